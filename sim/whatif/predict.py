"""What-if: fit once (`prepare`), then evaluate candidate configurations (`evaluate`) against the
reference (the first trace's own configuration): sigma = q_new / q_ref from the simulator, rho from a
sample-cost model, T_new / T_ref = rho / sigma.

`Study` holds what was fitted and nothing else; it is frozen and picklable: sweeps ship it to
process-pool or Ray workers once. The reference configuration is simulated with each candidate's
`updates` and `seed` (so sigma compares like with like) and memoised per (study, updates, seed) in the
process that evaluates. `evaluate` is a pure function of (study, cfg): equal inputs give equal outputs.
"""
from __future__ import annotations

import functools
import math
from numbers import Real
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from rlsim.replay.cost import EngineStepCost, StepSums
from rlsim.replay.device_speed import device_ratios
from rlsim.replay.calibration import REPLICATES
from rlsim.replay.devices import (get_profile, host_name, other_roof, per_device, profile_for_hardware,
                                  recorded_profile, rescale)
from rlsim.replay.errors import RlsimError, name, setting
from rlsim.replay.fit import fit_trace
from rlsim.replay.fit_quality import FitCheck, check_fits
from rlsim.replay.io import Trace
from rlsim.replay.learning import LearningCurve, NoiseScale, b_noise_replicates, fit_learning_curve, lr_scale, noise_scale
from rlsim.replay.models import INTERVAL, FittedModels, interval
from rlsim.replay.rho import (RhoModel, curves_rho, fit_lr_aware, invariant_rho, lr_aware_rho, noise_scale_ratio,
                              noise_scale_rho, parse_rho, regime, staleness_rho)
from rlsim.replay.schema import EVAL, placement
from rlsim.modes.split import data_parallel, split_config
from rlsim.core.config import EngineConfig, SimConfig, WhatIf
from rlsim.whatif.memory import Load, TraceMemory, candidate_memory, memory_object, memory_warning, trace_memory
from rlsim.whatif.outcome import Outcome, RunResult
from rlsim.core.pipeline import SimRun
from rlsim.whatif.simconfig import config_for, engine_of, gen_ratio
from rlsim.modes.registry import simulate

CONCURRENCY_EXTRAPOLATION = 16.0  # warn beyond this multiple of the measured concurrency
# The far end of a split predicted from a colocated GPU run: each side up to this many times the colocated per-device
# speed. A colocated step holds costs of sharing the devices (weight reloads, memory swaps, a smaller KV cache, the
# long tail holding every GPU) that a split drops and one log cannot separate. Published: verl's fully-async 7B
# trainer updated 512 prompts on 16 H20s in 314 s where the colocated update on 32 took 270 s (1.7x per device);
# NeMo RL's Llama-3.1-8B 1-step-off on 8 + 8 GPUs beat its colocated run on 16 (docs/results.md section 7).
SPLIT_GAIN_HI = 2.0


