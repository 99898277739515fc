"""The benches' analysis helpers on hand-made inputs (the recordings themselves are bench runs, not tests)."""
import math
from pathlib import Path

import numpy as np
import pytest

from bench.calibration_cost import calibration_cost, lolo
from bench.studies.extrapolation import table
from rlsim.replay.evaluation import kendall_tau
from rlsim.replay.io import read_trace


def test_kendall_tau_hand_cases():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one discordant pair (3, 4) of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)
    assert math.isnan(kendall_tau([1, 1], [2, 2]))


def test_paired_sigma_table_states_the_targets():
    from rlsim.replay.evaluation import SigmaCase

    out = table([SigmaCase("g8", 128, 2048, predicted=3.0, lo=2.9, hi=3.2, measured=3.3, measured_lo=3.2,
                           measured_hi=3.4)])
    assert "| g8 | 128 -> 2048 (16x) | 3.000 (2.900..3.200) | 3.300 (3.200..3.400) | -9.1 % | no |" in out
    assert "1 cases: |error| median 9.1 % (target <= 3 %), max 9.1 % (target <= 8 %)" in out and "in 0 %" in out


def test_ranking_resolution_hand_cases():
    from rlsim.replay.evaluation import ranking_resolution

    # three seeds that agree exactly: every pair ranks alike, no noise, a perfect predictor always reaches tau 1
    x = np.log([[1.2, 1.0, 0.9, 1.5]] * 3)
    r = ranking_resolution(x, ref=1, draws=200)
    assert r["seed_pair_tau"] == pytest.approx([1.0, 1.0, 1.0])
    assert r["sd_log_t"] == 0.0 and r["perfect_tau_mean"] == pytest.approx(1.0) and r["perfect_tau_p08"] == 1.0
    assert r["spread_cover_one"] == pytest.approx(0.75)  # 1 - 2 / 2^3
    # seed noise far larger than the gaps between sizes: rankings agree by chance only
    rng = np.random.default_rng(1)
    noisy = np.log([1.0, 1.0, 1.01, 1.02, 1.03, 1.04]) + rng.normal(0, 1.0, (3, 6))
    noisy[:, 0] = 0.0  # the reference column
    r = ranking_resolution(noisy, ref=0, draws=500)
    assert r["sd_log_t"] > 0.5 and r["perfect_tau_mean"] < 0.5 and r["perfect_tau_p08"] < 0.2
    # the truth is the 3-seed mean, whose gaps the noise inflates: the ladder still needs 4x the seeds or more
    assert (r["seeds_for_p08"] or 10**9) > 12 and r["perfect_tau_p08_by_seeds"][3] < 0.2


def test_ranking_resolution_seed_ladder_follows_the_gaps():
    from rlsim.replay.evaluation import ranking_resolution

    # sizes 0.3 apart in log T, two seeds with seed noise of sd 0.3: the chance that a perfect predictor scores
    # tau >= 0.8 grows with the seeds averaged, and 0.3 / (0.3 / sqrt m) separates neighbours well by m = 12
    gaps = np.array([0.0, 0.3, 0.6, 0.9, 1.2, 1.5])
    x = np.stack([gaps + [0, 0.3, -0.3, 0.3, -0.3, 0.3], gaps + [0, -0.3, 0.3, -0.3, 0.3, -0.3]])
    r = ranking_resolution(x, ref=0, draws=400, ladder=(1, 4, 16, 64))
    p = [r["perfect_tau_p08_by_seeds"][m] for m in (1, 4, 16, 64)]
    assert p == sorted(p) and p[0] < 0.5 and p[-1] == 1.0
    assert r["seeds_for_p08"] in (4, 16)


def test_resolution_splits_the_seed_noise_into_rho_and_sigma():
    import math

    from bench.studies.batch_study import resolution

    # two seeds: at P = 64 the second needs twice the samples, both run twice as fast as their reference; all noise
    # in log T is then in rho (sd log 2 / sqrt 2), none in sigma
    runs_ = {(32, "sqrt"): [dict(seed=0, n_star=100.0, rps=10.0), dict(seed=1, n_star=100.0, rps=10.0)],
             (64, "sqrt"): [dict(seed=0, n_star=100.0, rps=20.0), dict(seed=1, n_star=200.0, rps=20.0)],
             (64, "fixed"): [dict(seed=0, n_star=1.0, rps=1.0)]}  # another lr rule: not part of the ranking
    r = resolution(runs_, log=lambda *a: None)
    assert r["sd_log_rho"] == pytest.approx(math.log(2) / math.sqrt(2))
    assert r["sd_log_sigma"] == pytest.approx(0.0)
    assert r["sd_log_t"] == pytest.approx(r["sd_log_rho"])


