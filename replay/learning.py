"""Learning models: the eval curve vs cumulative responses, the gradient noise scale, and the
sample-cost models rho(B) = N*(B) / N*(B_ref).

- invariant:   rho = 1 (inside the approximately batch-size-invariant range, with the lr rescaled).
- noise-scale: B_crit from the two-batch estimators of McCandlish et al. (2018) on the trace's
  micro-batch and full-batch gradient norms (EMA-smoothed), then E(B) = E_min (1 + B/B_crit), so
  rho(B) = (1 + B/B_crit) / (1 + B_ref/B_crit).
- curves:      several traces at different batch sizes: samples-to-target N*(B), interpolated linearly
  in log B. Outside the measured range, a power law N* ~ B^s through the nearest measured segment, s clipped
  to [0, 1], with the bounds s = 0 and s = 1 as its interval (`bounds`).

Bounds without a measurement (McCandlish et al. 2018): a larger batch needs no fewer samples (N* rises
with B) and no more updates (N*/B falls with B), so beyond the last measured batch b_m, rho(B) lies in
[rho(b_m), rho(b_m) B / b_m], and below the first in [rho(b_1) B / b_1, rho(b_1)]. An invariant rho that
was assumed rather than asked for (`assumed`, no learning data at other sizes) carries the same bounds
around the reference: rho in [1, B / B_ref] above it, [B / B_ref, 1] below.
- lr-aware:    Adam at the lr each batch actually gets (the run's lr rule), not the tuned-at-every-batch lr
  that noise-scale assumes. Progress per update, relative to the reference's:
      delta(B) = x h(B) - kappa x^2 h(B_ref),   x = lr(B) / lr(B_ref),   h(B) = (1 + B_bend / B)^(-1/2)
  First order: Adam's update has a fixed size per coordinate, so the gain along the gradient is lr times the
  update's signal fraction, |G| / sqrt(|G|^2 + tr(Sigma)/B) for a noise scale B_bend (h). Second order: the
  curvature cost of an update of size lr (kappa: the share of the reference's first-order gain it takes
  back). Then N*(B) ~ B / delta(B) and rho(B) = (B / B_ref) delta(B_ref) / delta(B): flat while B << B_bend
  under the sqrt rule, then rising steeply once h saturates and the x^2 term grows (infinite where delta <= 0:
  that lr does not make progress). B_bend and kappa are fitted on runs at other batch sizes or lrs
  (`fit_lr_aware`) or given. B_bend is fitted rather than taken from the trace's two-batch B_noise: Adam's
  per-coordinate noise scale is not tr(Sigma)/|G|^2, and the two-batch estimate varied 3-5x between seeds of
  one configuration in the study, which made per-trace scaling worse on seeds it did not see (docs/results.md).
  The constants are the task's: one task's fit does not transfer to another, so there are no defaults.

Pure numpy; imports neither torch nor SimPy.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.util import default_group
from rlsim.replay.io import Trace
from rlsim.replay.schema import EVAL, UPDATE

RHO_MODELS = ("invariant", "noise-scale", "curves", "lr-aware", "auto")


@dataclass(frozen=True, eq=False)
class LearningCurve:
    """Held-out score against cumulative training responses, from eval rows."""

    cum_responses: np.ndarray = field(metadata={"help": "training responses consumed at each eval (sorted)"})
    score: np.ndarray = field(metadata={"help": "eval score at each point"})
    batch: int = field(default=0, metadata={"help": "responses per update (B = P x G) of the run"})
    lr_rule: str = field(default="", metadata={"help": "learning-rate rule of the run"})
    name: str = field(default="", metadata={"help": "trace name"})
    staleness: int = field(default=0, metadata={"help": "staleness limit the run was recorded with (config `staleness`; 0: synchronous)"})
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
                         batch=int((cfg.get("prompts") or 0) * g), lr_rule=str(cfg.get("lr_rule") or ""), name=trace.name,
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

    b_crit: float = field(metadata={"help": "EMA-smoothed B_noise at the end of the run, in responses (the run's ratio of "
                                            "means where that is not positive; nan if neither is)"})
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


def b_noise_estimate(series: np.ndarray, g2: np.ndarray, tr: np.ndarray) -> float:
    """The EMA ratio's last value; where that is not positive (|G|^2's EMA dipped below 0 at the end, as single
    estimates of |G|^2 often do when noise dominates), the ratio of the run's means, the same quantity averaged
    over every update; nan when that is not positive either."""
    for b in (series[-1] if len(series) else math.nan, np.mean(tr) / np.mean(g2) if len(g2) and np.mean(g2) > 0 else math.nan):
        if b > 0 and math.isfinite(b):
            return float(b)
    return math.nan


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


# ---- rho models ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RhoModel:
    """Sample cost rho(B) relative to B_ref; `kind` is invariant | noise-scale | curves."""

    kind: str = field(metadata={"help": "invariant | noise-scale | curves"})
    b_ref: float = field(metadata={"help": "reference batch in responses"})
    b_crit: float = field(default=math.nan, metadata={"help": "critical batch (noise-scale); the bend batch B_bend (lr-aware)"})
    log_b: tuple[float, ...] = field(default=(), metadata={"help": "curves: log batch of each trace (sorted)"})
    n_star: tuple[float, ...] = field(default=(), metadata={"help": "curves: samples-to-target of each trace"})
    lr_rules: tuple[str, ...] = field(default=(), metadata={"help": "curves: lr rule of each trace"})
    invariant_range: float = field(default=16.0, metadata={"help": "invariant: batch ratio up to which rho = 1 is trusted"})
    kappa: float = field(default=math.nan, metadata={"help": "lr-aware: share of the reference update's gain that curvature takes back"})
    lr_rule: str = field(default="sqrt", metadata={"help": "lr-aware: the reference's lr rule (the default for a candidate)"})
    source: str = field(default="", metadata={"help": "lr-aware: where B_bend and kappa come from"})
    assumed: bool = field(default=False, metadata={"help": "invariant: rho = 1 was assumed for want of data, not asked "
                                                           "for; `bounds` then gives the range the data could not narrow"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        """rho at batch b; lr-aware also takes the candidate's lr rule, or its lr over the reference's (x)."""
        if self.kind == "invariant":
            return 1.0
        if self.kind == "noise-scale":
            return (1 + b / self.b_crit) / (1 + self.b_ref / self.b_crit)
        if self.kind == "lr-aware":
            x = lr_scale(lr_rule or self.lr_rule, b / self.b_ref) if x is None else x
            d_ref, d = self.progress(self.b_ref, 1.0), self.progress(b, x)
            return (b / self.b_ref) * d_ref / d if d > 0 else math.inf
        if self.kind == "curves":
            return self._curve_n(b, None) / self._curve_n(self.b_ref, None)
        raise RlsimError(f"unknown rho model {self.kind!r}; use one of {', '.join(RHO_MODELS)}")

    def _curve_n(self, b: float, slope: float | None) -> float:
        """curves: N*(b), interpolated in log b inside the measured range; outside it a power law b^s from the
        nearest measured batch, s = the nearest segment's slope in log-log clipped to [0, 1] (or `slope`)."""
        lb, lo, hi = math.log(b), self.log_b[0], self.log_b[-1]
        if lo - 1e-9 <= lb <= hi + 1e-9 or len(self.log_b) < 2:
            return float(np.interp(lb, self.log_b, self.n_star))
        end, nxt = (0, 1) if lb < lo else (-1, -2)
        if slope is None:
            s = (math.log(self.n_star[end]) - math.log(self.n_star[nxt])) / (self.log_b[end] - self.log_b[nxt])
            slope = min(max(s, 0.0), 1.0)
        return float(self.n_star[end] * math.exp(slope * (lb - self.log_b[end])))

    def outside(self, b: float) -> bool:
        """Whether rho at batch b is not measured: beyond the curves, or an invariant rho assumed for want of data."""
        if self.kind == "curves" and self.log_b:
            lb = math.log(b)
            return lb < self.log_b[0] - 1e-9 or lb > self.log_b[-1] + 1e-9
        return self.kind == "invariant" and self.assumed and not math.isclose(b, self.b_ref)

    def bounds(self, b: float) -> tuple[float, float] | None:
        """(lo, hi) of rho at an unmeasured batch b (module doc: samples rise and updates fall with the batch);
        None where rho is measured or the model states no bound."""
        if not self.outside(b):
            return None
        if self.kind == "invariant":
            r = b / self.b_ref
            return (min(1.0, r), max(1.0, r))
        n_ref = self._curve_n(self.b_ref, None)
        a, c = self._curve_n(b, 0.0) / n_ref, self._curve_n(b, 1.0) / n_ref
        return (min(a, c), max(a, c))

    def progress(self, b: float, x: float) -> float:
        """lr-aware: progress per update at batch b and lr x times the reference's (delta in the docstring)."""
        h = lambda bb: (1.0 + self.b_crit / bb) ** -0.5  # noqa: E731
        return x * h(b) - self.kappa * x * x * h(self.b_ref)

    def notes(self, b: float) -> list[str]:
        """Warnings about trusting rho at batch b."""
        out = []
        r = b / self.b_ref
        if self.kind == "invariant" and not self.assumed and (r > self.invariant_range or r < 1 / self.invariant_range):
            out.append(f"rho=1 assumed at {r:.3g}x the reference batch, outside the {self.invariant_range:g}x range the "
                       "article found approximately invariant; record runs at other batch sizes (--rho curves)")
        if self.kind == "lr-aware" and not math.isfinite(self.rho(b)):
            out.append(f"at batch {b:g} the lr-aware model's lr is past the point where an update makes progress "
                       f"(kappa {self.kappa:.3g}): rho is infinite; use a smaller lr rule (--lr-rule fixed or sqrt)")
        if self.kind == "curves" and self.outside(b):
            lo, hi = self.bounds(b)
            out.append(f"batch {b:g} is outside the measured curves ({math.exp(self.log_b[0]):g}..{math.exp(self.log_b[-1]):g}): "
                       f"rho {self.rho(b):.3g} extrapolates the nearest segment as a power law, and only {lo:.3g}..{hi:.3g} "
                       "is bounded (samples rise, updates fall with the batch); record a run near this batch to measure it")
        if self.kind == "invariant" and self.outside(b):
            lo, hi = self.bounds(b)
            out.append(f"the sample cost is not measured (no learning curves at other batch sizes, no gradient noise scale): "
                       f"rho = 1 is assumed, and only {lo:.3g}..{hi:.3g} is bounded (samples rise, updates fall with the "
                       "batch); record a run at another batch size and add it with --trace")
        return out


