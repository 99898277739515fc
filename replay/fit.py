"""Cost models fitted to a recorded run, each with its fit quality.

- generation: the time of one engine step from its batch composition, roofline-shaped and linear,
      t_step = c_step + c_seq * num_running + c_ctx * context_tokens + c_prefill * prefill_tokens,
  fitted by non-negative least squares on `gen_step` rows after warm-up (the first RL step's rows are
  left out when there are others; residual outliers beyond 6 robust sigmas are trimmed and refitted).
  `c_step` is the per-step cost that amortises over concurrent sequences (weight reads, scheduling).
  With too little concurrency range the fixed term comes from a roofline prior: model bytes over the
  device's memory bandwidth (`hardware.mem_bandwidth_gbs`, else DEFAULT_MEM_BANDWIDTH_GBS).
- generation overhead per round outside engine steps (adding requests, collecting outputs, gaps):
  gen_time - sum(step durations) against responses and steps.
- response lengths: the empirical distribution (prompt lengths per prompt, response lengths per response).
- update time vs tokens, old-log-prob preparation vs tokens, reward time vs responses, the rest of the
  step (other) and the weight sync vs bytes.

Everything is linear in its inputs, so sums of step costs are closed forms of summed features: the
simulator relies on that. Imports neither torch nor SimPy.

Colocated recordings only: rows of the split-mode kinds (idle, train_rank, allreduce) are ignored, and a
trace recorded with `rlrun record --mode split` is refused (the simulator's split what-if starts from a
colocated reference; `rlsim.replay.split_stats` measures a split recording).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace
from rlsim.replay.schema import GEN_STEP, RESPONSE, SYNC, UPDATE, placement
from rlsim.replay.steps import step_table
from rlsim.replay.util import ENGINE_DEFAULTS, default_group

# Memory bandwidth in GB/s used for the roofline prior when the trace's `hardware.mem_bandwidth_gbs`
# is null: matched on the device name (case-insensitive substring), else by device type.
DEFAULT_MEM_BANDWIDTH_GBS: tuple[tuple[str, float], ...] = (
    ("b200", 8000.0), ("h200", 4800.0), ("h100", 3350.0), ("h800", 3350.0), ("a100", 2039.0),
    ("a800", 2039.0), ("l40", 864.0), ("a10", 600.0), ("l4", 300.0), ("v100", 900.0), ("t4", 320.0),
    ("mi300", 5300.0),
)
DEFAULT_MEM_BANDWIDTH_BY_TYPE_GBS = {"cuda": 2000.0, "gpu": 2000.0, "rocm": 2000.0, "cpu": 20.0}

MIN_GEN_ROWS = 50          # fewer gen_step rows after warm-up: warn that the generation fit is weak
MIN_CONCURRENCY_SPAN = 4.0  # max/min num_running below this: roofline prior for the fixed step cost


from rlsim.replay.robust import (NARROW_RANGE, AffineModel, FitQuality, _quality,  # noqa: F401  (re-exported)
                                 fit_affine, nnls_fit, robust_location)


GEN_FEATURES = ("step", "num_running", "context_tokens", "prefill_tokens")


@dataclass(frozen=True)
class GenStepModel:
    """Seconds of one engine step: c_step + c_seq*num_running + c_ctx*context_tokens + c_prefill*prefill_tokens."""

    c_step: float = field(metadata={"help": "fixed seconds per engine step, amortised over the batch (weight reads, scheduling)"})
    c_seq: float = field(metadata={"help": "seconds per sequence in the batch"})
    c_ctx: float = field(metadata={"help": "seconds per KV token attended"})
    c_prefill: float = field(metadata={"help": "seconds per prompt token computed"})
    quality: FitQuality = field(metadata={"help": "fit quality on the gen_step rows"})
    prior: bool = field(default=False, metadata={"help": "c_step came from the roofline prior (too little concurrency range)"})
    concurrency_range: tuple[int, int] = field(default=(0, 0), metadata={"help": "min and max num_running of the fitted rows"})
    c_knee: float = field(default=0.0, metadata={"help": "change of the per-sequence slope above `knee` (piecewise-linear form; 0: linear)"})
    knee: float = field(default=0.0, metadata={"help": "num_running at which the slope changes (replay/calibration.py)"})
    form: str = field(default="linear", metadata={"help": "linear | knee (c_knee * max(0, num_running - knee) added)"})

    @property
    def coef(self) -> np.ndarray:
        return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill])

    def predict(self, num_running, context_tokens, prefill_tokens=0.0):
        """Seconds per step for arrays of batch composition (broadcasts)."""
        n = np.asarray(num_running, float)
        t = (self.c_step * (n > 0) + self.c_seq * n + self.c_ctx * np.asarray(context_tokens, float)
             + self.c_prefill * np.asarray(prefill_tokens, float))
        return t + self.c_knee * np.maximum(n - self.knee, 0.0) if self.c_knee else t

    def throughput(self, num_running, context_per_seq: float):
        """Decode tokens per second at a steady batch of `num_running` sequences of mean context `context_per_seq`."""
        n = np.asarray(num_running, float)
        return n / self.predict(n, n * context_per_seq)


def default_bandwidth_gbs(hardware: dict[str, Any]) -> tuple[float, str]:
    """(GB/s, where it came from) for the roofline prior."""
    bw = hardware.get("mem_bandwidth_gbs")
    if bw:
        return float(bw), "trace metadata hardware.mem_bandwidth_gbs"
    name = str(hardware.get("device_name") or "").lower()
    for key, val in DEFAULT_MEM_BANDWIDTH_GBS:
        if key in name:
            return val, f"default for {key.upper()}"
    dev = str(hardware.get("device") or "cpu").lower()
    return DEFAULT_MEM_BANDWIDTH_BY_TYPE_GBS.get(dev, 20.0), f"default for device type {dev}"


def fit_gen_steps(rows: dict[str, np.ndarray], *, warmup_step: int | None = 0,
                  model_bytes: float | None = None, hardware: dict[str, Any] | None = None,
                  invalid_dropped: int = 0) -> tuple[GenStepModel, list[str]]:
    """Fit the step-cost model on gen_step rows; returns (model, warnings). `invalid_dropped`: gen_step
    rows the reader already removed as invalid (`read_trace(drop_invalid=True)`), counted in `dropped`."""
    warnings: list[str] = []
    n_all = len(rows["duration"])
    steps = rows["step"].astype(float)
    keep = np.ones(n_all, bool)
    if warmup_step is not None and n_all and np.any(steps != warmup_step):
        keep &= steps != warmup_step
    keep &= np.isfinite(rows["duration"]) & (rows["num_running"] > 0)
    y = rows["duration"][keep].astype(float)
    groups = rows["round"][keep] if "round" in rows else None
    X = np.column_stack([np.ones(keep.sum()), rows["num_running"][keep], rows["context_tokens"][keep],
                         rows["prefill_tokens"][keep]]).astype(float)
    dropped = n_all - int(keep.sum()) + invalid_dropped
    if len(y) < 4:
        raise RlsimError(f"the trace has {len(y)} usable gen_step rows after warm-up; record more RL steps (at least 2) with per-step rows on")
    if len(y) < MIN_GEN_ROWS:
        warnings.append(f"only {len(y)} generation steps after warm-up to fit the step cost (want >= {MIN_GEN_ROWS}): the generation model is weak")
    nr = X[:, 1]
    lo, hi = int(nr.min()), int(nr.max())
    prior = hi / max(lo, 1) < MIN_CONCURRENCY_SPAN or len(np.unique(nr)) < 3
    if prior:
        bw, src = default_bandwidth_gbs(hardware or {})
        c0 = float(model_bytes or 0.0) / (bw * 1e9)
        c0 = min(c0, float(np.percentile(y, 5)))
        coef_rest, k2 = nnls_fit(X[:, 1:], y - c0, groups=groups)
        coef = np.concatenate([[c0], coef_rest])
        warnings.append(f"generation steps span only {lo}..{hi} concurrent sequences: the fixed step cost uses a roofline "
                        f"prior (model bytes {model_bytes or 0:.3g} / {bw:g} GB/s, {src}) = {c0 * 1e3:.3g} ms")
        q = _quality(X[k2], y[k2], coef, dropped + int((~k2).sum()), "prior+nnls")
    else:
        coef, k2 = nnls_fit(X, y, groups=groups)
        q = _quality(X[k2], y[k2], coef, dropped + int((~k2).sum()), "nnls")
    return GenStepModel(*map(float, coef), quality=q, prior=prior, concurrency_range=(lo, hi)), warnings


@dataclass(frozen=True)
class GenOverheadModel:
    """Seconds of a generation round outside engine steps: a + b*responses + c*steps."""

    base: float = field(metadata={"help": "seconds per round"})
    per_response: float = field(metadata={"help": "seconds per request submitted and collected"})
    per_step: float = field(metadata={"help": "seconds between consecutive engine steps (output processing)"})
    quality: FitQuality = field(metadata={"help": "fit quality on the recorded rounds"})

    def predict(self, responses, steps):
        return self.base + self.per_response * np.asarray(responses, float) + self.per_step * np.asarray(steps, float)


@dataclass(frozen=True, eq=False)
class LengthModel:
    """Empirical prompt and response lengths, sampled with a passed-in Generator."""

    prompt_tokens: np.ndarray = field(metadata={"help": "prompt length of each recorded prompt (one per group)"})
    response_tokens: np.ndarray = field(metadata={"help": "length of each recorded response"})
    max_tokens: int = field(metadata={"help": "response cap of the recorded run (config.max_tokens)"})
    prefill_ratio: float = field(metadata={"help": "prompt tokens computed / prompt tokens submitted (prefix-cache hits lower it)"})

    @property
    def mean_response(self) -> float:
        return float(self.response_tokens.mean())

    def sample(self, rng: np.random.Generator, prompts: int, group: int, rounds: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, response lengths), each shaped (rounds, prompts*group), prompt-major order."""
        p = rng.choice(self.prompt_tokens, size=(rounds, prompts))
        r = rng.choice(self.response_tokens, size=(rounds, prompts * group))
        return np.repeat(p, group, axis=1).astype(np.int64), r.astype(np.int64)


