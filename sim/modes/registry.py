"""Execution modes in one registry, and `simulate`: one simulation of a resolved `SimConfig` in the mode it asks for.

A mode is registered with `register_mode(name, devices=, settings=, configure=, source=)`: its simulation function
(models, cfg, rng=, record_timeline=, **options) -> SimRun, where it places generation and training (`devices`:
colocated, split devices, or hybrid replicas on the training devices), the `WhatIf` fields it reads (`settings`,
in the framework's own names), how they become the shared split model's parameters (`configure`: WhatIf ->
`SplitConfig` fields) and the file its semantics were read from (`source`). `mode_of(cfg)` names the mode a
SimConfig asks for; `check(cfg)` refuses a WhatIf whose mode, devices or settings do not go together, with the fix.

Registered: `colocated` (`rlsim.core.pipeline.simulate`) and, all as parameters of the one split model
(`rlsim.modes.split.simulate_split`: replica, trainer, gate, sync processes), `split`, `areal`, `nemo_async`,
`one_step_off`, `fully_async`, `colocate_async`, `separate_async` and `separate_async_switch` (docs/simulator.md
states each).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping

import numpy as np

from rlsim.core import pipeline
from rlsim.core.config import SimConfig, SplitConfig, WhatIf
from rlsim.core.pipeline import SimRun
from rlsim.modes.split import simulate_split, split_config as split_of
from rlsim.replay.errors import RlsimError, name, setting
from rlsim.replay.models import FittedModels

Mode = Callable[..., SimRun]
DEVICES = ("colocated", "split", "hybrid")
# the settings every mode leaves alone; the others belong to the modes that name them
GENERAL = {f.name for f in fields(WhatIf)} - {
    "staleness", "partial_rollout", "staleness_threshold", "trigger_parameter_sync_step", "require_batches",
    "num_warmup_batches", "parameter_sync_step", "max_off_policy_threshold", "max_off_policy_strategy",
    "max_head_offpolicyness", "max_trajectory_age_steps", "switch_threshold_ratio", "in_flight_weight_updates",
    "recompute_kv_cache_after_weight_updates", "concurrent_samples_per_replica",
    "max_concurrent_rollouts"}


@dataclass(frozen=True)
class ModeSpec:
    """One registered execution mode."""

    name: str
    simulate: Mode
    devices: str = "colocated"           # colocated | split (--gen-gpus and --train-gpus) | hybrid (--train-gpus)
    settings: tuple[str, ...] = ()       # the WhatIf fields it reads beyond the general ones
    configure: Callable[[WhatIf], dict] | None = None  # WhatIf -> SplitConfig fields
    source: str = ""                     # repository, path and commit its semantics were read from
    fixed: tuple[tuple[str, Any], ...] = ()  # (WhatIf field, value) its framework always runs with: given so, accepted


MODES: dict[str, ModeSpec] = {}


def register_mode(name: str, *, devices: str = "colocated", settings: tuple[str, ...] = (),
                  configure: Callable[[WhatIf], dict] | None = None, source: str = "",
                  fixed: dict[str, Any] | None = None) -> Callable[[Mode], Mode]:
    """Decorator: register a simulation function as execution mode `name`."""
    def deco(fn: Mode) -> Mode:
        if name in MODES:
            raise ValueError(f"execution mode {name!r} is registered twice")
        if devices not in DEVICES:
            raise ValueError(f"execution mode {name!r}: devices must be one of {DEVICES}, got {devices!r}")
        MODES[name] = ModeSpec(name, fn, devices, tuple(settings), configure, source, tuple((fixed or {}).items()))
        return fn
    return deco


# a framework's own name for a registered mode, as its users say it -> that mode
ALIASES = {"sync": "colocated"}  # verl V1 trainer.v1.trainer_mode=sync: the synchronous colocated loop


def spec_of(mode: str | None) -> ModeSpec | None:
    """The registered mode a name (or a framework's alias) stands for; None for no name or an unknown one."""
    return MODES.get(ALIASES.get(mode, mode)) if mode else None


def resolved(cfg: WhatIf) -> str:
    """The registered mode a WhatIf asks for: its `mode` (an alias read as its mode), else split with split devices,
    else colocated."""
    m = cfg.mode or ("split" if cfg.split else "colocated")
    return ALIASES.get(m, m)


def check(cfg: WhatIf) -> None:
    """Refuse a WhatIf whose mode is not registered, whose devices do not fit its mode, or that gives a setting its
    mode does not read; one line with the fix."""
    m = resolved(cfg)
    if m not in MODES:
        raise RlsimError(f"{name('mode')} {m!r} is not an execution mode; registered: {', '.join(MODES)} (and "
                         f"{', '.join(f'{a} = {b}' for a, b in ALIASES.items())})")
    spec = MODES[m]
    fixed = dict(spec.fixed)
    for f in fields(WhatIf):
        v = getattr(cfg, f.name)
        if f.name in fixed and v is not None and v is not False:
            if v == fixed[f.name]:
                continue
            how = (f"never uses {name(f.name)}" if fixed[f.name] is False else
                   f"always runs with {setting(**{f.name: fixed[f.name]})}")
            raise RlsimError(f"{setting(mode=m)} {how} (its framework's own semantics): drop {name(f.name)}")
        if f.name in GENERAL or f.name in spec.settings or v is None or v is False:
            continue
        takers = [s.name for s in MODES.values() if f.name in s.settings]
        raise RlsimError(f"{name(f.name)} applies to {name('mode')} {' | '.join(takers)}, not {m}; drop it or add "
                         f"{setting(mode=takers[0])}")
    if cfg.mode is None:
        return
    if spec.devices == "colocated" and cfg.split:
        raise RlsimError(f"{setting(mode=m)} runs generation and training on the same devices: drop "
                         f"{name('gen_gpus')}/{name('train_gpus')} (use {name('gpus')}) or pick a split mode")
    if spec.devices == "split" and (cfg.gen_gpus is None or cfg.train_gpus is None):
        raise RlsimError(f"{setting(mode=m)} places generation and training on separate devices: add "
                         f"{setting(gen_gpus='N', train_gpus='M')}")
    if spec.devices == "hybrid" and (cfg.train_gpus is None or cfg.gen_gpus is not None):
        raise RlsimError(f"{setting(mode=m)} runs its rollout replicas on the training devices: give "
                         f"{setting(train_gpus='N')} and no {name('gen_gpus')}")
    k = (spec.configure(cfg) if spec.configure else {}).get("chunks", 1)
    if cfg.prompts is not None and cfg.prompts % k:  # else checked once the trace gives P (SplitConfig.validate)
        raise RlsimError(f"{m}: P = {cfg.prompts} prompts per step do not split into {k} equal trainer fetches (PPO "
                         f"mini-batches); pick {name('prompts')} a multiple of {k}")
    if spec.devices != "colocated" and (cfg.gpus is not None or cfg.gen_batch is not None):
        bad = "gpus" if cfg.gpus is not None else "gen_batch"
        raise RlsimError(f"{name(bad)} does not apply to {setting(mode=m)}: it places its devices by "
                         f"{name('gen_gpus')}/{name('train_gpus')} and generates B per step; drop {name(bad)}")


def recorded_mode(config: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the execution mode, its settings and devices as WhatIf fields) that a trace's `config` records: an imported
    framework log's `execution_mode` and `mode_settings` (rlsim.replay.importers); (None, {}) where none is."""
    m = config.get("execution_mode")
    return (str(m), dict(config.get("mode_settings") or {})) if m else (None, {})


def as_recorded(cfg: WhatIf, config: Mapping[str, Any]) -> tuple[WhatIf, str]:
    """`cfg`, validated and checked, asking about the execution mode the reference trace's `config` records where it
    names no mode itself, as if named: the recorded settings and devices fill the fields `cfg` leaves unset (so one
    device count given alone overrides its own). Returns it with the one output line that says so ('' where `cfg`
    names a mode or the trace records none: `cfg` as given)."""
    m, recorded = recorded_mode(config)
    spec = spec_of(m)
    if cfg.mode is not None or spec is None or (spec.devices == "colocated" and cfg.split):  # split devices: split
        cfg.validate()
        check(cfg)
        return cfg, ""
    own = set(spec.settings) | ({"gen_gpus", "train_gpus"} if spec.devices != "colocated" else set())
    fill = {k: v for k, v in recorded.items() if k in own and getattr(cfg, k) in (None, False)}
    out = replace(cfg, mode=m, **fill)
    if spec.devices != "colocated" and not cfg.split and (out.train_gpus is None or (
            spec.devices == "split" and out.gen_gpus is None)):
        need = setting(train_gpus="N", **({} if spec.devices == "hybrid" else {"gen_gpus": "M"}))
        cfg.validate()
        check(cfg)
        return cfg, f"mode: {resolved(cfg)}; the trace records {m} but not its devices: add {need} to ask it"
    given = setting(mode=m, **fill)
    try:
        out.validate()
        check(out)
    except RlsimError as e:
        raise RlsimError(f"{e} (the trace records {given}, asked where no {name('mode')} is given; "
                         f"{setting(mode='colocated')} asks the colocated loop)") from None
    if spec.devices == "colocated":
        return out, f"mode: {m} (from the trace{'; the colocated loop' if m != 'colocated' else ''})"
    return out, f"mode: {m} (from the trace: {given}; {setting(mode='colocated')} to compare)"


def split_config(cfg: WhatIf, models: FittedModels, hardware: dict | None) -> SplitConfig | None:
    """The SplitConfig the WhatIf's mode asks for (None: the colocated loop)."""
    spec = MODES[resolved(cfg)]
    if spec.devices == "colocated":
        return None
    extra = dict(spec.configure(cfg)) if spec.configure else {}
    if spec.devices == "hybrid":
        extra.update(gen_gpus=int(cfg.train_gpus), hybrid=True)
    return split_of(cfg, models, hardware, mode=spec.name, **extra)


@register_mode("colocated", source="rlsim's synchronous loop (verl trainer.v1.trainer_mode=sync, main_ppo)")
def _colocated(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
               round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    return pipeline.simulate(models, cfg, rng=rng, record_timeline=record_timeline, round_by_round=round_by_round,
                             max_rounds=max_rounds)


def _split_mode(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
                max_rounds: int | None = None, head: int | None = None, **_colocated_only: Any) -> SimRun:
    return simulate_split(models, cfg, rng=rng, record_timeline=record_timeline, max_rounds=max_rounds, head=head)


VERL = "volcengine/verl"
VERL_V1 = "verl-project/verl docs/advance/v1_async_trainer.md @1b86216e1f70195d69f406c84a5a91963c50543e"
FULLY_ASYNC = (f"{VERL} docs/advance/fully_async.md @b178a3cd56f58b2d502255daba591e92833930a7; rewards: "
               "verl-project/verl verl/experimental/fully_async_policy/fully_async_rollouter.py (agent reward loop) "
               "and verl/experimental/separation/ray_trainer.py _fit_compute_reward @1dda039b; prompts in flight: "
               "fully_async_rollouter.py max_concurrent_samples, _processor_worker @1dda039b")
ONE_STEP = f"{VERL} docs/advance/one_step_off.md @b178a3cd56f58b2d502255daba591e92833930a7"
NEMO = ("NVIDIA-NeMo/RL docs/guides/async-grpo.md @0f8bce6422931dc26d80fdad6a8dafb164682b2b; rewards: "
        "nemo_rl/algorithms/async_utils/trajectory_collector.py (the environments in the rollout) @7ea279ab")
AREAL = ("inclusionAI/AReaL areal/core/staleness_manager.py @08911ddf, areal/core/workflow_executor.py @0db3083b "
         "(Fu et al. 2025, arXiv 2505.24298); rewards: areal/workflow/rlvr.py arun_episode @4aef98d8; rollouts in "
         "flight: areal/infra/staleness_manager.py get_capacity, areal/api/cli_args.py max_concurrent_rollouts "
         "@4aef98d8")


def _v1(cfg: WhatIf) -> dict:
    """verl V1's replay buffer: num_warmup_batches dispatched ahead, one refill per prompt trained or dropped;
    partial rollout always on; max_off_policy_threshold with drop or wait."""
    t = 8 if cfg.max_off_policy_threshold is None else cfg.max_off_policy_threshold
    return dict(staleness=float(1.0 if cfg.num_warmup_batches is None else cfg.num_warmup_batches), refill=True,
                fifo=True, partial_rollout=True, off_policy=int(t),
                off_policy_wait=cfg.max_off_policy_strategy == "wait")


# verl fully_async's rollouter keeps at most (replicas x this) prompts in flight, each until its last response
# finishes (async_training.concurrent_samples_per_replica); rlsim gives each replica its share
VERL_SAMPLES_PER_REPLICA = 16


def _fully_async(cfg: WhatIf) -> dict:
    s = float(cfg.staleness_threshold or 0.0)
    if cfg.partial_rollout and s == 0:
        raise RlsimError(f"{name('partial_rollout')} takes effect only with {name('staleness_threshold')} > 0 (verl "
                         f"fully_async): add {setting(staleness_threshold=0.5)} or drop {name('partial_rollout')}")
    return dict(staleness=s, fifo=True, chunks=int(cfg.trigger_parameter_sync_step or 1),
                partial_rollout=bool(cfg.partial_rollout), reward_in_rollout=True,
                inflight=int(cfg.concurrent_samples_per_replica or VERL_SAMPLES_PER_REPLICA))


register_mode("split", devices="split", settings=("staleness", "partial_rollout"),
              source="rlsim.replay.admission: AReaL's gate, consumed by rlsim's deadline rule")(_split_mode)
register_mode("areal", devices="split", source=AREAL,
              settings=("max_head_offpolicyness", "partial_rollout", "max_concurrent_rollouts"),
              configure=lambda c: dict(
                  staleness=float(c.max_head_offpolicyness or 0), fifo=True, oldest=True,
                  partial_rollout=bool(c.partial_rollout), reward_in_rollout=True,
                  inflight_total=int(c.max_concurrent_rollouts or c.prompts or 0)))(_split_mode)
register_mode("nemo_async", devices="split", source=NEMO,
              settings=("max_trajectory_age_steps", "in_flight_weight_updates",
                        "recompute_kv_cache_after_weight_updates"),
              configure=lambda c: dict(staleness=float(c.max_trajectory_age_steps or 1),
                                       partial_rollout=bool(c.in_flight_weight_updates),
                                       recompute=bool(c.recompute_kv_cache_after_weight_updates),
                                       reward_in_rollout=True))(_split_mode)
register_mode("one_step_off", devices="split", source=ONE_STEP, fixed=dict(staleness=1.0, partial_rollout=False),
              configure=lambda c: dict(staleness=1.0, partial_rollout=False))(_split_mode)
register_mode("fully_async", devices="split", source=FULLY_ASYNC, configure=_fully_async,
              settings=("staleness_threshold", "trigger_parameter_sync_step", "require_batches", "partial_rollout",
                        "concurrent_samples_per_replica"))(
    _split_mode)
V1_FIXED = dict(partial_rollout=True)  # V1 resumes every aborted generation (its partial-rollout client)
register_mode("colocate_async", devices="hybrid", source=VERL_V1, configure=_v1, fixed=V1_FIXED,
              settings=("num_warmup_batches", "max_off_policy_threshold", "max_off_policy_strategy"))(_split_mode)
V1_SEPARATE = ("num_warmup_batches", "parameter_sync_step", "max_off_policy_threshold", "max_off_policy_strategy")
register_mode("separate_async", devices="split", source=VERL_V1, settings=V1_SEPARATE, fixed=V1_FIXED,
              configure=lambda c: dict(_v1(c), chunks=int(c.parameter_sync_step or 1)))(_split_mode)
register_mode("separate_async_switch", devices="split", source=VERL_V1, fixed=V1_FIXED,
              settings=V1_SEPARATE + ("switch_threshold_ratio",),
              configure=lambda c: dict(_v1(c), chunks=int(c.parameter_sync_step or 1),
                                       switch_ratio=float(c.switch_threshold_ratio or 0.4)))(_split_mode)


def mode_of(cfg: SimConfig) -> str:
    """The execution mode `cfg` asks for."""
    return cfg.split.mode if cfg.split is not None else "colocated"


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
             round_by_round: bool | None = None, max_rounds: int | None = None, head: int | None = None) -> SimRun:
    """Simulate `cfg.updates` RL steps with the fitted models in the config's mode; deterministic given the rng
    state. round_by_round applies to the colocated loop only (`rlsim.core.pipeline.simulate`); max_rounds bounds the
    distinct rounds (colocated) or updates (split modes, `rlsim.modes.split.simulate_split`) simulated; head (split
    modes only) ends the run after its first `head` updates."""
    name_ = mode_of(cfg)
    if name_ not in MODES:
        raise RlsimError(f"no execution mode {name_!r}; registered: {', '.join(MODES)}")
    extra = {} if head is None else {"head": head}
    return MODES[name_].simulate(models, cfg, rng=rng, record_timeline=record_timeline, round_by_round=round_by_round,
                                 max_rounds=max_rounds, **extra)
