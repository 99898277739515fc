"""`rlsim plan`: decisions and pilots from measured rho uncertainty; regret; the measured error curves reproduce."""
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bench.studies.plan_eval import (FRESH, PREFIX_F, STUDIES, _args, _with_target, cut, error_curves, folder_spec,
                                      main, prefix_tables, rerun_of, runs_of, second_runs, shared_table, shared_var,
                                      truth)
from rlsim.cli import app
from rlsim.core.config import WhatIf
from rlsim.sweeps.plan import (PlanConfig, ladder, luck_note, measured_column, one_reading, pick, plan,
                               regret_after_pilot, scores, sigma_spread, weigh)
from rlsim.replay.errors import RlsimError
from rlsim.replay.evaluation import regret, regret_interval, samples_to_target
from rlsim.replay.io import read_trace
from rlsim.replay.rho_errors import DATA, RhoErrors, measured_errors
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.present.results import read_results
from rlsim.present.tables import plan_lines
from rlsim.replay.learning import LearningCurve, fit_learning_curve, prefix_log_rho
from rlsim.replay.split_stats import split_stats
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

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
    rng = np.random.default_rng(0)
    now = scores(T, np.ones(100))[0][pick(T, np.ones(100), 0)]
    after = regret_after_pilot(T, np.ones(100), 1, 0, sd=0.05, rng=rng)
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


def test_no_sizes_plans_the_ladder_around_the_reference(synth):
    assert ladder(32) == (8, 16, 64, 128) and ladder(2) == (1, 4, 8) and ladder(6) == (2, 3, 12, 24)
    p = plan(synth["quiet"], PlanConfig(draws=500), errors=_errors(np.zeros((3, 6))))
    ref = p.reference_prompts
    assert [c.prompts for c in p.candidates] == sorted({*ladder(ref), ref})
    assert any(n.startswith("candidates: P=") for n in p.notes)
    r = runner.invoke(app, ["plan", str(REF), "--target", "0.566", "--json"])
    assert r.exit_code == 0, r.output
    assert [c["prompts"] for c in json.loads(r.output)["candidates"]] == [8, 16, 32, 64, 128]


