"""`rlsim plan`: which batch size to run, or which pilot runs would decide it most cheaply.

The time to target of candidate i relative to the reference is T_i = rho_i / sigma_i. sigma comes from the
simulator; rho from a sample-cost model that, from one reference trace, is known to err a lot (docs/results.md).
So the plan's uncertainty about rho is *measured*: error curves e(d) = log(rho measured / rho predicted from a
reference alone) at d = log2(B / B_ref), one per reference seed of the recorded batch-size studies
(`rlsim.replay.rho_errors`); a draw of the truth is one such curve plus the studies' seed noise. Its uncertainty
about sigma is each candidate's sigma interval as `rlsim run` gives it, read as a log-normal spread. A trace whose
cost fits cannot be used (`rlsim.replay.fit_quality`) gets no move: the plan names the recording that would fix it.

Over the draws (weights w), for each candidate i: expected regret E_w[T_i / min_j T_j - 1] and p_within_5pct
P_w[T_i <= 1.05 min_j T_j]. The pick is the least expected regret (ties: the reference), a **decision** when
p_within_5pct reaches `PlanConfig.confidence`; otherwise the plan lists **pilots** (a run at candidate j to the
target), ranked by the regret they are expected to remove (preposterior) per response spent. A pilot trace given
back (`--trace`) reweights the draws. The method in full: docs/usage.md, "Planning".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.modes.registry import check as check_mode
from rlsim.replay.errors import RlsimError, name
from rlsim.replay.evaluation import samples_to_target
from rlsim.replay.io import Trace
from rlsim.replay.learning import fit_learning_curve, noise_scale
from rlsim.replay.models import INTERVAL
from rlsim.replay.util import json_safe
from rlsim.replay.rho_errors import RhoErrors, measured_errors
from rlsim.whatif.outcome import Outcome
from rlsim.whatif.predict import evaluate, reference_outcome
from rlsim.whatif.study import Study, fit_check, prepare

WITHIN = 0.05  # "within 5 % of the best"


@dataclass(frozen=True)
class PlanConfig:
    """What `rlsim plan` is asked."""

    prompts: tuple[int, ...] = field(metadata={"help": "candidate P (prompts per update), two or more; the reference's "
                                                       "is added"})
    group: int | None = field(default=None, metadata={"help": "G of every candidate (None: the reference's)"})
    budget: float | None = field(default=None,
                                 metadata={"help": "responses the pilots may spend in all (None: one reference run's)"})
    confidence: float = field(default=0.8, metadata={"help": "p_within_5pct at which the pick is a decision"})
    draws: int = field(default=4000,
                       metadata={"help": "draws of the truth (error curves plus the studies' seed noise)"})
    seed: int = field(default=0, metadata={"help": "seed of the draws"})
    updates: int = field(default=40, metadata={"help": "updates simulated per candidate for sigma"})
    model_params: float | None = field(default=None, metadata={
        "help": "the model's parameter count, e.g. 7e9, for the candidates' memory when the trace names a model rlsim "
                "cannot size (None: the trace's model; WhatIf.model_params)"})
    fixed: tuple = field(default=(), metadata={
        "help": "((WhatIf field, value), ...) every candidate shares: the execution mode, its settings and devices "
                "(e.g. (('mode', 'fully_async'),))"})

    def validate(self) -> None:
        ps = list(self.prompts)
        if len(ps) < 2:
            raise RlsimError("rlsim plan needs two or more candidate sizes, e.g. --prompts 16,32,64,128")
        if any(not isinstance(p, int) or isinstance(p, bool) or p <= 0 for p in ps):
            raise RlsimError(f"{name('prompts')} sizes must be positive integers, got {ps}")
        if len(set(ps)) != len(ps):
            raise RlsimError(f"{name('prompts')} lists a size twice ({ps}); give each candidate once")
        if self.fixed:
            cfg = WhatIf(**dict(self.fixed))
            cfg.validate()
            check_mode(cfg)
        if self.budget is not None and not self.budget > 0:
            raise RlsimError(f"--budget must be a positive number of responses, got {self.budget}")
        if not 0.5 <= self.confidence < 1:
            raise RlsimError(f"--confidence must be in [0.5, 1), got {self.confidence}")
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
    fits: bool | None = field(default=None, metadata={
        "help": "fits its devices' memory (None: unknown); one that does not is never picked nor piloted"})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Pilot:
    """One pilot run worth making: a run at a candidate size to the target."""

    prompts: int = field(metadata={"help": "P"})
    group: int = field(metadata={"help": "G"})
    steps: int = field(metadata={"help": "updates: enough to reach the target at the 90 % quantile of its rho"})
    responses: int = field(metadata={"help": "responses it trains on (steps x P x G)"})
    expected_regret_after: float = field(metadata={"help": "expected regret of the pick once it is measured"})
    command: str = field(metadata={"help": "the rlrun record command line"})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


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
    notes: tuple[str, ...] = field(default=(), metadata={"help": "how the plan was made"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "what may be wrong"})
    no_move: str = field(default="", metadata={
        "help": "why the plan makes no move, neither a decision nor a pilot (the trace's cost fits cannot be used, "
                "rlsim.replay.fit_quality), and the recording that would fix it; '' when it makes one"})

    def to_dict(self) -> dict:
        out = {"reference_prompts": self.reference_prompts, "expected_regret": self.expected_regret,
               "candidates": [c.to_dict() for c in self.candidates], "notes": list(self.notes),
               "warnings": list(self.warnings)}
        if self.no_move:
            out["no_move"] = self.no_move
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


def pilot_weights(draw_e: np.ndarray, observed: float, sd: float) -> np.ndarray:
    """(draws,) likelihood of a pilot's observed log-rho error under each draw's error at its size (one seed's
    noise)."""
    return np.exp(-0.5 * ((draw_e - observed) / sd) ** 2)


def scores(T: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(expected regret (n,), p_within_5pct (n,)) of each candidate over draws T (K, n) with weights w (K,)."""
    best = T.min(axis=1, keepdims=True)
    p = w / w.sum()
    return p @ (T / best - 1.0), p @ (T <= (1 + WITHIN) * best).astype(float)