def test_score_predictions_by_hand_and_a_bad_file(tmp_path):
    import json

    from bench.studies.batch_study import score_predictions

    rows = [dict(P=P, rule="sqrt", T=T, rho=rho, rho_min=lo, rho_max=hi, censored=False)
            for P, T, rho, lo, hi in ((8, 0.9, 0.5, 0.4, 0.6), (32, 1.0, 1.0, 1.0, 1.0), (64, 1.3, 1.4, 1.2, 1.6))]
    rows.append(dict(P=64, rule="fixed", T=1.1, rho=1.0, rho_min=0.9, rho_max=1.1, censored=False))  # not ranked
    # predicted order 32 < 8 < 64 against measured 8 < 32 < 64: one discordant pair of three, tau 1/3; P = 8's rho out
    pred = {f"{P}_sqrt": {"noise_scale": {"T": T, "rho": rho}}
            for P, T, rho in ((8, 1.2, 0.8), (32, 1.0, 1.0), (64, 1.5, 1.3))}
    f = tmp_path / "pred.json"
    f.write_text(json.dumps({"predictions": pred}))
    r = score_predictions(rows, f, log=lambda *a: None)
    assert r["kendall_tau"] == pytest.approx(1 / 3) and r["rho_within_spread"] == [0, 1]
    assert list(r["models"]) == ["noise_scale"]
    # a second model in the same file is scored on its own: measured order exactly, both rho inside
    for P, T, rho in ((8, 0.8, 0.55), (32, 1.0, 1.0), (64, 1.2, 1.5)):
        pred[f"{P}_sqrt"]["kappa0"] = {"T": T, "rho": rho}
    f.write_text(json.dumps({"predictions": pred}))
    r = score_predictions(rows, f, log=lambda *a: None)
    assert r["models"]["kappa0"] == {"kendall_tau": pytest.approx(1.0), "rho_within_spread": [1, 1]}
    assert r["kendall_tau"] == pytest.approx(1 / 3)  # the top level stays the noise scale's
    del pred["64_sqrt"]
    f.write_text(json.dumps({"predictions": pred}))
    with pytest.raises(SystemExit, match="cannot read predictions from .*pred.json \\(KeyError"):
        score_predictions(rows, f, log=lambda *a: None)
    f.write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read predictions"):
        score_predictions(rows, f, log=lambda *a: None)


def test_batch_study_refuses_a_target_the_reference_never_reaches():
    from pathlib import Path

    from bench.studies.batch_study import BUDGET, analyse

    study = Path(__file__).resolve().parents[2] / "traces" / "study"
    with pytest.raises(SystemExit, match="reference seed\\(s\\) 0 never reach the target 0.99; lower --target"):
        analyse(study, (32,), 1, BUDGET, target=0.99, log=lambda *a: None)


def test_lr_or_batch_hypotheses_by_hand():
    from bench.studies.lr_or_batch import predict

    # the study measured rho 0.5 at the lr of P = 8 under the square-root rule (1.5e-4) and a censored >= 2 at P = 128's
    f = {1.5e-4: (0.5, False), 3e-4: (1.0, False), 6e-4: (2.0, True)}
    p = predict([(8, 3e-4), (128, 1.5e-4), (64, 5e-4)], f, lr_aware=(1e-9, 0.0))
    a, b, c = p["8_0.0003"], p["128_0.00015"], p["64_0.0005"]
    # lr alone: the reference lr gives 1 at any batch; another lr gives what the study measured at that lr
    assert a["lr_rho"] == 1.0 and b["lr_rho"] == 0.5 and b["lr_censored"] is False and c["lr_rho"] is None
    # noise-dominated Adam: (lr_ref / lr) sqrt(B / B_ref); equal progress per update: (lr_ref / lr) (B / B_ref)
    assert a["sde_rho"] == pytest.approx(0.5) and b["sde_rho"] == pytest.approx(4.0)
    assert a["steps_rho"] == pytest.approx(0.25) and b["steps_rho"] == pytest.approx(8.0)
    # lr-aware with no bend and no curvature: progress per update lr-proportional, as "steps"
    assert a["lr-aware_rho"] == pytest.approx(0.25) and b["lr-aware_rho"] == pytest.approx(8.0)


