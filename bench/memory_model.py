"""The memory model (rlsim.replay.memory) against published figures: vLLM's KV-cache capacity from public logs and
DeepSpeed's ZeRO estimator on its documented cases, each predicted from the model's shape, the device and the engine
or ZeRO arguments alone; then held-out cases (vLLM logs and out-of-memory reports with a neighbouring configuration
that ran, found after the rules were chosen); then against `rlrun record`'s measured peaks (traces/memory/).
docs/results.md section 8; tests/replay/test_memory.py checks the published cases.

    python -m bench.memory_model

Targets (issue "Will it fit?"): vLLM's capacity within 5 % on >= 3 public cases, the ZeRO estimator within 10 %, the
measured peaks within 20 % at sizes other than the one a fixed runtime term is fitted on.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.replay.devices import get_profile
from rlsim.replay.io import read_trace
from rlsim.replay.memory import (GIB, GenSetup, ModelShape, estimate_memory, kv_tokens_from_bytes, model_shape,
                                 setups_from_verl, usable_memory_gb, vllm_kv_capacity_tokens, vllm_kv_pool_bytes,
                                 zero_host_bytes, zero_model_states_bytes)
from rlsim.whatif.memory import Load, candidate_memory, trace_memory

# vLLM's "GPU KV cache size" (or its "# GPU blocks" x 16): (source, model, GPU memory as CUDA reported it in GiB or
# None for an A100-80GB profile, gpu_memory_utilization, max_num_batched_tokens, published tokens)
VLLM_CASES = [
    ("github.com/vllm-project/vllm/issues/10517 (RTX 3090, max-model-len 20k: 1952 blocks)",
     "meta-llama/Llama-3.1-8B-Instruct", 23.58, 0.90, 20000, 1952 * 16),
    ("github.com/vllm-project/vllm/issues/10517 (RTX 3090, max-model-len 29k: 'KV cache (23648)')",
     "meta-llama/Llama-3.1-8B-Instruct", 23.58, 0.90, 29000, 23648),
    ("github.com/vllm-project/vllm/pull/2031 (Llama2-7B, TP 1, 1 x A100-80GB: 7351 blocks)",
     "meta-llama/Llama-2-7b-hf", None, 0.90, 4096, 7351 * 16),
]
# a pool vLLM reported in GiB and the tokens it said it holds: (source, model, pool GiB, published tokens)
POOL_CASES = [("github.com/LMCache/LMCache/issues/1739 (Qwen3-14B)", "Qwen/Qwen3-14B", 6.51, 42656)]
# DeepSpeed's ZeRO estimators as published: (source, model, parameters, largest layer's parameters, GPUs on one node,
# stage, offload optimizer, offload parameters, per GPU, per CPU (None: not published), unit in bytes). The docs
# page (deepspeed.readthedocs.io/en/latest/memory.html) shows the `_all_cold` outputs for t5-3b and a worked
# t5-large case in MiB; deepspeedai/DeepSpeed issue #4527 a user's stage-3 output for a 6.8B model. The page's
# ZeRO-2 figure without offload (15.93) was printed before PR #5099 changed the estimator from 4 + 16 / GPUs to
# 2 + 18 / GPUs bytes per parameter (the current source, which the model follows): docs/simulator.md, "Memory".
DOCS, I4527 = "docs", "DeepSpeed issue #4527"
ZERO_CASES = [
    (DOCS, "t5-3b", 2851e6, 32e6, 8, 3, True, True, 0.12, 71.69, GIB),
    (DOCS, "t5-3b", 2851e6, 32e6, 8, 3, True, False, 0.78, 63.72, GIB),
    (DOCS, "t5-3b", 2851e6, 32e6, 8, 3, False, False, 6.09, 1.43, GIB),
    (DOCS, "t5-3b", 2851e6, 0, 8, 2, True, False, 5.31, 127.45, GIB),
    (DOCS + ", printed before PR #5099", "t5-3b", 2851e6, 0, 8, 2, False, False, 15.93, 127.45, GIB),
    (DOCS + ", worked example", "t5-large", 737.67e6, 32.90e6, 4, 3, False, False, 3291, None, 2 ** 20),
    (DOCS + ", worked example", "t5-large", 737.67e6, 32.90e6, 4, 3, True, True, 125, None, 2 ** 20),
    (DOCS + ", worked example", "t5-large", 737.67e6, 32.90e6, 4, 3, True, False, 477, None, 2 ** 20),
    (I4527, "6805M", 6805e6, 131e6, 4, 3, True, True, 0.49, 171.13, GIB),
    (I4527, "6805M", 6805e6, 131e6, 4, 3, True, False, 3.66, 152.11, GIB),
    (I4527, "6805M", 6805e6, 131e6, 4, 3, False, False, 29.01, 2.93, GIB),
]
# The ZeRO paper's per-GPU model states (Rajbhandari et al. 2020, arXiv:1910.02054, Figure 1: Psi = 7.5B, N_d = 64,
# K = 12, decimal GB) by stage: its accounting has no fp32 gradient copy (K = 12 where DeepSpeed's estimators count
# 16) and no 16-bit parameter partition at stage 3, so the model sits above it by 4 Psi (stage 0), 4 Psi / N (1, 2)
# and 2 Psi / N (3)
ZERO_PAPER = [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)]
ROOT = Path(__file__).resolve().parents[1]


# Held-out cases: found after the rules above were chosen and not used to choose them.
# vLLM's capacity (full prediction): (source, model, GPU memory as CUDA reports it in GiB, tensor parallel size,
# gpu_memory_utilization, max_num_batched_tokens, published tokens, published pool of one rank in GiB or None).
# vllm #13061: DeepSeek-R1-Distill-Qwen-14B (Qwen2.5-14B's shape) on 2 x RTX 4090, vLLM 0.7 (V0); the user's
# "23.08" is total x 0.98, so total = 23.55 GiB; its profiling line: weights 13.95 GiB, non-torch 0.25 GiB,
# activation peak 0.19 GiB, KV pool 8.69 GiB; max_model_len 131072 turns on V0's chunked prefill, whose token
# budget (2048) the profiling forward runs.
HELD_OUT_KV = [("github.com/vllm-project/vllm/issues/13061 (DeepSeek-R1-Distill-Qwen-14B, TP 2, 2 x RTX 4090)",
                "Qwen/Qwen2.5-14B", 23.55, 2, 0.98, 2048, 81536, 8.69)]
# a pool vLLM reported and the tokens it said it holds, for a model outside the registry (its KV shape from its
# config.json: huggingface.co/Qwen/Qwen3-235B-A22B, 94 layers, 4 KV heads of 128; a mixture of experts, whose
# weights the shape model does not count, but whose KV cache is that of any decoder): vllm #21348, TP 4, 4 x H100
QWEN3_235B = ModelShape("Qwen/Qwen3-235B-A22B", 235e9, 94, 4096, 64, 4, 128, 0, 151936,
                        source="huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (KV shape only)")
HELD_OUT_POOL = [("github.com/vllm-project/vllm/issues/21348 (Qwen3-235B-A22B-FP8, TP 4)", QWEN3_235B, 4, 8.11,
                  178880)]
# Out-of-memory reports with a neighbouring configuration that ran, each a verl-style run as setups_from_verl reads
# it: (source, what, model, device profile, GPUs, the verl config's values, reported outcome: True ran, False OOM).
# Search-R1 #80: its train_grpo.sh (verl 0.1: ppo_micro_batch_size 64 over the GPUs; param, grad and optimizer
# offload; vLLM TP 1 at 0.6; prompts 4096 + responses 500; 512 prompts x 5; KL loss, reference offloaded) with
# Qwen2.5-14B ran out of memory on 4 x A800-80GB; the maintainer trains 14B models with it on 8 x H100-80GB.
# EasyR1 PR #1 (github.com/hiyouga/EasyR1/pull/1): its grpo_example.yaml (Qwen2.5-7B-Instruct, 8 x 80 GB, vLLM TP 2,
# 512 prompts x 5, 2048 + 2048 tokens, micro-batch 4, checkpointing, actor and reference offload) ran out of
# memory at gpu_memory_utilization 0.7 and ran at 0.6.
OOM_CASES = [
    ("github.com/PeterGriffinJin/Search-R1/issues/80", "Search-R1 GRPO, Qwen2.5-14B, 4 x A800-80GB",
     "Qwen/Qwen2.5-14B", "a800-80gb", 4, dict(micro=16, util=0.6, tp=1, prompt=4096, response=500, batch=512, n=5,
                                               offload=True), False),
    ("github.com/PeterGriffinJin/Search-R1/issues/80", "same script, 8 x H100-80GB", "Qwen/Qwen2.5-14B", "h100-sxm",
     8, dict(micro=8, util=0.6, tp=1, prompt=4096, response=500, batch=512, n=5, offload=True), True),
    ("github.com/hiyouga/EasyR1/pull/1", "EasyR1 GRPO, Qwen2.5-7B, 8 x 80 GB, gpu_memory_utilization 0.7",
     "Qwen/Qwen2.5-7B-Instruct", "a100-80gb", 8, dict(micro=4, util=0.7, tp=2, prompt=2048, response=2048, batch=512,
                                                      n=5, offload=True), False),
    ("github.com/hiyouga/EasyR1/pull/1", "same, gpu_memory_utilization 0.6", "Qwen/Qwen2.5-7B-Instruct",
     "a100-80gb", 8, dict(micro=4, util=0.6, tp=2, prompt=2048, response=2048, batch=512, n=5, offload=True), True),
]

# The log-prob passes' micro-batches the same scripts set (rlsim.replay.memory.log_prob_pass_bytes), left out of the
# rows above so that they stay as first published and printed in a block of their own: Search-R1's train_grpo.sh
# sets verl 0.1's global rollout and ref log_prob_micro_batch_size 128 (over the GPUs); EasyR1's grpo_example.yaml
# micro_batch_size_per_device_for_experience 8.
LOG_PROB_KEYS = {"github.com/PeterGriffinJin/Search-R1/issues/80": {"log_prob_micro_batch_size": 128},
                 "github.com/hiyouga/EasyR1/pull/1": {"log_prob_micro_batch_size_per_gpu": 8}}

# What the scripts set about packing (rlsim.replay.memory.micro_batch_tokens), seen after the rule of the log-prob
# passes missed Search-R1's 8 x H100 run, so in-sample for the packing rule: Search-R1's train_grpo.sh sets
# actor_rollout_ref.model.use_remove_padding=True (github.com/PeterGriffinJin/Search-R1/blob/main/train_grpo.sh).
# Neither report gives the runs' mean prompt + response lengths, so the model keeps the padded bound and the block
# prints the largest mean at which each case would fit.
REMOVE_PADDING = {"github.com/PeterGriffinJin/Search-R1/issues/80"}


def verl_config(gpus: int, micro: int, util: float, tp: int, prompt: int, response: int, batch: int, n: int,
                offload: bool) -> dict:
    """A verl Hydra config (nested dict) with the values an OOM report gives; GRPO with a KL loss, gradient
    checkpointing and the reference offloaded, as in both reports."""
    actor = {"ppo_micro_batch_size_per_gpu": micro, "use_kl_loss": True,
             "fsdp_config": {"param_offload": offload, "optimizer_offload": offload}}
    return {"trainer": {"n_gpus_per_node": gpus, "nnodes": 1},
            "data": {"train_batch_size": batch, "max_prompt_length": prompt, "max_response_length": response},
            "algorithm": {"adv_estimator": "grpo"},
            "actor_rollout_ref": {"hybrid_engine": True, "model": {"enable_gradient_checkpointing": True},
                                  "actor": actor, "ref": {"fsdp_config": {"param_offload": True}},
                                  "rollout": {"tensor_model_parallel_size": tp, "gpu_memory_utilization": util,
                                              "n": n}}}


def held_out_kv_rows() -> list[tuple[str, float, float]]:
    """(case, published, predicted) for the held-out vLLM cases: tokens, and the rank's pool where published."""
    rows = []
    for source, name, total, tp, util, tokens, published, pool in HELD_OUT_KV:
        model, gen = model_shape(name), GenSetup(tp=tp, gpu_memory_utilization=util, max_num_batched_tokens=tokens)
        rows.append((source + ", tokens", published, vllm_kv_capacity_tokens(model, gen, total)))
        if pool is not None:
            rows.append((source + ", one rank's pool GiB", pool, vllm_kv_pool_bytes(model, gen, total) / GIB))
    for source, model, tp, pool, published in HELD_OUT_POOL:
        rows.append((source + ", pool to tokens", published, kv_tokens_from_bytes(model, pool, tp=tp)))
    return rows


