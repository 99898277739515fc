"""Scoring predictions of a batch-size study against what its runs measured: the study analysis as functions.

Measured, per configuration over its seeds (`SeedRuns`): samples-to-target N* (`samples_to_target`: a run that
never reached the target counts at the responses it trained on, a lower bound, and is marked censored) and steady
responses/s; against the reference configuration, rho = N* / N*_ref, sigma = responses/s over the reference's and
T = rho / sigma (`measured_ratios`). Seeds are resampled with replacement for intervals (`resample_T`: one (draws,
configurations) matrix of T, the reference resampled too), so that any statistic of a draw's T (a ranking's Kendall
tau, `tau_interval`; the time lost by a pick against the best) gets its interval over seeds the same way.

Scored: rankings by Kendall's tau-b (`kendall_tau`, scipy's), a predicted rho inside the seeds' spread
(`within_spread`; for a censored configuration, at or above its lower bound when asked), the error of log rho
(`censored_log_error`: a censored run only counts when predicted below its bound), the noise-scale B_crit that the
measured rho allows (`b_crit_allowed`), the critical batches (`critical_batches`), and how well the study itself
resolves a ranking (`ranking_resolution`, `noise_split`).

The gradient noise scale is `rlsim.replay.learning.noise_scale` (the one estimator). Pure numpy; scipy.stats is
imported when a tau is first asked for (it takes seconds to import).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

TAU_GOAL = 0.8  # the ranking agreement the studies aim for (`ranking_resolution` counts draws reaching it)


class Reached(NamedTuple):
    """Samples-to-target of one run: responses to reach the target, or (censored) the responses it trained on."""

    n: float
    censored: bool


def samples_to_target(curve, target: float) -> Reached:
    """N* of a learning curve (`LearningCurve.samples_to_target`); a run that never reaches the target is censored:
    its budget (the responses at its last eval) is a lower bound."""
    n = curve.samples_to_target(target)
    return Reached(float(curve.cum_responses[-1]), True) if n is None else Reached(float(n), False)


@dataclass(frozen=True, eq=False)
class SeedRuns:
    """One configuration's runs, one entry per seed (in seed order)."""

    n_star: np.ndarray = field(metadata={"help": "samples-to-target of each seed (a censored run: its budget, a lower "
                                                 "bound)"})
    censored: np.ndarray = field(metadata={"help": "whether each seed's run never reached the target"})
    rps: np.ndarray = field(metadata={"help": "steady responses/s of each seed's run"})

    @classmethod
    def of(cls, reached: Sequence[Reached], rps: Sequence[float]) -> SeedRuns:
        return cls(n_star=np.array([r.n for r in reached], float),
                   censored=np.array([r.censored for r in reached], bool), rps=np.asarray(rps, float))

    def __len__(self) -> int:
        return len(self.n_star)

    @property
    def any_censored(self) -> bool:
        """Whether the mean N* is a lower bound."""
        return bool(self.censored.any())


def measured_ratios(runs: SeedRuns, n_ref: float, rps_ref: float) -> dict[str, float]:
    """A configuration's seed means against the reference's means `n_ref` (N*) and `rps_ref` (responses/s): rho, sigma
    and T = rho / sigma, with the min..max of the per-seed rho and sigma (rho_min is a lower bound where censored)."""
    rho_s, sig_s = runs.n_star / n_ref, runs.rps / rps_ref
    n = float(np.mean(runs.n_star))
    out = dict(seeds=len(runs), reached=int((~runs.censored).sum()), censored=runs.any_censored, n_star=n,
               rho=n / n_ref, rho_min=float(min(rho_s)), rho_max=float(max(rho_s)), sigma=float(np.mean(sig_s)),
               sigma_min=float(min(sig_s)), sigma_max=float(max(sig_s)), rps=float(np.mean(runs.rps)))
    out["T"] = out["rho"] / out["sigma"]
    return out


def resample_T(ref: SeedRuns, configs: Sequence[SeedRuns], rng: np.random.Generator, draws: int = 1000) -> np.ndarray:
    """(draws, configs) T ratios with every configuration's seeds and the reference's resampled with replacement
    (the reference first in each draw, then each configuration in order); censored runs stay at their bound."""
    out = np.empty((draws, len(configs)))
    for d in range(draws):
        i = rng.choice(len(ref), len(ref))
        nr, qr = np.mean(ref.n_star[i]), np.mean(ref.rps[i])
        for k, c in enumerate(configs):
            j = rng.choice(len(c), len(c))
            out[d, k] = (np.mean(c.n_star[j]) / nr) / (np.mean(c.rps[j]) / qr)
    return out


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b of two score lists (scipy.stats.kendalltau); nan when it is undefined (constant input, a nan)."""
    from scipy.stats import kendalltau  # why here: scipy.stats adds ~0.3 s to every what-if import; only studies rank

    with warnings.catch_warnings():  # constant input: nan, said by the value
        warnings.simplefilter("ignore")
        return float(kendalltau(np.asarray(a, float), np.asarray(b, float)).statistic)


def tau_interval(pred: Sequence[float], T_draws: np.ndarray, q: tuple[float, float] = (5, 95)) -> tuple[float, float]:
    """The `q` percentiles over draws of the Kendall tau of `pred` against each draw's T (a row of `resample_T`)."""
    taus = [kendall_tau(pred, t) for t in T_draws]
    if not taus:
        return math.nan, math.nan
    lo, hi = np.nanpercentile(taus, q)
    return float(lo), float(hi)


