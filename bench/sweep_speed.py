"""Sweep speed: one config on one core, a ~1,000-config sweep on the local process pool, the same sweep as Ray
tasks on a local Ray instance (results must be identical), and the `rlsim sweep` CLI end to end.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.sweep_speed [--trace traces/grpo_p128.parquet]

Targets (issue 4): one config (100 updates, P=1024, G=8) <= 0.5 s on one core; 1,000 configs <= 5 min on
this 2-core machine; Ray on a local cluster within 20% of the local pool. Without --trace it uses
traces/grpo_p128.parquet when present, else a synthetic trace of the same shape (P=128, G=8,
max_num_seqs=256). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsim.replay.io import read_trace
from rlsim.sweeps import backends
from rlsim.core import grid as grids
from rlsim.core.config import WhatIf
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

ROOT = Path(__file__).resolve().parents[1]

# the example grid; seeds repeat it up to the asked size
BATCHES = [64, 128, 256, 512, 1024, 2048, 4096]
GROUPS = [4, 8, 16]
LR_RULES = ["sqrt", "fixed"]


def grid_axes(n: int, updates: int) -> dict[str, list]:
    per_seed = len(BATCHES) * len(GROUPS) * len(LR_RULES)
    seeds = list(range(max(1, -(-n // per_seed))))
    return {"prompts": BATCHES, "group": GROUPS, "lr_rule": LR_RULES, "seed": seeds, "updates": [updates]}


def default_trace(tmp: Path) -> Path:
    real = ROOT / "traces" / "grpo_p128.parquet"
    if real.exists():
        return real
    from tests.sim.study_synth import make_trace

    return make_trace(tmp / "synthetic_p128.parquet", prompts=128, group=8, updates=10, max_num_seqs=256,
                      kv_cache_tokens=65536)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--configs", type=int, default=1000, help="grid size (the example grid times seeds, rounded up)")
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--workers", type=int, default=backends.default_workers())
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rlsim-bench-"))
    trace_path = args.trace or default_trace(tmp)
    traces = [read_trace(trace_path)]
    t0 = time.perf_counter()
    study = prepare(traces)
    t_prepare = time.perf_counter() - t0
    rows: list[tuple[str, str, str, str]] = []
    rows.append(("prepare (fit + reference simulation)", "1", f"{t_prepare:.2f} s", "-"))

    one = WhatIf(prompts=1024, group=8, updates=100)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        evaluate(study, one)
        times.append(time.perf_counter() - t0)
    t_one = statistics.median(times)
    rows.append(("one config P=1024 G=8, 100 updates (median of 3)", "1", f"{t_one:.3f} s", "<= 0.5 s"))

    axes = grid_axes(args.configs, args.updates)
    grid = grids.build_grid(WhatIf, axes)
    n = len(grid)
    t0 = time.perf_counter()
    study = prepare(traces)
    rows.append(("fit the study", "-", f"{time.perf_counter() - t0:.2f} s", "-"))

    t0 = time.perf_counter()
    local = backends.run_sweep(study, grid, workers=args.workers)
    t_local = time.perf_counter() - t0
    rows.append((f"sweep, local process pool ({args.workers} workers)", str(n), f"{t_local:.1f} s",
                 "<= 300 s"))

    if not args.no_ray:
        try:
            import ray
        except ImportError:
            rows.append(("sweep, Ray", str(n), "ray not installed (pip install 'rlsim[ray]')", "-"))
        else:
            t0 = time.perf_counter()
            ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
            t_init = time.perf_counter() - t0
            t0 = time.perf_counter()
            remote = backends.run_sweep(study, grid, ray_address="local")
            t_ray = time.perf_counter() - t0
            ray.shutdown()
            same = backends.same_rows(remote, local)
            if not same:
                for i, (a, b) in enumerate(zip(local, remote)):
                    diff = [k for k in a if not backends.same_rows([{k: a[k]}], [{k: b.get(k)}])]
                    if diff:
                        print(f"config {i} differs in {diff}: local {[a[k] for k in diff]} ray "
                              f"{[b.get(k) for k in diff]}")
                        break
            rows.append((f"sweep, Ray local instance ({args.workers} CPUs), excluding start-up", str(n),
                         f"{t_ray:.1f} s",
                         f"<= {1.2 * t_local:.1f} s (local + 20%): {'ok' if t_ray <= 1.2 * t_local else 'MISSED'}; "
                         f"identical results: {same}"))
            rows.append(("Ray start-up (ray.init)", "-", f"{t_init:.1f} s", "-"))

    if not args.no_cli:
        out = tmp / "cli_sweep"
        cmd = [str(Path(sys.executable).parent / "rlsim"), "sweep", "--trace", str(trace_path),
               *itertools.chain.from_iterable((sw_opt, ",".join(map(str, vals))) for sw_opt, vals in
                                              (("--batch", axes["prompts"]), ("--group", axes["group"]),
                                               ("--lr-rule", axes["lr_rule"]), ("--seed", axes["seed"]),
                                               ("--updates", axes["updates"]))),
               "--out", str(out), "--workers", str(args.workers)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "120"})
        t_cli = time.perf_counter() - t0
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
        rows.append(("`rlsim sweep` CLI end to end (load, fit, sweep, files, 5 charts)", str(n), f"{t_cli:.1f} s",
                     f"<= 300 s ({status})"))

    print(f"trace: {trace_path}  grid: {n} configs ({len(BATCHES)} batches x {len(GROUPS)} groups x {len(LR_RULES)} lr "
          f"rules x {len(axes['seed'])} seeds, {args.updates} updates each)  cores: {os.cpu_count()}")
    print()
    print("| benchmark | configs | time | target |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
