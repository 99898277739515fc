"""`rlrun probe`: a paired ground truth of sigma, the throughput gain of a larger batch.

Two recordings made minutes apart differ by the machine's drift (speed moves 5-10 % between processes on a
shared VM) as much as by their batch sizes. The probe runs full RL steps (runner/rlstep.py: generate P x G
responses, reward, advantages, one update, weight sync) at several sizes in ONE process: after the warm-ups
of a recording, one unrecorded step at each size (its first shapes), then `rounds` rounds, each running every
size once in an order shuffled by a seeded `random.Random`. Within a round each size is measured beside the
smallest, so their ratio is free of the drift between rounds; `rlsim.replay.probe.probe_sigma` reads it.

The trace is a recording's (same rows for each step, same metadata) without evals or calibration, plus
`"kind": "probe"` and a `probe` section (sizes, group, rounds, each round's order, the command). Weights are
trained by every step, warm-ups included, as in a run; the lr of each size follows the run's --lr-rule.
"""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any, Callable

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import TraceWriter, recording
from rlsim.runner.config import ProbeConfig
from rlsim.runner.loop import begin, colocated_placement

KV_SAMPLE = 512  # prompts drawn (from the calibration's stream, not the run's) to bound the longest prompt


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def probe(pc: ProbeConfig, log: Callable[[str], None] = _log) -> Path:
    """Run the probe and write its trace at `pc.run.out`; returns the path."""
    from rlsim.runner.rlstep import start

    pc.validate()
    cfg = pc.reference
    ctx = begin(cfg, log)
    with colocated_placement(cfg) as pl:
        run = start(cfg, ctx, pl, log)  # the engine and trainer ranks, warmed up as for a recording
        try:
            check_kv(pc, run.engine, longest_prompt(ctx, cfg.seed))
            return _probe(pc, ctx, run, log)
        finally:
            run.close()


def orders(sizes: tuple[int, ...], rounds: int, seed: int) -> list[list[int]]:
    """Each round's order of the sizes: a `random.Random(seed)` shuffle, rotated by one place each round (so every
    size takes every position equally often: a drift within rounds biases none), the rounds in shuffled order."""
    rng = random.Random(seed)
    base = rng.sample(list(sizes), len(sizes))
    out = [base[r % len(base):] + base[:r % len(base)] for r in range(rounds)]
    rng.shuffle(out)
    return out


def longest_prompt(ctx, seed: int) -> int:
    """The longest of KV_SAMPLE of the task's prompts, in tokens."""
    stream = ctx.task.train_stream(seed + 104729)
    return max(len(ctx.encode(next(stream).prompt)) for _ in range(KV_SAMPLE))


def check_kv(pc: ProbeConfig, engine, longest: int) -> None:
    """Refuse a size whose running sequences (all of B, up to --max-num-seqs) could not all hold their KV at
    once: the engine would preempt and recompute, and that size's steps would measure the cache, not the batch."""
    for p in sorted(pc.prompts, reverse=True):
        cfg = pc.at(p)
        running = min(cfg.responses_per_update, engine.max_num_seqs)
        need = running * (longest + cfg.max_tokens)
        if need > engine.kv_cache_tokens:
            gib = math.ceil(10 * cfg.kv_cache_gib * need / engine.kv_cache_tokens) / 10
            raise RlsimError(f"--prompts {p} (B = {cfg.responses_per_update}) needs {need} KV tokens ({running} "
                             "sequences at once x "
                             f"({longest} prompt + {cfg.max_tokens} new tokens)), the engine's KV cache holds "
                             f"{engine.kv_cache_tokens}: drop {p} from --prompts, or give the cache --kv-cache-gib "
                             f"{gib:g} (vLLM's VLLM_CPU_KVCACHE_SPACE on CPU) or fewer --max-num-seqs")


def _probe(pc: ProbeConfig, ctx, run, log: Callable[[str], None]) -> Path:

    cfg = pc.reference
    order = orders(pc.prompts, pc.rounds, cfg.seed)
    meta = ctx.meta(engine={**run.engine.facts(), "warmup_excluded": True}, trainer=run.trainer_meta(cfg.compile))
    meta["kind"] = "probe"
    meta["probe"] = {**pc.to_meta(), "order": order, "warmup_steps": len(pc.prompts), "command": meta.get("command")}
    stream = ctx.task.train_stream(cfg.seed)
    next_prompt_id = 0
    # one unrecorded step at each size, the largest last: a size's first step carries its shapes' one-time costs,
    # and the largest leaves the memory every size needs held
    for p in sorted(pc.prompts):
        res = run.step(pc.at(p), 0, stream, next_prompt_id)
        next_prompt_id += p
        log(f"warm-up step P={p}: {res.responses / res.step_time:.0f} responses/s (not recorded)")
    run.start_clock()
    writer = TraceWriter(cfg.out, meta, overwrite=cfg.overwrite)
    with recording(writer, log):
        step = 0
        for r, sizes in enumerate(order):
            for p in sizes:
                for _ in range(pc.visit_steps):  # the first settles the switch of size; replay/probe.py counts the rest
                    res = run.step(pc.at(p), step, stream, next_prompt_id)
                    next_prompt_id += p
                    for kind, row in res.rows:
                        writer.add(kind, **row)
                    writer.flush()
                    step += 1
                    log(_info(r, pc.rounds, p, res))
    return Path(cfg.out)


def _info(r: int, rounds: int, p: int, res: Any) -> str:
    """One line per probed step (a few steps: each one's line says more than a progress bar)."""
    return (f"round {r + 1}/{rounds} P={p}: {res.responses / res.step_time:.0f} responses/s (step {res.step_time:.2f} "
            f"s: gen {res.gen_time:.2f}, train {res.update_time:.2f}, sync {res.sync_time:.3f})")