def test_lr_or_batch_refuses_bad_counts_and_points_in_one_line():
    from bench.studies.lr_or_batch import main

    with pytest.raises(SystemExit, match="--seeds, --study-seeds and --budget must be at least 1; got -2"):
        main(["--no-record", "--seeds", "-2"])
    with pytest.raises(SystemExit, match="--points takes P:LR pairs with positive numbers"):
        main(["--no-record", "--points=-8:3e-4"])
    # a committed pre-registration is never written over
    pre = Path(__file__).resolve().parents[2] / "docs" / "study" / "lr_or_batch_preregistered.json"
    before = pre.read_bytes()
    with pytest.raises(SystemExit, match="exists; predictions are written once"):
        main(["--predict", "--json", str(pre)])
    assert pre.read_bytes() == before


def test_batch_study_predict_refuses_an_existing_file_or_a_missing_folder(tmp_path):
    from bench.studies.batch_study import main

    pre = Path(__file__).resolve().parents[2] / "docs" / "study" / "addmix_lr1e-4_preregistered.json"
    before = pre.read_bytes()
    with pytest.raises(SystemExit, match="exists; predictions are written once, before the runs they predict"):
        main(["--no-record", "--predict", str(pre)])
    assert pre.read_bytes() == before
    with pytest.raises(SystemExit, match="its folder does not exist"):
        main(["--no-record", "--predict", str(tmp_path / "no" / "p.json")])


def test_batch_study_predict_from_the_references_alone(tmp_path):
    import shutil
    from pathlib import Path

    from bench.studies.batch_study import predict

    with pytest.raises(SystemExit, match="no complete reference run \\(P = 32\\) in .*; "
                                         "record it first \\(--sizes 32\\)"):
        predict(tmp_path, 1, "add2", sizes=(16, 32))
    study = Path(__file__).resolve().parents[2] / "traces" / "study"
    shutil.copy(study / "grpo_p32_s0.parquet", tmp_path / "grpo_p32_s0.parquet")
    r = predict(tmp_path, 1, "add2", sizes=(16, 32), argv=["--sizes", "16,32"])
    assert r["command"] == "python -m bench.studies.batch_study --sizes 16,32" and len(r["b_noise"]) == 1
    assert 0 < r["target"] < 1 and set(r["predictions"]) == {"16_sqrt", "32_sqrt"}
    ref, small = r["predictions"]["32_sqrt"], r["predictions"]["16_sqrt"]
    assert ref["noise_scale"]["rho"] == pytest.approx(1.0) and ref["noise_scale"]["T"] == pytest.approx(1.0)
    # half the batch: fewer or equal samples, lower throughput, by the noise-scale form and the kappa = 0 form
    assert 0 < small["noise_scale"]["rho"] <= 1 and 0 < small["noise_scale"]["sigma"] < 1
    assert 0 < small["kappa0"]["rho"] <= 1 and "lr_aware" not in small


def test_calibration_cost_of_a_shipped_trace():
    r = calibration_cost("traces/ppo_b256.parquet")
    cal = read_trace("traces/ppo_b256.parquet").meta["calibration"]
    assert r["calibration_s"] == cal["duration_s"] and r["run_s"] > r["calibration_s"]
    assert r["share"] == r["calibration_s"] / (r["calibration_s"] + r["run_s"]) and 0 < r["share"] < 0.5
    assert [n for _, n in r["train_levels"]] == [lv["n"] for lv in cal["train_levels"]]
    assert r["setup_s"] == pytest.approx(sum(cal["setup"].values()))
    v = lolo("traces/ppo_b256.parquet")  # one held-out error per measured level, as rlsim run prints them
    assert v["gen_form"] in ("linear", "knee", "interp") and v["train_levels"] == len(cal["train_levels"])
    assert 0 < v["gen_cv"] <= v["gen_cv_max"] and 0 < v["train_cv"] <= v["train_cv_max"]


def test_warmup_pass_rate_scores_a_tiny_warm_up_and_refuses_bad_input():
    pytest.importorskip("torch")
    from bench import warmup_pass_rate as wp

    rate, loss = wp.pass_rate("add4", 2, 4)  # two warm-up steps: a share of 4 prompts, a finite loss
    assert rate in (0.0, 0.25, 0.5, 0.75, 1.0) and math.isfinite(loss)
    for argv, says in ((["--task", "mul9"], "is not a built-in task"), (["--task", "add4", "--steps", "1,x"],
                       "comma list of integers"), (["--task", "add4", "--prompts", "0"], "must be positive")):
        with pytest.raises(SystemExit) as e:
            wp.main(argv)
        assert says in str(e.value) and str(e.value).startswith("error: ")
