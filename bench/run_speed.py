"""How fast `rlsim run` is: end to end (process start, load, fit, simulate) and one config alone.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.run_speed [TRACE]

TRACE defaults to traces/grpo_p128.parquet, else a synthetic P=128, G=8 trace. Targets: end to end
at P=2048, G=8, 100 updates < 5 s; at P=65536 (B = 524288 responses per update), G=8, 100 updates
< 3 s and < 1 GB peak resident memory; P=10,000,000 is refused in one line (exit 2) in < 3 s; one
config (P=1024, G=8, 100 updates) <= 0.5 s on one core. End-to-end rows run in a child process whose
peak RSS is read with getrusage(RUSAGE_CHILDREN) by a fresh wrapper process per run. P=128 is the
floor (import, load, fit, reference simulation).
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
    # (prompts, runs, target seconds, target peak RSS MB, expected exit code)
    for P, runs, target, rss_target, rc in ((128, 3, None, None, 0), (2048, 3, 5.0, None, 0), (8192, 3, None, None, 0),
                                            (65536, 3, 3.0, 1024, 0), (10_000_000, 1, 3.0, None, 2)):
        ts, rss = [], []
        for _ in range(runs):
            t, m = _child([str(rlsim), "run", "--trace", str(trace), "--batch", str(P), "--group", "8", "--json"], rc)
            ts.append(t)
            rss.append(m)
        what = f"rlsim run end to end, P={P} G=8, 100 updates" + (" (refused, exit 2)" if rc else "")
        rows.append((what, min(ts), statistics.median(ts), target, max(rss), rss_target))

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from rlsim.replay.io import read_trace
    from rlsim.core.config import WhatIf
    from rlsim.whatif.predict import evaluate
    from rlsim.whatif.study import prepare

    t0 = time.perf_counter()
    study = prepare([read_trace(trace)])
    t_prep = time.perf_counter() - t0
    rows.append(("load + fit + reference simulation (one core)", t_prep, t_prep, None, None, None))
    for P in (1024, 2048, 4096, 8192, 65536):  # the simulation alone (P=8192, 65536: round by round)
        ts = []
        for seed in range(5):
            t0 = time.perf_counter()
            evaluate(study, WhatIf(prompts=P, group=8, updates=100, seed=seed))
            ts.append(time.perf_counter() - t0)
        rows.append((f"one config P={P} G=8, 100 updates (one core)", min(ts), statistics.median(ts),
                     0.5 if P == 1024 else None, None, None))

    tab = Table(title=f"rlsim run speed ({trace.name})")
    for c in ("what", "best s", "median s", "target s", "peak RSS MB", "target MB", "ok"):
        tab.add_column(c, justify="left" if c == "what" else "right")
    for what, best, med, target, rss, rss_target in rows:
        ok = [med <= target] if target is not None else []
        ok += [rss <= rss_target] if rss_target is not None else []
        tab.add_row(what, f"{best:.3f}", f"{med:.3f}", "-" if target is None else f"< {target:g}",
                    "-" if rss is None else f"{rss:.0f}", "-" if rss_target is None else f"< {rss_target:g}",
                    "-" if not ok else ("yes" if all(ok) else "NO"))
    Console(width=140).print(tab)


def _child(argv: list[str], rc: int) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one run of argv, in a fresh wrapper so RUSAGE_CHILDREN is its own."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "p = subprocess.run(sys.argv[2:], capture_output=True, text=True)\n"
            "t = time.perf_counter() - t\n"
            "if p.returncode != int(sys.argv[1]) or (p.returncode and len(p.stderr.strip().splitlines()) != 1):\n"
            "    sys.exit(f'exit {p.returncode}: {p.stderr.strip()[-500:]}')\n"
            "print(t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(rc), *argv], check=True, capture_output=True,
                         text=True).stdout
    t, rss = out.split()
    return float(t), float(rss)


if __name__ == "__main__":
    main()
