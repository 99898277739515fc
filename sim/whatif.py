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
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import FittedModels, fit_trace
from rlsim.replay.io import Trace
from rlsim.replay.learning import (RHO_MODELS, LearningCurve, NoiseScale, RhoModel, curves_rho, fit_learning_curve,
                             invariant_rho, noise_scale, noise_scale_rho, regime)
from rlsim.replay.schema import EVAL
from rlsim.replay.util import ENGINE_DEFAULTS
from rlsim.config import EngineConfig, SimConfig, WhatIf
from rlsim.pipeline import SimRun, simulate

CONCURRENCY_EXTRAPOLATION = 16.0  # warn beyond this multiple of the measured concurrency


@dataclass(frozen=True, eq=False)
class Outcome:
    """One configuration's predicted throughput, sample cost and time-to-target."""

    prompts: int = field(metadata={"help": "P"})
    group: int = field(metadata={"help": "G"})
    batch: int = field(metadata={"help": "B = P x G responses per update"})
    lr_rule: str = field(metadata={"help": "learning-rate rule"})
    responses_per_s: float = field(metadata={"help": "simulated end-to-end responses per second (q)"})
    step_time_s: float = field(metadata={"help": "mean seconds per RL step"})
    gen_s: float = field(metadata={"help": "mean generation seconds per step"})
    train_s: float = field(metadata={"help": "mean training seconds per step (batch preparation + update)"})
    sync_s: float = field(metadata={"help": "mean weight-sync seconds per step"})
    other_s: float = field(metadata={"help": "mean seconds of rewards and the rest of the step"})
    idle_s: float = field(metadata={"help": "mean seconds the device neither generates, trains nor syncs (colocated: = other_s)"})
    sigma: float = field(metadata={"help": "throughput gain q / q_ref"})
    rho: float = field(metadata={"help": "sample cost N* / N*_ref"})
    rho_model: str = field(metadata={"help": "rho model used: invariant | noise-scale | curves"})
    time_to_target_ratio: float = field(metadata={"help": "T / T_ref = rho / sigma"})
    time_to_target_s: float = field(metadata={"help": "predicted training seconds to the target (nan without evals reaching it)"})
    regime: str = field(metadata={"help": "time falls | flat | time rises (vs the reference, 5% band)"})
    updates: int = field(metadata={"help": "updates simulated"})
    gen_steps: float = field(metadata={"help": "mean engine steps per generation round"})
    peak_running: int = field(metadata={"help": "most concurrent sequences in the simulation"})
    preemptions: float = field(metadata={"help": "mean requests preempted per round (KV cache full)"})
    seed: int = field(metadata={"help": "seed of the length sampling"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "extrapolation and model warnings"})

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "warnings"}
        d["warnings"] = "; ".join(self.warnings)
        return {k: (float(v) if isinstance(v, (np.floating,)) else int(v) if isinstance(v, np.integer) else v) for k, v in d.items()}


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
    trace_names: tuple[str, ...] = field(default=(), metadata={"help": "names of the traces"})

    @property
    def b_ref(self) -> int:
        return int(self.reference.prompts * self.reference.group)

    def reference_run(self, updates: int, seed: int) -> SimRun:
        """The reference configuration simulated for `updates` updates with length seed `seed`."""
        return _reference_run(self, updates, seed)

    def rho_for(self, b: float, lr_rule: str) -> tuple[float, str, list[str]]:
        """(rho, model used, notes) at batch b with lr rule `lr_rule`."""
        notes: list[str] = []
        kind = self.rho_requested
        ref_rule = self.reference.lr_rule
        model: RhoModel | None = None
        if kind in ("curves", "auto"):
            same = [c for i, c in enumerate(self.curves) if i == 0 or c.lr_rule == lr_rule or c.batch == self.b_ref]
            try:
                model = curves_rho(self.b_ref, same, self.target)
            except RlsimError as e:
                if kind == "curves":
                    raise
                if len(self.curves) > 1:
                    notes.append(f"learning curves not used ({e})")
                model = None
        if model is None and kind in ("noise-scale", "auto"):
            try:
                model = noise_scale_rho(self.b_ref, self.noise.b_crit)
            except RlsimError:
                if kind == "noise-scale":
                    raise
        if model is None:
            model = invariant_rho(self.b_ref)
        if lr_rule == "fixed" and b > self.b_ref and model.kind != "curves":
            notes.append(f"--lr-rule fixed beyond the reference batch needs learning curves (record runs with a fixed lr at larger "
                         f"batches and pass them with --trace); rho from the {model.kind} model assumes a rescaled lr and is "
                         "optimistic (the article measured 1.5-1.67x more responses at 2x batch with a fixed lr)")
        elif lr_rule != ref_rule and b != self.b_ref and model.kind != "curves":
            notes.append(f"lr rule {lr_rule} differs from the trace's ({ref_rule}); the {model.kind} rho model ignores the rule")
        notes += model.notes(b)
        return float(model.rho(b)), model.kind, notes


