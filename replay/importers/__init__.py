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

from pathlib import Path
from typing import Any

import numpy as np

from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers import openrlhf, trl, verl
from rlsim.replay.importers.common import ImportFlags, Importer, write_step_trace
from rlsim.replay.io import read_trace
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
    spec, steps, evals = load(path, device=device, **flags)
    return write_step_trace(out, spec, steps, evals, overwrite=overwrite)


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
    lines.append(f"next: rlsim run --trace {path} --prompts {2 * int(cfg.get('prompts') or 1)}")
    return "\n".join(lines)


def _median(x) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else float("nan")


__all__ = ["FRAMEWORKS", "IMPORTERS", "ImportFlags", "Importer", "import_log", "describe"]
