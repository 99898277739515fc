"""rlrun's training step, eager against `--compile` (torch.compile, inductor), on the same batches.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.train_step [--prompts 128] [--group 8] [--updates 8]
    ... bench/train_step.py --variants eager:96,eager:128,eager:256     # packed row length
    ... bench/train_step.py --variants compile:128,compile:128:noshare  # a group's prompt once, or per sample

Trainers on copies of the same tiny policy (by default: eager and compiled, both on 128-token rows;
each warmed up as `rlrun record` does, outside the timing) take turns on the same synthetic GRPO batches (the task's
prompt and response length range, random tokens and advantages), so machine drift hits both alike. Prints per-update
seconds (median, with forward and backward), the speed-up, and how far the two sets of weights are
apart after all updates (same math: only float summation order differs).
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=128, help="P: prompts per update")
    ap.add_argument("--group", type=int, default=8, help="G: responses per prompt")
    ap.add_argument("--updates", type=int, default=8, help="timed updates per trainer")
    ap.add_argument("--variants", default="eager:128,compile:128",
                    help="comma-separated MODE:ROW_TOKENS[:noshare] trainers, MODE eager or compile; noshare: "
                         "every sample lays out its own prompt (default eager:128,compile:128)")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from rlsim.runner.algo import Sample, Trainer
    from rlsim.runner.config import RunConfig
    from rlsim.runner.model import Recipe, ensure_model

    model_dir = ensure_model(Recipe.for_task("add2"), log=lambda m: None)
    policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rng = random.Random(0)

    def batch() -> list[Sample]:
        out = []
        for p in range(a.prompts):
            prompt = [1] + [rng.randrange(4, 18) for _ in range(6)]  # "<s>ab+cd=" is 7 tokens
            for g in range(a.group):  # add2 responses: 17-23 tokens
                out.append(Sample(prompt, [rng.randrange(4, 19) for _ in range(rng.randrange(17, 24))], 0.0, p, g,
                                  rng.gauss(0, 1)))
        return out

    trainers = {}
    for name in a.variants.split(","):
        mode, rows, *share = name.split(":")
        cfg = RunConfig(prompts=a.prompts, group=a.group, compile=mode == "compile")
        tr = Trainer(copy.deepcopy(policy), cfg, 0, "cpu")
        tr.row_tokens, tr.share_prompts = int(rows), share != ["noshare"]
        warm = tr.warmup(batch())
        trainers[name] = tr
        print(f"{name}: warm-up {warm:.1f} s (micro-batch {cfg.micro} responses, {cfg.responses_per_update} per "
              "update)")
    times = {k: [] for k in trainers}
    parts = {k: [] for k in trainers}
    for _ in range(a.updates):
        b = batch()
        for name, tr in trainers.items():
            t0 = time.perf_counter()
            st = tr.update(b, 1e-4)
            times[name].append(time.perf_counter() - t0)
            parts[name].append((st.t_forward, st.t_backward, st.num_tokens))
    print(f"\n{'trainer':<20} {'update s':>9} {'forward s':>10} {'backward s':>11} {'tokens/s':>9}")
    for name in trainers:
        med = statistics.median(times[name])
        fwd = statistics.median(p[0] for p in parts[name])
        bwd = statistics.median(p[1] for p in parts[name])
        tok = statistics.median(p[2] for p in parts[name])
        print(f"{name:<20} {med:9.3f} {fwd:10.3f} {bwd:11.3f} {tok / med:9.0f}")
    base, *others = trainers
    for name in others:
        diff = max(float((p - q).detach().abs().max()) for p, q in zip(trainers[base].policy.parameters(),
                                                                         trainers[name].policy.parameters()))
        print(f"{name} / {base} update time: {statistics.median(times[name]) / statistics.median(times[base]):.2f} "
              f"({a.updates} alternating updates each); max |weight difference| after them: {diff:.1e}")


if __name__ == "__main__":
    main()
