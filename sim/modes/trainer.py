"""The trainer of a split run (`rlsim.modes.split`): a SimPy process, one update after another.

Update u takes P finished prompts by the consumption rule (`FinishedGroups`), then the rewards (host), then
on each of the M data-parallel ranks the fitted prep and update models at that rank's tokens (B / M responses
each, in completion order), then a ring all-reduce of the gradients once the slowest rank is done, then the
weight sync with every replica (`WeightSync`), then the rest of the step (host).

The ranks start together and their costs are known when the batch is taken, so they are state, not processes:
the all-reduce, a collective of all ranks, starts after the slowest rank's prep + update.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from rlsim.modes.replica import EngineTotals
from rlsim.modes.requests import FinishedGroups, Requests
from rlsim.modes.sync import WeightSync
from rlsim.modes.timeline import Recorder, lane_train
from rlsim.core.config import SimConfig
from rlsim.replay.models import FittedModels
from rlsim.replay.timeline import LANE_HOST, LANE_RL, LANE_SYNC


def allreduce_seconds(grad_bytes: float, ranks: int, gbs: float) -> float:
    """Ring all-reduce: each rank sends and receives 2 (M - 1) / M of the gradient bytes."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * float(grad_bytes) / (float(gbs) * 1e9)


@dataclass(frozen=True)
class TrainerCosts:
    """Seconds per update of the trainer's fitted phases at batch B, and its ranks."""

    reward: float
    other: float
    sync: float
    allreduce: float
    ranks: int
    chunks: int = 1        # trainer fetches per weight sync (PPO mini-batches streamed), P / chunks prompts each
    hybrid: bool = False   # the replicas sit on the training devices: they stop while the trainer trains
    switch_ratio: float = 0.0  # verl V1 step switching: lend the hybrid replicas until this share of P is ready

    @classmethod
    def of(cls, models: FittedModels, cfg: SimConfig) -> TrainerCosts:
        sp, B = cfg.split, cfg.responses_per_update
        M = sp.train_gpus
        reward = 0.0 if sp.reward_in_rollout else max(float(models.reward.predict(B)), 0.0)
        return cls(reward=reward, other=max(float(models.other.predict(B)), 0.0),
                   sync=sp.sync_s if sp.sync_s is not None else max(float(models.sync.predict(models.sync_bytes)), 0.0),
                   allreduce=allreduce_seconds(models.sync_bytes, M, sp.allreduce_gbs)
                   if M > 1 and not sp.allreduce_fitted else 0.0, ranks=M, chunks=sp.chunks, hybrid=sp.hybrid,
                   switch_ratio=sp.switch_ratio)


@dataclass(frozen=True)
class RankWork:
    """One batch over the M data-parallel ranks: (M,) arrays."""

    tokens: float              # trained tokens of the whole batch
    rank_tokens: np.ndarray    # (M,) each rank's tokens
    prep: np.ndarray           # (M,) seconds
    update: np.ndarray         # (M,) seconds

    @property
    def compute(self) -> np.ndarray:
        return self.prep + self.update


def balanced(seqs: np.ndarray, tokens: np.ndarray, ranks: int) -> np.ndarray:
    """(ranks, B / ranks) shares of `seqs` ((B,) ids, (B,) `tokens` each) with near-equal tokens, as verl's
    balance_batch and packing trainers do: sequences by tokens, longest first, dealt out in a snake (0..M-1, M-1..0,
    ...); each share in id order."""
    order = seqs[np.argsort(-tokens, kind="stable")]
    sh = order.reshape(-1, ranks).copy()
    sh[1::2] = sh[1::2, ::-1]
    return np.sort(sh.T, axis=1)


def chunk_cost(model, tokens: np.ndarray, chunks: int) -> np.ndarray:
    """Seconds of a fitted phase (fitted per step) for one of `chunks` fetches of a step: its share of a step of
    `chunks` such fetches, model(chunks x tokens) / chunks, since a step trains its PPO mini-batches one after
    another whether they arrive together or streamed."""
    if chunks == 1:
        return np.maximum(model.predict(tokens), 0.0)
    return np.maximum(model.predict(tokens * chunks) / chunks, 0.0)


def rank_work(models: FittedModels, q: Requests, seqs: np.ndarray, ranks: int, chunks: int = 1) -> RankWork:
    """The batch `seqs` ((B,) sequence ids) split into `ranks` shares balanced by tokens (`balanced`); one of
    `chunks` fetches of a step (`chunk_cost`)."""
    p, L, G = q.p, q.L, q.group
    sh = balanced(seqs, p[seqs] + L[seqs], ranks) if ranks > 1 else seqs.reshape(1, -1)
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
    return RankWork(tokens, tok_r, chunk_cost(models.prep, tok_r, chunks), chunk_cost(models.update, tok_r, chunks))


@dataclass(eq=False)
class UpdateLog:
    """What the trainer measures: (U,) per-update arrays (SimRun's names), (M,) rank busy seconds, and the
    staleness (consuming update - start version) of the consumed sequences."""

    per: dict[str, np.ndarray]
    rank_busy: np.ndarray
    lag_sum: float = 0.0
    lag_max: int = 0

    @classmethod
    def of(cls, updates: int, ranks: int) -> UpdateLog:
        f, i = (lambda: np.zeros(updates)), (lambda: np.zeros(updates, np.int64))
        per = dict(step_time=f(), gen_time=f(), train_time=f(), sync_time=f(), other_time=f(), responses=f(),
                   tokens=f(), gen_steps=i(), preemptions=i(), peak_kv_tokens=f(), peak_running=i())
        return cls(per, np.zeros(ranks))

    def staleness(self, lag: np.ndarray) -> None:
        self.lag_sum += float(lag.sum())
        self.lag_max = max(self.lag_max, int(lag.max()))


