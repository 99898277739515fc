"""The intervals of an Outcome and how they were made: the fits' bootstrap replicates widened by their held-out
error, the far ends of what a log or a datasheet cannot decide (another roof, a split's gain, an unmeasured
device), and, for an undecided verdict, the cheapest run that would decide it (`decider`).
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import replace
from statistics import NormalDist
from typing import Any, Callable

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.core.pipeline import SimRun
from rlsim.modes.registry import resolved, simulate
from rlsim.replay.calibration import REPLICATES
from rlsim.replay.cost import EngineStepCost, StepSums
from rlsim.replay.devices import get_profile, other_roof, per_device, profile_for_hardware
from rlsim.replay.fit_quality import FitCheck
from rlsim.replay.models import INTERVAL, FittedModels, interval
from rlsim.replay.rho import RhoModel
from rlsim.whatif.study import (Study, fit_check, models_for, reference_config, sim_config, simulate_reference,
                                split_gain_of)

# The far end of a split predicted from a colocated GPU run: each side up to this many times the colocated per-device
# speed (the point takes Study.split_gain, study.SPLIT_SHARING_GAIN; the near end none). Published split runs beat
# their colocated runs per device by about this much more than overlap allows (docs/results.md sections 7, 10, 20).
SPLIT_GAIN_HI = 2.0

# A split's interval ends are simulated over at most this many updates (the first updates of the run as long as the
# point's), each read as its ratio to the point's own first as many: the pipeline's fill is in both and cancels
# (docs/results.md sections 19 and 31 measure the difference to full-length ends), and each end costs what that many
# of the point's updates cost, whatever the run's length.
END_UPDATES = 10


def replicate_rates(models: FittedModels, run_: SimRun) -> np.ndarray | None:
    """Responses/s of `run_` under each bootstrap replicate of the engine-step and update models: the run's
    summed features and per-update tokens with the replicate's coefficients in place of the point fit's."""
    reps = models.replicates
    if reps is None or not run_.features:
        return None
    sums = StepSums.from_dict(run_.features)
    eng_point = models.gen.total(sums)
    eng_reps = EngineStepCost.totals(reps.gen, sums)
    tok = np.asarray(run_.tokens, float)
    upd_point = np.maximum(models.update.predict(tok), 0.0).sum()
    upd_reps = np.maximum(reps.update_seconds(tok), 0.0).sum(axis=1)
    total = float(run_.step_time.sum()) - eng_point - upd_point + eng_reps + upd_reps
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, float(run_.responses.sum()) / total, np.nan)


def decider(iv: dict[str, Any], P: int, G: int, study: Study, cfg: WhatIf) -> str:
    """The cheapest measurement that would decide an undecided verdict: whichever of rho and sigma is less sure.
    Throughput at another P on the recorded hardware: `rlrun probe` of both sizes in one process, paired (two
    recordings made apart differ by the machine's drift, as much as the gain in question; docs/results.md
    sections 3, 6 and 10)."""
    def width(key: str) -> float:
        lo, hi = iv.get(key + "_lo", math.nan), iv.get(key + "_hi", math.nan)
        return math.log(hi / lo) if lo > 0 and math.isfinite(hi) and hi >= lo else 0.0

    rho_side = width("rho") >= width("sigma")
    check = fit_check(study)
    if not rho_side and not check.usable:  # no run at another size helps while the recording's own fits are noise
        return ("the throughput decides it, and this recording's cost fits cannot be used: "
                f"{check.fix(study.models.config)}")
    what = "to the target" if rho_side else "for a few updates"
    if study.framework == "rlrun":
        group = ("" if study.algo == "ppo" else f" --group {G}") + (f" --task {study.task}" if study.task else "")
        as_recorded = not cfg.split and cfg.device is None and cfg.gpus is None and cfg.gen_batch is None and \
            cfg.max_num_seqs is None and cfg.kv_cache_tokens is None  # what a probe runs: the recorded setup, P varied
        if not rho_side and as_recorded and G == study.reference.group and P != study.reference.prompts:
            sizes = ",".join(map(str, sorted((study.reference.prompts, P))))
            return (f"the throughput decides it: measure both sizes in one process (rlrun probe --algo {study.algo} "
                    f"--prompts {sizes}{group}), paired, so the machine's drift cancels")
        flags, caveat = rlrun_setup(cfg)
        run = f"rlrun record --algo {study.algo} --prompts {P}{group}{flags} " + ("..." if rho_side else "--steps 5")
        how = f"record a run at this size {what} ({run}){caveat}"
    else:
        how = (f"run {study.framework} at P={P}, G={G} {what} and import its log (rlsim import {study.framework} LOG "
               "-o run.parquet)")
    if rho_side:
        return f"the sample cost decides it: {how}, then add it with --trace"
    return f"the throughput decides it: {how}, which measures it"


def rlrun_setup(cfg: WhatIf) -> tuple[str, str]:
    """(rlrun's flags for the setup a what-if asks, a caveat after the command): rlrun records the colocated loop and
    AReaL's split, so another split mode gets no flags and a caveat naming it."""
    if not cfg.split:
        return "", ""
    if resolved(cfg) != "split":
        return "", f", though rlrun records the colocated loop and --mode split, not {resolved(cfg)}"
    if (cfg.staleness or 0) != int(cfg.staleness or 0):
        return "", f", though rlrun records a whole number of versions of staleness, not {cfg.staleness:g}"
    return (f" --mode split --gen-gpus {cfg.gen_gpus} --train-gpus {cfg.train_gpus} --staleness {cfg.staleness or 0:g}"
            + (" --partial-rollout" if cfg.partial_rollout else "")), ""


def outcome_intervals(study: Study, cfg: WhatIf, run_: SimRun, q: float, sigma: float, rho: float, ratio: float, B: int,
               kind: str, reference: bool, model: RhoModel | None = None, rho_stale: float = 1.0) -> dict[str, Any]:
    """The `_lo` / `_hi` fields of an Outcome and how they were made (empty when nothing is uncertain or
    nothing resamples). Throughput: the bootstrap replicates of the fits on the hardware `cfg` runs on (none for
    split runs: `_split_side_ends`), widened by the fits' held-out error (`rlsim.replay.fit_quality`: at least its
    bound where the fits cannot be used, and then the responses/s too). Sample cost: B_crit replicates (noise
    scale), or the bounds of an unmeasured rho."""
    reps = study.models.replicates
    level = reps.level if reps is not None else INTERVAL
    out: dict[str, Any] = {}
    methods: list[str] = []
    check = fit_check(study)
    q_reps, ref_reps, how = _throughput_replicates(study, cfg, run_, reference, check)
    sig_reps = None
    if q_reps is not None:
        rng = np.random.default_rng(cfg.seed)
        sig_reps = np.ones(len(q_reps)) if reference or ref_reps is None else q_reps / ref_reps
        if not check.usable:  # the throughput itself is not known: the fits' error on it, in full
            q_reps = q_reps * np.exp(np.random.default_rng(cfg.seed + 1).normal(0.0, held_out_error(check, run_),
                                                                                len(q_reps)))
        out["responses_per_s_lo"], out["responses_per_s_hi"] = interval(q, q_reps, level)
        # in full an octave or more from the reference's batch (its levels are then others than the reference's), less
        # nearer: the same batch shares the reference's levels and their errors cancel in sigma
        held_out = 0.0 if reference else held_out_error(check, run_) * min(1.0, abs(math.log2(B / study.b_ref)))
        if held_out > 0:  # the fits' error on levels they did not see, beyond the replicates' spread
            sig_reps = sig_reps * np.exp(rng.normal(0.0, held_out, len(sig_reps)))
        out["sigma_lo"], out["sigma_hi"] = (1.0, 1.0) if reference else interval(sigma, sig_reps, level)
        methods.append(how + (f", widened by the fits' held-out error ({100 * held_out:.1f} % RMS"
                              f"{'' if check.usable else ', at least the bound of fits that cannot be used'})"
                              if held_out > 0 else ""))
    ends = _other_ends(study, cfg, reference, q, run_) + _split_side_ends(study, cfg, reference, q, run_)
    widened = False  # whether an end lies beyond the sigma interval of the replicates
    for q_end, s_end, how in ends:  # what the evidence cannot decide: the other end widens the interval (or makes one)
        out["responses_per_s_lo"] = min(out.get("responses_per_s_lo", q), q_end)
        out["responses_per_s_hi"] = max(out.get("responses_per_s_hi", q), q_end)
        if not reference:
            widened |= not out.get("sigma_lo", sigma) <= s_end <= out.get("sigma_hi", sigma)
            out["sigma_lo"], out["sigma_hi"] = (min(out.get("sigma_lo", sigma), s_end),
                                                max(out.get("sigma_hi", sigma), s_end))
        methods.append(how)
    if reference:
        rho_reps, bounds, rho_note = None, None, "rho = 1"
    else:
        rho_reps, rho_note = study.rho_replicates(B, kind)
        bounds = model.bounds(B) if model is not None else None
    if bounds is not None:  # rho not measured here: its bounds, against the sigma interval's far ends
        out["rho_lo"], out["rho_hi"] = bounds[0] * rho_stale, bounds[1] * rho_stale
        s_lo, s_hi = out.get("sigma_lo", sigma), out.get("sigma_hi", sigma)
        out["time_to_target_ratio_lo"], out["time_to_target_ratio_hi"] = out["rho_lo"] / s_hi, out["rho_hi"] / s_lo
        methods.append(f"rho bounded {out['rho_lo']:.3g}..{out['rho_hi']:.3g} where it is not measured")
    elif rho_reps is not None or sig_reps is not None:
        rr = rho_reps * rho_stale if rho_reps is not None else np.full(len(sig_reps), rho)
        ss = sig_reps if sig_reps is not None else np.full(len(rr), sigma)
        m = min(len(rr), len(ss))
        out["rho_lo"], out["rho_hi"] = interval(rho, rr, level) if rho_reps is not None else (rho, rho)
        out["time_to_target_ratio_lo"], out["time_to_target_ratio_hi"] = (
            (1.0, 1.0) if reference else interval(ratio, rr[:m] / ss[:m], level))
        methods.append(rho_note)
    if ends and not reference and (widened or "time_to_target_ratio_lo" not in out):  # T / T_ref across the ends too
        out["time_to_target_ratio_lo"] = min(out.get("time_to_target_ratio_lo", ratio),
                                             out.get("rho_lo", rho) / out["sigma_hi"])
        out["time_to_target_ratio_hi"] = max(out.get("time_to_target_ratio_hi", ratio),
                                             out.get("rho_hi", rho) / out["sigma_lo"])
    if methods:
        out["interval"] = "; ".join(methods)
    return out


@functools.lru_cache(maxsize=8)
def _alt_study(study: Study) -> Study:
    """The study with its models at the other end of what the trace cannot identify (`FittedModels.alternative`)."""
    return replace(study, models=study.models.alternative)


def _rate(study: Study, cfg: WhatIf, reference: bool, point: Study | None = None, q_point: float = math.nan,
          point_run: SimRun | None = None) -> tuple[float, float]:
    """(responses/s, sigma) of `cfg` simulated on `study` (the reference configuration when `reference`). A split
    longer than END_UPDATES with its `point` study and responses/s given: q_point times the ratio of the two studies'
    rates over the run's first END_UPDATES updates (the point's read off `point_run`, its simulated run, if given)."""
    if reference:
        return simulate_reference(study, cfg).responses_per_s, 1.0
    if point is not None and cfg.split and cfg.updates > END_UPDATES and math.isfinite(q_point):
        q = q_point * _simulated_rate(study, cfg, END_UPDATES) / _head_rate(point, cfg, point_run)
    else:
        q = _simulated_rate(study, cfg)
    return q, q / simulate_reference(study, reference_config(study, cfg)).responses_per_s


def _head_rate(point: Study, cfg: WhatIf, run_: SimRun | None) -> float:
    """Responses/s of the point's first END_UPDATES updates: off its simulated run where that run simulated them
    (a run that stops once steady simulates more, and its first updates are the head's), else simulated."""
    if run_ is None or run_.rounds_simulated < END_UPDATES:
        return _simulated_rate(point, cfg, END_UPDATES)
    return float(run_.responses[:END_UPDATES].sum() / run_.step_time[:END_UPDATES].sum())


def _simulated_rate(study: Study, cfg: WhatIf, head: int | None = None) -> float:
    """Responses/s of `cfg` simulated on `study` (its first `head` updates alone, if given): as `prefetch_ends` left
    it, else simulated (and cached)."""
    key = (study, cfg, head)
    return _PRIMED[key] if key in _PRIMED else _simulate_rate(*key)


@functools.lru_cache(maxsize=16)
def _simulate_rate(study: Study, cfg: WhatIf, head: int | None = None) -> float:
    """(cached: Study is eq=False, so keyed by the object)"""
    run_ = simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed), head=head)
    return run_.responses_per_s


