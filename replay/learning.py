"""Learning models: the eval curve against cumulative responses, and the gradient noise scale of a run.

- `LearningCurve`: held-out score against responses trained, isotonic-smoothed; samples-to-target N*; a run's
  sample cost against a reference's from a prefix of its curve (`prefix_log_rho`, at equal responses).
- `noise_scale`: B_noise = tr(Sigma) / |G|^2 from the two-batch estimators of McCandlish et al. (2018) on the
  trace's micro-batch and full-batch gradient norms, EMA-smoothed (`b_noise_estimate`), with bootstrap replicates
  over the updates (`b_noise_replicates`). The one estimator of the project: rlsim's rho and the studies use it.

The sample-cost models rho(B) built on these are in `rlsim.replay.rho`. Pure numpy; imports neither torch nor SimPy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.replay.util import default_group
from rlsim.replay.io import Trace
from rlsim.replay.schema import EVAL, UPDATE


@dataclass(frozen=True, eq=False)
class LearningCurve:
    """Held-out score against cumulative training responses, from eval rows."""

    cum_responses: np.ndarray = field(metadata={"help": "training responses consumed at each eval (sorted)"})
    score: np.ndarray = field(metadata={"help": "eval score at each point"})
    responses_per_update: int = field(default=0, metadata={"help": "responses per update (B = P x G) of the run"})
    lr_rule: str = field(default="", metadata={"help": "learning-rate rule of the run"})
    name: str = field(default="", metadata={"help": "trace name"})
    staleness: int = field(default=0, metadata={"help": "staleness limit the run was recorded with (config "
                                                        "`staleness`; 0: synchronous)"})
    lr: float = field(default=math.nan, metadata={"help": "the run's effective learning rate (nan: not recorded)"})

    @property
    def smoothed(self) -> np.ndarray:
        """The scores made non-decreasing by isotonic regression (pool adjacent violators): eval noise
        averaged over neighbouring evals, so one lucky eval does not decide the crossing."""
        return isotonic(self.score)

    @property
    def best(self) -> float:
        """Best score of the smoothed curve."""
        return float(np.max(self.smoothed)) if len(self.score) else math.nan

    def samples_to_target(self, target: float) -> float | None:
        """Responses at which the smoothed score first reaches `target`, linearly interpolated between
        the eval before and the eval that reached it; None when never reached."""
        s, n = self.smoothed, self.cum_responses
        hit = np.nonzero(s >= target - 1e-12)[0]
        if len(hit) == 0:
            return None
        i = int(hit[0])
        if i == 0:
            return float(n[0])
        s0, s1, n0, n1 = s[i - 1], s[i], n[i - 1], n[i]
        frac = (target - s0) / (s1 - s0) if s1 > s0 else 1.0
        return float(n0 + frac * (n1 - n0))


def isotonic(y) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    y = np.asarray(y, float)
    vals: list[float] = []
    counts: list[int] = []
    for v in y:
        vals.append(float(v))
        counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            c = counts[-2] + counts[-1]
            vals[-2] = (vals[-2] * counts[-2] + vals[-1] * counts[-1]) / c
            counts[-2] = c
            vals.pop()
            counts.pop()
    return np.repeat(vals, counts) if vals else np.zeros(0)


def fit_learning_curve(trace: Trace) -> LearningCurve:
    ev = trace.rows(EVAL)
    order = np.argsort(ev["cum_responses"], kind="stable")
    cfg = trace.config
    g = cfg.get("group") or default_group(cfg.get("algo"))
    return LearningCurve(cum_responses=ev["cum_responses"][order].astype(float), score=ev["score"][order].astype(float),
                         responses_per_update=int((cfg.get("prompts") or 0) * g), lr_rule=str(cfg.get("lr_rule") or ""),
                         name=trace.name,
                         staleness=int(cfg.get("max_staleness", cfg.get("staleness")) or 0), lr=effective_lr(cfg))


def effective_lr(cfg: dict) -> float:
    """The lr a run trained with: its recorded `lr_effective`, else `lr` under `lr_rule` from `lr_ref_batch`."""
    if cfg.get("lr_effective") is not None:
        return float(cfg["lr_effective"])
    lr, ref = cfg.get("lr"), cfg.get("lr_ref_batch")
    b = (cfg.get("prompts") or 0) * (cfg.get("group") or default_group(cfg.get("algo")))
    if lr is None or not ref or not b:
        return math.nan
    return float(lr) * lr_scale(str(cfg.get("lr_rule") or "sqrt"), b / float(ref))


def lr_scale(rule: str, ratio: float) -> float:
    """lr(B) / lr(B_ref) under an lr rule, for B / B_ref = ratio."""
    return {"sqrt": math.sqrt(ratio), "linear": ratio}.get(rule, 1.0)


@dataclass(frozen=True, eq=False)
class NoiseScale:
    """Gradient noise scale B_noise = tr(Sigma)/|G|^2 (~ B_crit) from the two-batch estimators."""

    b_crit: float = field(metadata={"help": "EMA-smoothed B_noise at the end of the run, in responses (the run's ratio "
                                            "of means where that is not positive; nan if neither is)"})
    series: np.ndarray = field(metadata={"help": "B_noise after each update (EMA ratio)"})
    g2: np.ndarray = field(metadata={"help": "per-update |G|^2 estimates (unsmoothed)"})
    trace_sigma: np.ndarray = field(metadata={"help": "per-update tr(Sigma) estimates (unsmoothed)"})
    updates_used: int = field(metadata={"help": "update rows with both norms and micro_batch < num_responses"})
    critic_b_crit: float = field(default=math.nan,
                                 metadata={"help": "the same for the PPO value model (nan without critic norms)"})

    @property
    def ratio_of_means(self) -> float:
        """B_noise averaged over every update (`ratio_of_means`), beside the EMA's end value in `b_crit`."""
        return ratio_of_means(self.g2, self.trace_sigma)


