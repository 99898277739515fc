"""Split devices and asynchronous rollout with a staleness limit: a SimPy model at engine-step granularity.

`rlsim.modes.registry.simulate` runs a `SimConfig` with a `split` (`--gen-gpus`, `--train-gpus`, `--staleness`,
`--partial-rollout`) here, `simulate_split`, and one without it in the colocated loop (`rlsim.core.pipeline`).

Model
- Generation: `gen_gpus` engine replicas, one per generation device. One replica = one recorded engine:
  the fitted engine-step cost (`rlsim.replay.cost.EngineStepCost`, plus the fitted gap between steps), the
  trace's max_num_seqs and KV cache, and `rlsim.core.engine`'s continuous batching (FIFO admission while slots
  and KV blocks allow; prefill and first token in the admitting step, one token per step after; when the KV
  cache is full the latest admitted request is preempted and recomputes later). The per-replica cost does
  not change with gen_gpus: N replicas are N independent recorded engines (no tensor parallelism across
  them, no shared bandwidth). The fitted per-response host overhead is charged when a request is admitted;
  the fixed per-round overhead has no counterpart (there are no rounds).
- Requests: one queue shared by the replicas, in prompts of G sequences (a GRPO group: the trainer needs
  whole groups). A replica pulls prompts while it has free slots.
- Admission (AReaL's rule, eta = `staleness`): a new prompt starts only while
      prompts started (consumed + finished + running + queued on a replica) < (eta + v + 1) · P,
  v the current policy version (weight syncs so far). In-flight requests count, so the k-th P prompts
  to start (batch k) start no earlier than version k - eta. eta = 0 is synchronous: batch k is generated
  on the weights of version k, after update k-1's sync.
- Trainer: update u (version u -> u+1) consumes P finished groups: every prompt admitted at a version
  <= u - eta (consumed later it would exceed the limit; the gate keeps them within one batch), then the
  oldest admitted of the other finished ones (ties: completion order); it waits until those are finished,
  so a consumed sample's staleness never exceeds eta (`rlrun record --mode split` does the same). Then
  rewards (host), then on each of the `train_gpus` = M data-parallel ranks the fitted prep and update models
  at that rank's tokens (B / M responses each, token-balanced as verl's balance_batch: a + b·tokens_r, the
  trace's one-device fit), then a ring all-reduce of the gradients once the slowest rank is done:
      2 (M - 1) / M · gradient bytes / bandwidth,
  gradient bytes = the model's weight bytes (the trace's sync bytes), bandwidth = the interconnect of the
  trace's hardware metadata or its device profile (`rlsim.replay.devices`: profile_for_hardware,
  interconnect_gbs), or of --device; then the weight sync, then the rest of the step (host).
- Weight sync: a collective of the trainer and every replica costing the fitted sync time; it starts when
  all have joined and bumps the policy version at its end for all at once. Without partial rollout a
  replica joins once its in-flight responses have finished on the old weights (it admits nothing new
  meanwhile, so the sync waits for the longest response). With partial rollout it joins at the end of its
  current engine step; its in-flight responses continue after the sync on the new weights with their KV
  recomputed (prompt + generated tokens prefilled in the next step): a response may span several
  versions (its start and finish versions are in the timeline).
- Staleness of a consumed sample = the update that consumes it - the policy version its generation
  started under (its oldest tokens); at most eta by the consumption rule above.

Outputs (SimRun): per update, the step time (between consecutive update ends), the time the trainer waited
for generation (batch, and replicas joining the sync: `gen_time`), training (slowest rank + all-reduce),
sync, rewards + the rest; the generator and trainer idle ratios (mean over replicas / ranks of the fraction
of wall time not running engine steps / not computing or communicating); mean and max staleness.

Sample cost: rho is multiplied by N*(eta) / N*(eta_ref) (`rlsim.replay.rho.staleness_rho`; its evidence:
docs/simulator.md).

Structure: one SimPy Environment per run; one process per replica (`rlsim.modes.replica.Replica`) and one
for the trainer (`rlsim.modes.trainer.Trainer`); they share the requests' numpy arrays, the admission gate
and the pool of finished groups (`rlsim.modes.requests`), the weight sync (`rlsim.modes.sync`) and the
timeline recorder (`rlsim.modes.timeline`). Per-sequence state is in numpy arrays (no process per request);
slice ids come from a per-run counter; the rng is passed in.
"""
from __future__ import annotations

