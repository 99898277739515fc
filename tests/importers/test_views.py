"""Imported (step-level) traces in the views: Perfetto shows one slice per logged phase on its lane,
the report renders."""
import json
from pathlib import Path

from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verl"


def test_perfetto_and_report_show_the_phases(tmp_path):
    trace = import_log("verl", EXAMPLE / "verl_gsm8k_qwen.log", config=EXAMPLE / "config.yaml", device="h100",
                       out=tmp_path / "verl.parquet")
    p = read_trace(trace).rows("phase")
    res = CliRunner().invoke(app, ["export", "perfetto", str(trace), "-o", str(tmp_path / "pf.json")])
    assert res.exit_code == 0, res.output
    obj = json.loads((tmp_path / "pf.json").read_text())
    x = [e for e in obj["traceEvents"] if e["ph"] == "X"]
    roles = list(p["phase_role"])
    # every phase that is not nested inside another is one slice, named after the logged phase
    for name in {str(n) for n, r in zip(p["phase"], roles) if r == "gen"}:
        assert sum(e["name"] == f"gen.{name}" for e in x) == sum(1 for n, r in zip(p["phase"], roles) if n == name)
    gen = [e for e in x if e["name"] == "gen.gen"]
    first = min(gen, key=lambda e: e["ts"])
    i = next(k for k, (n, s) in enumerate(zip(p["phase"], p["step"])) if n == "gen" and s == p["step"].min())
    assert abs(first["ts"] - p["t_start"][i] * 1e6) < 1 and abs(first["dur"] - p["duration"][i] * 1e6) < 1
    threads = {e["args"]["name"] for e in obj["traceEvents"] if e.get("name") == "thread_name"}
    # one track each: no overlap
    assert {"RL steps", "generation rounds", "batch prep", "updates", "rewards"} <= threads
    res = CliRunner().invoke(app, ["report", "--trace", str(trace), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output


def test_calibration_with_an_imported_trace_is_one_line(tmp_path):
    trace = import_log("verl", EXAMPLE / "verl_gsm8k_qwen.log", config=EXAMPLE / "config.yaml", device="h100",
                       out=tmp_path / "verl.parquet")
    cal = Path(__file__).resolve().parents[2] / "traces" / "grpo_p32.parquet"
    res = CliRunner().invoke(app, ["run", "-t", str(trace), "--calibration", str(cal), "--updates", "3"])
    assert res.exit_code == 2 and "--calibration applies only to traces recorded by `rlrun record`" in res.output
    assert len(res.output.strip().splitlines()) == 1
