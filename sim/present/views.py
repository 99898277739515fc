"""The study's chart set, shared by `rlsim sweep` (written as HTML + PNG) and `rlsim report` (embedded):
time to target and sigma/rho over the sweep, generation throughput against the fitted model, learning
curves, and a simulated timeline of the best configuration; when the sweep varied the device split, time
to target over the split per staleness limit."""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.replay.timeline import simulated_timeline
from rlsim.whatif.predict import timeline
from rlsim.whatif.study import Study

CHARTS = (
    ("time_to_target", "Time to target vs batch size"),
    ("sigma_rho", "Throughput gain and sample cost vs batch size"),
    ("gen_throughput", "Generation throughput vs concurrency"),
    ("learning_curves", "Learning curves vs cumulative responses"),
    ("timeline", "Timeline of the best configuration (simulated)"),
)
GANTT_STEPS = 3
# charts drawn only when the sweep has their axes: the device split (--gen-gpus / --train-gpus), per staleness
OPTIONAL_CHARTS = (("split", "Time to target vs the generation : training device split, per staleness"),)
SPLIT_AXES = ("gen_gpus", "train_gpus")


def throughput_curve(fitted, trace, *, points: int = 48) -> list[dict]:
    g = trace.rows("gen_step")
    n = np.asarray(g["num_running"], float)
    ctx = np.asarray(g["context_tokens"], float)
    ok = n > 0
    if not ok.any():
        return []
    ctx_per_seq = float(np.median(ctx[ok] / n[ok]))
    hi = max(float(n.max()) * 2, float((fitted.engine or {}).get("max_num_seqs") or 0), 4.0)
    ns = np.unique(np.round(np.geomspace(1, hi, points)))
    tps = fitted.gen.throughput(ns, ctx_per_seq)
    return [{"num_running": float(a), "tokens_per_s": float(b)} for a, b in zip(ns, tps) if np.isfinite(b)]


def axes_of(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    axes = list(((meta.get("grid") or {}).get("axes") or {}).keys())
    return axes or [k for k in ("prompts", "group", "lr_rule") if rows and k in rows[0]]


def _whatif_from_row(row: Mapping[str, Any]):
    names = {f.name for f in dataclasses.fields(WhatIf) if f.init}
    kwargs = {k: row[k] for k in names if k in row and row[k] is not None}
    kwargs.pop("mode", None)  # a results row's `mode` describes the devices; its registered name is execution_mode
    if row.get("execution_mode") not in (None, "colocated", "split"):
        kwargs["mode"] = row["execution_mode"]
    cfg = WhatIf(**kwargs)
    if cfg.updates > GANTT_STEPS:
        cfg = dataclasses.replace(cfg, updates=GANTT_STEPS)
    return cfg


def _gantt_until(spans: Sequence[Any], steps: int = GANTT_STEPS) -> float | None:
    ends = sorted(s.start + s.dur for s in spans if s.track == "sync")
    if len(ends) < steps:
        ends = sorted(s.start + s.dur for s in spans if s.track == "update")
    return ends[steps - 1] * 1.0001 if len(ends) >= steps else None


def build_charts(*, traces: Sequence[Any], study: Study, rows: Sequence[Mapping[str, Any]] = (),
                 meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """name -> altair chart for every chart the study has data for (sweep charts need rows)."""
    from rlsim.present import charts as ch  # why here: the chart renderer (altair) loads only when charts are drawn

    meta = meta or {}
    out: dict[str, Any] = {}
    fitted = study.models
    if rows:
        axes = axes_of(meta, rows)
        series = ch.varying_keys(rows, axes)
        ref_cfg = traces[0].config
        prefer = {k: ref_cfg.get(k) for k in series if k in ref_cfg}
        ref_batch = (ref_cfg.get("prompts") or 0) * (ref_cfg.get("group") or 1) or None
        primary = ch.primary_series([dict(r) for r in rows], series, prefer)
        crit = critical_batches(study, rows, primary)
        out["time_to_target"] = ch.time_to_target_chart(rows, series=series, prefer=prefer, critical=crit,
                                                        reference_batch=ref_batch)
        out["sigma_rho"] = ch.sigma_rho_chart(rows, series=series)
        if any(a in axes for a in SPLIT_AXES):
            out["split"] = ch.split_chart(rows, series=ch.varying_keys(rows, axes, exclude=SPLIT_AXES + ("staleness",)))
    out["gen_throughput"] = ch.throughput_chart(ch.measured_throughput_points(traces[0]),
                                                throughput_curve(fitted, traces[0]),
                                                title=f"Generation throughput vs concurrency ({traces[0].name})")
    out["learning_curves"] = ch.learning_chart(ch.trace_learning_curves(traces),
                                               target=(meta.get("study") or {}).get("target"))
    best = rows[0] if rows else {k: traces[0].config.get(k) for k in ("prompts", "group")}
    cfg = _whatif_from_row(best)
    spans, counters = simulated_timeline(timeline(study, cfg))
    label = ", ".join(f"{k}={best.get(k)}" for k in axes_of(meta, rows)) if rows else "the recorded config"
    out["timeline"] = ch.gantt_chart(spans, counters, title=f"Simulated timeline: {label} (first {GANTT_STEPS} steps)",
                                     until=_gantt_until(spans))
    return out


def critical_batches(study: Study, rows: Sequence[Mapping[str, Any]],
                     primary: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The two boundaries of the time-to-target chart.
    Critical generation batch: where the simulated end-to-end throughput of the primary series plateaus
    (reaches 90% of its best). Critical training batch: the gradient noise scale B_crit of the reference
    trace when it is estimable (rho(B) bends upward there; with the lr-aware model its fitted bend batch), else
    the largest batch whose rho stays within 10%."""
    from rlsim.present import charts as ch  # why here: the chart renderer (altair) loads only when charts are drawn

    crit = ch.critical_batches(primary)
    b_crit = study.lr_aware.b_bend if study.lr_aware is not None else study.noise.b_crit
    if isinstance(b_crit, (int, float)) and math.isfinite(b_crit) and b_crit > 0:
        crit["critical_train_batch"] = float(b_crit)
    return crit


def sweep_charts(out_dir: str | os.PathLike, *, traces: Sequence[Any], study: Study, rows: Sequence[Mapping[str, Any]],
                 meta: Mapping[str, Any] | None = None, png: bool = True) -> dict[str, dict[str, Path]]:
    from rlsim.present.charts import save_chart  # why here: the renderer (altair) loads only when charts are drawn

    charts = build_charts(traces=traces, study=study, rows=rows, meta=meta)
    return {name: save_chart(c, out_dir, name, png=png) for name, c in charts.items()}

