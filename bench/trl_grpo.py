"""TRL's GRPOTrainer on rlrun's task, prompts and reward: the baseline of `bench/runner_vs_trl.py`.

Runs TRL (the optional `bench` extra, `pip install -e '.[cpu,bench]'`) with its default Hugging Face
generation (TRL's vLLM colocate mode does not run on the CPU vLLM build: its weight sync calls the model's
`load_weights` directly) under the clean protocol rlrun records by default:

- P prompts per update, G responses each, ONE optimizer update per batch of P x G responses: the whole
  generation batch is one `steps_per_generation` block of `gradient_accumulation_steps` micro-batches
  (`generation_batch_size = P x G`), and `num_iterations = 1` (no rollout reuse, so TRL skips the old
  log-prob pass);
- temperature 1, no KL (`beta = 0`, no reference model), Adam(W) with weight decay 0 at a constant lr,
  gradient clipping at 1.0, group-std-scaled advantages, token-mean loss (TRL's `dapo` = rlrun's
  `--loss-agg token`);
- the same prompts in the same order as `rlrun record --seed S` (its task's `train_stream(S)`, no shuffling),
  the same reward function (`runner.tasks`), the same max new tokens, fp32 weights (rlrun's dtype on CPU).

Per-update wall time comes from a `TrainerCallback` (time between consecutive `on_step_end`, the first
measured from `on_train_begin`), and the generation-and-scoring part of each update from a wrapper
around `_generate_and_score_completions`. Run as a script it writes a JSON result, so that the bench
can give it a clean process:

    python -m bench.trl_grpo --model DIR --prompts 32 --updates 12 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install -e '.[cpu,bench]'"


def require_trl() -> None:
    """Exit 2 with one line when the optional `bench` extra is missing."""
    try:
        import trl  # noqa: F401
    except ImportError:
        print(f"TRL is not installed (it is the optional `bench` extra): {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(2)


def steady_state(times: list[float], warmup: int) -> float:
    """Median of the per-update times after the first `warmup` updates (all of them if too few)."""
    tail = times[warmup:] if len(times) > warmup else times
    return statistics.median(tail)


def run_trl(model_dir: str, *, task: str = "add2", prompts: int = 32, group: int = 8, updates: int = 12,
            lr: float = 3e-4, max_tokens: int = 48, temperature: float = 1.0, seed: int = 0,
            micro_batches: int = 1, bf16: bool = False, grad_ckpt: bool = False, compile: bool = False,
            warmup: int = 2, log=None) -> dict[str, Any]:
    """Run TRL GRPO for `updates` optimizer updates; return per-update timings and the steady-state rate."""
    require_trl()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlsim.runner.tasks import Example, make_task

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    B = prompts * group
    if B % micro_batches:
        raise SystemExit(f"P x G = {B} is not divisible by --micro-batches {micro_batches}")
    t_task = make_task(task)
    stream = t_task.train_stream(seed)  # the same prompts, in the same order, as `rlrun record --seed`
    exs = [next(stream) for _ in range(prompts * updates)]
    ds = Dataset.from_dict({"prompt": [e.prompt for e in exs], "answer": [e.answer for e in exs]})

    rewards_seen: list[float] = []
    resp_tokens: list[int] = []

    def reward_fn(prompts, completions, answer, completion_ids=None, **_):
        out = [t_task.reward(c, Example(prompt=p, answer=a)) for p, c, a in zip(prompts, completions, answer)]
        rewards_seen.extend(out)
        if completion_ids is not None:
            resp_tokens.extend(len(c) for c in completion_ids)
        return out

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out_dir = tempfile.mkdtemp(prefix="trl-grpo-")
    cfg = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=bf16, fp16=False, gradient_checkpointing=grad_ckpt,
        torch_compile=compile, seed=seed, data_seed=seed, max_steps=updates, learning_rate=lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta2=0.99, max_grad_norm=1.0,
        optim="adamw_torch", per_device_train_batch_size=B // micro_batches, gradient_accumulation_steps=micro_batches,
        steps_per_generation=micro_batches, num_generations=group, num_iterations=1, beta=0.0,
        max_completion_length=max_tokens, temperature=temperature, top_p=1.0, top_k=0,
        scale_rewards="group", loss_type="dapo", shuffle_dataset=False,
        report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False, use_vllm=False,
    )

    gen_times: list[float] = []

    class Trainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_times.append(time.perf_counter() - t0)
            return out

    class Timer(TrainerCallback):
        def __init__(self):
            self.last, self.times = None, []

        def on_train_begin(self, args, state, control, **kw):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now
            i = len(self.times)
            if i == 1 or i % 5 == 0 or i == updates:
                log(f"TRL P={prompts}: update {i}/{updates}: {self.times[-1]:.2f} s "
                    f"({B / self.times[-1]:.0f} resp/s)")

    timer = Timer()
    t0 = time.perf_counter()
    trainer = Trainer(model=model, reward_funcs=[reward_fn], args=cfg, train_dataset=ds, processing_class=tok,
                      callbacks=[timer])
    t_setup = time.perf_counter() - t0
    trainer.train()
    times = timer.times
    step = steady_state(times, warmup)
    gen = steady_state(gen_times, warmup) if gen_times else float("nan")
    n_rew = len(rewards_seen)
    return {
        "tool": "trl", "trl_version": __import__("trl").__version__, "model": str(model_dir), "task": task,
        "prompts": prompts, "group": group, "batch": B, "updates": updates, "warmup": warmup, "lr": lr,
        "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "micro_batches": micro_batches,
        "bf16": bf16, "gradient_checkpointing": grad_ckpt, "torch_compile": compile,
        "torch_threads": torch.get_num_threads(), "setup_s": t_setup,
        "update_times": times, "gen_times": gen_times,
        "step_s": step, "gen_s": gen, "resp_per_s": B / step,
        "prompt_tokens_mean": statistics.fmean(len(tok(e.prompt)["input_ids"]) for e in exs),
        "response_tokens_mean": statistics.fmean(resp_tokens) if resp_tokens else None,
        "mean_reward_first": statistics.fmean(rewards_seen[:B]) if n_rew else None,
        "mean_reward_last": statistics.fmean(rewards_seen[-B:]) if n_rew else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="TRL GRPOTrainer on rlrun's task (baseline for bench/runner_vs_trl.py)")
    ap.add_argument("--model", help="local HF model folder (default: rlrun's cached tiny model for --task)")
    ap.add_argument("--task", default="add2")
    ap.add_argument("--prompts", type=int, default=32, help="P: prompts per update")
    ap.add_argument("--group", type=int, default=8, help="G: responses per prompt")
    ap.add_argument("--updates", type=int, default=12, help="optimizer updates")
    ap.add_argument("--warmup", type=int, default=2, help="updates left out of the steady-state median")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batches", type=int, default=1, help="gradient-accumulation micro-batches per update")
    ap.add_argument("--bf16", action="store_true", help="TRL's bf16 mixed precision (default fp32, as rlrun on CPU)")
    ap.add_argument("--grad-ckpt", action="store_true",
                    help="gradient checkpointing (TRL's default; off by default here: it only costs time on this "
                         "model)")
    ap.add_argument("--trl-defaults", action="store_true",
                    help="TRL's own defaults for precision and memory: bf16 and gradient checkpointing")
    ap.add_argument("--compile", action="store_true", help="TRL's torch_compile=True (TrainingArguments; default off)")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    require_trl()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = a.model
    if model is None:
        from rlsim.runner.model import Recipe, ensure_model

        model = str(ensure_model(Recipe(task=a.task)))
    r = run_trl(model, task=a.task, prompts=a.prompts, group=a.group, updates=a.updates, lr=a.lr,
                max_tokens=a.max_tokens, temperature=a.temperature, seed=a.seed, micro_batches=a.micro_batches,
                bf16=a.bf16 or a.trl_defaults, grad_ckpt=a.grad_ckpt or a.trl_defaults, compile=a.compile,
                warmup=a.warmup)
    print(f"TRL P={r['prompts']} G={r['group']}: {r['resp_per_s']:.0f} resp/s, step {r['step_s']:.2f} s "
          f"(generation+scoring {r['gen_s']:.2f} s), reward {r['mean_reward_first']:.2f} -> "
          f"{r['mean_reward_last']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
