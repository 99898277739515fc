"""The shipped traces (traces/*.parquet): `rlsim run` works on each, and `replay` stays close.

The per-update bound here (10%) is looser than the 5% target of bench/replay_fidelity.py: traces
recorded on a shared 2-core machine carry ~5% run-to-run noise that no model can predict (the bench
prints that floor next to the errors)."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.replay.io import read_trace
from rlsim.cli import app
from rlsim.fidelity import replay_trace

TRACES = sorted((Path(__file__).resolve().parents[2] / "traces").glob("*.parquet"))


@pytest.mark.skipif(not TRACES, reason="no shipped traces")
@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_shipped_trace_runs_and_replays(path):
    r = CliRunner().invoke(app, ["run", "--trace", str(path), "--batch", "512", "--updates", "20", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["responses_per_s"] > 0 and d["reference"]["sigma"] == 1.0 and d["rho"] >= 1.0
    e = replay_trace(read_trace(path)).errors()
    assert e["step_time"]["median"] < 0.10
    assert e["responses_per_s"]["median"] < 0.10
