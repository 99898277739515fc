"""Synthetic traces from a known cost model (tests, benchmarks, docs).

The generator runs its own simple step loop of a continuous-batching engine (a deque of waiting
requests, a list of running ones; independent of `sim.engine`), times each step with known
coefficients (optionally with multiplicative noise), and writes a schema-v1 trace with
`replay.io.write_trace` (schema v2 with `calibrate`: calib_gen / calib_train rows as `rlrun record` takes them). Fitting
the trace should recover the coefficients; replaying it should reproduce its step times.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlsim.replay.io import write_trace
from rlsim.replay.cost import EngineStepCost

CALIB_TRAIN_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # calib_train levels, x the batch (as rlrun record)


@dataclass(frozen=True)
class SynthSpec:
    """A synthetic run: configuration, engine, true cost coefficients, learning behaviour."""

    algo: str = field(default="grpo", metadata={"help": "grpo | ppo"})
    prompts: int = field(default=16, metadata={"help": "P"})
    group: int = field(default=4, metadata={"help": "G"})
    steps: int = field(default=6, metadata={"help": "RL steps (updates)"})
    lr_rule: str = field(default="sqrt", metadata={"help": "lr rule written to the config"})
    max_tokens: int = field(default=24, metadata={"help": "response cap"})
    min_tokens: int = field(default=4, metadata={"help": "shortest response"})
    prompt_min: int = field(default=6, metadata={"help": "shortest prompt"})
    prompt_max: int = field(default=12, metadata={"help": "longest prompt"})
    max_num_seqs: int = field(default=32, metadata={"help": "engine max_num_seqs"})
    kv_cache_tokens: int = field(default=1 << 16,
                                 metadata={"help": "engine KV capacity (tokens); the generator does not preempt"})
    block_size: int = field(default=16, metadata={"help": "KV block size"})
    c_step: float = field(default=4e-3, metadata={"help": "true fixed seconds per engine step"})
    c_seq: float = field(default=5e-5, metadata={"help": "true seconds per running sequence"})
    c_ctx: float = field(default=2e-7, metadata={"help": "true seconds per context token"})
    c_prefill: float = field(default=1e-6, metadata={"help": "true seconds per prefill token"})
    step_gap: float = field(default=2e-4, metadata={"help": "seconds between engine steps"})
    round_base: float = field(default=5e-3, metadata={"help": "generation round overhead, seconds"})
    per_response: float = field(default=1e-5, metadata={"help": "round overhead per request, seconds"})
    update_a: float = field(default=0.02, metadata={"help": "update seconds at 0 tokens (optimizer step)"})
    update_b: float = field(default=2e-5, metadata={"help": "update seconds per token"})
    prep_b: float = field(default=5e-6, metadata={"help": "prep seconds per token"})
    reward_b: float = field(default=2e-5, metadata={"help": "reward seconds per response"})
    sync_s: float = field(default=0.011, metadata={"help": "seconds per weight sync"})
    other_s: float = field(default=0.003, metadata={"help": "other seconds per step"})
    noise: float = field(default=0.0, metadata={"help": "relative sd of multiplicative timing noise"})
    load: float = field(default=0.0, metadata={
        "help": "sd of a log-normal slowdown shared by all timings of one RL step and of one calibration level (other "
                "processes on a loaded machine: whole levels move together, so more steps per level do not average it "
                "out)"})
    warmup_extra: float = field(default=0.0, metadata={"help": "extra seconds on each step-0 engine step (warm-up)"})
    g2: float = field(default=1.0, metadata={"help": "true |G|^2"})
    tr_sigma: float = field(default=64.0, metadata={"help": "true tr(Sigma): B_noise = tr_sigma / g2"})
    micro_batch: int = field(default=8, metadata={"help": "responses per micro-batch"})
    eval_every: int = field(default=1, metadata={"help": "eval every N updates"})
    score_scale: float = field(default=2000.0, metadata={"help": "score = 1 - exp(-cum_responses / scale)"})
    model_bytes: int = field(default=2_592_000, metadata={"help": "model.bytes metadata"})
    seed: int = field(default=0, metadata={"help": "seed"})
    c_knee: float = field(default=0.0,
                          metadata={"help": "true change of the per-sequence slope above `knee` (0: linear)"})
    knee: float = field(default=0.0, metadata={"help": "true num_running at which the slope changes"})
    calibrate: bool = field(default=False,
                            metadata={"help": "add calib_gen / calib_train rows (rlrun record's profiles)"})
    calib_steps: int = field(default=8, metadata={"help": "decode steps per calibration rung"})
    calib_factor: int = field(default=16, metadata={"help": "calibration rungs up to this multiple of the batch "
                                                            "(capped by max_num_seqs)"})
    calib_train_a: float = field(default=0.004, metadata={"help": "true forward + backward seconds at 0 tokens"})


def synthetic_trace(path: str | Path, spec: SynthSpec = SynthSpec(), *, meta_overrides: dict | None = None) -> Path:
    rng = np.random.default_rng(spec.seed)
    P, G, B = spec.prompts, spec.group, spec.prompts * spec.group
    rows: list[dict] = []
    t = 0.0
    cum = cum_tok = 0
    cost = true_cost(spec)
    loads = _loads(spec, spec.steps, 0)  # (steps,) slowdown of everything one step times

    def noisy(x: float) -> float:
        return x * (1 + spec.noise * rng.standard_normal()) if spec.noise else x

    for step in range(spec.steps):
        t_step0, slow = t, loads[step]
        plen = np.repeat(rng.integers(spec.prompt_min, spec.prompt_max + 1, size=P), G)
        rlen = rng.integers(spec.min_tokens, spec.max_tokens + 1, size=B)
        t += spec.round_base + spec.per_response * B
        t, t_first, t_fin = _generate(spec, cost, noisy, slow, step, t, plen, rlen, rows)
        gen_time = t - t_step0
        for j in range(B):
            rows.append(dict(kind="response", t_start=t_step0, duration=t_fin[j] - t_step0, step=step,
                             policy_version=step, prompt_id=step * P + j // G, group_index=j % G,
                             prompt_tokens=int(plen[j]), response_tokens=int(rlen[j]), reward=float(rng.random() < 0.5),
                             consumed_step=step, t_queued=t_step0, t_first_token=t_first[j], t_finished=t_fin[j]))
        tokens = int(plen.sum() + rlen.sum())
        t = _train(spec, noisy, slow, step, t, t_step0, gen_time, tokens, int(rlen.sum()), rows)
        cum += B
        cum_tok += tokens
        if (step + 1) % spec.eval_every == 0:
            rows.append(dict(kind="eval", t_start=t, duration=0.01, step=step, policy_version=step + 1,
                             cum_responses=cum, cum_tokens=cum_tok, score=1 - math.exp(-cum / spec.score_scale),
                             eval_k=4, eval_prompts=16))
    if spec.calibrate:
        rows += calibration_rows(spec)
    return write_trace(path, _meta(spec, meta_overrides), rows)


def _generate(spec: SynthSpec, cost: EngineStepCost, noisy, slow: float, step: int, t: float, plen: np.ndarray,
              rlen: np.ndarray, rows: list[dict]) -> tuple[float, np.ndarray, np.ndarray]:
    """One round of continuous batching, a gen_step row per engine step: (time after it, (B,) first-token and
    finish times)."""
    B = len(rlen)
    waiting = deque(range(B))
    running: list[int] = []
    done_tok = np.zeros(B, np.int64)
    t_first = np.full(B, np.nan)
    t_fin = np.full(B, np.nan)
    while waiting or running:
        pre = 0
        while waiting and len(running) < spec.max_num_seqs:
            j = waiting.popleft()
            running.append(j)
            pre += int(plen[j])
        n = len(running)
        ctx = int(sum(int(plen[j] + done_tok[j]) for j in running))
        dec = sum(1 for j in running if done_tok[j] > 0)
        dur = noisy(cost.stretch(1, n, ctx, pre)) * slow + (spec.warmup_extra if step == 0 else 0.0)
        fin = []
        for j in running:
            done_tok[j] += 1
            if done_tok[j] == 1:
                t_first[j] = t + dur
            if done_tok[j] >= rlen[j]:
                fin.append(j)
                t_fin[j] = t + dur
        rows.append(dict(kind="gen_step", t_start=t, duration=dur, step=step, policy_version=step, num_running=n,
                         num_waiting=len(waiting), prefill_tokens=pre, decode_tokens=dec, context_tokens=ctx,
                         kv_usage=min(ctx / spec.kv_cache_tokens, 1.0), finished=len(fin)))
        fs = set(fin)
        running = [j for j in running if j not in fs]
        t += dur + spec.step_gap
    return t, t_first, t_fin


def _train(spec: SynthSpec, noisy, slow: float, step: int, t: float, t_step0: float, gen_time: float, tokens: int,
           response_tokens: int, rows: list[dict]) -> float:
    """Rewards, preparation, the update, the rest of the step and the sync: their rows; the time after them."""
    B = spec.prompts * spec.group
    reward_t = noisy(spec.reward_b * B) * slow
    prep_t = noisy(spec.prep_b * tokens) * slow
    upd0 = noisy(spec.update_a + spec.update_b * tokens)
    upd = upd0 * slow
    t += reward_t + prep_t
    t_upd = t
    t += upd
    t += noisy(spec.other_s)  # the rest of the step, before the sync: step_time ends with the sync (format)
    t_sync = t
    sync = noisy(spec.sync_s)
    t += sync
    b_small = min(spec.micro_batch, B - 1) if B > 1 else 1
    gb = math.sqrt(spec.g2 + spec.tr_sigma / B)
    gs = math.sqrt(spec.g2 + spec.tr_sigma / b_small)
    if spec.calibrate:  # forward + backward as the calibration times them, the optimizer the rest
        fb = upd0 - spec.update_a + spec.calib_train_a
        t_fwd, t_bwd, t_opt = fb / 3, fb - fb / 3, spec.update_a - spec.calib_train_a
    else:
        t_fwd, t_bwd, t_opt = upd0 * 0.3, (upd0 - spec.update_a) * 0.7, spec.update_a
    t_fwd, t_bwd, t_opt = t_fwd * slow, t_bwd * slow, t_opt * slow
    ppo = spec.algo == "ppo"
    rows.append(dict(kind="update", t_start=t_upd, duration=upd, step=step, policy_version=step, num_responses=B,
                     num_tokens=tokens, response_tokens_total=response_tokens, lr=3e-4, loss=0.0, reward=0.5,
                     t_forward=t_fwd, t_backward=t_bwd, t_optimizer=t_opt, grad_norm=gb, grad_norm_micro=gs,
                     micro_batch=b_small, critic_grad_norm=gb if ppo else None,
                     critic_grad_norm_micro=gs if ppo else None, step_time=t - t_step0, gen_time=gen_time,
                     reward_time=reward_t, prep_time=prep_t))
    rows.append(dict(kind="sync", t_start=t_sync, duration=sync, step=step, policy_version=step + 1,
                     bytes=spec.model_bytes))
    return t


def _meta(spec: SynthSpec, overrides: dict | None) -> dict:
    meta = {
        "seed": spec.seed,
        "config": {"algo": spec.algo, "prompts": spec.prompts, "group": spec.group, "lr": 3e-4, "lr_rule": spec.lr_rule,
                   "lr_ref_batch": 256, "max_tokens": spec.max_tokens, "steps": spec.steps,
                   "max_num_seqs": spec.max_num_seqs},
        "engine": {"name": "synthetic", "max_num_seqs": spec.max_num_seqs, "kv_cache_tokens": spec.kv_cache_tokens,
                   "block_size": spec.block_size, "max_model_len": 256},
        "hardware": {"device": "cpu", "device_name": "synthetic", "mem_bandwidth_gbs": None},
        "model": {"name": "synthetic", "bytes": spec.model_bytes, "parameters": spec.model_bytes // 4},
    }
    for k, v in (overrides or {}).items():
        meta[k] = {**meta.get(k, {}), **v} if isinstance(v, dict) and isinstance(meta.get(k), dict) else v
    return meta


def _loads(spec: SynthSpec, n: int, stream: int) -> np.ndarray:
    """(n,) slowdown factors exp(load x N(0, 1)), from their own random stream (no load: ones, the other streams
    untouched)."""
    if not spec.load:
        return np.ones(n)
    return np.exp(spec.load * np.random.default_rng((spec.seed, 7_000_003, stream)).standard_normal(n))


def true_cost(spec: SynthSpec) -> EngineStepCost:
    """The generator's engine-step cost (one hinge when the spec has a knee)."""
    hinges = ((spec.knee, spec.c_knee),) if spec.c_knee else ()
    return EngineStepCost(spec.c_step, spec.c_seq, spec.c_ctx, spec.c_prefill, hinges=hinges)


