"""The notebook API returns what the CLI prints, as DataFrames, and raises the CLI's errors."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlsim
from rlsim.cli import app

TRACE = Path(__file__).resolve().parents[1] / "traces" / "grpo_p32.parquet"


def test_api_tables_equal_the_cli():
    tr = rlsim.load_trace(TRACE)
    ev = rlsim.events(tr)
    assert len(ev) == tr.table.num_rows and set(ev["kind"]) == {"gen_step", "response", "update", "sync", "eval",
                                                                 "calib_gen", "calib_train"}
    st = rlsim.steps(tr)
    assert len(st) == tr.count("update") and (st["step_time"] >= st["gen_time"]).all()
    pred = rlsim.predict(rlsim.fit([tr]), prompts=64, updates=5)
    cli = json.loads(CliRunner().invoke(app, ["run", "-t", str(TRACE), "--batch", "64", "--updates", "5", "--json"]).output)
    assert pred.loc["candidate", "responses_per_s"] == cli["responses_per_s"]
    assert pred.loc["reference", "responses_per_s"] == cli["reference"]["responses_per_s"]
    swept = rlsim.sweep([tr], {"prompts": [16, 64], "updates": [5]})
    assert list(swept.index) == [1, 2]
    assert swept[swept["prompts"] == 64]["time_to_target_ratio"].item() == cli["time_to_target_ratio"]
    assert len(rlsim.check_fidelity(tr)) == tr.count("update")  # the engine was warmed up before recording: all kept


def test_api_raises_the_cli_errors(tmp_path):
    with pytest.raises(rlsim.RlsimError, match="trace not found"):
        rlsim.load_trace(tmp_path / "missing.parquet")
    with pytest.raises(rlsim.RlsimError, match="--batch must be a positive integer"):
        rlsim.predict([TRACE], prompts=-1)