def _resolve(study_ref: WhatIf | None, models: FittedModels, cfg: WhatIf) -> tuple[int, int, str]:
    ref_p = study_ref.prompts if study_ref else models.prompts
    ref_g = study_ref.group if study_ref else models.group
    ref_r = study_ref.lr_rule if study_ref else str(models.config.get("lr_rule") or "sqrt")
    return (cfg.prompts or ref_p, cfg.group or ref_g, cfg.lr_rule or ref_r)


def sim_config(study: Study, cfg: WhatIf, *, lengths: str = "sampled") -> SimConfig:
    cfg.validate()
    P, G, _ = _resolve(study.reference, study.models, cfg)
    if study.algo == "grpo" and G < 2:
        raise RlsimError(f"GRPO needs a group of at least 2 responses per prompt (group-relative advantages), got --group {G}")
    eng = replace(study.engine, max_num_seqs=cfg.max_num_seqs or study.engine.max_num_seqs,
                  kv_cache_tokens=cfg.kv_cache_tokens or study.engine.kv_cache_tokens)
    if cfg.gen_batch is not None:
        gen_batch = cfg.gen_batch
    else:
        gen_batch = int(round(P * G * study_gen_ratio(study.models)))
    if gen_batch < P * G:
        if cfg.gen_batch is not None:
            raise RlsimError(f"--gen-batch {gen_batch} is smaller than the train batch B = P x G = {P * G}; generate at least B responses per update")
        gen_batch = P * G
    return SimConfig(prompts=P, group=G, updates=cfg.updates, engine=eng, lengths=lengths,
                     gen_batch=gen_batch if gen_batch > P * G else 0)


def study_gen_ratio(models: FittedModels) -> float:
    """B_gen / B of the recorded run (over-generation; 1.0 when none)."""
    c = models.config
    b = (c.get("prompts") or 0) * models.group
    gen = c.get("gen_responses") or c.get("gen_batch") or b
    return float(gen) / b if b else 1.0


def _engine_of(models: FittedModels) -> EngineConfig:
    e = models.engine
    return EngineConfig(max_num_seqs=int(e["max_num_seqs"]), kv_cache_tokens=int(e["kv_cache_tokens"]),
                        block_size=int(e.get("block_size") or ENGINE_DEFAULTS["block_size"]),
                        max_model_len=int(e.get("max_model_len") or ENGINE_DEFAULTS["max_model_len"]))


