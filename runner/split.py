"""Split mode: vLLM engine replicas in their own processes (runner/replicas.py) generate while the trainer trains.

`rlrun record --mode split --gen-gpus N --train-gpus M --staleness ETA [--partial-rollout]`.
This process is the controller and training rank 0 (ranks 1..M-1: runner/dp.py).

Admission and consumption follow AReaL's staleness rule, stated once in rlsim.replay.admission (the simulator
uses the same functions): a new prompt starts only while the prompts started < (ETA + v + 1) x P, v the policy
version (weight syncs done), so the controller admits right after each sync (and at the start); update u
consumes P finished prompts, the oldest started first. ETA = 0 is synchronous. Prompts go to the replica with the
fewest outstanding prompts; a prompt is one request with n = G (over-generation with --gen-batch > B: more
samples, the first G to finish are kept, the rest aborted).

After each update the trainer syncs the weights into every replica (a collective, as NCCL broadcast in verl or
AReaL) and waits until the last replica has loaded. Weights travel as numpy arrays through the queue. What each
row records: docs/trace-format.md (schema v3). Evals run on replica 0 at the version current when they are
due, outside the staleness gate. No calibration in split mode: calibrate the colocated reference.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import numpy as np

from rlsim.replay.admission import admitted, consumed
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import TraceWriter, recording
from rlsim.runner.algo import Sample, Trainer, grpo_advantages
from rlsim.runner.dp import DataParallel
from rlsim.runner.peaks import PhasePeak
from rlsim.runner.placement import pinned, place
from rlsim.runner.replicas import Replicas


def record_split(cfg, ctx, log: Callable[[str], None]):
    """Record a split-mode run. `ctx`: the set-up shared with the colocated loop (runner/loop.py `Setup`)."""
    pl = place(cfg.mode, cfg.gen_devices, cfg.train_devices, threads=cfg.threads)
    with pinned(pl.train[0] if pl.kind == "cpu" else None, pl.threads(pl.train[0], cfg.threads)):
        return _record_split(cfg, ctx, log, pl)


def _record_split(cfg, ctx, log, pl):
    base = dict(model_dir=str(ctx.model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=cfg.seed, max_tokens=cfg.max_tokens,
                temperature=cfg.temperature, logprobs=cfg.off_policy == "tis", partial=cfg.partial_rollout,
                warm_ids=ctx.eval_ids[: min(len(ctx.eval_ids), 64)])
    reps = Replicas(cfg.gen_devices, base, pl, cfg.threads, log)
    dp = None
    try:
        device = ctx.device
        if pl.kind == "cuda":  # rank 0 on its own GPU, not the engines' (setup put the policy on cuda:0)
            import torch  # only on CUDA placements; torch is loaded by runner.algo already

            device = torch.device(f"cuda:{pl.train[0][0]}")
            ctx.policy.to(device)
        trainer = Trainer(ctx.policy, cfg, ctx.pad_id, device)
        dp = DataParallel(trainer, cfg, str(ctx.model_dir), ctx.pad_id, t0=0.0,
                          cores=[list(c) for c in pl.train] if pl.kind == "cpu" else None,
                          gpus=[c[0] for c in pl.train] if pl.kind == "cuda" else None)
        # every rank's first-call costs (and compilation) outside the recorded run; weights are not changed
        t_warm = dp.warmup([Sample(prompt_ids=ctx.eval_ids[i % len(ctx.eval_ids)], response_ids=ids or [ctx.pad_id],
                                   reward=0.0, advantage=1.0) for i, ids in enumerate(reps.warm)])
        meta = ctx.meta(engine={**reps.facts[0], "replicas": reps.facts, "warmup_excluded": True},
                        trainer={"compile": cfg.compile, "warmup_s": t_warm, "row_tokens": trainer.row_tokens,
                                 "share_prompts": trainer.share_prompts},
                        placement={"kind": pl.kind, "gen": [list(g) for g in pl.gen],
                                   "train": [list(t) for t in pl.train]})
        if cfg.calibrate:
            log("split mode records no calibration (calibrate the colocated reference, or `rlrun calibrate --threads`)")
        return SplitLoop(cfg, ctx, reps, dp, meta, log).run()
    finally:
        if dp is not None:
            dp.close()
        reps.close()


class StalenessBook:
    """The controller's side of the staleness rule: which prompts have started and under which version, which
    have finished and wait to be consumed (completion order). Pure bookkeeping, no engine."""

    def __init__(self, prompts: int, staleness: int, limit: int):
        self.prompts, self.staleness, self.limit = prompts, staleness, limit
        self.started = 0
        self.started_at: dict[int, int] = {}   # prompt -> the version it started under (not yet consumed)
        self.finished: deque = deque()         # (tag, engine, completions), completion order, not yet consumed

    def admit(self, version: int) -> range:
        """The prompt ids that may start now (recorded as started under `version`)."""
        hi = max(self.started, min(admitted(self.staleness, version, self.prompts), self.limit))
        new = range(self.started, hi)
        for j in new:
            self.started_at[j] = version
        self.started = hi
        return new

    def finish(self, tag, engine: int, completions) -> None:
        self.finished.append((tag, engine, completions))

    def take(self, u: int) -> list | None:
        """The P finished prompts update u consumes (rlsim.replay.admission.consumed), in completion order, or
        None while it must wait for more to finish."""
        sv = np.array([self.started_at[tag[1]] for tag, _i, _c in self.finished], np.int64)
        pick = consumed(sv, np.fromiter(self.started_at.values(), np.int64), u, self.staleness, self.prompts)
        if pick is None:
            return None
        out = [self.finished[k] for k in pick.tolist()]
        for k in reversed(pick.tolist()):
            del self.finished[k]
        for tag, _i, _c in out:
            del self.started_at[tag[1]]
        return out


class SplitLoop:
    """One split-mode recording: the controller's steps, each a method; `run` strings them together."""

    def __init__(self, cfg, ctx, reps: Replicas, dp: DataParallel, meta: dict[str, Any], log: Callable[[str], None]):
        self.cfg, self.ctx, self.reps, self.dp, self.meta, self.log = cfg, ctx, reps, dp, meta, log
        self.P, self.G = cfg.prompts, cfg.G
        self.extra = cfg.gen_responses - cfg.responses_per_update   # over-generated responses per update
        self.book = StalenessBook(cfg.prompts, cfg.max_staleness, cfg.steps * cfg.prompts)
        self.stream = ctx.task.train_stream(cfg.seed)
        self.rows: list[tuple[str, dict[str, Any]]] = []
        self.examples: dict[int, Any] = {}
        self.evals: dict[int, dict[str, Any]] = {}  # version -> {t0, outs, left}
        self.acks: dict[int, tuple] = {}
        self.version = 0
        # the trainer process's peak during each update (the engines' generation runs in other processes)
        self.peak, self.train_peak = PhasePeak(dp.trainer.device), None
        self.cum_resp = self.cum_tok = 0
        self.T0 = 0.0

    def clock(self) -> float:
        return time.perf_counter() - self.T0

    def handle(self, m) -> None:
        """One message from a replica (runner/replicas.py `engine_main` lists them)."""
        kind, i = m[0], m[1]
        if kind == "step":
            s = m[3]
            keys = ("num_running", "num_waiting", "prefill_tokens", "decode_tokens", "context_tokens", "kv_usage",
                    "finished")
            self.rows.append(("gen_step", dict(t_start=s["t_start"], duration=s["duration"], step=m[2],
                                               policy_version=m[2], engine_id=i, **{k: s[k] for k in keys})))
        elif kind == "idle":
            self.rows.append(("idle", dict(t_start=m[3], duration=m[4], step=m[2], policy_version=m[2], engine_id=i)))
        elif kind == "done":
            tag = m[2]
            if tag[0] == "eval":
                self.evals[tag[1]]["outs"].extend(m[3])
                self.evals[tag[1]]["left"] -= 1
            else:
                self.reps.outstanding[i] -= 1
                self.book.finish(tag, i, m[3])
        elif kind == "synced":
            self.acks[i] = m[2:]
        else:  # pragma: no cover
            raise RlsimError(f"unexpected message {kind!r} from engine replica {i}")

    def admit(self) -> None:
        P, extra = self.P, self.extra
        for j in self.book.admit(self.version):
            self.examples[j] = next(self.stream)
            n = self.G + extra // P + (j % P < extra % P)
            i = self.reps.least_loaded()
            self.reps.outstanding[i] += 1
            self.reps.send(i, ("add", ("train", j), self.ctx.encode(self.examples[j].prompt), n, self.G))

    def start_eval(self, v: int) -> None:
        self.evals[v] = {"t0": self.clock(), "outs": [], "left": len(self.ctx.eval_ids)}
        for k, ids in enumerate(self.ctx.eval_ids):
            self.reps.send(0, ("eval", ("eval", v, k), ids, self.cfg.eval_k))

    def finish_evals(self, block: bool) -> None:
        ctx = self.ctx
        for v in sorted(self.evals):
            e = self.evals[v]
            while block and e["left"] > 0:
                self.handle(self.reps.get())
            if e["left"] > 0:
                continue
            rewards = [ctx.task.reward(ctx.tok.decode(c.token_ids, skip_special_tokens=True), ctx.eval_set[c.tag[2]])
                       for c in e["outs"]]
            t1 = self.clock()
            self.rows.append(("eval", dict(t_start=t1, duration=t1 - e["t0"], step=v, policy_version=v, engine_id=0,
                                           cum_responses=self.cum_resp, cum_tokens=self.cum_tok,
                                           score=sum(rewards) / max(1, len(rewards)), eval_k=self.cfg.eval_k,
                                           eval_prompts=len(ctx.eval_set))))
            del self.evals[v]

    def idle_ranks(self, t_start: float, dur: float) -> None:
        if dur > 0:
            for r in range(self.cfg.train_devices):
                self.rows.append(("idle", dict(t_start=t_start, duration=dur, step=self.version,
                                               policy_version=self.version, rank=r)))

    def wait_batch(self, u: int) -> tuple[list, float]:
        """Block until update u's batch is ready; (the batch, seconds the trainer waited)."""
        t_w = self.clock()
        while (batch := self.book.take(u)) is None:
            self.handle(self.reps.get())
        gen_wait = self.clock() - t_w
        self.idle_ranks(t_w, gen_wait)
        return batch, gen_wait

    def samples(self, batch: list) -> tuple[list, list]:
        """Rewards and advantages of a batch: (samples, (completion, engine) per sample)."""
        ctx, samples, outs = self.ctx, [], []
        for tag, i, comps in batch:
            j = tag[1]
            for g, c in enumerate(sorted(comps, key=lambda c: c.index)):
                r = ctx.task.reward(ctx.tok.decode(c.token_ids, skip_special_tokens=True), self.examples[j])
                samples.append(Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [ctx.pad_id],
                                      reward=r, prompt_id=j, group_index=g,
                                      behavior_logprobs=list(c.logprobs) if c.logprobs else None))
                outs.append((c, i))
            del self.examples[j]
        if self.cfg.algo == "grpo":
            for s, a in zip(samples, grpo_advantages([s.reward for s in samples], self.G, self.cfg.std_scale)):
                s.advantage = a
        return samples, outs

    def train(self, u: int, samples: list, lr: float) -> tuple[Any, float, float]:
        """The data-parallel update; (its stats, its start, its seconds)."""
        t_u = self.clock()
        self.peak.reset()
        st, rank_rows, ar_rows = self.dp.update(samples, lr)
        self.train_peak = self.peak.peak()
        u_dur = self.clock() - t_u
        for rr in rank_rows:
            self.rows.append(("train_rank", dict(rr, t_start=rr["t_start"] - self.T0, step=u, policy_version=u)))
        for ar in ar_rows:
            self.rows.append(("allreduce", dict(ar, t_start=ar["t_start"] - self.T0, step=u, policy_version=u)))
        return st, t_u, u_dur

    def sync(self, u: int) -> float:
        """Every replica joins (runner/replicas.py), loads and acknowledges; returns when the last one has loaded."""
        self.version = u + 1
        state = {k: v.detach().to("cpu").contiguous().numpy() for k, v in self.ctx.policy.state_dict().items()}
        t_s = self.clock()
        self.acks.clear()
        n_rep = len(self.reps.procs)
        for i in range(n_rep):
            self.reps.send(i, ("weights", self.version, state))
        while len(self.acks) < n_rep:
            self.handle(self.reps.get())
        join = max(a[1] for a in self.acks.values())
        self.idle_ranks(t_s, max(0.0, join - t_s))
        for i, (_v, ts, dur, nbytes) in sorted(self.acks.items()):
            self.rows.append(("sync", dict(t_start=ts, duration=dur, step=u, policy_version=self.version, bytes=nbytes,
                                           engine_id=i)))
        return t_s

    def record_update(self, u: int, samples: list, outs: list, st, lr: float, t_u: float, u_dur: float,
                      step_time: float, gen_wait: float, reward_time: float) -> None:
        for (c, i), s in zip(outs, samples):
            self.rows.append(("response", dict(t_start=c.t_queued, duration=(c.t_finished or c.t_queued) - c.t_queued,
                                               step=u, policy_version=c.start_version, finish_version=c.finish_version,
                                               engine_id=i, prompt_id=s.prompt_id, group_index=s.group_index,
                                               prompt_tokens=len(c.prompt_ids), response_tokens=len(c.token_ids),
                                               reward=s.reward, consumed_step=u, t_queued=c.t_queued,
                                               t_first_token=c.t_first_token, t_finished=c.t_finished)))
        self.rows.append(("update", dict(
            t_start=t_u, duration=u_dur, step=u, policy_version=u, num_responses=len(samples), num_tokens=st.num_tokens,
            response_tokens_total=st.response_tokens, lr=lr, loss=st.loss,
            reward=sum(s.reward for s in samples) / len(samples), t_forward=st.t_forward, t_backward=st.t_backward,
            t_optimizer=st.t_optimizer, grad_norm=st.grad_norm, grad_norm_micro=st.grad_norm_micro,
            micro_batch=st.micro_batch, critic_loss=st.critic_loss, critic_grad_norm=st.critic_grad_norm,
            critic_grad_norm_micro=st.critic_grad_norm_micro, step_time=step_time, gen_time=gen_wait,
            reward_time=reward_time, prep_time=st.prep_time, mem_train_peak_bytes=self.train_peak)))
        self.cum_resp += len(samples)
        self.cum_tok += st.num_tokens

    def flush(self, writer: TraceWriter) -> None:
        for kind, r in self.rows:
            writer.add(kind, **r)
        self.rows.clear()
        writer.flush()

    def run(self):
        cfg = self.cfg
        self.T0 = time.perf_counter()
        for i in range(len(self.reps.procs)):
            self.reps.send(i, ("start", self.T0))
        writer = TraceWriter(cfg.out, self.meta, overwrite=cfg.overwrite)
        with recording(writer, self.log):
            self.start_eval(0)
            self.finish_evals(block=True)
            self.flush(writer)  # the first eval (its engine steps too)
            t_end_prev = self.clock()
            self.admit()
            lr = cfg.lr_effective
            for u in range(cfg.steps):
                batch, gen_wait = self.wait_batch(u)
                t_r = self.clock()
                samples, outs = self.samples(batch)
                reward_time = self.clock() - t_r
                st, t_u, u_dur = self.train(u, samples, lr)
                t_s = self.sync(u)
                t_end = self.clock()
                step_time, t_end_prev = t_end - t_end_prev, t_end
                self.admit()
                self.record_update(u, samples, outs, st, lr, t_u, u_dur, step_time, gen_wait, reward_time)
                done = u + 1
                if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
                    self.start_eval(done)
                self.finish_evals(block=done == cfg.steps)
                self.flush(writer)
                if done % max(1, cfg.eval_every or 10) == 0 or done == cfg.steps:
                    mean_r = sum(s.reward for s in samples) / len(samples)
                    self.log(f"step {done}/{cfg.steps}: reward {mean_r:.3f}  {len(samples) / step_time:.0f} resp/s  "
                             f"(step {step_time:.2f} s: waited {gen_wait:.2f}, train {u_dur:.2f}, sync "
                             f"{t_end - t_s:.3f}; staleness max {max(u - c.start_version for c, _ in outs)})")
        return cfg.out
