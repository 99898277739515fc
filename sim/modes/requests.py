"""The requests of a split run (`rlsim.modes.split`): drawn once, started under the staleness gate, finished by the
replicas, consumed by the trainer.

- `queue_lengths`: prompt and response lengths of every sequence the run may start, in queue order.
- `Requests`: their per-sequence and per-prompt state, numpy arrays indexed by sequence / prompt id.
- `AdmissionGate`: AReaL's staleness rule (rlsim.replay.admission) over the queue of prompts the replicas share.
- `FinishedGroups`: finished prompts not yet consumed, and the trainer's consumption rule.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.core.config import SimConfig
from rlsim.replay.admission import admitted, consumed
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels
from rlsim.core.workload import Workload


def queue_lengths(models: FittedModels, cfg: SimConfig, rng: np.random.Generator,
                  prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """(S,) prompt and (S,) response lengths of the first `prompts` prompts' S = prompts x G sequences, in queue
    order (prompt-major, P prompts per block, no over-generation): `rlsim.core.workload.Workload`'s rounds end to
    end."""
    P, G = cfg.prompts, cfg.group
    blocks = -(-prompts // P)
    wl = Workload.of(models, cfg, over_generate=False)
    for b, (_, lb) in enumerate((wl.recorded or ())[:blocks]):  # a block is a batch: P whole groups
        if len(lb) != P * G:
            raise RlsimError(f"recorded lengths: the trace's update {b} has {len(lb)} responses, not P x G = "
                             f"{P * G}; use sampled lengths")
    ps, ls = wl.draw(rng, blocks)
    return np.concatenate(ps), np.concatenate(ls)


@dataclass(eq=False)
class Requests:
    """Every sequence the run may start: S = NP x G, prompt-major (sequence i is response i % G of prompt i // G).

    Steps count on the replica that runs the sequence. A sequence admitted at (virtual) step a has s - a tokens
    generated before step s; a preempted one is re-admitted with a moved back by what it had generated."""

    group: int
    p: np.ndarray      # (S,) int64 prompt tokens
    L: np.ndarray      # (S,) int64 response tokens
    pre0: np.ndarray   # (S,) prefill tokens of a first admission (prompt x the trace's prefill ratio)
    cp: np.ndarray     # (S + 1,) prefix sums of p: sums over [lo, hi) ranges of sequence ids at once
    cpre: np.ndarray   # (S + 1,) prefix sums of pre0
    a: np.ndarray      # (S,) int64 virtual admission step
    fin: np.ndarray    # (S,) int64 step that produces its last token
    done: np.ndarray   # (S,) int64 tokens generated when preempted (0: never preempted)
    v0: np.ndarray     # (S,) int64 policy version its generation started under (-1: not started)
    v1: np.ndarray     # (S,) int64 policy version of its last token (timeline only)
    t0: np.ndarray     # (S,) start of the step that computed its first token (timeline only)
    t1: np.ndarray     # (S,) end of the step that computed its last token (timeline only; nan: not finished)
    rep: np.ndarray    # (S,) int64 replica that ran it
    cons: np.ndarray   # (S,) int64 update that consumed it (-1: none; timeline only)
    left: np.ndarray   # (NP,) int64 per prompt: sequences not finished
    pv: np.ndarray     # (NP,) int64 per prompt: the policy version it started under (int64 max: not started)
    shared: np.ndarray  # (NP,) bool per prompt: handed back by a reclaimed replica, so maybe on several replicas
    shared_any: bool = False  # whether any prompt is

    @classmethod
    def of(cls, p: np.ndarray, L: np.ndarray, group: int, prefill_ratio: float, timeline: bool = True) -> Requests:
        """The queue; without `timeline` the arrays only the timeline reads are left uninitialised (written, never
        read: filling S entries of each would cost a long run's queue a share of its simulation)."""
        S, NP = len(p), len(p) // group
        pre0 = p * prefill_ratio
        full = np.full if timeline else (lambda n, _fill, dtype=float: np.empty(n, dtype))
        return cls(group, p, L, pre0, np.concatenate([[0], np.cumsum(p)]), np.concatenate([[0.0], np.cumsum(pre0)]),
                   a=np.zeros(S, np.int64), fin=np.zeros(S, np.int64), done=np.zeros(S, np.int64),
                   v0=np.full(S, -1, np.int64), v1=full(S, -1, np.int64), t0=full(S, np.nan), t1=full(S, np.nan),
                   rep=full(S, -1, np.int64), cons=full(S, -1, np.int64), left=np.full(NP, group, np.int64),
                   pv=np.full(NP, np.iinfo(np.int64).max, np.int64), shared=np.zeros(NP, bool))


@dataclass(eq=False)
class AdmissionGate:
    """AReaL's staleness rule over the queue of prompts the replicas share: at policy version v a prompt starts
    only while prompts started (consumed, finished, running or waiting on a replica) < (eta + v + 1) x P, so
    the k-th P prompts to start start no earlier than version k - eta. The prompts it admits are dealt out
    evenly: one pull takes at most ceil(admitted, not yet started / replicas), as RL frameworks balance
    requests over their engines (else the first replicas would take a whole batch and the rest idle)."""

    prompts: int       # P
    staleness: float   # eta (a fraction admits that share of a batch ahead)
    pv: np.ndarray     # (NP,) Requests.pv: the gate writes each prompt's start version
    started: int = 0   # prompts started: the queue's head
    replicas: int = 1  # engine replicas sharing the queue
    refill: bool = False  # the bound moves with prompts released (trained or dropped), not with the version (verl V1)
    released: int = 0     # prompts trained or dropped so far
    listeners: list = field(default_factory=list)  # (refill) told when the bound moves: idle replicas wake
    resume: deque = field(default_factory=deque)   # [lo, hi) sequence ranges a reclaimed replica handed back
    bounds: dict = field(default_factory=dict)     # version -> bound (without refill), asked at every engine segment

    def bound(self, version: int) -> int:
        if self.refill:  # (eta + 1) x P dispatched ahead, one more per prompt released
            return min(admitted(self.staleness, 0, self.prompts) + self.released, len(self.pv))
        if version not in self.bounds:
            self.bounds[version] = min(admitted(self.staleness, version, self.prompts), len(self.pv))
        return self.bounds[version]

    def release(self, n: int, wake: bool = False) -> None:
        """(trainer) n prompts trained or dropped: with refill, as many new ones may start (`wake`: tell the replicas
        anyway, sequences were handed back)."""
        self.released += n
        if (self.refill and n) or wake:
            for tell in self.listeners:
                tell()

    def is_open(self, version: int) -> bool:
        return self.started < self.bound(version)

    def pull(self, version: int, want: int) -> tuple[int, int]:
        """Start up to `want` prompts at `version`: the [lo, hi) prompt ids started."""
        lo = self.started
        share = -(-(self.bound(version) - lo) // self.replicas)
        hi = min(self.bound(version), lo + min(want, max(share, 1)))
        self.pv[lo:hi] = version
        self.started = hi
        return lo, hi


class FinishedGroups:
    """Finished prompts (whole groups) not yet consumed, in completion order, and the consumption rule
    (rlsim.replay.admission.consumed): update u takes the P oldest started of them once that keeps every open
    prompt within the staleness limit, else it waits for more to finish.

    The rule picks P at once from everything finished, where a SimPy Store hands out one item per get, so the
    trainer waits on `ready`, a condition event: a replica triggers it once P are finished and the trainer
    re-checks the rule."""

    def __init__(self, env: simpy.Environment, prompts: int, staleness: float, pv: np.ndarray, *, fifo: bool = False,
                 off_policy: int = 0, wait: bool = False, oldest: bool = False, gate: AdmissionGate | None = None):
        self.env = env
        self.prompts = prompts
        self.staleness = staleness
        self.pv = pv                       # (NP,) Requests.pv: start versions, not started = int64 max
        self.items: deque[int] = deque()   # prompt ids, completion order
        self.ready: simpy.Event | None = None
        self.taken = np.zeros(len(pv), bool)
        self.open_from = 0                 # prompts below it have all been consumed
        self.fifo, self.off_policy, self.wait, self.oldest, self.gate = fifo, off_policy, wait, oldest, gate
        self.need = prompts                # finished prompts the waiting take needs before it weighs them
        self.finished = np.zeros(len(pv), bool)
        self.dropped = 0                   # groups evicted as too old (verl V1 drop)

    def put(self, prompts: np.ndarray) -> None:
        """(replica) Prompts whose last sequence just finished."""
        self.items.extend(prompts.tolist())
        self.finished[prompts] = True
        ev = self.ready
        if ev is not None and len(self.items) >= self.need and not ev.triggered:
            ev.succeed()

    def _pick(self, u: int, want: int) -> tuple[np.ndarray, np.ndarray | None]:
        if self.fifo:
            return self._pick_fifo(u, want)
        if len(self.items) < self.prompts:  # fewer than a batch finished: nothing to weigh yet
            return np.zeros(0, np.int64), None
        rg = np.fromiter(self.items, np.int64, len(self.items))
        started = int(np.searchsorted(self.pv, np.iinfo(np.int64).max, side="left"))
        window = np.arange(self.open_from, started)
        open_ = self.pv[window[~self.taken[window]]]
        return rg, consumed(self.pv[rg], open_, u, self.staleness, self.prompts)

    def _pick_fifo(self, u: int, want: int) -> tuple[np.ndarray, np.ndarray | None]:
        """verl's rules: drop evicts finished groups older than the threshold (a new prompt is dispatched for each);
        wait holds the take while a group in flight has reached it; then the first `want` in completion order, or
        (oldest, and with wait, so the awaited group is trained) the `want` started first (AReaL's wait_results:
        the finished results sorted by creation time)."""
        T = self.off_policy
        if T and not self.wait and self.items:
            rg = np.fromiter(self.items, np.int64, len(self.items))
            old = u - self.pv[rg] > T
            if old.any():
                self._mark(rg[old])
                self.items = deque(rg[~old].tolist())
                self.dropped += int(old.sum())
                if self.gate is not None:
                    self.gate.release(int(old.sum()))
        if len(self.items) < want:
            return np.zeros(0, np.int64), None
        rg = np.fromiter(self.items, np.int64, len(self.items))
        if T and self.wait:
            started = int(np.searchsorted(self.pv, np.iinfo(np.int64).max, side="left"))
            window = np.arange(self.open_from, started)
            running = window[~self.taken[window] & ~self.finished[window]]
            if len(running) and (u - self.pv[running] >= T).any():
                return rg, None
        if self.oldest or (T and self.wait):
            return rg, np.sort(np.argsort(rg, kind="stable")[:want])  # prompt ids are in start order
        return rg, np.arange(want)

    def _mark(self, ids: np.ndarray) -> None:
        self.taken[ids] = True
        while self.open_from < len(self.taken) and self.taken[self.open_from]:
            self.open_from += 1

    def wait_for(self, n: int):
        """(trainer; a generator) Until n finished prompts wait to be trained."""
        while len(self.items) < n:
            self.need = n
            self.ready = self.env.event()
            yield self.ready
            self.ready = None

    def take(self, u: int, want: int | None = None):
        """(trainer; a generator to `yield from`) The prompt ids update u consumes (P, or `want` of them with fifo),
        in completion order."""
        want = self.prompts if want is None else want
        self.need = want
        rg, pick = self._pick(u, want)
        while pick is None:
            self.ready = self.env.event()
            yield self.ready
            self.ready = None
            rg, pick = self._pick(u, want)
        keep = np.ones(len(rg), bool)
        keep[pick] = False
        self.items = deque(rg[keep].tolist())
        self._mark(rg[pick])
        if self.gate is not None:
            self.gate.release(len(pick))
        return rg[pick]