@dataclass(frozen=True, eq=False)
class Study:
    """Everything fitted once from the traces; shipped to sweep workers."""

    models: FittedModels = field(metadata={"help": "cost models of the reference trace"})
    reference: WhatIf = field(metadata={"help": "the reference configuration (the first trace's), fields resolved"})
    engine: EngineConfig = field(metadata={"help": "the reference engine limits"})
    algo: str = field(metadata={"help": "grpo | ppo"})
    curves: tuple[LearningCurve, ...] = field(metadata={"help": "learning curves of all traces (first = reference)"})
    noise: NoiseScale = field(metadata={"help": "gradient noise scale of the reference trace"})
    rho_requested: str = field(metadata={"help": "rho model asked for (auto picks)"})
    target: float = field(metadata={"help": "eval score defining time-to-target"})
    n_star_ref: float = field(metadata={"help": "reference responses to reach the target (nan if never)"})
    recorded_time_to_target_s: float = field(metadata={"help": "wall seconds at which the reference's evals reached the target"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "fit and learning-model warnings"})
    notes: tuple[str, ...] = field(default=(), metadata={"help": "how the study was made (models chosen, constants fitted)"})
    trace_names: tuple[str, ...] = field(default=(), metadata={"help": "names of the traces"})
    hardware: dict = field(default_factory=dict, metadata={"help": "the reference trace's `hardware` metadata (source of --device)"})
    b_crit_reps: np.ndarray | None = field(default=None, metadata={"help": "bootstrap replicates of the reference's B_crit (over its updates), for rho intervals"})
    lr_aware: RhoModel | None = field(default=None, metadata={"help": "the lr-aware rho model (--rho lr-aware), its B_bend and kappa resolved"})
    framework: str = field(default="rlrun", metadata={"help": "what recorded the reference: rlrun, or the framework whose log was imported"})
    device_models: FittedModels | None = field(default=None, metadata={
        "help": "one device's cost models, from the reference's calibration at one device's threads (a core on CPU); None: not measured"})
    task: str = field(default="", metadata={"help": "the reference's task (its config's `task`; '' when not recorded), for the runs a verdict names"})
    memory: TraceMemory | None = field(default=None, metadata={
        "help": "the reference trace's memory inputs: model shape, framework settings, device memory "
                "(rlsim.whatif.memory)"})

    @property
    def b_ref(self) -> int:
        return int(self.reference.prompts * self.reference.group)

    def reference_run(self, updates: int, seed: int, like: WhatIf | None = None) -> SimRun:
        """The reference configuration simulated for `updates` updates with length seed `seed`, on the
        hardware `like` asks for (`reference_config`; None: as recorded)."""
        return _reference_run(self, reference_config(self, like or WhatIf(), updates=updates, seed=seed))

    def rho_for(self, b: float, lr_rule: str) -> tuple[float, str, list[str]]:
        """(rho, model used, notes) at batch b with lr rule `lr_rule`."""
        model, notes = self.rho_model(b, lr_rule)
        return float(model.rho(b, lr_rule)), model.kind, notes + model.notes(b)  # a model that ignores the rule ignores it

    def rho_model(self, b: float, lr_rule: str) -> tuple[RhoModel, list[str]]:
        """The sample-cost model for a candidate at batch b under `lr_rule`, and notes on its fit to the question."""
        notes: list[str] = []
        kind = self.rho_requested
        model: RhoModel | None = None
        if kind in ("curves", "auto"):
            same = [c for i, c in enumerate(self.curves) if (i == 0 or self._on_lr_line(c, lr_rule))
                    and c.staleness == self.curves[0].staleness]  # other limits: rlsim.modes.split
            try:
                model = curves_rho(self.b_ref, same, self.target)
            except RlsimError as e:
                if kind == "curves":
                    raise
                if len(self.curves) > 1:
                    notes.append(f"learning curves not used ({e})")
        if kind == "lr-aware":
            model = self.lr_aware
        if model is None and kind in ("noise-scale", "auto"):
            try:
                model = noise_scale_rho(self.b_ref, self.noise.b_crit)
            except RlsimError:
                if kind == "noise-scale":
                    raise
        if model is None:  # asked for, or nothing measured the sample cost (then it carries bounds)
            model = invariant_rho(self.b_ref, assumed=kind != "invariant")
        if model.follows_lr_rule:
            return model, notes
        if lr_rule == "fixed" and b > self.b_ref:
            notes.append(f"--lr-rule fixed beyond the reference batch needs learning curves (record runs with a fixed lr at larger "
                         f"batches and pass them with --trace); rho from the {model.kind} model assumes a rescaled lr, and what a "
                         "fixed lr costs depends on the task (docs/results.md)")
        elif lr_rule != self.reference.lr_rule and b != self.b_ref:
            notes.append(f"lr rule {lr_rule} differs from the trace's ({self.reference.lr_rule}); the {model.kind} rho model "
                         "ignores the rule")
        return model, notes

    def _on_lr_line(self, c: LearningCurve, lr_rule: str) -> bool:
        """Whether run `c` trained at the lr that `lr_rule` gives its batch from the reference's: the curves a candidate
        under that rule interpolates between. By the runs' effective lrs when both are recorded (a fixed-lr run at
        another base lr is another configuration, not a point of this one), else by the rule's name."""
        ref_lr, lr = self.curves[0].lr, c.lr
        if math.isfinite(ref_lr) and math.isfinite(lr) and ref_lr > 0:
            return math.isclose(lr, ref_lr * lr_scale(lr_rule, c.batch / self.b_ref), rel_tol=0.02)
        return c.lr_rule == lr_rule or c.batch == self.b_ref

    def rho_replicates(self, b: float, kind: str) -> tuple[np.ndarray | None, str]:
        """rho at batch b for each B_crit replicate (noise-scale), ones (invariant), or None (curves, lr-aware), and a note."""
        if kind == "invariant" or kind == "reference":
            return None, "rho = 1 by assumption"
        if kind == "noise-scale" and self.b_crit_reps is not None and len(self.b_crit_reps) >= 8:
            bc = np.asarray(self.b_crit_reps, float)
            return noise_scale_ratio(b, self.b_ref, bc), "rho: bootstrap of B_crit over the reference's updates"
        return None, f"rho from {kind}: no interval"


def models_for(study: Study, cfg: WhatIf) -> tuple[FittedModels, EngineConfig, tuple[str, ...]]:
    """The fitted models, engine limits and rescaling notes for the hardware `cfg` asks for (--device,
    --gpus): the study's own when it asks for none; for a split, one device's (each engine replica and each
    trainer rank holds one device)."""
    if cfg.split:
        return _one_device(study, cfg.device)
    if cfg.device is None and cfg.gpus is None:
        return study.models, study.engine, ()
    return _rescaled(study, cfg.device, cfg.gpus)


