"""Whole studies, as library calls the CLI and notebooks share: a sweep over a grid of what-if configs
(fit once, evaluate every config, rank, write the results) and a simulated timeline export."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlsim.sweeps import backends

from rlsim.present import results
from rlsim.present import perfetto as pf
from rlsim.core.config import WhatIf
from rlsim.modes.registry import as_recorded
from rlsim.core.grid import build_grid, config_dict
from rlsim.replay.errors import RlsimError
from rlsim.replay.util import exclusive
from rlsim.sweeps.plan import PlanConfig, plan
from rlsim.present.tables import sweep_verdict
from rlsim.present.views import sweep_charts
from rlsim.whatif.predict import timeline
from rlsim.whatif.study import Study, prepare


@dataclass(frozen=True)
class SweepResult:
    """A finished sweep."""

    rows: list = field(metadata={"help": "ranked result rows, best first (config fields + outcome)"})
    meta: dict = field(metadata={"help": "grid, study options, backend, traces' identity, the reference's outcome"})
    paths: dict = field(default_factory=dict,
                        metadata={"help": "files written (parquet, csv, json), when `out` was given"})
    seconds: float = field(default=0.0, metadata={"help": "wall seconds of the evaluation"})


def sweep_study(traces: Sequence[Any], axes: Mapping[str, Sequence[Any]], *, out: str | Path | None = None,
                overwrite: bool = False, rho_model: str = "auto", target: float | None = None,
                workers: int | None = None, ray_address: str | None = None, chunk_size: int | None = None,
                progress: backends.Progress | None = None, charts: bool = True,
                labels: Mapping[str, str] | None = None, calibration: Sequence[Any] = ()) -> SweepResult:
    """Evaluate the cartesian grid of `axes` (WhatIf field -> values) against the traces, rank it and,
    with `out`, write results.parquet / results.csv / sweep.json (and charts) there. Every row equals
    what `rlsim run` gives for its config."""
    labels = dict(labels or {})
    if not axes:
        raise RlsimError("nothing to sweep: give at least one option as a comma list, e.g. --prompts 64,128,256")
    if workers is not None and workers < 1:
        raise RlsimError("--workers must be at least 1")
    if ray_address:
        backends.import_ray()  # fail fast, before fitting, when the extra is missing
    grid = build_grid(WhatIf, axes, {}, labels=labels)
    # the mode the reference trace records where a config names none; a mode and settings that do not go together:
    # one line before anything is fitted
    grid, lines = _as_recorded(grid, traces)
    if out is not None:
        results.prepare_out_dir(out, overwrite, clear=False)  # refuse early; old results go only once new ones exist
    study = prepare(traces, rho_model=rho_model, target=target, calibration=calibration)
    backends.check_configs(study, grid, labels)
    with exclusive(out, what="--out folder") if out is not None else _nothing():
        t0 = time.perf_counter()
        rows = backends.run_sweep(study, grid, workers=workers, ray_address=ray_address, chunk_size=chunk_size,
                                  progress=progress)
        seconds = time.perf_counter() - t0
        ranked = results.rank_rows([_with_study_caveats(r, study) for r in rows])
        backend = ({"kind": "ray", "address": ray_address} if ray_address else
                   {"kind": "local", "workers": min(workers or backends.default_workers(), len(grid))})
        meta = results.sweep_metadata(traces=traces, axes=axes, fixed={}, labels=labels, n_configs=len(grid),
                                      study_options={"rho_model": rho_model, "target": target},
                                      backend=backend, seconds=round(seconds, 3))
        meta["reference"] = results.reference_row(study, grid[0].updates, grid[0].seed)
        meta["warnings"], meta["notes"] = list(study.warnings), list(study.notes)
        if lines:
            meta["mode_from_trace"] = lines
        if any(k in axes for k in HARDWARE_FIELDS):
            meta["notes"].append("each configuration is compared with the reference configuration on its own hardware "
                                 "(T / T_ref, the ranking); time_to_target_vs_recorded compares across hardware")
        meta["plan"] = _plan(traces, axes, target)
        ranked = [_with_plan(r, meta["plan"]) for r in ranked]
        v = sweep_verdict(ranked, meta)
        meta["verdict"] = {"kind": v["kind"], "title": v["title"], "text": v["text"],
                           "tied_configs": [r.get("config_id") for r in v["tied"]]}
        paths: dict = {}
        if out is not None:
            # again, under the lock: another sweep may have written it meanwhile
            results.prepare_out_dir(out, overwrite)
            paths = results.write_results(out, ranked, meta)
            if charts:
                sweep_charts(Path(out) / "charts", traces=traces, study=study, rows=ranked, meta=meta)
                paths["charts"] = Path(out) / "charts"
    return SweepResult(rows=ranked, meta=meta, paths=paths, seconds=seconds)


def _as_recorded(grid: Sequence[WhatIf], traces: Sequence[Any]) -> tuple[list[WhatIf], list[str]]:
    """The grid's configs asking about the execution mode the reference trace records where they name none
    (`rlsim.modes.registry.as_recorded`), and its lines, each once."""
    config = traces[0].config if traces else {}
    pairs = [as_recorded(cfg, config) for cfg in grid]
    return [c for c, _ in pairs], list(dict.fromkeys(line for _, line in pairs if line))


HARDWARE_FIELDS = ("device", "gpus", "gen_gpus", "train_gpus")  # the WhatIf fields that change the devices


def _with_study_caveats(row: dict, study: Study) -> dict:
    """A sweep row carries the study's warnings too, as `rlsim run` prints them beside each answer."""
    own = [w for w in str(row.get("warnings") or "").split("; ") if w]
    return {**row, "warnings": "; ".join(list(study.warnings) + own)}


