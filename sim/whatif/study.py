"""What-if, fitted once: `prepare` fits a trace's cost and learning models into a `Study`, and the functions
that resolve a candidate on its hardware (the models on that device, its batch, its SimConfig, its memory).

`Study` holds what was fitted and nothing else; it is frozen and picklable: sweeps ship it to process-pool or Ray
workers once. The reference configuration is simulated with each candidate's `updates` and `seed` (so sigma compares
like with like) and memoised per (study, updates, seed) in the process that evaluates.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Any, Sequence

import numpy as np

from rlsim.core.config import EngineConfig, SimConfig, WhatIf
from rlsim.core.pipeline import SimRun
from rlsim.modes.registry import recorded_mode, simulate, spec_of
from rlsim.modes.registry import check as check_mode, split_config
from rlsim.modes.split import data_parallel, replica_tp
from rlsim.replay.device_speed import device_ratios
from rlsim.replay.devices import device_models, host_name, per_device, profile_for_hardware, recorded_profile, rescale
from rlsim.replay.errors import RlsimError, name, setting
from rlsim.replay.fit import fit_trace
from rlsim.replay.fit_quality import FitCheck, check_fits
from rlsim.replay.io import Trace
from rlsim.replay.learning import (LearningCurve, NoiseScale, b_noise_replicates, fit_learning_curve, lr_scale,
                                   noise_scale)
from rlsim.replay.models import INTERVAL, FittedModels, interval
from rlsim.replay.rollout_costs import group_models, old_log_prob_share, without_share
from rlsim.replay.rho import (RhoModel, curves_rho, fit_lr_aware, invariant_rho, lr_aware_rho, noise_scale_ratio,
                              noise_scale_rho, parse_rho)
from rlsim.replay.schema import EVAL, PHASE, STEP_STATS, placement
from rlsim.whatif.memory import (PARTIAL, Load, TraceMemory, candidate_memory, memory_object, memory_warning,
                                 recorded_mean_seq_len, trace_memory)
from rlsim.whatif.simconfig import config_for, engine_of, gen_ratio

# A split side's speed per device over a colocated GPU log's. A colocated step holds costs of sharing the devices
# that a split drops (the engine's sleep and wake, the memory each side gives up to the other, offloading between
# phases), which no log identifies. The value with the lowest median |error| over the published runs at the
# package's engine-step overhead (`python -m bench.published --fit 0,0.012 --fit-gain 1,1.25,1.5,1.75,2,2.5`, which
# scores it leave-one-source-out; docs/results.md section 20); a split's interval spans 1 (no sharing cost) to
# intervals.SPLIT_GAIN_HI.
SPLIT_SHARING_GAIN = 2.0


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
    recorded_time_to_target_s: float = field(metadata={"help": "wall seconds at which the reference's evals reached "
                                                               "the target"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "fit and learning-model warnings"})
    notes: tuple[str, ...] = field(default=(),
                                   metadata={"help": "how the study was made (models chosen, constants fitted)"})
    trace_names: tuple[str, ...] = field(default=(), metadata={"help": "names of the traces"})
    hardware: dict = field(default_factory=dict,
                           metadata={"help": "the reference trace's `hardware` metadata (source of --device)"})
    b_crit_reps: np.ndarray | None = field(default=None, metadata={"help": "bootstrap replicates of the reference's "
                                                                           "B_crit (over its updates), for rho "
                                                                           "intervals"})
    lr_aware: RhoModel | None = field(default=None, metadata={"help": "the lr-aware rho model (--rho lr-aware), its "
                                                                      "B_bend and kappa resolved"})
    framework: str = field(default="rlrun", metadata={"help": "what recorded the reference: rlrun, or the framework "
                                                              "whose log was imported"})
    device_models: FittedModels | None = field(default=None, metadata={
        "help": "one device's cost models, from the reference's calibration at one device's threads (a core on CPU); "
                "None: not measured"})
    task: str = field(default="", metadata={"help": "the reference's task (its config's `task`; '' when not recorded), "
                                                    "for the runs a verdict names"})
    old_log_prob_share: float = field(default=1.0, metadata={
        "help": "the share of the reference's batch preparation logged as the old log-prob pass (rollout_log_probs "
                "drops it)"})
    memory: TraceMemory | None = field(default=None, metadata={
        "help": "the reference trace's memory inputs: model shape, framework settings, device memory "
                "(rlsim.whatif.memory)"})
    split_gain: float = field(default=1.0, metadata={
        "help": "each split side's speed per device over the reference's: SPLIT_SHARING_GAIN for a colocated GPU run "
                "that trained data-parallel (the device-sharing costs a split drops), else 1"})
    recorded_mode: dict = field(default_factory=dict, metadata={
        "help": "the execution mode the reference trace records, its config's execution_mode and mode_settings ({}: "
                "none), asked where a config names no mode (rlsim.modes.registry.as_recorded)"})

    @property
    def b_ref(self) -> int:
        return int(self.reference.prompts * self.reference.group)

    def reference_run(self, updates: int, seed: int, like: WhatIf | None = None) -> SimRun:
        """The reference configuration simulated for `updates` updates with length seed `seed`, on the
        hardware `like` asks for (`reference_config`; None: as recorded)."""
        return simulate_reference(self, reference_config(self, like or WhatIf(), updates=updates, seed=seed))

    def rho_for(self, b: float, lr_rule: str) -> tuple[float, str, list[str]]:
        """(rho, model used, notes) at batch b with lr rule `lr_rule`."""
        model, notes = self.rho_model(b, lr_rule)
        # a model that ignores the rule ignores it
        return float(model.rho(b, lr_rule)), model.kind, notes + model.notes(b)

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
            notes.append("--lr-rule fixed beyond the reference batch needs learning curves (record runs with a fixed "
                         f"lr at larger batches and pass them with --trace); rho from the {model.kind} model assumes a "
                         "rescaled lr, and what a fixed lr costs depends on the task (docs/results.md)")
        elif lr_rule != self.reference.lr_rule and b != self.b_ref:
            notes.append(f"lr rule {lr_rule} differs from the trace's ({self.reference.lr_rule}); the {model.kind} rho "
                         "model ignores the rule")
        return model, notes

    def _on_lr_line(self, c: LearningCurve, lr_rule: str) -> bool:
        """Whether run `c` trained at the lr that `lr_rule` gives its batch from the reference's: the curves a candidate
        under that rule interpolates between. By the runs' effective lrs when both are recorded (a fixed-lr run at
        another base lr is another configuration, not a point of this one), else by the rule's name."""
        ref_lr, lr = self.curves[0].lr, c.lr
        if math.isfinite(ref_lr) and math.isfinite(lr) and ref_lr > 0:
            return math.isclose(lr, ref_lr * lr_scale(lr_rule, c.responses_per_update / self.b_ref), rel_tol=0.02)
        return c.lr_rule == lr_rule or c.responses_per_update == self.b_ref

    def rho_replicates(self, b: float, kind: str) -> tuple[np.ndarray | None, str]:
        """rho at batch b for each B_crit replicate (noise-scale), ones (invariant), or None (curves, lr-aware), and a
        note."""
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
        return _split_models(study, cfg.device, replica_tp(cfg, study.hardware), cfg.rollout_log_probs,
                             split_gain_of(study, cfg))
    if cfg.device is None and cfg.gpus is None:
        return study.models, study.engine, ()
    return _rescaled(study, cfg.device, cfg.gpus)