def oom_rows(log_prob: bool = False, packing: bool = False) -> list[tuple[str, bool, Any]]:
    """(case with the model's GiB per device, reported outcome: ran, the model's estimate) for every OOM report;
    `log_prob`: with the log-prob micro-batches the scripts set (LOG_PROB_KEYS); `packing`: and use_remove_padding
    where the script sets it (REMOVE_PADDING), with the largest mean length at which the case fits."""
    out = []
    for source, what, name, device, gpus, values, ran in OOM_CASES:
        cfg = verl_config(gpus, **values)
        if log_prob:
            for role in ("rollout", "ref"):
                cfg["actor_rollout_ref"][role].update(LOG_PROB_KEYS[source])
        if packing and source in REMOVE_PADDING:
            cfg["actor_rollout_ref"]["model"]["use_remove_padding"] = True
        gen, train = setups_from_verl(cfg)
        model, memory_gb = model_shape(name), get_profile(device).memory_gb
        est = estimate_memory(model, gen, train, memory_gb)
        packed = (f", fits at a mean length <= {fitting_mean(model, gen, train, memory_gb)}"
                  if train.remove_padding else "")
        out.append((f"{what} ({source}): generation {est.generation_gb:.1f}, training {est.training_gb:.1f} of "
                    f"{est.limit_gb:.1f} GiB{packed}", ran, est))
    return out


