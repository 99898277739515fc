"""Cost models fitted to a recorded run, each with its fit quality.

- generation: the time of one engine step from its batch composition (replay/cost.py's formula), fitted by
  non-negative least squares on `gen_step` rows after warm-up, outliers trimmed (replay/robust.py); with too
  little concurrency range the fixed term comes from a roofline prior (`default_bandwidth_gbs`);
- generation overhead per round outside engine steps, against responses and steps;
- response lengths: the empirical distribution (prompt lengths per prompt, response lengths per response);
- update and old-log-prob preparation vs tokens, rewards vs responses, the rest of the step, the sync vs bytes.

Everything is linear in its inputs, so sums of step costs are closed forms of summed features: the
simulator relies on that. The types (`FittedModels` and its parts) are replay/models.py's; `fit_trace` hands
step-level traces to replay/fit_steps.py and every fit to replay/calibration.py. Imports neither torch nor SimPy.

Colocated recordings only: rows of the split-mode kinds (idle, train_rank, allreduce) are ignored, and a
trace recorded with `rlrun record --mode split` is refused (the simulator's split what-if starts from a
colocated reference; `rlsim.replay.split_stats` measures a split recording). In detail: docs/simulator.md,
"Fitted models".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from rlsim.replay.calibration import calibrate, calibrates_gen
from rlsim.replay.cost import EngineStepCost
from rlsim.replay.device_speed import device_ratios
from rlsim.replay.devices import device_models, profile_by_name
from rlsim.replay.drift import Drift, drift_of
from rlsim.replay.errors import RlsimError, name
from rlsim.replay.fit_steps import fit_steps, is_step_level
from rlsim.replay.io import Trace
from rlsim.replay.models import FittedModels, GenOverheadModel, GenStepModel, LengthModel, Recorded
from rlsim.replay.robust import (NARROW_RANGE, AffineModel, FitQuality, fit_affine, fit_quality, nnls_fit,
                                 robust_location)
from rlsim.replay.schema import GEN_STEP, RESPONSE, SYNC, UPDATE, placement
from rlsim.replay.steps import step_table
from rlsim.replay.util import ENGINE_DEFAULTS

# Memory bandwidth in GB/s of the roofline prior when neither the trace's `hardware.mem_bandwidth_gbs` nor a
# device profile (replay/devices.py) matched by its device name gives one: by device type.
DEFAULT_MEM_BANDWIDTH_BY_TYPE_GBS = {"cuda": 2000.0, "gpu": 2000.0, "rocm": 2000.0, "cpu": 20.0}

MIN_GEN_ROWS = 50          # fewer gen_step rows after warm-up: warn that the generation fit is weak
MIN_CONCURRENCY_SPAN = 4.0  # max/min num_running below this: roofline prior for the fixed step cost


def default_bandwidth_gbs(hardware: dict[str, Any]) -> tuple[float, str]:
    """(GB/s, where it came from) for the roofline prior: the trace's metadata, else the device profile its
    device name matches, else a default by device type."""
    bw = hardware.get("mem_bandwidth_gbs")
    if bw:
        return float(bw), "trace metadata hardware.mem_bandwidth_gbs"
    prof = profile_by_name(hardware.get("device_name"))
    if prof is not None:
        return prof.mem_bandwidth_gbs, f"device profile {prof.key} ({prof.source})"
    dev = str(hardware.get("device") or "cpu").lower()
    return DEFAULT_MEM_BANDWIDTH_BY_TYPE_GBS.get(dev, 20.0), f"default for device type {dev}"


def fit_gen_steps(rows: dict[str, np.ndarray], *, warmup_step: int | None = 0,
                  model_bytes: float | None = None, hardware: dict[str, Any] | None = None,
                  invalid_dropped: int = 0, fit: bool = True) -> tuple[GenStepModel, list[str]]:
    """Fit the step-cost model on gen_step rows; returns (model, warnings). `invalid_dropped`: gen_step
    rows the reader already removed as invalid (`read_trace(drop_invalid=True)`), counted in `dropped`.
    `fit` False: the rows' checks and warnings only, the model's coefficients NaN (a calibration refits and
    replaces it: `calibration.calibrates_gen`), which saves the robust fit's ~1,000 NNLS solves."""
    warnings: list[str] = []
    n_all = len(rows["duration"])
    steps = rows["step"].astype(float)
    keep = np.ones(n_all, bool)
    if warmup_step is not None and n_all and np.any(steps != warmup_step):
        keep &= steps != warmup_step
    keep &= np.isfinite(rows["duration"]) & (rows["num_running"] > 0)
    y = rows["duration"][keep].astype(float)
    groups = rows["round"][keep] if "round" in rows else None
    X = EngineStepCost.design(rows["num_running"][keep], rows["context_tokens"][keep], rows["prefill_tokens"][keep])
    dropped = n_all - int(keep.sum()) + invalid_dropped
    if len(y) < 4:
        raise RlsimError(f"the trace has {len(y)} usable gen_step rows after warm-up; record more RL steps (at least "
                         "2) with per-step rows on")
    if len(y) < MIN_GEN_ROWS:
        warnings.append(f"only {len(y)} generation steps after warm-up to fit the step cost (want >= {MIN_GEN_ROWS}): "
                        "the generation model is weak")
    nr = X[:, 1]
    lo, hi = int(nr.min()), int(nr.max())
    prior = hi / max(lo, 1) < MIN_CONCURRENCY_SPAN or len(np.unique(nr)) < 3
    if prior:
        bw, src = default_bandwidth_gbs(hardware or {})
        c0 = float(model_bytes or 0.0) / (bw * 1e9)
        c0 = min(c0, float(np.percentile(y, 5)))
        warnings.append(f"generation steps span only {lo}..{hi} concurrent sequences: the fixed step cost uses a "
                        f"roofline prior (model bytes {model_bytes or 0:.3g} / {bw:g} GB/s, {src}) = {c0 * 1e3:.3g} ms")
    if not fit:
        nan = math.nan
        q = FitQuality(len(y), nan, nan, nan, nan, dropped, "none (calibrated)")
        return GenStepModel(nan, nan, nan, nan, quality=q, prior=prior, concurrency_range=(lo, hi)), warnings
    if prior:
        coef_rest, k2 = nnls_fit(X[:, 1:], y - c0, groups=groups)
        coef = np.concatenate([[c0], coef_rest])
        q = fit_quality(X[k2], y[k2], coef, dropped + int((~k2).sum()), "prior+nnls")
    else:
        coef, k2 = nnls_fit(X, y, groups=groups)
        q = fit_quality(X[k2], y[k2], coef, dropped + int((~k2).sum()), "nnls")
    return GenStepModel(*map(float, coef), quality=q, prior=prior, concurrency_range=(lo, hi)), warnings