def prepare(traces: Sequence[Trace], *, rho_model: str = "auto", target: float | None = None) -> Study:
    """Fit the reference trace (the first) once, and the learning curves of all traces."""
    traces = list(traces)
    if not traces:
        raise RlsimError("pass at least one --trace")
    if rho_model not in RHO_MODELS:
        raise RlsimError(f"--rho must be one of {', '.join(RHO_MODELS)}, got {rho_model!r}")
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
    # step costs fitted across the traces of the same setup (their batch sizes give the slopes a range)
    pooled = [ref] + [t for t in traces[1:] if same_setup(ref, t)]
    models = fit_trace(pooled if len(pooled) > 1 else ref)
    reference = WhatIf(prompts=models.prompts, group=models.group, lr_rule=str(cfg.get("lr_rule") or "sqrt"))
    if not reference.prompts:
        raise RlsimError(f"{ref.path}: metadata config has no `prompts`; the trace was not written by `rlrun record`")
    curves = tuple(fit_learning_curve(t) for t in traces)
    noise = noise_scale(ref)
    warnings = list(models.warnings) + setup_warnings
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
        warnings.append(f"the reference's first eval already reaches {target:.4g}: pass a higher --target for a time-to-target")
        n_star = None
    elif n_star is None:
        if math.isfinite(target) and len(ref_curve.score):
            warnings.append(f"the reference never reached the target {target:.4g} (best {ref_curve.best:.4g}): no absolute time-to-target")
        elif not len(ref_curve.score):
            warnings.append("the reference trace has no eval rows: no absolute time-to-target")
    rec_t = math.nan
    if n_star is not None:
        ev = ref.rows(EVAL)
        hit = np.nonzero(ev["score"] >= target - 1e-12)[0]
        if len(hit):
            rec_t = float(ev["t_start"][hit[0]])
    if rho_model == "curves" and len(traces) < 2:
        raise RlsimError("--rho curves needs two or more traces at different batch sizes (repeat --trace)")
    return Study(models=models, reference=reference, engine=_engine_of(models), algo=algo, curves=curves, noise=noise,
                 rho_requested=rho_model, target=float(target), n_star_ref=float(n_star) if n_star is not None else math.nan,
                 recorded_time_to_target_s=rec_t, warnings=tuple(warnings), trace_names=tuple(t.name for t in traces))


@functools.lru_cache(maxsize=16)
def _reference_run(study: Study, updates: int, seed: int) -> SimRun:
    # Study is eq=False, so the cache is keyed by the object: a sweep worker simulates each
    # (updates, seed) of the reference once for all its configs
    cfg = replace(study.reference, updates=updates, seed=seed)
    return simulate(study.models, sim_config(study, cfg), rng=np.random.default_rng(seed))


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
    warnings: list[str] = []
    if reference:
        sigma, rho, kind = 1.0, 1.0, "reference"
    else:
        sigma = q / study.reference_run(cfg.updates, cfg.seed).responses_per_s
        rho, kind, notes = study.rho_for(B, rule)
        warnings += notes
    ratio = rho / sigma
    t_abs = rho * study.n_star_ref / q if math.isfinite(study.n_star_ref) else math.nan
    if not reference and study.models.update.quality.method == "proportional" and not (2 / 3 <= B / study.b_ref <= 1.5):
        warnings.append("training time is extrapolated in proportion to tokens from one batch size (a fixed per-update "
                        "cost cannot be separated from one trace); pass traces at other batch sizes (--trace) to fit it")
    measured = max(study.models.max_concurrency, 1)
    peak = int(run_.peak_running.max())
    if not reference and peak > CONCURRENCY_EXTRAPOLATION * measured:
        warnings.append(f"{peak} concurrent sequences is more than {CONCURRENCY_EXTRAPOLATION:g}x the measured {measured}: "
                        "the step-cost model is extrapolated")
    if run_.preemptions.sum() > 0:
        warnings.append(f"past KV-cache capacity ({run_.peak_kv_tokens.max():.0f} tokens needed of "
                        f"{sim_config(study, cfg).engine.kv_cache_tokens}): {run_.preemptions.mean():.1f} preemptions per round, recomputed")
    step = run_.mean_step_time
    gen, train, syn, oth = (float(run_.gen_time.mean()), float(run_.train_time.mean()), float(run_.sync_time.mean()),
                            float(run_.other_time.mean()))
    return Outcome(prompts=P, group=G, batch=B, lr_rule=rule, responses_per_s=q, step_time_s=step, gen_s=gen, train_s=train,
                   sync_s=syn, other_s=oth, idle_s=max(step - gen - train - syn, 0.0), sigma=sigma, rho=rho, rho_model=kind,
                   time_to_target_ratio=ratio, time_to_target_s=t_abs, regime="reference" if reference else regime(ratio),
                   updates=int(len(run_.step_time)), gen_steps=float(run_.gen_steps.mean()), peak_running=peak,
                   preemptions=float(run_.preemptions.mean()), seed=cfg.seed, warnings=tuple(warnings))