# rates simulated ahead in worker processes (`prefetch_ends`), keyed as `_simulated_rate`'s arguments
_PRIMED: dict[tuple[Study, WhatIf, int | None], float] = {}
_JOBS: list[tuple[Study, WhatIf, int | None]] = []  # what the forked workers simulate, inherited at the fork


def _job_rate(i: int) -> float:
    return _simulate_rate(*_JOBS[i])


def prefetch_ends(study: Study, cfg: WhatIf, workers: int) -> Callable[[], None]:
    """Start the short simulations of a long split's model ends (`_end_studies`, `_rate`) in up to `workers`
    forked processes while this one simulates the point; the returned call waits for them and leaves their rates
    where `_simulated_rate` finds them (until `forget_ends`). They depend on nothing the point computes, so the
    results equal the serial ones. Nothing starts with one worker, off Linux, or outside the main process (a sweep's
    workers already use the cores)."""
    ends = [s for s, _ in _end_studies(study, cfg)] if cfg.split and cfg.updates > END_UPDATES else []
    if workers < 2 or not ends or not sys.platform.startswith("linux"):  # fork is safe on Linux (not macOS's runtimes)
        return lambda: None
    # (why here: only a long split's ends need them; their import is the main command's time)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if mp.parent_process() is not None:
        return lambda: None
    _JOBS[:] = [(s, cfg, END_UPDATES) for s in ends]
    # the point runs here meanwhile, then waits; a worker that dies (out of memory) fails its future, not the wait
    pool = ProcessPoolExecutor(min(workers, len(_JOBS)), mp_context=mp.get_context("fork"))
    pending = [pool.submit(_job_rate, i) for i in range(len(_JOBS))]

    def collect() -> None:
        try:
            _PRIMED.update(zip(_JOBS, [f.result() for f in pending]))
        except Exception:  # noqa: BLE001  (a failed job is simulated again here, where its error is reported)
            pass
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            _JOBS.clear()
    return collect


