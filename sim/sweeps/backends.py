"""Evaluate a list of what-if configs against one fitted `Study`: in this process for one worker, on
a local process pool by default (the study pickled once and unpickled once per worker by the pool's
initializer; several configs per task), or as Ray tasks (`ray_address`: the study is `ray.put` once into
the object store and each task, a chunk of configs, reads it from there). `evaluate` is pure, so every
path gives identical rows, returned in grid order."""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import rlsim.replay
from rlsim.core.grid import config_dict
from rlsim.replay.errors import RlsimError
from rlsim.replay.util import cores
from rlsim.whatif.study import Study, sim_config
from rlsim.whatif.predict import evaluate as evaluate_config

RAY_HINT = "--ray-address needs Ray, an optional extra: pip install 'rlsim[ray]'"

Progress = Callable[[int], None]  # called with the number of configs just finished


def outcome_row(cfg: Any, outcome: Any) -> dict[str, Any]:
    """One results row: the config's fields, then the outcome's flat dict (which wins on equal keys)."""
    row = config_dict(cfg)
    d = outcome.to_dict() if hasattr(outcome, "to_dict") else dict(outcome)
    row.update(d)
    return row


def check_configs(study: Study, cfgs: Sequence[Any], labels: Mapping[str, str] | None = None) -> None:
    """Resolve every config against its study before any work is shipped (e.g. a group of 1 for GRPO):
    one clear RlsimError naming the config instead of a failure inside a worker."""
    labels = labels or {}
    for cfg in cfgs:
        try:
            sim_config(study, cfg)
        except RlsimError as e:
            desc = " ".join(f"{labels.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in config_dict(cfg).items()
                            if v is not None)
            raise RlsimError(f"config [{desc}] is invalid: {e}") from None


def evaluate_chunk(study: Study, chunk: Sequence[tuple[int, Any]],
                   evaluate: Callable | None = None) -> list[tuple[int, dict]]:
    evaluate = evaluate or evaluate_config
    return [(i, outcome_row(cfg, evaluate(study, cfg))) for i, cfg in chunk]


_WORKER: dict[str, Any] = {}


def _pool_init(study_blob: bytes, evaluate: Callable | None) -> None:
    # One unpickle per worker process; the chunks then only carry configs.
    _WORKER["study"] = pickle.loads(study_blob)
    _WORKER["evaluate"] = evaluate or evaluate_config


def _pool_chunk(chunk: Sequence[tuple[int, Any]]) -> list[tuple[int, dict]]:
    return evaluate_chunk(_WORKER["study"], chunk, _WORKER["evaluate"])


def chunks_of(items: Sequence[Any], size: int) -> list[list]:
    """ceil(n / size) chunks of at most `size` items, strided (chunk k holds items k, k + m, k + 2m, ...):
    grids list the batch outermost, so strided chunks mix cheap and costly configs and finish together."""
    m = max(1, math.ceil(len(items) / max(1, size)))
    return [list(items[k::m]) for k in range(m)] if items else []


def default_chunk_size(n: int, workers: int) -> int:
    # about 8 tasks per worker: balanced load and a live progress bar, small per-task overhead
    return max(1, min(64, math.ceil(n / max(1, 8 * workers))))


def default_workers() -> int:
    return cores()


