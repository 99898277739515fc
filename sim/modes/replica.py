"""One engine replica of a split run (`rlsim.modes.split`): a SimPy process at engine-step granularity.

A replica is the recorded engine (`rlsim.core.engine`'s continuous batching): FIFO admission while slots and KV
blocks allow, prefill and first token in the admitting step, one token per step after, and when the KV cache
is full the latest admitted sequence is preempted (it recomputes its prompt and generated tokens when
re-admitted). It advances in closed-form stretches of steps with one composition, cut at the next finish or
KV overflow; with partial rollout a sync request interrupts a stretch, which ends with the step in progress.

Without KV accounting a replica plans a segment of stretches at once (`Replica.plan_ahead`): up to its next pull
from the shared queue, which must happen at its time, in turn with the other replicas. It hands each completed
prompt to the trainer at its time and applies the rest at the segment's end; anything another process does to
it (a sync request, the gate moving, a reclaim) cuts the segment after the step in progress. The run equals the
run made one stretch per SimPy event (tests/sim/test_segments.py), in a fraction of the events.
"""
from __future__ import annotations

import bisect
import heapq
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
    inflight: int = 0       # prompts it holds in flight at most, each until its last response finishes (0: no cap)


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

# A segment tracks at most this many of the running sequences' earliest finishes (np.partition's k): the planning's
# fixed cost (a partition of the running set) is shared by that many stretches at most.
SEGMENT_FINISHES = 256


