"""Write docs/examples/verl/verl_gsm8k_qwen.log: an ILLUSTRATIVE verl console log (40 GRPO steps).

    .venv/bin/python docs/examples/verl/make_verl_example.py

The line FORMAT is verl's (see README.md for the public lines it copies); the NUMBERS are made up by the
model below, tuned to be plausible for Qwen2.5-3B-Instruct GRPO on GSM8K (P=256 prompts x n=5, 8 GPUs,
vLLM TP=2, max response 1024) and checked against magnitudes in public verl logs (issue #106 of
zhaochenyang20/Awesome-ML-SYS-Tutorial: gen 29.6 s, old_log_prob 6.6 s, ref 6.3 s at 330-token responses;
verl issue #1208: update_actor 14.3 s, step 96.6 s). Nothing here is a measurement.

The model: every step draws 1280 response lengths (log-normal, mean drifting from ~290 to ~215 tokens,
capped at 1024) and 256 prompt lengths; generation runs on 4 vLLM engines (8 GPUs / TP 2) as continuous
batching with a per-engine step cost 9 ms + 0.03 ms per running sequence + 60 ns per context token; the
round ends when the slowest engine does; the other phases are linear in tokens or responses; every
time gets multiplicative noise. Deterministic (seed 2025).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "verl_gsm8k_qwen.log"
P, G, GPUS, TP, STEPS, CAP = 256, 5, 8, 2, 40, 1024
B = P * G
ENGINES = GPUS // TP
TAG = "(TaskRunner pid=2145993) "


def engine_round(p: np.ndarray, L: np.ndarray) -> float:
    """Seconds of one engine's round: all requests admitted at step 0 (max_num_seqs 1024 > 320)."""
    K = int(L.max())
    steps = np.arange(K)
    running = (L[None, :] > steps[:, None])
    n = running.sum(axis=1)
    ctx = (running * (p[None, :] + steps[:, None])).sum(axis=1)
    return float(np.sum(0.009 + 0.00003 * n + 6e-8 * ctx) + 2.2e-7 * p.sum())


def fmt_np(x: float) -> str:
    return f"np.float64({x!r})"


