"""Per-process speed on this machine: the same engine visit, one thread, in several fresh processes.

Each child process pins itself to one core with one thread (as a split's engine replica does), starts the default
model's vLLM engine, warms it and times six visits of 256 sequences (12 decode steps each, `ignore_eos`); it prints
the median step of each visit. The parent runs the children one after another, alternating cores 0 and 1, and
prints each process's median and the range of its visits. The spread between processes is what one recording
cannot see: docs/results.md section 6 quotes it as the floor of a split's prediction.

    flock /tmp/rlsim-heavy.lock python -m bench.process_speed [--processes 6]   # ~3 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys

N, VISITS = 256, 6


def child(core: int) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    os.sched_setaffinity(0, {core})
    import torch  # function-level, as the two imports below: the child pins itself before torch and vLLM start

    torch.set_num_threads(1)
    from rlsim.runner.engine import Engine
    from rlsim.runner.model import ensure_model

    eng = Engine(str(ensure_model()), max_num_seqs=1024, max_model_len=128, kv_cache_gib=1.0, dtype="float32")
    prompts = [[1, 5 + i % 9, 14, 6 + i % 7, 15] for i in range(64)]

    def visit() -> float:
        durs: list[tuple[int, float]] = []
        eng.generate([(None, prompts[j % 64], 8) for j in range(N // 8)], eng.sampling(12, 1.0, ignore_eos=True),
                     lambda s: durs.append((s.num_running, s.duration)))
        return st.median(d for n, d in durs[1:] if n == N)

    for _ in range(3):
        visit()
    print(json.dumps([1e3 * visit() for _ in range(VISITS)]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=6, help="fresh processes, alternating cores 0 and 1")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        child(a.child)
        return 0
    print(f"engine step at {N} sequences, one thread, {VISITS} visits per fresh process (ms)")
    medians = []
    for i in range(a.processes):
        core = i % 2
        out = subprocess.run([sys.executable, "-m", "bench.process_speed", "--child", str(core)], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        v = json.loads(out)
        medians.append(st.median(v))
        print(f"process {i + 1} (core {core}): median {st.median(v):.1f}, visits {min(v):.1f}..{max(v):.1f}")
    print(f"between processes: medians {min(medians):.1f}..{max(medians):.1f} ms ({max(medians) / min(medians):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
