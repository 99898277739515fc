"""The benchmark harness's own logic: no TRL or engine needed (TRL is the optional `bench` extra)."""
import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rlsim.replay.io import read_trace, write_trace

from bench import runner_vs_trl as rvt

ROOT = Path(__file__).resolve().parents[2]

HAS_TRL = importlib.util.find_spec("trl") is not None


@pytest.mark.skipif(HAS_TRL, reason="TRL installed: the missing-extra path cannot be seen")
@pytest.mark.parametrize("cmd", [["-m", "bench.runner_vs_trl"], ["-m", "bench.trl_grpo"]])
def test_without_trl_one_line_and_exit_2(cmd):
    p = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[cpu,bench]'" in lines[0]


def _synthetic_trace(path, steps=5, B=16):
    rows, t = [], 0.0
    for s in range(steps):
        gen, rew, fwd, bwd, opt, sync, gap = 1.0 + 0.1 * s, 0.05, 0.3, 0.5, 0.02, 0.01, 0.04
        t_u = t + gen + rew
        upd = fwd + bwd + opt + 0.03  # prep and bookkeeping inside the update
        step_time = gen + rew + upd + sync
        rows.append(dict(kind="update", t_start=t_u, duration=upd, step=s, policy_version=s, num_responses=B,
                         num_tokens=B * 28, response_tokens_total=B * 21, lr=3e-4, reward=0.5, t_forward=fwd,
                         t_backward=bwd, t_optimizer=opt, step_time=step_time, gen_time=gen, reward_time=rew,
                         prep_time=0.03))
        rows.append(dict(kind="sync", t_start=t_u + upd, duration=sync, step=s, policy_version=s + 1, bytes=100))
        for i in range(B):
            rows.append(dict(kind="response", t_start=t, duration=gen, step=s, policy_version=s, prompt_id=i // 8,
                             group_index=i % 8, prompt_tokens=7, response_tokens=21, reward=1.0))
        t += step_time + gap  # tracing/flush between steps counts in the wall time
    return read_trace(write_trace(path, {"config": {}}, rows))


def test_rlrun_stats_breakdown(tmp_path):
    st = rvt.rlrun_stats(_synthetic_trace(tmp_path / "t.parquet"), warmup=1)
    # steps 1..4: gen 1.1, 1.2, 1.3, 1.4 -> median 1.25; wall = step_time + 0.04 except the last (step_time)
    assert st["gen_s"] == pytest.approx(1.25)
    assert st["train_s"] == pytest.approx(0.82)
    assert st["sync_s"] == pytest.approx(0.01)
    assert st["other_s"] == pytest.approx(0.05 + 0.03)
    assert st["step_time_s"] == pytest.approx(1.25 + 0.05 + 0.85 + 0.01)
    walls = [1.1 + 0.91 + 0.04, 1.2 + 0.91 + 0.04, 1.3 + 0.91 + 0.04, 1.4 + 0.91]
    assert st["wall_times"][1:] == pytest.approx(walls)
    assert st["resp_per_s"] == pytest.approx(16 / statistics.median(walls))
    assert st["train_tokens"] == 16 * 28 and st["gen_tokens"] == 16 * 28


def test_bound_arithmetic():
    b = rvt.bound_seconds(1_000_000, train_tokens=1000, gen_tokens=3000, gflops=100.0)
    assert b["train_s"] == pytest.approx(6e9 / 1e11)
    assert b["gen_s"] == pytest.approx(6e9 / 1e11)
    assert b["total_s"] == pytest.approx(0.12)


def test_matmul_rate_measures_something():
    pytest.importorskip("torch")
    r = rvt.matmul_rate([(256, 64, 64)], seconds=0.02)
    assert r["gflops"] > 0 and r["best_shape"] == "256x64x64"


def test_middle_half_skips_warmup_and_outliers():
    xs = [9.0, 9.0, 1.0, 5.0, 1.1, 1.2, 1.3, 0.1]
    assert rvt.middle_half(xs, warmup=2) == [2, 4, 5, 6]  # 1.0 .. 1.3: drops the fastest (0.1) and slowest (5.0)
    assert rvt.middle_half([3.0, 1.0], warmup=5) == [0, 1]
