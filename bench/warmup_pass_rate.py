"""The held-out pass rate of the default model after N warm-up steps, for choosing a task's `SFT_STEPS`
(runner/model.py: about 10-50 % at temperature 1, so RL has signal).

    python -m bench.warmup_pass_rate --task add4 --steps 300,400,500 [--prompts 256]

Each length is a fresh warm-up from the recipe's seed (as `ensure_model` builds it), then one sample per
held-out prompt at temperature 1 with HF generation (no vLLM: the engine is not what is measured), scored by the
task's reward. Prints one row per length.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from rlsim.replay.errors import RlsimError
from rlsim.runner.model import Recipe, build_model, make_tokenizer, warm_up
from rlsim.runner.tasks import BUILTIN_TASKS, ArithmeticTask


def pass_rate(task: str, steps: int, prompts: int, max_tokens: int = 48) -> tuple[float, float]:
    """(pass rate over `prompts` held-out prompts at temperature 1, final warm-up loss) after `steps` warm-up steps."""
    import torch  # (why here: the engine extra; `--help` and bad input answer without it)

    recipe = replace(Recipe.for_task(task), sft_steps=steps)
    tok = make_tokenizer()
    model = build_model(recipe, len(tok), {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id})
    info = warm_up(model, tok, recipe)
    t = ArithmeticTask(task)
    exs = t.eval_set(prompts)
    torch.manual_seed(0)
    hits = 0
    with torch.no_grad():
        for i in range(0, len(exs), 64):
            batch = exs[i:i + 64]
            tok.padding_side = "left"
            enc = tok([e.prompt for e in batch], return_tensors="pt", padding=True)
            out = model.generate(**enc, do_sample=True, temperature=1.0, max_new_tokens=max_tokens,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            hits += sum(t.reward(x, e) for x, e in zip(texts, batch))
    return hits / len(exs), info["sft_final_loss"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, help="built-in task (runner/tasks.py)")
    ap.add_argument("--steps", default="200,300,400", help="warm-up lengths, comma list")
    ap.add_argument("--prompts", type=int, default=256, help="held-out prompts, one sample each")
    a = ap.parse_args(argv)
    if a.task not in BUILTIN_TASKS:
        raise SystemExit(f"error: --task {a.task!r} is not a built-in task; choose one of {', '.join(BUILTIN_TASKS)}")
    try:
        lengths = [int(x) for x in a.steps.split(",")]
    except ValueError:
        raise SystemExit(f"error: --steps takes warm-up lengths as a comma list of integers, e.g. 200,300, got "
                         f"{a.steps!r}") from None
    if min(lengths) < 1 or a.prompts < 1:
        raise SystemExit("error: --steps and --prompts must be positive")
    print(f"{'warm-up steps':>13} {'pass rate':>9} {'final loss':>10}")
    for n in lengths:
        try:
            rate, loss = pass_rate(a.task, n, a.prompts)
        except (ImportError, RlsimError) as e:
            raise SystemExit(f"error: {e}") from None
        print(f"{n:>13} {rate:>9.1%} {loss:>10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