def warmup_excluded(trace: Trace) -> bool:
    """True when the runner warmed the engine up before recording (metadata engine.warmup_excluded)."""
    return bool((trace.meta.get("engine") or {}).get("warmup_excluded"))


def fit_trace(trace: Trace | list[Trace] | tuple[Trace, ...], calibration: Sequence[Trace] = (), *,
              one_device: bool = False, step_overhead_s: float | None = None) -> FittedModels:
    """Fit every cost model to one trace, or to several traces of the same setup: then the step
    costs (update, prep, reward, other, sync) are fitted across them (their batch sizes give the
    slopes a range), while the generation side (engine-step model, round overhead, lengths), the
    engine, the config and the recorded timings come from the first. Calibration rows (in the first
    trace, or in `calibration` traces from `rlrun calibrate`) refit the engine-step and update models
    over the calibrated range (replay/calibration.py); every fit gets its validation and replicates.
    `one_device`: the models of one device instead: the fitted ones with engine-step and training times scaled by
    one device's speed over the run's, from the first trace's calibration (replay/device_speed.py; replay/devices.py
    `device_models`).
    `step_overhead_s`: an imported log's engine-step overhead prior (replay/fit_steps.py; None: its default)."""
    traces = list(trace) if isinstance(trace, (list, tuple)) else [trace]
    ref = traces[0]
    _check_colocated(traces)
    if is_step_level(ref):  # imported from a log (replay/fit_steps.py)
        if calibration:  # its costs are per-phase totals: engine-step calibration rows have nothing to refit
            raise RlsimError(f"{ref.name} is a step-level trace imported from a log: {name('calibration')} applies "
                             f"only to traces recorded by `rlrun record`; drop {name('calibration')}")
        return fit_steps(traces, step_overhead_s=step_overhead_s)
    _check_rows(traces)
    drift = drift_of(ref)
    gen_rows = _gen_rows(ref, drift)
    # with calibration rows `calibrate` refits the engine-step model and replaces this one: only its checks run here
    gen, warnings = fit_gen_steps(gen_rows, warmup_step=0, model_bytes=(ref.meta.get("model") or {}).get("bytes"),
                                  hardware=ref.meta.get("hardware", {}), invalid_dropped=ref.dropped_rows(GEN_STEP),
                                  fit=not calibrates_gen(ref, calibration))
    st = _Steps.of(traces, drift)
    costs = _fit_step_costs(st, float((ref.meta.get("model") or {}).get("bytes") or 0.0), _sync_rows(traces))
    engine = _engine_limits(ref, gen, warnings)
    shared = [bool((t.meta.get("trainer") or {}).get("share_prompts")) for t in traces]
    if len(set(shared)) > 1:
        warnings.append("the traces differ in trainer.share_prompts, so their num_tokens count prompts differently "
                        "and the update-cost fit mixes the two; fit traces recorded by the same rlrun version")
    models = FittedModels(gen=gen, gen_overhead=fit_gen_overhead(st), lengths=_lengths(ref), **costs.models,
                          sync_bytes=costs.sync_bytes, engine=engine, config=dict(ref.config),
                          recorded=_recorded(ref, costs.prep_inside), warnings=tuple(warnings),
                          source=",".join(t.name for t in traces), shared_prompts=shared[0])
    # calibration rows, validation, replicates (replay/calibration.py)
    models = calibrate(models, traces, gen_rows, upd_proper=costs.upd_proper, n_tok=st.num_tokens, t_opt=st.t_optimizer,
                       sel=costs.sel, t_fb=st.t_fb, calibration=list(calibration), ref_rows=st.is_ref)
    if drift is not None and models.validation is not None:
        models = replace(models,
                         validation=replace(models.validation, notes=models.validation.notes + (drift.describe(),)))
    if one_device:
        r = device_ratios(ref)
        if r is None:
            raise RlsimError(f"{ref.path} has no one-device calibration (paired visits at 1 thread); record it with "
                             "`rlrun record` on more than one core, calibration on")
        models = device_models(models, r)
    return models


