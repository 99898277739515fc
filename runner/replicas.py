"""The engine replicas of a split run (runner/split.py): each a spawned process pinned to its own devices
(runner/placement.py: CPU cores, or GPUs) with its own torch threads, driven by messages over
multiprocessing queues; every process stamps times on one clock (`time.perf_counter()` is CLOCK_MONOTONIC,
shared by all processes on Linux) minus the run's start.

A replica joins a weight sync
- without --partial-rollout: once its in-flight training responses have finished on the old weights (it
  queues new prompts meanwhile);
- with --partial-rollout: at the end of its current engine step; its unfinished responses are aborted and
  re-submitted after the load as prompt + tokens so far, so their KV is recomputed on the new weights
  (AReaL's interruptible generation); a response records the versions it started and finished under.

This module imports neither torch nor vLLM at its top: a spawned replica pins its devices and threads first.
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
    ("synced", idx, version, t_start, duration, bytes) | ("idle", idx, version, t_start, duration) |
    ("error", idx, text)."""
    try:
        _pin(args["kind"], args["devices"], args["threads"])
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

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
