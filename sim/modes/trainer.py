"""The trainer of a split run (`rlsim.modes.split`): a SimPy process, one update after another.

Update u takes P finished prompts by the consumption rule (`FinishedGroups`), then the rewards (host), then
on each of the M data-parallel ranks the fitted prep and update models at that rank's tokens (B / M responses
each, in completion order), then a ring all-reduce of the gradients once the slowest rank is done, then the
weight sync with every replica (`WeightSync`), then the rest of the step (host).

The ranks start together and their costs are known when the batch is taken, so they are state, not processes:
the all-reduce, a collective of all ranks, starts after the slowest rank's prep + update.
"""
from __future__ import annotations

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

    @classmethod
    def of(cls, models: FittedModels, cfg: SimConfig) -> TrainerCosts:
        sp, B = cfg.split, cfg.batch
        M = sp.train_gpus
        return cls(reward=max(float(models.reward.predict(B)), 0.0), other=max(float(models.other.predict(B)), 0.0),
                   sync=max(float(models.sync.predict(models.sync_bytes)), 0.0),
                   allreduce=allreduce_seconds(models.sync_bytes, M, sp.allreduce_gbs)
                   if M > 1 and not sp.allreduce_fitted else 0.0, ranks=M)


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
    """(ranks, B / ranks) shares of `seqs` with near-equal tokens, as verl's balance_batch and packing trainers
    do: sequences by tokens, longest first, dealt out in a snake (0..M-1, M-1..0, ...); each share in id order."""
    order = seqs[np.argsort(-tokens[seqs], kind="stable")]
    sh = order.reshape(-1, ranks).copy()
    sh[1::2] = sh[1::2, ::-1]
    return np.sort(sh.T, axis=1)


def rank_work(models: FittedModels, q: Requests, seqs: np.ndarray, ranks: int) -> RankWork:
    """The batch `seqs` ((B,) sequence ids) split into `ranks` shares balanced by tokens (`balanced`)."""
    p, L, G = q.p, q.L, q.group
    sh = balanced(seqs, p + L, ranks) if ranks > 1 else seqs.reshape(1, -1)
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
    return RankWork(tokens, tok_r, np.maximum(models.prep.predict(tok_r), 0.0),
                    np.maximum(models.update.predict(tok_r), 0.0))


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
    batch: int
    log: UpdateLog = field(init=False)

    def __post_init__(self):
        self.log = UpdateLog.of(self.updates, self.costs.ranks)

    def run(self):
        env, c, per = self.env, self.costs, self.log.per
        prev = 0.0  # end of the previous update
        steps_prev = pre_prev = 0
        for u in range(self.updates):
            tw = env.now
            groups = yield from self.finished.take(u)
            waited = env.now - tw
            seqs = self.consume(groups, u)
            w = rank_work(self.models, self.q, seqs, c.ranks)
            yield from self.train(u, w)
            sync_wait = yield from self.sync_weights(u)
            t = env.now
            yield env.timeout(c.other)
            self.rec.slice(LANE_HOST, "other", "host.other", t, c.other, update=u)
            self.rec.slice(LANE_RL, "rl_step", "rl.step", prev, env.now - prev, update=u, responses=self.batch)
            for k, v in (("step_time", env.now - prev), ("gen_time", waited + sync_wait),
                         ("train_time", float(w.compute.max()) + c.allreduce), ("sync_time", c.sync),
                         ("other_time", c.reward + c.other), ("responses", self.batch), ("tokens", w.tokens),
                         ("gen_steps", self.totals.steps - steps_prev),
                         ("preemptions", self.totals.preemptions - pre_prev)):
                per[k][u] = v
            steps_prev, pre_prev = self.totals.steps, self.totals.preemptions
            self.log.rank_busy[:] += c.reward + w.compute + c.allreduce + c.sync + c.other
            prev = env.now

    def consume(self, groups: np.ndarray, u: int) -> np.ndarray:
        """(B,) sequence ids of the (P,) prompts `groups`, marked consumed by update u."""
        G = self.q.group
        seqs = (groups[:, None] * G + np.arange(G)).ravel()
        self.q.cons[seqs] = u
        self.log.staleness(u - self.q.v0[seqs])
        return seqs

    def train(self, u: int, w: RankWork):
        """(a generator) Rewards, then every rank's prep + update, then the all-reduce."""
        env, c, rec = self.env, self.costs, self.rec
        t = env.now
        yield env.timeout(c.reward)
        rec.slice(LANE_HOST, "reward", "host.reward", t, c.reward, update=u)
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

    def sync_weights(self, u: int):
        """(a generator) The weight sync: request it, wait for every replica to join, run it. Returns the wait."""
        env = self.env
        tr = env.now
        yield self.sync.request()
        wait = env.now - tr
        ts = env.now
        yield env.timeout(self.costs.sync)
        self.sync.publish()
        self.rec.slice(LANE_SYNC, "sync", "sync.weights", ts, self.costs.sync, update=u,
                       policy_version=self.sync.version, waited_s=wait)
        return wait
