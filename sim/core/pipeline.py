"""The RL loop as a SimPy model: synchronous, colocated (generation and training share the device).

Per update: a generation round of B_gen >= B = P x G requests on the engine (rlsim.core.engine), then rewards,
batch preparation (old log-probs), the optimizer update, the weight sync and the rest of the step, each a
fitted cost. All state lives in the SimPy Environment and the objects this call creates; ids come from
a per-run counter; nothing is class-level.

Split devices and staleness (`SimConfig.split`) run in `rlsim.modes.split`, which shares this module's engine
semantics (`rlsim.core.engine.Stretch`), cost model (`rlsim.replay.cost`) and workload sampler
(`rlsim.core.workload`); `rlsim.modes.registry.simulate` picks one of the two by the config.

How a simulation runs: the rounds (`_Round`: one update's engine seconds, steps, peaks and trained tokens),
all at once (`_AllRounds`) up to ALL_ROUNDS_MAX_REQUESTS requests in all, else one at a time
(`_RoundByRound`, memory O(B_gen); with sampled lengths a Monte-Carlo sample of SAMPLED_REQUESTS requests'
rounds, its error in `SimRun.approximation`), each by `_fast_round` (closed form when the KV cache cannot bind)
or `_exact_round` (the step loop with KV accounting); then the loop (`_Loop`): one SimPy process per RL step,
and the timeline (`_Timeline`) when asked for. `check_memory` refuses a configuration above MEMORY_LIMIT_BYTES
in one line first. Sizes and paths in detail: docs/simulator.md, "The simulation".
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.core.config import SimConfig
from rlsim.core.engine import (RoundPlan, Stretch, run_round_steps, schedule_round, schedule_rounds, step_arrays,
                               trained_mask)
from rlsim.replay.cost import StepSums
from rlsim.replay.errors import RlsimError, name
from rlsim.replay.models import FittedModels
from rlsim.replay.timeline import LANE_GEN, LANE_HOST, LANE_RL, LANE_SYNC, LANE_TRAIN, Counter, Slice
from rlsim.core.workload import Workload

# Requests over all updates (U x B_gen) up to which every round is drawn at once and all rounds are scheduled
# together (`_AllRounds`: its draws, and so its numbers, differ from the round-by-round path's). ~88 bytes per request
# (measured with tracemalloc: 550 MB at U x B_gen = 6.5M), so at most ~180 MB here.
ALL_ROUNDS_MAX_REQUESTS = 1 << 21
# Beyond it, with sampled lengths, ceil(SAMPLED_REQUESTS / B_gen) distinct rounds are simulated (>= 1, <= U)
# and reused cyclically. Rounds are i.i.d. and a round's step time is a sum over its B_gen requests, so the
# relative spread of the sampled mean falls as 1/sqrt(rounds x B_gen) (>= SAMPLED_REQUESTS requests drawn).
# Measured on traces/grpo_p128.parquet (G=8, 100 updates, seeds 0-9), |sampled / every round - 1| of the
# mean responses/s, against the same path simulating all 100 rounds one by one: P=2048 (B_gen=16384,
# 32 rounds) max 1.8e-4; P=8192 (8 rounds) max 1.7e-4; P=65536 (1 round; seeds 0-4) max 8.8e-5. For scale,
# two all-rounds simulations with different draws (the Monte-Carlo noise the all-rounds path has)
# differ by up to 1.9e-4 at P=2048.
SAMPLED_REQUESTS = 1 << 19
SAMPLING_ERROR = 5e-4  # the bound stated in SimRun.approximation (2.8x the largest error measured)
# Refuse (RlsimError) a configuration whose estimated memory is above this: a laptop, CI runner or sweep
# worker (several configurations at once) has a few GB; past it a run would swap or be OOM-killed after
# minutes instead of failing at once with a fix.
MEMORY_LIMIT_BYTES = 2 << 30
BYTES_PER_REQUEST_ALL = 128    # all rounds at once, per request of every round (measured 88)
BYTES_PER_REQUEST_ROUND = 160  # round by round, per request of one round: draws, schedule, sums (measured 80)
BYTES_PER_TIMELINE_STEP = 1500  # record_timeline: one gen.step Slice (with its args) and two Counters (measured 900)

@dataclass(frozen=True)
class SplitResult:
    """What a split simulation (rlsim.modes.split) adds to its SimRun: the devices and limits it ran under and its
    measured collective and per-replica idle."""

    gen_gpus: int = field(metadata={"help": "generation engine replicas"})
    train_gpus: int = field(metadata={"help": "data-parallel training ranks"})
    staleness: float = field(metadata={"help": "staleness limit eta"})
    partial_rollout: bool = field(metadata={"help": "in-flight responses continued across a weight sync"})
    allreduce_s: float = field(metadata={
        "help": "seconds of the gradient all-reduce per update (0: one rank or fitted)"})
    allreduce_gbs: float = field(metadata={"help": "the all-reduce's bandwidth, GB/s"})
    bandwidth_source: str = field(metadata={"help": "where that bandwidth came from"})
    allreduce_fitted: bool = field(metadata={
        "help": "the collective is inside the fitted update (data-parallel reference)"})
    grad_bytes: float = field(metadata={"help": "gradient bytes all-reduced (the model's weight bytes)"})
    sync_s: float = field(metadata={"help": "seconds of one weight sync"})
    replica_idle: tuple[float, ...] = field(default=(), metadata={
        "help": "(replicas,) each replica's fraction of wall time running no engine step"})
    mode: str = field(default="split", metadata={"help": "the execution mode's registered name"})
    hybrid: bool = field(default=False, metadata={"help": "the replicas sat on the training devices"})
    chunks: int = field(default=1, metadata={"help": "trainer fetches per weight sync"})
    dropped: int = field(default=0, metadata={
        "help": "groups evicted as too old (verl V1 drop), their generation lost"})


@dataclass(frozen=True, eq=False)
class SimRun:
    """Result of one simulation: per-update arrays, totals, and the timeline when asked for."""

    responses_per_update: int = field(metadata={"help": "B = P x G responses trained per update"})
    step_time: np.ndarray = field(metadata={"help": "seconds of each RL step"})
    gen_time: np.ndarray = field(metadata={"help": "generation seconds of each step (engine steps + round overhead)"})
    train_time: np.ndarray = field(metadata={"help": "training seconds (batch preparation + optimizer update)"})
    sync_time: np.ndarray = field(metadata={"help": "weight-sync seconds"})
    other_time: np.ndarray = field(metadata={"help": "rewards and the rest of the step"})
    responses: np.ndarray = field(metadata={"help": "responses per update"})
    tokens: np.ndarray = field(metadata={"help": "tokens trained per update (prompt + response)"})
    gen_steps: np.ndarray = field(metadata={"help": "engine steps per generation round"})
    preemptions: np.ndarray = field(metadata={"help": "preempted requests per round (KV cache full)"})
    peak_kv_tokens: np.ndarray = field(metadata={"help": "most KV tokens in use in a step of each round"})
    peak_running: np.ndarray = field(metadata={"help": "most concurrent sequences in a step of each round"})
    total_time: float = field(metadata={"help": "simulated seconds at the end"})
    exact_engine: bool = field(default=False, metadata={"help": "the step-level loop (KV accounting) was used"})
    timeline: list = field(default_factory=list,
                           metadata={"help": "Slices (rlsim.replay.timeline) when record_timeline=True"})
    counters: list = field(default_factory=list,
                           metadata={"help": "Counters gen.running, gen.kv_usage when record_timeline=True"})
    rounds_simulated: int = field(default=0, metadata={"help": "distinct generation rounds simulated (= updates unless "
                                                               "rounds were reused)"})
    approximation: str = field(default="", metadata={"help": "empty when every update's round was simulated; else what "
                                                             "was sampled and its error"})
    features: dict = field(default_factory=dict, metadata={
        "help": "summed engine-step features over all updates: K steps, S1 running, S2 context, S3 prefill tokens, and "
                "hist (steps per num_running; only for a knee step model): any step-cost coefficients give the engine "
                "seconds from them (rlsim.replay.cost: StepSums, EngineStepCost.totals), which the intervals use"})
    gen_idle_ratio: float = field(default=math.nan, metadata={
        "help": "split runs: mean over replicas of the fraction of wall time running no engine step (nan: colocated)"})
    train_idle_ratio: float = field(default=math.nan, metadata={
        "help": "split runs: mean over ranks of the fraction of wall time neither computing nor communicating (nan: "
                "colocated)"})
    staleness_mean: float = field(default=0.0,
                                  metadata={"help": "mean policy versions a consumed sample lagged (0: synchronous)"})
    staleness_max: int = field(default=0, metadata={"help": "most policy versions a consumed sample lagged"})
    split: SplitResult | None = field(default=None, metadata={
        "help": "split runs (rlsim.modes.split): devices, staleness limit, all-reduce; None: colocated"})
    notes: tuple = field(default=(), metadata={"help": "the model's assumptions for this run (split runs)"})

    @property
    def responses_per_s(self) -> float:
        return float(self.responses.sum() / self.step_time.sum())

    @property
    def mean_step_time(self) -> float:
        return float(self.step_time.mean())


def _trained(p: np.ndarray, L: np.ndarray, finish: np.ndarray | None, extra: int, G: int,
             shared_prompts: bool) -> tuple[int, float]:
    """Responses trained on and tokens trained on, counted as the trace's num_tokens counts them."""
    n = len(L) - extra
    prompt_of = np.concatenate([np.arange(n) // G, np.arange(extra) % max(n // G, 1)])
    m = trained_mask(prompt_of, finish, G) if extra else np.ones(len(L), bool)
    if shared_prompts:  # one prompt per group (queue order is prompt-major: prompt j at j * G)
        ptok = p[np.unique(prompt_of[m]) * G].sum() if extra else p[0:n:G].sum()
    else:
        ptok = p[m].sum()
    return int(m.sum()), float(ptok + L[m].sum())


def memory_estimate(models: FittedModels, cfg: SimConfig, *, round_by_round: bool, record_timeline: bool = False,
                    rounds_kept: int = 0) -> dict[str, float]:
    """Bytes a simulation needs, by part: `workload` (lengths, schedules, sums: all rounds at once, or one
    round plus `rounds_kept` rounds kept for a timeline) and `timeline` (recorded Slices and Counters)."""
    U, B_gen = cfg.updates, cfg.gen_requests
    if round_by_round:
        work = B_gen * BYTES_PER_REQUEST_ROUND + rounds_kept * B_gen * 24
    else:
        work = U * B_gen * BYTES_PER_REQUEST_ALL
    tl = 0.0
    if record_timeline:
        mean_len = float(min(np.mean(models.lengths.response_tokens), cfg.engine.max_model_len))
        steps = B_gen * mean_len / max(min(cfg.engine.max_num_seqs, B_gen), 1) + 1
        tl = U * steps * BYTES_PER_TIMELINE_STEP
    return {"workload": float(work), "timeline": float(tl)}


def check_memory(models: FittedModels, cfg: SimConfig, *, round_by_round: bool, record_timeline: bool = False,
                 rounds_kept: int = 0) -> None:
    """Raise RlsimError (one line: what is too large, how to fix it) when `memory_estimate` exceeds
    MEMORY_LIMIT_BYTES; nothing is allocated before."""
    est = memory_estimate(models, cfg, round_by_round=round_by_round, record_timeline=record_timeline,
                          rounds_kept=rounds_kept)
    total = sum(est.values())
    if total <= MEMORY_LIMIT_BYTES:
        return
    U, P, G, B_gen = cfg.updates, cfg.prompts, cfg.group, cfg.gen_requests
    limit = f"over the simulator's limit of {MEMORY_LIMIT_BYTES / 2**30:g} GB (rlsim.core.pipeline.MEMORY_LIMIT_BYTES)"
    if est["timeline"] >= est["workload"]:
        what = (f"recording the timeline of {U} updates of {B_gen:,} requests needs about {total / 2**30:.1f} GB of "
                "memory")
        fix = f"pass fewer {name('updates')} or a smaller {name('prompts')}"
    elif round_by_round:
        per_prompt = BYTES_PER_REQUEST_ROUND * B_gen / P
        p_max = int((MEMORY_LIMIT_BYTES - est["timeline"]) / per_prompt)
        what = (f"one generation round of {B_gen:,} requests (P={P:,} x G={G}"
                f"{f', {B_gen - P * G:,} over-generated' if B_gen > P * G else ''}) needs about {total / 2**30:.1f} GB "
                "of memory")
        over = f" or {name('gen_batch')}" if B_gen > P * G else ""
        fix = (f"pass a smaller {name('prompts')} (at most about {p_max:,} prompts at {name('group')} {G}){over}"
               if p_max >= 1 else f"pass a smaller {name('group')}: one prompt's {G:,} responses alone are too many")
    else:
        what = f"all {U} rounds of {B_gen:,} requests at once need about {total / 2**30:.1f} GB of memory"
        fix = f"pass fewer {name('updates')} or a smaller {name('prompts')}"
    raise RlsimError(f"{what}, {limit}; {fix}")


@dataclass(frozen=True, eq=False)
class _Round:
    """One simulated generation round, summarised (what the loop needs of it)."""

    requests: int = field(metadata={"help": "requests generated (B_gen)"})
    engine_s: float = field(metadata={"help": "seconds of its engine steps, the gap after each step included"})
    steps: int = field(metadata={"help": "engine steps"})
    preemptions: int = field(metadata={"help": "requests preempted (KV cache full)"})
    peak_kv_tokens: float = field(metadata={"help": "most KV tokens in use in one step"})
    peak_running: int = field(metadata={"help": "most sequences in one step"})
    responses: int = field(metadata={"help": "responses trained on"})
    tokens: float = field(metadata={"help": "tokens trained on"})
    features: StepSums = field(metadata={"help": "its summed engine-step features"})
    schedule: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, metadata={
        "help": "fast path, for a timeline: (B_gen,) admission step, response and prompt lengths"})
    stretches: list[tuple[Stretch, int]] | None = field(default=None, metadata={
        "help": "exact path, for a timeline: its stretches and the requests preempted at each"})


def _needs_hist(models: FittedModels) -> bool:
    """Whether the summed features must keep the histogram of num_running (hinges: a knee or the interpolated
    form, fitted or replicated)."""
    reps = models.replicates
    return bool(models.gen.hinges) or (reps is not None and bool(np.any(reps.gen[:, 4::2] != 0)))


def _fast_round(models: FittedModels, cfg: SimConfig, plan: RoundPlan, row: int, sums: StepSums, cost: float,
                p: np.ndarray, L: np.ndarray, keep_timeline: bool) -> _Round:
    """Round `row` of a plan of the fast path (`schedule_rounds`: the KV cache cannot bind); `sums`: its features,
    `cost`: their seconds."""
    K = int(plan.steps[row])
    extra = max(cfg.gen_requests - cfg.responses_per_update, 0)
    finish = plan.start[row] + L - 1 if extra else None
    responses, tokens = _trained(p, L, finish, extra, cfg.group, models.shared_prompts)
    return _Round(requests=len(L), engine_s=float(cost) + models.gen_overhead.per_step * K, steps=K,
                  preemptions=0, peak_kv_tokens=float(plan.peak_kv_tokens[row]),
                  peak_running=int(plan.peak_running[row]), responses=responses, tokens=tokens, features=sums,
                  schedule=(plan.start[row], L, p) if keep_timeline else None)


def _exact_round(models: FittedModels, cfg: SimConfig, p: np.ndarray, L: np.ndarray, keep_timeline: bool) -> _Round:
    """One round by the step-level loop (`run_round_steps`: KV accounting, preemption), stretch by stretch."""
    gm, per_step = models.gen, models.gen_overhead.per_step
    extra = max(cfg.gen_requests - cfg.responses_per_update, 0)
    finish = np.zeros(len(L), np.int64) if extra else None
    stretches = [] if keep_timeline else None
    hist = _needs_hist(models)
    sums = StepSums.zero(hist)
    K = pre_n = peak_run = 0
    peak_kv = engine_s = 0.0
    for x, pre in run_round_steps(p, L, cfg.engine, models.lengths.prefill_ratio, finish):
        engine_s += x.cost(gm) + per_step * x.steps
        sums = sums + x.sums(hist)
        K += x.steps
        pre_n += pre
        peak_run = max(peak_run, x.num_running)
        peak_kv = max(peak_kv, x.kv_tokens)
        if stretches is not None:
            stretches.append((x, pre))
    responses, tokens = _trained(p, L, finish, extra, cfg.group, models.shared_prompts)
    return _Round(requests=len(L), engine_s=engine_s, steps=K, preemptions=pre_n, peak_kv_tokens=float(peak_kv),
                  peak_running=peak_run, responses=responses, tokens=tokens, features=sums, stretches=stretches)


class _AllRounds:
    """Every round drawn at once; on the fast path every round scheduled at once, vectorised across rounds
    (one plan when the rounds are of one size), the exact path round by round as the loop reaches it."""

    def __init__(self, models: FittedModels, cfg: SimConfig, rng: np.random.Generator, keep_timeline: bool):
        self.models, self.cfg, self.keep_timeline = models, cfg, keep_timeline
        self.rounds = cfg.updates
        eng = cfg.engine
        self.prompts, self.lengths = Workload.of(models, cfg).draw(rng, cfg.updates)
        max_ctx = min(max(int((p + L).max()) for p, L in zip(self.prompts, self.lengths)), eng.max_model_len)
        self.exact = cfg.exact_engine or eng.kv_can_bind(max_ctx, max(len(L) for L in self.lengths))
        # per update: its plan, its row there, the plan's (rounds,) summed features and their seconds
        self._plans: list[tuple[RoundPlan, int, StepSums, np.ndarray]] = []
        if self.exact:
            return
        ratio, hist = models.lengths.prefill_ratio, _needs_hist(models)
        if len({len(L) for L in self.lengths}) == 1:
            P, L = np.stack(self.prompts), np.stack(self.lengths)  # (rounds, B_gen)
            plan = schedule_rounds(P, L, eng.max_num_seqs, P * ratio, eng.block_size)
            sums = plan.sums(hist)
            costs = models.gen.total(sums)
            self._plans = [(plan, u, sums, costs) for u in range(cfg.updates)]
        else:
            for p, L in zip(self.prompts, self.lengths):
                plan = schedule_rounds(p[None], L[None], eng.max_num_seqs, p[None] * ratio, eng.block_size)
                sums = plan.sums(hist)
                self._plans.append((plan, 0, sums, models.gen.total(sums)))

    def get(self, u: int) -> _Round:
        p, L = self.prompts[u], self.lengths[u]
        if self.exact:
            return _exact_round(self.models, self.cfg, p, L, self.keep_timeline)
        plan, row, sums, costs = self._plans[u]
        return _fast_round(self.models, self.cfg, plan, row, sums.row(row), costs[row], p, L, self.keep_timeline)

    def approximation(self) -> str:
        return ""


class _RoundByRound:
    """Generation rounds drawn and simulated one at a time, on demand in update order (memory O(B_gen)).

    Round of update u: recorded lengths replay the trace's update u mod its updates (with over-generated
    extras drawn per update); sampled lengths draw `rounds` distinct rounds and update u reuses round
    u mod `rounds`. A round is kept (its summary, and its arrays for a timeline) only while later updates
    reuse it.
    """

    def __init__(self, models: FittedModels, cfg: SimConfig, rng: np.random.Generator, max_rounds: int | None,
                 keep_timeline: bool):
        self.models, self.cfg, self.rng, self.keep_timeline = models, cfg, rng, keep_timeline
        self.workload = Workload.of(models, cfg)
        U = cfg.updates
        if self.workload.recorded is not None:
            self.period = U if self.workload.extra else len(self.workload.recorded)
            self.sampled = False
        else:
            S = -(-SAMPLED_REQUESTS // max(cfg.gen_requests, 1)) if max_rounds is None else max_rounds
            self.period = max(int(S), 1)
            self.sampled = self.period < U
        self.rounds = min(U, self.period)
        self.exact = cfg.exact_engine or cfg.engine.kv_can_bind(min(self.workload.context_bound(),
                                                                    cfg.engine.max_model_len), cfg.gen_requests)
        self._kept: dict[int, _Round] = {}

    def _simulate(self, key: int) -> _Round:
        models, eng = self.models, self.cfg.engine
        ps, ls = self.workload.draw(self.rng, 1, first=key)
        p, L = ps[0], ls[0]
        if self.exact:
            return _exact_round(models, self.cfg, p, L, self.keep_timeline)
        plan = schedule_round(p, L, eng.max_num_seqs, p * models.lengths.prefill_ratio, eng.block_size)
        sums = plan.sums(_needs_hist(models))
        return _fast_round(models, self.cfg, plan, 0, sums.row(0), models.gen.total(sums)[0], p, L, self.keep_timeline)

    def get(self, u: int) -> _Round:
        key = u % self.period
        r = self._kept.get(key)
        if r is None:
            r = self._simulate(key)
            if u + self.period < self.cfg.updates:  # a later update reuses it
                self._kept[key] = r
        return r

    def approximation(self) -> str:
        if not self.sampled:
            return ""
        return (f"{self.rounds} distinct generation rounds of {self.cfg.gen_requests:,} requests simulated for "
                f"{self.cfg.updates} updates (update u reuses round u mod {self.rounds}): responses/s within about "
                f"{100 * SAMPLING_ERROR:.2g}% of simulating every round")


class _Timeline:
    """The slices and counters of a simulation being recorded (rlsim.replay.timeline), ids from one counter."""

    def __init__(self, models: FittedModels, cfg: SimConfig):
        self.slices: list[Slice] = []
        self.counters: list[Counter] = []
        self.ids = itertools.count()
        self.gen, self.per_step = models.gen, models.gen_overhead.per_step
        self.ratio, self.kv_cache_tokens = models.lengths.prefill_ratio, cfg.engine.kv_cache_tokens

    def add(self, lane: str, track: str, name: str, t: float, dur: float, **args) -> None:
        self.slices.append(Slice(lane, track, name, t, dur, {"id": next(self.ids), **args}))

    def _step(self, t: float, d: float, u: int, n: int, ctx: float, pre: float, finished: int,
              kv_tokens: float) -> None:
        self.add(LANE_GEN, "gen_step", "gen.step", t, d, update=u, num_running=n, context_tokens=ctx,
                 prefill_tokens=pre, finished=finished)
        self.counters.append(Counter(LANE_GEN, "gen.running", t, float(n)))
        self.counters.append(Counter(LANE_GEN, "gen.kv_usage", t, float(min(kv_tokens / self.kv_cache_tokens, 1.0))))

    def schedule(self, t: float, u: int, start: np.ndarray, L: np.ndarray, p: np.ndarray) -> None:
        """A round of the fast path from its schedule: its engine steps, starting at t."""
        sa = step_arrays(start, L, p, p * self.ratio)
        d = self.gen.step(sa["num_running"], sa["context_tokens"], sa["prefill_tokens"])  # (K,) seconds
        starts = t + np.concatenate([[0.0], np.cumsum(d + self.per_step)[:-1]])
        for k in range(len(d)):
            ctx = float(sa["context_tokens"][k])
            self._step(float(starts[k]), float(d[k]), u, int(sa["num_running"][k]), ctx, float(sa["prefill_tokens"][k]),
                       int(sa["finished"][k]), ctx)

    def stretch(self, t: float, u: int, x: Stretch) -> None:
        """One stretch of the step-level loop, starting at t."""
        d = x.durations(self.gen)  # (steps,) seconds
        for k in range(x.steps):
            self._step(t, float(d[k]), u, x.num_running, x.context0 + k * x.num_running, x.prefill if k == 0 else 0.0,
                       x.finished if k == x.steps - 1 else 0, float(x.kv_tokens))
            t += float(d[k]) + self.per_step


class _Loop:
    """The SimPy model of the synchronous colocated RL loop over precomputed rounds."""

    def __init__(self, models: FittedModels, cfg: SimConfig, rounds: _AllRounds | _RoundByRound, record_timeline: bool):
        self.models, self.cfg, self.rounds = models, cfg, rounds
        self.env = simpy.Environment()
        self.tl = _Timeline(models, cfg) if record_timeline else None
        U = cfg.updates
        self.per = dict(step_time=np.zeros(U), gen_time=np.zeros(U), train_time=np.zeros(U), sync_time=np.zeros(U),
                        other_time=np.zeros(U), responses=np.zeros(U), tokens=np.zeros(U),
                        gen_steps=np.zeros(U, np.int64),
                        preemptions=np.zeros(U, np.int64), peak_kv_tokens=np.zeros(U),
                        peak_running=np.zeros(U, np.int64))
        self.features = StepSums.zero(_needs_hist(models))

    def generate(self, u: int):
        """Round u: the round overhead, then its engine steps; returns (seconds, the round)."""
        env, tl, ov = self.env, self.tl, self.models.gen_overhead
        r = self.rounds.get(u)
        self.features = self.features + r.features
        t0 = env.now
        yield env.timeout(float(ov.base + ov.per_response * r.requests))
        if tl is not None and r.stretches is not None:
            for x, _ in r.stretches:
                tl.stretch(env.now, u, x)
                yield env.timeout(x.cost(self.models.gen) + ov.per_step * x.steps)
        else:
            if tl is not None:
                tl.schedule(env.now, u, *r.schedule)
            yield env.timeout(r.engine_s)
        for k, v in (("gen_steps", r.steps), ("preemptions", r.preemptions), ("peak_running", r.peak_running),
                     ("peak_kv_tokens", r.peak_kv_tokens)):
            self.per[k][u] = v
        if tl is not None:
            tl.add(LANE_GEN, "gen_round", "gen.round", t0, env.now - t0, update=u, requests=r.requests)
        return env.now - t0, r

    def phase(self, lane: str, track: str, name: str, dur: float, u: int):
        t = self.env.now
        yield self.env.timeout(dur)
        if self.tl is not None:
            self.tl.add(lane, track, name, t, dur, update=u)

    def rl_steps(self):
        m, env, per = self.models, self.env, self.per
        for u in range(self.cfg.updates):
            t0 = env.now
            g, r = yield env.process(self.generate(u))
            B, tokens = r.responses, r.tokens
            rew = max(float(m.reward.predict(B)), 0.0)
            prep = max(float(m.prep.predict(tokens)), 0.0)
            upd = max(float(m.update.predict(tokens)), 0.0)
            syn = max(float(m.sync.predict(m.sync_bytes)), 0.0)
            oth = max(float(m.other.predict(B)), 0.0)
            yield from self.phase(LANE_HOST, "reward", "host.reward", rew, u)
            yield from self.phase(LANE_TRAIN, "prep", "train.prep", prep, u)
            yield from self.phase(LANE_TRAIN, "update", "train.update", upd, u)
            yield from self.phase(LANE_SYNC, "sync", "sync.weights", syn, u)
            yield from self.phase(LANE_HOST, "other", "host.other", oth, u)
            if self.tl is not None:
                self.tl.add(LANE_RL, "rl_step", "rl.step", t0, env.now - t0, update=u, responses=B)
            for k, v in (("step_time", env.now - t0), ("gen_time", g), ("train_time", prep + upd), ("sync_time", syn),
                         ("other_time", rew + oth), ("responses", B), ("tokens", tokens)):
                per[k][u] = v

    def run(self) -> SimRun:
        self.env.process(self.rl_steps())
        self.env.run()
        timeline, counters = [], []
        if self.tl is not None:
            timeline = sorted(self.tl.slices, key=lambda s: (s.start, -s.dur))
            counters = sorted(self.tl.counters, key=lambda c: c.t)
        r = self.rounds
        return SimRun(responses_per_update=self.cfg.responses_per_update, total_time=float(self.env.now),
                      exact_engine=r.exact, timeline=timeline, counters=counters, rounds_simulated=r.rounds,
                      approximation=r.approximation(), features=self.features.to_dict(), **self.per)


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
             round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    """Simulate `cfg.updates` RL steps of the colocated loop with the fitted models (a config with a split:
    `rlsim.modes.registry.simulate`). Deterministic given the rng state.

    round_by_round: None picks by size (U x B_gen > ALL_ROUNDS_MAX_REQUESTS: one round at a time); True or
    False forces it. max_rounds: distinct rounds simulated round by round with sampled lengths (None:
    ceil(SAMPLED_REQUESTS / B_gen); >= updates simulates every round). Raises RlsimError before
    allocating when the estimated memory is over MEMORY_LIMIT_BYTES.
    """
    cfg.validate()
    if cfg.split is not None:
        raise RlsimError("rlsim.core.pipeline.simulate runs the colocated loop; a SimConfig with a split runs in "
                         "rlsim.modes.split.simulate_split (rlsim.modes.registry.simulate picks by the config)")
    U = cfg.updates
    if round_by_round is None:
        round_by_round = U * cfg.gen_requests > ALL_ROUNDS_MAX_REQUESTS
    if round_by_round:
        rounds = _RoundByRound(models, cfg, rng, max_rounds, record_timeline)
        check_memory(models, cfg, round_by_round=True, record_timeline=record_timeline,
                     rounds_kept=rounds.rounds if record_timeline and rounds.rounds < U else 0)
    else:
        check_memory(models, cfg, round_by_round=False, record_timeline=record_timeline)
        rounds = _AllRounds(models, cfg, rng, record_timeline)
    return _Loop(models, cfg, rounds, record_timeline).run()
