"""`rlsim plan`: decisions and pilots from measured rho uncertainty; regret; the measured error curves reproduce."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.core.config import WhatIf
from rlsim.sweeps.plan import PlanConfig, pick, plan, regret_after_pilot, scores
from rlsim.replay.errors import RlsimError
from rlsim.replay.evaluation import regret, regret_interval
from rlsim.replay.io import read_trace
from rlsim.replay.rho_errors import DATA, RhoErrors, measured_errors
from rlsim.replay.synthetic import SynthSpec, synthetic_trace

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "traces" / "study"
REF = STUDY / "grpo_p32_s0.parquet"
SIZES = (8, 16, 32, 64, 128)
runner = CliRunner()


def _errors(curves, seed_sd=0.3, truth_sd=0.0, sigma_sd=0.0, mirrored=False) -> dict:
    d = np.log2(np.array([8, 16, 32, 64, 128, 256]) / 32)
    c = np.asarray(curves, float)
    return {"noise-scale": RhoErrors(d, c, tuple(f"hand seed{i}" for i in range(len(c))), seed_sd, truth_sd, sigma_sd,
                                     "noise-scale", mirrored)}


def test_regret_and_its_interval_by_hand():
    assert regret([1.0, 0.8, 1.2], 0) == pytest.approx(0.25)
    assert regret([1.0, 0.8, 1.2], 1) == 0.0
    draws = np.array([[1.0, 0.8], [1.0, 1.0], [1.0, 2.0]])
    assert regret_interval(draws, 0, q=(0, 100)) == pytest.approx((0.0, 0.25))


def test_scores_and_the_pick_keep_the_reference_unless_confident():
    T = np.array([[1.0, 0.5], [1.0, 0.6], [1.0, 1.5]])  # candidate 1 beats the reference (0) in 2 of 3 draws
    w = np.ones(3)
    er, p5 = scores(T, w)
    assert er == pytest.approx([(1 / 0.5 - 1 + 1 / 0.6 - 1) / 3, 0.5 / 3])
    assert p5 == pytest.approx([1 / 3, 2 / 3])
    assert pick(T, w, ref=0, confidence=0.8) == 0 and pick(T, w, ref=0, confidence=0.6) == 1
    assert pick(T, np.array([1.0, 1.0, 0.0]), ref=0) == 1  # a pilot that rules out the third draw decides it


def test_a_pilot_that_tells_the_draws_apart_removes_the_regret():
    # two equally likely truths: candidate 1 is twice as fast, or twice as slow; a pilot at 1 observes which
    T = np.array([[1.0, 0.5]] * 50 + [[1.0, 2.0]] * 50)
    e = np.array([[0.0, -0.7]] * 50 + [[0.0, 0.7]] * 50)
    rng = np.random.default_rng(0)
    now = scores(T, np.ones(100))[0][pick(T, np.ones(100), 0)]
    after = regret_after_pilot(T, e, np.ones(100), 1, 0, sd=0.05, rng=rng)
    assert now == pytest.approx(0.5) and after < 0.02


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """Synthetic recordings (P=16, G=4, calibrated) of a quiet machine, a noisy one whose fits still hold, and a loaded
    one whose fits cannot be used (whole calibration levels and steps slowed at random, 6 steps)."""
    d = tmp_path_factory.mktemp("plan_synth")
    return {name: read_trace(synthetic_trace(d / f"{name}.parquet",
                                             SynthSpec(calibrate=True, steps=steps, seed=0, **kw)))
            for name, steps, kw in (("quiet", 12, {}), ("noisy", 12, {"noise": 0.1}), ("loaded", 6, {"load": 1.0}))}


def test_exact_predictions_decide_without_pilots(synth):
    # exact rho (zero error curves) and a quiet recording's fits (a sigma interval of next to no width)
    p = plan(synth["quiet"], PlanConfig(prompts=(8, 32, 64), draws=500), errors=_errors(np.zeros((3, 6))))
    assert p.decision is not None and not p.pilots and not p.no_move
    best = min(p.candidates, key=lambda c: c.time_to_target_ratio)
    assert p.decision.prompts == best.prompts and p.decision.p_within_5pct > 0.95
    assert [c.prompts for c in p.candidates] == [8, 16, 32, 64] and sum(c.measured for c in p.candidates) == 1


def test_sigma_uncertainty_comes_from_the_traces_own_intervals(synth):
    from rlsim.sweeps.plan import sigma_spread
    from rlsim.whatif.predict import evaluate
    from rlsim.whatif.study import prepare

    cfg = PlanConfig(prompts=(8, 32, 64), draws=2000)
    spans = {}
    for name in ("quiet", "noisy"):
        p = plan(synth[name], cfg, errors=_errors(np.zeros((3, 6))))
        spans[name] = [math.log(c.time_to_target_ratio_hi / c.time_to_target_ratio_lo)
                       for c in p.candidates if not c.measured]
        o = evaluate(prepare([synth[name]], rho_model="noise-scale"), WhatIf(prompts=64, group=4, updates=40))
        sd, bare = sigma_spread([o])
        assert not bare and sd[0] == pytest.approx(math.log(o.sigma_hi / o.sigma_lo) / (2 * 1.6448536), rel=1e-6)
        assert any("the trace's own sigma intervals" in n for n in p.notes)
    # exact rho: the T spread is sigma's alone, the noisy trace's wider at every size
    assert all(n > 2 * q for q, n in zip(spans["quiet"], spans["noisy"]))


def test_unusable_fits_make_no_move_and_name_the_recording(synth):
    p = plan(synth["loaded"], PlanConfig(prompts=(8, 32, 64), draws=500), errors=_errors(np.zeros((3, 6))))
    assert p.decision is None and not p.pilots and p.no_move and p.warnings[0] == p.no_move
    assert "cannot be used" in p.no_move and "quiet machine" in p.no_move
    assert "rlrun record --algo grpo --prompts 16 --group 4 --steps 24" in p.no_move  # more steps: it had 6
    d = p.to_dict()
    assert d["no_move"] == p.no_move and "decision" not in d and d["pilots"] == []
    r = runner.invoke(app, ["plan", str(synth["loaded"].path), "--batch", "8,32,64"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "no move" in r.output, r.output
    assert "decision:" not in r.output and "warning:" in r.output, r.output


def test_wide_errors_ask_for_pilots_and_a_pilot_trace_is_measured():
    wide = _errors([[-0.6, -0.4, 0, 0.4, 0.6, 0.8], [0.6, 0.4, 0, -0.4, -0.6, -0.8]], mirrored=True)
    cfg = PlanConfig(prompts=SIZES, draws=1000, budget=1e6)
    p = plan(read_trace(REF), cfg, errors=wide, target=0.566)
    assert p.decision is None and p.pilots
    d = p.to_dict()
    assert set(d["pilots"][0]) >= {"prompts", "group", "steps", "command", "expected_regret_after"}
    assert all(x["expected_regret_after"] < d["expected_regret"] for x in d["pilots"])
    assert d["pilots"][0]["command"].startswith("rlrun record --algo grpo --prompts ")
    again = plan(read_trace(REF), cfg, pilots=[read_trace(STUDY / "grpo_p64_s0.parquet")], errors=wide, target=0.566)
    assert [c.prompts for c in again.candidates if c.measured] == [32, 64]


def test_the_shipped_error_curves_are_what_the_studies_measure():
    from bench.studies.plan_eval import STUDIES, error_curves, runs_of

    spec = STUDIES[2]  # the smallest study (3 seeds): its curves must be the stored ones
    e = error_curves(spec, runs_of(spec))
    stored = DATA["noise-scale"]
    rows = [c for c, s in zip(stored["curves"], stored["sources"]) if s.startswith(spec.name + " seed")]
    assert np.allclose(rows, e["curves"]["noise-scale"], atol=1e-4)
    assert measured_errors().mirrored and not measured_errors("invariant").mirrored


@pytest.mark.parametrize("args,msg", [
    (["--batch", "64"], "two or more candidate sizes"),
    (["--batch", "64,64"], "two or more candidate sizes"),  # a repeated size counts once
    (["--batch", "16,64", "--budget", "10"], "below one update"),
    (["--batch", "16,64", "--device", "h100"], "takes candidate sizes"),
    (["--batch", "16,64", "--gen-gpus", "2"], "needs --train-gpus too"),  # a mode's devices: checked before the fit
    (["--batch", "16,64", "--mode", "one_step_off"], "add --gen-gpus N --train-gpus M"),
    (["--batch", "16,64", "-t", str(ROOT / "traces" / "study_addmix" / "grpo_addmix_p64_s0.parquet")], "task"),
    (["--batch", "16,64", "-t", str(ROOT / "traces" / "ppo_b256.parquet")], "algo 'ppo'"),  # another algorithm
])
def test_bad_input_is_one_line(args, msg):
    r = runner.invoke(app, ["plan", str(REF), "--target", "0.566", *args])
    assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_cli_json_keys():
    r = runner.invoke(app, ["plan", str(REF), "--batch", "16,64", "--target", "0.566", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert ("decision" in d) != ("pilots" in d)
    if "decision" in d:
        assert set(d["decision"]) >= {"prompts", "group", "p_within_5pct", "expected_regret"}
    assert all(math.isfinite(c["expected_regret"]) for c in d["candidates"])
    with pytest.raises(RlsimError):
        PlanConfig(prompts=(8,)).validate()


def test_sweep_and_report_show_the_plan(tmp_path):
    out = tmp_path / "sw"
    r = runner.invoke(app, ["sweep", str(REF), "--batch", "16,32,64", "--target", "0.566", "--updates", "10", "--out",
                            str(out), "--no-charts"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    assert "plan: " in r.output and "exp. regret" in r.output
    meta = json.loads((out / "sweep.json").read_text())
    assert ("decision" in meta["plan"]) != ("pilots" in meta["plan"])
    from rlsim.present.results import read_results

    rows, _ = read_results(out)
    assert all(math.isfinite(x["expected_regret"]) for x in rows)
    html_out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "--trace", str(REF), "--sweep", str(out), "-o", str(html_out)])
    assert r.exit_code == 0, r.output
    page = html_out.read_text()
    assert "plan: " in page and "expected regret" in page
    # a grid over anything but the size has no plan
    r = runner.invoke(app, ["sweep", str(REF), "--batch", "16,32", "--group", "4,8", "--updates", "5", "--out",
                            str(tmp_path / "g"), "--no-charts"])
    assert r.exit_code == 0 and "plan: " not in r.output


def test_a_pilot_without_evals_is_one_line(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(STUDY / "grpo_p64_s0.parquet")
    path = tmp_path / "noeval_p64.parquet"
    pq.write_table(t.filter(pc.not_equal(t["kind"], "eval")).replace_schema_metadata(t.schema.metadata), path)
    r = runner.invoke(app, ["plan", str(REF), "--batch", "16,64", "--target", "0.566", "-t", str(path)])
    assert r.exit_code == 2 and "no eval rows" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_the_reference_is_refused_as_its_own_pilot(tmp_path):
    import shutil

    copy = tmp_path / "copy.parquet"
    shutil.copy(REF, copy)
    for pilot, how in ((REF, "the same file"), (copy, "the same events")):
        r = runner.invoke(app, ["plan", str(REF), "--batch", "16,64", "--target", "0.566", "-t", str(pilot)])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
        assert f"is the reference's own recording ({how})" in r.output
    pilot = STUDY / "grpo_p64_s0.parquet"
    with pytest.raises(RlsimError, match=r"pilot .*grpo_p64_s0.parquet is pilot .*grpo_p64_s0.parquet again "
                                         r"\(the same file\)"):
        plan(read_trace(REF), PlanConfig(prompts=SIZES), pilots=[read_trace(pilot), read_trace(pilot)], target=0.566)
