"""The benches' analysis helpers on hand-made inputs (the recordings themselves are bench runs, not tests)."""
import math

import numpy as np
import pytest

from bench.batch_study import kendall_tau
from bench.extrapolation import speed_factors


def test_kendall_tau_hand_cases():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one discordant pair (3, 4) of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)
    assert math.isnan(kendall_tau([1, 1], [2, 2]))


def test_speed_factors_recover_a_drift_per_recording():
    # each recording ran at its own speed s; a prediction fitted on a and checked on b is off by s_a / s_b
    s = {"a": 1.0, "b": 1.2, "c": 0.9, "d": 1.05}
    rows = [{"fit": x, "predict": y, "rps_err": s[x] / s[y] - 1} for x in s for y in s if x != y]
    out = speed_factors(rows)
    assert out["residual_max_abs"] < 1e-9
    g = np.exp(np.mean(np.log(list(s.values()))))  # the factors come out relative to their geometric mean
    for k, v in s.items():
        assert out["factors"][k] == pytest.approx(v / g)
    # a model error on one pair that no speed factor explains stays in the residual
    rows[0]["rps_err"] = (1 + rows[0]["rps_err"]) * 1.3 - 1
    assert speed_factors(rows)["residual_max_abs"] > 0.1
