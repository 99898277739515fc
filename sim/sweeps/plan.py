"""`rlsim plan`: which batch size to run, or which pilot runs would decide it most cheaply.

The time to target of candidate i relative to the reference is T_i = rho_i / sigma_i. sigma comes from the
simulator; rho from a sample-cost model that, from one reference trace, is known to err a lot (docs/results.md).
So the plan's uncertainty about rho is *measured*: error curves e(d) = log(rho measured / rho predicted from a
reference alone) at d = log2(B / B_ref), one per reference seed of the recorded batch-size studies
(`rlsim.replay.rho_errors`); a draw of the truth is one such curve plus the studies' seed noise. Its uncertainty
about sigma is each candidate's sigma interval as `rlsim run` gives it, read as a log-normal spread. Pilots run to
the target share the one reference run's luck (`weigh`, `RhoErrors.shared_sd`), which that configuration run again
reads (`_again`). A trace whose cost fits cannot be used gets no move (`rlsim.replay.fit_quality`).

Over the draws (weights w), for each candidate i: expected regret E_w[T_i / min_j T_j - 1] and p_within_5pct
P_w[T_i <= 1.05 min_j T_j]. Keeping the reference is a choice with its own expected regret: the pick is the least
expected regret among the reference and the candidates that beat it with probability `PlanConfig.confidence` on
predictions alone, or `measured_confidence` once a pilot (a run at candidate j, to the target or a prefix of one)
measured them; `Plan.why` says why in one line. It is a **decision** when its p_within_5pct reaches the confidence or
no pilot would lower the expected regret; otherwise the plan lists **pilots**, ranked by the regret they are
expected to remove (preposterior) per response spent. A move that the reference run's own luck could undo waits for
the reference again (`_confirm`). The method in full: docs/usage.md, "Planning".
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from statistics import NormalDist
from typing import Callable, Mapping, Sequence

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.modes.registry import as_recorded, check as check_mode, recorded_mode, resolved
from rlsim.replay.errors import RlsimError, name, setting
from rlsim.replay.evaluation import samples_to_target
from rlsim.replay.io import Trace
from rlsim.replay.learning import fit_learning_curve, noise_scale, prefix_log_rho
from rlsim.replay.models import INTERVAL
from rlsim.replay.util import is_count, json_safe
from rlsim.replay.rho_errors import RhoErrors, measured_errors
from rlsim.replay.schema import placement
from rlsim.replay.split_stats import split_stats
from rlsim.whatif.intervals import rlrun_setup
from rlsim.whatif.outcome import Outcome
from rlsim.whatif.predict import evaluate, reference_outcome
from rlsim.whatif.study import Study, fit_check, prepare

WITHIN = 0.05  # "within 5 % of the best"


@dataclass(frozen=True)
class PlanConfig:
    """What `rlsim plan` is asked."""

    prompts: tuple[int, ...] = field(default=(), metadata={
        "help": "candidate P (prompts per update), two or more; the reference's is added (none: the ladder P/4, P/2, "
                "2P, 4P around the reference's P, `ladder`)"})
    group: int | None = field(default=None, metadata={"help": "G of every candidate (None: the reference's)"})
    budget: float | None = field(default=None,
                                 metadata={"help": "responses the pilots may spend in all (None: one reference run's)"})
    confidence: float = field(default=0.8, metadata={"help": "p_within_5pct at which the pick is a decision"})
    draws: int = field(default=4000,
                       metadata={"help": "draws of the truth (error curves plus the studies' seed noise)"})
    seed: int = field(default=0, metadata={"help": "seed of the draws"})
    updates: int = field(default=40, metadata={"help": "updates simulated per candidate for sigma"})
    measured_confidence: float = field(default=0.8, metadata={
        "help": "probability with which a measured candidate must beat the reference to be picked (0: the least "
                "expected regret wins outright); chosen on the recorded studies (docs/results.md, 'rlsim plan acts on "
                "its pilots')"})
    slack: float = field(default=0.3, metadata={
        "help": "sd in log T by which a task's truth may lie off every recorded error curve: a pilot's measurement is "
                "weighed against the curves with it (0: the curves only; large: the measurement only); chosen on the "
                "recorded studies (docs/results.md, 'rlsim plan acts on its pilots')"})
    model_params: float | None = field(default=None, metadata={
        "help": "the model's parameter count, e.g. 7e9, for the candidates' memory when the trace names a model rlsim "
                "cannot size (None: the trace's model; WhatIf.model_params)"})
    prefix_moves: bool = field(default=False, metadata={
        "help": "whether a candidate read only by a prefix (a pilot short of the target) may be picked; False: a "
                "prefix only steers the pilots, a move needs a run to the target (chosen on the recorded studies: "
                "docs/results.md, 'The harness read prefixes whole')"})
    again: bool = field(default=True, metadata={
        "help": "whether the plan may ask for the reference's configuration run again with another seed, the one "
                "pilot that reads the reference run's own luck (False: pilots at other sizes only)"})
    fixed: tuple = field(default=(), metadata={
        "help": "((WhatIf field, value), ...) every candidate shares: the execution mode, its settings and devices "
                "(e.g. (('mode', 'fully_async'),))"})

    def validate(self) -> None:
        ps = list(self.prompts)
        if len(ps) == 1:
            raise RlsimError("rlsim plan needs two or more candidate sizes, e.g. --prompts 16,32,64,128 (or none: "
                             "P/4, P/2, 2P and 4P around the reference's P)")
        if not all(is_count(p, 1) for p in ps):
            raise RlsimError(f"{name('prompts')} sizes must be positive integers, got {ps}")
        if len(set(ps)) != len(ps):
            raise RlsimError(f"{name('prompts')} lists a size twice ({ps}); give each candidate once")
        if self.fixed:
            cfg = WhatIf(**dict(self.fixed))
            cfg.validate()
            if cfg.mode is not None:  # else the mode the trace records may take them (`plan`)
                check_mode(cfg)
        if self.group is not None and not is_count(self.group, 1):
            raise RlsimError(f"{name('group')} must be a positive integer (responses per prompt), got {self.group!r}")
        if not is_count(self.draws, 100):
            raise RlsimError(f"draws must be an integer of at least 100 (draws of the truth), got {self.draws!r}")
        if self.budget is not None and not self.budget > 0:
            raise RlsimError(f"--budget must be a positive number of responses, got {self.budget}")
        if not 0.5 <= self.confidence < 1:
            raise RlsimError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        if not self.slack >= 0:
            raise RlsimError(f"slack must be 0 or more (sd in log T), got {self.slack}")
        WhatIf(model_params=self.model_params).validate()


@dataclass(frozen=True)
class Candidate:
    """One candidate size as the plan sees it."""

    prompts: int = field(metadata={"help": "P"})
    group: int = field(metadata={"help": "G"})
    sigma: float = field(metadata={"help": "simulated throughput gain over the reference"})
    rho: float = field(metadata={"help": "sample cost predicted from the reference alone (or measured by a pilot)"})
    time_to_target_ratio: float = field(metadata={"help": "rho / sigma, the point prediction"})
    time_to_target_ratio_lo: float = field(metadata={"help": "5 % quantile of T over the draws"})
    time_to_target_ratio_hi: float = field(metadata={"help": "95 % quantile of T over the draws"})
    p_within_5pct: float = field(metadata={"help": "probability that its T is within 5 % of the best candidate's"})
    expected_regret: float = field(metadata={"help": "E[T / T_best - 1] over the draws"})
    p_beats_reference: float = field(metadata={"help": "probability that its T is below the reference's"})
    measured: bool = field(default=False, metadata={"help": "its rho was measured (the reference, or a pilot)"})
    source: str = field(default="prediction", metadata={
        "help": "where its rho, sigma and T come from: 'reference', 'pilot' (a run to the target), 'pilot prefix' "
                "(a run short of the target, read at equal responses) or 'prediction'"})
    rho_noise: float = field(default=math.nan, metadata={
        "help": "a pilot's seed noise: sd of its measured log rho (one seed each of it and the reference; a "
                "prefix's is the measured prefix noise); nan for a prediction, 0 for the reference"})
    sigma_noise: float = field(default=math.nan, metadata={
        "help": "a pilot's seed noise: sd of its measured log sigma (responses/s over the reference's); nan for a "
                "prediction, 0 for the reference"})
    fits: bool | None = field(default=None, metadata={
        "help": "fits its devices' memory (None: unknown); one that does not is never picked nor piloted"})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Pilot:
    """One pilot run worth making: a run at a candidate size to the target."""

    prompts: int = field(metadata={"help": "P"})
    group: int = field(metadata={"help": "G"})
    steps: int = field(metadata={
        "help": "updates: a run to the target, the reference's samples-to-target times the candidate's predicted rho; "
                "a prefix, `responses` long; the reference again, the reference's recorded updates (stop it at the "
                "target)"})
    responses: int = field(metadata={"help": "responses it trains on to the target or the prefix's end: its price"})
    expected_regret_after: float = field(metadata={"help": "expected regret of the pick once it is measured"})
    command: str = field(metadata={"help": "the rlrun record command line"})
    prefix: bool = field(default=False, metadata={
        "help": "a prefix: a run stopped before the target, set against the reference's learning curve at equal "
                "responses (noisier than a run to the target; measured in `RhoErrors.prefix_sd`)"})
    again: bool = field(default=False, metadata={
        "help": "a second run of the reference's configuration with another seed, to the target: it reads the first "
                "run's own luck, which every pilot run to the target is read against"})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Observation:
    """What one pilot trace (or several at one size, pooled) measured, against the reference (one seed each)."""

    index: int = field(metadata={"help": "the candidate it measures"})
    log_rho: float = field(metadata={
        "help": "log rho measured: its samples-to-target over the reference's (or a prefix's)"})
    rho_sd: float = field(metadata={"help": "seed noise of log_rho (a pilot's, or a prefix's)"})
    sigma: float = field(metadata={"help": "sigma measured: its steady responses/s over the reference's"})
    sigma_sd: float = field(metadata={"help": "seed noise of log sigma"})
    prefix: bool = field(default=False, metadata={"help": "it stopped short of the target: read from its prefix"})
    to_asked: float = field(default=1.0, metadata={
        "help": "the factor its measured sigma was carried by to the setup the plan asks (`setup_factor`; 1: "
                "recorded as asked)"})


@dataclass(frozen=True)
class Plan:
    """A decision, or the pilots that would most cheaply lead to one."""

    candidates: tuple[Candidate, ...] = field(metadata={"help": "every candidate, in the order asked (the reference "
                                                                "included)"})
    decision: Candidate | None = field(metadata={"help": "the size to run (None: run the pilots first)"})
    pilots: tuple[Pilot, ...] = field(metadata={"help": "pilots by regret removed per response, best first (empty: "
                                                        "decided)"})
    expected_regret: float = field(metadata={"help": "expected regret of the best pick now"})
    reference_prompts: int = field(metadata={"help": "the reference's P"})
    why: str = field(default="", metadata={
        "help": "one line: why the pick, by expected regret (keeping the reference is a choice with its own)"})
    notes: tuple[str, ...] = field(default=(), metadata={"help": "how the plan was made"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "what may be wrong"})
    no_move: str = field(default="", metadata={
        "help": "why the plan makes no move, neither a decision nor a pilot (the trace's cost fits cannot be used, "
                "rlsim.replay.fit_quality), and the recording that would fix it; '' when it makes one"})
    mode_line: str = field(default="", metadata={
        "help": "the line saying the candidates ask about the execution mode the trace records ('' where the plan "
                "names its mode or the trace records none; rlsim.modes.registry.as_recorded)"})
    asked: str = field(default="", metadata={
        "help": "the settings every candidate is asked with (the execution mode, its devices, the hardware), as the "
                "user gave them; '' for none"})

    def to_dict(self) -> dict:
        out = {"reference_prompts": self.reference_prompts, "expected_regret": self.expected_regret, "why": self.why,
               "candidates": [c.to_dict() for c in self.candidates], "notes": list(self.notes),
               "warnings": list(self.warnings)}
        if self.no_move:
            out["no_move"] = self.no_move
        if self.mode_line:
            out["mode_from_trace"] = self.mode_line
        if self.asked:
            out["asked"] = self.asked
        if self.decision is not None:
            d = self.decision
            out["decision"] = {"prompts": d.prompts, "group": d.group, "p_within_5pct": d.p_within_5pct,
                               "expected_regret": d.expected_regret,
                               "keep_reference": d.prompts == self.reference_prompts}
        else:
            out["pilots"] = [p.to_dict() for p in self.pilots]
        return json_safe(out)  # a plan that makes no move has no regrets: None, not NaN, in JSON and sweep metadata


# ------------------------------------------------------------------------------------------------ the draws

def truth_draws(log_t: np.ndarray, d: np.ndarray, errors: RhoErrors, draws: int, rng: np.random.Generator,
                sigma_sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log T, rho error), each (draws, n), of the candidates: the point predictions `log_t` (n,) plus a measured
    error curve at their d = log2(B / B_ref) (n,) with the studies' seed-mean noise (rho), and sigma's error, sd
    `sigma_sd` (n,) in log (`sigma_spread`). The reference (d = 0) is exact in both."""
    away = d != 0
    curves = errors.at(d)
    e_rho = curves[rng.integers(0, len(curves), draws)] + rng.standard_normal((draws, len(d))) * errors.truth_sd * away
    e_sigma = rng.standard_normal((draws, len(d))) * np.asarray(sigma_sd, float) * away
    return log_t[None, :] + e_rho - e_sigma, e_rho