def invariant_rho(b_ref: float, *, assumed: bool = False) -> RhoModel:
    """rho = 1; `assumed`: for want of data (it then carries bounds), rather than asked for with --rho invariant."""
    return RhoModel("invariant", float(b_ref), assumed=assumed)


def noise_scale_rho(b_ref: float, b_crit: float) -> RhoModel:
    if not (b_crit > 0 and math.isfinite(b_crit)):
        raise RlsimError("the gradient noise scale is not estimable from this trace (grad_norm and grad_norm_micro "
                         "missing or too noisy); use --rho invariant or --rho curves")
    return RhoModel("noise-scale", float(b_ref), b_crit=float(b_crit))


def lr_aware_rho(b_ref: float, b_bend: float, kappa: float, lr_rule: str = "sqrt", *, source: str = "given") -> RhoModel:
    if not (b_bend > 0 and math.isfinite(b_bend)) or not (0 <= kappa < 1):
        raise RlsimError(f"lr-aware constants out of range: --bend-batch must be > 0 responses (got {b_bend:g}) and --kappa "
                         f"in [0, 1) (got {kappa:g})")
    return RhoModel("lr-aware", float(b_ref), b_crit=float(b_bend), kappa=float(kappa), lr_rule=lr_rule, source=source)


@dataclass(frozen=True)
class LrAwareFit:
    """B_bend and kappa of the lr-aware model fitted to samples-to-target of runs at other batch sizes or lrs."""

    b_bend: float = field(metadata={"help": "fitted bend batch, responses"})
    kappa: float = field(metadata={"help": "fitted kappa"})
    loss: float = field(metadata={"help": "sum of squared log-rho errors at the fit (censored runs count only when predicted too low)"})
    runs: int = field(metadata={"help": "runs other than the reference that entered the fit"})


