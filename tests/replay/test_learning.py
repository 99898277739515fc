"""Learning curves, the gradient noise scale, and the rho models against hand-computed values."""
import math

import numpy as np
import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.learning import (LearningCurve, curves_rho, ema_ratio, invariant_rho, noise_scale, noise_scale_rho, regime,
                             two_batch_estimates)
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
        return LearningCurve(n.astype(float), 1 - np.exp(-n / scale), batch=b, lr_rule="sqrt")

    # N* for target 0.5 = scale * ln 2
    cs = [curve(256, 1000.0), curve(1024, 1000.0), curve(4096, 1600.0)]
    m = curves_rho(256, cs, 0.5)
    n = [c.samples_to_target(0.5) for c in cs]
    assert m.rho(256) == pytest.approx(1.0)
    assert m.rho(4096) == pytest.approx(n[2] / n[0])
    # 2048 is halfway between 1024 and 4096 in log batch
    assert m.rho(2048) == pytest.approx((n[1] + n[2]) / 2 / n[0])
    assert m.rho(8192) == pytest.approx(m.rho(4096))  # clamped
    assert m.notes(8192)
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