def recorded_devices(study: Study) -> int:
    """Devices the reference trace ran on: on CPU its cores (the torch threads it ran with: a CPU's device is a
    core, as `rlrun record --gen-gpus/--train-gpus` count them), else its hardware metadata's
    device_count; 1 when not stated."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    n = (hw.get("torch_threads") if hw.get("device") == "cpu" else None) or hw.get("device_count") or hw.get("gpus") or 1
    return int(n) if isinstance(n, (int, float)) and n >= 1 else 1


@functools.lru_cache(maxsize=32)
def _one_device(study: Study, device: str | None) -> tuple[FittedModels, EngineConfig, tuple[str, ...]]:
    """One device's models: measured by the reference's calibration at one device's threads (a core on CPU)
    when it has them; the recorded models when the reference ran on one device; else the recorded costs
    scaled to one device (`_rescaled`)."""
    if device is None and study.device_models is not None:
        return study.device_models, engine_of(study.device_models), (
            f"each engine replica and trainer rank: {study.device_models.config['one_device']['note']}",)
    if device is None and recorded_devices(study) == 1:
        return study.models, study.engine, ()
    return _rescaled(study, device, 1)


def reference_config(study: Study, cfg: WhatIf, *, updates: int | None = None, seed: int | None = None) -> WhatIf:
    """The reference configuration (the trace's P, G and lr rule, colocated and synchronous) on the hardware
    `cfg` runs on, so that sigma compares batch sizes, not machines: the same --device and --gpus; for a split,
    colocated on as many devices as the split holds (each replica and each trainer rank is one device)."""
    gpus = cfg.gpus
    if cfg.split:
        gpus = int(cfg.gen_gpus) + int(cfg.train_gpus)
        if cfg.device is None and gpus == recorded_devices(study):
            gpus = None
    return replace(study.reference, updates=cfg.updates if updates is None else updates,
                   seed=cfg.seed if seed is None else seed, device=cfg.device, gpus=gpus, model_params=cfg.model_params)


def hardware_label(study: Study, cfg: WhatIf) -> str:
    """The devices `cfg` runs on, in words ('as recorded' when it asks for none)."""
    if cfg.device is None and cfg.gpus is None and not cfg.split:
        return "as recorded"
    hw = study.hardware or {}
    host = host_name(hw.get("cpu_name") or hw.get("device_name")) if hw.get("device") == "cpu" else ""
    name = cfg.device or host or hw.get("device_name") or hw.get("device") or "the recorded device"
    n = int(cfg.gen_gpus) + int(cfg.train_gpus) if cfg.split else cfg.gpus or recorded_devices(study)
    return f"{n} x {name}"


@functools.lru_cache(maxsize=32)
def _rescaled(study: Study, device: str | None, gpus: int | None) -> tuple[FittedModels, EngineConfig, tuple[str, ...]]:
    hw = study.hardware or study.models.config.get("hardware") or {}
    n = gpus or recorded_devices(study)
    assumed: list[str] = []
    if device is None:  # --gpus alone: more (or fewer) of the recorded device, which needs no datasheet
        prof = profile_for_hardware(hw) or recorded_profile(hw)
        assumed.append(f"--gpus {n} without --device: {n} x the recorded device ({prof.short_name}); its costs scale "
                       f"with the device count from the {recorded_devices(study)} recorded")
        device = prof
    models, notes = rescale(study.models, device, n, source_profile=hw or None, source_gpus=recorded_devices(study))
    return models, engine_of(models), tuple(assumed + notes)


def _resolve(study_ref: WhatIf | None, models: FittedModels, cfg: WhatIf) -> tuple[int, int, str]:
    ref_p = study_ref.prompts if study_ref else models.prompts
    ref_g = study_ref.group if study_ref else models.group
    ref_r = study_ref.lr_rule if study_ref else str(models.config.get("lr_rule") or "sqrt")
    return (cfg.prompts or ref_p, cfg.group or ref_g, cfg.lr_rule or ref_r)


def sim_config(study: Study, cfg: WhatIf, *, lengths: str = "sampled") -> SimConfig:
    cfg.validate()
    P, G, _ = _resolve(study.reference, study.models, cfg)
    if study.algo == "grpo" and G < 2:
        raise RlsimError(f"GRPO needs a group of at least 2 responses per prompt (group-relative advantages), got "
                         f"{setting(group=G)}")
    if study.algo == "ppo" and G != 1:
        raise RlsimError(f"PPO trains one response per prompt (G = 1: a critic, not a group, gives its advantages), "
                         f"got {setting(group=G)}; for a bigger batch ask for more prompts, e.g. "
                         f"{setting(prompts=P * G)}")
    models, engine, _ = models_for(study, cfg)
    eng = replace(engine, max_num_seqs=cfg.max_num_seqs or engine.max_num_seqs,
                  kv_cache_tokens=cfg.kv_cache_tokens or engine.kv_cache_tokens)
    longest = int(np.max(models.lengths.prompt_tokens, initial=0)) + int(models.lengths.max_tokens)
    need = -(-min(longest, eng.max_model_len) // eng.block_size) * eng.block_size
    if cfg.kv_cache_tokens is None:
        eng = replace(eng, kv_cache_tokens=kv_capacity(study, cfg, eng.kv_cache_tokens, need))
    if eng.kv_cache_tokens < need:  # one request must fit, or the engine could never start it
        raise RlsimError(f"--kv-cache-tokens {eng.kv_cache_tokens} cannot hold one request of up to {min(longest, eng.max_model_len)} "
                         f"tokens (prompt + response, in blocks of {eng.block_size}); pass at least {need}")
    return config_for(study.models, updates=cfg.updates, prompts=P, group=G, engine=eng, lengths=lengths,
                      gen_batch=cfg.gen_batch, split=split_config(cfg, models, study.hardware))


@functools.lru_cache(maxsize=64)
def memory_of(study: Study, cfg: WhatIf) -> tuple[Any, int, str]:
    """(the memory estimate of `cfg` on its devices (rlsim.whatif.memory; None: unknown), its engines, why unknown)."""
    if study.memory is None:
        return None, 1, ""
    P, G, _ = _resolve(study.reference, study.models, cfg)
    gen = cfg.gen_batch or max(int(round(P * G * gen_ratio(study.models))), P * G)
    lengths = study.models.lengths
    longest = int(np.max(lengths.prompt_tokens, initial=0)) + int(lengths.max_tokens)
    load = Load(P * G, gen, min(longest, study.engine.max_model_len), recorded_devices(study))
    return candidate_memory(study.memory, cfg, load)


def kv_capacity(study: Study, cfg: WhatIf, tokens: int, need: int) -> int:
    """The simulated engine's KV capacity on `cfg`'s devices: `tokens` (the trace's, rescaled), or fewer where the
    memory model's pool (per engine, times the engines the simulated engine stands for; a split's replica is one)
    holds fewer, so that the engine queues and preempts as vLLM does; never below one request (`need`), which
    does not fit (the memory warning says so)."""
    est, engines, _ = memory_of(study, cfg)
    if est is None or est.kv_capacity_tokens is None:
        return tokens
    cap = est.kv_capacity_tokens * (1 if cfg.split else engines)
    return min(tokens, cap) if cap >= need else tokens


def _memory_fields(study: Study, cfg: WhatIf) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the Outcome's `fits` and `memory`, its memory warning, its memory notes)."""
    est, _, why = memory_of(study, cfg)
    warning = memory_warning(est)
    notes = [why] if why else []
    if est is not None and study.memory is not None and study.memory.assumed:
        notes.append(study.memory.assumed)
    return {"fits": None if est is None else est.fits, "memory": memory_object(est, why)}, \
        [warning] if warning else [], notes


def prepare(traces: Sequence[Trace], *, rho_model: str = "auto", target: float | None = None,
            calibration: Sequence[Trace] = ()) -> Study:
    """Fit the reference trace (the first) once, and the learning curves of all traces. `calibration`:
    traces of `rlrun calibrate` (same model and device) whose calibration rows refit the step costs."""
    traces = list(traces)
    if not traces:
        raise RlsimError(f"pass at least one trace ({name('trace')})")
    rho_model, rho_params = parse_rho(rho_model)
    if target is not None and (not isinstance(target, Real) or isinstance(target, bool) or not math.isfinite(target)):
        raise RlsimError(f"{name('target')} must be a finite eval score, got {target!r}")
    ref = traces[0]
    cfg = ref.config
    algo = str(cfg.get("algo") or "grpo")
    setup_warnings = []
    for t in traces[1:]:
        if str(t.config.get("algo") or "grpo") != algo:
            raise RlsimError(f"{t.path} is a {t.config.get('algo')} run, the reference {ref.path} is {algo}: "
                             "learning curves must come from one algorithm and task")
        for key, what in (("task", "task"), ("model", "model")):
            a = (ref.config.get(key) if key == "task" else (ref.meta.get("model") or {}).get("name"))
            b = (t.config.get(key) if key == "task" else (t.meta.get("model") or {}).get("name"))
            if a != b:
                setup_warnings.append(f"{t.name} has {what} {b!r}, the reference {a!r}: its learning curve may not be comparable")
    curves = tuple(fit_learning_curve(t) for t in traces)
    if target is not None:
        _check_target(float(target), curves)
    # step costs fitted across the traces of the same setup (their batch sizes give the slopes a range)
    # (split-mode recordings give learning curves at their staleness limit, not step costs: see fit_trace)
    pooled = [ref] + [t for t in traces[1:] if same_setup(ref, t) and placement(t.config)["mode"] == "colocated"]
    models = fit_trace(pooled if len(pooled) > 1 else ref, calibration=list(calibration))
    ratios = None if calibration else device_ratios(ref)  # one device's speed (a core on CPU), for splits
    device_models = per_device(models, ratios.gen, ratios.train, ratios.describe()) if ratios else None
    reference = WhatIf(prompts=models.prompts, group=models.group, lr_rule=str(cfg.get("lr_rule") or "sqrt"))
    if not reference.prompts:
        raise RlsimError(f"{ref.path}: metadata config has no `prompts`; the trace was not written by `rlrun record`")
    noise = noise_scale(ref)
    warnings = list(models.warnings) + setup_warnings
    warnings += [w for t in traces for w in t.warnings]  # rows dropped by --drop-invalid
    warnings += [f"{t.name} was recovered from a partial recording ({t.meta.get('status')}): only its complete steps are used"
                 for t in traces if t.recovered]
    ref_curve = curves[0]
    if target is None:
        # the best score the reference reached; with several traces, the best score all of them reached
        # (so that their samples-to-target can be compared)
        bests = [c.best for c in curves if len(c.score)]
        target = (min(bests) if len(curves) > 1 and len(bests) == len(curves) else ref_curve.best) if len(ref_curve.score) else math.nan
    n_star = ref_curve.samples_to_target(target) if math.isfinite(target) else None
    if n_star is not None and n_star <= 0:
        warnings.append(f"the reference's first eval already reaches {target:.4g}: pass a higher {name('target')} "
                        "for a time-to-target")
        n_star = None
    elif n_star is None and not len(ref_curve.score):  # (a target it never reached is refused: _check_target)
        warnings.append("the reference trace has no eval rows: no absolute time-to-target")
    rec_t = math.nan
    if n_star is not None:
        ev = ref.rows(EVAL)
        hit = np.nonzero(ev["score"] >= target - 1e-12)[0]
        if len(hit):
            rec_t = float(ev["t_start"][hit[0]])
    if rho_model == "curves" and len(traces) < 2:
        raise RlsimError(f"{setting(rho_model='curves')} needs two or more traces at different batch sizes (add "
                         f"them with {name('trace')})")
    b_crit_reps = b_noise_replicates(noise)
    if rho_model in ("auto", "noise-scale") and len(traces) == 1 and noise.b_crit > 0:
        warnings.append(_noise_scale_warning(noise.b_crit, b_crit_reps))
    lr_aware, notes = None, []
    if rho_model == "lr-aware":
        lr_aware, note, identified = _lr_aware(ref_curve, curves, target, rho_params)
        (notes if identified else warnings).append(note)
    return Study(models=models, reference=reference, engine=engine_of(models), algo=algo, curves=curves, noise=noise,
                 rho_requested=rho_model, target=float(target), n_star_ref=float(n_star) if n_star is not None else math.nan,
                 recorded_time_to_target_s=rec_t, warnings=tuple(warnings), notes=tuple(notes), trace_names=tuple(t.name for t in traces),
                 b_crit_reps=b_crit_reps, hardware=dict(ref.meta.get("hardware") or {}), lr_aware=lr_aware,
                 framework=str((ref.meta.get("source") or {}).get("framework") or "rlrun"), device_models=device_models,
                 task=str(ref.config.get("task") or ""), memory=trace_memory(ref.meta))


def _check_target(target: float, curves: Sequence[LearningCurve]) -> None:
    """Refuse a target above what the reference reached: time-to-target is the reference's samples-to-target (its
    evals isotonic-smoothed, `LearningCurve.samples_to_target`), and every T ratio is relative to it, so other traces
    reaching higher do not make a higher target answerable. A reference without evals has no best: it is warned
    about where the target is used."""
    ref = curves[0]
    if len(ref.score) and target > ref.best + 1e-12:
        both = [c.best for c in curves if len(c.score)]
        common = (f"; the best all {len(curves)} traces reached is {min(both):.4g}, the default with several traces"
                  if len(curves) > 1 and len(both) == len(curves) else "")
        raise RlsimError(f"{setting(target=target)} is above the reference's best eval score {ref.best:.4g} (its evals "
                         f"smoothed), so it never reaches it and time-to-target is undefined; pass a target of at most "
                         f"{ref.best:.4g}, or leave {name('target')} out for the best it reached{common}")


def _noise_scale_warning(b_crit: float, reps: np.ndarray | None) -> str:
    """The caveat on rho from one trace's gradient noise scale: the spread computed for it, and where its record is."""
    lo, hi = interval(b_crit, reps, INTERVAL) if reps is not None else (math.nan, math.nan)
    spread = (f"{100 * INTERVAL:.0f} % bootstrap over its updates {lo:.4g}..{hi:.4g}" if math.isfinite(lo) and math.isfinite(hi)
              else "too few updates for a bootstrap interval")
    return (f"rho from one trace rests on its gradient noise scale, B_crit {b_crit:.4g} responses ({spread}), which did not "
            "predict samples-to-target in rlsim's measured batch-size studies (docs/results.md): treat rho and the ranking "
            "as a guess, or record runs at two or more other batch sizes and add them with --trace (--rho curves)")


def _lr_aware(ref: LearningCurve, curves: Sequence[LearningCurve], target: float,
              params: tuple[float, float] | None) -> tuple[RhoModel, str, bool]:
    """The lr-aware model: B_bend and kappa as given, else fitted on the other traces' curves; a note on where they
    come from, and whether they are identified (two constants need runs at two other sizes or lrs)."""
    rule = ref.lr_rule or "sqrt"
    if params is not None:
        return lr_aware_rho(ref.batch, *params, rule), f"lr-aware rho: B_bend = {params[0]:.4g}, kappa = {params[1]:.3g} as given", True
    if len(curves) > 1 and math.isfinite(target):
        f = fit_lr_aware(ref, curves, target)
        src = f"fitted on {f.runs} runs"
        few = "; two constants from one run are not identified: add runs at more sizes" if f.runs < 2 else ""
        return lr_aware_rho(ref.batch, f.b_bend, f.kappa, rule, source=src), \
            f"lr-aware rho: B_bend = {f.b_bend:.4g} responses, kappa = {f.kappa:.3g} {src} (squared log error {f.loss:.3g}){few}", \
            f.runs >= 2
    if len(curves) > 1:
        raise RlsimError("--rho lr-aware is fitted where the runs reach a target score, and the reference trace has no eval "
                         "rows: record it with evals (--eval-every), or give --bend-batch and --kappa")
    raise RlsimError("--rho lr-aware needs its two constants: pass runs at other batch sizes or lrs with --trace to fit them, "
                     "or give --bend-batch and --kappa (they are the task's: one task's fit did not transfer to another, "
                     "docs/results.md)")


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


@functools.lru_cache(maxsize=32)
def _reference_run(study: Study, cfg: WhatIf) -> SimRun:
    # Study is eq=False, so the cache is keyed by the object: a sweep worker simulates each reference
    # configuration (updates, seed, hardware) once for all its configs
    return simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed))