@dataclass(eq=False)
class Trainer:
    """The trainer's process and what it measures (module doc)."""

    env: simpy.Environment
    models: FittedModels
    q: Requests
    finished: FinishedGroups
    sync: WeightSync
    totals: EngineTotals
    rec: Recorder
    costs: TrainerCosts
    updates: int
    responses_per_update: int
    helpers: list = field(default_factory=list)  # (step switching) the parked hybrid replicas on the training devices
    stop: Callable[[np.ndarray], bool] | None = None  # on the (u,) update times so far: whether to end the run
    log: UpdateLog = field(init=False)
    done: int = 0  # updates finished

    def __post_init__(self):
        self.log = UpdateLog.of(self.updates, self.costs.ranks)

    def run(self):
        env, c, per = self.env, self.costs, self.log.per
        prev = 0.0  # end of the previous update
        steps_prev = pre_prev = 0
        for u in range(self.updates):
            waited = sync_wait = compute = tokens = 0.0
            busy = np.zeros(c.ranks)  # (M,) each rank's busy seconds this update, summed as one step's terms
            if self.helpers:
                tw = env.now
                yield from self.switch()
                waited += env.now - tw
            for _ in range(c.chunks):  # one fetch of P / chunks prompts, trained as soon as it is ready
                tw = env.now
                groups = yield from self.finished.take(u, self.finished.prompts // c.chunks)
                waited += env.now - tw
                if c.hybrid:  # the replicas on the training devices stop at their next engine step
                    sync_wait += yield from self.request_sync()
                seqs = self.consume(groups, u)
                w = rank_work(self.models, self.q, seqs, c.ranks, c.chunks)
                yield from self.train(u, w)
                compute += float(w.compute.max()) + c.allreduce
                tokens += w.tokens
                busy = busy + (c.reward / c.chunks + w.compute + c.allreduce)
            if not c.hybrid:
                sync_wait += yield from self.request_sync()
            yield from self.sync_weights(u, sync_wait)
            t = env.now
            yield env.timeout(c.other)
            self.rec.slice(LANE_HOST, "other", "host.other", t, c.other, update=u)
            B = self.responses_per_update
            self.rec.slice(LANE_RL, "rl_step", "rl.step", prev, env.now - prev, update=u, responses=B)
            for k, v in (("step_time", env.now - prev), ("gen_time", waited + sync_wait),
                         ("train_time", compute), ("sync_time", c.sync),
                         ("other_time", c.reward + c.other), ("responses", B), ("tokens", tokens),
                         ("gen_steps", self.totals.steps - steps_prev),
                         ("preemptions", self.totals.preemptions - pre_prev)):
                per[k][u] = v
            steps_prev, pre_prev = self.totals.steps, self.totals.preemptions
            self.log.rank_busy[:] += busy + c.sync + c.other
            prev, self.done = env.now, u + 1
            if self.stop is not None and self.stop(per["step_time"][:u + 1]):
                return

    def switch(self):
        """(a generator) verl V1 step switching: while fewer than the target of finished groups wait, the hybrid
        replicas switch to rollout (a weight load each, the fitted sync) and help, then switch back at the end of
        their engine step in progress; target = round(ratio x P), at least one fetch, at most P."""
        P = self.finished.prompts
        target = min(max(round(self.costs.switch_ratio * P), P // self.costs.chunks), P)
        if len(self.finished.items) >= target:
            return
        for h in self.helpers:
            h.lend(self.costs.sync)
        yield from self.finished.wait_for(target)
        yield self.env.all_of([h.reclaim() for h in self.helpers])

    def consume(self, groups: np.ndarray, u: int) -> np.ndarray:
        """(B,) sequence ids of the (P,) prompts `groups`, marked consumed by update u."""
        G = self.q.group
        seqs = (groups[:, None] * G + np.arange(G)).ravel()
        self.q.cons[seqs] = u
        self.log.staleness(u - self.q.v0[seqs])
        return seqs

    def train(self, u: int, w: RankWork):
        """(a generator) Rewards (a chunk's share), then every rank's prep + update, then the all-reduce."""
        env, c, rec = self.env, self.costs, self.rec
        t = env.now
        reward = c.reward / c.chunks if c.chunks > 1 else c.reward
        yield env.timeout(reward)
        rec.slice(LANE_HOST, "reward", "host.reward", t, reward, update=u)
        t = env.now
        for m in range(c.ranks):
            rec.slice(lane_train(m), "prep", "train.prep", t, float(w.prep[m]), update=u,
                      tokens=float(w.rank_tokens[m]))
            rec.slice(lane_train(m), "update", "train.update", t + float(w.prep[m]), float(w.update[m]), update=u,
                      tokens=float(w.rank_tokens[m]))
        yield env.timeout(float(w.compute.max()))  # the slowest rank
        if c.ranks > 1:
            for m in range(c.ranks):
                rec.slice(lane_train(m), "allreduce", "train.allreduce", env.now, c.allreduce, update=u)
            yield env.timeout(c.allreduce)

    def request_sync(self):
        """(a generator) Ask every replica to join the weight sync (with hybrid replicas: to stop for training);
        returns the wait until all have joined."""
        tr = self.env.now
        yield self.sync.request()
        return self.env.now - tr

    def sync_weights(self, u: int, wait: float):
        """(a generator) The weight sync, every replica joined; it publishes the next version at its end."""
        env = self.env
        ts = env.now
        yield env.timeout(self.costs.sync)
        self.sync.publish()
        self.rec.slice(LANE_SYNC, "sync", "sync.weights", ts, self.costs.sync, update=u,
                       policy_version=self.sync.version, waited_s=wait)