def fitting_mean(model: ModelShape, gen: GenSetup, train: Any, memory_gb: float) -> str:
    """The largest mean prompt + response length (tokens, to 1 %) at which a packed case fits: 'none' if it does not
    fit at length 1, 'any' if it fits at the padded bound."""
    def fits(mean: float) -> bool:
        return bool(estimate_memory(model, gen, replace(train, mean_seq_len=mean), memory_gb).fits)
    lo, hi = 1.0, float(train.seq_len)
    if fits(hi) or not fits(lo):
        return "any" if fits(hi) else "none"
    while hi - lo > 0.01 * hi:
        lo, hi = ((lo + hi) / 2, hi) if fits((lo + hi) / 2) else (lo, (lo + hi) / 2)
    return f"{lo:.0f} of {train.seq_len} tokens"


def vllm_rows() -> list[tuple[str, float, float]]:
    """(case, published tokens, predicted tokens) for every vLLM case."""
    rows = []
    for source, name, total, util, tokens, published in VLLM_CASES:
        total = total or usable_memory_gb(get_profile("a100-80gb").memory_gb)
        gen = GenSetup(gpu_memory_utilization=util, max_num_batched_tokens=tokens)
        rows.append((source, published, vllm_kv_capacity_tokens(model_shape(name), gen, total)))
    for source, name, pool, published in POOL_CASES:
        rows.append((source + ", pool to tokens", published, kv_tokens_from_bytes(model_shape(name), pool)))
    return rows