@dataclass(eq=False)
class Segment:
    """Stretches a replica planned ahead (`Replica.plan`), applied (`Replica.commit`) as time reaches them. Row i,
    (step, steps, running, ctx, pre, host, fin, adm, groups, apply): a stretch of `steps` engine steps from `step`
    with `running` sequences, `ctx` context and `pre` prefill tokens at its first step, after `host` seconds of
    admission, over [t[i], t[i + 1]); `fin` sequences finish at its last step, `adm` were admitted from the wait
    queue at its first (after the first stretch's), prompts `groups` (a tuple) complete at its end; `apply`: a
    sequence of a shared prompt (`Requests.shared`) finishes there, so the segment is applied then (whether its
    prompt completes depends on other replicas)."""

    t: list[float]           # (stretches + 1,) start times, then the last one's end
    kv_tokens: int = 0       # KV tokens allocated (KV accounting on: one stretch)
    rows: list[tuple] = field(default_factory=list)
    a: list[int] = field(default_factory=list)      # admission steps of the sequences it admits, in queue order
    ids: list[int] = field(default_factory=list)    # ... their ids
    fresh: list[bool] = field(default_factory=list)  # ... whether first admitted (not resumed)
    done: int = 0            # stretches applied
    took: int = 0            # entries of `a` applied
    put: int = 0             # stretches seen through: their completed prompts went to the trainer

    def add(self, row: tuple, spec: ReplicaSpec) -> None:
        step, k, n, ctx, pre, host = row[:6]
        self.rows.append(row)
        self.t.append(self.t[-1] + host + spec.cost.stretch(k, n, ctx, pre) + spec.gap * k)

    def targets(self) -> list[int]:
        """Stretches at whose end the segment is applied: each that completes a prompt, and the last."""
        last = len(self.rows) - 1
        return [i for i, row in enumerate(self.rows) if (row[8] or row[9]) and i < last] + [last]

    def stretch(self, i: int, cut: int | None = None) -> Stretch:
        step, k, n, ctx, pre, _, fin = self.rows[i][:7]
        return Stretch(step=step, steps=k if cut is None else cut, num_running=n, context0=ctx, prefill=pre,
                       finished=fin if cut is None else 0, kv_tokens=self.kv_tokens)


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
        self.ahead = False                    # ... of a segment of several stretches: any interaction cuts it
        self.parked = False                   # a hybrid replica in trainer mode: it joins syncs, generates nothing
        self.switch_s = 0.0                   # seconds to switch to rollout before its next stretch (lent)
        self.stopped: simpy.Event | None = None  # (reclaimed) triggered once it has parked
        self.holding = 0                      # prompts it pulled whose last response has not finished
        self.used = SEGMENT_FINISHES          # finishes its last segment planned through (`plan_ahead`)
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
        if not self.wake() and (self.spec.partial or self.ahead) and self.in_stretch:
            self.in_stretch = False
            self.proc.interrupt()

    def room(self) -> int:
        """Prompts it may still pull: the cap on prompts in flight less those it holds (no cap: the engine's slots)."""
        return self.spec.inflight - self.holding if self.spec.inflight else self.spec.max_seqs

    def on_gate_open(self) -> None:
        """(AdmissionGate listener, refill) An idle replica wakes; one in a stretch with free slots (and room for a
        prompt) ends it after the step in progress, so the prompts admitted join at the next engine step, as vLLM
        schedules new requests."""
        if not self.wake() and self.in_stretch and not self.parked and self.room() > 0 and (
                self.ahead or len(self.b.run) < self.spec.max_seqs):
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
        for lo, hi in back:
            q.shared[lo // q.group:(hi - 1) // q.group + 1] = q.shared_any = True
        self.holding = 0  # what it held is the shared queue's now
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
        """The process: each pass joins a requested sync, or preempts, admits and runs one segment of stretches."""
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
            yield from self.run_segment(self.plan(used, pre, host))

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
        room = self.room()
        if b.nwait < free and room > 0 and self.gate.is_open(self.sync.version):
            lo, hi = self.gate.pull(self.sync.version, min(-(-(free - b.nwait) // G), room))
            b.wait.append((lo * G, hi * G))
            b.nwait += (hi - lo) * G
            self.holding += hi - lo
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
                q.fin[lo:hi] = q.L[lo:hi] + (s - 1)
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

    def plan(self, used: int, pre: float, host: float) -> Segment:
        """The steps ahead, after `host` seconds of admission with `pre` tokens to prefill: with KV accounting on, one
        stretch up to the next finish or KV overflow; else stretches up to the next interaction (`plan_ahead`)."""
        b, sp = self.b, self.spec
        if not sp.kv_bind:
            return self.plan_ahead(pre, host)
        k = int(b.last[b.last.argmin()]) - b.s + 1  # argmin: a fraction of ndarray.min's call overhead
        if k > 1:
            k = sp.kv.horizon(self.q.p[b.run] + (b.s - self.q.a[b.run]), k)
        seg = Segment([self.env.now], kv_tokens=used * sp.kv.block_size)
        seg.add((b.s, k, len(b.run), float(b.context()), float(pre), host,
                 int(np.count_nonzero(b.last == b.s + k - 1)), 0, (), False), sp)
        return seg

    def plan_ahead(self, pre: float, host: float) -> Segment:
        """Stretches from now, each up to the next finish, while nothing outside the replica can change their
        course: up to the next pull from the shared queue (made at its own time, in turn with the other replicas),
        until the running set empties, or through the earliest finishes it tracks (at most SEGMENT_FINISHES, fewer
        where a pull is due sooner). The sequences it admits come from the replica's own wait queue. Scalars and a
        heap of (last step, id, admission step, prompt tokens): a stretch costs microseconds here, where a SimPy
        event and array updates would cost tens."""
        b, q, sp = self.b, self.q, self.spec
        n, s, G = len(b.run), b.s, q.group
        admit = not self.sync.requested
        # a pull is due once slots free up: of sequences handed back, or of new prompts while the gate is open and
        # the cap on prompts in flight leaves room (which each prompt completed here adds to)
        resume, gate = admit and bool(self.gate.resume), admit and self.gate.is_open(self.sync.version)
        room = self.room()
        pull = resume or (gate and room > 0)
        nwait = b.nwait
        # finishes to track: a pull is due by then; and about twice what the last segment used (a prompt cap ends a
        # segment at a prompt's completion, long before the running set's finishes run out)
        m = min(n, SEGMENT_FINISHES, nwait + sp.max_seqs - n + 1 if pull else n, 2 * self.used + 16)
        v = int(np.partition(b.last, m - 1)[m - 1]) if m < n else int(b.last[b.last.argmax()])
        by_v = b.last <= v  # every running sequence that finishes by step v, ties included
        ids = b.run[by_v]
        heap = list(zip(b.last[by_v].tolist(), ids.tolist(), q.a[ids].tolist(), q.p[ids].tolist()))
        heapq.heapify(heap)
        wait, capped = iter(()), False  # capped: more wait than it took, so running out ends it too
        if nwait:  # the waiting ones it may admit
            w = np.fromiter(itertools.islice(itertools.chain.from_iterable(itertools.starmap(range, b.wait)),
                                             min(nwait, SEGMENT_FINISHES)), np.int64)
            wait = iter(zip(w.tolist(), q.p[w].tolist(), q.L[w].tolist(), q.pre0[w].tolist(),
                            (q.v0[w] >= 0).tolist(), q.done[w].tolist()))
            capped, nwait = len(w) < nwait, len(w)
        sum_p, sum_a, nadm, seg, left, togo = b.sum_p, b.sum_a, 0, Segment([self.env.now]), q.left, {}
        shared = q.shared if q.shared_any else None
        rows, t, T, stretch, gap, maxs = seg.rows, seg.t, seg.t[0], sp.cost.stretch, sp.gap, sp.max_seqs
        while True:
            f = heap[0][0]
            ctx, nfin, groups, apply = sum_p + n * s - sum_a, 0, (), False
            while heap and heap[0][0] == f:
                _, i, a, p = heapq.heappop(heap)
                nfin += 1
                sum_p -= p
                sum_a -= a
                g = i // G
                if shared is not None and shared[g]:  # its prompt may complete on another replica: applied then
                    apply = True
                    continue
                c = togo.get(g)
                togo[g] = c = (int(left[g]) if c is None else c) - 1  # the prompt's sequences still running
                if not c:
                    groups += (g,)
            if groups:
                room += len(groups)
                pull = resume or gate
            k = f - s + 1
            rows.append((s, k, n, ctx, pre, host, nfin, nadm, groups, apply))
            T += host + stretch(k, n, ctx, pre) + gap * k
            t.append(T)
            n, s, pre, host, nadm = n - nfin, f + 1, 0.0, 0.0, 0
            if not (n and heap) or ((pull or capped) and nwait < maxs - n):  # drained; next finish untracked;
                # a pull is due (or the wait taken runs out)
                if seg.ids:  # their start version, read by the trainer (staleness)
                    q.v0[[i for i, new in zip(seg.ids, seg.fresh) if new]] = b.version
                self.used = sum(row[6] for row in rows)
                return seg
            if not admit or not nwait:
                continue
            nadm, fresh = min(maxs - n, nwait), 0
            for i, p, L, pre0, again, done in itertools.islice(wait, nadm):
                if again:  # re-admitted: recompute its prompt and generated tokens
                    a = s - done
                    pre += p + done
                else:
                    a, fresh = s, fresh + 1
                    pre += pre0
                sum_p += p
                sum_a += a
                seg.a.append(a)
                seg.ids.append(i)
                seg.fresh.append(not again)
                if a + L - 1 <= v:
                    heapq.heappush(heap, (a + L - 1, i, a, p))
            n, nwait, host = n + nadm, nwait - nadm, sp.per_response * fresh

    def run_segment(self, seg: Segment):
        """(a generator) Wait out the segment, applying it at each stretch that completes a prompt (the trainer sees
        it then) and at its end. An interrupt (a sync request, the gate moving, a reclaim) cuts it after the engine
        step in progress."""
        env, st = self.env, self.stats
        self.ahead = len(seg.rows) > 1
        st.stretch_start, last = seg.t[0], len(seg.rows) - 1
        for T in seg.targets():
            try:
                self.in_stretch = True
                yield env.timeout(max(seg.t[T + 1] - env.now, 0.0))
            except simpy.Interrupt:
                self.in_stretch = False
                yield from self.cut(seg)
                break
            self.in_stretch = False
            if T == last or seg.rows[T][9]:
                self.commit(seg, T + 1)
            else:  # the trainer sees the prompt complete now; the replica's state catches up at the segment's end
                self.finished.put(np.array(seg.rows[T][8], np.int64))
                self.holding -= len(seg.rows[T][8])
                seg.put = T + 1
        if seg.took < len(seg.ids):  # planned admissions dropped by a cut: not started
            self.q.v0[[i for i, new in zip(seg.ids[seg.took:], seg.fresh[seg.took:]) if new]] = -1
        st.stretch_start, self.ahead = None, False

    def cut(self, seg: Segment):
        """(a generator) Interrupted now: the stretch in progress ends with its engine step in progress; what was
        planned after it is dropped."""
        e, sp = self.env.now, self.spec
        # the stretch in progress (or just ended); one after a stretch seen through (`put`) has begun
        i = bisect.bisect_left(seg.t, e - 1e-12, max(seg.done, seg.put) + 1) - 1
        _, k, n, ctx, pre, host = seg.rows[i][:6]
        cum = host + np.cumsum(sp.cost.stretch_steps(k, n, ctx, pre) + sp.gap)  # (k,) step ends from its start
        j = min(max(int(np.searchsorted(cum, e - seg.t[i] - 1e-12)) + 1, 1), k)
        end = seg.t[i] + float(cum[j - 1]) if j < k else seg.t[i + 1]
        if end > e:
            yield self.env.timeout(end - e)
        self.commit(seg, i + 1, j if j < k else None, end)

    def commit(self, seg: Segment, upto: int, cut: int | None = None, end: float | None = None) -> None:
        """Apply stretches seg.done..upto-1 (the last cut to `cut` steps, ending at `end`): their admissions, steps and
        finishes; prompts now complete go to the trainer."""
        b, sp, st = self.b, self.spec, self.stats
        i0, rows = seg.done, seg.rows[seg.done:upto]
        M = sum(row[7] for row in rows)
        if M:
            self.admit_planned(seg, i0, rows, M)
        b.s = rows[-1][0] + (rows[-1][1] if cut is None else cut)
        self.totals.steps += b.s - rows[0][0]  # the stretches' steps are consecutive
        end = seg.t[upto] if end is None else end
        st.busy += end - seg.t[i0]
        st.peak_running = max(st.peak_running, max(row[2] for row in rows))
        st.peak_kv = max(st.peak_kv, float(seg.kv_tokens) if sp.kv_bind else max(r[3] + r[2] * r[1] for r in rows))
        if self.rec.on:
            self.record(seg, i0, upto, cut)
        put = {g for row in seg.rows[i0:seg.put] for g in row[8]}  # prompts the trainer has already
        seg.done = upto
        if b.last[b.last.argmin()] >= b.s:  # no running sequence's last step is behind (argmin: see `plan`)
            return
        keep = b.last >= b.s
        out = b.run[~keep]
        b.run, b.last = b.run[keep], b.last[keep]
        if self.rec.on:
            ends = [row[0] + row[1] for row in seg.rows]  # exclusive end steps
            self.q.t1[out] = np.array(seg.t)[np.searchsorted(ends, self.q.fin[out], "right") + 1]
            self.q.v1[out] = b.version
        complete = self.leave(out)
        if put:
            complete = complete[[g not in put for g in complete.tolist()]]
        if len(complete):
            self.finished.put(complete)
            self.holding -= len(complete)
        if not len(b.run):
            self.rec.counter(lane_gen(self.r), "gen.running", end, 0.0)

    def admit_planned(self, seg: Segment, i0: int, rows: list[tuple], M: int) -> None:
        """The M planned admissions of `rows` (stretches i0..): the wait queue's first sequences join the running set
        at the steps planned (their start version is written at planning, `plan_ahead`)."""
        b, q = self.b, self.q
        parts = take_ranges(b.wait, M)
        idx = np.arange(*parts[0]) if len(parts) == 1 else np.concatenate([np.arange(lo, hi) for lo, hi in parts])
        b.nwait -= M
        a = np.array(seg.a[seg.took:seg.took + M], np.int64)
        if self.rec.on:  # which replica and when: the timeline's
            fresh = np.array(seg.fresh[seg.took:seg.took + M], bool)
            adm = [row[7] for row in rows]
            q.rep[idx[fresh]] = self.r
            q.t0[idx[fresh]] = np.repeat([seg.t[i0 + j] + row[5] for j, row in enumerate(rows)], adm)[fresh]
        seg.took += M
        q.a[idx] = a
        fin = a + q.L[idx] - 1
        q.fin[idx] = fin
        b.run, b.last = np.concatenate((b.run, idx)), np.concatenate((b.last, fin))
        b.sum_p += int(q.p[idx].sum())
        b.sum_a += int(a.sum())

    def record(self, seg: Segment, i0: int, upto: int, cut: int | None) -> None:
        """The timeline's engine steps of stretches i0..upto-1 (the last cut to `cut` steps)."""
        sp = self.spec
        for i in range(i0, upto):
            x = seg.stretch(i, cut if i == upto - 1 else None)
            d = x.durations(sp.cost)
            self.rec.stretch(self.r, x, seg.t[i] + seg.rows[i][5], d, self.b.version, float(x.kv_tokens or x.context0),
                             sp.kv_cache_tokens, sp.gap)

    def leave(self, out: np.ndarray) -> np.ndarray:
        """Sequences `out` finished: their prompts' counts go down. Returns the prompts now complete."""
        b, q = self.b, self.q
        if len(out) <= 64:  # the common case, a few sequences: numpy's per-call overhead would dominate
            b.sum_p -= sum(q.p[out].tolist())
            b.sum_a -= sum(q.a[out].tolist())
            left, complete = q.left, []
            for i in (out // q.group).tolist():
                left[i] -= 1
                if not left[i]:
                    complete.append(i)
            complete.sort()
            return np.array(complete, np.int64)
        b.sum_p -= int(q.p[out].sum())
        b.sum_a -= int(q.a[out].sum())
        g = out // q.group
        g0 = int(g.min())
        cnt = np.bincount(g - g0)  # sequences finished per prompt, from prompt g0
        gg = np.flatnonzero(cnt)
        g = gg + g0
        q.left[g] -= cnt[gg]
        return g[q.left[g] == 0]
