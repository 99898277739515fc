"""One engine replica of a split run (`rlsim.modes.split`): a SimPy process at engine-step granularity.

A replica is the recorded engine (`rlsim.core.engine`'s continuous batching): FIFO admission while slots and KV
blocks allow, prefill and first token in the admitting step, one token per step after, and when the KV cache
is full the latest admitted sequence is preempted (it recomputes its prompt and generated tokens when
re-admitted). It advances in closed-form stretches of steps with one composition, cut at the next finish or
KV overflow; with partial rollout a sync request interrupts a stretch, which ends with the step in progress.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.modes.requests import AdmissionGate, FinishedGroups, Requests
from rlsim.modes.sync import WeightSync
from rlsim.modes.timeline import Recorder, lane_gen
from rlsim.core.engine import KvCache, Stretch
from rlsim.replay.cost import EngineStepCost

@dataclass(frozen=True)
class ReplicaSpec:
    """The recorded engine every replica is: its fitted costs and its limits."""

    cost: EngineStepCost   # seconds of an engine step from its batch composition
    gap: float             # fitted seconds between engine steps
    per_response: float    # fitted host seconds per admitted response
    max_seqs: int
    kv: KvCache            # the KV-cache policy (blocks, preemption)
    kv_cache_tokens: int
    kv_bind: bool          # KV accounting on: the cache can bind (or the exact engine is asked for)
    partial: bool          # partial rollout: join a sync at the next step boundary
    recompute: bool = True  # partial rollout: the in-flight responses' KV is prefilled again after the sync


@dataclass(eq=False)
class EngineTotals:
    """Counts over all replicas, read by the trainer per update."""

    steps: int = 0
    preemptions: int = 0


@dataclass(eq=False)
class EngineState:
    """A replica's sequences (ids into `Requests`). Context before step s = sum_p + n s - sum_a (n running)."""

    run: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # (n,) running, admission order
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,) their last steps: Requests.fin[run]
    wait: deque = field(default_factory=deque)  # [lo, hi) id ranges pulled, not running; preempted ones in front
    nwait: int = 0
    s: int = 0              # engine steps run so far
    sum_p: int = 0          # sum of p over the running set
    sum_a: int = 0          # sum of a over the running set
    recompute: float = 0.0  # tokens to prefill again at the next step (partial rollout across a sync)
    version: int = 0        # policy version of the replica's weights

    def context(self) -> int:
        return self.sum_p + len(self.run) * self.s - self.sum_a


@dataclass(eq=False)
class ReplicaStats:
    """What a replica measures for the run's outputs (idle ratio, peaks)."""

    busy: float = 0.0                   # seconds of finished stretches (steps, gaps, admission overhead)
    stretch_start: float | None = None  # start of the stretch in progress
    peak_running: int = 0
    peak_kv: float = 0.0                # KV tokens


def take_ranges(wait: deque, m: int) -> list[tuple[int, int]]:
    """Pop the first m ids of a queue of [lo, hi) ranges, as ranges."""
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