def pick(T: np.ndarray, w: np.ndarray, ref: int, confidence: float = 0.8) -> int:
    """The candidate of least expected regret, if it beats the reference with probability `confidence`; else the
    reference (a measured run), since the draws come from other tasks' errors and may not cover this one's."""
    er, _ = scores(T, w)
    i = int(np.argmin(er))
    beats = float((w / w.sum()) @ (T[:, i] < T[:, ref]))
    return i if i != ref and beats >= confidence else ref


def regret_after_pilot(T: np.ndarray, e: np.ndarray, w: np.ndarray, j: int, ref: int, sd: float,
                       rng: np.random.Generator, truths: int = 400, confidence: float = 0.8) -> float:
    """Expected regret of the pick once candidate j is measured (preposterior over `truths` draws taken as the truth):
    T (K, n) draws of T, e (K, n) their rho errors, w (K,) the current weights, sd a pilot's noise in log rho."""
    idx = rng.choice(len(w), size=min(truths, len(w)), p=w / w.sum())
    out = np.empty(len(idx))
    for m, t in enumerate(idx):
        w2 = w * pilot_weights(e[:, j], e[t, j] + rng.standard_normal() * sd, sd)
        c = pick(T, w2 if w2.sum() > 0 else w, ref, confidence)
        out[m] = T[t, c] / T[t].min() - 1.0
    return float(out.mean())


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


def score(study: Study, cfg: PlanConfig, pilots: Sequence[Trace], errors: RhoErrors, rng: np.random.Generator,
          model_name: str | None = None, bounds_ok: bool = False) -> Scored:
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
    w, measured = np.ones(cfg.draws), {ref}
    for tr in pilots:
        j, obs = pilot_observation(study, tr, sizes, G, [p.rho for p in preds], model_name, bounds_ok)
        w = w * pilot_weights(e[:, j], obs, errors.seed_sd)
        measured.add(j)
        notes.append(f"pilot {tr.name}: P={sizes[j]}, log rho {obs:+.3f} from the prediction (one seed)")
    if not w.sum() > 0:
        raise RlsimError("the pilots' measurements lie outside every recorded error curve; check that they come from "
                         "the same task, model and lr rule as the reference")
    return Scored(sizes, ref, preds, np.exp(T_log), e, w, measured, notes, warnings)


