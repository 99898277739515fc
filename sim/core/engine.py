"""The generation engine at engine-step granularity: continuous batching (vLLM V1-like).

Scheduling semantics (the same in both paths below):
- requests queue FIFO; at the start of every step the engine admits waiting requests while fewer than
  `max_num_seqs` run and the KV cache has blocks for their prompt;
- an admitted request prefills and samples its first token in that step, then decodes one token per step;
- the step's cost is the fitted model of its composition (`rlsim.replay.cost.EngineStepCost`: num_running,
  context tokens, prefill tokens), a closed form of the schedule's summed features (`RoundPlan.sums`);
- when a running sequence needs a KV block and none is free, the latest admitted running request is
  preempted (its blocks freed; it re-queues at the front and recomputes prompt + output on readmission).

Two implementations: `schedule_rounds` (and `schedule_round`, one round in O(B) memory), the exact fast path
when the KV cache cannot bind, vectorised across rounds; `run_round_steps`, the step-level loop with KV
accounting and preemption, advancing each stretch between batch-changing events in one SimPy timeout
(`Stretch.cost`). Per-sequence state lives in numpy arrays; there is no process per request. In detail:
docs/simulator.md, "The simulation".
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rlsim.core.config import EngineConfig
from rlsim.replay.cost import EngineStepCost, StepSums
from rlsim.replay.errors import RlsimError

# the KV look-ahead checks at most this many (sequence, step) pairs at once (8 MB of int64), so that its memory
# does not grow with max_num_seqs x response length
KV_CHECK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class KvCache:
    """vLLM's KV-cache policy, one place for both simulators (`run_round_steps` here, the split replicas in
    rlsim.modes.replica): a sequence of c context tokens holds ceil(c / block_size) blocks; admission is FIFO
    while blocks are free; when the running set outgrows the cache the latest admitted is preempted."""

    block_size: int = field(metadata={"help": "tokens per KV block"})
    blocks: int = field(metadata={"help": "KV blocks in the cache"})

    def need(self, context: np.ndarray) -> np.ndarray:
        """(n,) blocks each sequence of `context` tokens holds."""
        return -(-np.asarray(context, np.int64) // self.block_size)

    def preempt(self, blocks: np.ndarray) -> tuple[int, int]:
        """Running sequences in admission order holding `blocks`: (how many stay, blocks they use). The latest
        admitted leave first until the rest fit."""
        used, keep = int(blocks.sum()), len(blocks)
        while used > self.blocks and keep:
            keep -= 1
            used -= int(blocks[keep])
        return keep, used

    def admit(self, contexts: Iterable[int], used: int, running: int) -> tuple[int, int]:
        """Waiting sequences of `contexts` tokens, queue order, admitted one by one while their blocks fit:
        (how many, blocks then used). A first sequence that cannot fit even an empty cache is an error."""
        got = 0
        for c in contexts:
            nb = -(-int(c) // self.block_size)
            if used + nb > self.blocks:
                if not running and not got:
                    raise RlsimError(f"a request of {int(c)} context tokens does not fit the KV cache of "
                                     f"{self.blocks * self.block_size} tokens; pass a larger --kv-cache-tokens "
                                     f"(at least {nb * self.block_size})")
                break
            used += nb
            got += 1
        return got, used

    def horizon(self, context: np.ndarray, k: int) -> int:
        """Steps (1..k) the running set of (n,) `context` tokens, one more each step, runs before it overflows."""
        if int((-(-(np.asarray(context, np.int64) + (k - 1)) // self.block_size)).sum()) <= self.blocks:
            return k  # blocks only grow step by step: when the last step fits, every one before it does
        chunk = max(KV_CHECK_ELEMENTS // max(len(context), 1), 1)
        for j0 in range(0, k, chunk):
            j = np.arange(j0, min(j0 + chunk, k))
            need = (-(-(context[:, None] + j[None, :]) // self.block_size)).sum(axis=0)  # (steps,) blocks per step
            over = np.nonzero(need > self.blocks)[0]
            if len(over):
                return max(j0 + int(over[0]), 1)
        return k


@dataclass(frozen=True, eq=False)
class RoundPlan:
    """Schedules of a set of generation rounds (one per update)."""

    start: np.ndarray = field(metadata={"help": "(rounds, B) step at which each request was admitted"})
    steps: np.ndarray = field(metadata={"help": "(rounds,) engine steps in each round"})
    sum_running: np.ndarray = field(metadata={"help": "(rounds,) sum over steps of num_running"})
    sum_context: np.ndarray = field(metadata={"help": "(rounds,) sum over steps of context tokens"})
    sum_prefill: np.ndarray = field(metadata={"help": "(rounds,) sum over steps of prefill tokens"})
    preemptions: np.ndarray = field(metadata={"help": "(rounds,) preemptions (0 on the fast path)"})
    peak_kv_tokens: np.ndarray = field(metadata={"help": "(rounds,) most KV tokens allocated in one step"})
    peak_running: np.ndarray = field(metadata={"help": "(rounds,) most sequences in one step"})
    length: np.ndarray | None = field(default=None,
                                      metadata={"help": "(rounds, B) response lengths (for num_running per step)"})

    def sums(self, hist: bool = False) -> StepSums:
        """(rounds,) summed engine-step features; `hist`: with the (rounds, max n + 1) histogram of num_running
        (what a cost with hinges needs)."""
        return StepSums(self.steps, self.sum_running, self.sum_context, self.sum_prefill,
                        running_hist(self) if hist else None)


def schedule_rounds(prompt: np.ndarray, length: np.ndarray, max_num_seqs: int, prefill: np.ndarray | None = None,
                    block_size: int = 16) -> RoundPlan:
    """Exact continuous-batching schedule of independent rounds when the KV cache never binds.

    prompt, length: (rounds, B) integer arrays in queue order. Returns admission steps and summed
    features. Vectorised across rounds: one loop iteration per engine step of the longest admission phase.
    """
    prompt = np.asarray(prompt, np.int64)
    length = np.asarray(length, np.int64)
    U, B = length.shape
    if prefill is None:
        prefill = prompt
    start = np.zeros((U, B), np.int64)
    if B == 0:
        z = np.zeros(U)
        return RoundPlan(start, z.astype(np.int64), z, z, z, z.astype(np.int64), z, z.astype(np.int64))
    lmax = int(length.max())
    R = lmax + 1  # ring of slot releases: a request admitted at s frees its slot at s + L (L <= lmax)
    ring = np.zeros(U * R, np.int64)
    free = np.full(U, int(max_num_seqs), np.int64)
    ptr = np.zeros(U, np.int64)
    rows_all = np.arange(U)
    flat_len = length.ravel()
    start_flat = start.ravel()
    s = 0
    while True:
        pending = ptr < B
        if not pending.any():
            break
        m = np.minimum(free, B - ptr)
        m[~pending] = 0
        tot = int(m.sum())
        if tot:
            rows = np.repeat(rows_all, m)
            first = np.cumsum(m) - m
            idx = rows * B + np.repeat(ptr - first, m) + np.arange(tot)
            start_flat[idx] = s
            ring += np.bincount(rows * R + (s + flat_len[idx]) % R, minlength=U * R)
            free -= m
            ptr += m
        s += 1
        slot = s % R
        col = ring[slot::R]
        free += col
        ring[slot::R] = 0
    return _plan(start, prompt, length, prefill, max_num_seqs)


def _plan(start: np.ndarray, prompt: np.ndarray, length: np.ndarray, prefill: np.ndarray,
          max_num_seqs: int) -> RoundPlan:
    """RoundPlan of (rounds, B) admission steps: the summed features are closed forms of the lengths."""
    U, B = length.shape
    lmax = int(length.max())
    steps = (start + length).max(axis=1)
    sums = StepSums.of_requests(prompt, length, prefill, steps)
    n_peak = np.minimum(max_num_seqs, B)
    # peak KV tokens: bounded by the running sequences' longest contexts; exact value needs the step
    # arrays, the bound is enough for the capacity warning (the fast path is only used when it fits)
    peak_kv = np.full(U, float(n_peak * (prompt.max() + lmax)))
    return RoundPlan(start=start, steps=steps, sum_running=sums.running, sum_context=sums.context,
                     sum_prefill=sums.prefill, preemptions=np.zeros(U, np.int64), peak_kv_tokens=peak_kv,
                     peak_running=np.full(U, n_peak, np.int64), length=length)


def schedule_round(prompt: np.ndarray, length: np.ndarray, max_num_seqs: int, prefill: np.ndarray | None = None,
                   block_size: int = 16) -> RoundPlan:
    """`schedule_rounds` of one round (a RoundPlan of one row), in O(B + max length) memory.

    The same schedule (equal admission steps) for lengths >= 1; a length-0 request holds its slot for one
    step. One loop iteration per engine step at which slots free up: the requests admitted at a step are a
    contiguous run of the queue, their slot releases are added to a window of the next 2 x (lmax + 1)
    steps at once (a bincount of their lengths).
    """
    prompt = np.asarray(prompt, np.int64)
    length = np.asarray(length, np.int64)
    B = len(length)
    if prefill is None:
        prefill = prompt
    if B == 0:
        z = np.zeros(1)
        return RoundPlan(np.zeros((1, 0), np.int64), z.astype(np.int64), z, z, z, z.astype(np.int64), z,
                         z.astype(np.int64))
    rel_len = np.maximum(length, 1) if length.min() < 1 else length
    R = int(rel_len.max()) + 1
    ring = np.zeros(2 * R, np.int64)  # slot releases at steps base .. base + 2R - 1
    base = 0
    free = int(max_num_seqs)
    ptr = s = 0
    steps, ends = [], []  # the requests admitted at steps[k] are ends[k-1] .. ends[k] - 1 of the queue
    bincount, flatnonzero = np.bincount, np.flatnonzero
    while True:
        b = ptr + free
        steps.append(s)
        if b >= B:
            ends.append(B)
            break
        ends.append(b)  # every free slot is taken
        i = s - base  # < R: every release of a request admitted now falls inside the window
        ring[i:i + R] += bincount(rel_len[ptr:b], minlength=R)
        ptr = b
        # the next step at which slots free (all max_num_seqs run, so there is one within R steps)
        i += 1
        r = ring[i]
        if not r:
            i += int(flatnonzero(ring[i:])[0])
            r = ring[i]
        s = base + i
        free = int(r)
        if i >= R:  # slide the window by R steps
            ring[:R] = ring[R:]
            ring[R:] = 0
            base += R
    start = np.repeat(np.asarray(steps, np.int64), np.diff(np.asarray(ends, np.int64), prepend=0))
    return _plan(start[None], prompt[None], length[None], np.asarray(prefill)[None], max_num_seqs)


def running_per_step(plan: RoundPlan) -> list[np.ndarray]:
    """num_running of every engine step, one array per round (from the admission steps and lengths)."""
    if plan.length is None:
        return [np.zeros(0, np.int64) for _ in range(len(plan.steps))]
    out = []
    for s, L in zip(plan.start, plan.length):
        e = s + L
        K = int(e.max()) if len(e) else 0
        out.append(np.cumsum(np.bincount(s, minlength=K + 1) - np.bincount(e, minlength=K + 1))[:K])
    return out


def running_hist(plan: RoundPlan, size: int = 0) -> np.ndarray:
    """(rounds, max num_running + 1): engine steps of each round with each num_running."""
    per = running_per_step(plan)
    m = max([size] + [int(n.max()) + 1 for n in per if len(n)])
    return np.array([np.bincount(n, minlength=m) for n in per]).reshape(len(per), m)


def round_cost(gen: EngineStepCost, plan: RoundPlan) -> np.ndarray:
    """(rounds,) seconds of engine steps per round: the cost of the plan's summed features."""
    return gen.total(plan.sums(hist=bool(gen.hinges)))


