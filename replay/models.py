"""What a fit of a trace is: `FittedModels` and its parts (the engine-step cost, the generation round
overhead, the length distribution, what was recorded), with the out-of-sample `Validation` and the bootstrap
`Replicates` of its step-cost fits (and the `interval` they give). No fitting here: replay/fit.py and
replay/fit_steps.py fit them, replay/calibration.py refits and validates them, replay/devices.py rescales
them, and the simulator reads them. Imports neither torch nor SimPy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsim.replay.cost import EngineStepCost
from rlsim.replay.robust import AffineModel, FitQuality, PiecewiseLinear, hinge_predict
from rlsim.replay.util import default_group

INTERVAL = 0.90         # central coverage of the reported intervals


# --------------------------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class LevelError:
    """One held-out level of a cross-validation."""

    level: float = field(metadata={"help": "median num_running (engine) or tokens (training) of the level"})
    rows: int = field(metadata={"help": "rows in the level"})
    rel_err: float = field(metadata={"help": "predicted / measured summed seconds of the level - 1, fitted without it"})


@dataclass(frozen=True, eq=False)
class Validation:
    """Out-of-sample checks of the step-cost fits: what `rlsim run` and the report print."""

    gen_form: str = field(metadata={"help": "engine-step form used: linear | knee | interp"})
    gen_knee: float = field(metadata={"help": "knee (num_running) of the knee form, nan for the other forms"})
    gen_r2: float = field(metadata={"help": "R2 of the engine-step fit on the rows used"})
    gen_cv: float = field(metadata={"help": "RMS relative error of held-out concurrency levels, form used"})
    gen_cv_max: float = field(metadata={"help": "largest |relative error| of a held-out level, form used"})
    gen_cv_linear: float = field(metadata={"help": "the same RMS for the linear form"})
    gen_cv_knee: float = field(metadata={"help": "the same RMS for the knee form (nan: too few levels)"})
    gen_levels: tuple[LevelError, ...] = field(metadata={"help": "held-out errors per level, form used"})
    gen_source: str = field(metadata={"help": "rows the engine-step fit used"})
    gen_cv_interp: float = field(default=math.nan, metadata={
        "help": "the same RMS for the interpolated form (nan: no calibration ladder of enough levels)"})
    gen_knots: int = field(default=0,
                           metadata={"help": "measured levels the interpolated form has knots at (0: another form)"})
    train_form: str = field(default="", metadata={
        "help": "training form: interp (forward + backward interpolated over the calibration's token levels), "
                "else '' (the run's own line, fit.py)"})
    train_r2: float = field(default=math.nan,
                            metadata={"help": "R2 of the training fit (calibration levels and run updates)"})
    train_cv: float = field(default=math.nan, metadata={"help": "RMS relative error of held-out token levels"})
    train_cv_max: float = field(default=math.nan,
                                metadata={"help": "largest |relative error| of a held-out token level"})
    train_levels: tuple[LevelError, ...] = field(default=(), metadata={"help": "held-out errors per token level"})
    train_run_err: float = field(default=math.nan, metadata={
        "help": "the run's median update predicted from the calibration alone (+ its optimizer time) / measured - 1"})
    train_source: str = field(default="", metadata={"help": "rows the training fit used"})
    train_flat: float = field(default=math.nan, metadata={
        "help": "largest token ratio over which the training curve does not rise (1: it rises everywhere; nan: no "
                "calibrated curve); judged by rlsim.replay.fit_quality"})
    calibrated: bool = field(default=False, metadata={"help": "calibration rows were used"})
    interval_method: str = field(default="", metadata={"help": "how the intervals are made"})
    notes: tuple[str, ...] = field(default=(), metadata={"help": "what the validation found (form chosen and why)"})

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["gen_levels"] = [vars(x) for x in self.gen_levels]
        d["train_levels"] = [vars(x) for x in self.train_levels]
        d["notes"] = list(self.notes)
        return d

    def summary(self) -> list[str]:
        """Lines for `rlsim run`."""
        pct = lambda v: "n/a" if not math.isfinite(v) else f"{100 * v:.1f}%"  # noqa: E731
        form = (f"interpolated over {self.gen_knots} measured levels" if self.gen_form == "interp"
                else self.gen_form + (f" at {self.gen_knee:.0f} running" if self.gen_form == "knee" else ""))
        out = [f"engine-step fit: {form}, leave-one-level-out {pct(self.gen_cv)} RMS (max {pct(self.gen_cv_max)}; "
               f"linear {pct(self.gen_cv_linear)}, knee {pct(self.gen_cv_knee)}), R2 {self.gen_r2:.3f}; "
               f"{self.gen_source}"]
        if self.train_source:
            run = (f", run's update from the calibration {100 * self.train_run_err:+.1f}%"
                   if math.isfinite(self.train_run_err) else "")
            form = f"interpolated over {len(self.train_levels)} token levels, " if self.train_form == "interp" else ""
            out.append(f"training fit: {form}leave-one-level-out {pct(self.train_cv)} RMS (max "
                       f"{pct(self.train_cv_max)}){run}, R2 {self.train_r2:.3f}; {self.train_source}")
        return out


@dataclass(frozen=True, eq=False)
class Replicates:
    """Bootstrap refits of the engine-step and update models (one row per replicate)."""

    gen: np.ndarray = field(metadata={
        "help": "(R, 4 + 2K): c_step, c_seq, c_ctx, c_prefill, then a (slope change, knee) pair per hinge "
                "(replay/cost.py)"})
    update: np.ndarray = field(metadata={
        "help": "(R, 2 + 2K): seconds at 0 tokens, seconds per token, then a (slope change, knee) pair per hinge "
                "(`robust.hinge_predict`; K = 0: a line)"})
    b_crit: np.ndarray | None = field(default=None,
                                      metadata={"help": "(R,) gradient noise scale replicates (filled by the what-if)"})
    method: str = field(default="", metadata={"help": "what was resampled"})
    level: float = field(default=INTERVAL, metadata={"help": "central coverage of the intervals"})

    def __len__(self) -> int:
        return len(self.gen)

    def update_seconds(self, tokens) -> np.ndarray:
        """(R,) + tokens' shape: each replicate's update seconds at `tokens`."""
        return hinge_predict(self.update, tokens)


def interval(point: float, reps: np.ndarray, level: float = INTERVAL) -> tuple[float, float]:
    """(lo, hi): `point` times the central `level` quantiles of reps / median(reps) (nan when not estimable)."""
    reps = np.asarray(reps, float)
    reps = reps[np.isfinite(reps) & (reps > 0)]
    if not (math.isfinite(point) and len(reps) >= 8):
        return math.nan, math.nan
    r = reps / np.median(reps)
    a = (1 - level) / 2
    lo, hi = np.quantile(r, [a, 1 - a])
    return float(point * min(lo, 1.0)), float(point * max(hi, 1.0))



# --------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class GenStepModel(EngineStepCost):
    """The engine-step cost (replay/cost.py: its formula, features, per-step, per-stretch and summed seconds)
    as fitted to a trace, with how it was fitted."""

    quality: FitQuality = field(metadata={"help": "fit quality on the gen_step rows"})
    prior: bool = field(default=False,
                        metadata={"help": "c_step came from the roofline prior (too little concurrency range)"})
    concurrency_range: tuple[int, int] = field(default=(0, 0),
                                               metadata={"help": "min and max num_running of the fitted rows"})
    form: str = field(default="linear", metadata={
        "help": "linear (no hinge) | knee (one hinge) | interp (a hinge at each inner measured level's concurrency)"})

    def predict(self, num_running, context_tokens, prefill_tokens=0.0):
        """Seconds per step for arrays of batch composition (broadcasts): `step`."""
        return self.step(num_running, context_tokens, prefill_tokens)

    def throughput(self, num_running, context_per_seq: float):
        """Decode tokens per second at a steady batch of `num_running` sequences of mean context `context_per_seq`."""
        n = np.asarray(num_running, float)
        return n / self.step(n, n * context_per_seq)



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
    prefill_ratio: float = field(metadata={"help": "prompt tokens computed / prompt tokens submitted (prefix-cache "
                                                   "hits lower it)"})

    @property
    def mean_response(self) -> float:
        return float(self.response_tokens.mean())

    def sample(self, rng: np.random.Generator, prompts: int, group: int,
               rounds: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, response lengths), each shaped (rounds, prompts*group), prompt-major order."""
        p = rng.choice(self.prompt_tokens, size=(rounds, prompts))
        r = rng.choice(self.response_tokens, size=(rounds, prompts * group))
        return np.repeat(p, group, axis=1).astype(np.int64, copy=False), r.astype(np.int64, copy=False)


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
    workload: tuple[tuple[np.ndarray, np.ndarray], ...] = field(default=(), metadata={
        "help": "(prompt_tokens, response_tokens) per RL step, in queue order"})

    @property
    def responses_per_s(self) -> np.ndarray:
        return self.num_responses / self.step_time


