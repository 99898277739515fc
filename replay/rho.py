"""Sample-cost models rho(B) = N*(B) / N*(B_ref): one small frozen class per model, registered by name.

- invariant:   rho = 1 (inside the approximately batch-size-invariant range, with the lr rescaled).
- noise-scale: rho(B) = (1 + B/B_crit) / (1 + B_ref/B_crit), B_crit from the two-batch estimators of McCandlish
  et al. (2018) on the trace's gradient norms (`rlsim.replay.learning.noise_scale`).
- curves:      samples-to-target N*(B) of several traces, interpolated linearly in log B; outside the measured
  range a power law through the nearest segment, its exponent bounded by 0 and 1 (`bounds`).
- lr-aware:    Adam at the lr each batch actually gets (the run's lr rule): progress per update
  delta(B) = x h(B) - kappa x^2 h(B_ref), x = lr(B) / lr(B_ref), h(B) = (1 + B_bend / B)^(-1/2), and
  rho(B) = (B / B_ref) delta(B_ref) / delta(B); B_bend and kappa fitted on other runs (`fit_lr_aware`) or given.

Bounds without a measurement: a larger batch needs no fewer samples and no more updates, so rho beyond the
measured range, or an invariant rho that was assumed (`assumed`), lies between them.

Every model answers `rho(b, lr_rule=None, x=None)`, `notes(b)`, `outside(b)` and `bounds(b)`; `kind` is the
name it is registered under (`register_rho`, a decorator filling `RHO_REGISTRY`). Pure numpy. The models, their
derivations and their evidence: docs/simulator.md, "rho models".
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple, Sequence

import numpy as np

from rlsim.replay.errors import RlsimError, did_you_mean, name, setting
from rlsim.replay.evaluation import samples_to_target
from rlsim.replay.learning import LearningCurve, lr_scale

RHO_REGISTRY: dict[str, type[RhoModel]] = {}


def register_rho(name: str) -> Callable[[type[RhoModel]], type[RhoModel]]:
    """Class decorator: register a rho model under `name` (its `kind`); a name is registered once."""
    def decorator(cls: type[RhoModel]) -> type[RhoModel]:
        if name in RHO_REGISTRY and RHO_REGISTRY[name] is not cls:
            raise ValueError(f"rho model {name!r} is already registered: {RHO_REGISTRY[name]} vs {cls}")
        cls.kind = name
        RHO_REGISTRY[name] = cls
        return cls

    return decorator


def get_rho_model(name: str) -> type[RhoModel]:
    """The class registered under `name`."""
    if name not in RHO_REGISTRY:
        raise RlsimError(f"unknown rho model {name!r}; use one of {', '.join(RHO_MODELS)}")
    return RHO_REGISTRY[name]


@dataclass(frozen=True)
class RhoModel:
    """Sample cost rho(B) relative to B_ref. A subclass registers itself with `register_rho`."""

    kind: ClassVar[str] = ""
    # whether rho depends on the candidate's lr rule (others assume it rescaled)
    follows_lr_rule: ClassVar[bool] = False
    b_ref: float = field(metadata={"help": "reference batch in responses"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        """rho at batch b; a model that follows the lr rule also takes the candidate's rule, or its lr over the
        reference's (x)."""
        raise NotImplementedError

    def outside(self, b: float) -> bool:
        """Whether rho at batch b is not measured (then `bounds` gives its range)."""
        return False

    def bounds(self, b: float) -> tuple[float, float] | None:
        """(lo, hi) of rho at an unmeasured batch b (module doc: samples rise and updates fall with the batch);
        None where rho is measured or the model states no bound."""
        return None

    def notes(self, b: float) -> list[str]:
        """Warnings about trusting rho at batch b."""
        return []