def forget_ends() -> None:
    """Drop the rates `prefetch_ends` left (they hold their studies)."""
    _PRIMED.clear()


def _end_studies(study: Study, cfg: WhatIf) -> list[tuple[Study, str]]:
    """(study, how) at the far ends of the terms no log identifies, each simulated as the point's `cfg`: the trace's
    unidentified terms (`FittedModels.alternative`) and a split's device-sharing gain."""
    out = []
    m = study.models
    if m.alternative is not None:
        what = (f"the per-step generation cost {m.gen.c_step * 1e3:.3g}..{m.alternative.gen.c_step * 1e3:.3g} ms"
                if m.alternative.update is m.update else "generation's share of the logged step")
        out.append((_alt_study(study), f"both ends of what the trace cannot identify ({what})"))
    if cfg.split and split_gain_of(study, cfg) != 1.0:
        for g in sorted({1.0, max(SPLIT_GAIN_HI, study.split_gain)} - {study.split_gain}):  # the point is no end
            out.append((_gain_study(study, g),
                        f"the colocated run's device-sharing costs: each split side {study.split_gain:g}x the recorded "
                        f"speed per device, 1x..{max(SPLIT_GAIN_HI, study.split_gain):g}x at the ends"))
    return out


def _other_ends(study: Study, cfg: WhatIf, reference: bool, q: float = math.nan,
                point_run: SimRun | None = None) -> list[tuple[float, float, str]]:
    """(responses/s, sigma, how) at the far ends of what the evidence cannot decide: the trace's unidentified terms
    and a split's gain (`_end_studies`), and for another device, its datasheet gain against none (frameworks reach a
    different share of peak on new hardware, which no datasheet states)."""
    out = [(*_rate(end, cfg, reference, study, q, point_run), how) for end, how in _end_studies(study, cfg)]
    if cfg.device is not None and other_device(study, cfg.device):
        out.append((*_rate(study, replace(cfg, device=None), reference),
                    f"{cfg.device}'s datasheet gain at one end, the recorded device's own speed at the other"))
    roof = _other_roof_study(study, cfg.device) if cfg.device is not None and not cfg.split else None
    if roof is not None:
        out.append((*_rate(roof[0], cfg, reference),
                    f"per-token compute on {cfg.device} at its bandwidth gain at the other end, {roof[1]:.3g}x below "
                    "its FLOP/s gain (which of the datasheet's two roofs a term reaches on a new device, none states)"))
    return out


