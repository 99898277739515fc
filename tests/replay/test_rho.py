"""The rho models as a registry of small classes: each registered under its name, with its own parameters,
answering the same four questions (rho, notes, bounds, outside)."""
import dataclasses
import math
import pickle

import numpy as np
import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.learning import LearningCurve
from rlsim.replay.rho import (RHO_MODELS, RHO_REGISTRY, CurvesRho, InvariantRho, LrAwareRho, NoiseScaleRho, RhoModel,
                              curves_rho, get_rho_model, invariant_rho, lr_aware_rho, noise_scale_ratio,
                              noise_scale_rho, register_rho)


def test_registry_names_every_model_once_and_auto_last():
    assert RHO_MODELS == ("invariant", "noise-scale", "curves", "lr-aware", "auto")
    assert (RHO_REGISTRY == {"invariant": InvariantRho, "noise-scale": NoiseScaleRho, "curves": CurvesRho,
                             "lr-aware": LrAwareRho})
    for name, cls in RHO_REGISTRY.items():
        assert cls.kind == name and issubclass(cls, RhoModel) and get_rho_model(name) is cls
    with pytest.raises(RlsimError, match="unknown rho model 'magic'"):
        get_rho_model("magic")


def test_register_refuses_a_second_class_under_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        @register_rho("curves")
        @dataclasses.dataclass(frozen=True)
        class Other(RhoModel):
            pass
    assert RHO_REGISTRY["curves"] is CurvesRho
    assert register_rho("curves")(CurvesRho) is CurvesRho  # registering the same class again is harmless


def test_each_model_carries_the_parameters_named_for_what_they_are():
    names = {cls: [f.name for f in dataclasses.fields(cls)] for cls in RHO_REGISTRY.values()}
    assert names[InvariantRho] == ["b_ref", "invariant_range", "assumed"]
    assert names[NoiseScaleRho] == ["b_ref", "b_crit"]
    assert names[CurvesRho] == ["b_ref", "log_b", "n_star", "lr_rules"]
    assert names[LrAwareRho] == ["b_ref", "b_bend", "kappa", "lr_rule", "source"]  # the bend batch is not a B_crit
    assert ([cls.follows_lr_rule for cls in (InvariantRho, NoiseScaleRho, CurvesRho, LrAwareRho)]
            == [False, False, True, True])


def test_models_are_frozen_and_picklable():
    # a Study holding one is shipped to sweep workers
    m = lr_aware_rho(256, 900.0, 0.3, source="fitted on 4 runs")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.kappa = 0.5
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back.kind == "lr-aware" and back.rho(1024) == m.rho(1024)


def test_every_model_answers_the_four_questions():
    def curve(b, n_star):
        n = np.linspace(0, 2 * n_star, 21)
        return LearningCurve(n, 0.5 * n / n_star, responses_per_update=b, lr_rule="sqrt")

    models = [invariant_rho(256), invariant_rho(256, assumed=True), noise_scale_rho(256, 1000.0),
              curves_rho(256, [curve(256, 1e4), curve(1024, 2e4)], 0.5), lr_aware_rho(256, 500.0, 0.1)]
    for m in models:
        assert m.rho(256) == pytest.approx(1.0)
        for b in (64, 4096):
            r, out, bounds, notes = m.rho(b), m.outside(b), m.bounds(b), m.notes(b)
            assert r > 0 and isinstance(out, bool) and isinstance(notes, list)
            # bounds exactly where rho is not measured, and they hold the point estimate
            assert (bounds is not None) == out
            if out:
                assert bounds[0] <= r + 1e-12 and r <= bounds[1] + 1e-12 and notes


def test_assumed_invariant_is_bounded_asked_for_is_not():
    assumed, asked = invariant_rho(512, assumed=True), invariant_rho(512)
    assert assumed.bounds(2048) == (1.0, 4.0) and assumed.bounds(128) == (0.25, 1.0) and assumed.bounds(512) is None
    assert asked.bounds(2048) is None and not asked.outside(2048)
    assert any("rho = 1 is assumed" in n for n in assumed.notes(2048))
    assert asked.notes(2048) == [] and any("outside the 16x range" in n for n in asked.notes(512 * 32))


def test_noise_scale_ratio_takes_bootstrap_replicates():
    reps = np.array([500.0, 1000.0, 2000.0])
    got = noise_scale_ratio(1024, 256, reps)
    assert got == pytest.approx([noise_scale_rho(256, b).rho(1024) for b in reps])


def test_lr_aware_ignores_nothing_the_others_ignore_the_lr_rule():
    ns, la = noise_scale_rho(256, 1000.0), lr_aware_rho(256, 1000.0, 0.2)
    assert ns.rho(1024, "fixed") == ns.rho(1024, "sqrt") == ns.rho(1024)
    assert la.rho(1024, "fixed") != la.rho(1024, "sqrt") == la.rho(1024)
    assert math.isinf(lr_aware_rho(256, 100.0, 0.6).rho(4096))
