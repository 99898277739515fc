"""Where a vLLM generation step goes on this machine: cProfile of one GRPO batch on rlrun's engine.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.engine_profile [--prompts 32,128] [--group 8]

For each P: one warm-up generation, then one timed generation and one under cProfile (G samples per
prompt, rlrun's engine settings). Prints wall seconds, engine steps, ms per step, and the share of the
profiled time in vLLM's scheduler, its output handling, request intake and the model forward. The
last line fits ms per step against running sequences across the P values: the per-sequence cost of a
step is per-request work (mostly Python), the intercept the fixed cost of a step.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (label, (file suffix, function name)) of the cumulative times reported; they do not nest in each other
PARTS = (
    ("scheduler (schedule, KV blocks)", ("v1/core/sched/scheduler.py", "schedule")),
    ("scheduler update_from_output", ("v1/core/sched/scheduler.py", "update_from_output")),
    ("output processor", ("v1/engine/output_processor.py", "process_outputs")),
    ("request intake (add_request)", ("v1/engine/llm_engine.py", "add_request")),
    ("model forward", ("v1/worker/gpu_model_runner.py", "_model_forward")),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="32,128", help="comma-separated P values")
    ap.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    a = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import numpy as np
    from transformers import AutoTokenizer

    from rlsim.runner.config import RunConfig
    from rlsim.runner.engine import Engine
    from rlsim.runner.model import Recipe, ensure_model
    from rlsim.runner.tasks import make_task

    cfg = RunConfig()
    model_dir = ensure_model(Recipe.for_task(cfg.task), log=lambda m: None)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    eng = Engine(str(model_dir), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                 kv_cache_gib=cfg.kv_cache_gib)
    sampling = eng.sampling(cfg.max_tokens, cfg.temperature)
    stream = make_task(cfg.task, None, cfg.reward).train_stream(0)

    def batch(P):
        return [(j, list(tok(next(stream).prompt)["input_ids"]), a.group) for j in range(P)]

    print(f"engine: vLLM {eng.version}, max_num_seqs {eng.max_num_seqs}, G={a.group}, task {cfg.task}")
    fit_x, fit_y = [], []
    for P in [int(x) for x in a.prompts.split(",")]:
        eng.generate(batch(P), sampling)  # warm-up at this size
        steps = []
        t0 = time.perf_counter()
        eng.generate(batch(P), sampling, steps.append)
        wall = time.perf_counter() - t0
        full = [s.duration for s in steps if s.num_running == P * a.group and s.prefill_tokens == 0]
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        eng.generate(batch(P), sampling)
        prof.disable()
        pwall = time.perf_counter() - t0
        stats = pstats.Stats(prof).stats
        print(f"\nP={P}: {P * a.group} samples, {wall:.2f} s, {len(steps)} engine steps, {1e3 * wall / len(steps):.1f} "
              f"ms/step (full-batch decode steps: median {1e3 * np.median(full):.1f} ms); under cProfile {pwall:.2f} s")
        for label, (suffix, fn) in PARTS:
            cum = sum(v[3] for (f, _, name), v in stats.items() if f.endswith(suffix) and name == fn)
            print(f"  {label:34s} {cum:6.2f} s  {100 * cum / pwall:5.1f} %")
        if full:
            fit_x.append(P * a.group)
            fit_y.append(float(np.median(full)))
    if len(fit_x) >= 2:
        slope, icpt = np.polyfit(fit_x, fit_y, 1)
        print(f"\nfull-batch decode step = {1e3 * icpt:.1f} ms + {1e6 * slope:.0f} us x running sequences")


if __name__ == "__main__":
    main()
