"""Split devices and asynchronous rollout with a staleness limit: a SimPy model at engine-step granularity.

`rlsim.modes.registry.simulate` runs a `SimConfig` with a `split` (`--gen-gpus`, `--train-gpus`, `--staleness`,
`--partial-rollout`) here, `simulate_split`, and one without it in the colocated loop (`rlsim.core.pipeline`).

- Generation: gen_gpus / gen_tp replicas, each a tensor-parallel group (`rlsim.replay.rollout_costs`) running the
  recorded engine at that size, pulling prompts of G sequences from one shared queue.
- Admission (AReaL's rule, eta = `staleness`, `rlsim.replay.admission`): a prompt starts only while prompts
  started, in-flight ones counted, stay under (eta + v + 1) · P at policy version v.
- Trainer: update u consumes P finished groups so that no sample lags more than ceil(eta) versions, then the
  fitted prep and update on each of the `train_gpus` data-parallel ranks and a ring all-reduce.
- Weight sync: one collective of the trainer and every replica (fitted, or by --weight-sync PATH); with partial
  rollout in-flight responses continue on the new weights, their KV recomputed.

Outputs (SimRun): per-update phase times, the generator and trainer idle ratios and the staleness of consumed
samples. One process per replica (`rlsim.modes.replica`) and one for the trainer (`rlsim.modes.trainer`); they
share the requests' arrays, the gate and finished pool (`rlsim.modes.requests`), the sync (`rlsim.modes.sync`)
and the timeline (`rlsim.modes.timeline`); the rng is passed in. The model, its formulas and its evidence:
docs/simulator.md, "Split devices and asynchronous rollout".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import simpy

from rlsim.modes.replica import EngineTotals, Replica, ReplicaSpec
from rlsim.modes.requests import AdmissionGate, FinishedGroups, Requests, queue_lengths
from rlsim.modes.sync import WeightSync
from rlsim.modes.timeline import Recorder
from rlsim.modes.trainer import Trainer, TrainerCosts
from rlsim.core.config import SimConfig, SplitConfig, WhatIf
from rlsim.core.engine import KvCache
from rlsim.core.pipeline import BYTES_PER_TIMELINE_STEP, MEMORY_LIMIT_BYTES, SimRun, SplitResult
from rlsim.replay.admission import admitted
from rlsim.replay.devices import profile_for_hardware
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels
from rlsim.replay.rollout_costs import weight_sync_seconds
from rlsim.replay.util import is_count

# per-sequence arrays of a split run (14 x 8 bytes: `Requests`), all of the run's requests at once
BYTES_PER_SEQUENCE = 112
# A split run of more than STEADY_REQUESTS responses in all (U x B) stops once the mean time of its updates past the
# first (which holds the pipeline's fill) is known within STEADY_ERROR (`steady_enough`), and repeats the updates
# after the first in turn for the rest (`steady_run`), as the colocated loop reuses rounds. How noisy the updates are
# depends on the mode and the batch, not only on the responses simulated, so the stop reads the run's own spread:
# batch means over STEADY_BLOCKS blocks of consecutive updates (two or more each, for their autocorrelation), a
# two-sided 99 % t interval (STEADY_T, 4 degrees of freedom). Checked by `python -m bench.split_ends --steady`.
STEADY_REQUESTS = 1 << 17
STEADY_ERROR = 0.01
STEADY_BLOCKS = 5
STEADY_T = 4.604
STEADY_UPDATES = 1 + 2 * STEADY_BLOCKS  # the fewest updates a run stops at


def interconnect(models: FittedModels, hardware: dict | None) -> tuple[float, str]:
    """(GB/s, source) of the device interconnect: the (rescaled) models' hardware, else the trace's, by its
    `interconnect_gbs` or its device profile; (0, '') when none is known."""
    hw = (models.config.get("hardware") if isinstance(models.config, dict) else None) or hardware or {}
    v = hw.get("interconnect_gbs")
    if v:
        src = f"device profile {hw['profile']}" if hw.get("profile") else "trace metadata hardware.interconnect_gbs"
        return float(v), src
    try:
        prof = profile_for_hardware(hw)
    except RlsimError:
        prof = None
    if prof is None:
        return 0.0, ""
    return float(prof.interconnect_gbs), f"device profile {prof.key} ({prof.source})"


def split_config(cfg: WhatIf, models: FittedModels, hardware: dict | None, **mode: Any) -> SplitConfig | None:
    """The SplitConfig a WhatIf asks for (None: colocated); `mode`: the fields its execution mode sets
    (`rlsim.modes.registry.split_config`), and `inflight_total`, a cap on prompts in flight over all replicas, which
    each replica holds its share of (`inflight`)."""
    if not cfg.split:
        return None
    bw, src = interconnect(models, hardware)
    sync_s = weight_sync_seconds(float(models.sync_bytes or 0), cfg.weight_sync) if cfg.weight_sync else None
    base = dict(gen_gpus=int(cfg.gen_gpus or 0), train_gpus=int(cfg.train_gpus), staleness=float(cfg.staleness or 0),
                partial_rollout=bool(cfg.partial_rollout), allreduce_gbs=bw, bandwidth_source=src,
                allreduce_fitted=data_parallel(hardware), gen_tp=replica_tp(cfg, hardware), sync_s=sync_s)
    total = mode.pop("inflight_total", 0)
    sp = SplitConfig(**{**base, **mode})
    return replace(sp, inflight=-(-total // max(sp.replicas, 1))) if total > 0 else sp


def replica_tp(cfg: WhatIf, hardware: dict | None) -> int:
    """Devices per rollout replica: the what-if's gen_tp, else the trace's tensor parallel (1 when unstated)."""
    return int(cfg.gen_tp or (hardware or {}).get("tp") or 1)


def data_parallel(hardware: dict | None) -> bool:
    """Whether the reference trained data-parallel over several GPUs, so that its fitted update holds the gradient
    collective (a ring all-reduce costs about the same at any rank count). A CPU trace trains in one process."""
    hw = hardware or {}
    n = hw.get("device_count") or hw.get("gpus") or 1
    return str(hw.get("device") or "").lower() != "cpu" and isinstance(n, (int, float)) and n > 1


def queue_prompts(sp: SplitConfig, updates: int, prompts: int) -> int:
    """Prompts a run may start: the gate's bound at version U (no more can start before the run ends); with refill,
    those dispatched ahead plus one per prompt trained, and as many again for groups dropped as too old."""
    if not sp.refill:
        return admitted(sp.staleness, updates, prompts)
    drops = updates * prompts if sp.off_policy and not sp.off_policy_wait else 0
    return admitted(sp.staleness, 0, prompts) + updates * prompts + drops


def memory_estimate(cfg: SimConfig, record_timeline: bool = False, mean_len: float = 32.0) -> float:
    """Bytes a split simulation needs: every request it may start, and the timeline when recorded."""
    sp = cfg.split
    seqs = queue_prompts(sp, cfg.updates, cfg.prompts) * cfg.group
    tl = 0.0
    if record_timeline:
        # steps, and one slice per response
        steps = seqs * mean_len / max(min(cfg.engine.max_num_seqs, cfg.responses_per_update), 1) + seqs
        tl = steps * BYTES_PER_TIMELINE_STEP
    return seqs * BYTES_PER_SEQUENCE + tl


def replica_spec(models: FittedModels, cfg: SimConfig, kv_bind: bool) -> ReplicaSpec:
    eng, ov = cfg.engine, models.gen_overhead
    return ReplicaSpec(cost=models.gen, gap=ov.per_step, per_response=ov.per_response, max_seqs=eng.max_num_seqs,
                       kv=KvCache(eng.block_size, eng.kv_blocks), kv_cache_tokens=eng.kv_cache_tokens,
                       kv_bind=kv_bind, partial=cfg.split.partial_rollout, recompute=cfg.split.recompute,
                       inflight=cfg.split.inflight)


def steady_updates(cfg: SimConfig, record_timeline: bool, max_rounds: int | None) -> int | None:
    """Updates a split run simulates: max_rounds (at least 2, at most U) where given; None where it may stop once
    steady (`steady_enough`: more than STEADY_REQUESTS responses, no timeline); else all U."""
    U, B = cfg.updates, cfg.responses_per_update
    if max_rounds is not None:
        return min(max(int(max_rounds), 2), U)
    if record_timeline or U * B <= STEADY_REQUESTS or U <= STEADY_UPDATES:
        return U
    return None


def steady_enough(step_time: np.ndarray) -> bool:
    """Whether the mean of the (k,) update times past the first is known within STEADY_ERROR (module constants)."""
    x = step_time[1:]
    m = len(x) // STEADY_BLOCKS
    if m < 2:
        return False
    blocks = x[len(x) - m * STEADY_BLOCKS:].reshape(STEADY_BLOCKS, m).mean(axis=1)
    return STEADY_T * float(blocks.std(ddof=1)) / math.sqrt(STEADY_BLOCKS) <= STEADY_ERROR * float(x.mean())


def simulate_split(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
                   max_rounds: int | None = None, head: int | None = None) -> SimRun:
    """Simulate `cfg.updates` updates of the split asynchronous loop (module doc). Deterministic given the rng.
    max_rounds: updates simulated (at least 2; >= updates simulates every one); None: a run of more than
    STEADY_REQUESTS responses stops once steady (`steady_enough`). The updates not simulated repeat the simulated
    ones after the first (`steady_run`). head: the run of only the first `head` updates of the `cfg.updates`-update
    run, not extended (the same draws and queue: the first updates of the long run itself)."""
    cfg.validate()
    if cfg.split is None:
        raise RlsimError("simulate_split needs a SimConfig with a split")
    if head is not None and not is_count(head, 1):
        raise RlsimError(f"head must be a positive number of updates, got {head!r}")
    if head is not None and head < cfg.updates:
        return _simulate_split(models, cfg, rng, record_timeline, stop=lambda x: len(x) >= head)
    k = steady_updates(cfg, record_timeline, max_rounds)
    if k is not None and k < cfg.updates:
        return steady_run(_simulate_split(models, replace(cfg, updates=k), rng, record_timeline), cfg.updates)
    run = _simulate_split(models, cfg, rng, record_timeline, stop=steady_enough if k is None else None)
    return steady_run(run, cfg.updates, stopped=True) if run.rounds_simulated < cfg.updates else run


PER_UPDATE = ("step_time", "gen_time", "train_time", "sync_time", "other_time", "responses", "tokens", "gen_steps",
              "preemptions", "peak_kv_tokens", "peak_running")


def steady_run(run: SimRun, updates: int, stopped: bool = False) -> SimRun:
    """`run` (k simulated updates) extended to `updates`: update u >= k repeats simulated update 1 + (u - 1) mod
    (k - 1), so the first update's fill counts once; totals follow the extended arrays. `stopped`: the run stopped
    once steady (`steady_enough`), else it was asked for k updates."""
    k = len(run.step_time)
    idx = np.concatenate([np.arange(k), 1 + (np.arange(k, updates) - 1) % (k - 1)])
    per = {f: getattr(run, f)[idx] for f in PER_UPDATE}
    note = (f"{k} of {updates} updates simulated (update u >= {k} repeats simulated update 1 + (u - 1) mod {k - 1}, "
            "past the pipeline's fill)" + (f": it stopped once the mean update time was known within "
                                           f"{100 * STEADY_ERROR:.2g}% (99 % interval over its own updates)"
                                           if stopped else ""))
    return replace(run, **per, total_time=float(per["step_time"].sum()), rounds_simulated=k, approximation=note)


def _simulate_split(models: FittedModels, cfg: SimConfig, rng: np.random.Generator, record_timeline: bool,
                    stop: Callable[[np.ndarray], bool] | None = None) -> SimRun:
    """The simulation; `stop` (a predicate on the (k,) update times so far) may end it after k < U updates, and the
    run is then that of k updates."""
    sp = cfg.split
    U, P, G, B = cfg.updates, cfg.prompts, cfg.group, cfg.responses_per_update
    NP = queue_prompts(sp, U, P)
    est = memory_estimate(cfg, record_timeline, float(np.mean(models.lengths.response_tokens)))
    if est > MEMORY_LIMIT_BYTES:
        raise RlsimError(f"a split simulation of {U} updates of B = {B:,} responses (staleness {sp.staleness:g}) holds "
                         f"every request at once and needs about {est / 2**30:.1f} GB of memory, over the simulator's "
                         f"limit of {MEMORY_LIMIT_BYTES / 2**30:g} GB; pass fewer --updates or a smaller --prompts")
    p, L = queue_lengths(models, cfg, rng, NP)
    q = Requests.of(p, L, G, models.lengths.prefill_ratio, timeline=record_timeline)
    kv_bind = cfg.exact_engine or cfg.engine.kv_can_bind(int((p + L).max()) if len(p) else 0)
    env = simpy.Environment()
    rec = Recorder(record_timeline)
    # step switching: a parked hybrid replica per training device group
    helpers = sp.train_gpus // sp.gen_tp if sp.switch_ratio else 0
    sync = WeightSync(env, sp.replicas + helpers)
    totals = EngineTotals()
    spec = replica_spec(models, cfg, kv_bind)
    gate = AdmissionGate(P, sp.staleness, q.pv, replicas=sp.replicas + helpers, refill=sp.refill)
    finished = FinishedGroups(env, P, sp.staleness, q.pv, fifo=sp.fifo, off_policy=sp.off_policy,
                              wait=sp.off_policy_wait, oldest=sp.oldest, gate=gate)
    reps = [Replica(r, env, spec, q, gate, finished, sync, totals, rec) for r in range(sp.replicas + helpers)]
    for h in reps[sp.replicas:]:
        h.parked = True
    trainer = Trainer(env, models, q, finished, sync, totals, rec, TrainerCosts.of(models, cfg), U, B,
                      helpers=reps[sp.replicas:], stop=stop)
    env.run(until=env.process(trainer.run()))
    if trainer.done < U:
        trainer.log.per = {f: v[:trainer.done] for f, v in trainer.log.per.items()}
        cfg = replace(cfg, updates=trainer.done)
    return split_run(models, cfg, env.now, reps, trainer, rec, kv_bind)


def split_run(models: FittedModels, cfg: SimConfig, wall: float, reps: list[Replica], trainer: Trainer, rec: Recorder,
              kv_bind: bool) -> SimRun:
    """The SimRun of a finished split simulation (module doc: Outputs)."""
    sp, log, c = cfg.split, trainer.log, trainer.costs
    wall = float(wall)
    busy = np.array([R.stats.busy + (wall - R.stats.stretch_start if R.stats.stretch_start is not None else 0.0)
                     for R in reps[:sp.replicas]])  # the generation devices (hybrid helpers train in between)
    log.per["peak_running"][:] = max(R.stats.peak_running for R in reps)
    log.per["peak_kv_tokens"][:] = max(R.stats.peak_kv for R in reps)
    if rec.on:
        rec.responses(trainer.q)
    timeline, counters = rec.ordered()
    consumed = cfg.updates * cfg.responses_per_update
    idle = 1.0 - busy / wall if wall > 0 else np.full(len(reps), math.nan)
    split = SplitResult(gen_gpus=sp.gen_gpus, train_gpus=sp.train_gpus, staleness=sp.staleness,
                        partial_rollout=sp.partial_rollout, allreduce_s=c.allreduce, allreduce_gbs=sp.allreduce_gbs,
                        bandwidth_source=sp.bandwidth_source, allreduce_fitted=sp.allreduce_fitted,
                        grad_bytes=float(models.sync_bytes), sync_s=c.sync, replica_idle=tuple(map(float, idle)),
                        mode=sp.mode, hybrid=sp.hybrid, chunks=sp.chunks, dropped=trainer.finished.dropped)
    return SimRun(responses_per_update=cfg.responses_per_update, total_time=wall, exact_engine=kv_bind,
                  timeline=timeline, counters=counters,
                  rounds_simulated=cfg.updates, approximation="", features={},
                  gen_idle_ratio=float(1.0 - busy.mean() / wall) if wall > 0 else math.nan,
                  train_idle_ratio=float(1.0 - log.rank_busy.mean() / wall) if wall > 0 else math.nan,
                  staleness_mean=log.lag_sum / consumed if consumed else 0.0, staleness_max=int(log.lag_max),
                  split=split, notes=tuple(split_notes(models, cfg, split)), **log.per)


def split_notes(models: FittedModels, cfg: SimConfig, split: SplitResult) -> list[str]:
    """The split model's assumptions, one line each (they join the Outcome's warnings)."""
    N, M, eta = split.gen_gpus, split.train_gpus, split.staleness
    e = cfg.engine
    gate = (f"AReaL's rule with eta = {eta:g} (rlsim.modes.split)" if split.mode == "split" else
            f"the rule of {split.mode} (below)")
    R = cfg.split.replicas
    out = [f"split model: {N} generation device{'s' if N > 1 else ''} in {R} replica{'s' if R > 1 else ''} of "
           f"{cfg.split.gen_tp}, each the "
           f"recorded engine at that size (its fitted step cost, max_num_seqs {e.max_num_seqs}, KV cache "
           f"{e.kv_cache_tokens:,} tokens; cost per replica unchanged by their number), one shared queue admitting by "
           f"{gate}; the fixed per-round generation "
           "overhead has no counterpart; rewards and the rest of the step run on the trainer's critical path"]
    if M > 1 and split.allreduce_fitted:
        out.append(f"training: {M} data-parallel ranks, each the fitted prep + update at its B/{M} responses' tokens, "
                   "balanced by tokens; the gradient collective is inside the fitted update (the reference trained "
                   "data-parallel), not added")
    elif M > 1:
        out.append(f"training: {M} data-parallel ranks, each the fitted prep + update at its B/{M} responses' tokens; "
                   f"gradient all-reduce 2({M}-1)/{M} x {split.grad_bytes / 1e6:.4g} MB (the model's weight bytes) / "
                   f"{split.allreduce_gbs:g} GB/s ({split.bandwidth_source}) = {split.allreduce_s * 1e3:.4g} ms per "
                   "update")
    else:
        out.append("training: 1 rank (the recorded trainer), no all-reduce")
    how = ("replicas join at their next engine step and in-flight responses continue on the new weights (KV recomputed)"
           if split.partial_rollout else "replicas join once their in-flight responses finish on the old weights")
    by = (f"by its path ({cfg.split.sync_s:.3g} s for {models.sync_bytes / 1e9:.4g} GB, rlsim.replay.rollout_costs)"
          if cfg.split.sync_s is not None else f"the fitted {split.sync_s * 1e3:.4g} ms")
    out.append(f"weight sync: {by} as one collective of the trainer and all replicas; {how}")
    if split.mode != "split":
        out.append(mode_note(cfg.split, split.dropped, cfg.updates))
    return out


def mode_note(sp: SplitConfig, dropped: int, updates: int) -> str:
    """How the mode `sp` sets the shared split model's parameters, in one line (docs/simulator.md states each mode)."""
    parts = [f"{sp.mode}: "]
    parts.append(f"the {sp.gen_gpus} replicas sit on the training devices and stop at their next engine step while the "
                 "trainer trains, their responses in flight resumed after the sync; " if sp.hybrid else "")
    parts.append(f"admission: {sp.staleness:g} batches dispatched ahead, one prompt refilled per prompt trained or "
                 "dropped" if sp.refill else f"admission: the gate with eta = {sp.staleness:g} policy versions")
    parts.append(f"; the trainer takes P/{sp.chunks} prompts at a time and trains each as it is ready, a weight sync "
                 f"every {sp.chunks}" if sp.chunks > 1 else "; the trainer takes P prompts per step")
    parts.append(" by AReaL's wait_results (the finished started first)" if sp.oldest else " in completion order"
                 if sp.fifo else " by rlsim's deadline rule (oldest started, every open prompt within the limit)")
    if sp.inflight:
        parts.append(f"; at most {sp.inflight} prompt{'s' if sp.inflight > 1 else ''} in flight per replica, each "
                     "until its last response finishes, whatever the engine's free slots")
    if sp.off_policy:
        act = ("waits for a group in flight at that age" if sp.off_policy_wait else
               f"drops a finished group older than that and dispatches a new prompt ({dropped} dropped in {updates} "
               "updates simulated)")
        parts.append(f"; max_off_policy_threshold {sp.off_policy}: training {act}")
    if sp.reward_in_rollout:
        parts.append("; rewards scored on the rollout side as each response finishes, off the trainer's path (their "
                     "time overlaps generation)")
    if sp.switch_ratio:
        parts.append(f"; step switching: while fewer than {sp.switch_ratio:g} x P groups are ready, one hybrid replica "
                     "per training device generates (switching costs one fitted weight sync; the adaptive threshold "
                     "and the switch-cost estimate are not modelled)")
    if sp.partial_rollout and not sp.recompute:
        parts.append("; in-flight weight updates keep the responses' old KV")
    return "".join(parts)
