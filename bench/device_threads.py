"""One core against the run's threads, in a process with a vLLM engine up: does asking for one thread take effect?

vLLM's CPU worker replaces `torch.set_num_threads` with a no-op once it has bound its OpenMP threads; the runner
sets threads through `runner/placement.set_threads` (the builtin in torch._C). One process, P=32, G=8: a real
engine and trainer, then six ABBA pairs of (the run's threads, one core) for a 1x training pass (256 responses),
one micro-batch of it, and an engine visit at 256 sequences, once with `torch.set_num_threads` and once with
`set_threads`. Prints the threads torch reports inside the one-core block and the one-core / run-threads ratio
(median of the pairs). docs/results.md section 6 quotes its output.

    flock /tmp/rlsim-heavy.lock python -m bench.device_threads   # ~2 min on 2 cores
"""
from __future__ import annotations

import os
import statistics as st
from contextlib import contextmanager

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

from bench.calib_rig import rig  # noqa: E402
from rlsim.runner.placement import set_threads  # noqa: E402

PAIRS = 6


@contextmanager
def one_core(setter):
    before, n = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(before)})
    setter(1)
    try:
        yield torch.get_num_threads()
    finally:
        os.sched_setaffinity(0, before)
        setter(n)


def main() -> None:
    cfg, trainer, cal = rig("/tmp/rlsim-device-threads.parquet")
    full = cal.batch(cfg.responses_per_update)
    m = trainer.micro_for(len(full))
    cal.warm(full)

    def train(samples, micro=None):
        cal.train_pass(samples, len(samples), record=False, micro=micro)
        return cal.train_pass(samples, len(samples), record=False, micro=micro)[0]

    kinds = {"1x update (256 responses)": lambda: train(full),
             f"one micro-batch ({m} responses)": lambda: train(full[:m], m),
             "engine step at 256 sequences": lambda: st.median(cal.visit(256, 6, record=False))}
    print(f"\nrun threads {torch.get_num_threads()}; {PAIRS} ABBA pairs each\n")
    print(f"{'setter':24} {'threads in the one-core block':>30} {'kind':32} {'one core / run threads':>22}")
    for name, setter in (("torch.set_num_threads", torch.set_num_threads), ("placement.set_threads", set_threads)):
        for kind, fn in kinds.items():
            ratios, seen = [], set()
            for k in range(PAIRS):
                got = {}
                for one in ((False, True) if k % 2 == 0 else (True, False)):
                    if one:
                        with one_core(setter) as n:
                            seen.add(n)
                            got[one] = fn()
                    else:
                        got[one] = fn()
                ratios.append(got[True] / got[False])
            print(f"{name:24} {','.join(map(str, sorted(seen))):>30} {kind:32} {st.median(ratios):>22.2f}")


if __name__ == "__main__":
    main()