@dataclass(frozen=True, eq=False)
class FittedModels:
    """All models fitted to one trace (or to several of one setup); frozen and picklable."""

    gen: GenStepModel = field(metadata={"help": "engine step cost vs batch composition"})
    gen_overhead: GenOverheadModel = field(metadata={"help": "generation round overhead outside engine steps"})
    lengths: LengthModel = field(metadata={"help": "prompt and response length distribution"})
    update: AffineModel | PiecewiseLinear = field(metadata={
        "help": "update seconds vs tokens trained: a line (the run alone), or the calibration's forward + backward "
                "seconds interpolated over its token levels plus the run's fixed cost"})
    prep: AffineModel = field(metadata={"help": "batch preparation (old log-probs, values) seconds vs tokens"})
    reward: AffineModel = field(metadata={"help": "reward/advantage seconds vs responses"})
    other: AffineModel = field(metadata={"help": "rest of the RL step (unaccounted) vs responses"})
    sync: AffineModel = field(metadata={"help": "weight sync seconds vs bytes"})
    sync_bytes: float = field(metadata={"help": "bytes per weight sync (median of sync rows, else model bytes)"})
    engine: dict = field(metadata={"help": "trace metadata `engine`: max_num_seqs, kv_cache_tokens, block_size, "
                                           "max_model_len"})
    config: dict = field(metadata={"help": "trace metadata `config` (algo, prompts, group, lr_rule, ...)"})
    recorded: Recorded = field(metadata={"help": "recorded per-step timings and workload"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "fit warnings"})
    source: str = field(default="", metadata={"help": "trace name(s) fitted"})
    shared_prompts: bool = field(default=False, metadata={
        "help": "the trainer laid each group's prompt out once (metadata trainer.share_prompts): tokens trained "
                "per update = one prompt per group + all response tokens, else prompt + response per sample "
                "(a group longer than the trainer's row repeats its prompt there; not modelled)"})
    validation: Validation | None = field(default=None, metadata={
        "help": "out-of-sample checks of the step-cost fits (Validation): form, R2, cross-validated error"})
    replicates: Replicates | None = field(default=None, metadata={
        "help": "bootstrap coefficient sets for intervals (Replicates), None when not estimable"})
    alternative: FittedModels | None = field(default=None, metadata={
        "help": "the models at the far end of what the trace cannot identify (a log at one batch size: the per-step "
                "generation cost as large as its longest response allows; a log of whole steps: generation's share of "
                "the step at its high end), fitting the trace as well; None when identified. Predictions are made with "
                "both for the interval"})

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

