"""rlsim.replay.drift on synthetic drift probes: the slowness per probe, its interpolation, and the fit using it."""
from __future__ import annotations

import numpy as np

from rlsim.replay.drift import Drift, drift_of, moved
from rlsim.replay.io import TraceWriter, read_trace

SLOW = [1.0, 1.0, 1.2, 1.2, 0.9]  # the machine's slowness at probes after updates 0, 4, 8, 12, 16


def write_drift(path, slow=SLOW, version=4):
    meta = {"seed": 0, "config": {"algo": "grpo", "prompts": 4, "group": 2, "batch": 8}, "schema_version": version}
    with TraceWriter(path, meta) as w:
        for i, f in enumerate(slow):
            step, t = 4 * i, 10.0 * i
            # the prefill step: not used
            w.add("drift_gen", t_start=t, duration=0.05 * f, step=step, policy_version=step, num_running=8,
                  num_waiting=0, prefill_tokens=40, decode_tokens=8, context_tokens=40, calib_level=8)
            for k in range(1, 7):
                w.add("drift_gen", t_start=t + 0.01 * k, duration=0.01 * f * (1 + 0.01 * (k % 2)), step=step,
                      policy_version=step, num_running=8, num_waiting=0, prefill_tokens=0, decode_tokens=8,
                      context_tokens=40 + 8 * k, calib_level=8)
            w.add("drift_train", t_start=t + 0.2, duration=0.3 * f, step=step, policy_version=step, num_responses=2,
                  num_tokens=60, t_forward=0.1 * f, t_backward=0.2 * f, calib_level=2)
            w.flush()
    return path


def test_slowness_per_probe_relative_to_the_median(tmp_path):
    d = drift_of(read_trace(write_drift(tmp_path / "d.parquet")))
    assert d is not None and len(d.t) == 5
    np.testing.assert_allclose(d.train, np.array(SLOW) / 1.0, rtol=1e-9)
    np.testing.assert_allclose(d.gen, np.array(SLOW), rtol=0.02)
    # between probes: linear in time; outside: the nearest probe's value
    assert (abs(d.factor("train", 15.0) - 1.1) < 1e-9 and d.factor("train", -5.0) == 1.0
            and abs(d.factor("train", 99.0) - 0.9) < 1e-12)
    assert np.allclose(d.spread("train"), (0.9, 1.2)) and moved(d) and "0.90x..1.20x" in d.describe()


def test_no_drift_without_enough_probes(tmp_path):
    assert drift_of(read_trace(write_drift(tmp_path / "d.parquet", slow=[1.0, 1.1]))) is None


def test_steady_machine_has_not_moved():
    d = Drift(np.array([0.0, 1.0, 2.0]), np.ones(3), np.array([1.0, 1.01, 0.99]))
    assert not moved(d) and moved(d, tolerance=0.005)
