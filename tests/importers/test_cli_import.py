"""`rlsim import`: the commands of sim/cli/imports.py on a throwaway typer app (and on the real
`rlsim` app once it registers them), then a what-if on the imported shipped example."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rlsim.cli import imports as commands_import
from rlsim.core.config import WhatIf
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers import IMPORTERS, Importer
from rlsim.replay.io import read_trace
from rlsim.whatif.predict import run
from tests.importers.fixtures import OPENRLHF_CONFIG, write_openrlhf_csv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "verl"
runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, add_completion=False)

    @app.callback()
    def main() -> None:
        """throwaway app"""

    commands_import.register(app)
    return app


def test_import_verl_example_then_run(tmp_path):
    out = tmp_path / "verl_run.parquet"
    r = runner.invoke(_app(), ["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config",
                               str(EXAMPLE / "config.yaml"), "--device", "h100", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "40 steps (1..40), 5 evals" in r.output and "P = 256 prompts x G = 5 = B = 1280" in r.output
    assert f"next: rlsim run --trace {out} --prompts 512" in r.output
    res = run([read_trace(out)], WhatIf(prompts=512, updates=30))
    assert res.candidate.responses_per_update == 2560 and res.candidate.sigma > 1
    from rlsim.cli import app  # the real `rlsim run` on the imported trace

    r = runner.invoke(app, ["run", "--trace", str(out), "--batch", "512", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["responses_per_update"] == 2560 and d["sigma"] > 1
    assert any("step-level trace imported from verl" in w for w in d["warnings"])


@pytest.mark.parametrize("args,msg", [
    (["--prompts", "128"], "--prompts 128 disagrees with data.train_batch_size = 256 in config.yaml"),
    (["--device", "tpu"], "unknown device 'tpu'; known devices: a100-40gb"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, msg):
    r = runner.invoke(_app(), ["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config",
                               str(EXAMPLE / "config.yaml"), "-o", str(tmp_path / "t.parquet"), *args])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output
    assert len([line for line in r.output.splitlines() if line.strip()]) == 1


def test_truncated_and_empty_logs(tmp_path):
    lines = (EXAMPLE / "verl_gsm8k_qwen.log").read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if " step:" in line)
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(lines[:last] + [lines[last][: len(lines[last]) // 2]]) + "\n")
    r = runner.invoke(_app(), ["import", "verl", str(cut), "--config", str(EXAMPLE / "config.yaml"), "-o",
                               str(tmp_path / "t.parquet")])
    assert r.exit_code == 2 and f"line {last + 1}: the line of step 40 is truncated" in r.output
    r = runner.invoke(_app(), ["import", "verl", str(cut), "--config", str(EXAMPLE / "config.yaml"), "--drop-truncated",
                               "-o", str(tmp_path / "t.parquet")])
    assert r.exit_code == 0 and "39 steps (1..39)" in r.output
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    r = runner.invoke(_app(), ["import", "verl", str(empty), "--prompts", "8", "--group", "2", "-o",
                               str(tmp_path / "e.parquet")])
    assert r.exit_code == 2 and "no verl training steps found" in r.output


def test_openrlhf_and_trl_commands(tmp_path):
    c = tmp_path / "history.csv"
    write_openrlhf_csv(c, [dict(gen=30.0, avrm=3.0, wait=0.5, train=12.0, resp=400.0, total=550.0)] * 5)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(OPENRLHF_CONFIG)
    r = runner.invoke(_app(), ["import", "openrlhf", str(c), "--config", str(cfg), "-o", str(tmp_path / "o.parquet")])
    assert r.exit_code == 0, r.output
    assert "P = 128 prompts x G = 8 = B = 1024" in r.output
    r = runner.invoke(_app(), ["import", "trl", str(tmp_path / "missing.json"), "--group", "8", "--prompts", "4",
                               "-o", str(tmp_path / "t.parquet")])
    assert r.exit_code == 2 and "log not found" in r.output


def test_the_rlsim_app_registers_import():
    from rlsim.cli import app

    assert [g.name for g in app.registered_groups].count("import") == 1
    r = runner.invoke(app, ["import", "--help"])
    assert r.exit_code == 0 and "verl" in r.output and "openrlhf" in r.output and "trl" in r.output


def test_an_importer_in_the_registry_is_a_subcommand_with_its_own_flags(tmp_path, monkeypatch):
    """A new framework is its importer in the registry: `rlsim import` lists it, with the ImportFlags it names
    in its words, and passes what was given to its `load` (no edit to the CLI)."""
    seen = {}

    def load(path, **flags):
        seen.update(flags)
        raise RlsimError("stop here")

    fake = Importer(name="fakerl", help="Import a FakeRL run.", log_help="its metrics", load=load,
                    flags=("prompts", "group"), flag_help={"prompts": "P: fake.batch"})
    monkeypatch.setitem(IMPORTERS, "fakerl", fake)
    app = _app()
    assert "fakerl" in runner.invoke(app, ["import", "--help"]).output
    r = runner.invoke(app, ["import", "fakerl", "--help"], env={"COLUMNS": "200"})
    assert "P: fake.batch" in r.output and "--group" in r.output and "--tp" not in r.output
    r = runner.invoke(app, ["import", "fakerl", str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "o.parquet"),
                            "--prompts", "8"])
    assert r.exit_code == 2 and r.output.strip() == "error: stop here"
    assert seen["prompts"] == 8 and "group" not in seen and "tp" not in seen
