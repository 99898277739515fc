"""Small, realistic synthetic traces for the sweep / chart / report / Perfetto tests.

A colocated synchronous GRPO loop: each RL step queues P x G requests into an engine with
continuous batching (`max_num_seqs`, prefill on admission, one decode token per running
sequence per step, step cost roofline-shaped), then rewards, one update, one weight sync, and an
eval every `eval_every` updates. Written with `replay.io.write_trace` in the documented format.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rlsim.replay.io import write_trace

MODEL_BYTES = 2_592_000


def make_trace(path: Path, *, prompts: int = 8, group: int = 4, updates: int = 6, max_num_seqs: int = 16,
               seed: int = 0, eval_every: int = 2, lr: float = 3e-4, kv_cache_tokens: int = 16384) -> Path:
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    t = 0.5
    cum_responses = cum_tokens = 0
    # roofline-shaped step cost: fixed + per sequence + per context token + per prefill token
    a, b, c, d = 4e-3, 1.5e-4, 2e-7, 1e-6
    for step in range(updates):
        n = prompts * group
        prompt_len = np.repeat(rng.integers(6, 12, size=prompts), group)
        target = rng.integers(8, 40, size=n)
        generated = np.zeros(n, dtype=int)
        t_queued = np.full(n, t)
        t_first = np.full(n, np.nan)
        waiting = list(range(n))
        running: list[int] = []
        gen_start = t
        while waiting or running:
            admitted = []
            while waiting and len(running) < max_num_seqs:
                i = waiting.pop(0)
                running.append(i)
                admitted.append(i)
            prefill = int(prompt_len[admitted].sum())
            ctx = int((prompt_len[running] + generated[running]).sum())
            dur = a + b * len(running) + c * ctx + d * prefill
            dur *= float(rng.uniform(0.97, 1.03))
            generated[running] += 1
            for i in running:
                if np.isnan(t_first[i]):
                    t_first[i] = t + dur
            done = [i for i in running if generated[i] >= target[i]]
            num_running = len(running)
            running = [i for i in running if generated[i] < target[i]]
            kv = float((prompt_len[running] + generated[running]).sum()) / kv_cache_tokens
            rows.append(dict(kind="gen_step", t_start=t, duration=dur, step=step, policy_version=step,
                             num_running=num_running, num_waiting=len(waiting), prefill_tokens=prefill,
                             decode_tokens=num_running, context_tokens=ctx, kv_usage=kv, finished=len(done)))
            for i in done:
                reward = float(rng.random() < 0.3 + 0.05 * step)
                rows.append(dict(kind="response", t_start=float(t_queued[i]), duration=t + dur - float(t_queued[i]),
                                 step=step, policy_version=step, prompt_id=step * prompts + i // group,
                                 group_index=i % group, prompt_tokens=int(prompt_len[i]),
                                 response_tokens=int(target[i]), reward=reward, consumed_step=step,
                                 t_queued=float(t_queued[i]), t_first_token=float(t_first[i]), t_finished=t + dur))
            t += dur
        gen_time = t - gen_start
        reward_time = 0.002 + 1e-5 * n
        t += reward_time
        prep_time = 0.003 + 2e-5 * n
        t += prep_time
        tokens = int((prompt_len + target).sum())
        upd = 0.01 + 3e-6 * tokens
        fwd, bwd, opt = upd * 0.3, upd * 0.6, upd * 0.08
        gn = float(rng.uniform(0.5, 1.0))
        rows.append(dict(kind="update", t_start=t, duration=upd, step=step, policy_version=step,
                         num_responses=n, num_tokens=tokens, response_tokens_total=int(target.sum()), lr=lr,
                         loss=float(rng.normal(0, 0.1)), reward=0.3 + 0.05 * step, t_forward=fwd, t_backward=bwd,
                         t_optimizer=opt, grad_norm=gn, grad_norm_micro=gn * 1.8, micro_batch=8,
                         step_time=None, gen_time=gen_time, reward_time=reward_time, prep_time=prep_time))
        t += upd
        sync = 0.011 + MODEL_BYTES / 5e10
        rows.append(dict(kind="sync", t_start=t, duration=sync, step=step, policy_version=step + 1, bytes=MODEL_BYTES))
        t += sync
        rows[-2]["step_time"] = t - gen_start
        cum_responses += n
        cum_tokens += tokens
        if (step + 1) % eval_every == 0:
            ev = 0.05
            rows.append(dict(kind="eval", t_start=t, duration=ev, step=step, policy_version=step + 1,
                             cum_responses=cum_responses, cum_tokens=cum_tokens,
                             score=0.4 + 0.3 * (1 - np.exp(-cum_responses / (4.0 * n))), eval_k=4, eval_prompts=32))
            t += ev
    meta = {
        "created": "2026-11-29T21:30:00Z", "seed": seed,
        "config": {"algo": "grpo", "prompts": prompts, "group": group, "lr": lr, "lr_rule": "sqrt",
                   "lr_ref_batch": prompts * group, "max_tokens": 48, "temperature": 1.0, "eval_every": eval_every,
                   "task": "add2", "updates": updates},
        "engine": {"name": "vllm", "version": "0.32.0", "max_num_seqs": max_num_seqs, "kv_cache_tokens": kv_cache_tokens,
                   "block_size": 16, "max_model_len": 256, "dtype": "float32", "start_time_s": 2.1},
        "hardware": {"device": "cpu", "device_name": "synthetic", "device_count": 1, "cpu_cores": 2,
                     "memory_gb": 23.4, "mem_bandwidth_gbs": None},
        "model": {"name": "tiny-llama-add2", "architecture": "LlamaForCausalLM", "parameters": 648000,
                  "bytes": MODEL_BYTES, "hidden": 128, "layers": 3, "heads": 2, "head_dim": 64, "vocab": 23},
        "packages": {"rlsim": "0.1.0", "python": "3.11"},
    }
    return write_trace(path, meta, rows)


class FakeOutcome:
    def __init__(self, d):
        self._d = d

    def to_dict(self):
        return dict(self._d)


def fake_evaluate(study, cfg):
    """A deterministic stand-in for `sim.whatif.evaluate` (tests of the sweep machinery alone)."""
    p = cfg.prompts or study["prompts"]
    g = cfg.group or study["group"]
    b = p * g
    ref = study["prompts"] * study["group"]
    sigma = (min(b, 1024) / ref) ** 0.6
    rho = 1.0 if b <= 512 else b / 512 * (1.2 if cfg.lr_rule == "fixed" else 1.0)
    ratio = rho / sigma
    return FakeOutcome({"prompts": p, "group": g, "lr_rule": cfg.lr_rule or "sqrt", "responses_per_s": 100 * sigma,
                        "step_time_s": b / (100 * sigma), "sigma": sigma, "rho": rho, "time_to_target_ratio": ratio,
                        "regime": "falls" if ratio < 0.95 else ("rises" if ratio > 1.05 else "flat"),
                        "warnings": ["extrapolating"] if b > 16 * ref else []})