def plan(reference: Trace, cfg: PlanConfig, *, pilots: Sequence[Trace] = (),
         errors: Mapping[str, RhoErrors] | None = None, target: float | None = None, bounds_ok: bool = False) -> Plan:
    """Candidates scored over the measured uncertainty, then a decision or the pilots worth running (module doc).
    `errors`: measured error curves by rho model (default: `rlsim.replay.rho_errors`); `bounds_ok`: a pilot that never
    reached the target counts at its budget (a lower bound) instead of being refused."""
    cfg.validate()
    _once(reference, pilots)
    study = prepare([reference], rho_model="noise-scale" if _has_noise_scale(reference) else "invariant", target=target)
    errors = (errors or {}).get(study.rho_requested) or measured_errors(study.rho_requested)
    G = cfg.group or study.reference.group
    if cfg.budget is not None and cfg.budget < min(cfg.prompts) * G:
        raise RlsimError(f"--budget {cfg.budget:g} responses is below one update of the smallest candidate "
                         f"({min(cfg.prompts)} x {G} = {min(cfg.prompts) * G}); give at least that")
    if not np.isfinite(study.n_star_ref):
        raise RlsimError(f"{reference.name} never reaches its target, so no samples-to-target to plan from; pass a "
                         "lower --target")
    s = score(study, cfg, pilots, errors, np.random.default_rng(cfg.seed),
              (reference.meta.get("model") or {}).get("name"), bounds_ok)
    s, fit_warnings = _feasible(s)
    er, p5 = scores(s.T, s.w)
    er[[i for i, p in enumerate(s.preds) if p.fits is False and i != s.ref]] = np.inf  # shown as "does not fit"
    beats = (s.w / s.w.sum()) @ (s.T < s.T[:, [s.ref]])
    cands = tuple(Candidate(prompts=P, group=p.group, sigma=p.sigma, rho=p.rho,
                            time_to_target_ratio=p.time_to_target_ratio,
                            time_to_target_ratio_lo=lo, time_to_target_ratio_hi=hi, p_within_5pct=float(p5[i]),
                            expected_regret=float(er[i]), p_beats_reference=float(beats[i]), measured=i in s.measured,
                            fits=p.fits)
                  for i, (P, p) in enumerate(zip(s.sizes, s.preds))
                  for lo, hi in [_weighted_quantiles(s.T[:, i], s.w, (0.05, 0.95))])
    best = pick(s.T, s.w, s.ref, cfg.confidence)
    d = np.log2(np.array(s.sizes, float) * cands[0].group / study.b_ref)
    warnings = [w for w in [errors.span_note(d)] if w] + s.warnings + fit_warnings
    decided = Plan(cands, cands[best], (), float(er[best]), study.reference.prompts, tuple(s.notes), tuple(warnings))
    unusable = fit_check(study).warning(reference.name, reference.config)
    if unusable:  # the fits say nothing of sigma: no decision and no pilot rests on them, nor a regret
        blank = tuple(replace(c, p_within_5pct=math.nan, expected_regret=math.nan, p_beats_reference=math.nan)
                      for c in cands)
        return replace(decided, candidates=blank, decision=None, expected_regret=math.nan,
                       warnings=(unusable, *warnings),
                       no_move=unusable)
    if p5[best] >= cfg.confidence:
        return decided
    budget = cfg.budget if cfg.budget is not None else _reference_responses(study)
    options = _pilots(study, s, errors.seed_sd, np.random.default_rng(cfg.seed + 1), cfg.confidence)
    useful = [p for p in options if p.responses <= budget and p.expected_regret_after < er[best] - 0.005]
    if useful:
        return replace(decided, decision=None, pilots=tuple(useful))
    warnings.append(_undecided(cands, best, s.ref, cfg.confidence, budget, options))
    return replace(decided, warnings=tuple(warnings))


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


def _undecided(cands: Sequence[Candidate], best: int, ref: int, confidence: float, budget: float,
               options: Sequence[Pilot]) -> str:
    """Why the pick is not a confident decision, and what would make one."""
    c = cands[best]
    out = f"undecided: P={c.prompts} is within 5 % of the best with probability {c.p_within_5pct:.2f}"
    if best == ref:
        other = min((x for i, x in enumerate(cands) if i != ref), key=lambda x: x.expected_regret)
        out += (f"; no candidate beats the reference with probability {confidence:.2f} (the least expected regret, P="
                f"{other.prompts}, beats it with {other.p_beats_reference:.2f}), and the predictions' errors, measured "
                "on other tasks, can go either way, so the measured configuration is kept")
    cheap = min(options, key=lambda p: p.responses, default=None)
    if cheap is not None and cheap.responses > budget:
        out += (f"; no pilot fits the budget of {budget:.0f} responses (the cheapest, P={cheap.prompts} to the target, "
                f"takes about {cheap.responses}: allow it with --budget {cheap.responses})")
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