import math

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

# per-sequence arrays of a split run (14 x 8 bytes: `Requests`), all of the run's requests at once
BYTES_PER_SEQUENCE = 112


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


def split_config(cfg: WhatIf, models: FittedModels, hardware: dict | None) -> SplitConfig | None:
    """The SplitConfig a WhatIf asks for (None: colocated)."""
    if not cfg.split:
        return None
    bw, src = interconnect(models, hardware)
    return SplitConfig(gen_gpus=int(cfg.gen_gpus), train_gpus=int(cfg.train_gpus), staleness=float(cfg.staleness or 0),
                       partial_rollout=bool(cfg.partial_rollout), allreduce_gbs=bw, bandwidth_source=src,
                       allreduce_fitted=data_parallel(hardware))


def data_parallel(hardware: dict | None) -> bool:
    """Whether the reference trained data-parallel over several GPUs, so that its fitted update holds the gradient
    collective (a ring all-reduce costs about the same at any rank count). A CPU trace trains in one process."""
    hw = hardware or {}
    n = hw.get("device_count") or hw.get("gpus") or 1
    return str(hw.get("device") or "").lower() != "cpu" and isinstance(n, (int, float)) and n > 1


def memory_estimate(cfg: SimConfig, record_timeline: bool = False, mean_len: float = 32.0) -> float:
    """Bytes a split simulation needs: every request it may start, and the timeline when recorded."""
    sp = cfg.split
    seqs = math.ceil(cfg.updates + sp.staleness + 1) * cfg.batch
    tl = 0.0
    if record_timeline:
        # steps, and one slice per response
        steps = seqs * mean_len / max(min(cfg.engine.max_num_seqs, cfg.batch), 1) + seqs
        tl = steps * BYTES_PER_TIMELINE_STEP
    return seqs * BYTES_PER_SEQUENCE + tl


def replica_spec(models: FittedModels, cfg: SimConfig, kv_bind: bool) -> ReplicaSpec:
    eng, ov = cfg.engine, models.gen_overhead
    return ReplicaSpec(cost=models.gen, gap=ov.per_step, per_response=ov.per_response, max_seqs=eng.max_num_seqs,
                       kv=KvCache(eng.block_size, eng.kv_blocks), kv_cache_tokens=eng.kv_cache_tokens,
                       kv_bind=kv_bind, partial=cfg.split.partial_rollout)


def simulate_split(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator,
                   record_timeline: bool = False) -> SimRun:
    """Simulate `cfg.updates` updates of the split asynchronous loop (module doc). Deterministic given the rng."""
    cfg.validate()
    sp = cfg.split
    if sp is None:
        raise RlsimError("simulate_split needs a SimConfig with a split")
    U, P, G, B = cfg.updates, cfg.prompts, cfg.group, cfg.batch
    NP = admitted(sp.staleness, U, P)  # the gate's bound at version U: no more prompts can start before the run ends
    est = memory_estimate(cfg, record_timeline, float(np.mean(models.lengths.response_tokens)))
    if est > MEMORY_LIMIT_BYTES:
        raise RlsimError(f"a split simulation of {U} updates of B = {B:,} responses (staleness {sp.staleness:g}) holds "
                         f"every request at once and needs about {est / 2**30:.1f} GB of memory, over the simulator's "
                         f"limit of {MEMORY_LIMIT_BYTES / 2**30:g} GB; pass fewer --updates or a smaller --batch")
    p, L = queue_lengths(models, cfg, rng, NP)
    q = Requests.of(p, L, G, models.lengths.prefill_ratio)
    kv_bind = cfg.exact_engine or cfg.engine.kv_can_bind(int((p + L).max()) if len(p) else 0)
    env = simpy.Environment()
    rec = Recorder(record_timeline)
    finished = FinishedGroups(env, P, sp.staleness, q.pv)
    sync = WeightSync(env, sp.gen_gpus)
    totals = EngineTotals()
    spec = replica_spec(models, cfg, kv_bind)
    gate = AdmissionGate(P, sp.staleness, q.pv, replicas=sp.gen_gpus)
    reps = [Replica(r, env, spec, q, gate, finished, sync, totals, rec) for r in range(sp.gen_gpus)]
    trainer = Trainer(env, models, q, finished, sync, totals, rec, TrainerCosts.of(models, cfg), U, B)
    env.run(until=env.process(trainer.run()))
    return split_run(models, cfg, env.now, reps, trainer, rec, kv_bind)


