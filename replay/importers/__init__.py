"""Import runs teams already have: verl, OpenRLHF and TRL logs become step-level rlsim traces.

    import_log("verl", "train.log", config="config.yaml", out="results/verl_run.parquet")
    import_log("verl", "metrics.jsonl", prompts=256, group=5, gpus=8, out=...)
    import_log("openrlhf", "wandb_history.csv", config="wandb_config.yaml", out=...)
    import_log("trl", "trainer_state.json", config="grpo.yaml", gpus=8, out=...)

A step-level trace holds per RL step the phase times, batch, tokens, length and score statistics and
validation scores (docs/importing.md); `rlsim run --trace` fits it with `replay.fit_steps`.
Bad input is one RlsimError line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers import openrlhf, trl, verl
from rlsim.replay.importers.common import ImportFlags, Importer, write_step_trace
from rlsim.replay.io import read_trace
from rlsim.replay.memory import model_shape, shape_from_config
from rlsim.replay.schema import EVAL, PHASE, UPDATE
from rlsim.replay.steps import step_table

# the importers, in the order `rlsim import --help` lists them: a new framework is its module and one entry here
IMPORTERS: dict[str, Importer] = {m.IMPORTER.name: m.IMPORTER for m in (verl, openrlhf, trl)}
FRAMEWORKS = tuple(IMPORTERS)


def _loader(framework: str):
    if framework not in IMPORTERS:
        raise RlsimError(f"unknown framework {framework!r}; rlsim imports {', '.join(FRAMEWORKS)}")
    return IMPORTERS[framework].load


def import_log(framework: str, path: str | Path, *, out: str | Path, overwrite: bool = False, device: str | None = None,
               **flags: Any) -> Path:
    """Parse `path` (a log of `framework`) with its flags (config, prompts, group, gpus, model_params,
    tp, eval_metric, ...; see each framework's `load`), and write the step-level trace `out`."""
    load = _loader(framework)
    if device is not None:
        get_profile(device)  # an unknown name fails before any parsing, listing the known ones
    model_config = flags.pop("model_config", None)
    dims = model_dims(model_config) if model_config is not None else None
    spec, steps, evals = load(path, device=device, **flags)
    if dims is not None:
        params = dims.pop("parameters")
        spec.model_dims = dims
        if spec.model_params_source != "--model-params":  # an explicit count wins over the one the config gives
            spec.model_params, spec.model_params_source = params, f"counted from {Path(model_config).name}"
    return write_step_trace(out, spec, steps, evals, overwrite=overwrite)


def model_dims(path: str | Path) -> dict[str, Any]:
    """The layer shapes and parameter count of a Hugging Face config.json (`--model-config`), as a trace's `model`
    metadata keeps them (the keys rlrun records, which `rlsim.whatif.memory` reads)."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RlsimError(f"--model-config {path}: cannot read it as JSON ({e}); pass the model's config.json") from None
    if not isinstance(cfg, dict):
        raise RlsimError(f"--model-config {path}: not a JSON object; pass the model's config.json")
    s = shape_from_config(cfg, str(cfg.get("_name_or_path") or ""))
    return {"parameters": s.params, "layers": s.layers, "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "intermediate": s.intermediate, "vocab": s.vocab}


def describe(path: str | Path) -> str:
    """A few lines about an imported trace: what it holds and the command that simulates it."""
    t = read_trace(path)
    src, cfg, hw = t.meta.get("source", {}), t.config, t.meta.get("hardware", {})
    ph = t.rows(PHASE)
    names = list(dict.fromkeys(ph["phase"].tolist()))
    st = step_table(t)["step_time"]
    lines = [f"imported {src.get('framework')} {src.get('format')} log {src.get('file')}: {t.count(UPDATE)} steps "
             f"({src.get('first_step')}..{src.get('last_step')}), {t.count(EVAL)} evals -> {path}",
             f"batch: P = {cfg.get('prompts')} prompts x G = {cfg.get('group')} = B = {cfg.get('batch')} responses per "
             f"step; GPUs {hw.get('device_count') or '?'}"
             + (f" x {hw.get('profile')}" if hw.get("profile") else " (device not given)"),
             f"phases: {', '.join(names) if names else '-'}; median step {float(_median(st)):.4g} s",
             f"unknown metrics kept: {len(src.get('unknown_metrics') or [])} (step_stats.metrics)"]
    for n in src.get("notes") or []:
        lines.append(f"note: {n}")
    for w in src.get("warnings") or []:
        lines.append(f"warning: {w}")
    memory = memory_note(t.meta.get("model") or {})
    if memory:
        lines.append(f"note: {memory}")
    lines.append(f"next: rlsim run --trace {path} --prompts {2 * int(cfg.get('prompts') or 1)}")
    return "\n".join(lines)


def memory_note(model: dict[str, Any]) -> str:
    """What the memory estimate will lack for the trace's `model` metadata, and what to pass ('' when complete)."""
    dims = ("layers", "hidden", "kv_heads", "head_dim")
    if all(isinstance(model.get(k), int) and model[k] > 0 for k in dims):
        return ""
    try:
        shape = model_shape(model.get("name"), params=model.get("parameters"))
    except RlsimError:
        return (f"memory unknown: the model {model.get('name')!r} is not one rlsim can size; import again with "
                "--model-params (e.g. 7B) or --model-config PATH/config.json")
    if shape.full:
        return ""
    return (f"memory partly unknown: only the parameter count of {model.get('name')!r} is known, not its layer shapes "
            "(KV cache, activations); import again with --model-config PATH/config.json")


def _median(x) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else float("nan")


__all__ = ["FRAMEWORKS", "IMPORTERS", "ImportFlags", "Importer", "import_log", "describe"]