def same_setup(a: Trace, b: Trace) -> bool:
    """Same algorithm, model, device and engine limits: step costs may be fitted across the two."""
    def key(t: Trace):
        e, h, m = t.meta.get("engine") or {}, t.meta.get("hardware") or {}, t.meta.get("model") or {}
        return (t.config.get("algo"), m.get("name"), h.get("device_name"), e.get("max_num_seqs"), e.get("kv_cache_tokens"))
    return key(a) == key(b)


def _outcome(study: Study, cfg: WhatIf, run_: SimRun, *, reference: bool = False) -> Outcome:
    P, G, rule = _resolve(study.reference, study.models, cfg)
    B = P * G
    q = run_.responses_per_s
    ref_cfg = reference_config(study, cfg)
    model: RhoModel | None = None
    if reference:
        sigma, rho, kind, warnings = 1.0, 1.0, "reference", []
    else:
        sigma = q / _reference_run(study, ref_cfg).responses_per_s
        model, warnings = study.rho_model(B, rule)
        rho, kind = float(model.rho(B, rule)), model.kind  # a model that ignores the lr rule ignores it
        warnings += model.notes(B)
    hw_warnings, notes, gain = _hardware(study, cfg, ref_cfg)
    warnings += hw_warnings
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
    mem, mem_warnings, mem_notes = _memory_fields(study, cfg)
    warnings += mem_warnings
    notes += mem_notes
    step = run_.mean_step_time
    gen, train, syn, oth = (float(run_.gen_time.mean()), float(run_.train_time.mean()), float(run_.sync_time.mean()),
                            float(run_.other_time.mean()))
    iv = _intervals(study, cfg, run_, q, sigma, rho, ratio, B, kind, reference, model, rho_stale)
    own = reference or replace(cfg, prompts=P, group=G, lr_rule=rule) == ref_cfg  # a candidate may be the reference
    reg = "reference" if own else regime(ratio)
    lo_t, hi_t = iv.get("time_to_target_ratio_lo", math.nan), iv.get("time_to_target_ratio_hi", math.nan)
    if not own and lo_t < 1 < hi_t and not (lo_t >= 1 - REGIME_BAND and hi_t <= 1 + REGIME_BAND):
        reg = "undecided"
        # the same words for every config (its interval is printed beside it): a sweep says them once for all
        warnings.append("the T / T_ref interval spans 1: whether time to target falls or rises is undecided at this "
                        f"confidence; {_decider(iv, P, G, study, cfg)}")
    return Outcome(prompts=P, group=G, batch=B, lr_rule=rule, responses_per_s=q, step_time_s=step, gen_s=gen, train_s=train,
                   sync_s=syn, other_s=oth, idle_s=max(step - gen - train - syn, 0.0), sigma=sigma, rho=rho, rho_model=kind,
                   time_to_target_ratio=ratio, time_to_target_s=t_abs, regime=reg, **iv,
                   updates=int(len(run_.step_time)), gen_steps=float(run_.gen_steps.mean()), peak_running=int(run_.peak_running.max()),
                   preemptions=float(run_.preemptions.mean()), seed=cfg.seed, warnings=tuple(warnings), notes=tuple(notes),
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
    gain = _reference_run(study, ref_cfg).responses_per_s / _reference_run(study, recorded).responses_per_s
    notes = [f"compared with the reference configuration (P={ref_cfg.prompts}, G={ref_cfg.group}, colocated) on the same "
             f"hardware, {hardware_label(study, ref_cfg)}: it runs {gain:.3g}x the recorded responses/s there, a change of "
             "hardware and not of batch size, which sigma leaves out"] + list(notes)
    if cfg.split:  # where each side's one-device costs come from
        notes += [n for n in models_for(study, cfg)[2] if n not in notes]
    return warnings, notes, float(gain)


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
                   f"{sim_config(study, cfg).engine.kv_cache_tokens}): {run_.preemptions.mean():.1f} preemptions per round, recomputed")
    return out


