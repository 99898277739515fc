"""Split devices and asynchronous rollout with a staleness limit: a SimPy model at engine-step granularity.

`rlsim.pipeline.simulate` hands a `SimConfig` with a `split` (`--gen-gpus`, `--train-gpus`, `--staleness`,
`--partial-rollout`) to `simulate_split`; without one it runs the synchronous colocated loop as before.

Model
- Generation: `gen_gpus` engine replicas, one per generation device. One replica = one recorded engine:
  the fitted engine-step cost (c_step + c_seq·n + c_ctx·context + c_prefill·prefill, plus the fitted gap
  between steps), the trace's max_num_seqs and KV cache, and `rlsim.engine`'s continuous batching (FIFO
  admission while slots and KV blocks allow; prefill and first token in the admitting step, one token per
  step after; when the KV cache is full the latest admitted request is preempted and recomputes later).
  The per-replica cost does not change with gen_gpus: N replicas are N independent recorded engines
  (no tensor parallelism across them, no shared bandwidth). The fitted per-response host overhead is
  charged when a request is admitted; the fixed per-round overhead has no counterpart (there are no rounds).
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
  at that rank's tokens (B / M responses each, in completion order: a + b·tokens_r, the trace's one-device
  fit), then a ring all-reduce of the gradients once the slowest rank is done:
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

Sample cost (`staleness_rho`): rho is multiplied by N*(eta) / N*(eta_ref), from learning curves when traces
recorded at several staleness limits (their config's `staleness`) at the reference batch are given; else 1
up to eta = 4, with a warning beyond: AReaL (Fu et al. 2025, arXiv:2505.24298, staleness ablation) measured
AIME24 42.0, 42.1, 41.8, 42.2 at eta = 0, 1, 2, 4 with its decoupled (off-policy corrected) PPO objective,
41.0 and 38.7 at eta = 8 and 16; with naive PPO 42.0, 41.8, 40.0, 23.3 at eta = 0, 1, 2, 4.

State: all in the SimPy Environment and this call's objects; per-sequence state in numpy arrays (no process
per request); slice ids from a per-run counter; the rng passed in.

Size: one SimPy model (replicas, admission gate, trainer ranks, sync, partial rollout) whose processes share
state through the Environment; split across files it would only trade reading order for imports.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Any

import numpy as np
import simpy

from rlsim.config import SimConfig, SplitConfig, WhatIf
from rlsim.engine import Stretch
from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import FittedModels
from rlsim.replay.timeline import LANE_HOST, LANE_RL, LANE_SYNC, Counter, Slice

BYTES_PER_SEQUENCE = 112  # per-sequence arrays of a split run (14 x 8 bytes), all of the run's requests at once
STALENESS_FLAT_UP_TO = 4
AREAL_SOURCE = ("AReaL (Fu et al. 2025, arXiv:2505.24298), staleness ablation: AIME24 42.0, 42.1, 41.8, 42.2 at eta = 0, 1, "
                "2, 4 with the decoupled PPO objective (41.0, 38.7 at 8, 16); naive PPO 42.0, 41.8, 40.0, 23.3 at 0, 1, 2, 4")


def lane_gen(r: int) -> str:
    return f"gen/engine{r}"


def lane_train(m: int) -> str:
    return f"train/trainer{m}"


def allreduce_seconds(grad_bytes: float, ranks: int, gbs: float) -> float:
    """Ring all-reduce: each rank sends and receives 2 (M - 1) / M of the gradient bytes."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * float(grad_bytes) / (float(gbs) * 1e9)


def interconnect(models: FittedModels, hardware: dict | None) -> tuple[float, str]:
    """(GB/s, source) of the device interconnect: the (rescaled) models' hardware, else the trace's, by its
    `interconnect_gbs` or its device profile; (0, '') when none is known."""
    from rlsim.replay.devices import profile_for_hardware

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
    return SplitConfig(gen_gpus=int(cfg.gen_gpus), train_gpus=int(cfg.train_gpus), staleness=int(cfg.staleness or 0),
                       partial_rollout=bool(cfg.partial_rollout), allreduce_gbs=bw, bandwidth_source=src)