def split_gain_of(study: Study, cfg: WhatIf) -> float:
    """The gain a split `cfg` takes (Study.split_gain): none where its replicas sit on the training devices (a hybrid
    mode, verl's colocate_async), which share them as the colocated run did."""
    spec = spec_of(cfg.mode)
    return 1.0 if spec is not None and spec.devices == "hybrid" else study.split_gain


@functools.lru_cache(maxsize=32)
def _split_models(study: Study, device: str | None, tp: int, rollout_log_probs: bool, gain: float = 1.0
                  ) -> tuple[FittedModels, EngineConfig, tuple[str, ...]]:
    """A split's models: one device's for each trainer rank, one tensor-parallel group's of `tp` devices for each
    rollout replica (`rlsim.replay.rollout_costs.group_models`), each side at `gain` times its speed per device;
    with rollout_log_probs, no old log-prob pass."""
    models, engine, notes = _one_device(study, device)
    tp_ref = int((study.hardware or {}).get("tp") or 1)
    if tp != 1 or tp_ref != 1:
        group, _, _ = _rescaled(study, device, tp)
        models, note = group_models(models, group, tp_ref, tp)
        notes += (note,)
    if gain != 1.0:
        models = per_device(models, 1 / gain, 1 / gain, f"{gain:g}x the colocated run's speed per device")
        notes += (f"each split side {gain:g}x the colocated log's speed per device: the device-sharing costs a "
                  "colocated run pays and a split drops (the engine's sleep and wake, memory given up, offloading), "
                  "fitted on published verl and NeMo RL runs",)
    if rollout_log_probs:
        models = replace(models, prep=without_share(models.prep, study.old_log_prob_share))
        notes += (f"the trainer takes old log-probs from the rollout: its batch preparation less the old log-prob pass "
                  f"({100 * study.old_log_prob_share:.0f} % of it as logged)",)
    return models, engine_of(models), notes