class Replica:
    """Replica r's process and state (module doc)."""

    def __init__(self, r: int, env: simpy.Environment, spec: ReplicaSpec, q: Requests, gate: AdmissionGate,
                 finished: FinishedGroups, sync: WeightSync, totals: EngineTotals, rec: Recorder):
        self.r, self.env, self.spec, self.q, self.gate = r, env, spec, q, gate
        self.finished, self.sync, self.totals, self.rec = finished, sync, totals, rec
        self.b = EngineState()
        self.stats = ReplicaStats()
        self.idle: simpy.Event | None = None  # set while nothing runs: the next sync request triggers it
        self.in_stretch = False               # waiting out a stretch that a sync request may interrupt
        self.parked = False                   # a hybrid replica in trainer mode: it joins syncs, generates nothing
        self.switch_s = 0.0                   # seconds to switch to rollout before its next stretch (lent)
        self.stopped: simpy.Event | None = None  # (reclaimed) triggered once it has parked
        sync.listeners.append(self.on_sync_request)
        gate.listeners.append(self.on_gate_open)
        self.proc = env.process(self.run())

    def wake(self) -> bool:
        """(AdmissionGate listener) An idle replica wakes to pull what the gate admits; whether it was idle."""
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()
            return True
        return False

    def on_sync_request(self) -> None:
        """(WeightSync listener) An idle replica wakes to join; with partial rollout one in a stretch is cut short.
        Idle replicas wake in replica order, the order they then join and start pulling prompts after the sync."""
        if not self.wake() and self.spec.partial and self.in_stretch:
            self.in_stretch = False
            self.proc.interrupt()

    def on_gate_open(self) -> None:
        """(AdmissionGate listener, refill) An idle replica wakes; one in a stretch with free slots ends it after the
        step in progress, so the prompts admitted join at the next engine step, as vLLM schedules new requests."""
        if not self.wake() and self.in_stretch and not self.parked and len(self.b.run) < self.spec.max_seqs:
            self.in_stretch = False
            self.proc.interrupt()

    def lend(self, switch_s: float) -> None:
        """(trainer) A parked hybrid replica switches to rollout (`switch_s` seconds), then pulls from the shared
        queue."""
        self.parked, self.switch_s = False, switch_s
        self.wake()

    def reclaim(self) -> simpy.Event:
        """(trainer) Switch back to trainer mode at the end of the engine step in progress; the event fires once parked.
        Its responses in flight keep their tokens and go back to the shared queue (`park`)."""
        self.parked, self.stopped = True, self.env.event()
        if not self.wake() and self.in_stretch:
            self.in_stretch = False
            self.proc.interrupt()
        return self.stopped

    def park(self):
        """(a generator) Hand every sequence back to the shared queue, the running ones with their tokens (resumed by
        any replica after a prefill of their prefix, as a preempted sequence is), then wait, parked."""
        b, q = self.b, self.q
        back = [(int(i), int(i) + 1) for i in b.run.tolist()]
        q.done[b.run] = b.s - q.a[b.run]
        back += list(b.wait)
        if back:
            self.gate.resume.extend(back)
            self.gate.release(0, wake=True)
        b.run, b.last, b.wait, b.nwait, b.sum_p, b.sum_a = b.run[:0], b.last[:0], deque(), 0, 0, 0
        if self.stopped is not None and not self.stopped.triggered:
            self.stopped.succeed()
        self.idle = self.env.event()
        yield self.idle
        self.idle = None

    def run(self):
        """The process: each pass joins a requested sync, or preempts, admits and runs one stretch of steps."""
        b = self.b
        while True:
            if self.sync.requested and (self.spec.partial or not len(b.run)):
                yield from self.join_sync()
                continue
            if self.parked:
                yield from self.park()
                continue
            if self.switch_s:  # a lent hybrid replica wakes its engine and loads the current weights
                t, d, self.switch_s = self.env.now, self.switch_s, 0.0
                yield self.env.timeout(d)
                self.rec.slice(lane_gen(self.r), "weight_load", "gen.switch", t, d)
                continue  # a reclaim or a sync request that came during the switch is seen first (else: idle forever)
            used, preempted = self.preempt()
            pre, b.recompute, host = b.recompute, 0.0, 0.0
            if not self.sync.requested and not preempted:
                used, pre, host = self.admit(used, pre)
            if not len(b.run):  # nothing to run: wait for a sync request or, with refill, for the gate to move
                self.idle = self.env.event()
                yield self.idle
                self.idle = None
                continue
            x, ends = self.plan(used, pre)
            x = yield from self.run_stretch(x, host)
            self.end_stretch(x, ends)

    def join_sync(self):
        b, n, tj = self.b, len(self.b.run), self.env.now
        yield self.sync.join(self.r)
        b.version = self.sync.version
        if n and self.spec.recompute:  # partial rollout: the running sequences' KV is recomputed on the new weights
            b.recompute += float(b.context())
        self.rec.slice(lane_gen(self.r), "weight_load", "gen.weight_sync", tj, self.env.now - tj,
                       policy_version=b.version, in_flight=n)
        self.rec.counter(lane_gen(self.r), "gen.running", tj, 0.0)

    def preempt(self) -> tuple[int, int]:
        """(KV blocks this step needs, sequences preempted): the latest admitted go back to the queue's front
        until the running set fits (rlsim.core.engine.KvCache)."""
        b, q, sp = self.b, self.q, self.spec
        if not (sp.kv_bind and len(b.run)):
            return 0, 0
        keep, used = sp.kv.preempt(sp.kv.need(q.p[b.run] + (b.s - q.a[b.run])))
        for victim in b.run[keep:][::-1].tolist():
            q.done[victim] = b.s - q.a[victim]
            b.sum_p -= int(q.p[victim])
            b.sum_a -= int(q.a[victim])
            b.wait.appendleft((victim, victim + 1))
        preempted = len(b.run) - keep
        b.run, b.last = b.run[:keep], b.last[:keep]
        b.nwait += preempted
        self.totals.preemptions += preempted
        return used, preempted

    def admit(self, used: int, pre: float) -> tuple[int, float, float]:
        """Pull whole prompts through the gate while slots are free, then admit FIFO while slots (and KV blocks)
        allow: (blocks used, prefill tokens, host seconds of admission)."""
        b, G = self.b, self.q.group
        free = self.spec.max_seqs - len(b.run)
        while self.gate.resume and b.nwait < free:  # sequences a reclaimed replica handed back: oldest first
            lo, hi = self.gate.resume.popleft()
            b.wait.append((lo, hi))
            b.nwait += hi - lo
        if b.nwait < free and self.gate.is_open(self.sync.version):
            lo, hi = self.gate.pull(self.sync.version, -(-(free - b.nwait) // G))
            b.wait.append((lo * G, hi * G))
            b.nwait += (hi - lo) * G
        m = min(free, b.nwait)
        if m and self.spec.kv_bind:
            m, used = self.fit_kv(m, used)
        host = 0.0
        if m:
            pre, host = self.start(m, pre)
        return used, pre, host

    def fit_kv(self, m: int, used: int) -> tuple[int, int]:
        """How many of the first m waiting sequences get KV blocks, one by one in queue order; blocks then used."""
        q = self.q
        waiting = itertools.islice(itertools.chain.from_iterable(range(lo, hi) for lo, hi in self.b.wait), m)
        return self.spec.kv.admit((int(q.p[i] + q.done[i]) for i in waiting), used, len(self.b.run))

    def start(self, m: int, pre: float) -> tuple[float, float]:
        """Admit the first m waiting sequences at step s: (prefill tokens, host seconds of their admission)."""
        b, q, s = self.b, self.q, self.b.s
        b.nwait -= m
        parts, fresh = take_ranges(b.wait, m), []
        for lo, hi in parts:
            if q.v0[lo] < 0:  # never started (a preempted sequence is a range of one)
                q.a[lo:hi] = s
                q.fin[lo:hi] = s + q.L[lo:hi] - 1
                q.v0[lo:hi] = b.version
                q.rep[lo:hi] = self.r
                pre += float(q.cpre[hi] - q.cpre[lo])
                b.sum_a += s * (hi - lo)
                fresh.append((lo, hi))
            else:  # re-admitted after a preemption: recompute its prompt and generated tokens
                dn = int(q.done[lo])
                q.a[lo] = s - dn
                q.fin[lo] = q.a[lo] + q.L[lo] - 1
                pre += float(q.p[lo] + dn)
                b.sum_a += int(q.a[lo])
            b.sum_p += int(q.cp[hi] - q.cp[lo])
        host = self.spec.per_response * sum(hi - lo for lo, hi in fresh)
        for lo, hi in fresh:
            q.t0[lo:hi] = self.env.now + host
        if len(parts) == 1:  # one range (the common case): slices, no index arrays
            lo, hi = parts[0]
            b.run = np.concatenate((b.run, np.arange(lo, hi, dtype=np.int64)))
            b.last = np.concatenate((b.last, q.fin[lo:hi]))
        else:
            new = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in parts])
            b.run = np.concatenate([b.run, new])
            b.last = np.concatenate([b.last, q.fin[new]])
        return pre, host

    def plan(self, used: int, pre: float) -> tuple[Stretch, np.ndarray]:
        """The next stretch of steps with this composition, up to the next finish (or KV overflow), and the (n,)
        mask of the running sequences that finish in its last step."""
        b, sp, st = self.b, self.spec, self.stats
        n = len(b.run)
        k = int(b.last[b.last.argmin()]) - b.s + 1  # argmin: a fraction of ndarray.min's call overhead
        if sp.kv_bind:
            if k > 1:
                k = sp.kv.horizon(self.q.p[b.run] + (b.s - self.q.a[b.run]), k)
            if used * sp.kv.block_size > st.peak_kv:
                st.peak_kv = float(used * sp.kv.block_size)
        elif b.sum_p + n * (b.s + k) - b.sum_a > st.peak_kv:
            st.peak_kv = float(b.sum_p + n * (b.s + k) - b.sum_a)
        if n > st.peak_running:
            st.peak_running = n
        ends = b.last == b.s + k - 1
        x = Stretch(step=b.s, steps=k, num_running=n, context0=float(b.context()), prefill=float(pre),
                    finished=int(np.count_nonzero(ends)), kv_tokens=used * sp.kv.block_size)
        return x, ends

    def run_stretch(self, x: Stretch, host: float):
        """(a generator) Wait out stretch x after `host` seconds of admission; with partial rollout a sync request
        cuts it after the step in progress. Returns the stretch as run."""
        env, sp, st = self.env, self.spec, self.stats
        k = x.steps
        dur = host + x.cost(sp.cost) + sp.gap * k
        tstart = st.stretch_start = env.now
        d = None
        try:
            self.in_stretch = True
            yield env.timeout(dur)
        except simpy.Interrupt:
            e = env.now - tstart
            d = x.durations(sp.cost)
            cum = host + np.cumsum(d + sp.gap)  # (k,) end of each step from the stretch's start
            j = min(max(int(np.searchsorted(cum, e - 1e-12)) + 1, 1), k)
            if j < k:
                x = Stretch(step=x.step, steps=j, num_running=x.num_running, context0=x.context0, prefill=x.prefill,
                            finished=0, kv_tokens=x.kv_tokens)
                d = d[:j]
                dur = float(cum[j - 1])
            self.in_stretch = False
            if dur > e:
                yield env.timeout(dur - e)
        self.in_stretch = False
        st.stretch_start = None
        st.busy += dur
        if self.rec.on:
            self.rec.stretch(self.r, x, tstart + host, x.durations(sp.cost) if d is None else d, self.b.version,
                             float(x.kv_tokens or x.context0), sp.kv_cache_tokens, sp.gap)
        return x

    def end_stretch(self, x: Stretch, ends: np.ndarray) -> None:
        """After stretch x: its finished sequences leave; prompts whose sequences have all finished go to the
        trainer."""
        b, q = self.b, self.q
        b.s += x.steps
        self.totals.steps += x.steps
        if not x.finished:
            return
        keep = ~ends
        out = b.run[ends]
        b.run, b.last = b.run[keep], b.last[keep]
        if self.rec.on:
            q.t1[out] = self.env.now
            q.v1[out] = b.version
        if x.finished == 1:  # the common case, in scalars: numpy's per-call overhead dominates at one sequence
            i = int(out[0])
            b.sum_p -= int(q.p[i])
            b.sum_a -= int(q.a[i])
            g1 = i // q.group
            q.left[g1] -= 1
            if not q.left[g1]:
                self.finished.put(out[:1] // q.group)
        else:
            self.leave(out)
        if not len(b.run):
            self.rec.counter(lane_gen(self.r), "gen.running", self.env.now, 0.0)

    def leave(self, out: np.ndarray) -> None:
        """Sequences `out` finished: their prompts' counts go down, and prompts now complete go to the trainer."""
        b, q = self.b, self.q
        b.sum_p -= int(q.p[out].sum())
        b.sum_a -= int(q.a[out].sum())
        g = out // q.group
        g0 = int(g.min())
        cnt = np.bincount(g - g0)  # sequences finished per prompt, from prompt g0
        gg = np.flatnonzero(cnt)
        g = gg + g0
        q.left[g] -= cnt[gg]
        complete = g[q.left[g] == 0]
        if len(complete):
            self.finished.put(complete)