def main() -> None:
    rng = np.random.default_rng(2025)
    lines = [
        f"{TAG}Using dataset class: RLHFDataset",
        f"{TAG}dataset len: 7473",
        f"{TAG}filter dataset len: 7473",
        f"{TAG}Size of train dataloader: 29, Size of val dataloader: 1",
        f"{TAG}Total training steps: {STEPS}",
    ]
    noise = lambda s=0.03: float(np.exp(rng.normal(0, s)))  # noqa: E731
    # validation before training (verl logs it as step 0)
    val = [0.692, 0.771, 0.812, 0.838, 0.851]
    lines.append(f"{TAG}step:0 - val-aux/openai/gsm8k/reward/mean@1:{val[0]!r} - "
                 f"val-aux/openai/gsm8k/score/mean@1:{val[0]!r} - val-core/openai/gsm8k/acc/mean@1:{val[0]!r}")
    for g in range(1, STEPS + 1):
        frac = (g - 1) / (STEPS - 1)
        mean_target = 215 + 75 * np.exp(-3.0 * frac)
        sigma = 0.5
        mu = np.log(mean_target) - sigma**2 / 2
        L = np.minimum(np.maximum(np.round(rng.lognormal(mu, sigma, B)), 12), CAP).astype(np.int64)
        p_prompt = np.clip(np.round(rng.normal(104, 22, P)), 62, 228).astype(np.int64)
        p = np.repeat(p_prompt, G)
        order = rng.permutation(B)
        gen_s = max(engine_round(p[idx], L[idx]) for idx in np.array_split(order, ENGINES))
        gen_s = (gen_s + 1.6) * noise()  # + weight reshard into vLLM and request handling
        resp_tok, prompt_tok = int(L.sum()), int(p.sum())
        T = resp_tok + prompt_tok
        reward = 0.62 * noise(0.06)
        old_lp = (0.25 + 2.3e-6 * T) * noise()
        ref = (0.22 + 2.2e-6 * T) * noise()
        adv = 0.031 * noise(0.1)
        upd = (0.7 + 1.05e-5 * T) * noise()
        testing = 14.2 * noise(0.04) if g % 10 == 0 else None
        ckpt = 17.5 * noise(0.05) if g % 20 == 0 else None
        other = 0.28 * noise(0.1)
        step = gen_s + reward + old_lp + ref + adv + upd + other + (testing or 0) + (ckpt or 0)
        score = float(np.clip(0.63 + 0.24 * (1 - np.exp(-2.5 * frac)) + rng.normal(0, 0.012), 0, 1))
        clip = float(np.mean(L >= CAP))
        seqlen = (p + L).reshape(GPUS, -1).sum(axis=1)
        kv = [
            ("global_seqlen/min", int(seqlen.min())), ("global_seqlen/max", int(seqlen.max())),
            ("global_seqlen/minmax_diff", int(seqlen.max() - seqlen.min())),
            ("global_seqlen/balanced_min", int(T // GPUS)), ("global_seqlen/balanced_max", int(-(-T // GPUS))),
            ("global_seqlen/mean", T / GPUS),
            ("actor/entropy", fmt_np(0.41 - 0.12 * frac + rng.normal(0, 0.01))),
            ("actor/pg_loss", fmt_np(rng.normal(0, 0.004))),
            ("actor/pg_clipfrac", fmt_np(abs(rng.normal(0.0012, 0.0004)))),
            ("actor/ppo_kl", fmt_np(rng.normal(0, 2e-5))),
            ("actor/pg_clipfrac_lower", fmt_np(0.0)),
            ("actor/kl_loss", fmt_np(0.0009 * g * noise(0.1))),
            ("actor/kl_coef", fmt_np(0.001)),
            ("actor/grad_norm", fmt_np(0.11 * noise(0.25))),
            ("perf/mfu/actor", fmt_np(0.31 * noise(0.04))),
            ("perf/max_memory_allocated_gb", fmt_np(41.2 + rng.normal(0, 0.4))),
            ("perf/max_memory_reserved_gb", fmt_np(57.8 + rng.normal(0, 0.3))),
            ("perf/cpu_memory_used_gb", fmt_np(118.0 + 0.4 * g)),
            ("actor/lr", fmt_np(1e-06)),
            ("training/global_step", g), ("training/epoch", 0 if g <= 29 else 1),
        ]
        if testing is not None:
            v = val[g // 10]
            kv += [("val-aux/openai/gsm8k/reward/mean@1", v), ("val-aux/openai/gsm8k/score/mean@1", v),
                   ("val-core/openai/gsm8k/acc/mean@1", v)]
        adv_max = 1.7888520956039429
        kv += [
            ("critic/score/mean", score), ("critic/score/max", 1.0), ("critic/score/min", 0.0),
            ("critic/rewards/mean", score), ("critic/rewards/max", 1.0), ("critic/rewards/min", 0.0),
            ("critic/advantages/mean", float(rng.normal(-0.004, 0.003))), ("critic/advantages/max", adv_max),
            ("critic/advantages/min", -adv_max),
            ("critic/returns/mean", float(rng.normal(-0.004, 0.003))), ("critic/returns/max", adv_max),
            ("critic/returns/min", -adv_max),
            ("response_length/mean", float(L.mean())), ("response_length/max", float(L.max())),
            ("response_length/min", float(L.min())), ("response_length/clip_ratio", clip),
            ("prompt_length/mean", float(p.mean())), ("prompt_length/max", float(p.max())),
            ("prompt_length/min", float(p.min())), ("prompt_length/clip_ratio", 0.0),
            ("timing_s/gen", gen_s), ("timing_s/reward", reward), ("timing_s/old_log_prob", old_lp),
            ("timing_s/ref", ref), ("timing_s/adv", adv), ("timing_s/update_actor", upd),
        ]
        if testing is not None:
            kv.append(("timing_s/testing", testing))
        if ckpt is not None:
            kv.append(("timing_s/save_checkpoint", ckpt))
        kv += [("timing_s/step", step),
               ("timing_per_token_ms/gen", gen_s * 1000 / resp_tok), ("timing_per_token_ms/ref", ref * 1000 / T),
               ("timing_per_token_ms/adv", adv * 1000 / T), ("timing_per_token_ms/update_actor", upd * 1000 / T),
               ("perf/total_num_tokens", T), ("perf/time_per_step", step), ("perf/throughput", T / (step * GPUS))]
        body = " - ".join(f"{k}:{v!r}" if isinstance(v, float) else f"{k}:{v}" for k, v in kv)
        lines.append(f"{TAG}step:{g} - {body}")
        if g < STEPS:
            lines.append(f"{TAG}Training Progress:  {int(100 * g / STEPS)}%|          | {g}/{STEPS} "
                         f"[{int(step * g // 60):02d}:{int(step * g) % 60:02d}<?, {step:.2f}s/it]")
    lines.append(f"{TAG}Final validation metrics: {{'val-core/openai/gsm8k/acc/mean@1': {val[-1]!r}}}")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({STEPS} steps)")


if __name__ == "__main__":
    main()
