"""Learning curves, the gradient noise scale, and the rho models against hand-computed values."""
import math

import numpy as np
import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.learning import LearningCurve, ema_ratio, noise_scale, two_batch_estimates
from rlsim.replay.rho import (curves_rho, fit_lr_aware, invariant_rho, lr_aware_rho, noise_scale_rho, parse_rho, regime,
                              rho_points)
from rlsim.replay.synthetic import SynthSpec, synthetic_trace


def test_two_batch_estimators_exact():
    g2, tr = 2.0, 50.0
    bs, bb = 8, 128
    ns, nb = math.sqrt(g2 + tr / bs), math.sqrt(g2 + tr / bb)
    eg2, etr = two_batch_estimates(bs, bb, ns, nb)
    assert eg2 == pytest.approx(g2)
    assert etr == pytest.approx(tr)


def test_ema_ratio_bias_free_on_constant_series():
    out = ema_ratio(np.full(5, 6.0), np.full(5, 2.0), 0.2)
    assert np.allclose(out, 3.0)


def test_noise_scale_from_trace(tmp_path):
    t = read_trace(synthetic_trace(tmp_path / "ns.parquet", SynthSpec(g2=0.5, tr_sigma=40.0, steps=4)))
    ns = noise_scale(t)
    assert ns.b_crit == pytest.approx(80.0)
    assert ns.updates_used == 4
    assert math.isnan(ns.critic_b_crit)


def test_b_noise_falls_back_to_the_ratio_of_means_when_the_ema_ends_below_zero():
    from rlsim.replay.learning import b_noise_estimate

    tr = np.full(5, 100.0)
    g2 = np.array([1.0, 1.0, 1.0, 1.0, -3.0])  # a noisy last |G|^2 drags its EMA below 0; the mean is 0.2
    series = ema_ratio(tr, g2, 0.2)
    assert math.isnan(series[-1])
    assert b_noise_estimate(series, g2, tr) == pytest.approx(500.0)
    assert b_noise_estimate(series[:4], g2[:4], tr[:4]) == pytest.approx(series[3])  # the EMA when it is positive
    assert math.isnan(b_noise_estimate(series, np.array([1.0, -2.0, 0.5, 0.1, -3.0]), tr))  # mean below 0 too
    assert math.isnan(b_noise_estimate(np.zeros(0), np.zeros(0), np.zeros(0)))


def test_rho_models_hand_computed():
    assert invariant_rho(1024).rho(4096) == 1.0
    m = noise_scale_rho(b_ref=1024, b_crit=2048)
    assert m.rho(1024) == pytest.approx(1.0)
    assert m.rho(4096) == pytest.approx((1 + 2) / (1 + 0.5))
    assert m.rho(512) == pytest.approx((1 + 0.25) / 1.5)
    with pytest.raises(RlsimError):
        noise_scale_rho(1024, float("nan"))


def test_curves_interpolate_in_log_batch():
    def curve(b, scale):
        n = np.arange(1, 41) * b
        return LearningCurve(n.astype(float), 1 - np.exp(-n / scale), responses_per_update=b, lr_rule="sqrt")

    # N* for target 0.5 = scale * ln 2
    cs = [curve(256, 1000.0), curve(1024, 1000.0), curve(4096, 1600.0)]
    m = curves_rho(256, cs, 0.5)
    n = [c.samples_to_target(0.5) for c in cs]
    assert m.rho(256) == pytest.approx(1.0)
    assert m.rho(4096) == pytest.approx(n[2] / n[0])
    # 2048 is halfway between 1024 and 4096 in log batch
    assert m.rho(2048) == pytest.approx((n[1] + n[2]) / 2 / n[0])
    # beyond the curves: a power law through the last segment (slope clipped to [0, 1]), never a flat clamp,
    # bounded by samples rising (rho >= rho at the last batch) and updates falling (rho <= that x B / B_last)
    s = min(max(math.log(n[2] / n[1]) / math.log(4), 0.0), 1.0)
    assert m.rho(8192) == pytest.approx(n[2] / n[0] * 2 ** s)
    assert m.bounds(8192) == pytest.approx((n[2] / n[0], 2 * n[2] / n[0]))
    assert m.bounds(128) == pytest.approx((0.5, 1.0)) and m.bounds(1024) is None
    assert any("power law" in w and "clamp" not in w for w in m.notes(8192))
    with pytest.raises(RlsimError):
        curves_rho(256, cs[:1], 0.5)


def test_samples_to_target_interpolates_between_evals():
    c = LearningCurve(np.array([100.0, 200.0, 300.0]), np.array([0.1, 0.3, 0.5]))
    assert c.samples_to_target(0.4) == pytest.approx(250.0)
    assert c.samples_to_target(0.05) == pytest.approx(100.0)
    assert c.samples_to_target(0.6) is None
    assert c.best == 0.5


def test_regimes():
    assert regime(0.71) == "time falls"
    assert regime(1.02) == "flat"
    assert regime(1.23) == "time rises"


