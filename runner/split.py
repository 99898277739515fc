"""Split mode: vLLM engine replicas in their own processes generate while the trainer trains.

`rlrun record --mode split --gen-devices N --train-devices M --max-staleness ETA [--partial-rollout]`.
This process is the controller and training rank 0 (ranks 1..M-1: runner/dp.py); each engine replica is a
spawned process pinned to its own devices (runner/placement.py: CPU cores, or GPUs), with its own
torch threads. Messages go over multiprocessing queues; every process stamps times on one clock
(`time.perf_counter()` is CLOCK_MONOTONIC, shared by all processes on Linux) minus the run's start.

Admission (AReaL, Fu et al. 2025, "staleness-aware" rollout control; the simulator's rule in
sim/asyncrl.py): a new prompt starts only while
    prompts started (consumed + finished + in flight + queued at a replica) < (ETA + v + 1) * P,
v the current policy version (weight syncs done). The cap moves only at a sync, so the controller
admits right after each sync (and at the start). ETA = 0 is synchronous: batch k is generated on version k.
Prompts go to the replica with the fewest outstanding prompts. A prompt is one request with n = G
(over-generation with --gen-batch > B: more samples, the first G to finish are kept, the rest aborted).

Trainer: update u consumes P finished prompts: every prompt admitted at a version <= u - ETA (it would
exceed the limit at u + 1; the admission rule keeps them within one batch), then the oldest admitted of
the others that have finished (ties: completion order); it waits until those are finished. So a consumed
sample's staleness (u - the version it started under) never exceeds ETA. It computes rewards and advantages, trains (DP over M ranks), then syncs the weights into every replica: a
collective, as with NCCL broadcast in verl or AReaL. Each replica joins
- without --partial-rollout: once its in-flight training responses have finished on the old weights
  (it queues new prompts meanwhile);
- with --partial-rollout: at the end of its current engine step; its unfinished responses are aborted
  and re-submitted after the load as prompt + tokens so far, so their KV is recomputed on the new
  weights (AReaL's interruptible generation); a response records the versions it started and finished under.
The trainer waits until every replica has loaded (trainer idle until the last one joins, then the
sync). Weights travel as numpy arrays through the queue (host memory; NCCL on GPU clusters is faster).

Recorded (schema v3): gen_step rows per replica (engine_id; policy_version = the replica's weights),
response rows (policy_version = start version, finish_version, consumed_step), update rows (step_time =
the wall time since the previous update's sync ended, gen_time = the trainer's wait for responses),
train_rank / allreduce rows per rank, one sync row per replica (its load: bytes, duration), idle rows
for replicas (waiting for prompts or weights) and ranks (waiting for responses or the sync).
Evals run on replica 0 at the version current when they are due, beside the training requests and
outside the staleness gate; with --partial-rollout an eval in flight across a sync is not restarted.
No calibration in split mode: calibrate the colocated reference (the simulator's what-if for a split
starts from it) or use `rlrun calibrate --threads` at a side's thread count.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections import deque
from dataclasses import asdict
from typing import Any, Callable

from rlsim.replay.errors import RlsimError
from rlsim.runner.placement import set_threads

ENGINE_TIMEOUT_S = 600.0  # a replica that sends nothing for this long while the trainer waits is taken as hung


# ---------------------------------------------------------------------------------------------------
# engine replica process
# ---------------------------------------------------------------------------------------------------

def _pin(kind: str, devices: tuple[int, ...], threads: int) -> None:
    """Before torch / vLLM are imported in a fresh process: bind it to its devices."""
    if kind == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    else:
        os.sched_setaffinity(0, set(devices))
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, devices))
        os.environ["OMP_NUM_THREADS"] = str(threads)


def engine_main(idx: int, args: dict[str, Any], inq, outq) -> None:
    """One engine replica: admit, step, sync weights as the controller's messages say. Messages in:
    ("start", t0) | ("add", tag, ids, n, keep) | ("eval", tag, ids, n) | ("weights", version, arrays) | ("stop",).
    Out: ("ready", idx, facts, warm) | ("step", idx, version, stats) | ("done", idx, tag, completions) |
    ("synced", idx, version, t_start, duration, bytes) | ("idle", idx, version, t_start, duration) | ("error", idx, text)."""
    try:
        _pin(args["kind"], args["devices"], args["threads"])
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import torch

        set_threads(args["threads"])
        from rlsim.runner.engine import Engine

        eng = Engine(args["model_dir"], max_num_seqs=args["max_num_seqs"], max_model_len=args["max_model_len"],
                     kv_cache_gib=args["kv_cache_gib"], dtype=args["dtype"], seed=args["seed"] + idx)
        sampling = eng.sampling(args["max_tokens"], args["temperature"], logprobs=args["logprobs"])
        warm = eng.generate([(None, ids, 1) for ids in args["warm_ids"]], sampling)
        outq.put(("ready", idx, {**eng.facts(), "devices": list(args["devices"]), "threads": args["threads"]},
                  [list(c.token_ids) for c in warm]))
        _serve(idx, eng, sampling, args["partial"], inq, outq)
    except BaseException:  # the controller turns it into one line; the trace keeps what was flushed
        outq.put(("error", idx, traceback.format_exc(limit=-3)))


def _serve(idx: int, eng, sampling, partial: bool, inq, outq) -> None:
    msg = inq.get()
    if msg[0] != "start":
        return
    t0 = msg[1]
    eng.clock = clock = lambda: time.perf_counter() - t0  # noqa: E731
    version = 0
    need: dict[Any, int] = {}       # tag -> samples that complete it
    got: dict[Any, list] = {}       # tag -> its finished samples
    train_tags: set = set()         # tags of training prompts in the engine
    held: deque = deque()           # training prompts that arrived while a sync was pending (no partial rollout)
    pending = None                  # ("weights", version, arrays) waiting for the replica to join

    def admit(tag, ids, n, keep, is_train):
        need[tag], got[tag] = keep, []
        if is_train:
            train_tags.add(tag)
        eng.add(tag, ids, n, sampling, version=version)

    while True:
        msgs = []
        if not eng.has_work() and pending is None:
            t_i = clock()
            msgs.append(inq.get())
            dt = clock() - t_i
            if dt > 0:
                outq.put(("idle", idx, version, t_i, dt))
        while True:
            try:
                msgs.append(inq.get_nowait())
            except queue.Empty:
                break
        for m in msgs:
            if m[0] == "stop":
                return
            if m[0] == "add":
                if pending is not None and not partial:
                    held.append(m)
                else:
                    admit(m[1], m[2], m[3], m[4], True)
            elif m[0] == "eval":
                admit(m[1], m[2], m[3], m[3], False)
            elif m[0] == "weights":
                pending = m
        if pending is not None and (partial or not train_tags):
            cont = []
            if partial:  # interrupt: abort the in-flight training requests, keep their tokens
                for tag in [t for t in eng.in_flight() if t in train_tags]:
                    cont.extend((tag, c) for c in eng.abort(tag))
            import torch

            t_s = clock()
            arrays = pending[2]
            nbytes = eng.sync({k: torch.from_numpy(v) for k, v in arrays.items()})
            version = pending[1]
            outq.put(("synced", idx, version, t_s, clock() - t_s, nbytes))
            pending = None
            by_tag: dict[Any, list] = {}
            for tag, c in cont:
                by_tag.setdefault(tag, []).append(c)
            for tag, cs in by_tag.items():  # re-submitted on the new weights: prompt + tokens so far
                eng.add(tag, [], len(cs), sampling, continuing=cs)
            while held:
                m = held.popleft()
                admit(m[1], m[2], m[3], m[4], True)
            continue
        if not eng.has_work():
            continue
        st, done = eng.step(version)
        outq.put(("step", idx, version, asdict(st)))
        for c in done:
            lst = got.get(c.tag)
            if lst is None:  # a sample of a prompt already complete (over-generation): dropped
                continue
            lst.append(c)
            if len(lst) == need[c.tag]:
                outq.put(("done", idx, c.tag, lst))
                del got[c.tag], need[c.tag]
                train_tags.discard(c.tag)
                eng.abort(c.tag)  # over-generated samples still running


# ---------------------------------------------------------------------------------------------------
# controller (this process, training rank 0)
# ---------------------------------------------------------------------------------------------------

class Replicas:
    """The engine processes and the controller's view of them (outstanding prompts, messages)."""

    def __init__(self, n: int, base: dict[str, Any], placement, threads: int, log: Callable[[str], None]):
        ctx = mp.get_context("spawn")
        self.outq = ctx.Queue()
        self.inqs = [ctx.Queue() for _ in range(n)]
        self.procs = []
        for i in range(n):
            args = {**base, "kind": placement.kind, "devices": placement.physical(placement.gen[i]),
                    "threads": placement.threads(placement.gen[i], threads)}
            p = ctx.Process(target=engine_main, args=(i, args, self.inqs[i], self.outq), daemon=True,
                            name=f"rlsim-engine-{i}")
            p.start()
            self.procs.append(p)
        self.outstanding = [0] * n
        self.facts: list[dict] = [{}] * n
        self.warm: list[list[int]] = []
        for _ in range(n):
            m = self.get()
            if m[0] != "ready":  # pragma: no cover - handled by get()
                raise RlsimError(f"engine replica sent {m[0]!r} before it was ready")
            self.facts[m[1]] = m[2]
            self.warm.extend(m[3])
        log(f"split mode: {n} engine replica(s) ready on {placement.kind} devices {[list(g) for g in placement.gen]}")

    def get(self, timeout: float = ENGINE_TIMEOUT_S):
        t_end = time.monotonic() + timeout
        while True:
            try:
                m = self.outq.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise RlsimError(f"engine process {dead[0]} died without a message; see its output above") from None
                if time.monotonic() > t_end:
                    raise RlsimError(f"no message from the engine replicas for {timeout:.0f} s") from None
                continue
            if m[0] == "error":
                last = [ln for ln in m[2].strip().splitlines() if ln.strip()][-1]
                raise RlsimError(f"engine replica {m[1]} failed: {last[:200]}")
            return m

    def send(self, i: int, msg) -> None:
        self.inqs[i].put(msg)

    def least_loaded(self) -> int:
        return min(range(len(self.outstanding)), key=lambda i: (self.outstanding[i], i))

    def close(self) -> None:
        for q in self.inqs:
            try:
                q.put(("stop",))
            except (OSError, ValueError):  # pragma: no cover
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def record_split(cfg, ctx, log: Callable[[str], None]):
    """Record a split-mode run. `ctx`: the set-up shared with the colocated loop (runner/loop.py `Setup`)."""
    from rlsim.runner.placement import place, pinned

    pl = place(cfg.mode, cfg.gen_devices, cfg.train_devices, threads=cfg.threads)
    with pinned(pl.train[0] if pl.kind == "cpu" else None, pl.threads(pl.train[0], cfg.threads)):
        return _record_split(cfg, ctx, log, pl)