def _decider(iv: dict[str, Any], P: int, G: int, study: Study, cfg: WhatIf) -> str:
    """The cheapest measurement that would decide an undecided verdict: whichever of rho and sigma is less sure.
    Throughput at another P on the recorded hardware: `rlrun probe` of both sizes in one process, paired (two
    recordings made apart differ by the machine's drift, 5-10 % between processes on a shared host, as much as
    the gain in question; docs/results.md section 6)."""
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
        run = f"rlrun record --algo {study.algo} --prompts {P}{group} " + ("..." if rho_side else "--steps 5")
        how = f"record a run at this size {what} ({run})"
    else:
        how = (f"run {study.framework} at P={P}, G={G} {what} and import its log (rlsim import {study.framework} LOG "
               "-o run.parquet)")
    if rho_side:
        return f"the sample cost decides it: {how}, then add it with --trace"
    return f"the throughput decides it: {how}, which measures it"


def _split_fields(run_: SimRun, rho_stale: float) -> dict[str, Any]:
    """The Outcome's device-split fields: measured for a split run; for a colocated one the device waits on
    the generation side while it trains and on the training side while it generates."""
    sp = run_.split
    if not sp:
        total = float(run_.step_time.sum())
        gen = float(run_.gen_time.sum()) / total if total > 0 else math.nan
        return {"mode": "colocated", "gen_idle_ratio": 1.0 - gen, "train_idle_ratio": gen}
    mode = (f"split {sp.gen_gpus} gen : {sp.train_gpus} train, staleness {sp.staleness:g}"
            + (", partial rollout" if sp.partial_rollout else ""))
    return {"mode": mode, "gen_idle_ratio": run_.gen_idle_ratio, "train_idle_ratio": run_.train_idle_ratio,
            "staleness_mean": run_.staleness_mean, "staleness_max": int(run_.staleness_max), "rho_staleness": rho_stale,
            "allreduce_s": float(sp.allreduce_s)}