def within_spread(pred: float, lo: float, hi: float, censored: bool = False) -> bool:
    """Whether a prediction lies inside the seeds' lo..hi; a censored configuration's true value is at least lo, so
    with `censored` any prediction at or above lo is not contradicted."""
    return bool(lo <= pred <= hi or (censored and pred >= lo))


def censored_log_error(pred: float, meas: float, censored: bool) -> float:
    """|log(pred / meas)|; 5 for an infinite or non-positive prediction; 0 for a censored measurement (a lower bound)
    predicted at or above it."""
    e = math.log(pred / meas) if math.isfinite(pred) and pred > 0 else 5.0
    return 0.0 if (censored and e > 0) else abs(e)


def error_summary(errs: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    """Per model, the mean and median of its errors and their count (models without errors left out)."""
    return {k: dict(mean=float(np.mean(v)), median=float(np.median(v)), n=len(v)) for k, v in errs.items() if v}


def score_ranking(pred_T: Sequence[float], meas_T: Sequence[float], pred_rho: Sequence[float],
                  spread: Sequence[tuple[float, float, bool]]) -> dict:
    """A model's predictions against the measured configurations: Kendall tau of its T ranking, and whether each
    predicted rho lies inside the measured (lo, hi, censored) spread of its configuration (1 or 0)."""
    return dict(kendall_tau=kendall_tau(pred_T, meas_T),
                rho_within_spread=[int(within_spread(p, lo, hi, c)) for p, (lo, hi, c) in zip(pred_rho, spread)])


def b_crit_allowed(rows: Sequence[Mapping], b_ref: float) -> tuple[float, float]:
    """The B_crit that the noise-scale form (1 + B/B_crit) / (1 + B_ref/B_crit) could have with the measured rho of the
    configurations above the reference (`rows`: batch B, rho, rho_max, censored): one every seed finished bounds it
    below (rho <= its seed maximum: B_crit >= (B - r B_ref) / (r - 1)), a censored one above (rho >= its bound)."""
    lo, hi = 0.0, math.inf
    for r in rows:
        B = r["B"]
        if B <= b_ref:
            continue
        if not r["censored"] and r["rho_max"] > 1:
            lo = max(lo, (B - r["rho_max"] * b_ref) / (r["rho_max"] - 1))
        elif r["censored"] and r["rho"] > 1:
            hi = min(hi, (B - r["rho"] * b_ref) / (r["rho"] - 1))
    return lo, hi


def critical_batches(rows: Sequence[Mapping], *, sigma_share: float = 0.9,
                     n_star_ratio: float = 1.2) -> tuple[float, float]:
    """(critical generation batch, critical training batch) of measured rows sorted by batch (`P`, sigma, n_star,
    censored): the smallest P whose sigma is within `sigma_share` of the largest, and the largest P every seed finished
    within `n_star_ratio` of the smallest P's samples-to-target (nan if none)."""
    smax = max(r["sigma"] for r in rows)
    gen = next(r["P"] for r in rows if r["sigma"] >= sigma_share * smax)
    base = rows[0]["n_star"]
    train = max((r["P"] for r in rows if not r["censored"] and r["n_star"] <= n_star_ratio * base), default=math.nan)
    return gen, train


def pooled_sd(x: np.ndarray, skip: int | None = None) -> float:
    """Root mean over columns (but `skip`) of the per-column variance over rows (ddof 1); 0 with one row."""
    x = np.asarray(x, float)
    cols = [c for c in range(x.shape[1]) if c != skip]
    return float(np.sqrt(np.mean(x[:, cols].var(0, ddof=1)))) if len(x) > 1 and cols else 0.0


def ranking_resolution(log_t, ref: int, *, draws: int = 4000, seed: int = 0, ladder=(3, 6, 12, 24, 48, 96)) -> dict:
    """How well the study itself resolves the ranking. log_t: (seeds, sizes) log T ratio of each seed over its own
    reference (column `ref` is 0). Returns the Kendall tau of each seed's ranking against each other seed's, and, by a
    parametric bootstrap (truth = the seed mean, per-seed noise normal with the sd pooled over the non-reference sizes),
    the tau a perfect predictor reaches against a mean of that many seeds and how often it reaches TAU_GOAL, the same
    chance for each seed count in `ladder` and the fewest seeds of it that give TAU_GOAL in 80 % of draws (None: more
    than its last); plus the chance that the min..max of n seeds contains the truth at one size (1 - 2^(1-n), any
    continuous symmetric noise)."""
    x = np.asarray(log_t, float)
    n, k = x.shape
    pair = [kendall_tau(x[i], x[j]) for i in range(n) for j in range(i + 1, n)]
    mu = x.mean(0)
    sd = pooled_sd(x, ref)
    noise_sd = np.where(np.arange(k) == ref, 0.0, sd)
    rng = np.random.default_rng(seed)

    def perfect(m: int):  # (draws,) tau of the truth against the mean of m noisy seeds
        return np.array([kendall_tau(mu, mu + (rng.standard_normal((m, k)) * noise_sd).mean(0)) for _ in range(draws)])

    taus = perfect(n)
    by_seeds = {m: float(np.mean(perfect(m) >= TAU_GOAL - 1e-9)) for m in ladder}
    return dict(seed_pair_tau=[float(t) for t in pair], seed_pair_tau_mean=float(np.mean(pair)) if pair else math.nan,
                sd_log_t=sd, perfect_tau_mean=float(np.nanmean(taus)),
                perfect_tau_p08=float(np.mean(taus >= TAU_GOAL - 1e-9)),
                perfect_tau_p08_by_seeds=by_seeds, seeds_for_p08=next((m for m in ladder if by_seeds[m] >= 0.8), None),
                spread_cover_one=1 - 2 * 0.5 ** n)


def noise_split(log_rho, log_sigma, ref: int, within: int, **resolution) -> dict:
    """`ranking_resolution` of log T = log rho - log sigma ((seeds, sizes), each seed over its own reference, column
    `ref`), with the seed sd of each half (learning: rho; the machine: sigma) and the chance that a perfect rho lands
    inside the seeds' spread at all `within` sizes."""
    log_rho, log_sigma = np.asarray(log_rho, float), np.asarray(log_sigma, float)
    res = ranking_resolution(log_rho - log_sigma, ref, **resolution)
    others = log_rho.shape[1] > 1
    res["sd_log_rho"] = pooled_sd(log_rho, ref) if others else math.nan
    res["sd_log_sigma"] = pooled_sd(log_sigma, ref) if others else math.nan
    res["spread_cover_all"] = res["spread_cover_one"] ** within
    return res


def regret(T: Sequence[float], pick: int) -> float:
    """Time lost by running configuration `pick` instead of the best: T[pick] / min(T) - 1 (T: each configuration's
    time to target, any common unit; a censored configuration's T is its lower bound)."""
    T = np.asarray(T, float)
    return float(T[pick] / np.min(T) - 1.0)


def regret_interval(T_draws: np.ndarray, pick: int, q: tuple[float, float] = (5, 95)) -> tuple[float, float]:
    """The `q` percentiles of `regret` over draws of T ((draws, configs), e.g. `resample_T`: seeds resampled)."""
    r = T_draws[:, pick] / T_draws.min(axis=1) - 1.0
    lo, hi = np.percentile(r, q)
    return float(lo), float(hi)


@dataclass(frozen=True)
class SigmaCase:
    """One predicted sigma against a paired measurement of it (`rlrun probe`: both sizes in one process, drift
    cancels)."""

    name: str = field(metadata={"help": "configuration (algorithm, task, G)"})
    b_ref: int = field(metadata={"help": "responses per update of the fitted recording (sigma's reference)"})
    b: int = field(metadata={"help": "responses per update of the candidate"})
    predicted: float = field(metadata={"help": "sigma the fit predicts"})
    lo: float = field(metadata={"help": "its interval's lower end (nan: none)"})
    hi: float = field(metadata={"help": "its interval's upper end"})
    measured: float = field(metadata={"help": "sigma measured by the probe (geometric mean over rounds)"})
    measured_lo: float = field(metadata={"help": "the measurement's interval over rounds"})
    measured_hi: float = field(metadata={"help": "its upper end"})

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def covered(self) -> bool:
        """The predicted interval holds the measured value."""
        return bool(self.lo <= self.measured <= self.hi)


def sigma_summary(cases: Sequence[SigmaCase]) -> dict[str, float]:
    """Median and largest |error|, and the share of cases whose predicted interval holds the measured sigma."""
    if not cases:
        return {"cases": 0, "median_abs_error": math.nan, "max_abs_error": math.nan, "coverage": math.nan}
    e = np.abs([c.error for c in cases])
    return {"cases": len(cases), "median_abs_error": float(np.median(e)), "max_abs_error": float(e.max()),
            "coverage": float(np.mean([c.covered for c in cases]))}