def sigma_spread(preds: Sequence[Outcome]) -> tuple[np.ndarray, list[int]]:
    """((n,) sd of log sigma of each candidate, read from its sigma interval as a log-normal spread: log(hi / lo) over
    the interval's width in standard deviations; the indices of the candidates whose sigma has no interval, taken
    as exact)."""
    z = 2 * NormalDist().inv_cdf(0.5 + INTERVAL / 2)
    sd, bare = np.zeros(len(preds)), []
    for i, p in enumerate(preds):
        lo, hi = p.sigma_lo, p.sigma_hi
        if p.rho_model == "reference":
            continue
        if math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi:
            sd[i] = math.log(hi / lo) / z
        else:
            bare.append(i)
    return sd, bare


def measured_column(log_T: np.ndarray, y, s: float, slack: float, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weights, T): a pilot's measured log T `y` (scalar, (K,) one per draw, (M, 1) or (M, K); noise sd `s`) against
    the draws' log T of its candidate `log_T` (K,), when the truth may lie `slack` off each draw: each draw weighed by
    the likelihood of y (variance s^2 + slack^2), and the candidate's T in it the normal posterior of prior
    N(log_T, slack^2) and the measurement (gain g = slack^2 / (slack^2 + s^2)), drawn with `z` (K,). slack 0: the
    draws' own T, reweighted."""
    v = s ** 2 + slack ** 2
    g = slack ** 2 / v if v > 0 else 0.0
    w = np.exp(-0.5 * (y - log_T) ** 2 / v) if v > 0 else np.ones_like(log_T)
    return w, np.exp(log_T + g * (y - log_T) + math.sqrt(g) * s * z)