def zero_rows() -> list[tuple[str, float, float]]:
    """(case, published, predicted) per GPU and per CPU for every published ZeRO estimator output, in its unit."""
    rows = []
    for source, model, params, largest, gpus, stage, opt, par, gpu, cpu, unit in ZERO_CASES:
        off = "offload optimizer + params" if par else "offload optimizer" if opt else "no offload"
        what = f"{model} ZeRO-{stage} x {gpus}, {off} ({'GiB' if unit == GIB else 'MiB'}; {source})"
        g = zero_model_states_bytes(params, largest, stage, gpus, opt, par) / unit
        rows.append((what + ", per GPU", gpu, g))
        if cpu is not None:
            rows.append((what + ", per CPU", cpu, zero_host_bytes(params, largest, stage, gpus, 1, opt, par) / unit))
    return rows


def zero_paper_rows() -> list[tuple[str, float, float]]:
    """(stage, published GB, predicted GB) per GPU for the ZeRO paper's Figure 1 (largest layer not given: 0)."""
    return [(f"7.5B ZeRO-{stage} x 64 (arXiv:1910.02054, Figure 1; GB)", gb,
             zero_model_states_bytes(7.5e9, 0, stage, 64) / 1e9) for stage, gb in ZERO_PAPER]


def peak_rows(paths: list[Path]) -> list[tuple[str, float, float]]:
    """(recording, measured GiB, model GiB + runtime) per phase of each `rlrun record` trace with memory peaks: the
    recording process's resident peak holds the Python, torch and vLLM runtime, which the model does not count, so
    one runtime term per phase is fitted on the first trace (the smallest batch) and added unchanged to the others."""
    out, runtime = [], None
    for p in paths:
        t = read_trace(p)
        u = t.rows("update")
        meas = [float(np.nanmax(u[c].astype(float))) / GIB for c in ("mem_gen_peak_bytes", "mem_train_peak_bytes")]
        tm = trace_memory(t.meta)
        c = t.config
        B, seq = int(c["prompts"]) * int(c.get("group") or 1), int(c.get("max_model_len") or 256)
        est, _, _ = candidate_memory(tm, WhatIf(), Load(B, B, seq, 1))
        model = [est.generation_gb, est.training_gb]
        runtime = runtime or [m - x for m, x in zip(meas, model)]
        kv = c.get("kv_cache_gib")
        for phase, m, x, r in zip(("generation", "training"), meas, model, runtime):
            out.append((f"{p.name} (P {c['prompts']}, G {c.get('group')}, KV pool {kv} GiB), {phase}", m, x + r))
    return out