def run_local(study: Study, cfgs: Sequence[Any], *, workers: int | None = None, chunk_size: int | None = None,
              progress: Progress | None = None, evaluate: Callable | None = None) -> list[dict]:
    """Evaluate on a local process pool (or in this process for one worker); rows in grid order."""
    n = len(cfgs)
    workers = max(1, workers or default_workers())
    chunk_size = chunk_size or default_chunk_size(n, workers)
    indexed = list(enumerate(cfgs))
    chunks = chunks_of(indexed, chunk_size)
    workers = min(workers, len(chunks))
    rows: list[dict | None] = [None] * n
    if workers <= 1:
        for ch in chunks:
            for i, row in evaluate_chunk(study, ch, evaluate):
                rows[i] = row
            if progress:
                progress(len(ch))
        return rows  # type: ignore[return-value]
    blob = pickle.dumps(study, protocol=pickle.HIGHEST_PROTOCOL)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_pool_init,
                             initargs=(blob, evaluate)) as pool:
        pending = {pool.submit(_pool_chunk, ch): len(ch) for ch in chunks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                for i, row in fut.result():
                    rows[i] = row
                if progress:
                    progress(pending[fut])
                del pending[fut]
    return rows  # type: ignore[return-value]


def _ray_chunk(study: Study, chunk: Sequence[tuple[int, Any]], evaluate: Callable | None) -> list[tuple[int, dict]]:
    """A Ray task. The study arrives as a top-level ObjectRef argument, so Ray resolves it from the object
    store before the task starts (numpy arrays zero-copy). A `ray.get` inside the task would block the
    worker, release its CPU, and make Ray start extra worker processes that then compete for the cores."""
    return evaluate_chunk(study, chunk, evaluate)


def import_ray():
    try:
        import ray  # noqa: F401  (why here: Ray is the optional `ray` extra, needed by --ray-address only)
    except ImportError:
        raise RlsimError(RAY_HINT) from None
    return ray


def ship_package(dest: str | os.PathLike) -> Path:
    """Lay the simulator side of the `rlsim` package out as one folder `dest/rlsim` (what Ray's
    `py_modules` uploads): the package's own folder maps to sim/ and its `replay` subpackage to
    replay/ (pyproject's package-dir), so neither folder alone is importable as `rlsim`. The runner
    is left out: sweeps never import it."""
    root = Path(dest) / "rlsim"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(__file__).parents[1], root, ignore=skip)  # the package `rlsim` (sim/), above sweeps/
    shutil.copytree(Path(rlsim.replay.__file__).parent, root / "replay", ignore=skip, dirs_exist_ok=True)
    return root


def run_ray(study: Study, cfgs: Sequence[Any], *, address: str | None, chunk_size: int | None = None,
            progress: Progress | None = None, evaluate: Callable | None = None) -> list[dict]:
    """Evaluate as Ray tasks on the cluster at `address` (`auto`, `ray://host:10001`, or `local` for a new
    local instance). Reuses an already initialised Ray. Rows in grid order, identical to `run_local`."""
    ray = import_ray()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address and address != "local":
            # the cluster's workers import the simulator from the `rlsim` package, shipped from this install
            kwargs["runtime_env"] = {"py_modules": [str(ship_package(tempfile.mkdtemp(prefix="rlsim-ray-")))]}
        try:
            ray.init(address=address or "local", **kwargs)
        except ConnectionError as e:
            raise RlsimError(f"cannot reach the Ray cluster at {address!r}: {e}") from None
    n = len(cfgs)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    chunk_size = chunk_size or default_chunk_size(n, cpus)
    study_ref = ray.put(study)  # once, into the object store
    task = ray.remote(num_cpus=1)(_ray_chunk)
    pending = {}
    for ch in chunks_of(list(enumerate(cfgs)), chunk_size):
        pending[task.remote(study_ref, ch, evaluate)] = len(ch)
    rows: list[dict | None] = [None] * n
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            for i, row in ray.get(ref):
                rows[i] = row
            if progress:
                progress(pending[ref])
            del pending[ref]
    return rows  # type: ignore[return-value]


def run_sweep(study: Study, cfgs: Sequence[Any], *, workers: int | None = None, ray_address: str | None = None,
              chunk_size: int | None = None, progress: Progress | None = None,
              evaluate: Callable | None = None) -> list[dict]:
    if not cfgs:
        raise RlsimError("the sweep grid is empty: give at least one value for each swept option")
    if ray_address:
        return run_ray(study, cfgs, address=ray_address, chunk_size=chunk_size, progress=progress, evaluate=evaluate)
    return run_local(study, cfgs, workers=workers, chunk_size=chunk_size, progress=progress, evaluate=evaluate)


def same_rows(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Exact equality of two result lists, NaN equal to NaN (NaN != NaN would make equal sweeps differ)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return type(x) is type(y) and x == y

    return len(a) == len(b) and all(ra.keys() == rb.keys() and all(same(ra[k], rb[k]) for k in ra)
                                    for ra, rb in zip(a, b))