def test_sweep_and_report_show_the_plan(tmp_path):
    out = tmp_path / "sw"
    r = runner.invoke(app, ["sweep", str(REF), "--batch", "16,32,64", "--target", "0.566", "--updates", "10", "--out",
                            str(out), "--no-charts"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    assert "plan: " in r.output and "exp. regret" in r.output
    meta = json.loads((out / "sweep.json").read_text())
    assert ("decision" in meta["plan"]) != ("pilots" in meta["plan"])

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
    t = pq.read_table(STUDY / "grpo_p64_s0.parquet")
    path = tmp_path / "noeval_p64.parquet"
    pq.write_table(t.filter(pc.not_equal(t["kind"], "eval")).replace_schema_metadata(t.schema.metadata), path)
    r = runner.invoke(app, ["plan", str(REF), "--batch", "16,64", "--target", "0.566", "-t", str(path)])
    assert r.exit_code == 2 and "no eval rows" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_the_reference_is_refused_as_its_own_pilot(tmp_path):
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


# ------------------------------------------------------------------------------------------------ measured pilots

def test_a_measured_candidate_wins_on_expected_regret_a_prediction_needs_the_guard():
    # candidate 1 beats the reference (0) by half in 3 draws of 4 and loses by a tenth in the fourth: expected regret
    # 0.1 / 4 = 0.025 against the reference's 3 x 1.0 / 4 = 0.75; it beats the reference with probability 0.75
    T = np.array([[1.0, 0.5]] * 3 + [[1.0, 1.1]])
    w = np.ones(4)
    er, _ = scores(T, w)
    assert er == pytest.approx([0.75, 0.025])
    assert pick(T, w, ref=0, confidence=0.8) == 0  # a prediction alone: the guard keeps the reference
    assert pick(T, w, ref=0, confidence=0.8, measured=[1]) == 1  # measured: the least expected regret wins
    assert pick(T, w, ref=0, measured=[1], measured_confidence=0.8) == 0  # unless a guard asks 0.8 (it has 0.75)
    assert pick(T, w, ref=0, measured=[1], measured_confidence=0.7) == 1
    # measured, but worse in expectation: the reference stays
    assert pick(np.array([[1.0, 1.2]] * 3 + [[1.0, 0.9]]), w, ref=0, measured=[1]) == 0
    assert pick(T, w, ref=0, measured=[1], barred=[1]) == 0  # read by a prefix alone, without prefix moves


def test_without_prefix_moves_a_prefix_only_steers():
    # two equally likely truths, candidate 1 twice as fast or twice as slow: a prefix that tells them apart removes
    # the regret when the pick may follow it, and none when a move needs a run to the target
    T = np.array([[1.0, 0.5]] * 50 + [[1.0, 2.0]] * 50)
    w = np.ones(100)
    free = regret_after_pilot(T, w, 1, 0, sd=0.05, rng=np.random.default_rng(0), measured_confidence=0.8)
    held = regret_after_pilot(T, w, 1, 0, sd=0.05, rng=np.random.default_rng(0), measured_confidence=0.8, barred=[1])
    assert free == pytest.approx(0.0) and held == pytest.approx(scores(T, w)[0][0], abs=0.1)


def test_a_measurement_weighed_against_the_curves_by_hand():
    log_T, z = np.log([0.5, 1.0, 2.0]), np.array([0.0, 1.0, -1.0])
    w, T = measured_column(log_T, 0.0, s=0.5, slack=0.0, z=z)  # the curves only: reweighted, T unchanged
    assert w == pytest.approx(np.exp(-0.5 * log_T ** 2 / 0.25)) and T == pytest.approx(np.exp(log_T))
    w, T = measured_column(log_T, 0.0, s=0.3, slack=0.4, z=z)  # gain 0.16 / 0.25: most of the way to the measurement
    assert w == pytest.approx(np.exp(-0.5 * log_T ** 2 / 0.25))
    assert T == pytest.approx(np.exp(log_T * (1 - 0.64) + math.sqrt(0.64) * 0.3 * z))
    w, T = measured_column(log_T, 0.0, s=0.3, slack=1e6, z=z)  # the measurement only
    assert w == pytest.approx(np.ones(3)) and T == pytest.approx(np.exp(0.3 * z), rel=1e-4)


def test_pilots_read_against_one_reference_share_its_luck_by_hand():
    # flat draws (log T = 0 at both candidates), slack 0.3; two pilots each read log T = -0.6 with noise 0.41, of
    # which 0.28 is the reference run's (shared) and 0.3 their own. As one Gaussian: t_j ~ N(0, 0.3^2), reading
    # y_j = t_j + u + e_j, u ~ N(0, 0.28^2), e_j ~ N(0, 0.3^2): E[t_1 | y] = 0.09 (S^-1 y)_1, S = [[a, b], [b, a]],
    # a = 0.09 + 0.0784 + 0.09, b = 0.0784, so -0.6 x 0.09 / (a + b) = -0.160; taken as independent (noise 0.41
    # each), -0.6 x 0.09 / (0.09 + 0.1684) = -0.209: the shared part pulls both readings back towards the reference.

    K, sd = 200_000, math.hypot(0.28, 0.3)
    readings = [(1, -0.6, sd, True), (2, -0.6, sd, True)]
    for shared, expect in ((0.28, -0.6 * 0.09 / (0.2584 + 0.0784)), (0.0, -0.6 * 0.09 / 0.2584)):
        u = np.random.default_rng(1).standard_normal(K) * shared
        w, T = weigh(np.ones((K, 3)), readings, u, shared, 0.3, np.random.default_rng(2))
        assert (w / w.sum()) @ np.log(T[:, 1]) == pytest.approx(expect, abs=0.006)
        assert T[:, 0] == pytest.approx(1.0)  # the reference's column is its own: untouched
    # prefixes share none of it: as independent readings whatever shared_sd says
    u = np.random.default_rng(1).standard_normal(K) * 0.28
    w, T = weigh(np.ones((K, 3)), [(1, -0.6, sd, False), (2, -0.6, sd, False)], u, 0.28, 0.3, np.random.default_rng(2))
    assert (w / w.sum()) @ np.log(T[:, 1]) == pytest.approx(-0.6 * 0.09 / 0.2584, abs=0.006)


def test_the_plan_says_when_its_pilots_read_the_reference_as_slow_by_hand():
    u, w = np.array([-0.4, -0.4, 0.2]), np.array([1.0, 1.0, 0.0])  # the weighted mean offset: -0.4 in log T
    note = luck_note(u, w, 0.28, full=2)
    assert "reference run as slow" in note and "about 33% faster" in note
    assert "as fast" in luck_note(-u, w, 0.28, full=2) and "49% slower" in luck_note(-u, w, 0.28, full=2)  # e^0.4
    assert luck_note(u, w, 0.28, full=1) == ""  # one run to the target cannot tell its candidate from the reference
    assert luck_note(u * 0.3, w, 0.28, full=2) == ""  # -0.12: under half the prior sd, nothing to say


def test_prefix_log_rho_by_hand():
    n = np.arange(0, 20001, 1000.0)
    ref = LearningCurve(cum_responses=n, score=n / 20000)  # score 1 at 20,000 responses
    slow = LearningCurve(cum_responses=n[:9], score=n[:9] / 40000)  # half as fast, 8,000 responses run
    assert prefix_log_rho(ref, slow, 8000) == pytest.approx(math.log(2))
    assert math.isnan(prefix_log_rho(ref, slow, 30000))  # longer than the run: no k' in [k/2, k]
    flat = LearningCurve(cum_responses=n[:9], score=np.zeros(9))  # never past the reference's first score
    assert math.isnan(prefix_log_rho(ref, flat, 8000))


def _cut(path: Path, out: Path, updates: int) -> Path:
    """The first `updates` updates of a recording (rows of later steps dropped), as a pilot stopped early."""

    t = pq.read_table(path)
    keep = pc.or_(pc.is_null(t["step"]), pc.less_equal(t["step"], updates))
    pq.write_table(t.filter(keep).replace_schema_metadata(t.schema.metadata), out)
    return out


def test_a_pilots_row_shows_what_it_measured_with_its_seed_noise(tmp_path):
    errs = _errors(np.zeros((3, 6)), seed_sd=0.3)
    e = errs["noise-scale"]
    errs["noise-scale"] = RhoErrors(e.d, e.curves, e.sources, 0.3, 0.0, 0.0, "noise-scale", False, pilot_sigma_sd=0.05,
                                    prefix_f=(0.25, 1.0), prefix_bias=(0.2, 0.1), prefix_sd=(0.9, 0.6))
    ref, pil = read_trace(REF), read_trace(STUDY / "grpo_p64_s0.parquet")
    n_ref = samples_to_target(fit_learning_curve(ref), 0.566).n
    n_pil = samples_to_target(fit_learning_curve(pil), 0.566).n
    sigma = split_stats(pil).responses_per_s / split_stats(ref).responses_per_s
    p = plan(ref, PlanConfig(prompts=SIZES, draws=500), pilots=[pil], errors=errs, target=0.566)
    c = next(c for c in p.candidates if c.prompts == 64)
    assert c.source == "pilot" and c.measured and (c.rho_noise, c.sigma_noise) == (0.3, 0.05)
    assert c.rho == pytest.approx(n_pil / n_ref) and c.sigma == pytest.approx(sigma)
    assert c.time_to_target_ratio == pytest.approx(n_pil / n_ref / sigma)
    # a pilot stopped short of the target (12 updates of 512 responses): read from its prefix, bias removed
    short = read_trace(_cut(STUDY / "grpo_p64_s0.parquet", tmp_path / "short_p64.parquet", 12))
    p = plan(ref, PlanConfig(prompts=SIZES, draws=500), pilots=[short], errors=errs, target=0.566)
    c = next(c for c in p.candidates if c.prompts == 64)
    k = samples_to_target(fit_learning_curve(short), 0.566)
    assert k.censored and c.source == "pilot prefix"
    bias, sd = errs["noise-scale"].prefix_noise(k.n / n_ref)
    assert c.rho_noise == pytest.approx(sd)
    est = prefix_log_rho(fit_learning_curve(ref), fit_learning_curve(short), k.n)
    assert c.rho == pytest.approx(math.exp(est - bias))


def test_pilots_are_priced_from_the_references_samples_to_target_and_predicted_rho():
    wide = _errors([[-0.6, -0.4, 0, 0.4, 0.6, 0.8], [0.6, 0.4, 0, -0.4, -0.6, -0.8]], mirrored=True)
    p = plan(read_trace(REF), PlanConfig(prompts=SIZES, draws=1000, budget=1e6), errors=wide, target=0.566)

    n_ref = samples_to_target(fit_learning_curve(read_trace(REF)), 0.566).n
    rho = {c.prompts: c.rho for c in p.candidates}
    for x in p.pilots:
        if not x.prefix:
            B = x.prompts * x.group
            assert rho[x.prompts] * n_ref <= x.responses < rho[x.prompts] * n_ref + B and x.responses == x.steps * B
    runs = [(x.prompts, x.steps) for x in p.pilots]
    assert len(runs) == len(set(runs))


def test_prefixes_cut_at_one_length_are_one_pilot():
    # grpo_p128 reached the target after 61,440 responses: at P=512 (4,096 a step) a quarter and a half of that both
    # cut at the 8 steps two evals need
    p = plan(read_trace(ROOT / "traces" / "grpo_p128.parquet"), PlanConfig(prompts=(64, 128, 512), draws=300))
    cuts = [(x.prompts, x.steps) for x in p.pilots if x.prefix]
    assert (512, 8) in cuts and len(cuts) == len(set(cuts))
    args = ["plan", str(ROOT / "traces" / "grpo_p128.parquet"), "--prompts", "32,64,128,256,512"]
    every = json.loads(runner.invoke(app, [*args, "--json"]).output)["pilots"]
    r = runner.invoke(app, args)
    shown = [x for x in r.output.splitlines() if x.startswith("  P=")]
    assert r.exit_code == 0 and len(every) > 5 and len(shown) == 5, r.output  # the table lists the best five
    assert f"and {len(every) - 5} more, of less value (--json lists every one)" in r.output
    # each shown command is one line to copy, at any width (piped output is 80 columns to rich)
    cmds = [x.strip() for x in r.output.splitlines() if x.startswith("    rlrun record")]
    assert cmds == [x["command"] for x in every[:5]], r.output


def test_span_note_names_the_candidates_beyond_the_data():
    e = _errors(np.zeros((2, 6)))["noise-scale"]
    assert e.span_note(np.array([0.0, 4.0]), ["P=32", "P=512"]).startswith("P=512 lies beyond")
    assert e.span_note(np.array([-3.0, 4.0]), ["P=4", "P=512"]).startswith("P=4, P=512 lie beyond")
    assert e.span_note(np.array([0.0, 1.0]), ["P=32", "P=64"]) == ""


def test_cli_table_fits_80_columns_and_says_why(tmp_path):
    pilot = STUDY / "grpo_p64_s0.parquet"
    r = runner.invoke(app, ["plan", str(REF), "--prompts", "8,16,64,128,256,512", "--target", "0.566",
                            "-t", str(pilot)],
                      env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    table = lines[1:lines.index(next(x for x in lines if x.startswith("p<=5%")))]
    assert len(table) == 9 and all(len(x) <= 80 for x in table), table
    assert "pilot" in table[5] and "x/" in table[5]  # P=64: measured, with its seed noise
    assert any(x.startswith("warning: P=512 lies beyond") for x in lines), r.output
    assert ("why: " in r.output) or ("pilots (expected regret now" in r.output)
    short = _cut(pilot, tmp_path / "short_p64.parquet", 12)  # a pilot short of the target is accepted
    r = runner.invoke(app, ["plan", str(REF), "--prompts", "16,64", "--target", "0.566", "-t", str(short), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [c["source"] for c in d["candidates"]] == ["prediction", "reference", "pilot prefix"] and d["why"]


def test_prefix_noise_by_length_and_batch_ratio_by_hand():
    e = measured_errors()
    two = RhoErrors(e.d, e.curves, e.sources, 0.3, 0.0, 0.0, prefix_f=(0.25, 1.0), prefix_d=(-1.0, 1.0),
                    prefix_bias=((0.0, 0.2), (1.0, 0.6)), prefix_sd=((0.4, 0.2), (1.2, 0.8)))
    assert two.prefix_noise(0.25, -1.0) == pytest.approx((0.0, 0.4))
    assert two.prefix_noise(1.0, 1.0) == pytest.approx((0.6, 0.8))
    assert two.prefix_noise(0.625, 0.0) == pytest.approx(((0.1 + 0.8) / 2, (0.3 + 1.0) / 2))  # both midpoints
    assert two.prefix_noise(0.25, 3.0) == pytest.approx((1.0, 1.2))  # held at the largest measured ratio
    assert RhoErrors.from_dict(two.to_dict()).prefix_noise(0.625, 0.0) == two.prefix_noise(0.625, 0.0)
    one = RhoErrors(e.d, e.curves, e.sources, 0.3, 0.0, 0.0, prefix_f=(0.25, 1.0), prefix_bias=(0.2, 0.1),
                    prefix_sd=(0.9, 0.6))  # one row: every ratio alike
    assert one.prefix_noise(0.25, 2.0) == one.prefix_noise(0.25) == pytest.approx((0.2, 0.9))


def test_prefix_tables_by_size_fall_back_to_the_pooled_length_by_hand():
    f0 = PREFIX_F[0]
    study = {"prefix": {f: [1.0, 2.0, 3.0, 4.0, 5.0] if f == f0 else [0.0] for f in PREFIX_F},
             "prefix_at": {(64, f0): [1.0, 2.0, 3.0, 4.0], (128, f0): [5.0]}, "ref_p": 32}
    t = prefix_tables({"x": study})
    assert t["prefix_d"] == (1.0, 2.0)
    assert t["prefix_bias"][0][0] == pytest.approx(2.5) and t["prefix_sd"][0][0] == pytest.approx(np.std([1, 2, 3, 4]))
    assert t["prefix_bias"][1][0] == pytest.approx(3.0)  # one sample at P 128: the pooled mean at that length


def test_the_shared_pilot_noise_is_the_within_seed_covariance_by_hand():
    # seed 0's pilots err by 1, 2, 3 (their pairwise products average 22 / 6), seed 1's by 1, -1 (-1)
    assert shared_var({"a": {"pilot_T": [[1.0, 2.0, 3.0]]}, "b": {"pilot_T": [[1.0, -1.0]]}}) == pytest.approx(
        (22 / 6 - 1) / 2)
    assert shared_var({"b": {"pilot_T": [[1.0, -1.0], [0.5]]}}) == 0.0  # never below 0; a lone pilot shares nothing


def test_the_shared_noise_table_by_hand():
    # prefixes: seed 0 at P 8 / 16 errs 1 / 2, seed 1 3 / 0; less their sizes' means (2, 1): -1 / +1 and +1 / -1,
    # so each seed's pair multiplies to -1 (one prefix fast where the other is slow: nothing shared)
    by_seed = {(0, 8, 0.5): 1.0, (0, 16, 0.5): 2.0, (1, 8, 0.5): 3.0, (1, 16, 0.5): 0.0}
    st = {"pilot_T": [[1.0, 2.0, 3.0]], "cross": {f: ([0.5, -0.5, 0.2] if f == PREFIX_F[0] else []) for f in PREFIX_F},
          "prefix_by_seed": by_seed}
    row = shared_table({"x": st})["x"]
    assert row["prefix_x_prefix"] == {"0.5": dict(shared_cov=-1.0, variance=1.0, pairs=2)}
    assert row["shared_cov"] == pytest.approx(22 / 6) and row["variance"] == pytest.approx(14 / 3)
    assert row["prefix_x_full"][str(PREFIX_F[0])] == pytest.approx(0.2 / 3)
    assert math.isnan(row["prefix_x_full"][str(PREFIX_F[1])])
    with pytest.raises(SystemExit, match="--shared-sd must be 0 or more"):
        main(["--shared-sd", "-1"])


def test_plan_eval_takes_any_study_folder(tmp_path):
    a = _args(["--folder", "traces/study_addmix_lr1e-4", "--prefix", "grpo_addmix", "--seeds", "2", "--ref-p", "32",
               "--sizes", "16,32", "--target", "0.647"])
    spec = folder_spec(a)
    assert (spec.name, spec.sizes, spec.ref_p, spec.seeds) == ("study_addmix_lr1e-4", (16, 32), 32, 2)
    runs = runs_of(spec)
    assert list(runs) == [16, 32] and all(len(r) == 2 for r in runs.values())
    assert truth(runs, [0, 1], 32)[1] == pytest.approx(1.0)
    # the reference again for seed s is the recording of seed s + seeds, never one of the study's own seeds
    again = rerun_of(spec, 0, 0.647)
    assert again["path"].name == "grpo_addmix_p32_s2.parquet" and again["n"] > 0
    assert rerun_of(replace(spec, seeds=6), 0, 0.647) is None
    with pytest.raises(RlsimError, match="2 run\\(s\\) missing"):
        runs_of(folder_spec(_args(["--folder", "traces/study_addmix_lr1e-4", "--prefix", "grpo_addmix", "--seeds", "2",
                                   "--sizes", "32,512"])))
    with pytest.raises(SystemExit, match="--ref-p 64 is not one of"):
        folder_spec(_args(["--folder", "x", "--sizes", "16,32", "--ref-p", "64"]))


def test_a_move_on_one_pilot_run_asks_for_a_second_reference_run():


    study = NS(framework="rlrun", n_star_ref=6000.0,
               models=NS(config={"algo": "grpo", "task": "add4", "seed": 0, "eval_every": 2}))
    full, prefix = NS(prefix=False), NS(prefix=True)
    s = NS(ref=2, sizes=[8, 16, 32], preds=[NS(group=8)] * 3, observed={0: full, 1: prefix}, w=np.ones(4),
           u=np.zeros(4))  # draws that read no luck: the second run priced at the reference's samples-to-target
    w = one_reading(s, 0, 0.28, study)
    assert w.startswith("the move to P=8 rests on one pilot run") and "sd 0.28" in w
    assert "rlrun record --algo grpo --prompts 32 --group 8 --task add4" in w  # 6,000 / 256 responses: 24 steps
    assert "--steps 24 --seed 1 --out reference_2.parquet" in w
    assert one_reading(s, 2, 0.28, study) == ""  # no move
    assert one_reading(s, 1, 0.28, study) == ""  # a move on a prefix: that reading does not share the luck
    assert one_reading(NS(**{**vars(s), "observed": {0: full, 1: full}}), 0, 0.28, study) == ""  # two runs: the
    # shared-luck model reads the reference's luck from them
    imported = one_reading(s, 0, 0.28, NS(**{**vars(study), "framework": "verl"}))
    assert ("run verl as the reference was, at P=32, G=8, for 24 updates with another seed, then rlsim import verl "
            "LOG -o reference_2.parquet") in imported


# ------------------------------------------------------------------------------------------------ the reference again

def test_a_second_reference_run_reads_the_reference_runs_luck_by_hand():
    # u ~ N(0, 0.28^2) the reference run's luck; the reference run again reads y0 = u + e0, a pilot y1 = t1 + u + e1,
    # e ~ N(0, 0.3^2) (own_sd of a total 0.41 with 0.28 shared), t1 ~ N(0, slack^2 = 0.09). As one Gaussian:
    # E[u | y0] = y0 x 0.0784 / (0.0784 + 0.09); E[t1 | y0, y1] = [0.09, 0] S^-1 [y1, y0], S = [[0.2584, 0.0784],
    # [0.0784, 0.1684]]: a second run that reads the reference as slow (y0 = -0.5) pulls a fast pilot back further.

    K, sd = 200_000, math.hypot(0.28, 0.3)
    u = np.random.default_rng(1).standard_normal(K) * 0.28
    T0 = np.ones((K, 2))
    T0[:, 0] = 1.3  # the reference's size in a mode the plan asks: its column is never the reading's
    w, T = weigh(T0, [(0, -0.5, sd, True)], u, 0.28, 0.3, np.random.default_rng(2), ref=0)
    assert (w / w.sum()) @ u == pytest.approx(-0.5 * 0.0784 / 0.1684, abs=0.004)
    assert T[:, 0] == pytest.approx(1.3) and T[:, 1] == pytest.approx(1.0)
    S = np.array([[0.2584, 0.0784], [0.0784, 0.1684]])
    pilot, again = (1, -0.6, sd, True), (0, -0.5, sd, True)
    for readings, n in (([pilot], 1), ([again, pilot], 2)):  # without the second run, then with it
        w, T = weigh(np.ones((K, 2)), readings, u, 0.28, 0.3, np.random.default_rng(2), ref=0)
        expect = float(np.array([0.09, 0.0])[:n] @ np.linalg.solve(S[:n, :n], np.array([-0.6, -0.5])[:n]))
        assert (w / w.sum()) @ np.log(T[:, 1]) == pytest.approx(expect, abs=0.006)


def test_the_reference_again_is_worth_a_run_only_once_a_pilot_shares_its_luck():
    # candidate 1 is 0.86x or 1.16x the reference (even odds); a pilot there reads log T = -0.15 plus the reference
    # run's luck u (sd 0.28) and its own noise (0.1): the reference or the candidate may be the fast one. The
    # reference run again (noise 0.1) reads u, and so tells them apart; with no pilot, u moves no pick.

    K, sd = 20_000, math.hypot(0.28, 0.1)
    rng = np.random.default_rng(3)
    u = rng.standard_normal(K) * 0.28
    T = np.exp(np.column_stack([np.zeros(K), np.where(rng.random(K) < 0.5, -0.15, 0.15)]))
    now = lambda w, T: scores(T, w)[0][pick(T, w, 0, measured=[1], measured_confidence=0.5)]  # noqa: E731
    after = lambda w, T: regret_after_pilot(T, w, 0, 0, sd=0.1, rng=np.random.default_rng(4), u=u,  # noqa: E731
                                             measured=[1], measured_confidence=0.5, slack=0.0, truths=2000)
    assert after(np.ones(K), T) == pytest.approx(now(np.ones(K), T), abs=0.01)
    w, T1 = weigh(T, [(1, -0.15, sd, True)], u, 0.28, 0.0, np.random.default_rng(2), ref=0)
    assert after(w, T1) < 0.6 * now(w, T1)


def test_a_second_reference_run_is_a_pilot(tmp_path):
    # add2's seed 4: a slow reference (15,500 responses to the target, the other seeds' mean 10,700), and its P=16 run
    # to the target reads fast against it; whether that is P=16 or the reference run's luck, a second run tells
    ref, again, p16 = (read_trace(STUDY / f"grpo_p{P}_s{s}.parquet") for P, s in ((32, 4), (32, 5), (16, 4)))
    cfg = PlanConfig(prompts=SIZES, draws=1000, budget=1e6)
    alone = plan(ref, cfg, pilots=[p16], target=0.566)
    x = next(x for x in alone.pilots if x.again)
    assert (x.prompts, x.steps) == (32, 64) and "--seed 5 --out reference_2.parquet" in x.command
    assert x.expected_regret_after < alone.expected_regret - 0.05
    assert not any(x.again for x in plan(ref, replace(cfg, again=False), pilots=[p16], target=0.566).pilots)
    both = plan(ref, cfg, pilots=[again, p16], target=0.566)
    r = next(c for c in both.candidates if c.prompts == 32)
    assert (r.source, r.rho, r.sigma, r.time_to_target_ratio) == ("reference", 1.0, 1.0, 1.0)
    assert any(n.startswith("second run of the reference grpo_p32_s5: it reached the target after") for n in both.notes)
    assert any("the second run of the reference reads the reference run as slow" in n for n in both.notes)
    assert not any(x.again for x in both.pilots)
    # the reference's own seed, or short of the target: one line each
    same = read_trace(_cut(STUDY / "grpo_p32_s4.parquet", tmp_path / "ref_cut.parquet", 40))
    short = read_trace(_cut(STUDY / "grpo_p32_s1.parquet", tmp_path / "again_short.parquet", 10))
    for pilot, msg in ((same, "with the reference's seed \\(4\\)"), (short, "stopped short of the target .* run it to "
                                                                          "the end \\(rlrun record .* --steps 64")):
        with pytest.raises(RlsimError, match=msg):
            plan(ref, cfg, pilots=[pilot], target=0.566)


def test_a_pilot_from_another_build_of_the_model_is_refused():
    # sub3's model rebuilt from the same recipe on another day: its warm-up ended at another loss (0.041048 against
    # 0.041), and its runs start from other weights
    sub3 = ROOT / "traces" / "study_sub3"
    ref, rebuilt = read_trace(sub3 / "grpo_sub3_p32_s0.parquet"), read_trace(sub3 / "rebuilt_model" /
                                                                               "grpo_sub3_p32_s3.parquet")
    with pytest.raises(RlsimError, match="trains another build of tiny-llama-sub3-.* than the reference .*warm-up "
                                         "ended at loss 0.0410479, the reference's at 0.041"):
        plan(ref, PlanConfig(prompts=(8, 32), draws=200), pilots=[rebuilt])


def test_a_move_that_the_reference_runs_luck_could_undo_asks_for_the_reference_again():
    # add4's seed 0: a slow reference (8,237 responses to the target; its second run 6,696) and its P=8 run (3,467):
    # read against the reference alone, P=8 looks 0.42x the samples
    add4 = ROOT / "traces" / "study_add4"
    ref = read_trace(add4 / "grpo_add4_p32_s0.parquet")
    p8 = read_trace(add4 / "grpo_add4_p8_s0.parquet")
    cfg = PlanConfig(prompts=(8, 16, 32, 64, 128, 256), group=8, budget=16384, draws=2000)
    p = plan(ref, cfg, pilots=[p8], target=0.831)
    assert p.decision is None and [x.again for x in p.pilots] == [True]
    assert p.why.startswith("run P=8") and "changes with probability" in p.why
    assert "--seed 1 --out reference_2.parquet" in p.pilots[0].command
    assert plan(ref, replace(cfg, again=False), pilots=[p8], target=0.831).decision.prompts == 8
    assert plan(ref, replace(cfg, budget=3000), pilots=[p8], target=0.831).decision.prompts == 8  # unaffordable
    both = plan(ref, cfg, pilots=[p8, read_trace(add4 / "grpo_add4_p32_s3.parquet")], target=0.831)
    assert both.why.startswith("keep the reference")  # read back: P=8 no longer clears the guard
    assert not any(x.again for x in both.pilots)


def test_plan_eval_cuts_a_pilot_where_it_stopped():
    # a prefix pilot is the run cut after its length (`cut` reads the run's updates first, then swaps in the cut
    # table): its rows, learning curve and speed are the cut's, not the run's

    path = ROOT / "traces" / "study_add4" / "grpo_add4_p8_s0.parquet"
    full, short = read_trace(path), cut(path, 2112)
    assert len(short.rows("update")["step"]) == 33 < len(full.rows("update")["step"])
    curve = fit_learning_curve(short)
    assert curve.cum_responses[-1] <= 2112 and samples_to_target(curve, 0.831).censored


def test_the_sweep_says_when_the_plan_asks_for_the_reference_again():
    x = dict(prompts=32, group=8, steps=64, responses=7936, expected_regret_after=0.14, again=True,
             command="rlrun record --prompts 32 --seed 1 --out reference_2.parquet")
    lines = plan_lines({"plan": {"pilots": [x], "expected_regret": 0.127}})
    assert lines == ["plan: the reference again with another seed first (64 updates; it reads the reference run's own "
                     "luck): rlrun record --prompts 32 --seed 1 --out reference_2.parquet"]


def test_second_runs_read_the_studies_references_against_their_seconds():
    by = {f.name: second_runs(_with_target(f)) for f in FRESH if f.name in ("add4", "sub3")}
    add4, sub3 = by["add4"], by["sub3"]
    assert [round(r["first"]) for r in add4] == [8237, 5851, 4521] and all(r["same_model"] for r in add4)
    assert [round(r["second"]) for r in add4] == [6696, 5688, 7222]
    assert not any(r["same_model"] for r in sub3) and len(sub3) == 3  # rebuilt_model/: another build


def test_a_study_scored_from_another_reference_size_keeps_its_registered_target():
    by = {f.name: _with_target(f) for f in FRESH}
    assert by["sum3 ref P 8"].target == by["sum3"].target == 0.36 and by["sum3 ref P 8"].ref_p == 8
    assert second_runs(by["sum3 ref P 16"]) == []  # no second runs at P 16: the plan cannot ask for them


def test_a_pilot_is_read_in_the_setup_the_plan_asks():
    # a pilot recorded as the reference was (colocated): a plan asking a split reads its measured sigma times the
    # simulator's ratio of its size split to colocated, not as if it had run split
    ref, pil = read_trace(STUDY / "grpo_p32_s0.parquet"), read_trace(STUDY / "grpo_p64_s0.parquet")
    split = (("gen_gpus", 1), ("train_gpus", 1), ("staleness", 1))
    rows = {}
    for fixed in ((), split):
        p = plan(ref, PlanConfig(prompts=(16, 64), draws=200, fixed=fixed), pilots=[pil], target=0.566)
        rows[fixed] = next(c for c in p.candidates if c.prompts == 64)
        assert any("in the asked setup" in n for n in p.notes) == bool(fixed)
    study = prepare([ref], rho_model="noise-scale", target=0.566)
    ask = WhatIf(prompts=64, group=8, updates=PlanConfig.updates)
    ratio = evaluate(study, replace(ask, **dict(split))).sigma / evaluate(study, ask).sigma
    assert rows[split].sigma / rows[()].sigma == pytest.approx(ratio, rel=1e-9) and abs(ratio - 1) > 0.05


def test_pilot_commands_record_the_asked_setup_where_rlrun_records_it():
    # an asked split as AReaL runs it: every pilot recorded so (it measures rho under the staleness too); the
    # reference's second run as the reference was; a mode rlrun cannot record: the pilots as the reference was
    ref = read_trace(STUDY / "grpo_p32_s0.parquet")
    split = (("gen_gpus", 1), ("train_gpus", 1), ("staleness", 1))
    nemo = (("mode", "nemo_async"), ("gen_gpus", 1), ("train_gpus", 1), ("max_trajectory_age_steps", 1))
    flags = "--mode split --gen-gpus 1 --train-gpus 1 --staleness 1 --steps"
    for fixed, want in (((), False), (split, True), (nemo, False)):
        p = plan(ref, PlanConfig(prompts=(16, 64), draws=200, fixed=fixed), target=0.566)
        assert p.pilots and all((flags in x.command) == (want and not x.again) for x in p.pilots), fixed
        assert all("--mode" not in x.command for x in p.pilots if x.again)


def test_a_pilot_recorded_in_another_setup_is_refused():
    ref, pil = read_trace(STUDY / "grpo_p32_s0.parquet"), read_trace(STUDY / "grpo_p64_s0.parquet")
    split = replace(pil, meta={**pil.meta, "config": {**pil.config, "mode": "split", "gen_devices": 1,
                                                      "train_devices": 1, "max_staleness": 1}})
    with pytest.raises(RlsimError, match="pilot grpo_p64_s0 was recorded with --mode split --gen-gpus 1 --train-gpus 1 "
                                         "--staleness 1, the reference with --mode colocated: record each pilot as"):
        plan(ref, PlanConfig(prompts=(16, 64), draws=200), pilots=[split], target=0.566)
    # recorded as the plan asks: its sigma read as measured, no ratio; asked otherwise: refused, naming the ask
    asked = (("gen_gpus", 1), ("train_gpus", 1), ("staleness", 1))
    rows = [next(c for c in plan(ref, PlanConfig(prompts=(16, 64), draws=200, fixed=f), pilots=[t],
                                 target=0.566).candidates if c.prompts == 64) for f, t in (((), pil), (asked, split))]
    assert rows[0].sigma == rows[1].sigma and rows[1].source == "pilot"
    other = (("gen_gpus", 1), ("train_gpus", 1), ("staleness", 2))
    with pytest.raises(RlsimError, match="the plan asks --mode split --gen-gpus 1 --train-gpus 1 --staleness 2: "):
        plan(ref, PlanConfig(prompts=(16, 64), draws=200, fixed=other), pilots=[split], target=0.566)


def test_the_reference_row_in_an_asked_setup_shows_its_predicted_interval():
    ref = read_trace(ROOT / "traces" / "grpo_p128.parquet")
    split = (("gen_gpus", 1), ("train_gpus", 1), ("staleness", 1))
    rows = {f: next(c for c in plan(ref, PlanConfig(prompts=(64, 256), draws=200, fixed=f)).candidates
                    if c.prompts == 128) for f in ((), split)}
    assert rows[()].time_to_target_ratio_lo == rows[()].time_to_target_ratio_hi == 1.0
    o = evaluate(prepare([ref], rho_model="noise-scale"), WhatIf(prompts=128, group=8, updates=PlanConfig.updates,
                                                                 **dict(split)))
    r = rows[split]
    assert (r.time_to_target_ratio_lo, r.time_to_target_ratio_hi) == pytest.approx((1 / o.sigma_hi, 1 / o.sigma_lo))
    assert r.time_to_target_ratio_lo < r.time_to_target_ratio < r.time_to_target_ratio_hi


@pytest.mark.parametrize("kw,msg", [(dict(group=0), "--group must be a positive integer"),
                                    (dict(draws=0), "draws must be an integer of at least 100"),
                                    (dict(prompts=(8, True)), "sizes must be positive integers")])
def test_bad_plan_settings_are_refused_before_the_fit(kw, msg):
    with pytest.raises(RlsimError, match=msg):
        PlanConfig(**kw).validate()


def test_a_reference_without_evals_is_refused_naming_what_gives_them():
    t = read_trace(STUDY / "grpo_p32_s0.parquet")
    bare = replace(t, table=t.table.filter(pc.not_equal(t.table["kind"], "eval")))
    with pytest.raises(RlsimError, match="has no eval scores, so no learning curve to plan from: record the reference "
                                         "with evals"):
        plan(bare, PlanConfig(prompts=(16, 64), draws=200))
