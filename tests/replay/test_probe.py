"""rlsim.replay.probe on synthetic probe traces (known step times -> known sigma and interval), and the simulator's
entry points refusing a probe trace as a run to fit."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t
from typer.testing import CliRunner

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import TraceWriter, read_trace
from rlsim.replay.probe import probe_sigma, refuse_probe

ROOT = Path(__file__).resolve().parents[2]
SIZES, G = (16, 4, 64), 2
# responses/s of each size per round: the machine drifts (the smallest runs 100, 80, 120 resp/s), the ratios to
# the smallest in the same round stay near 1.5 (P=16) and 2.0 (P=64)
RPS = [{4: 100.0, 16: 145.0, 64: 210.0}, {4: 80.0, 16: 124.0, 64: 156.0}, {4: 120.0, 16: 180.0, 64: 240.0}]
ORDER = [[16, 4, 64], [64, 16, 4], [4, 64, 16]]


def write_probe(path, rps=RPS, order=ORDER, *, skip_last: int = 0) -> Path:
    """A probe trace whose step `k` (round k // 3, size order[round][k % 3]) takes B / rps seconds; the last
    `skip_last` steps left out (an interrupted probe)."""
    meta = {"kind": "probe", "seed": 0,
            "config": {"algo": "grpo", "prompts": min(SIZES), "group": G, "batch": min(SIZES) * G,
                       "lr": 3e-4, "lr_rule": "sqrt", "lr_ref_batch": 1024, "task": "add2",
                       "steps": len(order) * len(SIZES)},
            "probe": {"sizes": list(SIZES), "group": G, "rounds": len(order), "order": order}}
    steps = [(r, p) for r, o in enumerate(order) for p in o]
    t = 0.0
    with TraceWriter(path, meta) as w:
        for k, (r, p) in enumerate(steps[:len(steps) - skip_last]):
            B = p * G
            dt = B / rps[r][p]
            w.add("update", t_start=t + 0.6 * dt, duration=0.3 * dt, step=k, policy_version=k, num_responses=B,
                  num_tokens=B * 20, lr=3e-4, step_time=dt, gen_time=0.6 * dt)
            w.add("sync", t_start=t + 0.9 * dt, duration=0.1 * dt, step=k, policy_version=k + 1, bytes=1000)
            w.flush()
            t += dt
    return Path(path)


def _expected(p: int, rounds=range(3)) -> tuple[float, float, float]:
    x = np.log([RPS[r][p] / RPS[r][4] for r in rounds])
    half = student_t.ppf(0.95, len(x) - 1) * np.std(x, ddof=1) / math.sqrt(len(x))
    return math.exp(x.mean()), math.exp(x.mean() - half), math.exp(x.mean() + half)


def test_sigma_is_paired_within_rounds(tmp_path):
    ps = probe_sigma(write_probe(tmp_path / "probe.parquet"))
    assert [r.prompts for r in ps.rows] == [4, 16, 64] and ps.rounds == 3 and ps.level == 0.9
    ref, mid, big = ps.rows
    assert (ref.sigma, ref.sigma_lo, ref.sigma_hi, ref.rounds) == (1.0, 1.0, 1.0, 3)
    assert ref.per_round == (100.0, 80.0, 120.0) and ref.responses_per_s == 100.0 and ref.responses == 8
    for row, p in ((mid, 16), (big, 64)):
        s, lo, hi = _expected(p)
        assert (row.sigma, row.sigma_lo, row.sigma_hi) == pytest.approx((s, lo, hi), rel=1e-9)
        assert row.group == G and row.responses == p * G and row.rounds == 3
        assert row.responses_per_s == pytest.approx(float(np.median([RPS[r][p] for r in range(3)])))
        assert row.sigma_per_round == pytest.approx([RPS[r][p] / RPS[r][4] for r in range(3)])
    assert mid.sigma == pytest.approx((1.45 * 1.55 * 1.5) ** (1 / 3))
    # unpaired, the drift of the smallest (80..120) would swamp the gain; paired, the interval is narrow
    assert 1.4 < mid.sigma_lo < mid.sigma < mid.sigma_hi < 1.65
    assert "90 % t interval on the log ratios over 3 rounds" in ps.interval
    assert ps.row(64) is big
    with pytest.raises(RlsimError, match="did not probe P=32"):
        ps.row(32)


def test_one_round_has_no_interval(tmp_path):
    ps = probe_sigma(write_probe(tmp_path / "probe.parquet", order=ORDER[:1]))
    assert ps.rounds == 1 and "no interval" in ps.interval
    for row in ps.rows:
        assert row.rounds == 1 and math.isnan(row.sigma_lo) and math.isnan(row.sigma_hi)
        assert row.sigma == pytest.approx(RPS[0][row.prompts] / RPS[0][4])


def test_an_interrupted_probe_pairs_what_it_measured(tmp_path):
    ps = probe_sigma(write_probe(tmp_path / "probe.parquet", skip_last=1))  # round 3 lacks P=16
    assert ps.row(16).rounds == 2 and math.isnan(ps.row(16).per_round[2])
    assert ps.row(16).sigma == pytest.approx(_expected(16, range(2))[0])
    assert ps.row(64).rounds == 3 and ps.row(64).sigma == pytest.approx(_expected(64)[0])


def test_the_first_step_of_each_visit_is_not_counted(tmp_path):
    """visit_steps 2: each visit's first step (the switch from the previous size) runs at a third of the speed and
    is left out; sigma comes from the second steps alone."""
    meta = {"kind": "probe", "seed": 0, "config": {"algo": "grpo", "prompts": 4, "group": G, "batch": 4 * G},
            "probe": {"sizes": [4, 16], "group": G, "rounds": 2, "visit_steps": 2, "order": [[16, 4], [4, 16]]}}
    rps = {4: 100.0, 16: 150.0}
    with TraceWriter(tmp_path / "v.parquet", meta) as w:
        k = 0
        for order in meta["probe"]["order"]:
            for p in order:
                for first in (True, False):
                    B = p * G
                    dt = B / (rps[p] / (3.0 if first else 1.0))
                    w.add("update", t_start=float(k), duration=0.1, step=k, policy_version=k, num_responses=B,
                          num_tokens=B * 20, lr=3e-4, step_time=dt)
                    w.flush()
                    k += 1
    ps = probe_sigma(tmp_path / "v.parquet")
    assert ps.rounds == 2 and ps.row(16).sigma == pytest.approx(1.5) and ps.row(4).per_round == (100.0, 100.0)


def test_a_recording_is_not_a_probe():
    with pytest.raises(RlsimError, match="is not an `rlrun probe` trace"):
        probe_sigma(ROOT / "traces" / "grpo_p32.parquet")
    t = read_trace(ROOT / "traces" / "grpo_p32.parquet")
    assert refuse_probe(t) is t


def _one_line_exit_2(res, path):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.stderr
    assert lines[0] == (f"error: {path} is an `rlrun probe` trace (paired throughput at P=4,16,64), not a run to "
                        f"extrapolate from: read its measured sigma with `rlrun inspect {path}`")


@pytest.mark.parametrize("args", [
    ["run", "--trace", "{p}", "--batch", "64"],
    ["run", "{p}", "--batch", "64"],
    ["run", "-t", "{ref}", "-t", "{p}", "--batch", "64"],  # not as a learning curve either
    ["sweep", "--trace", "{p}", "--batch", "64,128", "--out", "{tmp}/sweep"],
    ["plan", "{p}", "--batch", "8,16,32"],
    ["replay", "{p}"],
    ["export", "perfetto", "--simulate", "--trace", "{p}", "-o", "{tmp}/x.json"],
])
def test_the_simulator_refuses_a_probe_trace(args, tmp_path):
    from rlsim.cli import app

    p = write_probe(tmp_path / "probe.parquet")
    ref = ROOT / "traces" / "grpo_p32.parquet"
    res = CliRunner().invoke(app, [a.format(p=p, ref=ref, tmp=tmp_path) for a in args])
    _one_line_exit_2(res, p)


def test_the_api_refuses_a_probe_trace(tmp_path):
    import rlsim

    p = write_probe(tmp_path / "probe.parquet")
    for call in (lambda: rlsim.predict(str(p), prompts=64), lambda: rlsim.fit([rlsim.load_trace(p)]),
                 lambda: rlsim.sweep(p, {"prompts": [64]}), lambda: rlsim.check_fidelity(p)):
        with pytest.raises(RlsimError, match=r"is an `rlrun probe` trace \(paired throughput at P=4,16,64\)") as e:
            call()
        assert "\n" not in str(e.value) and "rlrun inspect" in str(e.value)
    assert len(rlsim.steps(p)) == 9  # reading it is fine: only fitting it as a run is refused