def _record_split(cfg, ctx, log, pl):
    from rlsim.replay.io import TraceWriter
    from rlsim.runner.algo import Sample, Trainer, grpo_advantages
    from rlsim.runner.dp import DataParallel

    base = dict(model_dir=str(ctx.model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                kv_cache_gib=cfg.kv_cache_gib, dtype=cfg.dtype, seed=cfg.seed, max_tokens=cfg.max_tokens,
                temperature=cfg.temperature, logprobs=cfg.off_policy == "tis", partial=cfg.partial_rollout,
                warm_ids=ctx.eval_ids[: min(len(ctx.eval_ids), 64)])
    reps = Replicas(cfg.gen_devices, base, pl, cfg.threads, log)
    dp = None
    try:
        device = ctx.device
        if pl.kind == "cuda":  # rank 0 on its own GPU, not the engines' (setup put the policy on cuda:0)
            import torch

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
                        placement={"kind": pl.kind, "gen": [list(g) for g in pl.gen], "train": [list(t) for t in pl.train]})
        if cfg.calibrate:
            log("split mode records no calibration (calibrate the colocated reference, or `rlrun calibrate --threads`)")
        return _run(cfg, ctx, reps, dp, meta, log, TraceWriter, Sample, grpo_advantages)
    finally:
        if dp is not None:
            dp.close()
        reps.close()