def true_step_seconds(spec: SynthSpec, n, ctx, pre):
    """The generator's noise-free engine-step seconds."""
    return true_cost(spec).step(n, ctx, pre)


def calibration_rows(spec: SynthSpec) -> list[dict]:
    """calib_gen rows at half-octave rungs 1, 2, 3, 4, 6, 8, 11, ... up to min(calib_factor x B, max_num_seqs)
    (as `rlrun record` calibrates), `calib_steps` decode steps each after a prefill step, and calib_train rows
    at CALIB_TRAIN_FACTORS x the batch's tokens (2 passes each); timed with the spec's true coefficients and
    noise (their own random stream)."""
    rng = np.random.default_rng(spec.seed + 1_000_003)
    B = spec.prompts * spec.group
    top = min(spec.calib_factor * B, spec.max_num_seqs)
    rungs = [n for n in np.unique(np.round(2 ** (np.arange(2 * np.log2(top) + 1) / 2))).astype(int).tolist() if n < top]
    rungs.append(top)
    rows: list[dict] = []
    t = 0.0

    def noisy(x: float) -> float:
        return x * (1 + spec.noise * rng.standard_normal()) if spec.noise else x

    gen_load, train_load = _loads(spec, len(rungs), 1), _loads(spec, len(CALIB_TRAIN_FACTORS), 2)
    for level, slow in zip(rungs, gen_load):
        plen = rng.integers(spec.prompt_min, spec.prompt_max + 1, size=level)
        for k in range(spec.calib_steps + 1):
            pre = int(plen.sum()) if k == 0 else 0
            ctx = int(plen.sum()) + level * k
            dur = noisy(float(true_step_seconds(spec, level, ctx, pre))) * slow
            rows.append(dict(kind="calib_gen", t_start=t, duration=dur, step=0, policy_version=0, num_running=level,
                             num_waiting=0, prefill_tokens=pre, decode_tokens=level if k else 0, context_tokens=ctx,
                             kv_usage=min(ctx / spec.kv_cache_tokens, 1.0),
                             finished=level if k == spec.calib_steps else 0, calib_level=level))
            t += dur
    mean_tok = (spec.prompt_min + spec.prompt_max) / 2 + (spec.min_tokens + spec.max_tokens) / 2
    for f, slow in zip(CALIB_TRAIN_FACTORS, train_load):
        R = max(1, int(round(f * B)))
        tokens = int(round(R * mean_tok))
        for _ in range(2):
            dur = noisy(spec.calib_train_a + spec.update_b * tokens) * slow
            rows.append(dict(kind="calib_train", t_start=t, duration=dur, step=0, policy_version=0, num_responses=R,
                             num_tokens=tokens, t_forward=dur / 3, t_backward=dur - dur / 3, calib_level=R))
            t += dur
    return rows