def pilot_observation(study: Study, tr: Trace, sizes: list[int], G: int, rho_pred: Sequence[float],
                      model_name: str | None, bounds_ok: bool = False) -> tuple[int, float]:
    """(candidate index, observed log(rho / rho predicted)) of a pilot trace: its samples-to-target over the
    reference's."""
    c = tr.config
    for key in ("algo", "task", "lr_rule"):
        if str(c.get(key)) != str(study.models.config.get(key)):
            raise RlsimError(f"pilot {tr.name} has {key} {c.get(key)!r}, the reference "
                             f"{study.models.config.get(key)!r}: a pilot must be the reference's run at another size")
    if model_name is not None and (tr.meta.get("model") or {}).get("name") != model_name:
        raise RlsimError(f"pilot {tr.name} trains another model than the reference; record it with the reference's "
                         "--model")
    P, g = int(c.get("prompts") or 0), int(c.get("group") or 1)
    if P not in sizes or g != G:
        raise RlsimError(f"pilot {tr.name} is P={P}, G={g}, not one of the candidates (P in {sizes}, G={G}); "
                         "pass the candidates it was recorded for")
    curve = fit_learning_curve(tr)
    if not len(curve.score):
        raise RlsimError(f"pilot {tr.name} has no eval rows, so it cannot measure samples-to-target; record it with "
                         "evals (rlrun record --eval-every N)")
    reached = samples_to_target(curve, study.target)
    if reached.censored and not bounds_ok:
        raise RlsimError(f"pilot {tr.name} never reached the target {study.target:.4g} (trained {reached.n:.0f} "
                         "responses): run it longer (more --steps) so that it measures its samples-to-target")
    j = sizes.index(P)
    return j, float(math.log(reached.n / study.n_star_ref) - math.log(rho_pred[j]))


def _pilots(study: Study, s: Scored, sd: float, rng: np.random.Generator, confidence: float) -> list[Pilot]:
    """Each unmeasured candidate's pilot, by expected regret removed per response, best first."""
    er_now = float(scores(s.T, s.w)[0][pick(s.T, s.w, s.ref, confidence)])
    out = []
    for j, P in enumerate(s.sizes):
        if j in s.measured or s.preds[j].fits is False:  # no pilot at a size that does not fit
            continue
        G = s.preds[j].group
        rho_hi = s.preds[j].rho * _weighted_quantiles(np.exp(s.e[:, j]), s.w, (0.9,))[0]
        steps = max(int(math.ceil(1.2 * rho_hi * study.n_star_ref / (P * G))), 1)
        after = regret_after_pilot(s.T, s.e, s.w, j, s.ref, sd, rng, confidence=confidence)
        out.append(((er_now - after) / (steps * P * G),
                    Pilot(P, G, steps, steps * P * G, after, _command(study, P, G, steps))))
    return [p for _, p in sorted(out, key=lambda x: -x[0])]


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


def _command(study: Study, P: int, G: int, steps: int) -> str:
    """The rlrun record command of a pilot: the reference's configuration at P prompts (an imported reference: its
    framework's run, imported)."""
    if study.framework != "rlrun":
        return (f"run {study.framework} as the reference was, at P={P}, G={G}, for {steps} updates, then "
                f"rlsim import {study.framework} LOG -o pilot_p{P}.parquet")
    c = study.models.config
    parts = ["rlrun record", f"--algo {c.get('algo') or 'grpo'}", f"--prompts {P}"]
    if (c.get("algo") or "grpo") != "ppo":
        parts.append(f"--group {G}")
    for key, flag in (("task", "--task"), ("lr", "--lr"), ("lr_rule", "--lr-rule"), ("lr_ref_batch", "--lr-ref-batch"),
                      ("max_tokens", "--max-tokens"), ("eval_every", "--eval-every")):
        if c.get(key) is not None:
            parts.append(f"{flag} {c[key]}")
    parts += [f"--steps {steps}", f"--out pilot_p{P}.parquet"]
    return " ".join(parts)