def split_side_spreads(study: Study) -> tuple[float, float]:
    """(engine, training) relative error of a split side's one-device costs: the fits' held-out error on levels they
    did not see (a side's operating point is not the recording's)."""
    check = fit_check(study)
    return check.spread("engine-step"), check.spread("training")


def _split_side_ends(study: Study, cfg: WhatIf, reference: bool, q: float = math.nan,
                     point_run: SimRun | None = None) -> list[tuple[float, float, str]]:
    """A split measured one device at a time (a CPU recording's calibration) has no bootstrap of its rate (its sides
    wait on each other): both sides at the near and the far end of their costs' error instead, each end simulated.
    The rate is about the slower side's, so moving both together spans it without the corners' overstatement."""
    if not cfg.split or reference or cfg.device is not None or study.device_models is None:
        return []
    sg, st = split_side_spreads(study)
    if sg <= 0 and st <= 0:
        return []
    z = NormalDist().inv_cdf(0.5 + INTERVAL / 2)
    out = []
    for sign in (-1.0, 1.0):
        dm = study.device_models
        moved = per_device(dm, math.exp(sign * z * sg), math.exp(sign * z * st), dm.config["one_device"]["note"])
        out.append((*_rate(replace(study, device_models=replace(moved, config=dm.config)), cfg, False, study, q,
                           point_run),
                    f"each side's one-device costs at the {'near' if sign < 0 else 'far'} end of their error (engine "
                    f"steps +-{100 * sg:.0f} %, training +-{100 * st:.0f} % RMS: the fits' held-out error)"))
    return out


