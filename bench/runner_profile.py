"""Profile `rlrun record` on this machine: engine start, responses/s vs P, step-time split, tracing overhead.

Runs short real GRPO recordings (G=8) in subprocesses and prints one table:

    python -m bench.runner_profile                 # P = 16, 64, 128; 10 updates each; overhead at P=64
    python -m bench.runner_profile --steps 6 --prompts 16,64

Throughput and shares are over the RL steps after the first (the first update carries one-time costs);
wall per step is measured between consecutive step starts, so it includes the per-step trace flush.
The tracing overhead compares the same run with and without per-step (gen_step) recording.
Timing-sensitive: on a shared machine wrap it in `flock /tmp/rlsim-heavy.lock`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from rlsim.replay.io import read_trace  # noqa: E402


def run(out: Path, P: int, steps: int, record_steps: bool = True, seed: int = 0) -> None:
    cmd = [sys.executable, "-m", "rlsim.runner.cli", "record", "--out", str(out), "--prompts", str(P), "--group", "8",
           "--steps", str(steps), "--eval-every", "0", "--eval-prompts", "8", "--eval-k", "1", "--seed", str(seed),
           "--no-progress", "--overwrite"]
    if not record_steps:
        cmd.append("--no-record-steps")
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    if p.returncode != 0:
        sys.exit(f"recording failed ({' '.join(cmd)}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")


def stats(path: Path, skip: int = 1) -> dict[str, float]:
    t = read_trace(path)
    u, s = t.rows("update"), t.rows("sync")
    sl = slice(skip, None)
    step = u["step_time"][sl]
    starts = u["t_start"] - u["gen_time"] - u["reward_time"]
    wall = np.diff(starts)[skip:]  # step start to next step start: includes the trace flush
    resp = u["num_responses"][sl]
    return {
        "engine_start_s": t.meta["engine"]["start_time_s"],
        "step_s": float(np.mean(step)),
        "wall_s": float(np.mean(wall)) if len(wall) else float("nan"),
        "resp_per_s": float(resp.sum() / step.sum()),
        "resp_per_s_wall": float(np.mean(resp[: len(wall)]) / np.mean(wall)) if len(wall) else float("nan"),
        "gen": float(u["gen_time"][sl].sum() / step.sum()),
        "train": float(u["duration"][sl].sum() / step.sum()),
        "sync": float(s["duration"][sl].sum() / step.sum()),
        "gen_steps": t.count("gen_step"),
        "tokens_per_resp": float(u["response_tokens_total"][sl].sum() / resp.sum()),
    }


def writer_cost(n_gen_rows: int, n_resp: int, steps: int = 20) -> float:
    """Seconds per RL step to add and flush one step's rows (direct cost of the trace, no engine)."""
    import time

    from rlsim.replay.io import TraceWriter

    with tempfile.TemporaryDirectory() as d:
        w = TraceWriter(Path(d) / "t.parquet", {"config": {}}).open()
        t0 = time.perf_counter()
        for step in range(steps):
            for i in range(n_gen_rows):
                w.add("gen_step", t_start=0.01 * i, duration=0.01, step=step, policy_version=step, num_running=200,
                      num_waiting=0, prefill_tokens=0, decode_tokens=200, context_tokens=4000, kv_usage=0.1, finished=3)
            for i in range(n_resp):
                w.add("response", t_start=0.1, duration=1.0, step=step, policy_version=step, prompt_id=i, group_index=0,
                      prompt_tokens=7, response_tokens=21, reward=1.0, consumed_step=step, t_queued=0.1,
                      t_first_token=0.2, t_finished=1.1)
            w.flush()
        dt = (time.perf_counter() - t0) / steps
        w.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="16,64,128", help="comma-separated P values (G=8)")
    ap.add_argument("--steps", type=int, default=10, help="updates per run")
    ap.add_argument("--overhead-prompts", type=int, default=64, help="P of the with/without per-step recording pair")
    ap.add_argument("--workdir", default=None, help="keep the traces here (default: a temporary folder)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="rlsim-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for P in [int(x) for x in a.prompts.split(",")]:
        out = work / f"grpo_p{P}.parquet"
        run(out, P, a.steps)
        rows.append((P, stats(out)))
    print(f"{'P':>5} {'B':>6} {'engine start s':>14} {'step s':>7} {'resp/s':>7} {'resp/s wall':>11} "
          f"{'gen %':>6} {'train %':>7} {'sync %':>6} {'tok/resp':>8}")
    for P, r in rows:
        print(f"{P:5d} {8 * P:6d} {r['engine_start_s']:14.1f} {r['step_s']:7.2f} {r['resp_per_s']:7.1f} "
              f"{r['resp_per_s_wall']:11.1f} {100 * r['gen']:6.1f} {100 * r['train']:7.1f} {100 * r['sync']:6.2f} "
              f"{r['tokens_per_resp']:8.1f}")
    P = a.overhead_prompts
    on, off = work / f"trace_on_p{P}.parquet", work / f"trace_off_p{P}.parquet"
    # alternate the order so drift on a shared machine does not favour one side
    run(off, P, a.steps, record_steps=False)
    run(on, P, a.steps, record_steps=True)
    s_on, s_off = stats(on), stats(off)
    print()
    print(f"tracing overhead at P={P}, G=8 ({a.steps} updates, first excluded):")
    print(f"  with gen_step rows:    {s_on['wall_s']:.3f} s per step wall ({s_on['gen_steps']} engine-step rows), "
          f"gen {s_on['step_s'] * s_on['gen']:.3f} s")
    print(f"  without gen_step rows: {s_off['wall_s']:.3f} s per step wall, gen {s_off['step_s'] * s_off['gen']:.3f} s")
    print(f"  overhead: {100 * (s_on['wall_s'] / s_off['wall_s'] - 1):+.1f}% of wall per step "
          "(A/B of two real runs: includes run-to-run noise on a shared machine)")
    n_rows = round(s_on["gen_steps"] / a.steps)
    c_on, c_off = writer_cost(n_rows, 8 * P), writer_cost(0, 8 * P)
    print(f"  direct cost of writing a step's rows: {1e3 * c_off:.2f} ms without, {1e3 * c_on:.2f} ms with "
          f"{n_rows} gen_step rows ({100 * (c_on - c_off) / s_on['wall_s']:.3f}% of a step)")
    print(f"traces in {work}")


if __name__ == "__main__":
    main()