def two_batch_estimates(b_small, b_big, norm_small, norm_big) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased |G|^2 and tr(Sigma) from squared gradient norms at two batch sizes."""
    b_small, b_big = np.asarray(b_small, float), np.asarray(b_big, float)
    gs2, gb2 = np.asarray(norm_small, float) ** 2, np.asarray(norm_big, float) ** 2
    g2 = (b_big * gb2 - b_small * gs2) / (b_big - b_small)
    tr = (gs2 - gb2) / (1.0 / b_small - 1.0 / b_big)
    return g2, tr


def ema_ratio(num: np.ndarray, den: np.ndarray, alpha: float) -> np.ndarray:
    """EMA(num)/EMA(den), bias-corrected, after each element."""
    out = np.empty(len(num))
    en = ed = 0.0
    for i, (a, b) in enumerate(zip(num, den)):
        en = (1 - alpha) * en + alpha * a
        ed = (1 - alpha) * ed + alpha * b
        out[i] = en / ed if ed > 0 else math.nan
    return out


def ratio_of_means(g2: np.ndarray, tr: np.ndarray) -> float:
    """B_noise averaged over every update: mean tr(Sigma) / mean |G|^2 (nan when the mean |G|^2 is not positive)."""
    return float(np.mean(tr) / np.mean(g2)) if len(g2) and np.mean(g2) > 0 else math.nan


def b_noise_estimate(series: np.ndarray, g2: np.ndarray, tr: np.ndarray) -> float:
    """The EMA ratio's last value; where that is not positive (|G|^2's EMA dipped below 0 at the end, as single
    estimates of |G|^2 often do when noise dominates), the ratio of the run's means, the same quantity averaged
    over every update; nan when that is not positive either."""
    for b in (series[-1] if len(series) else math.nan, ratio_of_means(g2, tr)):
        if b > 0 and math.isfinite(b):
            return float(b)
    return math.nan


def b_noise_replicates(noise: NoiseScale, reps: int = 64, alpha: float = 0.2, seed: int = 0) -> np.ndarray | None:
    """B_noise re-estimated on bootstrap resamples of the updates (kept in time order: the EMA weighs late ones):
    the EMA ratio's last value of each resample, the positive finite ones; None with fewer than 4 updates or 8
    replicates, or when the run's own estimate is not positive."""
    g2, tr = np.asarray(noise.g2, float), np.asarray(noise.trace_sigma, float)
    if len(g2) < 4 or not (noise.b_crit > 0):
        return None
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        i = np.sort(rng.integers(0, len(g2), len(g2)))
        v = float(ema_ratio(tr[i], g2[i], alpha)[-1])
        if v > 0 and math.isfinite(v):
            out.append(v)
    return np.array(out) if len(out) >= 8 else None


def noise_scale(trace: Trace, *, alpha: float = 0.2) -> NoiseScale:
    u = trace.rows(UPDATE)

    def est(norm_col: str, micro_col: str):
        b_big = u["num_responses"].astype(float)
        b_small = u["micro_batch"].astype(float)
        gb, gs = u[norm_col].astype(float), u[micro_col].astype(float)
        ok = np.isfinite(gb) & np.isfinite(gs) & np.isfinite(b_small) & (b_small > 0) & (b_small < b_big)
        if not ok.any():
            return math.nan, np.zeros(0), np.zeros(0), np.zeros(0), 0
        g2, tr = two_batch_estimates(b_small[ok], b_big[ok], gs[ok], gb[ok])
        series = ema_ratio(tr, g2, alpha)
        return b_noise_estimate(series, g2, tr), series, g2, tr, int(ok.sum())

    b, series, g2, tr, n = est("grad_norm", "grad_norm_micro")
    cb = est("critic_grad_norm", "critic_grad_norm_micro")[0]
    return NoiseScale(b_crit=b, series=series, g2=g2, trace_sigma=tr, updates_used=n, critic_b_crit=cb)


def prefix_log_rho(reference: LearningCurve, run: LearningCurve, k: float, points: int = 6) -> float:
    """log rho of `run` against `reference` from the run's first k responses, learning curves set side by side at equal
    responses: at each k' in [k/2, k] (`points` of them) the run's smoothed score s(k') is the reference's at n_ref(s),
    so log(k' / n_ref) is its sample cost at that score; the median over the k'. nan when no k' gives one (the run
    never beat the reference's first eval, or scored beyond the reference's best, or trained fewer than k/2)."""
    vals = []
    for q in np.linspace(0.5 * k, k, points):
        if q > run.cum_responses[-1] + 1e-9 or q <= 0:
            continue
        s = float(np.interp(q, run.cum_responses, run.smoothed))
        n = reference.samples_to_target(s)
        if n is not None and n > 0 and s > reference.smoothed[0] + 1e-12:
            vals.append(math.log(q / n))
    return float(np.median(vals)) if vals else math.nan
