"""The RL loop as a SimPy model: synchronous, colocated (generation and training share the device).

Per update: a generation round of B = P x G requests on the engine (sim.engine), then rewards, batch
preparation (old log-probs), the optimizer update, the weight sync and the rest of the step, each a
fitted cost. All state lives in the SimPy Environment and the objects this call creates; ids come from
a per-run counter; nothing is class-level.

Split devices and staleness (`SimConfig.split`): `simulate` hands the run to `rlsim.asyncrl.simulate_split`
(engine replicas pulling from a shared queue under a staleness gate, a trainer consuming finished batches);
the engine's step semantics (`rlsim.engine.Stretch`) and the cost models are shared.

Size. Per-update arrays are O(U); the generation workload is O(B_gen) per round. Up to
ALL_ROUNDS_MAX_REQUESTS requests in all (U x B_gen) every round's lengths are drawn at once and all
rounds are scheduled together (vectorised across rounds; the original path, its draws and numbers
unchanged). Beyond it the rounds are drawn and simulated one at a time (`_RoundByRound`, memory
O(B_gen), never U x B nor B x steps):
- exact: every round's schedule (`schedule_round`, the same admission steps as `schedule_rounds`, or
  the step-level loop with KV accounting), its step-cost sums and its trained tokens; recorded lengths
  without over-generation repeat with the trace's period and are computed once per distinct round;
- approximate: with sampled lengths only ceil(SAMPLED_REQUESTS / B_gen) rounds are drawn and simulated
  (at least 1, at most U) and update u reuses round u mod that number. Rounds are i.i.d., so this is a
  Monte-Carlo sample of fewer rounds; its error is stated in `SimRun.approximation` (measured, see
  SAMPLED_REQUESTS).
Before allocating, `check_memory` estimates the bytes a configuration needs and raises RlsimError
(one line: what is too large, how to fix it) above MEMORY_LIMIT_BYTES.

Size: one SimPy model and the two workload strategies it needs (all rounds at once, round by round),
kept together because both feed the same process and must draw identically.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import FittedModels
from rlsim.replay.timeline import LANE_GEN, LANE_HOST, LANE_RL, LANE_SYNC, LANE_TRAIN, Counter, Slice
from rlsim.config import SimConfig
from rlsim.engine import (round_cost, run_round_steps, running_hist, schedule_round, schedule_rounds, step_arrays,
                          trained_mask)

# Requests over all updates (U x B_gen) up to which every round is drawn at once and all rounds are scheduled
# together: the original path (its random draws, hence its numbers, are kept). ~88 bytes per request
# (measured with tracemalloc: 550 MB at U x B_gen = 6.5M), so at most ~180 MB here.
ALL_ROUNDS_MAX_REQUESTS = 1 << 21
# Beyond it, with sampled lengths, ceil(SAMPLED_REQUESTS / B_gen) distinct rounds are simulated (>= 1, <= U)
# and reused cyclically. Rounds are i.i.d. and a round's step time is a sum over its B_gen requests, so the
# relative spread of the sampled mean falls as 1/sqrt(rounds x B_gen) (>= SAMPLED_REQUESTS requests drawn).
# Measured on traces/grpo_p128.parquet (G=8, 100 updates, seeds 0-9), |sampled / every round - 1| of the
# mean responses/s, against the same path simulating all 100 rounds one by one: P=2048 (B_gen=16384,
# 32 rounds) max 1.8e-4; P=8192 (8 rounds) max 1.7e-4; P=65536 (1 round; seeds 0-4) max 8.8e-5. For scale,
# two all-rounds simulations with different draws (the Monte-Carlo noise the original path already has)
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

@dataclass(frozen=True, eq=False)
class SimRun:
    """Result of one simulation: per-update arrays, totals, and the timeline when asked for."""

    batch: int = field(metadata={"help": "responses per update"})
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
    timeline: list = field(default_factory=list, metadata={"help": "Slices (rlsim.replay.timeline) when record_timeline=True"})
    counters: list = field(default_factory=list, metadata={"help": "Counters gen.running, gen.kv_usage when record_timeline=True"})
    rounds_simulated: int = field(default=0, metadata={"help": "distinct generation rounds simulated (= updates unless rounds were reused)"})
    approximation: str = field(default="", metadata={"help": "empty when every update's round was simulated; else what was sampled and its error"})
    features: dict = field(default_factory=dict, metadata={
        "help": "summed engine-step features over all updates: K steps, S1 running, S2 context, S3 prefill tokens, and "
                "hist (steps per num_running; only for a knee step model): any step-cost coefficients give the engine "
                "seconds from them (replay.calibration.engine_seconds), which the intervals use"})
    gen_idle_ratio: float = field(default=math.nan, metadata={
        "help": "split runs: mean over replicas of the fraction of wall time running no engine step (nan: colocated)"})
    train_idle_ratio: float = field(default=math.nan, metadata={
        "help": "split runs: mean over ranks of the fraction of wall time neither computing nor communicating (nan: colocated)"})
    staleness_mean: float = field(default=0.0, metadata={"help": "mean policy versions a consumed sample lagged (0: synchronous)"})
    staleness_max: int = field(default=0, metadata={"help": "most policy versions a consumed sample lagged"})
    split: dict = field(default_factory=dict, metadata={"help": "split runs (rlsim.asyncrl): devices, staleness limit, all-reduce; empty: colocated"})
    notes: tuple = field(default=(), metadata={"help": "the model's assumptions for this run (split runs)"})

    @property
    def responses_per_s(self) -> float:
        return float(self.responses.sum() / self.step_time.sum())

    @property
    def mean_step_time(self) -> float:
        return float(self.step_time.mean())


def _workload(models: FittedModels, cfg: SimConfig, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Per round: prompt lengths and response lengths of the B_gen requests in queue order (P x G
    prompt-major, then over-generated extras cycling over the prompts); and the extras count."""
    U, P, G = cfg.updates, cfg.prompts, cfg.group
    extra = cfg.gen_requests - cfg.batch
    if cfg.lengths == "recorded":
        wl = models.recorded.workload
        if not wl or any(len(w[1]) == 0 for w in wl):
            raise RlsimError("the trace's response rows do not cover its updates; replay with sampled lengths")
        ps = [wl[u % len(wl)][0].astype(np.int64) for u in range(U)]
        ls = [wl[u % len(wl)][1].astype(np.int64) for u in range(U)]
    else:
        p, L = models.lengths.sample(rng, P, G, rounds=U)
        ps, ls = list(p), list(L)
    if extra > 0:
        # lengths of the responses generated but not trained on are not recorded: drawn from the distribution
        ex = rng.choice(models.lengths.response_tokens, size=(U, extra)).astype(np.int64)
        for u in range(U):
            n_prompts = max(len(ls[u]) // G, 1)
            pe = ps[u][(np.arange(extra) % n_prompts) * G]
            ps[u] = np.concatenate([ps[u], pe])
            ls[u] = np.concatenate([ls[u], ex[u]])
    return ps, ls, max(extra, 0)


def _trained(p: np.ndarray, L: np.ndarray, finish: np.ndarray | None, extra: int, G: int, shared_prompts: bool) -> tuple[int, float]:
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
    est = memory_estimate(models, cfg, round_by_round=round_by_round, record_timeline=record_timeline, rounds_kept=rounds_kept)
    total = sum(est.values())
    if total <= MEMORY_LIMIT_BYTES:
        return
    U, P, G, B_gen = cfg.updates, cfg.prompts, cfg.group, cfg.gen_requests
    limit = f"over the simulator's limit of {MEMORY_LIMIT_BYTES / 2**30:g} GB (rlsim.pipeline.MEMORY_LIMIT_BYTES)"
    if est["timeline"] >= est["workload"]:
        what = f"recording the timeline of {U} updates of {B_gen:,} requests needs about {total / 2**30:.1f} GB of memory"
        fix = "pass fewer --updates or a smaller --batch"
    elif round_by_round:
        per_prompt = BYTES_PER_REQUEST_ROUND * B_gen / P
        p_max = int((MEMORY_LIMIT_BYTES - est["timeline"]) / per_prompt)
        what = (f"one generation round of {B_gen:,} requests (P={P:,} x G={G}"
                f"{f', {B_gen - P * G:,} over-generated' if B_gen > P * G else ''}) needs about {total / 2**30:.1f} GB of memory")
        fix = f"pass a smaller --batch (at most about {p_max:,} prompts at --group {G}){' or --gen-batch' if B_gen > P * G else ''}"
    else:
        what = f"all {U} rounds of {B_gen:,} requests at once need about {total / 2**30:.1f} GB of memory"
        fix = "pass fewer --updates or a smaller --batch"
    raise RlsimError(f"{what}, {limit}; {fix}")


@dataclass(frozen=True, eq=False)
class _Round:
    """One simulated generation round, summarised (what the pipeline needs of it)."""

    requests: int
    engine_s: float  # seconds of its engine steps, per-step overhead included
    steps: int
    preemptions: int
    peak_kv_tokens: float
    peak_running: int
    responses: int  # trained on
    tokens: float  # trained on
    tl: object = None  # for a timeline: (start, length, prompt) on the fast path, [(Stretch, preempted)] on the exact one
    features: tuple = ()  # (K, S1, S2, S3, hist or None): its summed engine-step features


class _Features:
    """Summed engine-step features of a simulation (SimRun.features)."""

    def __init__(self, hist: bool):
        self.K = self.S1 = self.S2 = self.S3 = 0.0
        self.hist = np.zeros(1) if hist else None

    def add(self, K: float, S1: float, S2: float, S3: float, hist: np.ndarray | None = None) -> None:
        self.K += K
        self.S1 += S1
        self.S2 += S2
        self.S3 += S3
        if self.hist is not None and hist is not None:
            if len(hist) > len(self.hist):
                self.hist = np.pad(self.hist, (0, len(hist) - len(self.hist)))
            self.hist[:len(hist)] += hist

    def add_stretch(self, x) -> None:
        k, n = x.steps, x.num_running
        h = None
        if self.hist is not None:
            h = np.zeros(n + 1)
            h[n] = k
        self.add(k, k * n, k * x.context0 + n * k * (k - 1) / 2, x.prefill, h)

    def to_dict(self) -> dict:
        return {"K": self.K, "S1": self.S1, "S2": self.S2, "S3": self.S3, "hist": self.hist}


def _needs_hist(models: FittedModels) -> bool:
    reps = getattr(models, "replicates", None)
    return bool(models.gen.c_knee) or (reps is not None and bool(np.any(reps.gen[:, 4] != 0)))


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
        U, lm = cfg.updates, models.lengths
        self.extra = max(cfg.gen_requests - cfg.batch, 0)
        if cfg.lengths == "recorded":
            wl = models.recorded.workload
            if not wl or any(len(w[1]) == 0 for w in wl):
                raise RlsimError("the trace's response rows do not cover its updates; replay with sampled lengths")
            self.period = U if self.extra else len(wl)
            max_ctx = max(int((w[0].astype(np.int64) + w[1]).max()) for w in wl)
            if self.extra:
                max_ctx = max(max_ctx, max(int(w[0].max()) for w in wl) + int(lm.response_tokens.max()))
            self.sampled = False
        else:
            S = -(-SAMPLED_REQUESTS // max(cfg.gen_requests, 1)) if max_rounds is None else max_rounds
            self.period = max(int(S), 1)
            max_ctx = int(lm.prompt_tokens.max()) + int(lm.response_tokens.max())  # the support's bound
            self.sampled = self.period < U
        self.rounds = min(U, self.period)
        self.exact = cfg.exact_engine or cfg.engine.kv_can_bind(min(max_ctx, cfg.engine.max_model_len))
        self._kept: dict[int, _Round] = {}

    def _workload(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and response lengths of one round in queue order (as `_workload` gives each round)."""
        cfg, G = self.cfg, self.cfg.group
        if cfg.lengths == "recorded":
            w = self.models.recorded.workload[key % len(self.models.recorded.workload)]
            p, L = w[0].astype(np.int64), w[1].astype(np.int64)
        else:
            pp, LL = self.models.lengths.sample(self.rng, cfg.prompts, G, rounds=1)
            p, L = pp[0], LL[0]
        if self.extra:
            ex = self.rng.choice(self.models.lengths.response_tokens, size=self.extra).astype(np.int64)
            n_prompts = max(len(L) // G, 1)
            p = np.concatenate([p, p[(np.arange(self.extra) % n_prompts) * G]])
            L = np.concatenate([L, ex])
        mml = cfg.engine.max_model_len
        if int((p + L).max()) > mml:
            L = np.minimum(L, np.maximum(mml - p, 1))
        return p, L

    def _simulate(self, key: int) -> _Round:
        models, eng = self.models, self.cfg.engine
        gm, ov, ratio = models.gen, models.gen_overhead, models.lengths.prefill_ratio
        p, L = self._workload(key)
        finish, tl = None, None
        if not self.exact:
            plan = schedule_round(p, L, eng.max_num_seqs, p * ratio, eng.block_size)
            K = int(plan.steps[0])
            engine_s = float(round_cost(gm, plan)[0]) + ov.per_step * K
            feats = (K, float(plan.sum_running[0]), float(plan.sum_context[0]), float(plan.sum_prefill[0]),
                     running_hist(plan)[0] if _needs_hist(models) else None)
            if self.extra:
                finish = plan.start[0] + L - 1
            if self.keep_timeline:
                tl = (plan.start[0], L, p)
            pre_n, peak_run, peak_kv = 0, int(plan.peak_running[0]), float(plan.peak_kv_tokens[0])
        else:
            finish = np.zeros(len(L), np.int64) if self.extra else None
            tl = [] if self.keep_timeline else None
            K = pre_n = peak_run = 0
            peak_kv = engine_s = 0.0
            acc = _Features(_needs_hist(models))
            for x, pre in run_round_steps(p, L, eng, ratio, finish):
                engine_s += x.cost(gm) + ov.per_step * x.steps
                acc.add_stretch(x)
                K += x.steps
                pre_n += pre
                peak_run = max(peak_run, x.num_running)
                peak_kv = max(peak_kv, x.kv_tokens)
                if tl is not None:
                    tl.append((x, pre))
            feats = (acc.K, acc.S1, acc.S2, acc.S3, acc.hist)
        responses, tokens = _trained(p, L, finish, self.extra, self.cfg.group, models.shared_prompts)
        return _Round(requests=len(L), engine_s=engine_s, steps=K, preemptions=pre_n, peak_kv_tokens=float(peak_kv),
                      peak_running=peak_run, responses=responses, tokens=tokens, tl=tl, features=feats)

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


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
             round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    """Simulate `cfg.updates` RL steps with the fitted models. Deterministic given the rng state.

    round_by_round: None picks by size (U x B_gen > ALL_ROUNDS_MAX_REQUESTS: one round at a time); True or
    False forces it. max_rounds: distinct rounds simulated round by round with sampled lengths (None:
    ceil(SAMPLED_REQUESTS / B_gen); >= updates simulates every round). Raises RlsimError before
    allocating when the estimated memory is over MEMORY_LIMIT_BYTES.
    """
    cfg.validate()
    if cfg.split is not None:  # split devices, asynchronous within a staleness limit
        from rlsim.asyncrl import simulate_split

        return simulate_split(models, cfg, rng=rng, record_timeline=record_timeline)
    eng = cfg.engine
    U = cfg.updates
    G = cfg.group
    if round_by_round is None:
        round_by_round = U * cfg.gen_requests > ALL_ROUNDS_MAX_REQUESTS
    rounds = None
    if round_by_round:
        rounds = _RoundByRound(models, cfg, rng, max_rounds, record_timeline)
        check_memory(models, cfg, round_by_round=True, record_timeline=record_timeline,
                     rounds_kept=rounds.rounds if record_timeline and rounds.rounds < U else 0)
        exact, extra = rounds.exact, rounds.extra
    else:
        check_memory(models, cfg, round_by_round=False, record_timeline=record_timeline)
        prompts_u, lengths_u, extra = _workload(models, cfg, rng)
        max_ctx = max(int((p + L).max()) for p, L in zip(prompts_u, lengths_u))
        if max_ctx > eng.max_model_len:
            lengths_u = [np.minimum(L, np.maximum(eng.max_model_len - p, 1)) for p, L in zip(prompts_u, lengths_u)]
            max_ctx = eng.max_model_len
        exact = cfg.exact_engine or eng.kv_can_bind(max_ctx)
    ratio = models.lengths.prefill_ratio

    # Fast path: all rounds scheduled at once (exact when the KV cache cannot bind).
    plans = None
    feats = _Features(_needs_hist(models))
    hists = None
    if not exact and not round_by_round:
        sizes = {len(L) for L in lengths_u}
        if len(sizes) == 1:
            P, L = np.stack(prompts_u), np.stack(lengths_u)
            plan = schedule_rounds(P, L, eng.max_num_seqs, P * ratio, eng.block_size)
            plans = [(plan, u) for u in range(U)]
            costs = round_cost(models.gen, plan)
            if feats.hist is not None:
                h = running_hist(plan)
                hists = [h[u] for u in range(U)]
        else:
            plans, costs = [], []
            for p, L in zip(prompts_u, lengths_u):
                pl = schedule_rounds(p[None], L[None], eng.max_num_seqs, p[None] * ratio, eng.block_size)
                plans.append((pl, 0))
                costs.append(float(round_cost(models.gen, pl)[0]))
            costs = np.asarray(costs)
            if feats.hist is not None:
                hists = [running_hist(pl)[0] for pl, _ in plans]

    def trained_tokens(u: int, finish: np.ndarray | None) -> tuple[int, float]:
        """Responses trained on and tokens trained on, counted as the trace's num_tokens counts them."""
        return _trained(prompts_u[u], lengths_u[u], finish, extra, G, models.shared_prompts)

    env = simpy.Environment()
    ids = itertools.count()
    n = dict(step_time=np.zeros(U), gen_time=np.zeros(U), train_time=np.zeros(U), sync_time=np.zeros(U),
             other_time=np.zeros(U), responses=np.zeros(U), tokens=np.zeros(U), gen_steps=np.zeros(U, np.int64),
             preemptions=np.zeros(U, np.int64), peak_kv_tokens=np.zeros(U), peak_running=np.zeros(U, np.int64))
    timeline: list[Slice] = []
    finish: dict[int, np.ndarray] = {}
    trained: dict[int, tuple[int, float]] = {}
    counters: list[Counter] = []
    ov = models.gen_overhead
    gm = models.gen

    def record_steps(u: int, start: np.ndarray, L: np.ndarray, p: np.ndarray, K: int):
        """Timeline of a round on the fast path: its K engine steps from the schedule, starting now."""
        sa = step_arrays(start, L, p, p * ratio)
        d = gm.predict(sa["num_running"], sa["context_tokens"], sa["prefill_tokens"])
        starts = env.now + np.concatenate([[0.0], np.cumsum(d + ov.per_step)[:-1]])
        for k in range(K):
            timeline.append(Slice(LANE_GEN, "gen_step", "gen.step", float(starts[k]), float(d[k]),
                                  {"id": next(ids), "update": u, "num_running": int(sa["num_running"][k]),
                                   "context_tokens": float(sa["context_tokens"][k]), "prefill_tokens": float(sa["prefill_tokens"][k]),
                                   "finished": int(sa["finished"][k])}))
            counters.append(Counter(LANE_GEN, "gen.running", float(starts[k]), float(sa["num_running"][k])))
            counters.append(Counter(LANE_GEN, "gen.kv_usage", float(starts[k]), float(min(sa["context_tokens"][k] / eng.kv_cache_tokens, 1.0))))

    def record_stretch(u: int, x):
        """Timeline of one stretch of the step-level loop, starting now."""
        t = env.now
        for k in range(x.steps):
            ctx = x.context0 + k * x.num_running
            d = float(gm.predict(x.num_running, ctx, x.prefill if k == 0 else 0.0))
            timeline.append(Slice(LANE_GEN, "gen_step", "gen.step", t, d,
                                  {"id": next(ids), "update": u, "num_running": x.num_running, "context_tokens": ctx,
                                   "prefill_tokens": x.prefill if k == 0 else 0.0,
                                   "finished": x.finished if k == x.steps - 1 else 0}))
            counters.append(Counter(LANE_GEN, "gen.running", t, float(x.num_running)))
            counters.append(Counter(LANE_GEN, "gen.kv_usage", t, float(min(x.kv_tokens / eng.kv_cache_tokens, 1.0))))
            t += d + ov.per_step

    def gen_round(u: int):
        """Engine process for round u: round overhead, then the engine steps."""
        p, L = prompts_u[u], lengths_u[u]
        B = len(L)
        t0 = env.now
        base = float(ov.base + ov.per_response * B)
        yield env.timeout(base)
        if not exact:
            plan, row = plans[u]
            K = int(plan.steps[row])
            dur = float(costs[u]) + ov.per_step * K
            if record_timeline:
                record_steps(u, plan.start[row], L, p, K)
            yield env.timeout(dur)
            feats.add(K, float(plan.sum_running[row]), float(plan.sum_context[row]), float(plan.sum_prefill[row]),
                      hists[u] if hists is not None else None)
            if extra:
                finish[u] = plan.start[row] + L - 1
            n["gen_steps"][u] = K
            n["peak_running"][u] = int(plan.peak_running[row])
            n["peak_kv_tokens"][u] = float(plan.peak_kv_tokens[row])
        else:
            K = pre_n = peak_run = 0
            peak_kv = 0.0
            fin_arr = finish[u] = np.zeros(B, np.int64) if extra else None
            for x, pre in run_round_steps(p, L, eng, ratio, fin_arr):
                c = x.cost(gm)
                feats.add_stretch(x)
                if record_timeline:
                    record_stretch(u, x)
                yield env.timeout(c + ov.per_step * x.steps)
                K += x.steps
                pre_n += pre
                peak_run = max(peak_run, x.num_running)
                peak_kv = max(peak_kv, x.kv_tokens)
            n["gen_steps"][u] = K
            n["preemptions"][u] = pre_n
            n["peak_running"][u] = peak_run
            n["peak_kv_tokens"][u] = peak_kv
        if record_timeline:
            timeline.append(Slice(LANE_GEN, "gen_round", "gen.round", t0, env.now - t0, {"id": next(ids), "update": u, "requests": B}))
        trained[u] = trained_tokens(u, finish.pop(u, None))
        return env.now - t0

    def gen_round_by_round(u: int):
        """Engine process for round u when rounds are simulated one at a time (`_RoundByRound`)."""
        r = rounds.get(u)
        feats.add(*r.features)
        t0 = env.now
        yield env.timeout(float(ov.base + ov.per_response * r.requests))
        if record_timeline and not exact:
            start, L, p = r.tl
            record_steps(u, start, L, p, r.steps)
            yield env.timeout(r.engine_s)
        elif record_timeline:
            for x, _ in r.tl:
                record_stretch(u, x)
                yield env.timeout(x.cost(gm) + ov.per_step * x.steps)
        else:
            yield env.timeout(r.engine_s)
        n["gen_steps"][u] = r.steps
        n["preemptions"][u] = r.preemptions
        n["peak_running"][u] = r.peak_running
        n["peak_kv_tokens"][u] = r.peak_kv_tokens
        if record_timeline:
            timeline.append(Slice(LANE_GEN, "gen_round", "gen.round", t0, env.now - t0, {"id": next(ids), "update": u, "requests": r.requests}))
        trained[u] = (r.responses, r.tokens)
        return env.now - t0

    def phase(lane: str, track: str, name: str, dur: float, u: int):
        t = env.now
        yield env.timeout(dur)
        if record_timeline:
            timeline.append(Slice(lane, track, name, t, dur, {"id": next(ids), "update": u}))

    def _sync_colocated():
        for u in range(U):
            t0 = env.now
            g = yield env.process(gen_round_by_round(u) if round_by_round else gen_round(u))
            B, tokens = trained.pop(u)
            rew = max(float(models.reward.predict(B)), 0.0)
            prep = max(float(models.prep.predict(tokens)), 0.0)
            upd = max(float(models.update.predict(tokens)), 0.0)
            syn = max(float(models.sync.predict(models.sync_bytes)), 0.0)
            oth = max(float(models.other.predict(B)), 0.0)
            yield from phase(LANE_HOST, "reward", "host.reward", rew, u)
            yield from phase(LANE_TRAIN, "prep", "train.prep", prep, u)
            yield from phase(LANE_TRAIN, "update", "train.update", upd, u)
            yield from phase(LANE_SYNC, "sync", "sync.weights", syn, u)
            yield from phase(LANE_HOST, "other", "host.other", oth, u)
            if record_timeline:
                timeline.append(Slice(LANE_RL, "rl_step", "rl.step", t0, env.now - t0, {"id": next(ids), "update": u, "responses": B}))
            n["step_time"][u] = env.now - t0
            n["gen_time"][u] = g
            n["train_time"][u] = prep + upd
            n["sync_time"][u] = syn
            n["other_time"][u] = rew + oth
            n["responses"][u] = B
            n["tokens"][u] = tokens

    env.process(_sync_colocated())
    env.run()
    if record_timeline:
        timeline.sort(key=lambda s: (s.start, -s.dur))
        counters.sort(key=lambda c: c.t)
    return SimRun(batch=cfg.batch, total_time=float(env.now), exact_engine=exact, timeline=timeline, counters=counters,
                  rounds_simulated=rounds.rounds if rounds else U, approximation=rounds.approximation() if rounds else "",
                  features=feats.to_dict(), **n)