@dataclass(frozen=True, eq=False)
class Recorded:
    """What the trace measured per RL step (for replay and for charts)."""

    step: np.ndarray = field(metadata={"help": "RL step index of each update row"})
    step_time: np.ndarray = field(metadata={"help": "recorded wall seconds of each RL step"})
    gen_time: np.ndarray = field(metadata={"help": "recorded generation seconds of each step"})
    train_time: np.ndarray = field(metadata={"help": "recorded update seconds (update row duration) + prep_time"})
    sync_time: np.ndarray = field(metadata={"help": "recorded weight-sync seconds of each step"})
    num_responses: np.ndarray = field(metadata={"help": "responses per update"})
    gen_steps: np.ndarray = field(metadata={"help": "engine steps per RL step"})
    # per-step workload in queue order, for an exact replay of the recorded responses
    workload: tuple[tuple[np.ndarray, np.ndarray], ...] = field(default=(), metadata={"help": "(prompt_tokens, response_tokens) per RL step, in queue order"})

    @property
    def responses_per_s(self) -> np.ndarray:
        return self.num_responses / self.step_time


@dataclass(frozen=True, eq=False)
class FittedModels:
    """All models fitted to one trace (or to several of one setup); frozen and picklable."""

    gen: GenStepModel = field(metadata={"help": "engine step cost vs batch composition"})
    gen_overhead: GenOverheadModel = field(metadata={"help": "generation round overhead outside engine steps"})
    lengths: LengthModel = field(metadata={"help": "prompt and response length distribution"})
    update: AffineModel = field(metadata={"help": "optimizer update seconds vs tokens trained"})
    prep: AffineModel = field(metadata={"help": "batch preparation (old log-probs, values) seconds vs tokens"})
    reward: AffineModel = field(metadata={"help": "reward/advantage seconds vs responses"})
    other: AffineModel = field(metadata={"help": "rest of the RL step (unaccounted) vs responses"})
    sync: AffineModel = field(metadata={"help": "weight sync seconds vs bytes"})
    sync_bytes: float = field(metadata={"help": "bytes per weight sync (median of sync rows, else model bytes)"})
    engine: dict = field(metadata={"help": "trace metadata `engine`: max_num_seqs, kv_cache_tokens, block_size, max_model_len"})
    config: dict = field(metadata={"help": "trace metadata `config` (algo, prompts, group, lr_rule, ...)"})
    recorded: Recorded = field(metadata={"help": "recorded per-step timings and workload"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "fit warnings"})
    source: str = field(default="", metadata={"help": "trace name(s) fitted"})
    shared_prompts: bool = field(default=False, metadata={
        "help": "the trainer laid each group's prompt out once (metadata trainer.share_prompts): tokens trained "
                "per update = one prompt per group + all response tokens, else prompt + response per sample "
                "(a group longer than the trainer's row repeats its prompt there; not modelled)"})
    validation: Any = field(default=None, metadata={
        "help": "out-of-sample checks of the step-cost fits (replay.calibration.Validation): form, R2, cross-validated error"})
    replicates: Any = field(default=None, metadata={
        "help": "bootstrap coefficient sets for intervals (replay.calibration.Replicates), None when not estimable"})

    @property
    def quality(self) -> dict[str, FitQuality]:
        return {"gen_step": self.gen.quality, "gen_overhead": self.gen_overhead.quality,
                "update": self.update.quality, "prep": self.prep.quality, "reward": self.reward.quality,
                "other": self.other.quality, "sync": self.sync.quality}

    @property
    def prompts(self) -> int:
        return int(self.config.get("prompts") or 0)

    @property
    def group(self) -> int:
        g = self.config.get("group")
        if g is None:
            g = default_group(self.config.get("algo"))
        return int(g)

    @property
    def max_concurrency(self) -> int:
        return self.gen.concurrency_range[1]

    def predict_gen_step(self, num_running, context_tokens, prefill_tokens=0.0):
        return self.gen.predict(num_running, context_tokens, prefill_tokens)