REGIME_BAND = 0.05  # the band of `regime` ("flat" within it)


def _intervals(study: Study, cfg: WhatIf, run_: SimRun, q: float, sigma: float, rho: float, ratio: float, B: int,
               kind: str, reference: bool, model: RhoModel | None = None, rho_stale: float = 1.0) -> dict[str, Any]:
    """The `_lo` / `_hi` fields of an Outcome and how they were made (empty when nothing is uncertain or
    nothing resamples). Throughput: the bootstrap replicates of the fits on the hardware `cfg` runs on (none for
    split runs), widened by the fits' held-out error (`rlsim.replay.fit_quality`: at least its bound where the fits
    cannot be used, and then the responses/s too). Sample cost: B_crit replicates (noise scale), or the bounds of an
    unmeasured rho."""
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
            q_reps = q_reps * np.exp(np.random.default_rng(cfg.seed + 1).normal(0.0, _held_out_error(check, run_),
                                                                                len(q_reps)))
        out["responses_per_s_lo"], out["responses_per_s_hi"] = interval(q, q_reps, level)
        # in full an octave or more from the reference's batch (its levels are then others than the reference's), less
        # nearer: the same batch shares the reference's levels and their errors cancel in sigma
        held_out = 0.0 if reference else _held_out_error(check, run_) * min(1.0, abs(math.log2(B / study.b_ref)))
        if held_out > 0:  # the fits' error on levels they did not see, beyond the replicates' spread
            sig_reps = sig_reps * np.exp(rng.normal(0.0, held_out, len(sig_reps)))
        out["sigma_lo"], out["sigma_hi"] = (1.0, 1.0) if reference else interval(sigma, sig_reps, level)
        methods.append(how + (f", widened by the fits' held-out error ({100 * held_out:.1f} % RMS"
                              f"{'' if check.usable else ', at least the bound of fits that cannot be used'})"
                              if held_out > 0 else ""))
    ends = _other_ends(study, cfg, reference)
    widened = False  # whether an end lies beyond the sigma interval of the replicates
    for q_end, s_end, how in ends:  # what the evidence cannot decide: the other end widens the interval (or makes one)
        out["responses_per_s_lo"] = min(out.get("responses_per_s_lo", q), q_end)
        out["responses_per_s_hi"] = max(out.get("responses_per_s_hi", q), q_end)
        if not reference:
            widened |= not out.get("sigma_lo", sigma) <= s_end <= out.get("sigma_hi", sigma)
            out["sigma_lo"], out["sigma_hi"] = min(out.get("sigma_lo", sigma), s_end), max(out.get("sigma_hi", sigma), s_end)
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
        out["time_to_target_ratio_lo"] = min(out.get("time_to_target_ratio_lo", ratio), out.get("rho_lo", rho) / out["sigma_hi"])
        out["time_to_target_ratio_hi"] = max(out.get("time_to_target_ratio_hi", ratio), out.get("rho_hi", rho) / out["sigma_lo"])
    if methods:
        out["interval"] = "; ".join(methods)
    return out