def cost_ms(path: Path, repeats: int = 200) -> float:
    """Milliseconds the memory estimate adds to one `rlsim run` (the trace's inputs, then the reference's and the
    candidate's estimates), median over `repeats`: pure arithmetic, no import of its own."""
    t = read_trace(path)
    B = int(t.config["prompts"]) * int(t.config.get("group") or 1)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tm = trace_memory(t.meta)
        for b in (B, 16 * B):
            candidate_memory(tm, WhatIf(), Load(b, b, 256, 1))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main() -> None:
    print(f"{'case':<100} {'published':>10} {'predicted':>10} {'error':>7}")
    peaks = sorted((ROOT / "traces" / "memory").glob("*.parquet"), key=lambda p: (len(p.stem), p.stem))
    for title, rows in (("vLLM KV-cache capacity, tokens (target 5 %)", vllm_rows()),
                        ("DeepSpeed ZeRO estimator's published outputs (target 10 %)", zero_rows()),
                        ("ZeRO paper's model states (another accounting: no target)", zero_paper_rows()),
                        ("rlrun record peaks, GiB (runtime fitted on the first; target 20 % on the others)",
                         peak_rows(peaks))):
        print(title)
        for case, published, predicted in rows:
            print(f"  {case:<98} {published:>10.6g} {predicted:>10.6g} {predicted / published - 1:>+7.1%}")
    print("held-out vLLM cases (not used to choose the rules)")
    for case, published, predicted in held_out_kv_rows():
        print(f"  {case:<98} {published:>10.6g} {predicted:>10.6g} {predicted / published - 1:>+7.1%}")
    for title, log_prob, packing in (
            ("out-of-memory reports and their neighbours: reported / the model", False, False),
            ("the same with the scripts' log-prob micro-batches (LOG_PROB_KEYS)", True, False),
            ("the same with use_remove_padding where set (REMOVE_PADDING; in-sample: seen before the packing rule; "
             "no recorded mean: padded bound)", True, True)):
        print(title)
        for case, ran, est in oom_rows(log_prob, packing):
            verdict = "fits" if est.fits else "does not fit" if est.fits is False else "undecided"
            print(f"  {case}: reported {'ran' if ran else 'out of memory'} / {verdict} "
                  f"({'agrees' if est.fits is ran else 'MISSES'})")
    trace = ROOT / "traces" / "grpo_p128.parquet"
    print(f"time the estimate adds to rlsim run on {trace.name}: {cost_ms(trace):.2f} ms (median of 200; "
          "target < 50 ms)")


if __name__ == "__main__":
    main()
