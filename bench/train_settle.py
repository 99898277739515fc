"""How much settling does a training level's visit need? Paired in one process, with a vLLM engine up.

A calibration visit of a training level follows a pass at another size, and the first pass after a size change
runs slower than the next (docs/results.md section 6). Each visit here: a settle of one kind, then the recorded pass,
then a reference pass at the same size (steady state, the run's update cost at that size). Settle kinds: none, one
micro-batch of the level (a quarter of the pass at the default micro-batch rule), a full pass. Levels 1/8x, 1x and 4x
of P=32, G=8; (level, kind) visits in a shuffled order, round after round. Prints, per level and kind, the median of
recorded / reference over the visits (1.00: the recorded pass is what the run's update costs) and its spread.

    flock /tmp/rlsim-heavy.lock python -m bench.train_settle   # ~4 min on 2 cores
"""
from __future__ import annotations

import argparse
import os
import random
import statistics as st

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from bench.calib_rig import rig  # noqa: E402

FACTORS = (0.125, 1.0, 4.0)
KINDS = ("none", "micro", "full")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds over every (level, settle kind)")
    args = ap.parse_args()
    cfg, trainer, cal = rig("/tmp/rlsim-train-settle.parquet")
    G = cfg.G
    batches = {f: cal.batch(max(G, int(round(f * cfg.responses_per_update / G)) * G)) for f in FACTORS}
    cal.warm(batches[1.0])
    rng = random.Random(1)
    ratios: dict[tuple[float, str], list[float]] = {}
    for _ in range(args.rounds):
        visits = [(f, k) for f in FACTORS for k in KINDS]
        rng.shuffle(visits)
        for f, kind in visits:
            b = batches[f]
            if kind == "micro":
                m = trainer.micro_for(len(b))
                cal.train_pass(b[:m], 0, record=False, micro=m)
            elif kind == "full":
                cal.train_pass(b, 0, record=False)
            rec = cal.train_pass(b, 0, record=False)[0]
            ref = cal.train_pass(b, 0, record=False)[0]
            ratios.setdefault((f, kind), []).append(rec / ref)
    print(f"{'level':>6} {'settle':>6} {'n':>3} {'recorded/reference median':>26} {'quartiles':>14}")
    for (f, kind), v in sorted(ratios.items()):
        q = st.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
        print(f"{f:>5}x {kind:>6} {len(v):>3} {st.median(v):>26.3f} {q[0]:>6.3f}..{q[2]:.3f}")


if __name__ == "__main__":
    main()