def weigh(T: np.ndarray, readings: Sequence[tuple[int, float, float, bool]], u: np.ndarray, shared_sd: float,
          slack: float, rng: np.random.Generator, ref: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(weights (K,), T (K, n)): the draws T (K, n) once the pilots' readings (candidate j, measured log T, its noise sd
    in log T, whether it is a run to the target) are weighed in. A run to the target, less its draw's offset u (K,)
    (the reference run's luck at the target, sd `shared_sd`, common to every such pilot), measures its candidate
    with its own noise (`own_sd`); a prefix, read against the reference's curve where it stopped, shares no
    measurable part of it (docs/usage.md, Planning). Each reweighs the draws (their errors move together) and sets
    its own column (`measured_column`); a second run of the reference (j = `ref`, its log rho over the first's) reads
    u alone and sets no column."""
    w, T = np.ones(len(T)), T.copy()
    for j, y, sd, full in readings:
        y, sd = (y - u, own_sd(sd, shared_sd)) if full else (y, sd)
        if j == ref:  # the recorded configuration run again: it reads 0 + u, whatever the plan's mode makes of it
            w = w * measured_column(np.zeros(len(T)), y, sd, 0.0, np.zeros(len(T)))[0]
            continue
        wj, T[:, j] = measured_column(np.log(T[:, j]), y, sd, slack, rng.standard_normal(len(T)))
        w = w * wj
    return w, T


def luck_note(u: np.ndarray, w: np.ndarray, shared_sd: float, full: int, again: bool = False) -> str:
    """A note when two or more runs to the target, or a second run of the reference (`again`), read the reference
    run as lucky or unlucky: the weighted mean of the draws' shared offset u (K,) in log T, where it is at least half
    its prior sd ('' otherwise)."""
    if (full < 2 and not again) or not shared_sd > 0:
        return ""
    m = float((w / w.sum()) @ u)
    if abs(m) < 0.5 * shared_sd:
        return ""
    who = "the second run of the reference reads" if again else "the pilots run to the target read"
    return (f"{who} the reference run as {'slow' if m < 0 else 'fast'}: each pilot reads its "
            f"candidate about {abs(math.expm1(m)):.0%} {'faster' if m < 0 else 'slower'} than it is (the reference's "
            "own luck, shared by every pilot read against it); the decision takes it out, their rows show what they "
            "measured")


def one_reading(s: Scored, best: int, shared_sd: float, study: Study) -> str:
    """A warning when a move rests on one run to the target read against the one reference run: their ratio carries
    the reference run's own luck (sd `shared_sd` in log T), which only a second run at the reference's size tells
    apart ('' otherwise)."""
    full = [j for j, o in s.observed.items() if not o.prefix]
    if best == s.ref or full != [best] or not shared_sd > 0:
        return ""
    again = _again_of(study, s)
    return (f"the move to P={s.sizes[best]} rests on one pilot run read against one reference run, and that reading "
            f"carries the reference run's own luck (sd {shared_sd:.2f} in log T): before acting on it, run the "
            f"reference's configuration again with another seed ({again.command}) and plan again with it as a pilot")


def scores(T: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(expected regret (n,), p_within_5pct (n,)) of each candidate over draws T (K, n) with weights w (K,)."""
    best = T.min(axis=1, keepdims=True)
    p = w / w.sum()
    return p @ (T / best - 1.0), p @ (T <= (1 + WITHIN) * best).astype(float)


def pick(T: np.ndarray, w: np.ndarray, ref: int, confidence: float = 0.8, measured: Sequence[int] = (),
         measured_confidence: float = 0.0, barred: Sequence[int] = ()) -> int:
    """The least expected regret among the reference, the `measured` candidates, and the candidates predicted to beat
    the reference with probability `confidence` (the guard on moves made on predictions alone: their draws come from
    other tasks' errors and may not cover this one's); a measured one needs `measured_confidence`; `barred` ones
    never (read by a prefix alone, with `PlanConfig.prefix_moves` off). Ties: the reference."""
    er, _ = scores(T, w)
    beats = (w / w.sum()) @ (T < T[:, [ref]])
    ok = [i for i in range(T.shape[1])
          if i == ref or (i not in barred and beats[i] >= (measured_confidence if i in measured else confidence))]
    return min(ok, key=lambda i: (er[i], i != ref))


def own_sd(sd: float, shared_sd: float) -> float:
    """The part of a pilot's noise `sd` (log T) that is its own, once the part it shares with the other pilots of the
    same reference run (`RhoErrors.shared_sd`) is drawn apart; at least a tenth of it."""
    return math.sqrt(max(sd ** 2 - shared_sd ** 2, (0.1 * sd) ** 2))


def regret_after_pilot(T: np.ndarray, w: np.ndarray, j: int, ref: int, sd: float, rng: np.random.Generator,
                       truths: int = 400, **rule) -> float:
    """Expected regret of the pick once candidate j is measured (`picks_after_pilot`, its arguments), over the truths
    drawn there."""
    idx, c = picks_after_pilot(T, w, j, ref, sd, rng, truths, **rule)
    return float(np.mean(T[idx, c] / T[idx].min(axis=1) - 1.0))


def picks_after_pilot(T: np.ndarray, w: np.ndarray, j: int, ref: int, sd: float, rng: np.random.Generator,
                      truths: int = 400, confidence: float = 0.8, measured: Sequence[int] = (),
                      slack: float = 0.3, measured_confidence: float = 0.0, u: np.ndarray | None = None,
                      barred: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(the truths drawn (M,) as indices of the draws, the pick made after each one's reading (M,)) once candidate j
    is measured (preposterior over `truths` draws taken as the
    truth): T (K, n) draws of T, w (K,) the current weights, sd a pilot's own noise in log T, u (K,) the draws' offset
    shared by every pilot of the reference (`Scored.u`; None: none), `barred` the candidates the pick may not take;
    j = `ref`: a second run of the reference, which reads u alone. As `score` does with a pilot given back
    (`measured_column`), then `pick`. All truths at once: (M, K) arrays."""
    u = np.zeros(len(w)) if u is None else u
    idx = rng.choice(len(w), size=min(truths, len(w)), p=w / w.sum())
    log_T = np.zeros(len(w)) if j == ref else np.log(T[:, j])  # the reference run again reads 0 + u (`weigh`)
    y = (log_T[idx] + u[idx] + rng.standard_normal(len(idx)) * sd)[:, None]  # (M, 1) what it would measure
    W, col = measured_column(log_T[None, :], y - u[None, :], sd, 0.0 if j == ref else slack,
                             rng.standard_normal(len(w)))
    col = np.broadcast_to(T[:, ref], W.shape) if j == ref else col
    W = w[None, :] * W
    W = np.where(W.sum(axis=1, keepdims=True) > 0, W, w[None, :])
    P = W / W.sum(axis=1, keepdims=True)
    best = np.minimum(np.delete(T, j, axis=1).min(axis=1)[None, :], col)  # (M, K) the best T of each draw
    er = (P / best) @ T - 1.0  # (M, n); column j is the measured one
    er[:, j] = (P * col / best).sum(axis=1) - 1.0
    beats = P @ (T < T[:, [ref]]).astype(float)
    beats[:, j] = (P * (col < T[None, :, ref])).sum(axis=1)
    need = np.full(T.shape[1], confidence)
    need[[j, *measured]] = measured_confidence
    ok = beats >= need
    ok[:, list(barred)] = False
    ok[:, ref] = True
    key = np.where(ok, er, np.inf)
    key[:, ref] = np.nextafter(key[:, ref], -np.inf)  # ties: the reference
    return idx, key.argmin(axis=1)


# ------------------------------------------------------------------------------------------------ the plan

@dataclass(frozen=True, eq=False)
class Scored:
    """The candidates' predictions and the weighted draws of their truth."""

    sizes: list = field(metadata={"help": "candidate P, ascending, the reference's included"})
    ref: int = field(metadata={"help": "index of the reference"})
    preds: list = field(metadata={"help": "the what-if Outcome of each"})
    T: np.ndarray = field(metadata={"help": "(K, n) draws of T / T_ref"})
    e: np.ndarray = field(metadata={"help": "(K, n) their log-rho errors"})
    w: np.ndarray = field(metadata={"help": "(K,) weights (pilots observed)"})
    measured: set = field(metadata={"help": "indices whose rho was measured"})
    notes: list = field(metadata={"help": "how it was made"})
    warnings: list = field(default_factory=list, metadata={"help": "what may be wrong with it"})
    observed: dict = field(default_factory=dict, metadata={"help": "index -> the pilots' Observation there"})
    u: np.ndarray | None = field(default=None, metadata={
        "help": "(K,) each draw's offset in log T shared by every pilot read against the reference (its run's own "
                "luck, sd RhoErrors.shared_sd); a pilot's reading minus it is the candidate's T plus the pilot's own "
                "noise"})


def score(study: Study, cfg: PlanConfig, pilots: Sequence[Trace], errors: RhoErrors, rng: np.random.Generator,
          model: Mapping | None = None, bounds_ok: bool = False, ref_rps: float = math.nan) -> Scored:
    """Predict every candidate, draw its truth from the measured errors, weigh the draws by the pilots' measurements."""
    G = cfg.group or study.reference.group
    sizes = sorted(set(cfg.prompts) | {study.reference.prompts})
    preds = [_predict(study, P, G, cfg) for P in sizes]
    log_t = np.log([p.time_to_target_ratio for p in preds])
    d = np.log2(np.array(sizes, float) * G / study.b_ref)
    ref = sizes.index(study.reference.prompts)
    sd, bare = sigma_spread(preds)
    T_log, e = truth_draws(log_t, d, errors, cfg.draws, rng, sd)
    away = sd[d != 0]
    notes = [errors.describe(), f"sigma uncertainty: the trace's own sigma intervals (its fits' bootstrap and held-out "
                                f"error), sd {away.min():.2f}..{away.max():.2f} in log" if len(away) else ""]
    notes = [n for n in notes if n] + _memory_notes(preds)
    warnings = [f"sigma of P={', '.join(str(sizes[i]) for i in bare)} has no interval from this trace (nothing "
                "resamples its fits): taken as exact, which understates the uncertainty"] if bare else []
    factor = setup_factor(study, cfg, sizes, G, preds)
    observed = observe(study, pilots, sizes, G, preds, errors, model, bounds_ok, notes, ref_rps, factor)
    u = np.random.default_rng(cfg.seed + 2).standard_normal(cfg.draws) * errors.shared_sd
    readings = [(j, o.log_rho, o.rho_sd, True) if j == ref else  # its speed on another day reads the host, not u
                (j, o.log_rho - math.log(o.sigma), math.hypot(o.rho_sd, o.sigma_sd), not o.prefix)
                for j, o in observed.items()]
    w, T = weigh(np.exp(T_log), readings, u, errors.shared_sd, cfg.slack, rng, ref)
    measured = {ref, *observed}
    if not w.sum() > 0:
        raise RlsimError("the pilots' measurements lie outside every recorded error curve; check that they come from "
                         "the same task, model and lr rule as the reference")
    luck = luck_note(u, w, errors.shared_sd, sum(full for j, *_, full in readings if j != ref), ref in observed)
    notes += [luck] if luck else []
    return Scored(sizes, ref, preds, T, e, w, measured, notes, warnings, observed, u)


def plan(reference: Trace, cfg: PlanConfig, *, pilots: Sequence[Trace] = (),
         errors: Mapping[str, RhoErrors] | None = None, target: float | None = None, bounds_ok: bool = False) -> Plan:
    """Candidates scored over the measured uncertainty, then a decision or the pilots worth running (module doc).
    `errors`: measured error curves by rho model (default: `rlsim.replay.rho_errors`); `bounds_ok`: a pilot short of the
    target whose prefix cannot be read counts at its budget (a lower bound) instead of being refused."""
    cfg.validate()
    _once(reference, pilots)
    cfg, line = _as_recorded(cfg, reference.config)
    study = prepare([reference], rho_model="noise-scale" if _has_noise_scale(reference) else "invariant", target=target)
    errors = (errors or {}).get(study.rho_requested) or measured_errors(study.rho_requested)
    G = cfg.group or study.reference.group
    asked_sizes = bool(cfg.prompts)
    if not asked_sizes:
        cfg = replace(cfg, prompts=ladder(study.reference.prompts))
    if cfg.budget is not None and cfg.budget < min(cfg.prompts) * G:
        raise RlsimError(f"--budget {cfg.budget:g} responses is below one update of the smallest candidate "
                         f"({min(cfg.prompts)} x {G} = {min(cfg.prompts) * G}); give at least that")
    if not len(study.curves[0].score):
        raise RlsimError(f"{reference.name} has no eval scores, so no learning curve to plan from: record the "
                         "reference with evals (rlrun record --eval-every N) or import a log that prints validation "
                         "scores")
    if not np.isfinite(study.n_star_ref):
        raise RlsimError(f"{reference.name} never reaches its target, so no samples-to-target to plan from; pass a "
                         "lower --target")
    s = score(study, cfg, pilots, errors, np.random.default_rng(cfg.seed),
              reference.meta.get("model") or None,
              bounds_ok, split_stats(reference).responses_per_s if pilots else math.nan)
    s, fit_warnings = _feasible(s)
    cands, er, p5 = _rows(s)
    best = pick(s.T, s.w, s.ref, cfg.confidence, sorted(s.measured), cfg.measured_confidence, _barred(s, cfg))
    d = np.log2(np.array(s.sizes, float) * G / study.b_ref)
    warnings = [w for w in [errors.span_note(d, [f"P={P}" for P in s.sizes]),
                            one_reading(s, best, errors.shared_sd, study)] if w] + s.warnings + fit_warnings
    notes = s.notes if asked_sizes else [f"candidates: P={', '.join(map(str, s.sizes))}, the reference's P with P/4, "
                                         f"P/2, 2P and 4P ({name('prompts')} names others)", *s.notes]
    decided = Plan(cands, cands[best], (), float(er[best]), study.reference.prompts, _why(cands, best, s.ref, cfg),
                   tuple(notes), tuple(warnings), mode_line=line, asked=_asked(cfg.fixed) if not line else "")
    unusable = fit_check(study).warning(reference.name, reference.config)
    if unusable:  # the fits say nothing of sigma: no decision and no pilot rests on them, nor a regret
        blank = tuple(replace(c, p_within_5pct=math.nan, expected_regret=math.nan, p_beats_reference=math.nan)
                      for c in cands)
        return replace(decided, candidates=blank, decision=None, expected_regret=math.nan, why="",
                       warnings=(unusable, *warnings), no_move=unusable)
    budget = cfg.budget if cfg.budget is not None else _reference_responses(study)
    first = _confirm(study, s, best, errors, cfg)
    if first is not None and first[0].responses <= budget:
        return replace(decided, decision=None, pilots=(first[0],),
                       why=f"{decided.why}; but it changes with probability {first[1]:.2f} once the reference run's "
                           "own luck is read, so the reference again first")
    if p5[best] >= cfg.confidence:
        return decided
    options = _pilots(study, s, errors, cfg.seed + 1, cfg)
    useful = [p for p in options if p.responses <= budget and p.expected_regret_after < er[best] - 0.005]
    if useful:
        return replace(decided, decision=None, pilots=tuple(useful))
    warnings.append(_undecided(cands, best, budget, options))
    return replace(decided, warnings=tuple(warnings))


def _rows(s: Scored) -> tuple[tuple[Candidate, ...], np.ndarray, np.ndarray]:
    """(the candidates' rows, expected regret (n,), p_within_5pct (n,)): a pilot's row shows what it measured."""
    er, p5 = scores(s.T, s.w)
    er[[i for i, p in enumerate(s.preds) if p.fits is False and i != s.ref]] = np.inf  # shown as "does not fit"
    beats = (s.w / s.w.sum()) @ (s.T < s.T[:, [s.ref]])
    rows = []
    for i, (P, p) in enumerate(zip(s.sizes, s.preds)):
        lo, hi = _weighted_quantiles(s.T[:, i], s.w, (0.05, 0.95))
        if i == s.ref and p.rho_model != "reference" and 0 < p.sigma_lo <= p.sigma_hi < math.inf:
            # an asked setup: the reference's sigma there is predicted; its error, shared by every size, leaves the
            # regrets unchanged, so the draws take it as exact and the row shows its own interval
            lo, hi = p.rho / p.sigma_hi, p.rho / p.sigma_lo
        o = s.observed.get(i) if i != s.ref else None  # a second run of the reference reads its luck, a note says
        rho, sigma = (math.exp(o.log_rho), o.sigma) if o else (p.rho, p.sigma)
        source = "reference" if i == s.ref else ("pilot prefix" if o.prefix else "pilot") if o else "prediction"
        noise = (o.rho_sd, o.sigma_sd) if o else (0.0, 0.0) if i == s.ref else (math.nan, math.nan)
        rows.append(Candidate(prompts=P, group=p.group, sigma=sigma, rho=rho, time_to_target_ratio=rho / sigma,
                              time_to_target_ratio_lo=lo, time_to_target_ratio_hi=hi, p_within_5pct=float(p5[i]),
                              expected_regret=float(er[i]), p_beats_reference=float(beats[i]), measured=i in s.measured,
                              source=source, rho_noise=noise[0], sigma_noise=noise[1], fits=p.fits))
    return tuple(rows), er, p5


def _why(cands: Sequence[Candidate], best: int, ref: int, cfg: PlanConfig) -> str:
    """One line: the pick by expected regret, against keeping the reference (or the runner-up when it is kept)."""
    c, r = cands[best], cands[ref]
    if best == ref:
        o = min((x for i, x in enumerate(cands) if i != ref and x.fits is not False), key=lambda x: x.expected_regret,
                default=None)
        if o is None:
            return "keep the reference: no other candidate fits"
        if o.expected_regret < r.expected_regret:
            what, need = ("measured", cfg.measured_confidence) if o.measured else ("predicted", cfg.confidence)
            return (f"keep the reference: expected regret {r.expected_regret:.1%}; P={o.prompts} ({what}) would have "
                    f"{o.expected_regret:.1%}, but a {what} move needs it to beat the reference with probability "
                    f"{need:.2f} (it does with {o.p_beats_reference:.2f})")
        return (f"keep the reference: expected regret {r.expected_regret:.1%}, the least (next: P={o.prompts}, "
                f"{o.source}, {o.expected_regret:.1%})")
    how = (f"measured by a {c.source}" if c.measured else
           f"predicted to beat the reference with probability {c.p_beats_reference:.2f} >= {cfg.confidence:.2f}")
    return (f"run P={c.prompts}: expected regret {c.expected_regret:.1%} ({how}), against {r.expected_regret:.1%} for "
            "keeping the reference")


def ladder(P: int) -> tuple[int, ...]:
    """The candidate sizes a plan weighs when none are named: P/4, P/2, 2P and 4P (at least 1, without P)."""
    return tuple(sorted({max(1, round(P * f)) for f in (0.25, 0.5, 2, 4)} - {P}))


def _as_recorded(cfg: PlanConfig, config: Mapping) -> tuple[PlanConfig, str]:
    """The plan with its shared settings `fixed` asking about the execution mode the reference's trace `config`
    records where they name none (`rlsim.modes.registry.as_recorded`), and the line that says so."""
    like, line = as_recorded(WhatIf(**dict(cfg.fixed)), config)
    if not line:
        return cfg, ""
    return replace(cfg, fixed=tuple((f.name, getattr(like, f.name)) for f in fields(WhatIf)
                                    if getattr(like, f.name) != f.default)), line


def _asked(fixed: tuple) -> str:
    """The line saying which settings every candidate shares, as given ('' for none)."""
    return (f"asked: {setting(**dict(fixed))} for every candidate, the reference's size too (T / T_ref against the "
            "reference as recorded)" if fixed else "")


def same_recording(a: Trace, b: Trace) -> str:
    """How two traces are one recording: 'the same file', 'the same events' (a copy, or a log imported twice), or ''."""
    try:
        if a.path.resolve() == b.path.resolve():
            return "the same file"
    except OSError:
        pass
    return "the same events" if a.table.num_rows == b.table.num_rows and a.table.equals(b.table) else ""


def _once(reference: Trace, pilots: Sequence[Trace]) -> None:
    """Refuse a pilot that is the reference's own recording (it would measure the reference's rho against itself) or
    one given twice (its observation would count twice)."""
    for i, tr in enumerate(pilots):
        for j, other in enumerate([reference, *pilots[:i]]):
            how = same_recording(tr, other)
            if how:
                what = "the reference's own recording" if j == 0 else f"pilot {other.path} again"
                raise RlsimError(f"pilot {tr.path} is {what} ({how}): a pilot is another run at a candidate size; "
                                 f"give the reference first and each pilot once ({name('trace')} REF "
                                 f"{name('trace')} PILOT ...)")


def _undecided(cands: Sequence[Candidate], best: int, budget: float, options: Sequence[Pilot]) -> str:
    """Why the pick is not a confident decision, and what would make one."""
    c = cands[best]
    out = f"undecided: P={c.prompts} is within 5 % of the best with probability {c.p_within_5pct:.2f}"
    cheap = min(options, key=lambda p: p.responses, default=None)
    if cheap is not None and cheap.responses > budget:
        out += (f"; no pilot fits the budget of {budget:.0f} responses (the cheapest, P={cheap.prompts}, takes about "
                f"{cheap.responses}: allow it with --budget {cheap.responses})")
    else:
        out += "; no pilot within the budget would lower the expected regret"
    return out


def _has_noise_scale(trace: Trace) -> bool:
    return bool(np.isfinite(noise_scale(trace).b_crit))


def _memory_notes(preds: Sequence[Outcome]) -> list[str]:
    """Why the candidates' memory is unknown or undecided, and what to pass: once, not per candidate."""
    memory = ("memory unknown", "memory undecided")
    return list(dict.fromkeys(n for p in preds for n in p.notes if n.startswith(memory)))


def _predict(study: Study, P: int, G: int, cfg: PlanConfig) -> Outcome:
    """Candidate P; under the plan's shared settings `fixed` (a mode) every size runs in it, the reference's too."""
    like = WhatIf(updates=cfg.updates, model_params=cfg.model_params, **dict(cfg.fixed))
    if P == study.reference.prompts and G == study.reference.group and not cfg.fixed:
        return reference_outcome(study, cfg.updates, 0, like=like)
    return evaluate(study, replace(like, prompts=P, group=G))


def observe(study: Study, pilots: Sequence[Trace], sizes: list[int], G: int, preds: Sequence[Outcome],
            errors: RhoErrors, model: Mapping | None, bounds_ok: bool, notes: list[str],
            ref_rps: float, factor: Callable[[int, Trace], float] | None = None) -> dict[int, Observation]:
    """The pilots' observations by candidate index: at one size, runs to the target supersede prefixes, and what is
    left is pooled (inverse-variance mean of log rho, mean of log sigma); one note per pilot says what it measured.
    `factor` (`setup_factor`): what carries a pilot's sigma to the setup the plan asks."""
    by: dict[int, list[Observation]] = {}
    for tr in pilots:
        o = pilot_observation(study, tr, sizes, G, preds, errors, model, bounds_ok, ref_rps, factor)
        by.setdefault(o.index, []).append(o)
        if sizes[o.index] == study.reference.prompts:
            notes.append(f"second run of the reference {tr.name}: it reached the target after "
                         f"{math.exp(o.log_rho):.2f}x the first run's responses (seed noise {o.rho_sd:.2f} in log), "
                         "a reading of the first run's own luck, which every pilot run to the target is read against")
            continue
        how = "a prefix short of the target, read at equal responses" if o.prefix else "to the target"
        asked = (f" in the asked setup (x{o.to_asked:.3f} from as recorded, the simulator's ratio)"
                 if o.to_asked != 1.0 else "")
        notes.append(f"pilot {tr.name}: P={sizes[o.index]}, {how}: rho {math.exp(o.log_rho):.3f} (seed noise "
                     f"{o.rho_sd:.2f} in log), sigma {o.sigma:.3f} ({o.sigma_sd:.2f}){asked}, "
                     f"T {math.exp(o.log_rho) / o.sigma:.3f}")
    out = {}
    for j, obs in by.items():
        full = [o for o in obs if not o.prefix] or obs
        iv = np.array([1 / o.rho_sd ** 2 for o in full])
        out[j] = Observation(j, float(iv @ [o.log_rho for o in full] / iv.sum()), float(iv.sum() ** -0.5),
                             float(np.exp(np.mean([math.log(o.sigma) for o in full]))),
                             float(np.mean([o.sigma_sd for o in full]) / math.sqrt(len(full))), full[0].prefix)
    return out


def pilot_observation(study: Study, tr: Trace, sizes: list[int], G: int, preds: Sequence[Outcome], errors: RhoErrors,
                      model: Mapping | None, bounds_ok: bool = False, ref_rps: float = math.nan,
                      factor: Callable[[int, Trace], float] | None = None) -> Observation:
    """What a pilot trace measured: its samples-to-target over the reference's (one seed each: noise
    `errors.seed_sd`), or, short of the target, the rho its prefix gives against the reference's curve at equal
    responses (`prefix_log_rho`, its measured bias at its length and batch ratio removed, noise `errors.prefix_sd`);
    its responses/s over the reference's (noise `errors.pilot_sigma_sd`; the prediction's sigma where either has
    none), carried to the setup the plan asks by `factor(j, tr)` (`setup_factor`)."""
    _same_setup(study, tr, model)
    c = tr.config
    P, g = int(c.get("prompts") or 0), int(c.get("group") or 1)
    if P not in sizes or g != G:
        raise RlsimError(f"pilot {tr.name} is P={P}, G={g}, not one of the candidates (P in {sizes}, G={G}); "
                         "pass the candidates it was recorded for")
    j = sizes.index(P)
    curve = fit_learning_curve(tr)
    if not len(curve.score):
        raise RlsimError(f"pilot {tr.name} has no eval rows, so it cannot measure samples-to-target; record it with "
                         "evals (rlrun record --eval-every N)")
    reached = samples_to_target(curve, study.target)
    if reached.n <= 0:
        raise RlsimError(f"pilot {tr.name} has no eval after training started, so it measures nothing; run it longer "
                         "(more --steps than --eval-every)")
    log_rho, sd, prefix = math.log(reached.n / study.n_star_ref), errors.seed_sd, reached.censored
    if P == study.reference.prompts:  # a second run of the reference: its samples-to-target read the first's luck
        _another_seed(study, tr, reached, bounds_ok)
        prefix = False  # short of the target (bounds_ok): counted at its budget, a lower bound
    elif prefix:
        bias, p_sd = errors.prefix_noise(reached.n / study.n_star_ref, math.log2(P * G / study.b_ref))
        est = prefix_log_rho(study.curves[0], curve, reached.n)
        if math.isfinite(est) and math.isfinite(p_sd):
            log_rho, sd = est - bias, p_sd
        elif not bounds_ok:
            raise RlsimError(f"pilot {tr.name} never reached the target {study.target:.4g} (trained {reached.n:.0f} "
                             "responses) and its learning curve cannot be set against the reference's (it never passed "
                             "the reference's first eval score): run it longer (more --steps)")
    f = factor(j, tr) if factor is not None else 1.0
    rps = split_stats(tr).responses_per_s
    sigma, s_sd = f * rps / ref_rps, errors.pilot_sigma_sd
    if not (math.isfinite(sigma) and sigma > 0):
        sigma, s_sd, f = preds[j].sigma, float(sigma_spread([preds[j]])[0][0]), 1.0
    return Observation(j, float(log_rho), float(sd), float(sigma), float(s_sd), bool(prefix), float(f))


def _another_seed(study: Study, tr: Trace, reached, bounds_ok: bool) -> None:
    """Refuse a second run of the reference that has the reference's seed (it would repeat the first run's luck, not
    read it) or, unless `bounds_ok`, that stopped short of the target (`reached`, samples_to_target's)."""
    seed, first = tr.config.get("seed"), study.models.config.get("seed")
    if seed is not None and seed == first:
        raise RlsimError(f"pilot {tr.name} is the reference's configuration with the reference's seed ({seed}): a "
                         "second run of the reference reads the first run's luck only with another seed (--seed)")
    if reached.censored and not bounds_ok:
        again = _again(study, study.reference.prompts, study.reference.group)
        raise RlsimError(f"pilot {tr.name}, a second run of the reference, stopped short of the target (trained "
                         f"{reached.n:.0f} responses): it reads the first run's luck only at the target; run it to "
                         f"the end ({again.command})")


def _same_setup(study: Study, tr: Trace, model: Mapping | None) -> None:
    """Refuse a pilot of another algorithm, task, lr rule or model than the reference's (`model`: its trace's model
    metadata), or of another build of the same built-in model: the warm-up that makes it, run on another host or
    software, may end elsewhere, and a run from other weights measures them, not the batch size."""
    c = tr.config
    for key in ("algo", "task", "lr_rule"):
        if str(c.get(key)) != str(study.models.config.get(key)):
            raise RlsimError(f"pilot {tr.name} has {key} {c.get(key)!r}, the reference "
                             f"{study.models.config.get(key)!r}: a pilot must be the reference's run at another size")
    if not model or model.get("name") is None:
        return
    mine = tr.meta.get("model") or {}
    if mine.get("name") != model.get("name"):
        raise RlsimError(f"pilot {tr.name} trains another model than the reference; record it with the reference's "
                         "--model")
    a, b = ((m.get("recipe") or {}).get("sft_final_loss") for m in (mine, model))
    if a is not None and b is not None and a != b:
        raise RlsimError(f"pilot {tr.name} trains another build of {model.get('name')} than the reference (its "
                         f"warm-up ended at loss {a:.6g}, the reference's at {b:.6g}): record it with the reference's "
                         "model folder (--model PATH, the folder the reference's trace names)")


def recorded_setup(config: Mapping) -> dict:
    """The execution setup a trace's config records, comparable between traces: an imported log's mode and its
    settings (`recorded_mode`), else rlrun's placement (a split's devices, staleness and partial rollout)."""
    m, settings = recorded_mode(config)
    if m:
        return {"mode": m, **settings}
    pl = placement(dict(config))
    if pl["mode"] != "split":
        return {"mode": "colocated"}
    return {"mode": "split", "gen_gpus": pl["gen_devices"], "train_gpus": pl["train_devices"],
            "staleness": pl["max_staleness"], **({"partial_rollout": True} if pl["partial_rollout"] else {})}


def asked_setup(fixed: tuple) -> dict:
    """The execution setup the plan's shared settings ask, as `recorded_setup` writes a trace's."""
    w = WhatIf(**dict(fixed))
    m = resolved(w)
    if m == "colocated":
        return {"mode": m}
    if m == "split":
        return {"mode": m, "gen_gpus": w.gen_gpus, "train_gpus": w.train_gpus, "staleness": w.staleness or 0,
                **({"partial_rollout": True} if w.partial_rollout else {})}
    return {"mode": m, **{k: v for k, v in fixed if k != "mode"}}


def setup_factor(study: Study, cfg: PlanConfig, sizes: list[int], G: int,
                 preds: Sequence[Outcome]) -> Callable[[int, Trace], float]:
    """What a pilot's measured sigma (its responses/s over the reference's) is multiplied by to read it in the setup
    the plan asks (`PlanConfig.fixed`): 1 for a pilot recorded as asked (the pilots' commands record them so where
    rlrun can, `pilot_setup`); for one recorded as the reference was, where another setup is asked, candidate j's
    predicted sigma as asked (`preds[j]`) over its predicted sigma as recorded. A pilot recorded otherwise is
    refused."""
    recorded, _ = _as_recorded(replace(cfg, fixed=()), study.models.config)
    ref, same = recorded_setup(study.models.config), recorded.fixed == cfg.fixed
    asked = ref if same else asked_setup(cfg.fixed)

    @functools.cache
    def ratio(j: int) -> float:  # (one simulation a size, however many pilots it has)
        return preds[j].sigma / _predict(study, sizes[j], G, recorded).sigma

    def factor(j: int, tr: Trace) -> float:
        mine = recorded_setup(tr.config)
        if mine == ref:
            return 1.0 if same else ratio(j)
        if mine == asked:
            return 1.0
        also = "" if asked == ref else f", the plan asks {setting(**asked)}"
        raise RlsimError(f"pilot {tr.name} was recorded with {setting(**mine)}, the reference with {setting(**ref)}"
                         f"{also}: record each pilot as asked (the plan's commands do where rlrun can) or as the "
                         "reference was")
    return factor


def _pilots(study: Study, s: Scored, errors: RhoErrors, seed: int, cfg: PlanConfig) -> list[Pilot]:
    """The pilots worth pricing, by expected regret removed per response, best first: at each candidate not yet run to
    the target, a run to the target (priced at the reference's samples-to-target times its predicted rho) and the
    prefixes shorter than that whose noise was measured (`RhoErrors.prefix_sd`), as successive halving would spend
    little on a candidate before running it to the end; and once, the reference again with another seed (`_again`),
    whose worth is what it tells of the reference run's luck. Every option is scored on the same random truths and noise
    draws (common random numbers, `seed`), so their ranking is not the draws' noise."""
    measured = sorted(s.measured)
    barred = _barred(s, cfg)
    setup = pilot_setup(cfg)
    er_now = float(scores(s.T, s.w)[0][pick(s.T, s.w, s.ref, cfg.confidence, measured, cfg.measured_confidence,
                                            barred)])
    out = []
    if cfg.again and s.ref not in s.observed:  # its luck, shared by runs to the target
        x = _again_of(study, s)
        after = regret_after_pilot(s.T, s.w, s.ref, s.ref, own_sd(errors.seed_sd, errors.shared_sd),
                                   np.random.default_rng(seed), confidence=cfg.confidence, measured=measured,
                                   slack=cfg.slack, measured_confidence=cfg.measured_confidence, u=s.u, barred=barred)
        out.append(((er_now - after) / x.responses, replace(x, expected_regret_after=after)))
    for j, P in enumerate(s.sizes):
        o = s.observed.get(j)
        if j == s.ref or (o is not None and not o.prefix) or s.preds[j].fits is False:  # none where it does not fit
            continue
        G = s.preds[j].group
        full = max(int(math.ceil(s.preds[j].rho * study.n_star_ref / (P * G))), 1)
        lengths = [(full, errors.seed_sd, False)]
        if o is None:  # prefixes: at least two evals past the start
            least = 2 * int(study.models.config.get("eval_every") or 1)
            d = math.log2(P * G / study.b_ref)
            cuts = {}  # steps -> the longest measured length that cuts there (lengths short of two evals meet)
            for f in sorted(errors.prefix_f):
                cuts[max(int(math.ceil(f * study.n_star_ref / (P * G))), least)] = f
            lengths += [(steps, errors.prefix_noise(f, d)[1], True) for steps, f in cuts.items() if steps < full]
        for steps, sd, prefix in lengths:
            sd = math.hypot(sd, errors.pilot_sigma_sd)
            after = regret_after_pilot(s.T, s.w, j, s.ref, sd if prefix else own_sd(sd, errors.shared_sd),
                                       np.random.default_rng(seed),
                                       confidence=cfg.confidence, measured=[m for m in measured if m != j],
                                       slack=cfg.slack, measured_confidence=cfg.measured_confidence,
                                       u=None if prefix else s.u,
                                       barred=[b for b in barred if b != j] + ([j] if prefix and not cfg.prefix_moves
                                                                               else []))
            out.append(((er_now - after) / (steps * P * G),
                        Pilot(P, G, steps, steps * P * G, after, _command(study, P, G, steps, setup=setup), prefix)))
    return [p for _, p in sorted(out, key=lambda x: -x[0])]


def _confirm(study: Study, s: Scored, best: int, errors: RhoErrors, cfg: PlanConfig) -> tuple[Pilot, float] | None:
    """(the reference again, the probability that its reading changes the pick) where a move to `best` is read
    against the one reference run through runs to the target and that run's luck, as a second run would read it,
    changes the pick with probability 1 - confidence or more (None otherwise). The preposterior ranks pilots by
    expected regret, which a second run of the reference seldom lowers where the draws put the reference far behind;
    the studies' misses were such moves, whose draws a slow reference had misled (docs/results.md)."""
    full = any(not o.prefix for j, o in s.observed.items() if j != s.ref)
    if best == s.ref or not full or not cfg.again or s.ref in s.observed or not errors.shared_sd > 0:
        return None
    idx, c = picks_after_pilot(s.T, s.w, s.ref, s.ref, own_sd(errors.seed_sd, errors.shared_sd),
                               np.random.default_rng(cfg.seed + 3), confidence=cfg.confidence,
                               measured=sorted(s.measured), slack=cfg.slack,
                               measured_confidence=cfg.measured_confidence, u=s.u, barred=_barred(s, cfg))
    flip = float(np.mean(c != best))
    if flip < 1 - cfg.confidence:
        return None
    x = _again_of(study, s)
    return replace(x, expected_regret_after=float(np.mean(s.T[idx, c] / s.T[idx].min(axis=1) - 1.0))), flip


def _barred(s: Scored, cfg: PlanConfig) -> list[int]:
    """The candidates the pick may not take: those read only by a prefix, unless `cfg.prefix_moves`."""
    return [] if cfg.prefix_moves else sorted(j for j, o in s.observed.items() if o.prefix)


def _feasible(s: Scored) -> tuple[Scored, list[str]]:
    """The draws with every candidate that does not fit in memory a million times slower than the slowest (never
    the best, never picked, never within 5 % of it), and the warnings; the reference ran, so it stays, with a
    warning if the model disagrees."""
    out = [i for i, p in enumerate(s.preds) if p.fits is False and i != s.ref]
    warnings = [f"P={s.sizes[i]} does not fit in memory ({s.preds[i].memory.get('overflow')}): it is never picked"
                for i in out]
    if s.preds[s.ref].fits is False:
        warnings.append("the memory model says the recorded configuration does not fit its devices, yet it ran: its "
                        "memory estimates are off for this setup (docs/simulator.md, Memory)")
    if not out:
        return s, warnings
    T = s.T.copy()
    T[:, out] = 1e6 * float(np.max(T[np.isfinite(T)], initial=1.0))
    return replace(s, T=T), warnings


def _reference_responses(study: Study) -> float:
    """Responses one reference run trained on (its recorded updates)."""
    return float(np.sum(study.models.recorded.num_responses))


def _weighted_quantiles(x: np.ndarray, w: np.ndarray, qs: Sequence[float]) -> list[float]:
    o = np.argsort(x)
    c = np.cumsum(w[o]) / w.sum()
    return [float(x[o][min(int(np.searchsorted(c, q)), len(x) - 1)]) for q in qs]


def _again_of(study: Study, s: Scored) -> Pilot:
    """`_again` at the reference's size, priced with what the draws read of the reference run's luck, E_w[e^u]."""
    luck = float((s.w / s.w.sum()) @ np.exp(s.u)) if s.u is not None else 1.0
    return _again(study, s.sizes[s.ref], s.preds[s.ref].group, luck)


def _again(study: Study, P: int, G: int, luck: float = 1.0) -> Pilot:
    """The reference's configuration run again with the next seed for its recorded updates (another seed may need
    more responses to the target than the first), priced, as a run to the target, at the first's samples-to-target
    times `luck`, what the pilots read of the first run's luck (E[e^u]: below 1 where they read it as slow; expected
    regret after it: nan, for the caller to set)."""
    to_target = max(int(math.ceil(study.n_star_ref * luck / (P * G))), 1)
    steps = max(int(study.models.config.get("steps") or 0), to_target)
    seed = int(study.models.config.get("seed") or 0) + 1
    return Pilot(P, G, steps, to_target * P * G, math.nan,
                 _command(study, P, G, steps, out="reference_2", seed=seed), again=True)


def pilot_setup(cfg: PlanConfig) -> str:
    """rlrun's flags that record a pilot in the setup the plan asks, where rlrun records it (a split as AReaL runs it:
    the pilot then measures its sigma and its rho under that staleness); else none, and the pilot, recorded as the
    reference was, is carried to the asked setup by the simulator (`setup_factor`)."""
    flags, caveat = rlrun_setup(WhatIf(**dict(cfg.fixed)))
    return "" if caveat else flags


def _command(study: Study, P: int, G: int, steps: int, out: str | None = None, seed: int | None = None,
             setup: str = "") -> str:
    """The rlrun record command of a pilot: the reference's configuration at P prompts (an imported reference: its
    framework's run, imported), in the setup `setup` (rlrun's flags; none: the reference's), written to
    `out`.parquet (default pilot_pP), with `seed` where given."""
    out = out or f"pilot_p{P}"
    if study.framework != "rlrun":
        return (f"run {study.framework} as the reference was, at P={P}, G={G}, for {steps} updates"
                f"{'' if seed is None else ' with another seed'}, then rlsim import {study.framework} LOG -o "
                f"{out}.parquet")
    c = study.models.config
    parts = ["rlrun record", f"--algo {c.get('algo') or 'grpo'}", f"--prompts {P}"]
    if (c.get("algo") or "grpo") != "ppo":
        parts.append(f"--group {G}")
    for key, flag in (("task", "--task"), ("lr", "--lr"), ("lr_rule", "--lr-rule"), ("lr_ref_batch", "--lr-ref-batch"),
                      ("max_tokens", "--max-tokens"), ("eval_every", "--eval-every")):
        if c.get(key) is not None:
            parts.append(f"{flag} {c[key]}")
    parts += [setup.strip()] if setup else []
    parts += [f"--steps {steps}"] + ([] if seed is None else [f"--seed {seed}"]) + [f"--out {out}.parquet"]
    return " ".join(parts)
