"""The shipped traces (traces/*.parquet): `rlsim run` works on each, and `replay` stays close.

Replay, with recorded lengths: the run's mean step time, generation time and responses/s within 3 % (what a
time prediction needs), and the per-update median step-time error within 3 points of the trace's floor (the
best constant predictor: traces recorded on a shared 2-core machine carry run-to-run noise that no model can
predict; bench/replay_fidelity.py prints both, against 2 points)."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.replay.io import read_trace
from rlsim.cli import app
from rlsim.whatif.fidelity import noise_floor, replay_trace

TRACES = sorted((Path(__file__).resolve().parents[2] / "traces").glob("*.parquet"))


@pytest.mark.skipif(not TRACES, reason="no shipped traces")
@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_shipped_trace_runs_and_replays(path):
    r = CliRunner().invoke(app, ["run", "--trace", str(path), "--batch", "512", "--updates", "20", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["responses_per_s"] > 0 and d["reference"]["sigma"] == 1.0 and d["rho"] >= 1.0
    # calibrated: training interpolated over its levels, the engine by the form that cross-validates best
    v = d["fit_validation"]
    assert (v["train_form"] in ("interp", "") and v["gen_form"] in ("linear", "knee", "interp")
            and v["gen_cv"] <= v["gen_cv_linear"])
    res = replay_trace(read_trace(path))
    e = res.errors()
    for k in ("step_time", "gen_time", "responses_per_s"):
        assert e[k]["mean_error"] <= 0.03, k
    assert e["step_time"]["median"] <= noise_floor(res.recorded["step_time"]) + 0.03


def test_noise_floor_hand_cases():
    assert noise_floor([1.0, 1.0, 1.0, 2.0]) == pytest.approx(0.0)  # a constant at 1 s is exact on three of four
    # two times 1 s and 2 s: a constant c in between errs (c - 1) / 1 and (2 - c) / 2, median c / 4, least at c = 1
    assert noise_floor([1.0, 2.0]) == pytest.approx(0.25)
