"""Learning models: the eval curve vs cumulative responses, the gradient noise scale, and the
sample-cost models rho(B) = N*(B) / N*(B_ref).

- invariant:   rho = 1 (inside the approximately batch-size-invariant range, with the lr rescaled).
- noise-scale: B_crit from the two-batch estimators of McCandlish et al. (2018) on the trace's
  micro-batch and full-batch gradient norms (EMA-smoothed), then E(B) = E_min (1 + B/B_crit), so
  rho(B) = (1 + B/B_crit) / (1 + B_ref/B_crit).
- curves:      several traces at different batch sizes: samples-to-target N*(B), interpolated linearly
  in log B (clamped outside the measured range).

Pure numpy; imports neither torch nor SimPy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.util import default_group
from rlsim.replay.io import Trace
from rlsim.replay.schema import EVAL, UPDATE

RHO_MODELS = ("invariant", "noise-scale", "curves", "auto")


@dataclass(frozen=True, eq=False)
class LearningCurve:
    """Held-out score against cumulative training responses, from eval rows."""

    cum_responses: np.ndarray = field(metadata={"help": "training responses consumed at each eval (sorted)"})
    score: np.ndarray = field(metadata={"help": "eval score at each point"})
    batch: int = field(default=0, metadata={"help": "responses per update (B = P x G) of the run"})
    lr_rule: str = field(default="", metadata={"help": "learning-rate rule of the run"})
    name: str = field(default="", metadata={"help": "trace name"})
    staleness: int = field(default=0, metadata={"help": "staleness limit the run was recorded with (config `staleness`; 0: synchronous)"})

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
                         batch=int((cfg.get("prompts") or 0) * g), lr_rule=str(cfg.get("lr_rule") or ""), name=trace.name,
                         staleness=int(cfg.get("max_staleness", cfg.get("staleness")) or 0))


@dataclass(frozen=True, eq=False)
class NoiseScale:
    """Gradient noise scale B_noise = tr(Sigma)/|G|^2 (~ B_crit) from the two-batch estimators."""

    b_crit: float = field(metadata={"help": "EMA-smoothed B_noise at the end of the run, in responses (nan if not estimable)"})
    series: np.ndarray = field(metadata={"help": "B_noise after each update (EMA ratio)"})
    g2: np.ndarray = field(metadata={"help": "per-update |G|^2 estimates (unsmoothed)"})
    trace_sigma: np.ndarray = field(metadata={"help": "per-update tr(Sigma) estimates (unsmoothed)"})
    updates_used: int = field(metadata={"help": "update rows with both norms and micro_batch < num_responses"})
    critic_b_crit: float = field(default=math.nan, metadata={"help": "the same for the PPO value model (nan without critic norms)"})


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
        last = float(series[-1]) if len(series) else math.nan
        if not (last > 0 and math.isfinite(last)):
            last = math.nan
        return last, series, g2, tr, int(ok.sum())

    b, series, g2, tr, n = est("grad_norm", "grad_norm_micro")
    cb = est("critic_grad_norm", "critic_grad_norm_micro")[0]
    return NoiseScale(b_crit=b, series=series, g2=g2, trace_sigma=tr, updates_used=n, critic_b_crit=cb)


# ---- rho models ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RhoModel:
    """Sample cost rho(B) relative to B_ref; `kind` is invariant | noise-scale | curves."""

    kind: str = field(metadata={"help": "invariant | noise-scale | curves"})
    b_ref: float = field(metadata={"help": "reference batch in responses"})
    b_crit: float = field(default=math.nan, metadata={"help": "critical batch (noise-scale)"})
    log_b: tuple[float, ...] = field(default=(), metadata={"help": "curves: log batch of each trace (sorted)"})
    n_star: tuple[float, ...] = field(default=(), metadata={"help": "curves: samples-to-target of each trace"})
    lr_rules: tuple[str, ...] = field(default=(), metadata={"help": "curves: lr rule of each trace"})
    invariant_range: float = field(default=16.0, metadata={"help": "invariant: batch ratio up to which rho = 1 is trusted"})

    def rho(self, b: float) -> float:
        if self.kind == "invariant":
            return 1.0
        if self.kind == "noise-scale":
            return (1 + b / self.b_crit) / (1 + self.b_ref / self.b_crit)
        if self.kind == "curves":
            n_ref = float(np.interp(math.log(self.b_ref), self.log_b, self.n_star))
            return float(np.interp(math.log(b), self.log_b, self.n_star)) / n_ref
        raise RlsimError(f"unknown rho model {self.kind!r}; use one of invariant, noise-scale, curves, auto")

    def notes(self, b: float) -> list[str]:
        """Warnings about trusting rho at batch b."""
        out = []
        r = b / self.b_ref
        if self.kind == "invariant" and (r > self.invariant_range or r < 1 / self.invariant_range):
            out.append(f"rho=1 assumed at {r:.3g}x the reference batch, outside the {self.invariant_range:g}x range the "
                       "article found approximately invariant; record runs at other batch sizes (--rho curves)")
        if self.kind == "curves" and self.log_b:
            lb = math.log(b)
            if lb < self.log_b[0] - 1e-9 or lb > self.log_b[-1] + 1e-9:
                out.append(f"batch {b:g} is outside the measured curves ({math.exp(self.log_b[0]):g}..{math.exp(self.log_b[-1]):g}): "
                           "rho is clamped to the nearest measured value")
        return out


def invariant_rho(b_ref: float) -> RhoModel:
    return RhoModel("invariant", float(b_ref))


def noise_scale_rho(b_ref: float, b_crit: float) -> RhoModel:
    if not (b_crit > 0 and math.isfinite(b_crit)):
        raise RlsimError("the gradient noise scale is not estimable from this trace (grad_norm and grad_norm_micro "
                         "missing or too noisy); use --rho invariant or --rho curves")
    return RhoModel("noise-scale", float(b_ref), b_crit=float(b_crit))


def curves_rho(b_ref: float, curves: list[LearningCurve], target: float) -> RhoModel:
    """rho from the samples-to-target of several runs; runs at the same batch are averaged."""
    pts: dict[float, list[float]] = {}
    rules: dict[float, str] = {}
    for c in curves:
        n = c.samples_to_target(target)
        if n is None or n <= 0 or c.batch <= 0:  # never reached, or already at the start
            continue
        pts.setdefault(float(c.batch), []).append(n)
        rules[float(c.batch)] = c.lr_rule
    if len(pts) < 2:
        raise RlsimError(f"--rho curves needs traces at two or more batch sizes that reach the target {target:.4g}; "
                         f"got {len(pts)} (add --trace for runs at other batch sizes, or lower --target)")
    if float(b_ref) not in pts:
        raise RlsimError(f"the reference trace does not reach the target {target:.4g}; lower --target")
    bs = sorted(pts)
    return RhoModel("curves", float(b_ref), log_b=tuple(math.log(b) for b in bs),
                    n_star=tuple(float(np.mean(pts[b])) for b in bs), lr_rules=tuple(rules[b] for b in bs))


def regime(ratio: float, tol: float = 0.05) -> str:
    """Time-to-target ratio -> 'time falls' | 'flat' | 'time rises'."""
    if not math.isfinite(ratio):
        return "unknown"
    if ratio < 1 - tol:
        return "time falls"
    if ratio > 1 + tol:
        return "time rises"
    return "flat"
