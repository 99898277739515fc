"""The study analysis (rlsim.replay.evaluation) on hand-made inputs; tests/bench/test_study_reproduces.py checks it
against the committed study results."""
import itertools
import math

import numpy as np
import pytest

from rlsim.replay.evaluation import (Reached, SeedRuns, b_crit_allowed, censored_log_error, critical_batches,
                                     error_summary, kendall_tau, measured_ratios, noise_split, pooled_sd,
                                     ranking_resolution, resample_T, samples_to_target, score_ranking, tau_interval,
                                     within_spread)
from rlsim.replay.learning import LearningCurve


def _tau_b(a, b):
    """Kendall's tau-b counted pair by pair."""
    conc = disc = ta = tb = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        x, y = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
        if x == 0 and y == 0:
            continue
        if x == 0:
            ta += 1
        elif y == 0:
            tb += 1
        elif x == y:
            conc += 1
        else:
            disc += 1
    return (conc - disc) / math.sqrt((conc + disc + ta) * (conc + disc + tb))


def test_kendall_tau_is_tau_b_with_ties():
    rng = np.random.default_rng(3)
    for _ in range(50):
        a, b = rng.integers(0, 4, 7).astype(float), rng.integers(0, 4, 7).astype(float)
        if len(set(a)) > 1 and len(set(b)) > 1:
            assert kendall_tau(a, b) == pytest.approx(_tau_b(a, b), abs=1e-12)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))  # undefined: said by the value, no warning raised
    assert math.isnan(kendall_tau([1, 2, math.nan], [1, 2, 3]))


def test_samples_to_target_censors_a_run_that_never_reaches_it():
    c = LearningCurve(np.array([100.0, 200.0, 300.0]), np.array([0.1, 0.3, 0.5]))
    assert samples_to_target(c, 0.4) == Reached(250.0, False)
    assert samples_to_target(c, 0.9) == Reached(300.0, True)  # its budget: a lower bound
    n, censored = samples_to_target(c, 0.9)
    assert (n, censored) == (300.0, True)


def test_measured_ratios_by_hand():
    ref = SeedRuns.of([Reached(100.0, False), Reached(300.0, False)], [10.0, 30.0])
    big = SeedRuns.of([Reached(300.0, False), Reached(500.0, True)], [40.0, 40.0])
    r = measured_ratios(big, n_ref=float(np.mean(ref.n_star)), rps_ref=float(np.mean(ref.rps)))
    assert (r["seeds"], r["reached"], r["censored"]) == (2, 1, True)
    assert r["rho"] == pytest.approx(2.0) and (r["rho_min"], r["rho_max"]) == pytest.approx((1.5, 2.5))
    assert r["sigma"] == pytest.approx(2.0) and r["T"] == pytest.approx(1.0) and r["n_star"] == 400.0


def test_resample_T_draws_the_reference_then_each_configuration():
    ref = SeedRuns(np.array([100.0, 200.0, 400.0]), np.zeros(3, bool), np.array([1.0, 2.0, 4.0]))
    cfgs = [SeedRuns(np.array([50.0, 60.0]), np.zeros(2, bool), np.array([2.0, 3.0])),
            SeedRuns(np.array([900.0, 800.0, 700.0]), np.array([True, False, False]), np.array([5.0, 5.0, 6.0]))]
    got = resample_T(ref, cfgs, np.random.default_rng(7), draws=20)
    rng = np.random.default_rng(7)  # the same draws by hand, in the same order
    for d in range(20):
        i = rng.choice(3, 3)
        nr, qr = ref.n_star[i].mean(), ref.rps[i].mean()
        for k, c in enumerate(cfgs):
            j = rng.choice(len(c), len(c))
            assert got[d, k] == pytest.approx((c.n_star[j].mean() / nr) / (c.rps[j].mean() / qr), rel=1e-12)
    # the interval of a ranking's tau over those draws
    lo, hi = tau_interval([1.0, 2.0], got)
    taus = [kendall_tau([1.0, 2.0], t) for t in got]
    assert (lo, hi) == pytest.approx(tuple(np.nanpercentile(taus, [5, 95])))
    assert all(math.isnan(x) for x in tau_interval([1.0, 2.0], np.zeros((0, 2))))