def recorded_devices(study: Study) -> int:
    """Devices the reference trace ran on: on CPU its cores (the torch threads it ran with: a CPU's device is a
    core, as `rlrun record --gen-gpus/--train-gpus` count them), else its hardware metadata's
    device_count; 1 when not stated."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    n = ((hw.get("torch_threads") if hw.get("device") == "cpu" else None) or hw.get("device_count")
         or hw.get("gpus") or 1)
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
    return _rescaled(study, device, 1, one_device=True)


def reference_config(study: Study, cfg: WhatIf, *, updates: int | None = None, seed: int | None = None) -> WhatIf:
    """The reference configuration (the trace's P, G and lr rule, colocated and synchronous) on the hardware
    `cfg` runs on, so that sigma compares batch sizes, not machines: the same --device and --gpus; for a split,
    colocated on as many devices as the split holds (each replica and each trainer rank is one device)."""
    gpus = cfg.gpus
    if cfg.split:
        gpus = cfg.split_devices
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
    n = cfg.split_devices if cfg.split else cfg.gpus or recorded_devices(study)
    return f"{n} x {name}"


@functools.lru_cache(maxsize=32)
def _rescaled(study: Study, device: str | None, gpus: int | None, one_device: bool = False
              ) -> tuple[FittedModels, EngineConfig, tuple[str, ...]]:
    """The models on `gpus` of `device` (None: the recorded one); `one_device`: a split side's one device, which the
    user did not ask as --gpus."""
    hw = study.hardware or study.models.config.get("hardware") or {}
    n = gpus or recorded_devices(study)
    assumed: list[str] = []
    if device is None:  # --gpus alone: more (or fewer) of the recorded device, which needs no datasheet
        prof = profile_for_hardware(hw) or recorded_profile(hw)
        asked = "one device of a split side" if one_device else f"{name('gpus')} {n} without {name('device')}"
        assumed.append(f"{asked}: {n} x the recorded device ({prof.short_name}); its costs scale with the device "
                       f"count from the {recorded_devices(study)} recorded")
        device = prof
    models, notes = rescale(study.models, device, n, source_profile=hw or None, source_gpus=recorded_devices(study))
    return models, engine_of(models), tuple(assumed + notes)


def resolve_batch(study_ref: WhatIf | None, models: FittedModels, cfg: WhatIf) -> tuple[int, int, str]:
    ref_p = study_ref.prompts if study_ref else models.prompts
    ref_g = study_ref.group if study_ref else models.group
    ref_r = study_ref.lr_rule if study_ref else str(models.config.get("lr_rule") or "sqrt")
    return (cfg.prompts or ref_p, cfg.group or ref_g, cfg.lr_rule or ref_r)


def sim_config(study: Study, cfg: WhatIf, *, lengths: str = "sampled") -> SimConfig:
    cfg.validate()
    check_mode(cfg)
    P, G, _ = resolve_batch(study.reference, study.models, cfg)
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
        raise RlsimError(f"--kv-cache-tokens {eng.kv_cache_tokens} cannot hold one request of up to "
                         f"{min(longest, eng.max_model_len)} tokens (prompt + response, in blocks of "
                         f"{eng.block_size}); pass at least {need}")
    return config_for(study.models, updates=cfg.updates, prompts=P, group=G, engine=eng, lengths=lengths,
                      gen_batch=cfg.gen_batch, split=split_config(replace(cfg, prompts=P), models, study.hardware))


@functools.lru_cache(maxsize=64)
def memory_of(study: Study, cfg: WhatIf) -> tuple[Any, int, str]:
    """(the memory estimate of `cfg` on its devices (rlsim.whatif.memory; None: unknown), its engines, why unknown)."""
    if study.memory is None:
        return None, 1, ""
    P, G, _ = resolve_batch(study.reference, study.models, cfg)
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


def memory_fields(study: Study, cfg: WhatIf) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the Outcome's `fits` and `memory`, its memory warning, its memory notes)."""
    est, _, why = memory_of(study, cfg)
    warning = memory_warning(est)
    notes = [why] if why else []
    if est is not None and est.fits is None:
        notes.append(f"memory undecided: {PARTIAL}")
    if est is not None and study.memory is not None and study.memory.assumed:
        notes.append(study.memory.assumed)
    return {"fits": None if est is None else est.fits, "memory": memory_object(est, why)}, \
        [warning] if warning else [], notes


def prepare(traces: Sequence[Trace], *, rho_model: str = "auto", target: float | None = None,
            calibration: Sequence[Trace] = (), step_overhead_s: float | None = None,
            split_gain: float | None = None) -> Study:
    """Fit the reference trace (the first) once, and the learning curves of all traces. `calibration`:
    traces of `rlrun calibrate` (same model and device) whose calibration rows refit the step costs.
    `step_overhead_s`: an imported log's engine-step overhead prior (rlsim.replay.fit_steps; None: its default).
    `split_gain`: a split side's speed per device over the reference's (None: `sharing_gain`; 1: none)."""
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
                setup_warnings.append(f"{t.name} has {what} {b!r}, the reference {a!r}: its learning curve may not be "
                                      "comparable")
    curves = tuple(fit_learning_curve(t) for t in traces)
    if target is not None:
        _check_target(float(target), curves)
    # step costs fitted across the traces of the same setup (their batch sizes give the slopes a range)
    # (split-mode recordings give learning curves at their staleness limit, not step costs: see fit_trace)
    pooled = [ref] + [t for t in traces[1:] if same_setup(ref, t) and placement(t.config)["mode"] == "colocated"]
    models = fit_trace(pooled if len(pooled) > 1 else ref, calibration=list(calibration),
                       step_overhead_s=step_overhead_s)
    ratios = None if calibration else device_ratios(ref)  # one device's speed (a core on CPU), for splits
    one_models = device_models(models, ratios) if ratios else None
    reference = WhatIf(prompts=models.prompts, group=models.group, lr_rule=str(cfg.get("lr_rule") or "sqrt"))
    if not reference.prompts:
        raise RlsimError(f"{ref.path}: metadata config has no `prompts`; the trace was not written by `rlrun record`")
    noise = noise_scale(ref)
    warnings = list(models.warnings) + setup_warnings
    warnings += [w for t in traces for w in t.warnings]  # rows dropped by --drop-invalid
    warnings += [f"{t.name} was recovered from a partial recording ({t.meta.get('status')}): only its complete steps "
                 "are used"
                 for t in traces if t.recovered]
    ref_curve = curves[0]
    if target is None:
        # the best score the reference reached; with several traces, the best score all of them reached
        # (so that their samples-to-target can be compared)
        bests = [c.best for c in curves if len(c.score)]
        target = ((min(bests) if len(curves) > 1 and len(bests) == len(curves) else ref_curve.best)
                  if len(ref_curve.score) else math.nan)
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
                 rho_requested=rho_model, target=float(target),
                 n_star_ref=float(n_star) if n_star is not None else math.nan,
                 recorded_time_to_target_s=rec_t, warnings=tuple(warnings), notes=tuple(notes),
                 trace_names=tuple(t.name for t in traces),
                 b_crit_reps=b_crit_reps, hardware=dict(ref.meta.get("hardware") or {}), lr_aware=lr_aware,
                 framework=str((ref.meta.get("source") or {}).get("framework") or "rlrun"), device_models=one_models,
                 task=str(ref.config.get("task") or ""),
                 memory=trace_memory(ref.meta, recorded_mean_seq_len(ref.rows(STEP_STATS))),
                 recorded_mode={k: ref.config[k] for k in ("execution_mode", "mode_settings") if k in ref.config},
                 split_gain=sharing_gain(ref) if split_gain is None else _positive(split_gain, "split_gain"),
                 old_log_prob_share=old_log_prob_share(phase_seconds(ref)))


