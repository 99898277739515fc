"""The RL loop as a SimPy model: synchronous, colocated (generation and training share the device).

Per update: a generation round of B = P x G requests on the engine (sim.engine), then rewards, batch
preparation (old log-probs), the optimizer update, the weight sync and the rest of the step, each a
fitted cost. All state lives in the SimPy Environment and the objects this call creates; ids come from
a per-run counter; nothing is class-level.

Extension points (a later issue): split devices and staleness replace `_sync_colocated` with a driver
whose engine process pulls requests from a store while a trainer process consumes finished batches;
the engine's step loop (`sim.engine.run_round_steps`) and the cost models are shared.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import FittedModels
from rlsim.replay.timeline import LANE_GEN, LANE_HOST, LANE_RL, LANE_SYNC, LANE_TRAIN, Counter, Slice
from rlsim.config import SimConfig
from rlsim.engine import round_cost, run_round_steps, schedule_rounds, step_arrays, trained_mask

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


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False) -> SimRun:
    """Simulate `cfg.updates` RL steps with the fitted models. Deterministic given the rng state."""
    cfg.validate()
    eng = cfg.engine
    prompts_u, lengths_u, extra = _workload(models, cfg, rng)
    U = cfg.updates
    G = cfg.group
    ratio = models.lengths.prefill_ratio
    max_ctx = max(int((p + L).max()) for p, L in zip(prompts_u, lengths_u))
    if max_ctx > eng.max_model_len:
        lengths_u = [np.minimum(L, np.maximum(eng.max_model_len - p, 1)) for p, L in zip(prompts_u, lengths_u)]
        max_ctx = eng.max_model_len
    exact = cfg.exact_engine or eng.kv_can_bind(max_ctx)

    # Fast path: all rounds scheduled at once (exact when the KV cache cannot bind).
    plans = None
    if not exact:
        sizes = {len(L) for L in lengths_u}
        if len(sizes) == 1:
            P, L = np.stack(prompts_u), np.stack(lengths_u)
            plan = schedule_rounds(P, L, eng.max_num_seqs, P * ratio, eng.block_size)
            plans = [(plan, u) for u in range(U)]
            costs = round_cost(models.gen, plan)
        else:
            plans, costs = [], []
            for p, L in zip(prompts_u, lengths_u):
                pl = schedule_rounds(p[None], L[None], eng.max_num_seqs, p[None] * ratio, eng.block_size)
                plans.append((pl, 0))
                costs.append(float(round_cost(models.gen, pl)[0]))
            costs = np.asarray(costs)

    def trained_tokens(u: int, finish: np.ndarray | None) -> tuple[int, float]:
        """Responses trained on and tokens trained on, counted as the trace's num_tokens counts them."""
        p, L = prompts_u[u], lengths_u[u]
        n = len(L) - extra
        prompt_of = np.concatenate([np.arange(n) // G, np.arange(extra) % max(n // G, 1)])
        m = trained_mask(prompt_of, finish, G) if extra else np.ones(len(L), bool)
        if models.shared_prompts:  # one prompt per group (queue order is prompt-major: prompt j at j * G)
            ptok = p[np.unique(prompt_of[m]) * G].sum() if extra else p[0:n:G].sum()
        else:
            ptok = p[m].sum()
        return int(m.sum()), float(ptok + L[m].sum())

    env = simpy.Environment()
    ids = itertools.count()
    n = dict(step_time=np.zeros(U), gen_time=np.zeros(U), train_time=np.zeros(U), sync_time=np.zeros(U),
             other_time=np.zeros(U), responses=np.zeros(U), tokens=np.zeros(U), gen_steps=np.zeros(U, np.int64),
             preemptions=np.zeros(U, np.int64), peak_kv_tokens=np.zeros(U), peak_running=np.zeros(U, np.int64))
    timeline: list[Slice] = []
    finish: dict[int, np.ndarray] = {}
    counters: list[Counter] = []
    ov = models.gen_overhead
    gm = models.gen

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
                sa = step_arrays(plan.start[row], L, p, p * ratio)
                d = gm.predict(sa["num_running"], sa["context_tokens"], sa["prefill_tokens"])
                starts = env.now + np.concatenate([[0.0], np.cumsum(d + ov.per_step)[:-1]])
                for k in range(K):
                    timeline.append(Slice(LANE_GEN, "gen_step", "gen.step", float(starts[k]), float(d[k]),
                                          {"id": next(ids), "update": u, "num_running": int(sa["num_running"][k]),
                                           "context_tokens": float(sa["context_tokens"][k]), "prefill_tokens": float(sa["prefill_tokens"][k]),
                                           "finished": int(sa["finished"][k])}))
                    counters.append(Counter(LANE_GEN, "gen.running", float(starts[k]), float(sa["num_running"][k])))
                    counters.append(Counter(LANE_GEN, "gen.kv_usage", float(starts[k]), float(min(sa["context_tokens"][k] / eng.kv_cache_tokens, 1.0))))
            yield env.timeout(dur)
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
                if record_timeline:
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
        return env.now - t0

    def phase(lane: str, track: str, name: str, dur: float, u: int):
        t = env.now
        yield env.timeout(dur)
        if record_timeline:
            timeline.append(Slice(lane, track, name, t, dur, {"id": next(ids), "update": u}))

    def _sync_colocated():
        for u in range(U):
            t0 = env.now
            g = yield env.process(gen_round(u))
            B, tokens = trained_tokens(u, finish.get(u))
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
    return SimRun(batch=cfg.batch, total_time=float(env.now), exact_engine=exact, timeline=timeline, counters=counters, **n)
