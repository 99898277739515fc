"""The fit-quality rule reaches every output (run, its JSON, the API, sweep), and widens the intervals it affects;
sigma has an interval on rescaled hardware (the fits' replicates moved with the costs, and the datasheet's other
roof)."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import rlsim
from rlsim.cli import app
from rlsim.core.config import WhatIf
from rlsim.replay.devices import other_roof, rescale
from rlsim.replay.io import read_trace
from rlsim.replay.models import Replicates
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.whatif.predict import evaluate, run
from rlsim.whatif.study import prepare

ROOT = Path(__file__).resolve().parents[2]
P128 = ROOT / "traces" / "grpo_p128.parquet"
UNUSABLE = "its cost fits cannot be used"
runner = CliRunner()


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> Path:
    """A 6-step recording on a loaded machine (whole calibration levels and steps slowed at random)."""
    return synthetic_trace(tmp_path_factory.mktemp("fitq") / "loaded.parquet",
                           SynthSpec(calibrate=True, steps=6, load=1.0))


def test_run_warns_and_cannot_decide(loaded):
    r = runner.invoke(app, ["run", "--trace", str(loaded), "--batch", "64"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    warn = [w for w in " ".join(r.output.split()).split("warning: ") if UNUSABLE in w]  # the lines rich wrapped, joined
    assert len(warn) == 1 and "rlrun record --algo grpo --prompts 16 --group 4 --steps 24" in warn[0]
    assert "verdict: undecided" in r.output and "at least the bound of fits that cannot be used" in r.output
    d = json.loads(runner.invoke(app, ["run", "--trace", str(loaded), "--batch", "64", "--json"]).output)
    assert any(UNUSABLE in w for w in d["warnings"]) and d["regime"] == "undecided"


def test_the_intervals_carry_the_unusable_fits_error(loaded):
    res = run([read_trace(loaded)], WhatIf(prompts=64))
    c, ref = res.candidate, res.reference
    # sigma: at least the bound's spread (log sd 1 x the octaves, 2 here) on both sides
    assert math.log(c.sigma_hi / c.sigma_lo) > 2 * 1.645 * 0.8 and c.regime == "undecided"
    # the simulated reference's responses/s is not known either: its interval holds what was recorded
    assert ref.responses_per_s_lo < res.recorded_responses_per_s < ref.responses_per_s_hi
    assert ref.responses_per_s_hi / ref.responses_per_s_lo > 5


def test_the_api_and_sweep_rows_carry_the_warning(loaded, tmp_path):
    df = rlsim.predict(str(loaded), prompts=64)
    assert all(UNUSABLE in w for w in df["warnings"])
    rows = rlsim.sweep([str(loaded)], {"prompts": [8, 64], "updates": [10]})
    assert all(UNUSABLE in w for w in rows["warnings"])
    r = runner.invoke(app, ["sweep", str(loaded), "--batch", "8,32,64", "--updates", "10",
                            "--out", str(tmp_path / "sw"), "--no-charts"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "plan: no move" in r.output and any(UNUSABLE in w for w in " ".join(r.output.split()).split("warning: "))


def test_sigma_has_an_interval_on_rescaled_hardware():
    r = runner.invoke(app, ["run", "--trace", str(P128), "--batch", "1024", "--device", "h200", "--gpus", "8",
                            "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["sigma_lo"] is not None and d["sigma_lo"] < d["sigma"] < d["sigma_hi"]
    assert d["responses_per_s_lo"] < d["responses_per_s"] < d["responses_per_s_hi"]
    assert "held-out error" in d["interval"] and "bandwidth gain" in d["interval"]  # the fits' error, the datasheet's
    table = runner.invoke(app, ["run", "--trace", str(P128), "--batch", "1024", "--device", "h200", "--gpus", "8"],
                          env={"COLUMNS": "200"}).output
    row = next(line for line in table.splitlines() if "sigma (throughput gain)" in line)
    assert f"{d['sigma']:.3f}x ({d['sigma_lo']:.3f}x..{d['sigma_hi']:.3f}x)" in row
    df = rlsim.predict(str(P128), prompts=1024, device="h200", gpus=8)
    assert df.loc["candidate", "sigma_lo"] == pytest.approx(d["sigma_lo"])
    # --gpus alone (more of the recorded device) has one too
    study = prepare([read_trace(P128)])
    more = evaluate(study, WhatIf(prompts=1024, gpus=4, updates=10))
    assert more.sigma_lo < more.sigma < more.sigma_hi


def test_rescaled_replicates_move_as_the_point_fits_do():
    study = prepare([read_trace(P128)])
    m, hw = study.models, study.hardware
    # replicates equal to the point fits: once rescaled, they must equal the rescaled point fits
    pts = Replicates(gen=np.tile(m.gen.array, (8, 1)), update=np.tile(m.update.array, (8, 1)))
    for dev, n in (("h200", 8), ("a100-80gb", 2)):
        out, _ = rescale(replace(m, replicates=pts), dev, n, source_profile=hw, source_gpus=2)
        assert np.allclose(out.replicates.gen, out.gen.array, rtol=1e-12, atol=0)
        assert np.allclose(out.replicates.update, out.update.array, rtol=1e-12, atol=1e-15)
    # the other roof: per-token compute moves by the bandwidth gain, more slowly than by the FLOP/s gain
    end, k = other_roof(m, "h200", source_profile=hw)
    assert k > 1 and end.gen.c_seq == pytest.approx(m.gen.c_seq * k) and end.gen.c_step == m.gen.c_step
    assert end.gen.c_ctx == m.gen.c_ctx and other_roof(m, "cpu-amd-epyc", source_profile=hw) is None
