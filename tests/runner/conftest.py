"""Shared fixtures for the runner tests: one built default model for the whole session."""
from __future__ import annotations

import importlib.util

import pytest


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


HAS_ENGINE = _has("torch") and _has("vllm") and _has("transformers")


def pytest_collection_modifyitems(config, items):
    if HAS_ENGINE:
        return
    skip = pytest.mark.skip(reason="needs torch, transformers and vLLM (pip install -e '.[cpu]')")
    for item in items:
        if "engine" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model():
    """The default tiny Llama (built once, cached under $RLSIM_CACHE or ~/.cache/rlsim)."""
    from rlsim.runner.model import ensure_model

    return ensure_model()


@pytest.fixture
def small_config():
    """Make a small RunConfig for a quick real run: `small_config(tmp_path, steps=2, ...)`."""
    return _small_config


def _small_config(tmp_path, **kw):
    from rlsim.runner.config import RunConfig

    base = dict(prompts=4, group=4, steps=3, eval_every=2, eval_prompts=16, eval_k=2, kv_cache_gib=0.1,
                max_num_seqs=64, progress=False, out=str(tmp_path / "run.parquet"))
    base.update(kw)
    return RunConfig(**base)