def sharing_gain(ref: Trace) -> float:
    """SPLIT_SHARING_GAIN where the reference shared its devices between generation and training on GPUs that
    trained data-parallel (a colocated run, or verl's hybrid replicas); 1 for a split recording and on CPU, whose
    one-device costs are measured (`rlsim.replay.device_speed`)."""
    mode, _ = recorded_mode(ref.config)
    spec = spec_of(mode)
    shared = spec is None or spec.devices != "split"
    return SPLIT_SHARING_GAIN if shared and data_parallel(ref.meta.get("hardware")) else 1.0


def _positive(v: float, what: str) -> float:
    if not isinstance(v, Real) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise RlsimError(f"{what} must be a positive number (1: a split side as fast per device as the reference), "
                         f"got {v!r}")
    return float(v)


def phase_seconds(trace: Trace) -> dict[str, float]:
    """Logged seconds per phase name over the trace (imported logs' phase rows; empty for rlrun traces)."""
    ph = trace.rows(PHASE) if trace.count(PHASE) else {}
    out: dict[str, float] = {}
    for n, d in zip(ph.get("phase", ()), ph.get("duration", ())):
        out[str(n)] = out.get(str(n), 0.0) + float(d)
    return out


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
    spread = (f"{100 * INTERVAL:.0f} % bootstrap over its updates {lo:.4g}..{hi:.4g}"
              if math.isfinite(lo) and math.isfinite(hi) else "too few updates for a bootstrap interval")
    return (f"rho from one trace rests on its gradient noise scale, B_crit {b_crit:.4g} responses ({spread}), which "
            "did not predict samples-to-target in rlsim's measured batch-size studies (docs/results.md): treat rho and "
            "the ranking as a guess, or record runs at two or more other batch sizes and add them with --trace (--rho "
            "curves)")