def split_run(models: FittedModels, cfg: SimConfig, wall: float, reps: list[Replica], trainer: Trainer, rec: Recorder,
              kv_bind: bool) -> SimRun:
    """The SimRun of a finished split simulation (module doc: Outputs)."""
    sp, log, c = cfg.split, trainer.log, trainer.costs
    wall = float(wall)
    busy = np.array([R.stats.busy + (wall - R.stats.stretch_start if R.stats.stretch_start is not None else 0.0)
                     for R in reps])
    log.per["peak_running"][:] = max(R.stats.peak_running for R in reps)
    log.per["peak_kv_tokens"][:] = max(R.stats.peak_kv for R in reps)
    if rec.on:
        rec.responses(trainer.q)
    timeline, counters = rec.ordered()
    consumed = cfg.updates * cfg.batch
    idle = 1.0 - busy / wall if wall > 0 else np.full(len(reps), math.nan)
    split = SplitResult(gen_gpus=sp.gen_gpus, train_gpus=sp.train_gpus, staleness=sp.staleness,
                        partial_rollout=sp.partial_rollout, allreduce_s=c.allreduce, allreduce_gbs=sp.allreduce_gbs,
                        bandwidth_source=sp.bandwidth_source, allreduce_fitted=sp.allreduce_fitted,
                        grad_bytes=float(models.sync_bytes), sync_s=c.sync, replica_idle=tuple(map(float, idle)))
    return SimRun(batch=cfg.batch, total_time=wall, exact_engine=kv_bind, timeline=timeline, counters=counters,
                  rounds_simulated=cfg.updates, approximation="", features={},
                  gen_idle_ratio=float(1.0 - busy.mean() / wall) if wall > 0 else math.nan,
                  train_idle_ratio=float(1.0 - log.rank_busy.mean() / wall) if wall > 0 else math.nan,
                  staleness_mean=log.lag_sum / consumed if consumed else 0.0, staleness_max=int(log.lag_max),
                  split=split, notes=tuple(split_notes(models, cfg, split)), **log.per)


def split_notes(models: FittedModels, cfg: SimConfig, split: SplitResult) -> list[str]:
    """The split model's assumptions, one line each (they join the Outcome's warnings)."""
    N, M, eta = split.gen_gpus, split.train_gpus, split.staleness
    e = cfg.engine
    out = [f"split model: {N} generation replica{'s' if N > 1 else ''}, each the recorded engine (its fitted step "
           f"cost, max_num_seqs {e.max_num_seqs}, KV cache {e.kv_cache_tokens:,} tokens; cost per replica unchanged by "
           f"their number), one shared queue admitting by AReaL's rule with eta = {eta:g} (rlsim.modes.split); the "
           "fixed per-round generation "
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
    out.append(f"weight sync: the fitted {split.sync_s * 1e3:.4g} ms as one collective of the trainer and all "
               f"replicas; {how}")
    return out
