"""The one recorded step time (replay/steps.py) everywhere a recorded run is read, and the step table's counts."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import rlsim
from rlsim.cli import app
from rlsim.replay.drift import drift_of
from rlsim.replay.io import read_trace
from rlsim.replay.steps import COUNTS, step_table, step_times
from rlsim.replay.timeline import recorded_timeline

TRACE = Path(__file__).resolve().parents[2] / "traces" / "grpo_p32.parquet"


def test_steps_replay_and_run_read_one_step_time():
    """A trace with a drift probe (the fit normalises its inputs to the machine's median speed): the recorded
    step times of `rlsim.steps`, `check_fidelity` and `rlsim run`'s recorded line are the same measured ones."""
    tr = rlsim.load_trace(TRACE)
    d = drift_of(tr)
    assert d is not None and max(abs(d.gen - 1).max(), abs(d.train - 1).max()) > 0.01  # normalising would move them
    st = rlsim.steps(tr).set_index("step")
    fid = rlsim.check_fidelity(tr)
    assert len(fid) >= len(st) - 1
    np.testing.assert_array_equal(fid["recorded_step_time"].to_numpy(), st.loc[fid.index, "step_time"].to_numpy())
    np.testing.assert_allclose(fid["recorded_responses_per_s"].to_numpy(),
                               (st["num_responses"] / st["step_time"]).loc[fid.index].to_numpy(), rtol=1e-12)
    r = CliRunner().invoke(app, ["run", "--trace", str(TRACE), "--batch", "64", "--updates", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["recorded_step_time_s"] == pytest.approx(float(np.median(st["step_time"])), rel=1e-12)
    rate = float(np.median(st["num_responses"] / st["step_time"]))
    assert out["recorded_responses_per_s"] == pytest.approx(rate, rel=1e-12)


def test_step_table_counts_are_integers():
    st = rlsim.steps(TRACE)
    for c in COUNTS:
        assert st[c].dtype == np.int64, c
    assert (st["gen_steps"] > 0).all() and (st["num_tokens"] > st["num_responses"]).all()
    assert {c for c in st.columns if st[c].dtype.kind == "f"} == set(st.columns) - set(COUNTS)


def test_step_times_rebuild_a_missing_step_from_its_phases():
    nan = float("nan")
    rec = np.array([5.0, nan, nan])
    gen, reward, prep, upd, sync = (np.array([1.0, 1.0, 1.0]), np.array([0.5] * 3), np.array([0.25] * 3),
                                    np.array([2.0] * 3), np.array([0.125] * 3))
    got = step_times(rec, gen, reward, prep, upd, sync, prep_inside=np.array([False, False, True]))
    np.testing.assert_array_equal(got, [5.0, 3.875, 3.625])  # recorded; the phases; prep inside the update's duration


def test_a_trace_without_step_time_reads_the_rebuilt_one_everywhere(tmp_path):
    """Update rows without `step_time`: the step table rebuilds it, and the timeline's RL-step slices take it."""
    t = pq.read_table(TRACE)
    i = t.schema.get_field_index("step_time")
    path = tmp_path / "no_step_time.parquet"
    pq.write_table(t.set_column(i, "step_time", pa.nulls(t.num_rows, pa.float64())), path)
    tr = read_trace(path)
    st = step_table(tr)
    parts = st["gen_time"] + st["reward_time"] + st["update_time"] + st["sync_time"]
    assert np.all(np.isfinite(st["step_time"])) and np.all(st["step_time"] >= parts - 1e-12)
    assert np.all(st["step_time"] <= parts + st["prep_time"] + 1e-12)
    spans, _ = recorded_timeline(tr)
    rl = {s.args["step"]: s.dur for s in spans if s.track == "rl_step"}
    assert rl and all(rl[int(s)] == pytest.approx(v) for s, v in zip(st["step"], st["step_time"]))