def test_spread_and_log_errors_handle_censoring():
    assert within_spread(1.1, 1.0, 1.2) and not within_spread(1.3, 1.0, 1.2)
    assert within_spread(1.3, 1.0, 1.2, censored=True) and not within_spread(0.9, 1.0, 1.2, censored=True)
    assert censored_log_error(2.0, 1.0, False) == pytest.approx(math.log(2))
    assert censored_log_error(0.5, 1.0, True) == pytest.approx(math.log(2))  # predicted below a lower bound: an error
    assert censored_log_error(2.0, 1.0, True) == 0.0  # at or above it: not contradicted
    assert censored_log_error(math.inf, 1.0, False) == 5.0
    assert error_summary({"a": [1.0, 3.0], "b": []}) == {"a": {"mean": 2.0, "median": 2.0, "n": 2}}


def test_score_ranking_by_hand():
    # predicted order 2 < 1 < 3 against measured 1 < 2 < 3: one discordant pair of three; the second rho outside
    s = score_ranking([1.2, 1.0, 1.5], [0.9, 1.0, 1.3], [0.5, 1.9], [(0.4, 0.6, False), (1.0, 1.5, False)])
    assert s == {"kendall_tau": pytest.approx(1 / 3), "rho_within_spread": [1, 0]}
    assert score_ranking([1, 2], [1, 2], [1.9], [(1.0, 1.5, True)])["rho_within_spread"] == [1]


def test_b_crit_allowed_by_the_measured_rho():
    # B_ref 256; at B 512 every seed finished with rho <= 1.2: B_crit >= (512 - 1.2 x 256) / 0.2 = 1024;
    # at B 2048 a censored rho >= 2: B_crit <= (2048 - 2 x 256) / 1 = 1536
    rows = [dict(B=128, rho=0.9, rho_max=1.0, censored=False), dict(B=512, rho=1.1, rho_max=1.2, censored=False),
            dict(B=2048, rho=2.0, rho_max=2.1, censored=True)]
    assert b_crit_allowed(rows, 256) == pytest.approx((1024.0, 1536.0))
    assert b_crit_allowed(rows[:1], 256) == (0.0, math.inf)


def test_critical_batches_by_hand():
    rows = [dict(P=8, sigma=0.5, n_star=100.0, censored=False), dict(P=16, sigma=0.95, n_star=110.0, censored=False),
            dict(P=32, sigma=1.0, n_star=130.0, censored=False), dict(P=64, sigma=1.02, n_star=119.0, censored=True)]
    assert critical_batches(rows) == (16, 16)
    assert math.isnan(critical_batches([dict(P=8, sigma=1.0, n_star=1.0, censored=True)])[1])


def test_noise_split_parts_the_seed_noise():
    # all of log T's seed noise in rho: two seeds, rho 1 and 2 at the second size, sigma alike
    log_rho = np.log([[1.0, 1.0], [1.0, 2.0]])
    log_sig = np.zeros((2, 2))
    r = noise_split(log_rho, log_sig, ref=0, within=1, draws=50)
    assert r["sd_log_rho"] == pytest.approx(math.log(2) / math.sqrt(2)) and r["sd_log_sigma"] == 0.0
    assert r["sd_log_t"] == pytest.approx(r["sd_log_rho"]) and r["spread_cover_all"] == r["spread_cover_one"] == 0.5
    assert pooled_sd(np.zeros((1, 3))) == 0.0
    # a seed with all sizes tied
    assert math.isnan(ranking_resolution(log_rho - log_sig, 0, draws=50)["seed_pair_tau"][0])


def test_sigma_cases_error_and_coverage():
    from rlsim.replay.evaluation import SigmaCase, sigma_summary

    a = SigmaCase("g8", 128, 512, predicted=2.2, lo=2.0, hi=2.4, measured=2.0, measured_lo=1.9, measured_hi=2.1)
    b = SigmaCase("g8", 128, 2048, predicted=3.0, lo=2.9, hi=3.2, measured=3.3, measured_lo=3.2, measured_hi=3.4)
    assert abs(a.error - 0.1) < 1e-12 and a.covered and not b.covered
    s = sigma_summary([a, b])
    assert s["cases"] == 2 and abs(s["max_abs_error"] - 0.1) < 1e-12 and s["coverage"] == 0.5
    assert abs(s["median_abs_error"] - (0.1 + 0.3 / 3.3) / 2) < 1e-12
    assert sigma_summary([])["cases"] == 0