@functools.lru_cache(maxsize=8)
def _alt_study(study: Study) -> Study:
    """The study with its models at the other end of what the trace cannot identify (`FittedModels.alternative`)."""
    return replace(study, models=study.models.alternative)


def _rate(study: Study, cfg: WhatIf, reference: bool) -> tuple[float, float]:
    """(responses/s, sigma) of `cfg` simulated on `study` (the reference configuration when `reference`)."""
    if reference:
        return _reference_run(study, cfg).responses_per_s, 1.0
    q = simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed)).responses_per_s
    return q, q / _reference_run(study, reference_config(study, cfg)).responses_per_s


def _other_ends(study: Study, cfg: WhatIf, reference: bool) -> list[tuple[float, float, str]]:
    """(responses/s, sigma, how) at the far ends of what the evidence cannot decide: the trace's unidentified terms
    (`FittedModels.alternative`), and for another device, its datasheet gain against none (frameworks reach a
    different share of peak on new hardware, which no datasheet states)."""
    out = []
    m = study.models
    if m.alternative is not None:
        what = (f"the per-step generation cost {m.gen.c_step * 1e3:.3g}..{m.alternative.gen.c_step * 1e3:.3g} ms"
                if m.alternative.update is m.update else "generation's share of the logged step")
        out.append((*_rate(_alt_study(study), cfg, reference), f"both ends of what the trace cannot identify ({what})"))
    if cfg.split and data_parallel(study.hardware):
        out.append((*_rate(_split_gain_study(study), cfg, reference),
                    f"the split free of the colocated run's device-sharing costs at the other end (each side up to "
                    f"{SPLIT_GAIN_HI:g}x the recorded speed per device)"))
    if cfg.device is not None and _other_device(study, cfg.device):
        out.append((*_rate(study, replace(cfg, device=None), reference),
                    f"{cfg.device}'s datasheet gain at one end, the recorded device's own speed at the other"))
    roof = _other_roof_study(study, cfg.device) if cfg.device is not None and not cfg.split else None
    if roof is not None:
        out.append((*_rate(roof[0], cfg, reference),
                    f"per-token compute on {cfg.device} at its bandwidth gain at the other end, {roof[1]:.3g}x below "
                    "its FLOP/s gain (which of the datasheet's two roofs a term reaches on a new device, none states)"))
    return out