def _plan(traces: Sequence[Any], axes: Mapping[str, Sequence[Any]], target: float | None) -> dict | None:
    """`rlsim plan` over the swept sizes when only P (and one G) is swept: the decision or the next pilots, and each
    size's expected regret (None when the grid sweeps anything else; {"error": ...} when it cannot plan)."""
    sizes = list(axes.get("prompts") or ())
    if len(sizes) < 2 or set(axes) - {"prompts", "group", "updates", "seed"} or len(axes.get("group") or [None]) > 1:
        return None
    try:
        return plan(traces[0], PlanConfig(prompts=tuple(sizes), group=(axes.get("group") or [None])[0]),
                    target=target).to_dict()
    except RlsimError as e:
        return {"error": str(e)}


def _with_plan(row: dict, p: dict | None) -> dict:
    """A sweep row with its size's expected regret and p_within_5pct from the plan (when there is one)."""
    c = next((c for c in (p or {}).get("candidates", ())
              if (c["prompts"], c["group"]) == (row.get("prompts"), row.get("group"))),
             None)
    return {**row, "expected_regret": c["expected_regret"], "p_within_5pct": c["p_within_5pct"]} if c else row


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def export_simulated(traces: Sequence[Any], fixed: Mapping[str, Any], out: str | Path, *, rho_model: str = "auto",
                     overwrite: bool = False, calibration: Sequence[Any] = ()) -> dict[str, int]:
    """Simulate one config (fields not given: the reference trace's) with its timeline and write it as
    Chrome trace JSON. Returns the slice counts per track."""
    cfg = _as_recorded(build_grid(WhatIf, {k: [v] for k, v in fixed.items()}, {}), traces)[0][0]
    run = timeline(prepare(traces, rho_model=rho_model, calibration=calibration), cfg)
    obj = pf.simulated_chrome_trace(run, other={"config": config_dict(cfg), "traces": [str(t.path) for t in traces]})
    counts = pf.check_chrome_trace(obj)
    pf.write_json(obj, out, overwrite=overwrite)
    return counts