def _lr_aware(ref: LearningCurve, curves: Sequence[LearningCurve], target: float,
              params: tuple[float, float] | None) -> tuple[RhoModel, str, bool]:
    """The lr-aware model: B_bend and kappa as given, else fitted on the other traces' curves; a note on where they
    come from, and whether they are identified (two constants need runs at two other sizes or lrs)."""
    rule = ref.lr_rule or "sqrt"
    if params is not None:
        return (lr_aware_rho(ref.responses_per_update, *params, rule),
                f"lr-aware rho: B_bend = {params[0]:.4g}, kappa = {params[1]:.3g} as given", True)
    if len(curves) > 1 and math.isfinite(target):
        f = fit_lr_aware(ref, curves, target)
        src = f"fitted on {f.runs} runs"
        few = "; two constants from one run are not identified: add runs at more sizes" if f.runs < 2 else ""
        return lr_aware_rho(ref.responses_per_update, f.b_bend, f.kappa, rule, source=src), \
            (f"lr-aware rho: B_bend = {f.b_bend:.4g} responses, kappa = {f.kappa:.3g} {src} (squared log error "
             f"{f.loss:.3g}){few}"), \
            f.runs >= 2
    if len(curves) > 1:
        raise RlsimError(f"{setting(rho_model='lr-aware')} is fitted where the runs reach a target score, and the "
                         "reference trace has no eval rows: record it with evals (rlrun's --eval-every), or give "
                         f"{name('bend_batch')} and {name('kappa')}")
    raise RlsimError(f"{setting(rho_model='lr-aware')} needs its two constants: pass runs at other batch sizes or lrs "
                     f"with {name('trace')} to fit them, or give {name('bend_batch')} and {name('kappa')} (they are "
                     "the task's: one task's fit did not transfer to another, docs/results.md)")


@functools.lru_cache(maxsize=32)
def simulate_reference(study: Study, cfg: WhatIf) -> SimRun:
    # Study is eq=False, so the cache is keyed by the object: a sweep worker simulates each reference
    # configuration (updates, seed, hardware) once for all its configs
    return simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(cfg.seed))


def same_setup(a: Trace, b: Trace) -> bool:
    """Same algorithm, model, device and engine limits: step costs may be fitted across the two."""
    def key(t: Trace):
        e, h, m = t.meta.get("engine") or {}, t.meta.get("hardware") or {}, t.meta.get("model") or {}
        return (t.config.get("algo"), m.get("name"), h.get("device_name"), e.get("max_num_seqs"),
                e.get("kv_cache_tokens"))
    return key(a) == key(b)


def fit_check(study: Study) -> FitCheck:
    """The fit-quality rule (`rlsim.replay.fit_quality`) on the reference's cost fits."""
    return check_fits(study.models.validation, len(study.models.recorded.step))