def _run(cfg, ctx, reps: Replicas, dp, meta, log, TraceWriter, Sample, grpo_advantages):
    P, G, B, eta = cfg.prompts, cfg.G, cfg.batch, cfg.max_staleness
    extra = cfg.gen_responses - B
    stream = ctx.task.train_stream(cfg.seed)
    T0 = time.perf_counter()
    clock = lambda: time.perf_counter() - T0  # noqa: E731
    n_rep, ranks = len(reps.procs), cfg.train_devices
    for i in range(n_rep):
        reps.send(i, ("start", T0))
    from rlsim.replay.io import recording

    writer = TraceWriter(cfg.out, meta, overwrite=cfg.overwrite)
    rows: list[tuple[str, dict[str, Any]]] = []
    finished: deque = deque()  # (tag, engine, completions) in completion order
    examples: dict[int, Any] = {}
    evals: dict[int, dict[str, Any]] = {}  # version -> {t0, outs, engine}
    started = 0
    version = 0
    cum_resp = cum_tok = 0
    acks: dict[int, tuple] = {}
    started_at: dict[int, int] = {}  # prompt -> the version when it was admitted (not yet consumed)
    finished_ids: set[int] = set()   # finished, not yet consumed

    def handle(m) -> None:
        kind, i = m[0], m[1]
        if kind == "step":
            s = m[3]
            rows.append(("gen_step", dict(t_start=s["t_start"], duration=s["duration"], step=m[2], policy_version=m[2],
                                          engine_id=i, **{k: s[k] for k in ("num_running", "num_waiting", "prefill_tokens",
                                                                             "decode_tokens", "context_tokens", "kv_usage",
                                                                             "finished")})))
        elif kind == "idle":
            rows.append(("idle", dict(t_start=m[3], duration=m[4], step=m[2], policy_version=m[2], engine_id=i)))
        elif kind == "done":
            tag = m[2]
            if tag[0] == "eval":
                evals[tag[1]]["outs"].extend(m[3])
                evals[tag[1]]["left"] -= 1
            else:
                reps.outstanding[i] -= 1
                finished.append((tag, i, m[3]))
                finished_ids.add(tag[1])
        elif kind == "synced":
            acks[i] = m[2:]
        else:  # pragma: no cover
            raise RlsimError(f"unexpected message {kind!r} from engine replica {i}")

    def admit() -> None:
        nonlocal started
        while started < min((eta + version + 1) * P, cfg.steps * P):
            j = started
            examples[j] = next(stream)
            n = G + extra // P + (j % P < extra % P)
            i = reps.least_loaded()
            reps.outstanding[i] += 1
            reps.send(i, ("add", ("train", j), ctx.encode(examples[j].prompt), n, G))
            started_at[j] = version
            started += 1

    def ready(u: int) -> bool:
        old = [j for j in started_at if started_at[j] <= u - eta]
        return len(finished) >= P and all(j in finished_ids for j in old)

    def take(u: int) -> list:
        """P finished prompts: the due ones first, then the oldest started (ties: completion order)."""
        order = sorted(range(len(finished)), key=lambda k: (started_at[finished[k][0][1]] > u - eta,
                                                           started_at[finished[k][0][1]], k))
        pick = sorted(order[:P])
        out = [finished[k] for k in pick]
        for k in reversed(pick):
            del finished[k]
        for tag, _i, _c in out:
            finished_ids.discard(tag[1])
            del started_at[tag[1]]
        return out

    def start_eval(v: int) -> None:
        evals[v] = {"t0": clock(), "outs": [], "left": len(ctx.eval_ids)}
        for k, ids in enumerate(ctx.eval_ids):
            reps.send(0, ("eval", ("eval", v, k), ids, cfg.eval_k))

    def finish_evals(block: bool) -> None:
        for v in sorted(evals):
            e = evals[v]
            while block and e["left"] > 0:
                handle(reps.get())
            if e["left"] > 0:
                continue
            rewards = [ctx.task.reward(ctx.tok.decode(c.token_ids, skip_special_tokens=True), ctx.eval_set[c.tag[2]])
                       for c in e["outs"]]
            t1 = clock()
            rows.append(("eval", dict(t_start=t1, duration=t1 - e["t0"], step=v, policy_version=v, engine_id=0,
                                      cum_responses=cum_resp, cum_tokens=cum_tok, score=sum(rewards) / max(1, len(rewards)),
                                      eval_k=cfg.eval_k, eval_prompts=len(ctx.eval_set))))
            del evals[v]

    def idle_ranks(t_start: float, dur: float) -> None:
        if dur > 0:
            for r in range(ranks):
                rows.append(("idle", dict(t_start=t_start, duration=dur, step=version, policy_version=version, rank=r)))

    with recording(writer, log):
        start_eval(0)
        finish_evals(block=True)
        for kind, r in rows:  # the first eval (its engine steps too)
            writer.add(kind, **r)
        rows.clear()
        writer.flush()
        t_end_prev = clock()
        admit()
        lr = cfg.lr_effective
        for u in range(cfg.steps):
            t_w = clock()
            while not ready(u):
                handle(reps.get())
            gen_wait = clock() - t_w
            idle_ranks(t_w, gen_wait)
            batch = take(u)
            t_r = clock()
            samples, outs = [], []
            for tag, i, comps in batch:
                j = tag[1]
                for g, c in enumerate(sorted(comps, key=lambda c: c.index)):
                    r = ctx.task.reward(ctx.tok.decode(c.token_ids, skip_special_tokens=True), examples[j])
                    samples.append(Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids) or [ctx.pad_id],
                                          reward=r, prompt_id=j, group_index=g,
                                          behavior_logprobs=list(c.logprobs) if c.logprobs else None))
                    outs.append((c, i))
                del examples[j]
            if cfg.algo == "grpo":
                for s, a in zip(samples, grpo_advantages([s.reward for s in samples], G, cfg.std_scale)):
                    s.advantage = a
            reward_time = clock() - t_r
            t_u = clock()
            st, rank_rows, ar_rows = dp.update(samples, lr)
            u_dur = clock() - t_u
            for rr in rank_rows:
                rows.append(("train_rank", dict(rr, t_start=rr["t_start"] - T0, step=u, policy_version=u)))
            for ar in ar_rows:
                rows.append(("allreduce", dict(ar, t_start=ar["t_start"] - T0, step=u, policy_version=u)))
            # weight sync: every replica joins (see the module docstring), loads, acknowledges
            version = u + 1
            state = {k: v.detach().to("cpu").contiguous().numpy() for k, v in ctx.policy.state_dict().items()}
            t_s = clock()
            acks.clear()
            for i in range(n_rep):
                reps.send(i, ("weights", version, state))
            while len(acks) < n_rep:
                handle(reps.get())
            join = max(a[1] for a in acks.values())
            idle_ranks(t_s, max(0.0, join - t_s))
            for i, (_v, ts, dur, nbytes) in sorted(acks.items()):
                rows.append(("sync", dict(t_start=ts, duration=dur, step=u, policy_version=version, bytes=nbytes, engine_id=i)))
            t_end = clock()
            s_dur = t_end - t_s
            step_time = t_end - t_end_prev
            t_end_prev = t_end
            admit()
            mean_r = sum(s.reward for s in samples) / len(samples)
            for (c, i), s in zip(outs, samples):
                rows.append(("response", dict(t_start=c.t_queued, duration=(c.t_finished or c.t_queued) - c.t_queued,
                                              step=u, policy_version=c.start_version, finish_version=c.finish_version,
                                              engine_id=i, prompt_id=s.prompt_id, group_index=s.group_index,
                                              prompt_tokens=len(c.prompt_ids), response_tokens=len(c.token_ids),
                                              reward=s.reward, consumed_step=u, t_queued=c.t_queued,
                                              t_first_token=c.t_first_token, t_finished=c.t_finished)))
            rows.append(("update", dict(t_start=t_u, duration=u_dur, step=u, policy_version=u, num_responses=len(samples),
                                        num_tokens=st.num_tokens, response_tokens_total=st.response_tokens, lr=lr,
                                        loss=st.loss, reward=mean_r, t_forward=st.t_forward, t_backward=st.t_backward,
                                        t_optimizer=st.t_optimizer, grad_norm=st.grad_norm,
                                        grad_norm_micro=st.grad_norm_micro, micro_batch=st.micro_batch,
                                        critic_loss=st.critic_loss, critic_grad_norm=st.critic_grad_norm,
                                        critic_grad_norm_micro=st.critic_grad_norm_micro, step_time=step_time,
                                        gen_time=gen_wait, reward_time=reward_time, prep_time=st.prep_time)))
            cum_resp += len(samples)
            cum_tok += st.num_tokens
            done = u + 1
            if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
                start_eval(done)
            finish_evals(block=done == cfg.steps)
            for kind, r in rows:
                writer.add(kind, **r)
            rows.clear()
            writer.flush()
            if done % max(1, cfg.eval_every or 10) == 0 or done == cfg.steps:
                log(f"step {done}/{cfg.steps}: reward {mean_r:.3f}  {len(samples) / step_time:.0f} resp/s  (step "
                    f"{step_time:.2f} s: waited {gen_wait:.2f}, train {u_dur:.2f}, sync {s_dur:.3f}; "
                    f"staleness max {max(u - c.start_version for c, _ in outs)})")
    return cfg.out