@register_rho("invariant")
@dataclass(frozen=True)
class InvariantRho(RhoModel):
    """rho = 1: asked for, or `assumed` for want of data (then unmeasured away from the reference, with bounds)."""

    invariant_range: float = field(default=16.0, metadata={"help": "batch ratio up to which rho = 1 is trusted"})
    assumed: bool = field(default=False, metadata={"help": "rho = 1 was assumed for want of data, not asked for; "
                                                           "`bounds` then gives the range the data could not narrow"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        return 1.0

    def outside(self, b: float) -> bool:
        return self.assumed and not math.isclose(b, self.b_ref)

    def bounds(self, b: float) -> tuple[float, float] | None:
        if not self.outside(b):
            return None
        r = b / self.b_ref
        return (min(1.0, r), max(1.0, r))

    def notes(self, b: float) -> list[str]:
        r = b / self.b_ref
        if not self.assumed and (r > self.invariant_range or r < 1 / self.invariant_range):
            return [f"rho=1 assumed at {r:.3g}x the reference batch, outside the {self.invariant_range:g}x range the "
                    "article found approximately invariant; record runs at other batch sizes (--rho curves)"]
        if self.outside(b):
            lo, hi = self.bounds(b)
            return ["the sample cost is not measured (no learning curves at other batch sizes, no gradient noise "
                    f"scale): rho = 1 is assumed, and only {lo:.3g}..{hi:.3g} is bounded (samples rise, updates fall "
                    "with the batch); record a run at another batch size and add it with --trace"]
        return []


def noise_scale_ratio(b, b_ref: float, b_crit):
    """(1 + B/B_crit) / (1 + B_ref/B_crit); `b_crit` may be an array (bootstrap replicates)."""
    return (1 + b / b_crit) / (1 + b_ref / b_crit)


@register_rho("noise-scale")
@dataclass(frozen=True)
class NoiseScaleRho(RhoModel):
    """rho from the gradient noise scale B_crit, at the lr tuned for each batch."""

    b_crit: float = field(default=math.nan,
                          metadata={"help": "critical batch (the reference's gradient noise scale), responses"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        return noise_scale_ratio(b, self.b_ref, self.b_crit)


@register_rho("curves")
@dataclass(frozen=True)
class CurvesRho(RhoModel):
    """rho from the samples-to-target of runs at several batch sizes, interpolated in log batch."""

    follows_lr_rule: ClassVar[bool] = True  # the runs on the candidate's lr line are chosen (`Study.rho_model`)
    log_b: tuple[float, ...] = field(default=(), metadata={"help": "log batch of each measured size (sorted)"})
    n_star: tuple[float, ...] = field(default=(),
                                      metadata={"help": "samples-to-target at each size (mean of its runs)"})
    lr_rules: tuple[str, ...] = field(default=(), metadata={"help": "lr rule of the runs at each size"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        return self._curve_n(b, None) / self._curve_n(self.b_ref, None)

    def _curve_n(self, b: float, slope: float | None) -> float:
        """N*(b), interpolated in log b inside the measured range; outside it a power law b^s from the nearest
        measured batch, s = the nearest segment's slope in log-log clipped to [0, 1] (or `slope`)."""
        lb, lo, hi = math.log(b), self.log_b[0], self.log_b[-1]
        if lo - 1e-9 <= lb <= hi + 1e-9 or len(self.log_b) < 2:
            return float(np.interp(lb, self.log_b, self.n_star))
        end, nxt = (0, 1) if lb < lo else (-1, -2)
        if slope is None:
            s = (math.log(self.n_star[end]) - math.log(self.n_star[nxt])) / (self.log_b[end] - self.log_b[nxt])
            slope = min(max(s, 0.0), 1.0)
        return float(self.n_star[end] * math.exp(slope * (lb - self.log_b[end])))

    def outside(self, b: float) -> bool:
        if not self.log_b:
            return False
        lb = math.log(b)
        return lb < self.log_b[0] - 1e-9 or lb > self.log_b[-1] + 1e-9

    def bounds(self, b: float) -> tuple[float, float] | None:
        if not self.outside(b):
            return None
        n_ref = self._curve_n(self.b_ref, None)
        a, c = self._curve_n(b, 0.0) / n_ref, self._curve_n(b, 1.0) / n_ref
        return (min(a, c), max(a, c))

    def notes(self, b: float) -> list[str]:
        if not self.outside(b):
            return []
        lo, hi = self.bounds(b)
        return [f"batch {b:g} is outside the measured curves "
                f"({math.exp(self.log_b[0]):g}..{math.exp(self.log_b[-1]):g}): rho {self.rho(b):.3g} extrapolates the "
                f"nearest segment as a power law, and only {lo:.3g}..{hi:.3g} is bounded (samples rise, updates fall "
                "with the batch); record a run near this batch to measure it"]


@register_rho("lr-aware")
@dataclass(frozen=True)
class LrAwareRho(RhoModel):
    """rho of Adam at the lr each batch gets under the run's lr rule (module doc: delta(B), B_bend, kappa)."""

    follows_lr_rule: ClassVar[bool] = True
    b_bend: float = field(default=math.nan, metadata={"help": "the batch (responses) where rho bends upward, B_bend"})
    kappa: float = field(default=math.nan,
                         metadata={"help": "share of the reference update's gain that curvature takes back"})
    lr_rule: str = field(default="sqrt", metadata={"help": "the reference's lr rule (the default for a candidate)"})
    source: str = field(default="", metadata={"help": "where B_bend and kappa come from"})

    def rho(self, b: float, lr_rule: str | None = None, x: float | None = None) -> float:
        x = lr_scale(lr_rule or self.lr_rule, b / self.b_ref) if x is None else x
        d_ref, d = self.progress(self.b_ref, 1.0), self.progress(b, x)
        return (b / self.b_ref) * d_ref / d if d > 0 else math.inf

    def progress(self, b: float, x: float) -> float:
        """Progress per update at batch b and lr x times the reference's (delta in the module doc)."""
        h = lambda bb: (1.0 + self.b_bend / bb) ** -0.5  # noqa: E731
        return x * h(b) - self.kappa * x * x * h(self.b_ref)

    def notes(self, b: float) -> list[str]:
        if math.isfinite(self.rho(b)):
            return []
        return [f"at batch {b:g} the lr-aware model's lr is past the point where an update makes progress "
                f"(kappa {self.kappa:.3g}): rho is infinite; use a smaller lr rule (--lr-rule fixed or sqrt)"]


RHO_MODELS = (*RHO_REGISTRY, "auto")


# ---- constructors ------------------------------------------------------------------------------

def invariant_rho(b_ref: float, *, assumed: bool = False) -> InvariantRho:
    """rho = 1; `assumed`: for want of data (it then carries bounds), rather than asked for with --rho invariant."""
    return InvariantRho(float(b_ref), assumed=assumed)


def noise_scale_rho(b_ref: float, b_crit: float) -> NoiseScaleRho:
    if not (b_crit > 0 and math.isfinite(b_crit)):
        raise RlsimError("the gradient noise scale is not estimable from this trace (grad_norm and grad_norm_micro "
                         f"missing or too noisy); use {setting(rho_model='invariant')} or "
                         f"{setting(rho_model='curves')}")
    return NoiseScaleRho(float(b_ref), b_crit=float(b_crit))


def lr_aware_rho(b_ref: float, b_bend: float, kappa: float, lr_rule: str = "sqrt", *,
                 source: str = "given") -> LrAwareRho:
    if not (b_bend > 0 and math.isfinite(b_bend)) or not (0 <= kappa < 1):
        raise RlsimError(f"lr-aware constants out of range: {name('bend_batch')} must be > 0 responses (got "
                         f"{b_bend:g}) and {name('kappa')} in [0, 1) (got {kappa:g})")
    return LrAwareRho(float(b_ref), b_bend=float(b_bend), kappa=float(kappa), lr_rule=lr_rule, source=source)


def curves_rho(b_ref: float, curves: list[LearningCurve], target: float) -> CurvesRho:
    """rho from the samples-to-target of several runs; runs at the same batch are averaged."""
    pts: dict[float, list[float]] = {}
    rules: dict[float, str] = {}
    for c in curves:
        n = c.samples_to_target(target)
        if n is None or n <= 0 or c.responses_per_update <= 0:  # never reached, or already at the start
            continue
        pts.setdefault(float(c.responses_per_update), []).append(n)
        rules[float(c.responses_per_update)] = c.lr_rule
    if len(pts) < 2:
        raise RlsimError(f"{setting(rho_model='curves')} needs traces at two or more batch sizes that reach the target "
                         f"{target:.4g}; got {len(pts)} (add runs at other batch sizes with {name('trace')}, or lower "
                         f"{name('target')})")
    if float(b_ref) not in pts:
        raise RlsimError(f"the reference trace does not reach the target {target:.4g}; lower {name('target')}")
    bs = sorted(pts)
    return CurvesRho(float(b_ref), log_b=tuple(math.log(b) for b in bs),
                     n_star=tuple(float(np.mean(pts[b])) for b in bs), lr_rules=tuple(rules[b] for b in bs))


# ---- the lr-aware model's fit ------------------------------------------------------------------

@dataclass(frozen=True)
class LrAwareFit:
    """B_bend and kappa of the lr-aware model fitted to samples-to-target of runs at other batch sizes or lrs."""

    b_bend: float = field(metadata={"help": "fitted bend batch, responses"})
    kappa: float = field(metadata={"help": "fitted kappa"})
    loss: float = field(metadata={"help": "sum of squared log-rho errors at the fit (censored runs count only when "
                                          "predicted too low)"})
    runs: int = field(metadata={"help": "runs other than the reference that entered the fit"})


class RhoPoint(NamedTuple):
    """One run's measured rho against the reference's, as the lr-aware fit uses it."""

    batch: float  # responses per update
    x: float  # its lr over the reference's
    rho: float  # its samples-to-target over the reference's (censored: its responses trained over them, a lower bound)
    censored: bool


def rho_points(ref: LearningCurve, curves, target: float) -> list[RhoPoint]:
    """(batch, lr over the reference's, measured rho, censored) for each curve other than the reference; a run that
    never reached the target gives its responses trained as a lower bound (censored)."""
    n_ref = ref.samples_to_target(target)
    if n_ref is None or n_ref <= 0:
        raise RlsimError(f"the reference trace does not reach the target {target:.4g} after its first eval; lower "
                         f"{name('target')}")
    out = []
    for c in curves:
        if c is ref or c.responses_per_update <= 0 or not len(c.score):
            continue
        b_ratio = c.responses_per_update / ref.responses_per_update
        x = c.lr / ref.lr if (c.lr > 0 and ref.lr > 0) else lr_scale(c.lr_rule or "sqrt", b_ratio)
        n, cens = samples_to_target(c, target)
        if not cens and n <= 0:
            continue
        out.append(RhoPoint(float(c.responses_per_update), float(x), float(n / n_ref), cens))
    return out


def fit_lr_aware(ref: LearningCurve, curves, target: float) -> LrAwareFit:
    """Least squares in log rho over a grid of B_bend (B_ref/256..256 B_ref, 2^(1/4) apart) and kappa (0..0.95,
    0.01 apart); a censored run (rho >= its bound) costs only when the model puts it below the bound."""
    pts = rho_points(ref, curves, target)
    if not pts:
        raise RlsimError(f"fitting the lr-aware model needs runs at other batch sizes or lrs that have evals (add "
                         f"them with {name('trace')})")
    base = lr_aware_rho(ref.responses_per_update, ref.responses_per_update, 0.0)
    best = None
    for m in 2.0 ** np.arange(-8, 8.01, 0.25):
        for k in np.linspace(0.0, 0.95, 96):
            model = dataclasses.replace(base, b_bend=float(m * ref.responses_per_update), kappa=float(k))
            loss = 0.0
            for b, x, r, cens in pts:
                p = model.rho(b, x=x)
                e = math.log(p / r) if math.isfinite(p) else 5.0
                loss += 0.0 if (cens and e > 0) else e * e
            if best is None or loss < best[0] - 1e-12:
                best = (loss, float(m), float(k))
    return LrAwareFit(b_bend=best[1] * ref.responses_per_update, kappa=best[2], loss=best[0], runs=len(pts))


# ---- the --rho option and the verdict ----------------------------------------------------------

def parse_rho(spec: str) -> tuple[str, tuple[float, float] | None]:
    """'lr-aware:B_BEND,KAPPA' -> ('lr-aware', (B_BEND, KAPPA)); any other model name -> (name, None)."""
    if not isinstance(spec, str):
        raise RlsimError(f"{name('rho_model')} must be one of {', '.join(RHO_MODELS)} (text), got {spec!r}")
    kind, _, params = spec.partition(":")
    if kind not in RHO_MODELS:
        raise RlsimError(f"{name('rho_model')} must be one of {', '.join(RHO_MODELS)}, got {kind!r}"
                         f"{did_you_mean(kind, RHO_MODELS)}")
    if not params:
        return kind, None
    try:
        m, k = (float(v) for v in params.split(","))
    except ValueError:
        raise RlsimError(f"rho parameters {params!r}: expected 'B_BEND,KAPPA' (e.g. lr-aware:3000,0.6)") from None
    if kind != "lr-aware":
        raise RlsimError(f"the parameters {params!r} (B_BEND,KAPPA) go with {setting(rho_model='lr-aware')}, "
                         f"not {kind}")
    return kind, (m, k)


def regime(ratio: float, tol: float = 0.05) -> str:
    """Time-to-target ratio -> 'time falls' | 'flat' | 'time rises'."""
    if not math.isfinite(ratio):
        return "unknown"
    if ratio < 1 - tol:
        return "time falls"
    if ratio > 1 + tol:
        return "time rises"
    return "flat"


def regime_key(label: object) -> str | None:
    """A regime label (`time falls`, `flat`, `time rises`, `undecided`, as `regime` and the verdicts write it) ->
    falls / flat / rises / undecided; None if unknown."""
    s = str(label or "").lower()
    for k in ("undecided", "falls", "rises", "flat"):
        if k in s:
            return k
    return None


# the staleness limit up to which AReaL's ablation (with an off-policy correction) found no loss in sample cost
STALENESS_FLAT_UP_TO = 4


def staleness_rho(curves: Sequence[LearningCurve], target: float, b_ref: int, eta: float) -> tuple[float, list[str]]:
    """(rho multiplier at staleness limit eta, notes). From learning curves recorded at several staleness limits
    (traces at the reference batch `b_ref`, the first the reference; their config's `staleness`) when two or more
    reach `target`; else 1 up to eta = STALENESS_FLAT_UP_TO (AReaL, with an off-policy correction) and a warning
    beyond."""
    ref_eta = int(curves[0].staleness or 0) if curves else 0
    pts: dict[int, list[float]] = {}
    if curves and math.isfinite(target):
        for c in curves:
            if c.responses_per_update != b_ref:
                continue
            n_ = c.samples_to_target(target)
            if n_ is not None and n_ > 0:
                pts.setdefault(int(c.staleness or 0), []).append(n_)
    if len(pts) >= 2 and ref_eta in pts:
        xs = sorted(pts)
        ys = [float(np.mean(pts[k])) for k in xs]
        mult = float(np.interp(eta, xs, ys)) / float(np.mean(pts[ref_eta]))
        notes = [f"staleness: rho x{mult:.4g} at eta = {eta:g} from learning curves recorded at staleness "
                 f"{', '.join(map(str, xs))} (batch {b_ref}), linear in eta"]
        if eta < xs[0] or eta > xs[-1]:
            notes.append(f"staleness {eta:g} is outside the recorded {xs[0]}..{xs[-1]}: its sample cost is clamped to "
                         "the nearest")
        return mult, notes
    if eta == ref_eta:
        return 1.0, []
    notes = [f"staleness: rho x1 assumed for eta = {eta:g}, not measured on this task: flat up to eta = "
             f"{STALENESS_FLAT_UP_TO} with an off-policy correction and rising from eta = 2 without one (plain "
             "PPO/GRPO clipping) in AReaL's staleness ablation (Fu et al. 2025, arXiv:2505.24298); record runs at this "
             "staleness (--trace, config staleness) for learning curves"]
    if eta > STALENESS_FLAT_UP_TO:
        notes.append(f"staleness {eta:g} is beyond eta = {STALENESS_FLAT_UP_TO}, where that ablation's final scores "
                     "fall even with the correction: rho = 1 is optimistic here")
    return 1.0, notes
