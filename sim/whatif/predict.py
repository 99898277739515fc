"""What-if: evaluate candidate configurations (`evaluate`) against the reference (the first trace's own
configuration) of a fitted `Study` (rlsim.whatif.study): sigma = q_new / q_ref from the simulator, rho from a
sample-cost model, T_new / T_ref = rho / sigma. `evaluate` is a pure function of (study, cfg): equal inputs give
equal outputs; `run` fits and evaluates in one call.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.core.pipeline import SimRun
from rlsim.modes.registry import MODES, as_recorded, recorded_mode, resolved, simulate, spec_of
from rlsim.replay.io import Trace
from rlsim.replay.rho import RhoModel, regime, staleness_rho
from rlsim.whatif.intervals import decider, forget_ends, outcome_intervals, prefetch_ends
from rlsim.whatif.outcome import Outcome, RunResult
from rlsim.whatif.study import (Study, hardware_label, memory_fields, models_for, prepare, reference_config,
                                resolve_batch, sim_config, simulate_reference)

CONCURRENCY_EXTRAPOLATION = 16.0  # warn beyond this multiple of the measured concurrency


REGIME_BAND = 0.05  # the band of `regime` ("flat" within it)


def _outcome(study: Study, cfg: WhatIf, run_: SimRun, *, reference: bool = False) -> Outcome:
    P, G, rule = resolve_batch(study.reference, study.models, cfg)
    B = P * G
    q = run_.responses_per_s
    ref_cfg = reference_config(study, cfg)
    model: RhoModel | None = None
    if reference:
        sigma, rho, kind, warnings = 1.0, 1.0, "reference", []
    else:
        sigma = q / simulate_reference(study, ref_cfg).responses_per_s
        model, warnings = study.rho_model(B, rule)
        rho, kind = float(model.rho(B, rule)), model.kind  # a model that ignores the lr rule ignores it
        warnings += model.notes(B)
    hw_warnings, notes, gain = _hardware(study, cfg, ref_cfg)
    warnings += hw_warnings + _recorded_mode_warnings(study)
    rho_stale = 1.0
    if run_.split:  # split devices: the model's assumptions, and the staleness limit's effect on sample cost

        rho_stale, stale_notes = staleness_rho(study.curves, study.target, study.b_ref, float(run_.split.staleness))
        rho *= rho_stale
        warnings += stale_notes
        notes += list(run_.notes)
    if run_.approximation:
        notes.append(run_.approximation)
    ratio = rho / sigma
    t_abs = rho * study.n_star_ref / q if math.isfinite(study.n_star_ref) else math.nan
    warnings += _extrapolation_warnings(study, cfg, run_, B, reference)
    mem, mem_warnings, mem_notes = memory_fields(study, cfg)
    warnings += mem_warnings
    notes += mem_notes
    step = run_.mean_step_time
    gen, train, syn, oth = (float(run_.gen_time.mean()), float(run_.train_time.mean()), float(run_.sync_time.mean()),
                            float(run_.other_time.mean()))
    iv = outcome_intervals(study, cfg, run_, q, sigma, rho, ratio, B, kind, reference, model, rho_stale)
    # a candidate may be the reference, its mode named (colocated, sync) or not
    loop = MODES[resolved(cfg)].devices == "colocated"
    own = reference or replace(cfg, prompts=P, group=G, lr_rule=rule, mode=None if loop else cfg.mode) == ref_cfg
    reg = "reference" if own else regime(ratio)
    lo_t, hi_t = iv.get("time_to_target_ratio_lo", math.nan), iv.get("time_to_target_ratio_hi", math.nan)
    if not own and lo_t < 1 < hi_t and not (lo_t >= 1 - REGIME_BAND and hi_t <= 1 + REGIME_BAND):
        reg = "undecided"
        # the same words for every config (its interval is printed beside it): a sweep says them once for all
        warnings.append("the T / T_ref interval spans 1: whether time to target falls or rises is undecided at this "
                        f"confidence; {decider(iv, P, G, study, cfg)}")
    return Outcome(prompts=P, group=G, responses_per_update=B, lr_rule=rule, responses_per_s=q, step_time_s=step,
                   gen_s=gen, train_s=train,
                   sync_s=syn, other_s=oth, idle_s=max(step - gen - train - syn, 0.0), sigma=sigma, rho=rho,
                   rho_model=kind, time_to_target_ratio=ratio, time_to_target_s=t_abs, regime=reg, **iv,
                   updates=int(len(run_.step_time)), gen_steps=float(run_.gen_steps.mean()),
                   peak_running=int(run_.peak_running.max()),
                   preemptions=float(run_.preemptions.mean()), seed=cfg.seed, warnings=tuple(warnings),
                   notes=tuple(notes),
                   hardware=hardware_label(study, cfg), hardware_gain=gain, time_to_target_vs_recorded=ratio / gain,
                   **_split_fields(run_, rho_stale), **mem)


def _hardware(study: Study, cfg: WhatIf, ref_cfg: WhatIf) -> tuple[list[str], list[str], float]:
    """(warnings, notes, gain) of running on the hardware `cfg` asks for: gain is the reference configuration's
    responses/s there over its responses/s as recorded (1 when `cfg` asks for no other hardware)."""
    if cfg.device is None and cfg.gpus is None and not cfg.split:
        return [], [], 1.0
    models, _, notes = models_for(study, ref_cfg)
    warnings = [w for w in models.warnings if w not in study.models.warnings]  # the rescale's own caveat
    recorded = reference_config(study, WhatIf(), updates=ref_cfg.updates, seed=ref_cfg.seed)
    gain = simulate_reference(study, ref_cfg).responses_per_s / simulate_reference(study, recorded).responses_per_s
    as_recorded = ref_cfg.device is None and ref_cfg.gpus is None  # (a split on the recorded devices)
    notes = ([] if as_recorded else [
        f"compared with the reference configuration (P={ref_cfg.prompts}, G={ref_cfg.group}, colocated) on the same "
        f"hardware, {hardware_label(study, ref_cfg)}: it runs {gain:.3g}x the recorded responses/s there, a change of "
        "hardware and not of batch size, which sigma leaves out"]) + list(notes)
    if cfg.split:  # where each side's one-device costs come from
        notes += [n for n in models_for(study, cfg)[2] if n not in notes]
    return warnings, notes, float(gain)


def _recorded_mode_warnings(study: Study) -> list[str]:
    """The caveat of a log recorded in an asynchronous mode: its phase times are fitted as if they ran one after
    the other, as in the colocated loop the reference column simulates."""
    m, _ = recorded_mode(study.recorded_mode)
    spec = spec_of(m)
    if spec is None or spec.devices == "colocated":
        return []
    return [f"the trace was recorded in {m}, whose phases overlap: its logged phase times are fitted as if they ran "
            "one after the other (the reference column runs them colocated), so where the framework overlapped them "
            "the costs are not each phase's own; a log of a colocated (sync) run of the same model measures them"]


def _extrapolation_warnings(study: Study, cfg: WhatIf, run_: SimRun, B: int, reference: bool) -> list[str]:
    """Where the candidate leaves the range the cost models were measured on."""
    out = []
    if not reference and study.models.update.quality.method == "proportional" and not (2 / 3 <= B / study.b_ref <= 1.5):
        out.append("training time is extrapolated in proportion to tokens from one batch size (a fixed per-update "
                   "cost cannot be separated from one trace); pass traces at other batch sizes (--trace) to fit it")
    measured = max(study.models.max_concurrency, 1)
    peak = int(run_.peak_running.max())
    if not reference and peak > CONCURRENCY_EXTRAPOLATION * measured:
        out.append(f"{peak} concurrent sequences is more than {CONCURRENCY_EXTRAPOLATION:g}x the measured {measured}: "
                   "the step-cost model is extrapolated")
    if run_.preemptions.sum() > 0:
        out.append(f"past KV-cache capacity ({run_.peak_kv_tokens.max():.0f} tokens needed of "
                   f"{sim_config(study, cfg).engine.kv_cache_tokens}): {run_.preemptions.mean():.1f} preemptions per "
                   "round, recomputed")
    return out


def _split_fields(run_: SimRun, rho_stale: float) -> dict[str, Any]:
    """The Outcome's device-split fields: measured for a split run; for a colocated one the device waits on
    the generation side while it trains and on the training side while it generates."""
    sp = run_.split
    if not sp:
        total = float(run_.step_time.sum())
        gen = float(run_.gen_time.sum()) / total if total > 0 else math.nan
        return {"mode": "colocated", "execution_mode": "colocated", "gen_idle_ratio": 1.0 - gen,
                "train_idle_ratio": gen}
    if sp.hybrid:
        where = f"{sp.mode} on {sp.train_gpus} devices (hybrid replicas)"
    else:
        where = f"{sp.mode} {sp.gen_gpus} gen : {sp.train_gpus} train"
    mode = (f"{where}, staleness {sp.staleness:g}" + (", partial rollout" if sp.partial_rollout else "")
            + (f", {sp.chunks} fetches per sync" if sp.chunks > 1 else ""))
    return {"mode": mode, "execution_mode": sp.mode, "gen_idle_ratio": run_.gen_idle_ratio,
            "train_idle_ratio": run_.train_idle_ratio,
            "staleness_mean": run_.staleness_mean, "staleness_max": int(run_.staleness_max), "rho_staleness": rho_stale,
            "allreduce_s": float(sp.allreduce_s)}


def evaluate(study: Study, cfg: WhatIf, *, workers: int = 1) -> Outcome:
    """Simulate one candidate and compare it with the reference. Pure and deterministic. `workers` > 1: a long
    split's interval ends are simulated in forked processes beside the point (`prefetch_ends`; the same outcome)."""
    sc = sim_config(study, cfg)
    collect = prefetch_ends(study, cfg, workers)
    try:
        run_ = simulate(models_for(study, cfg)[0], sc, rng=np.random.default_rng(cfg.seed))
    finally:
        collect()
    try:
        return _outcome(study, cfg, run_)
    finally:
        forget_ends()