@functools.lru_cache(maxsize=8)
def _other_roof_study(study: Study, device: str) -> tuple[Study, float] | None:
    """The study at the other roof of the move to `device` (`rlsim.replay.devices.other_roof`) and its factor, or
    None."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    end = other_roof(study.models, device, source_profile=hw or None)
    return None if end is None else (replace(study, models=end[0]), end[1])


@functools.lru_cache(maxsize=8)
def _gain_study(study: Study, gain: float) -> Study:
    """The study with each split side `gain` times the recorded speed per device (Study.split_gain)."""
    return replace(study, split_gain=gain)


def other_device(study: Study, device: str) -> bool:
    """Whether `device` is another GPU than the GPU the trace was recorded on (a CPU trace moved to a GPU has its
    own warnings: its recorded speed is no end of anything)."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    rec, dst = profile_for_hardware(hw), get_profile(device)
    recorded_gpu = rec.kind == "gpu" if rec is not None else str(hw.get("device") or "").lower() not in ("cpu", "")
    return recorded_gpu and dst.kind == "gpu" and (rec is None or dst.key != rec.key)


def held_out_error(check: FitCheck, run_: SimRun) -> float:
    """The relative error of a candidate's step costs where the fits have not seen it: the leave-one-level-out RMS
    of the engine-step and the training fits (each level predicted from the others; `FitCheck.spread`: at least the
    rule's bound for a fit that cannot be used), weighted by the candidate's generation and training shares of its
    step. Measured (docs/results.md section 6): the bootstrap over levels alone gave sigma intervals that held a
    paired measurement in 0 of 10 cases."""
    gen, train = float(np.sum(run_.gen_time)), float(np.sum(run_.train_time))
    cv_g, cv_t = check.spread("engine-step"), check.spread("training")
    tot = gen + train
    return float(math.sqrt((gen * cv_g ** 2 + train * cv_t ** 2) / tot)) if tot > 0 else 0.0


def _throughput_replicates(study: Study, cfg: WhatIf, run_: SimRun, reference: bool,
                           check: FitCheck) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(responses/s of `run_` under each bootstrap replicate of the fits on the hardware `cfg` asks for, the same of
    the reference configuration there (None for the reference itself), what was resampled). A split run: None (its
    sides wait on each other; the replicates' summed costs do not give its rate). No replicates: None, unless the
    fits cannot be used, then the point rate alone for the held-out error to spread."""
    reps = study.models.replicates
    models = models_for(study, cfg)[0]
    q_reps = None if cfg.split or reps is None else replicate_rates(models, run_)
    if q_reps is None:
        if cfg.split or check.usable:
            return None, None, ""
        return np.full(REPLICATES, run_.responses_per_s), None, "no bootstrap (too few levels or updates)"
    ref_reps = None if reference else replicate_rates(models, simulate_reference(study, reference_config(study, cfg)))
    return q_reps, ref_reps, reps.method