def step_arrays(start: np.ndarray, length: np.ndarray, prompt: np.ndarray,
                prefill: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-step composition of one round from its schedule: num_running, context_tokens, prefill_tokens, finished."""
    start = np.asarray(start, np.int64)
    length = np.asarray(length, np.int64)
    prompt = np.asarray(prompt, np.int64)
    prefill = prompt if prefill is None else np.asarray(prefill, float)
    end = start + length
    K = int(end.max()) if len(end) else 0
    n = np.cumsum(np.bincount(start, minlength=K + 1) - np.bincount(end, minlength=K + 1))[:K]
    a = (prompt - start).astype(float)  # context of a request at step s is a + s
    ctx = np.cumsum(np.bincount(start, a, minlength=K + 1)
                    - np.bincount(end, a, minlength=K + 1))[:K] + np.arange(K) * n
    pre = np.bincount(start, np.asarray(prefill, float), minlength=K + 1)[:K]
    fin = np.bincount(end - 1, minlength=K + 1)[:K]
    return {"num_running": n.astype(np.int64), "context_tokens": ctx, "prefill_tokens": pre, "finished": fin}


@dataclass(frozen=True)
class Stretch:
    """A run of engine steps with one composition."""

    step: int = field(metadata={"help": "index of its first step in the round"})
    steps: int = field(metadata={"help": "how many steps"})
    num_running: int = field(metadata={"help": "sequences in each of its steps"})
    context0: float = field(metadata={"help": "context tokens of its first step (grows by num_running per step)"})
    prefill: float = field(metadata={"help": "prefill tokens of its first step"})
    finished: int = field(metadata={"help": "requests finishing in its last step"})
    kv_tokens: int = field(metadata={"help": "KV tokens allocated at its first step (blocks x block size)"})

    def cost(self, gen: EngineStepCost) -> float:
        """Seconds of its steps (closed form)."""
        return gen.stretch(self.steps, self.num_running, self.context0, self.prefill)

    def durations(self, gen: EngineStepCost) -> np.ndarray:
        """(steps,) seconds of each of its steps."""
        return gen.stretch_steps(self.steps, self.num_running, self.context0, self.prefill)

    def sums(self, hist: bool = False) -> StepSums:
        """Its summed engine-step features."""
        return StepSums.of_stretch(self.steps, self.num_running, self.context0, self.prefill, hist)


def run_round_steps(prompt: np.ndarray, length: np.ndarray, engine: EngineConfig, prefill_ratio: float = 1.0,
                    finish: np.ndarray | None = None):
    """The general step-level loop of one round (KV accounting, preemption). Yields (Stretch, requests
    preempted at its first step).

    State: per-request numpy arrays (prompt, target length, generated, admission order); the running
    set is an index array in admission order; the waiting queue a FIFO of indices. `finish`, when
    given, receives each request's last step. Memory: O(B) per-request arrays (the queue is an index
    into them plus a stack of preempted requests) and at most KV_CHECK_ELEMENTS numbers for the KV
    look-ahead; never B x steps.
    """
    p = np.asarray(prompt, np.int64)
    L = np.asarray(length, np.int64)
    B = len(L)
    kv = KvCache(engine.block_size, engine.kv_blocks)
    gen_done = np.zeros(B, np.int64)      # tokens generated so far
    nxt = 0                               # the next request never admitted (queue order)
    requeued: list[int] = []              # preempted requests, a stack in front of the queue: pop() gives the head
    running = np.zeros(0, np.int64)
    s = 0
    while len(running) or requeued or nxt < B:
        # 1. blocks the running set needs for this step; preempt the latest admitted until it fits
        keep, used = kv.preempt(kv.need(p[running] + gen_done[running]))
        requeued.extend(int(v) for v in running[keep:][::-1])
        preempted_now = len(running) - keep
        running = running[:keep]
        # 2. admit while slots and blocks allow (not in a step that preempted)
        pre_tok = 0.0
        admitted: list[int] = []
        if not preempted_now:
            slots = engine.max_num_seqs - len(running)
            queue = (requeued[::-1] + list(range(nxt, min(B, nxt + slots))))[:slots]
            m, used = kv.admit((int(p[j] + gen_done[j]) for j in queue), used, len(running))  # prompt + output
            for j in queue[:m]:
                if requeued:
                    requeued.pop()
                else:
                    nxt += 1
                admitted.append(j)
                pre_tok += p[j] * prefill_ratio if gen_done[j] == 0 else int(p[j] + gen_done[j])
        if admitted:
            running = np.concatenate([running, np.asarray(admitted, np.int64)])
        n = len(running)
        if n == 0:
            raise ValueError("engine stalled: no request fits")
        ctx = p[running] + gen_done[running]
        remaining = L[running] - gen_done[running]
        k = int(remaining.min())
        if k > 1:  # 3. KV overflow inside the stretch
            k = kv.horizon(ctx, k)
        gen_done[running] += k
        fin = gen_done[running] >= L[running]
        if finish is not None:
            finish[running[fin]] = s + k - 1
        yield Stretch(step=s, steps=k, num_running=n, context0=float(ctx.sum()), prefill=float(pre_tok),
                      finished=int(fin.sum()), kv_tokens=used * kv.block_size), preempted_now
        running = running[~fin]
        s += k


def round_plan_exact(prompt: np.ndarray, length: np.ndarray, engine: EngineConfig, prefill_ratio: float = 1.0):
    """Run `run_round_steps` for each round: (steps, sum_running, sum_context, sum_prefill, preemptions,
    peak_kv_tokens, peak_running, stretches) per round (the reference implementation)."""
    out = []
    for u in range(len(length)):
        st = [(x, pre) for x, pre in run_round_steps(prompt[u], length[u], engine, prefill_ratio)]
        sums = sum((x.sums() for x, _ in st), StepSums())
        out.append((sums.steps, sums.running, sums.context, sums.prefill, sum(pre for _, pre in st),
                    max(x.kv_tokens for x, _ in st), max(x.num_running for x, _ in st), [x for x, _ in st]))
    return out


def trained_mask(prompt_of: np.ndarray, finish: np.ndarray, group: int) -> np.ndarray:
    """Over-generation: per prompt, the first `group` responses to finish (ties: queue order)."""
    n = len(finish)
    order = np.lexsort((np.arange(n), finish, prompt_of))
    po = prompt_of[order]
    first = np.r_[0, np.nonzero(np.diff(po))[0] + 1]
    rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    mask = np.zeros(n, bool)
    mask[order[rank < group]] = True
    return mask