def _check_colocated(traces: Sequence[Trace]) -> None:
    for t in traces:  # a split recording's step costs overlap and wait on each other: no colocated model in them
        if placement(t.config)["mode"] == "split":
            raise RlsimError(f"{t.name} was recorded in split mode; fit a colocated recording (rlrun record --mode "
                             "colocated) and predict the split with --gen-gpus/--train-gpus/--staleness")


def _check_rows(traces: Sequence[Trace]) -> None:
    ref = traces[0]
    if sum(t.count(GEN_STEP) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no gen_step rows; record it with per-step rows on (rlrun record without "
                         "--no-record-steps)")
    if sum(t.count(UPDATE) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no update rows; the run recorded no complete RL step")
    if sum(t.count(RESPONSE) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no response rows; the trace cannot give response lengths")


def _gen_rows(ref: Trace, drift: Drift | None = None) -> dict[str, np.ndarray]:
    """The first trace's gen_step rows (one machine state, one engine): duration (at the run's median machine
    speed when the trace has a drift probe), num_running, context_tokens, prefill_tokens; `step` 0 for warm-up
    rows (the first RL step, unless the runner warmed the engine up before recording), else 1; `round` the RL
    step (groups of rows for the robust fit's starts)."""
    rg = ref.rows(GEN_STEP)
    rows = {c: rg[c].astype(float) for c in ("duration", "num_running", "context_tokens", "prefill_tokens")}
    if drift is not None:
        rows["duration"] = rows["duration"] / drift.factor("gen", rg["t_start"])
    rows["step"] = np.where((rg["step"].astype(float) == 0) & (not warmup_excluded(ref)), 0.0, 1.0)
    rows["round"] = rg["step"].astype(float)
    return rows


def _sync_rows(traces: Sequence[Trace]) -> tuple[np.ndarray, np.ndarray]:
    return _cat(traces, SYNC, "duration"), _cat(traces, SYNC, "bytes")


def _cat(traces: Sequence[Trace], kind: str, col: str) -> np.ndarray:
    return np.concatenate([t.rows(kind)[col].astype(float) for t in traces])


@dataclass(frozen=True, eq=False)
class _Steps:
    """Per update row of the traces end to end (replay/steps.py's step table, and what the fits need of it);
    every array (updates,)."""

    gen_steps: np.ndarray = field(metadata={"help": "engine steps of the step's generation"})
    gen_step_time: np.ndarray = field(metadata={"help": "summed engine-step seconds"})
    gen_time: np.ndarray = field(metadata={"help": "generation seconds"})
    step_time: np.ndarray = field(metadata={"help": "wall seconds of the RL step"})
    sync_time: np.ndarray = field(metadata={"help": "weight-sync seconds"})
    reward_time: np.ndarray = field(metadata={"help": "reward seconds (0 when not recorded)"})
    prep_time: np.ndarray = field(metadata={"help": "batch preparation seconds (0 when not recorded)"})
    update_time: np.ndarray = field(metadata={"help": "the update row's duration (may include prep_time)"})
    num_responses: np.ndarray = field(metadata={"help": "responses trained on"})
    num_tokens: np.ndarray = field(metadata={"help": "tokens trained on"})
    t_optimizer: np.ndarray = field(metadata={"help": "optimizer-step seconds"})
    t_fb: np.ndarray = field(metadata={"help": "forward + backward seconds"})
    warm: np.ndarray = field(metadata={"help": "warm-up update (a trace's step 0 unless warmed up before; none if all "
                                               "are)"})
    is_ref: np.ndarray = field(metadata={"help": "a row of the first trace"})
    trace: np.ndarray = field(metadata={"help": "index of the row's trace"})

    @classmethod
    def of(cls, traces: Sequence[Trace], drift: Drift | None = None) -> _Steps:
        """The traces' update rows; the first trace's at its median machine speed when `drift` (its probe) is given."""
        tables = [step_table(t) for t in traces]
        if drift is not None:
            tables[0] = _at_median_speed(tables[0], traces[0].rows(UPDATE)["t_start"], drift)
        col = {c: np.concatenate([tb[c] for tb in tables]) for c in tables[0]}
        warm = np.concatenate([(t.rows(UPDATE)["step"] == 0) & (not warmup_excluded(t)) for t in traces])
        if np.all(warm):
            warm = np.zeros_like(warm)
        trace = np.concatenate([np.full(t.count(UPDATE), i) for i, t in enumerate(traces)])
        return cls(gen_steps=col["gen_steps"], gen_step_time=col["gen_step_time"], gen_time=col["gen_time"],
                   step_time=col["step_time"], sync_time=col["sync_time"], reward_time=col["reward_time"],
                   prep_time=col["prep_time"], update_time=col["update_time"], num_responses=col["num_responses"],
                   num_tokens=col["num_tokens"], t_optimizer=col["t_optimizer"],
                   t_fb=col["t_forward"] + col["t_backward"], warm=warm, is_ref=trace == 0, trace=trace)


def _at_median_speed(tb: dict[str, np.ndarray], t: np.ndarray, drift: Drift) -> dict[str, np.ndarray]:
    """A step table with generation seconds divided by the engine's slowness at each update's time and
    training seconds by the trainer's; the step time loses what they lost."""
    fg, ft = drift.factor("gen", t), drift.factor("train", t)
    out = dict(tb)
    for c in ("gen_step_time", "gen_time"):
        out[c] = tb[c] / fg
    for c in ("update_time", "t_forward", "t_backward"):
        out[c] = tb[c] / ft
    out["step_time"] = tb["step_time"] - (tb["gen_time"] - out["gen_time"]) - (tb["update_time"] - out["update_time"])
    return out


def fit_gen_overhead(st: _Steps) -> GenOverheadModel:
    """Generation time outside engine steps (gen_time minus their durations) vs responses and engine steps,
    on the first trace's updates after warm-up."""
    ok = np.isfinite(st.gen_time) & ~st.warm & st.is_ref
    gap = st.gen_time - st.gen_step_time
    n_resp, k = st.num_responses[ok], st.gen_steps[ok]
    Xo = np.column_stack([np.ones(ok.sum()), n_resp, k])
    if ok.sum() < 3:
        return GenOverheadModel(0.0, 0.0, 0.0, FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default"))
    if n_resp.max() / max(n_resp.min(), 1) < NARROW_RANGE:
        # responses constant: the per-round term and per-response term are not separable; a
        # per-step gap plus a per-response share of the rest
        per_step_coef, _ = nnls_fit(Xo[:, [0, 2]], gap[ok])
        med = robust_location(gap[ok] - per_step_coef[1] * k)
        coef = np.array([0.0, max(med, 0.0) / max(float(np.median(n_resp)), 1.0), per_step_coef[1]])
        oq = fit_quality(Xo, gap[ok], coef, 0, "nnls(per-step)+proportional")
    else:
        coef, kept = nnls_fit(Xo, gap[ok])
        oq = fit_quality(Xo[kept], gap[ok][kept], coef, int((~kept).sum()), "nnls")
    return GenOverheadModel(float(coef[0]), float(coef[1]), float(coef[2]), oq)


PHASES = ("update", "prep", "reward", "other", "sync")  # FittedModels' per-update cost models beside generation


@dataclass(frozen=True, eq=False)
class _StepCosts:
    """The phase models of `_fit_step_costs` and what they were fitted on."""

    models: dict[str, AffineModel] = field(metadata={"help": "PHASES -> its fitted model"})
    sync_bytes: float = field(metadata={"help": "bytes per weight sync"})
    upd_proper: np.ndarray = field(metadata={"help": "(updates,) update seconds without batch preparation"})
    prep_inside: bool = field(metadata={"help": "the update rows' durations hold the batch preparation"})
    sel: np.ndarray = field(metadata={"help": "(updates,) rows fitted (after warm-up)"})


def _fit_step_costs(st: _Steps, model_bytes: float, sync_rows: tuple[np.ndarray, np.ndarray]) -> _StepCosts:
    """Update, prep, reward, other (the rest of the step) and sync, across the traces (one group each)."""
    sel = ~st.warm if (~st.warm).any() else np.ones_like(st.warm)
    # Is prep_time inside the update row's duration (old log-probs computed by the update call)?
    # Then the update proper is duration - prep_time; the step's other time must not subtract it twice.
    prep_inside = False
    if np.any(st.prep_time[sel] > 0):
        slack = st.update_time - (st.t_fb + st.t_optimizer)
        ok_p = np.isfinite(slack) & sel
        if ok_p.any():
            prep_inside = bool(np.median(slack[ok_p]) >= 0.5 * np.median(st.prep_time[ok_p]))
    upd_proper = st.update_time - st.prep_time if prep_inside else st.update_time
    hint = robust_location(st.t_optimizer[sel]) if np.isfinite(st.t_optimizer[sel]).any() else 0.0
    grp = st.trace[sel] if st.trace.max() > 0 else None
    n_tok, n_resp = st.num_tokens[sel], st.num_responses[sel]
    other_t = np.maximum(st.step_time - st.gen_time - st.reward_time - st.prep_time - upd_proper - st.sync_time,
                         0.0)[sel]
    s_dur, s_bytes = sync_rows
    if len(s_dur):
        sync, sync_bytes = fit_affine("sync", "bytes", s_bytes, s_dur), float(np.median(s_bytes))
    else:
        sync = AffineModel("sync", "bytes", 0.0, 0.0,
                           FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default"))
        sync_bytes = model_bytes
    models = dict(update=fit_affine("update", "tokens", n_tok, upd_proper[sel], intercept_hint=hint, groups=grp),
                  prep=fit_affine("prep", "tokens", n_tok, st.prep_time[sel], groups=grp),
                  reward=fit_affine("reward", "responses", n_resp, st.reward_time[sel], groups=grp),
                  other=fit_affine("other", "responses", n_resp, other_t, intercept_hint=robust_location(other_t),
                                   groups=grp),
                  sync=sync)
    return _StepCosts(models, sync_bytes=sync_bytes, upd_proper=upd_proper, prep_inside=prep_inside, sel=sel)


def _lengths(ref: Trace) -> LengthModel:
    """The first trace's prompt lengths (one per group), response lengths, cap and prefix-cache ratio."""
    resp = ref.rows(RESPONSE)
    first = resp["group_index"] == 0
    p_tok = resp["prompt_tokens"][first] if first.any() else resp["prompt_tokens"]
    max_tokens = int(ref.config.get("max_tokens") or int(np.max(resp["response_tokens"])))
    pre_total = float(np.sum(ref.rows(GEN_STEP)["prefill_tokens"]))
    prompt_total = float(np.sum(resp["prompt_tokens"]))
    ratio = float(np.clip(pre_total / prompt_total, 0.0, 1.5)) if prompt_total > 0 else 1.0
    return LengthModel(prompt_tokens=p_tok.astype(np.int64),
                       response_tokens=np.maximum(resp["response_tokens"], 1).astype(np.int64),
                       max_tokens=max_tokens, prefill_ratio=ratio)


def _recorded(ref: Trace, prep_inside: bool) -> Recorded:
    """The first trace's per-update timings as recorded (replay/steps.py: the step time's one definition, not
    normalised for the machine's drift as the fits' inputs are) and its workload in queue order."""
    resp = ref.rows(RESPONSE)
    st = step_table(ref)
    rec_steps = st["step"]
    order = np.lexsort((resp["group_index"], resp["prompt_id"],
                        resp["t_queued"] if np.isfinite(resp["t_queued"]).all() else resp["prompt_id"]))
    r_step = resp["consumed_step"] if np.isfinite(resp["consumed_step"].astype(float)).all() else resp["step"]
    r_step = r_step[order].astype(np.int64)
    rp = resp["prompt_tokens"][order].astype(np.int64)
    rr = np.maximum(resp["response_tokens"][order], 1).astype(np.int64)
    workload = tuple((rp[r_step == s], rr[r_step == s]) for s in rec_steps)
    train = st["update_time"] + (0.0 if prep_inside else st["prep_time"])
    return Recorded(step=rec_steps, step_time=st["step_time"], gen_time=st["gen_time"], train_time=train,
                    sync_time=st["sync_time"], num_responses=st["num_responses"], gen_steps=st["gen_steps"],
                    workload=workload)


def _engine_limits(ref: Trace, gen: GenStepModel, warnings: list[str]) -> dict:
    """The trace's engine metadata with every limit the simulator needs filled in (a warning for max_num_seqs)."""
    engine = dict(ref.meta.get("engine", {}) or {})
    if not engine.get("max_num_seqs"):
        engine["max_num_seqs"] = int(ref.config.get("max_num_seqs") or max(gen.concurrency_range[1], 1))
        warnings.append(f"trace metadata has no engine.max_num_seqs; using {engine['max_num_seqs']}")
    engine.setdefault("block_size", ENGINE_DEFAULTS["block_size"])
    engine.setdefault("max_model_len", int(ref.config.get("max_model_len") or ENGINE_DEFAULTS["max_model_len"]))
    if not engine.get("kv_cache_tokens"):
        engine["kv_cache_tokens"] = int(engine["max_num_seqs"] * engine["max_model_len"])
    return engine