def evaluate(study: Study, cfg: WhatIf) -> Outcome:
    """Simulate one candidate and compare it with the reference. Pure and deterministic."""
    run_ = simulate(study.models, sim_config(study, cfg), rng=np.random.default_rng(cfg.seed))
    return _outcome(study, cfg, run_)


def reference_outcome(study: Study, updates: int = 100, seed: int = 0) -> Outcome:
    """The reference configuration's own outcome (sigma = rho = 1) for `updates` updates, seed `seed`."""
    cfg = replace(study.reference, updates=updates, seed=seed)
    return _outcome(study, cfg, study.reference_run(updates, seed), reference=True)


def timeline(study: Study, cfg: WhatIf) -> SimRun:
    """The candidate simulated with its timeline recorded (Gantt charts, Perfetto export)."""
    return simulate(study.models, sim_config(study, cfg), rng=np.random.default_rng(cfg.seed), record_timeline=True)


@dataclass(frozen=True, eq=False)
class RunResult:
    """`rlsim run`: the reference and the candidate."""

    reference: Outcome = field(metadata={"help": "the trace's own configuration, simulated"})
    candidate: Outcome = field(metadata={"help": "the configuration asked for"})
    rho_model: str = field(metadata={"help": "rho model used for the candidate"})
    target: float = field(metadata={"help": "eval score defining time-to-target"})
    n_star_ref: float = field(metadata={"help": "reference responses to reach the target (nan if never)"})
    b_crit: float = field(metadata={"help": "gradient noise scale of the reference (actor), responses"})
    recorded_time_to_target_s: float = field(metadata={"help": "wall seconds at which the reference's evals reached the target"})
    warnings: tuple[str, ...] = field(metadata={"help": "fit and learning-model warnings"})
    b_crit_critic: float = field(default=math.nan, metadata={"help": "gradient noise scale of the PPO value model"})
    recorded_responses_per_s: float = field(default=math.nan, metadata={"help": "median responses/s over the trace's updates"})
    recorded_step_time_s: float = field(default=math.nan, metadata={"help": "median step time over the trace's updates"})

    def to_dict(self) -> dict[str, Any]:
        d = self.candidate.to_dict()
        d.update(rho_model=self.rho_model, target=self.target, n_star_ref=self.n_star_ref, b_crit=self.b_crit,
                 b_crit_critic=self.b_crit_critic, recorded_responses_per_s=self.recorded_responses_per_s,
                 recorded_step_time_s=self.recorded_step_time_s,
                 recorded_time_to_target_s=self.recorded_time_to_target_s,
                 warnings=list(self.warnings) + list(self.candidate.warnings),
                 reference=self.reference.to_dict())
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def run(traces: Sequence[Trace], cfg: WhatIf, *, rho_model: str = "auto", target: float | None = None) -> RunResult:
    cfg.validate()
    study = prepare(traces, rho_model=rho_model, target=target)
    cand = evaluate(study, cfg)
    ref = reference_outcome(study, cfg.updates, cfg.seed)
    rec = study.models.recorded
    return RunResult(reference=ref, candidate=cand, rho_model=cand.rho_model, target=study.target, n_star_ref=study.n_star_ref,
                     b_crit=study.noise.b_crit, recorded_time_to_target_s=study.recorded_time_to_target_s, warnings=study.warnings,
                     b_crit_critic=study.noise.critic_b_crit,
                     recorded_responses_per_s=float(np.median(rec.responses_per_s)) if len(rec.step) else math.nan,
                     recorded_step_time_s=float(np.median(rec.step_time)) if len(rec.step) else math.nan)