def warmup_excluded(trace: Trace) -> bool:
    """True when the runner warmed the engine up before recording (metadata engine.warmup_excluded)."""
    return bool((trace.meta.get("engine") or {}).get("warmup_excluded"))


def fit_trace(trace: Trace | list[Trace] | tuple[Trace, ...], calibration: Sequence[Trace] = ()) -> FittedModels:
    """Fit every cost model to one trace, or to several traces of the same setup: then the step
    costs (update, prep, reward, other, sync) are fitted across them (their batch sizes give the
    slopes a range), while the generation side (engine-step model, round overhead, lengths), the
    engine, the config and the recorded timings come from the first. Calibration rows (in the first
    trace, or in `calibration` traces from `rlrun calibrate`) refit the engine-step and update models
    over the calibrated range (replay/calibration.py); every fit gets its validation and replicates."""
    traces = list(trace) if isinstance(trace, (list, tuple)) else [trace]
    ref = traces[0]
    for t in traces:  # a split recording's step costs overlap and wait on each other: no colocated model in them
        if placement(getattr(t, "config", None))["mode"] == "split":
            raise RlsimError(f"{t.name} was recorded in split mode; fit a colocated recording (rlrun record --mode colocated) "
                             "and predict the split with --gen-gpus/--train-gpus/--staleness")
    from rlsim.replay.fit_steps import fit_steps, is_step_level  # step-level traces (imported logs)

    if is_step_level(ref):
        if calibration:  # its costs are per-phase totals: engine-step calibration rows have nothing to refit
            raise RlsimError(f"{ref.name} is a step-level trace imported from a log: --calibration applies only to "
                             "traces recorded by `rlrun record`; drop --calibration")
        return fit_steps(traces)
    warnings: list[str] = []

    def cat(kind: str, col: str) -> np.ndarray:
        return np.concatenate([t.rows(kind)[col].astype(float) for t in traces])

    if sum(t.count(GEN_STEP) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no gen_step rows; record it with per-step rows on (rlrun record without --no-record-steps)")
    if sum(t.count(UPDATE) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no update rows; the run recorded no complete RL step")
    if sum(t.count(RESPONSE) for t in traces) == 0:
        raise RlsimError(f"{ref.path} has no response rows; the trace cannot give response lengths")

    model_meta = ref.meta.get("model", {}) or {}
    # the engine-step model comes from the first trace only (one machine state, one engine)
    rg = ref.rows(GEN_STEP)
    gen_rows = {c: rg[c].astype(float) for c in ("duration", "num_running", "context_tokens", "prefill_tokens")}
    # warm-up = step 0, unless the runner warmed the engine up before recording
    gen_rows["step"] = np.where((rg["step"].astype(float) == 0) & (not warmup_excluded(ref)), 0.0, 1.0)
    gen_rows["round"] = rg["step"].astype(float)
    gen, w = fit_gen_steps(gen_rows, warmup_step=0, model_bytes=model_meta.get("bytes"), hardware=ref.meta.get("hardware", {}),
                           invalid_dropped=ref.dropped_rows(GEN_STEP) if hasattr(ref, "dropped_rows") else 0)
    warnings += w

    # per-RL-step aggregates, the traces' step tables end to end
    tables = [step_table(t) for t in traces]
    col = lambda c: np.concatenate([tb[c] for tb in tables])  # noqa: E731
    g_steps_n, g_dur_sum, sync_per_step = col("gen_steps"), col("gen_step_time"), col("sync_time")
    n_resp, n_tok, gen_time, step_time = col("num_responses"), col("num_tokens"), col("gen_time"), col("step_time")
    reward_time, prep_time, upd_dur, t_opt = col("reward_time"), col("prep_time"), col("update_time"), col("t_optimizer")
    s_dur, s_bytes = cat(SYNC, "duration"), cat(SYNC, "bytes")

    # generation overhead: gen_time minus the engine steps, vs responses and steps (skip warm-up steps)
    warm = np.concatenate([(t.rows(UPDATE)["step"] == 0) & (not warmup_excluded(t)) for t in traces])
    if np.all(warm):
        warm = np.zeros_like(warm)
    is_ref = np.concatenate([np.full(t.count(UPDATE), i == 0) for i, t in enumerate(traces)])
    ok = np.isfinite(gen_time) & ~warm & is_ref  # generation side: the first trace only
    gap = gen_time - g_dur_sum
    Xo = np.column_stack([np.ones(ok.sum()), n_resp[ok], g_steps_n[ok]])
    if ok.sum() >= 3:
        span_b = n_resp[ok].max() / max(n_resp[ok].min(), 1)
        if span_b < NARROW_RANGE:
            # responses constant: the per-round term and per-response term are not separable; a
            # per-step gap plus a per-response share of the rest
            per_step_coef, k = nnls_fit(Xo[:, [0, 2]], gap[ok])
            med = robust_location(gap[ok] - per_step_coef[1] * g_steps_n[ok])
            coef = np.array([0.0, max(med, 0.0) / max(float(np.median(n_resp[ok])), 1.0), per_step_coef[1]])
            oq = _quality(Xo, gap[ok], coef, 0, "nnls(per-step)+proportional")
        else:
            coef, k = nnls_fit(Xo, gap[ok])
            oq = _quality(Xo[k], gap[ok][k], coef, int((~k).sum()), "nnls")
    else:
        coef = np.zeros(3)
        oq = FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default")
    gen_overhead = GenOverheadModel(float(coef[0]), float(coef[1]), float(coef[2]), oq)

    sel = ~warm
    if not sel.any():
        sel = np.ones_like(warm)
    # Is prep_time inside the update row's duration (old log-probs computed by the update call)?
    # Then the update proper is duration - prep_time; the step's other time must not subtract it twice.
    parts = cat(UPDATE, "t_forward") + cat(UPDATE, "t_backward") + t_opt
    prep_inside = False
    if np.any(prep_time[sel] > 0):
        slack = upd_dur - parts
        ok_p = np.isfinite(slack) & sel
        if ok_p.any():
            prep_inside = bool(np.median(slack[ok_p]) >= 0.5 * np.median(prep_time[ok_p]))
    upd_proper = upd_dur - prep_time if prep_inside else upd_dur
    hint = robust_location(t_opt[sel]) if np.isfinite(t_opt[sel]).any() else 0.0
    grp = np.concatenate([np.full(t.count(UPDATE), i) for i, t in enumerate(traces)])[sel] if len(traces) > 1 else None
    update = fit_affine("update", "tokens", n_tok[sel], upd_proper[sel], intercept_hint=hint, groups=grp)
    prep = fit_affine("prep", "tokens", n_tok[sel], prep_time[sel], groups=grp)
    reward = fit_affine("reward", "responses", n_resp[sel], reward_time[sel], groups=grp)
    other_t = step_time - gen_time - reward_time - prep_time - upd_proper - sync_per_step
    other = fit_affine("other", "responses", n_resp[sel], np.maximum(other_t[sel], 0.0), intercept_hint=robust_location(np.maximum(other_t[sel], 0)), groups=grp)
    if len(s_dur):
        sync = fit_affine("sync", "bytes", s_bytes, s_dur)
        sync_bytes = float(np.median(s_bytes))
    else:
        sync = AffineModel("sync", "bytes", 0.0, 0.0, FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default"))
        sync_bytes = float(model_meta.get("bytes") or 0.0)

    # lengths
    resp = ref.rows(RESPONSE)
    first = resp["group_index"] == 0
    p_tok = resp["prompt_tokens"][first] if first.any() else resp["prompt_tokens"]
    max_tokens = int(ref.config.get("max_tokens") or int(np.max(resp["response_tokens"])))
    pre_total = float(np.sum(ref.rows(GEN_STEP)["prefill_tokens"]))
    prompt_total = float(np.sum(resp["prompt_tokens"]))
    ratio = float(np.clip(pre_total / prompt_total, 0.0, 1.5)) if prompt_total > 0 else 1.0
    lengths = LengthModel(prompt_tokens=p_tok.astype(np.int64), response_tokens=np.maximum(resp["response_tokens"], 1).astype(np.int64),
                          max_tokens=max_tokens, prefill_ratio=ratio)

    # recorded (reference trace only)
    ru = ref.rows(UPDATE)
    n_ref = len(ru["step"])
    rec_steps = ru["step"].astype(np.int64)
    workload = []
    order = np.lexsort((resp["group_index"], resp["prompt_id"], resp["t_queued"] if np.isfinite(resp["t_queued"]).all() else resp["prompt_id"]))
    r_step = resp["consumed_step"] if np.isfinite(resp["consumed_step"].astype(float)).all() else resp["step"]
    r_step = r_step[order].astype(np.int64)
    rp, rr = resp["prompt_tokens"][order].astype(np.int64), np.maximum(resp["response_tokens"][order], 1).astype(np.int64)
    for s in rec_steps:
        m = r_step == s
        workload.append((rp[m], rr[m]))
    recorded = Recorded(step=rec_steps, step_time=step_time[:n_ref], gen_time=gen_time[:n_ref],
                        train_time=upd_proper[:n_ref] + prep_time[:n_ref], sync_time=sync_per_step[:n_ref],
                        num_responses=n_resp[:n_ref], gen_steps=g_steps_n[:n_ref], workload=tuple(workload))

    engine = dict(ref.meta.get("engine", {}) or {})
    if not engine.get("max_num_seqs"):
        engine["max_num_seqs"] = int(ref.config.get("max_num_seqs") or max(gen.concurrency_range[1], 1))
        warnings.append(f"trace metadata has no engine.max_num_seqs; using {engine['max_num_seqs']}")
    engine.setdefault("block_size", ENGINE_DEFAULTS["block_size"])
    engine.setdefault("max_model_len", int(ref.config.get("max_model_len") or ENGINE_DEFAULTS["max_model_len"]))
    if not engine.get("kv_cache_tokens"):
        engine["kv_cache_tokens"] = int(engine["max_num_seqs"] * engine["max_model_len"])
    shared = [bool((t.meta.get("trainer") or {}).get("share_prompts")) for t in traces]
    if len(set(shared)) > 1:
        warnings.append("the traces differ in trainer.share_prompts, so their num_tokens count prompts differently "
                        "and the update-cost fit mixes the two; fit traces recorded by the same rlrun version")
    models = FittedModels(gen=gen, gen_overhead=gen_overhead, lengths=lengths, update=update, prep=prep, reward=reward,
                          other=other, sync=sync, sync_bytes=sync_bytes, engine=engine, config=dict(ref.config),
                          recorded=recorded, warnings=tuple(warnings), source=",".join(t.name for t in traces),
                          shared_prompts=shared[0])
    from rlsim.replay.calibration import calibrate  # calibration rows, validation, replicates

    return calibrate(models, traces, gen_rows, upd_proper=upd_proper, n_tok=n_tok, t_opt=t_opt, sel=sel,
                     t_fb=cat(UPDATE, "t_forward") + cat(UPDATE, "t_backward"), calibration=list(calibration),
                     ref_rows=is_ref)