def test_isotonic_smoothing_of_noisy_evals():
    from rlsim.replay.learning import isotonic

    assert isotonic([0.1, 0.5, 0.3, 0.6]).tolist() == pytest.approx([0.1, 0.4, 0.4, 0.6])
    c = LearningCurve(np.array([0.0, 100, 200, 300, 400]), np.array([0.2, 0.6, 0.4, 0.55, 0.7]))
    # smoothed: 0.2, 0.5, 0.5, 0.55, 0.7 -> a lucky 0.6 at 100 responses does not decide the crossing of 0.55
    assert c.best == pytest.approx(0.7)
    assert c.samples_to_target(0.55) == pytest.approx(300.0)


def _h(b, bend):
    return (1 + bend / b) ** -0.5


def test_lr_aware_rho_hand_computed():
    m = lr_aware_rho(256, 200.0, 0.2, "sqrt")
    d_ref = _h(256, 200) * (1 - 0.2)
    d = 2 * _h(1024, 200) - 0.2 * 4 * _h(256, 200)  # x = sqrt(1024 / 256) = 2
    assert m.rho(256) == pytest.approx(1.0)
    assert m.rho(1024) == pytest.approx(4 * d_ref / d)
    d_fixed = _h(1024, 200) - 0.2 * _h(256, 200)  # the reference's lr kept: x = 1
    assert m.rho(1024, "fixed") == pytest.approx(4 * d_ref / d_fixed)
    assert m.rho(1024, x=1.0) == pytest.approx(m.rho(1024, "fixed"))
    assert m.rho(1024, "linear") == pytest.approx(4 * d_ref / (4 * _h(1024, 200) - 0.2 * 16 * _h(256, 200)))


def test_lr_aware_limits():
    # far below the bend the sqrt rule keeps samples-to-target flat; far above it, without curvature, only the
    # lr grows (as sqrt B) and samples-to-target grows as sqrt(B / B_ref)
    noisy = lr_aware_rho(256, 1e12, 0.0)
    assert noisy.rho(16) == pytest.approx(1.0, rel=1e-6) and noisy.rho(4096) == pytest.approx(1.0, rel=1e-6)
    clean = lr_aware_rho(256, 1e-9, 0.0)
    assert clean.rho(4096) == pytest.approx(4.0, rel=1e-6)
    # past the lr where an update stops making progress: infinite, with a note that says so
    edge = lr_aware_rho(256, 100.0, 0.6)
    assert math.isinf(edge.rho(4096)) and any("infinite" in n for n in edge.notes(4096))
    assert math.isfinite(edge.rho(512))
    for bend, kappa in ((100.0, 1.0), (100.0, -0.1), (0.0, 0.2), (float("nan"), 0.2)):
        with pytest.raises(RlsimError, match="out of range"):
            lr_aware_rho(256, bend, kappa)


def _linear_curve(batch, n_star, lr, budget=None, target=0.5):
    """Score rising linearly in responses so that it crosses `target` exactly at n_star; stops at `budget`."""
    n = np.linspace(0, budget or 2 * n_star, 41)
    return LearningCurve(n, target * n / n_star, responses_per_update=batch, lr_rule="sqrt", lr=lr)


def test_fit_lr_aware_recovers_known_constants():
    bend = 256 * 2 ** 2.25  # on the fit's grid
    truth = lr_aware_rho(256, bend, 0.5)
    ref = _linear_curve(256, 10_000.0, 3e-4)
    curves = [ref]
    for b, x in ((64, 0.5), (128, 2 ** -0.5), (512, 2 ** 0.5), (512, 1.0), (1024, 2.0)):
        curves.append(_linear_curve(b, 10_000.0 * truth.rho(b, x=x), 3e-4 * x))
    # a censored run: it stopped before its (true) samples-to-target; as a lower bound it must not drag the fit
    n_2048 = 10_000.0 * truth.rho(2048, x=8 ** 0.5)
    curves.append(_linear_curve(2048, n_2048, 3e-4 * 8 ** 0.5, budget=0.5 * n_2048))
    pts = rho_points(ref, curves, 0.5)
    assert len(pts) == 6 and pts[-1][3] and pts[-1][2] == pytest.approx(truth.rho(2048, x=8 ** 0.5) / 2)
    f = fit_lr_aware(ref, curves, 0.5)
    assert f.runs == 6 and f.loss < 1e-3
    assert f.b_bend == pytest.approx(bend, rel=0.01)
    assert f.kappa == pytest.approx(0.5, abs=0.011)
    with pytest.raises(RlsimError, match="other batch sizes"):
        fit_lr_aware(ref, [ref], 0.5)


def test_parse_rho():
    assert parse_rho("auto") == ("auto", None)
    assert parse_rho("lr-aware:3000,0.6") == ("lr-aware", (3000.0, 0.6))
    for bad, msg in (("magic", "--rho must be one of"), ("noise-scale:1,2", "go with --rho lr-aware"),
                     ("lr-aware:8", "expected 'B_BEND,KAPPA'")):
        with pytest.raises(RlsimError, match=msg):
            parse_rho(bad)