def _workload(models: FittedModels, cfg: SimConfig, rng: np.random.Generator, prompts_total: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and response lengths of every sequence the run may start, in queue order (prompt-major,
    P prompts per block): recorded lengths replay the trace's updates cyclically, sampled ones are drawn."""
    P, G = cfg.prompts, cfg.group
    blocks = -(-prompts_total // P)
    if cfg.lengths == "recorded":
        wl = models.recorded.workload
        if not wl:
            raise RlsimError("the trace's response rows do not cover its updates; use sampled lengths")
        ps, ls = [], []
        for b in range(blocks):
            pb, lb = wl[b % len(wl)]
            if len(lb) != P * G:
                raise RlsimError(f"recorded lengths: the trace's update {b % len(wl)} has {len(lb)} responses, not P x G = "
                                 f"{P * G}; use sampled lengths")
            ps.append(np.asarray(pb, np.int64))
            ls.append(np.asarray(lb, np.int64))
        p, L = np.concatenate(ps), np.concatenate(ls)
    else:
        pp, LL = models.lengths.sample(rng, P, G, rounds=blocks)
        p, L = pp.ravel().astype(np.int64), LL.ravel().astype(np.int64)
    mml = cfg.engine.max_model_len
    if len(L) and int((p + L).max()) > mml:
        L = np.minimum(L, np.maximum(mml - p, 1))
    return p, L


def memory_estimate(cfg: SimConfig, record_timeline: bool = False, mean_len: float = 32.0) -> float:
    """Bytes a split simulation needs: every request it may start, and the timeline when recorded."""
    from rlsim.pipeline import BYTES_PER_TIMELINE_STEP

    sp = cfg.split
    seqs = (cfg.updates + sp.staleness + 1) * cfg.batch
    tl = 0.0
    if record_timeline:
        steps = seqs * mean_len / max(min(cfg.engine.max_num_seqs, cfg.batch), 1) + seqs  # steps, and one slice per response
        tl = steps * BYTES_PER_TIMELINE_STEP
    return seqs * BYTES_PER_SEQUENCE + tl


class _Shared:
    """The state the replicas and the trainer share (one per run)."""

    def __init__(self, env: simpy.Environment):
        self.version = 0            # published policy version (weight syncs so far)
        self.next_prompt = 0        # prompts started (pulled from the shared queue)
        self.ready_groups: deque = deque()  # finished prompts not yet consumed, in completion order
        self.batch_ev: simpy.Event | None = None  # the trainer waits on it for a full batch
        self.sync_wanted = False
        self.joined = 0
        self.all_joined: simpy.Event = env.event()
        self.sync_done: simpy.Event = env.event()
        self.steps = 0
        self.preemptions = 0


class _Replica:
    def __init__(self, r: int):
        self.r = r
        self.wake: simpy.Event | None = None
        self.busy = 0.0             # seconds running engine steps (with their gaps and admission overhead)
        self.cur_start: float | None = None  # start of the stretch in progress
        self.peak_running = 0
        self.peak_kv = 0.0
        self.stretch = False        # waiting out a stretch of engine steps (partial rollout interrupts it)
        self.proc = None


def simulate_split(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False):
    """Simulate `cfg.updates` updates of the split asynchronous loop (module doc). Deterministic given the rng."""
    from rlsim.pipeline import MEMORY_LIMIT_BYTES, SimRun

    cfg.validate()
    sp = cfg.split
    if sp is None:
        raise RlsimError("simulate_split needs a SimConfig with a split")
    U, P, G, B = cfg.updates, cfg.prompts, cfg.group, cfg.batch
    N, M, eta, partial = sp.gen_gpus, sp.train_gpus, sp.staleness, sp.partial_rollout
    NP = (U + eta + 1) * P  # the gate's bound at version U: no more prompts can start before the run ends
    est = memory_estimate(cfg, record_timeline, float(np.mean(models.lengths.response_tokens)))
    if est > MEMORY_LIMIT_BYTES:
        raise RlsimError(f"a split simulation of {U} updates of B = {B:,} responses (staleness {eta}) holds every request at "
                         f"once and needs about {est / 2**30:.1f} GB of memory, over the simulator's limit of "
                         f"{MEMORY_LIMIT_BYTES / 2**30:g} GB; pass fewer --updates or a smaller --batch")
    p, L = _workload(models, cfg, rng, NP)
    S = NP * G
    eng = cfg.engine
    gm, ov = models.gen, models.gen_overhead
    ratio = models.lengths.prefill_ratio
    pre0 = p * ratio
    cp = np.concatenate([[0], np.cumsum(p)])        # prefix sums over queue order: ranges of sequences at once
    cpre = np.concatenate([[0.0], np.cumsum(pre0)])
    a = np.zeros(S, np.int64)        # virtual admission step on its replica: tokens generated before step s = s - a
    fin = np.zeros(S, np.int64)      # step (on its replica) that produces its last token
    done = np.zeros(S, np.int64)     # tokens generated when preempted (0: never ran)
    v0 = np.full(S, -1, np.int64)    # policy version its generation started under
    v1 = np.full(S, -1, np.int64)    # policy version of its last token
    t0 = np.full(S, np.nan)          # start of the step that computed its first token
    t1 = np.full(S, np.nan)          # end of the step that computed its last token
    rep = np.full(S, -1, np.int64)   # replica that ran it
    cons = np.full(S, -1, np.int64)  # update that consumed it
    left = np.full(NP, G, np.int64)  # per prompt: sequences not finished
    pv = np.full(NP, np.iinfo(np.int64).max, np.int64)  # per prompt: the policy version when it was admitted
    max_ctx = int((p + L).max()) if S else 0
    kv_bind = cfg.exact_engine or eng.kv_can_bind(max_ctx)
    bs, cap, max_seqs = eng.block_size, eng.kv_blocks, eng.max_num_seqs

    env = simpy.Environment()
    ids = itertools.count()
    st = _Shared(env)
    reps = [_Replica(r) for r in range(N)]
    timeline: list[Slice] = []
    counters: list[Counter] = []

    def step_durations(x: Stretch) -> np.ndarray:
        """Seconds of each engine step of a stretch (without the gap between steps)."""
        n = x.num_running
        d = gm.c_step + gm.c_seq * n + gm.c_ctx * (x.context0 + n * np.arange(x.steps, dtype=float))
        if gm.c_knee:
            d = d + gm.c_knee * max(n - gm.knee, 0.0)
        d[0] += gm.c_prefill * x.prefill
        return d

    def record_stretch(r: int, x: Stretch, t: float, d: np.ndarray, version: int, kv_tokens: float):
        lane = lane_gen(r)
        for k in range(x.steps):
            ctx = x.context0 + k * x.num_running
            timeline.append(Slice(lane, "gen_step", "gen.step", t, float(d[k]),
                                  {"id": next(ids), "num_running": x.num_running, "context_tokens": ctx,
                                   "prefill_tokens": x.prefill if k == 0 else 0.0,
                                   "finished": x.finished if k == x.steps - 1 else 0, "policy_version": version}))
            counters.append(Counter(lane, "gen.running", t, float(x.num_running)))
            counters.append(Counter(lane, "gen.kv_usage", t, float(min(kv_tokens / eng.kv_cache_tokens, 1.0))))
            t += float(d[k]) + ov.per_step

    def take(wait: deque, m: int) -> list[tuple[int, int]]:
        """The first m sequences of a replica's queue (a deque of [lo, hi) ranges of sequence ids), as ranges."""
        parts = []
        while m:
            lo, hi = wait[0]
            t = min(m, hi - lo)
            parts.append((lo, lo + t))
            if lo + t == hi:
                wait.popleft()
            else:
                wait[0] = (lo + t, hi)
            m -= t
        return parts

    def replica(R: _Replica):
        r = R.r
        run = np.zeros(0, np.int64)   # running sequences, in admission order
        frun = np.zeros(0, np.int64)  # their last steps (fin[run])
        wait: deque = deque()         # [lo, hi) ranges of sequences pulled, not running (preempted ones in front)
        nwait = 0
        s = 0                         # engine steps run so far on this replica
        sumP = sumA = 0               # sums of p and a over the running set: context before step s = sumP + n s - sumA
        recompute = 0.0               # tokens to prefill again at the next step (partial rollout across a sync)
        version = 0
        while True:
            n = len(run)
            # 1. a weight sync: join it (partial rollout: now, at a step boundary; else once nothing runs)
            if st.sync_wanted and (partial or n == 0):
                tj = env.now
                st.joined += 1
                if st.joined == N:
                    st.all_joined.succeed()
                yield st.sync_done
                version = st.version
                if n:
                    recompute += float(sumP + n * s - sumA)
                if record_timeline:
                    timeline.append(Slice(lane_gen(r), "weight_load", "gen.weight_sync", tj, env.now - tj,
                                          {"id": next(ids), "policy_version": version, "in_flight": n}))
                    counters.append(Counter(lane_gen(r), "gen.running", tj, 0.0))
                continue
            # 2. KV blocks this step needs: preempt the latest admitted until they fit
            preempted = 0
            used = 0
            if kv_bind and n:
                blocks = -(-(p[run] + (s - a[run])) // bs)
                used = int(blocks.sum())
                while used > cap and len(run):
                    victim = int(run[-1])
                    run, frun = run[:-1], frun[:-1]
                    used -= int(blocks[-1])
                    blocks = blocks[:-1]
                    done[victim] = s - a[victim]
                    sumP -= int(p[victim])
                    sumA -= int(a[victim])
                    wait.appendleft((victim, victim + 1))
                    nwait += 1
                    preempted += 1
                st.preemptions += preempted
            # 3. admission: pull prompts under the staleness gate, admit FIFO while slots (and blocks) allow
            pre = recompute
            recompute = 0.0
            host = 0.0
            if not st.sync_wanted and not preempted:
                free = max_seqs - len(run)
                allowed = min((eta + st.version + 1) * P, NP)
                if nwait < free and st.next_prompt < allowed:
                    j = min(allowed, st.next_prompt + -(-(free - nwait) // G))  # whole prompts, while slots are free
                    wait.append((st.next_prompt * G, j * G))
                    pv[st.next_prompt:j] = st.version
                    nwait += (j - st.next_prompt) * G
                    st.next_prompt = j
                m = min(free, nwait)
                if m and kv_bind:  # one by one while the KV cache has blocks for them
                    got = 0
                    for lo, hi in wait:
                        for i in range(lo, hi):
                            if got == m:
                                break
                            nb = -(-int(p[i] + done[i]) // bs)
                            if used + nb > cap:
                                if not len(run) and not got:
                                    raise RlsimError(f"a request of {int(p[i] + done[i])} context tokens does not fit the "
                                                     f"KV cache of {cap * bs} tokens; pass a larger --kv-cache-tokens")
                                m = got
                                break
                            used += nb
                            got += 1
                        if got == m:
                            break
                    m = got
                if m:
                    nwait -= m
                    new_runs, fresh = [], []
                    for lo, hi in take(wait, m):
                        if v0[lo] < 0:  # fresh (a preempted request is a range of one, already started)
                            a[lo:hi] = s
                            fin[lo:hi] = s + L[lo:hi] - 1
                            v0[lo:hi] = version
                            rep[lo:hi] = r
                            pre += float(cpre[hi] - cpre[lo])
                            sumA += s * (hi - lo)
                            fresh.append((lo, hi))
                        else:
                            dn = int(done[lo])
                            a[lo] = s - dn
                            fin[lo] = a[lo] + L[lo] - 1
                            pre += float(p[lo] + dn)
                            sumA += int(a[lo])
                        sumP += int(cp[hi] - cp[lo])
                        new_runs.append(np.arange(lo, hi, dtype=np.int64))
                    host = ov.per_response * sum(hi - lo for lo, hi in fresh)
                    for lo, hi in fresh:
                        t0[lo:hi] = env.now + host
                    new = new_runs[0] if len(new_runs) == 1 else np.concatenate(new_runs)
                    run = np.concatenate([run, new])
                    frun = np.concatenate([frun, fin[new]])
            n = len(run)
            if n == 0:  # nothing to run: wait for a sync request (the gate opens only at a sync's end)
                R.wake = env.event()
                yield R.wake
                R.wake = None
                continue
            # 4. one stretch of steps with this composition, up to the next finish (or KV overflow)
            k = int(frun.min()) - s + 1
            if kv_bind:
                if k > 1:
                    ctx = p[run] + (s - a[run])
                    chunk = max((1 << 20) // n, 1)
                    for j0 in range(0, k, chunk):
                        jj = np.arange(j0, min(j0 + chunk, k))
                        need = (-(-(ctx[:, None] + jj[None, :]) // bs)).sum(axis=0)
                        over = np.nonzero(need > cap)[0]
                        if len(over):
                            k = max(j0 + int(over[0]), 1)
                            break
                if used * bs > R.peak_kv:
                    R.peak_kv = float(used * bs)
            elif sumP + n * (s + k) - sumA > R.peak_kv:
                R.peak_kv = float(sumP + n * (s + k) - sumA)
            if n > R.peak_running:
                R.peak_running = n
            finished = frun == s + k - 1
            x = Stretch(step=s, steps=k, num_running=n, context0=float(sumP + n * s - sumA), prefill=float(pre),
                        finished=int(np.count_nonzero(finished)), kv_tokens=used * bs)
            dur = host + x.cost(gm) + ov.per_step * k
            tstart = env.now
            R.cur_start = tstart
            d = None
            try:
                R.stretch = True
                yield env.timeout(dur)
            except simpy.Interrupt:  # partial rollout: a sync request ends the stretch with the step in progress
                e = env.now - tstart
                d = step_durations(x)
                cum = host + np.cumsum(d + ov.per_step)
                j = min(max(int(np.searchsorted(cum, e - 1e-12)) + 1, 1), k)
                if j < k:
                    x = Stretch(step=s, steps=j, num_running=n, context0=x.context0, prefill=x.prefill, finished=0,
                                kv_tokens=x.kv_tokens)
                    d = d[:j]
                    dur = float(cum[j - 1])
                R.stretch = False
                if dur > e:
                    yield env.timeout(dur - e)
            R.stretch = False
            R.cur_start = None
            R.busy += dur
            if record_timeline:
                record_stretch(r, x, tstart + host, step_durations(x) if d is None else d, version, float(x.kv_tokens or x.context0))
            s += x.steps
            st.steps += x.steps
            if x.finished:
                out = run[finished]
                keep = ~finished
                run, frun = run[keep], frun[keep]
                sumP -= int(p[out].sum())
                sumA -= int(a[out].sum())
                if record_timeline:
                    t1[out] = env.now
                    v1[out] = version
                g = out // G
                g0 = int(g[0]) if g[0] == g[-1] else int(g.min())
                cnt = np.bincount(g - g0)
                gg = np.flatnonzero(cnt)
                g = gg + g0
                left[g] -= cnt[gg]
                complete = g[left[g] == 0]
                if len(complete):
                    st.ready_groups.extend(complete.tolist())
                    if st.batch_ev is not None and len(st.ready_groups) >= P and not st.batch_ev.triggered:
                        st.batch_ev.succeed()  # the trainer re-checks its rule
                if record_timeline and not len(run):
                    counters.append(Counter(lane_gen(r), "gen.running", env.now, 0.0))

    # ---- the trainer -------------------------------------------------------------------------------
    per = dict(step_time=np.zeros(U), gen_time=np.zeros(U), train_time=np.zeros(U), sync_time=np.zeros(U),
             other_time=np.zeros(U), responses=np.zeros(U), tokens=np.zeros(U), gen_steps=np.zeros(U, np.int64),
             preemptions=np.zeros(U, np.int64), peak_kv_tokens=np.zeros(U), peak_running=np.zeros(U, np.int64))
    rank_busy = np.zeros(M)
    lag_sum = 0.0
    lag_max = 0
    A = allreduce_seconds(models.sync_bytes, M, sp.allreduce_gbs) if M > 1 else 0.0
    rew = max(float(models.reward.predict(B)), 0.0)
    oth = max(float(models.other.predict(B)), 0.0)
    syn = max(float(models.sync.predict(models.sync_bytes)), 0.0)
    share = B // M

    def slice_(lane: str, track: str, name: str, t: float, dur: float, **args):
        if record_timeline:
            timeline.append(Slice(lane, track, name, t, dur, {"id": next(ids), **args}))

    def trainer():
        nonlocal lag_sum, lag_max
        fu = 0  # prompts below fu have all finished (a lower bound, advanced after each update)
        prev = 0.0
        steps_prev = pre_prev = 0
        for u in range(U):
            tw = env.now
            D = int(np.searchsorted(pv, u - eta, side="right"))  # prompts [0, D) were admitted at versions <= u - eta
            while len(st.ready_groups) < P or not np.all(left[fu:D] == 0):
                st.batch_ev = env.event()
                yield st.batch_ev
                st.batch_ev = None
            waited = env.now - tw
            rg = np.fromiter(st.ready_groups, np.int64, len(st.ready_groups))
            order = np.lexsort((np.arange(len(rg)), pv[rg], rg >= D))  # due first, then oldest admitted, then finish
            pick = np.sort(order[:P])
            g = rg[pick]
            keep = np.ones(len(rg), bool)
            keep[pick] = False
            st.ready_groups = deque(rg[keep].tolist())
            while fu < NP and left[fu] == 0:
                fu += 1
            seqs = (g[:, None] * G + np.arange(G)).ravel()
            cons[seqs] = u
            lag = u - v0[seqs]
            lag_sum += float(lag.sum())
            lag_max = max(lag_max, int(lag.max()))
            sh = seqs.reshape(M, share)
            if models.shared_prompts:  # one prompt per group on each rank that trains any of its responses
                gid = sh // G
                first = np.ones(sh.shape, bool)
                first[:, 1:] = gid[:, 1:] != gid[:, :-1]
                ptok = (p[sh] * first).sum(axis=1)
                tokens = float(p[seqs[::G]].sum() + L[seqs].sum())
            else:
                ptok = p[sh].sum(axis=1)
                tokens = float(p[seqs].sum() + L[seqs].sum())
            tok_r = (ptok + L[sh].sum(axis=1)).astype(float)
            prep_r = np.maximum(models.prep.predict(tok_r), 0.0)
            upd_r = np.maximum(models.update.predict(tok_r), 0.0)
            comp = prep_r + upd_r
            cmax = float(comp.max())
            t = env.now
            yield env.timeout(rew)
            slice_(LANE_HOST, "reward", "host.reward", t, rew, update=u)
            t = env.now
            for m_ in range(M):
                slice_(lane_train(m_), "prep", "train.prep", t, float(prep_r[m_]), update=u, tokens=float(tok_r[m_]))
                slice_(lane_train(m_), "update", "train.update", t + float(prep_r[m_]), float(upd_r[m_]), update=u,
                       tokens=float(tok_r[m_]))
            yield env.timeout(cmax)
            if M > 1:
                for m_ in range(M):
                    slice_(lane_train(m_), "allreduce", "train.allreduce", env.now, A, update=u)
                yield env.timeout(A)
            # the weight sync: a collective with every replica
            tr = env.now
            st.sync_wanted = True
            st.joined = 0
            st.all_joined = env.event()
            for R in reps:
                if R.wake is not None and not R.wake.triggered:
                    R.wake.succeed()
                elif partial and R.stretch:
                    R.stretch = False
                    R.proc.interrupt()
            yield st.all_joined
            sync_wait = env.now - tr
            ts = env.now
            yield env.timeout(syn)
            st.version += 1
            st.sync_wanted = False
            ev, st.sync_done = st.sync_done, env.event()
            ev.succeed()
            slice_(LANE_SYNC, "sync", "sync.weights", ts, syn, update=u, policy_version=st.version, waited_s=sync_wait)
            t = env.now
            yield env.timeout(oth)
            slice_(LANE_HOST, "other", "host.other", t, oth, update=u)
            slice_(LANE_RL, "rl_step", "rl.step", prev, env.now - prev, update=u, responses=B)
            per["step_time"][u] = env.now - prev
            per["gen_time"][u] = waited + sync_wait
            per["train_time"][u] = cmax + A
            per["sync_time"][u] = syn
            per["other_time"][u] = rew + oth
            per["responses"][u] = B
            per["tokens"][u] = tokens
            per["gen_steps"][u] = st.steps - steps_prev
            per["preemptions"][u] = st.preemptions - pre_prev
            steps_prev, pre_prev = st.steps, st.preemptions
            rank_busy[:] += rew + comp + A + syn + oth
            prev = env.now

    for R in reps:
        R.proc = env.process(replica(R))
    proc = env.process(trainer())
    env.run(until=proc)
    wall = float(env.now)
    busy = np.array([R.busy + (wall - R.cur_start if R.cur_start is not None else 0.0) for R in reps])
    per["peak_running"][:] = max(R.peak_running for R in reps)
    per["peak_kv_tokens"][:] = max(R.peak_kv for R in reps)
    if record_timeline:
        done_ = np.nonzero(np.isfinite(t1))[0]
        for i in done_:
            timeline.append(Slice(lane_gen(int(rep[i])), "response", f"p{i // G}/g{i % G}", float(t0[i]), float(t1[i] - t0[i]),
                                  {"id": next(ids), "prompt_id": int(i // G), "group_index": int(i % G),
                                   "prompt_tokens": int(p[i]), "response_tokens": int(L[i]),
                                   "start_version": int(v0[i]), "finish_version": int(v1[i]),
                                   "consumed_update": int(cons[i]) if cons[i] >= 0 else None,
                                   "staleness": int(cons[i] - v0[i]) if cons[i] >= 0 else None}))
        timeline.sort(key=lambda s_: (s_.start, -s_.dur))
        counters.sort(key=lambda c: c.t)
    consumed = U * B
    split = {"gen_gpus": N, "train_gpus": M, "staleness": eta, "partial_rollout": partial, "allreduce_s": A,
             "allreduce_gbs": sp.allreduce_gbs, "bandwidth_source": sp.bandwidth_source, "grad_bytes": float(models.sync_bytes),
             "sync_s": syn}
    return SimRun(batch=B, total_time=wall, exact_engine=kv_bind, timeline=timeline, counters=counters, rounds_simulated=U,
                  approximation="", features={}, gen_idle_ratio=float(1.0 - busy.mean() / wall) if wall > 0 else math.nan,
                  train_idle_ratio=float(1.0 - rank_busy.mean() / wall) if wall > 0 else math.nan,
                  staleness_mean=lag_sum / consumed if consumed else 0.0, staleness_max=int(lag_max), split=split,
                  notes=tuple(split_notes(models, cfg, split)), **per)


def split_notes(models: FittedModels, cfg: SimConfig, split: dict[str, Any]) -> list[str]:
    """The split model's assumptions, one line each (they join the Outcome's warnings)."""
    N, M, eta = split["gen_gpus"], split["train_gpus"], split["staleness"]
    e = cfg.engine
    out = [f"split model: {N} generation replica{'s' if N > 1 else ''}, each the recorded engine (its fitted step cost, "
           f"max_num_seqs {e.max_num_seqs}, KV cache {e.kv_cache_tokens:,} tokens; cost per replica unchanged by their number), "
           f"one shared queue admitting by AReaL's rule with eta = {eta} (rlsim.asyncrl); the fixed per-round generation "
           "overhead has no counterpart; rewards and the rest of the step run on the trainer's critical path"]
    if M > 1:
        out.append(f"training: {M} data-parallel ranks, each the fitted prep + update at its B/{M} responses' tokens; gradient "
                   f"all-reduce 2({M}-1)/{M} x {split['grad_bytes'] / 1e6:.4g} MB (the model's weight bytes) / "
                   f"{split['allreduce_gbs']:g} GB/s ({split['bandwidth_source']}) = {split['allreduce_s'] * 1e3:.4g} ms per update")
    else:
        out.append("training: 1 rank (the recorded trainer), no all-reduce")
    how = ("replicas join at their next engine step and in-flight responses continue on the new weights (KV recomputed)"
           if split["partial_rollout"] else "replicas join once their in-flight responses finish on the old weights")
    out.append(f"weight sync: the fitted {split['sync_s'] * 1e3:.4g} ms as one collective of the trainer and all replicas; {how}")
    return out


def staleness_rho(study: Any, eta: int) -> tuple[float, list[str]]:
    """(rho multiplier at staleness limit eta, notes). From learning curves recorded at several staleness limits
    (traces at the reference batch; their config's `staleness`) when there are two or more reaching the target;
    else 1 up to eta = STALENESS_FLAT_UP_TO (AReaL, with an off-policy correction) and a warning beyond."""
    curves = getattr(study, "curves", ()) or ()
    ref_eta = int(getattr(curves[0], "staleness", 0) or 0) if curves else 0
    target = getattr(study, "target", math.nan)
    pts: dict[int, list[float]] = {}
    if curves and math.isfinite(target):
        for c in curves:
            if c.batch != study.b_ref:
                continue
            n_ = c.samples_to_target(target)
            if n_ is not None and n_ > 0:
                pts.setdefault(int(getattr(c, "staleness", 0) or 0), []).append(n_)
    if len(pts) >= 2 and ref_eta in pts:
        xs = sorted(pts)
        ys = [float(np.mean(pts[k])) for k in xs]
        mult = float(np.interp(eta, xs, ys)) / float(np.mean(pts[ref_eta]))
        notes = [f"staleness: rho x{mult:.4g} at eta = {eta} from learning curves recorded at staleness "
                 f"{', '.join(map(str, xs))} (batch {study.b_ref}), linear in eta"]
        if eta < xs[0] or eta > xs[-1]:
            notes.append(f"staleness {eta} is outside the recorded {xs[0]}..{xs[-1]}: its sample cost is clamped to the nearest")
        return mult, notes
    if eta == ref_eta:
        return 1.0, []
    notes = [f"staleness: rho x1 assumed for eta = {eta} (flat up to eta = {STALENESS_FLAT_UP_TO} with an off-policy "
             f"correction; {AREAL_SOURCE}); without one (plain PPO/GRPO clipping) sample cost rises from eta = 2; record "
             "runs at this staleness (--trace, config staleness) for learning curves"]
    if eta > STALENESS_FLAT_UP_TO:
        notes.append(f"staleness {eta} is beyond eta = {STALENESS_FLAT_UP_TO}, where AReaL's final scores fall (41.0 at 8, 38.7 "
                     "at 16, 36.9 unbounded vs 42.0 synchronous): rho = 1 is optimistic here")
    return 1.0, notes