@functools.lru_cache(maxsize=8)
def _other_roof_study(study: Study, device: str) -> tuple[Study, float] | None:
    """The study at the other roof of the move to `device` (`rlsim.replay.devices.other_roof`) and its factor, or
    None."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    end = other_roof(study.models, device, source_profile=hw or None)
    return None if end is None else (replace(study, models=end[0]), end[1])


@functools.lru_cache(maxsize=8)
def _split_gain_study(study: Study) -> Study:
    """The study with every device cost SPLIT_GAIN_HI times faster (the roofline rule with both ratios at that
    factor), for the far end of a split predicted from a colocated GPU run."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    src = recorded_profile(hw)
    fast = replace(src, key="split-gain", mem_bandwidth_gbs=SPLIT_GAIN_HI, flops_tflops=SPLIT_GAIN_HI)
    n = recorded_devices(study)
    models, _ = rescale(study.models, fast, n, source_profile=src, source_gpus=n)
    return replace(study, models=replace(models, config=study.models.config, warnings=study.models.warnings, alternative=None))


def _other_device(study: Study, device: str) -> bool:
    """Whether `device` is another GPU than the GPU the trace was recorded on (a CPU trace moved to a GPU has its
    own warnings: its recorded speed is no end of anything)."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    rec, dst = profile_for_hardware(hw), get_profile(device)
    recorded_gpu = rec.kind == "gpu" if rec is not None else str(hw.get("device") or "").lower() not in ("cpu", "")
    return recorded_gpu and dst.kind == "gpu" and (rec is None or dst.key != rec.key)


def _held_out_error(check: FitCheck, run_: SimRun) -> float:
    """The relative error of a candidate's step costs where the fits have not seen it: the leave-one-level-out RMS
    of the engine-step and the training fits (each level predicted from the others; `FitCheck.spread`: at least the
    rule's bound for a fit that cannot be used), weighted by the candidate's generation and training shares of its
    step. Measured (docs/results.md section 6): the bootstrap over levels alone gave sigma intervals that held a
    paired measurement in 0 of 10 cases."""
    gen, train = float(np.sum(run_.gen_time)), float(np.sum(run_.train_time))
    cv_g, cv_t = check.spread("engine-step"), check.spread("training")
    tot = gen + train
    return float(math.sqrt((gen * cv_g ** 2 + train * cv_t ** 2) / tot)) if tot > 0 else 0.0


def fit_check(study: Study) -> FitCheck:
    """The fit-quality rule (`rlsim.replay.fit_quality`) on the reference's cost fits."""
    return check_fits(study.models.validation, len(study.models.recorded.step))


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
    ref_reps = None if reference else replicate_rates(models, _reference_run(study, reference_config(study, cfg)))
    return q_reps, ref_reps, reps.method


def evaluate(study: Study, cfg: WhatIf) -> Outcome:
    """Simulate one candidate and compare it with the reference. Pure and deterministic."""
    run_ = simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed))
    return _outcome(study, cfg, run_)


def reference_outcome(study: Study, updates: int = 100, seed: int = 0, like: WhatIf | None = None) -> Outcome:
    """The reference configuration's own outcome (sigma = rho = 1) for `updates` updates, seed `seed`, on the
    hardware `like` asks for (`reference_config`; None: as recorded)."""
    cfg = reference_config(study, like or WhatIf(), updates=updates, seed=seed)
    return _outcome(study, cfg, _reference_run(study, cfg), reference=True)


def timeline(study: Study, cfg: WhatIf) -> SimRun:
    """The candidate simulated with its timeline recorded (Gantt charts, Perfetto export)."""
    return simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed),
                    record_timeline=True)


def run(traces: Sequence[Trace], cfg: WhatIf, *, rho_model: str = "auto", target: float | None = None,
        calibration: Sequence[Trace] = ()) -> RunResult:
    cfg.validate()
    study = prepare(traces, rho_model=rho_model, target=target, calibration=calibration)
    cand = evaluate(study, cfg)
    ref = reference_outcome(study, cfg.updates, cfg.seed, like=cfg)
    rec = study.models.recorded
    return RunResult(reference=ref, candidate=cand, rho_model=cand.rho_model, target=study.target, n_star_ref=study.n_star_ref,
                     b_crit=study.noise.b_crit, recorded_time_to_target_s=study.recorded_time_to_target_s, warnings=study.warnings,
                     notes=study.notes,
                     b_crit_critic=study.noise.critic_b_crit, validation=study.models.validation,
                     recorded_responses_per_s=float(np.median(rec.responses_per_s)) if len(rec.step) else math.nan,
                     recorded_step_time_s=float(np.median(rec.step_time)) if len(rec.step) else math.nan)