def rho_points(ref: LearningCurve, curves, target: float) -> list[tuple[float, float, float, bool]]:
    """(batch, lr over the reference's, measured rho, censored) for each curve other than the reference; a run that
    never reached the target gives its responses trained as a lower bound (censored)."""
    n_ref = ref.samples_to_target(target)
    if n_ref is None or n_ref <= 0:
        raise RlsimError(f"the reference trace does not reach the target {target:.4g} after its first eval; lower --target")
    out = []
    for c in curves:
        if c is ref or c.batch <= 0 or not len(c.score):
            continue
        x = c.lr / ref.lr if (c.lr > 0 and ref.lr > 0) else lr_scale(c.lr_rule or "sqrt", c.batch / ref.batch)
        n = c.samples_to_target(target)
        if n is not None and n <= 0:
            continue
        cens = n is None
        out.append((float(c.batch), float(x), float((c.cum_responses[-1] if cens else n) / n_ref), cens))
    return out


def fit_lr_aware(ref: LearningCurve, curves, target: float) -> LrAwareFit:
    """Least squares in log rho over a grid of B_bend (B_ref/256..256 B_ref, 2^(1/4) apart) and kappa (0..0.95,
    0.01 apart); a censored run (rho >= its bound) costs only when the model puts it below the bound."""
    pts = rho_points(ref, curves, target)
    if not pts:
        raise RlsimError("fitting the lr-aware model needs runs at other batch sizes or lrs that have evals (repeat --trace)")
    base = lr_aware_rho(ref.batch, ref.batch, 0.0)
    best = None
    for m in 2.0 ** np.arange(-8, 8.01, 0.25):
        for k in np.linspace(0.0, 0.95, 96):
            model = dataclasses.replace(base, b_crit=float(m * ref.batch), kappa=float(k))
            loss = 0.0
            for b, x, r, cens in pts:
                p = model.rho(b, x=x)
                e = math.log(p / r) if math.isfinite(p) else 5.0
                loss += 0.0 if (cens and e > 0) else e * e
            if best is None or loss < best[0] - 1e-12:
                best = (loss, float(m), float(k))
    return LrAwareFit(b_bend=best[1] * ref.batch, kappa=best[2], loss=best[0], runs=len(pts))


def parse_rho(spec: str) -> tuple[str, tuple[float, float] | None]:
    """'lr-aware:B_BEND,KAPPA' -> ('lr-aware', (B_BEND, KAPPA)); any other model name -> (name, None)."""
    kind, _, params = spec.partition(":")
    if kind not in RHO_MODELS:
        raise RlsimError(f"--rho must be one of {', '.join(RHO_MODELS)}, got {kind!r}")
    if not params:
        return kind, None
    try:
        m, k = (float(v) for v in params.split(","))
    except ValueError:
        raise RlsimError(f"rho parameters {params!r}: expected 'B_BEND,KAPPA' (e.g. lr-aware:3000,0.6)") from None
    if kind != "lr-aware":
        raise RlsimError(f"--bend-batch and --kappa go with --rho lr-aware, not {kind}")
    return kind, (m, k)


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