def reference_outcome(study: Study, updates: int = 100, seed: int = 0, like: WhatIf | None = None) -> Outcome:
    """The reference configuration's own outcome (sigma = rho = 1) for `updates` updates, seed `seed`, on the
    hardware `like` asks for (`reference_config`; None: as recorded)."""
    cfg = reference_config(study, like or WhatIf(), updates=updates, seed=seed)
    return _outcome(study, cfg, simulate_reference(study, cfg), reference=True)


def timeline(study: Study, cfg: WhatIf) -> SimRun:
    """The candidate simulated with its timeline recorded (Gantt charts, Perfetto export)."""
    return simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed),
                    record_timeline=True)


def run(traces: Sequence[Trace], cfg: WhatIf, *, rho_model: str = "auto", target: float | None = None,
        calibration: Sequence[Trace] = (), workers: int = 1) -> RunResult:
    # validated and checked before the fit, in the mode the trace records where cfg names none: one line at once
    cfg, line = as_recorded(cfg, traces[0].config if traces else {})
    study = prepare(traces, rho_model=rho_model, target=target, calibration=calibration)
    cand = evaluate(study, cfg, workers=workers)
    ref = reference_outcome(study, cfg.updates, cfg.seed, like=cfg)
    rec = study.models.recorded
    return RunResult(reference=ref, candidate=cand, rho_model=cand.rho_model, target=study.target,
                     n_star_ref=study.n_star_ref,
                     b_crit=study.noise.b_crit, recorded_time_to_target_s=study.recorded_time_to_target_s,
                     warnings=study.warnings, notes=study.notes,
                     b_crit_critic=study.noise.critic_b_crit, validation=study.models.validation,
                     recorded_responses_per_s=float(np.median(rec.responses_per_s)) if len(rec.step) else math.nan,
                     recorded_step_time_s=float(np.median(rec.step_time)) if len(rec.step) else math.nan,
                     mode_line=line)
