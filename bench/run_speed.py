"""How fast `rlsim run` is: end to end (process start, load, fit, simulate) and one config alone.

    flock /tmp/rlsim-heavy.lock .venv/bin/python bench/run_speed.py [TRACE]

TRACE defaults to traces/grpo_p128.parquet, else a synthetic P=128, G=8 trace. Targets: end to end
at P=2048, G=8, 100 updates < 5 s; one config (P=1024, G=8, 100 updates) <= 0.5 s on one core.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def trace_path(argv: list[str]) -> Path:
    if len(argv) > 1:
        return Path(argv[1])
    default = ROOT / "traces" / "grpo_p128.parquet"
    if default.exists():
        return default
    from rlsim.replay.synthetic import SynthSpec, synthetic_trace

    out = Path(tempfile.mkdtemp()) / "synthetic_p128.parquet"
    return synthetic_trace(out, SynthSpec(prompts=128, group=8, steps=4, max_num_seqs=256, max_tokens=48, min_tokens=8))


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    trace = trace_path(sys.argv)
    rlsim = Path(sys.executable).with_name("rlsim")
    rows = []
    e2e = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([str(rlsim), "run", "--trace", str(trace), "--batch", "2048", "--group", "8", "--json"],
                       check=True, capture_output=True)
        e2e.append(time.perf_counter() - t0)
    rows.append(("rlsim run end to end, P=2048 G=8, 100 updates", min(e2e), statistics.median(e2e), 5.0))

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from rlsim.replay.io import read_trace
    from rlsim.config import WhatIf
    from rlsim.whatif import evaluate, prepare

    t0 = time.perf_counter()
    study = prepare([read_trace(trace)])
    t_prep = time.perf_counter() - t0
    rows.append(("load + fit + reference simulation (one core)", t_prep, t_prep, None))
    for P in (1024, 2048, 4096):
        ts = []
        for seed in range(5):
            t0 = time.perf_counter()
            evaluate(study, WhatIf(prompts=P, group=8, updates=100, seed=seed))
            ts.append(time.perf_counter() - t0)
        rows.append((f"one config P={P} G=8, 100 updates (one core)", min(ts), statistics.median(ts), 0.5 if P == 1024 else None))

    tab = Table(title=f"rlsim run speed ({trace.name})")
    for c in ("what", "best s", "median s", "target s", "ok"):
        tab.add_column(c, justify="left" if c == "what" else "right")
    for what, best, med, target in rows:
        tab.add_row(what, f"{best:.3f}", f"{med:.3f}", "-" if target is None else f"{target:g}",
                    "-" if target is None else ("yes" if med <= target else "NO"))
    Console(width=120).print(tab)


if __name__ == "__main__":
    main()
