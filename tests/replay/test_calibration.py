"""Calibrated step-cost fits (replay/calibration.py): known coefficients recovered, hand-computed
cross-validation, the form chosen by held-out error, old traces read with a warning."""
import math
from pathlib import Path

import numpy as np
import pytest

from rlsim.replay.calibration import fit_gen_calibrated, fit_train_calibrated, level_key
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN, EVENT_KINDS, KIND_SINCE, SCHEMA_VERSION, columns_for_version
from rlsim.replay.synthetic import SynthSpec, calibration_rows, synthetic_trace, true_step_seconds

ROOT = Path(__file__).resolve().parents[2]


def _rows(spec: SynthSpec) -> dict[str, np.ndarray]:
    rows = [r for r in calibration_rows(spec) if r["kind"] == CALIB_GEN]
    return {k: np.array([r[k] for r in rows], float) for k in ("duration", "num_running", "context_tokens", "prefill_tokens")}


def test_calibration_kinds_are_schema_v2():
    assert SCHEMA_VERSION >= 2 and {CALIB_GEN, CALIB_TRAIN} <= set(EVENT_KINDS)
    assert KIND_SINCE[CALIB_GEN] == KIND_SINCE[CALIB_TRAIN] == 2
    assert "calib_level" in columns_for_version(2) and "calib_level" not in columns_for_version(1)


def test_fit_recovers_a_knee_and_its_coefficients():
    spec = SynthSpec(prompts=16, group=4, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, c_ctx=2e-7, c_prefill=1e-6,
                     c_knee=2e-4, knee=200, noise=0.005, calib_steps=12)
    f = fit_gen_calibrated(_rows(spec))
    assert f.form == "knee"
    c_step, c_seq, c_ctx, c_prefill, c_knee, knee = f.coef
    assert knee == pytest.approx(200, rel=0.08)
    assert c_step == pytest.approx(2e-3, rel=0.05) and c_seq == pytest.approx(1e-4, rel=0.05)
    assert c_knee == pytest.approx(2e-4, rel=0.05) and c_prefill == pytest.approx(1e-6, rel=0.25)
    assert f.cv["knee"][0] < 0.05 and f.cv["linear"][0] > 2 * f.cv["knee"][0]  # the linear form misses held-out levels, the knee does not
    # a concave curve (slope falls above the knee) is the same form with c_knee < 0
    g = fit_gen_calibrated(_rows(SynthSpec(prompts=16, group=4, max_num_seqs=1024, c_step=2e-3, c_seq=2e-4,
                                           c_knee=-1.5e-4, knee=64, noise=0.005, calib_steps=12)))
    assert g.form == "knee" and g.coef[4] == pytest.approx(-1.5e-4, rel=0.1) and g.coef[5] == pytest.approx(64, rel=0.15)


def test_a_straight_line_keeps_the_linear_form():
    f = fit_gen_calibrated(_rows(SynthSpec(prompts=16, group=4, max_num_seqs=1024, noise=0.01, calib_steps=12)))
    assert f.form == "linear" and f.coef[4] == 0
    assert f.coef[1] == pytest.approx(SynthSpec().c_seq, rel=0.05)


def test_cross_validation_by_hand():
    """Three levels of one step each, t = 2, 3, 6 ms at n = 1, 2, 4, no context or prefill. Leaving a level out
    fits the line through the other two: n=1 from (2, 3), (4, 6): 1.5 ms -> -25 %; n=2 from (1, 2), (4, 6):
    2/3 + 4/3 * 2 = 10/3 ms -> +1/9; n=4 from (1, 2), (2, 3): 5 ms -> -1/6."""
    rows = {"duration": np.array([2e-3, 3e-3, 6e-3]), "num_running": np.array([1.0, 2.0, 4.0]),
            "context_tokens": np.zeros(3), "prefill_tokens": np.zeros(3)}
    f = fit_gen_calibrated(rows, forms=("linear",))
    rms, worst, levels = f.cv["linear"]
    assert [lv.level for lv in levels] == [1, 2, 4]
    assert [lv.rel_err for lv in levels] == pytest.approx([-0.25, 1 / 9, -1 / 6], abs=1e-6)
    assert rms == pytest.approx(math.sqrt((1 / 16 + 1 / 81 + 1 / 36) / 3), rel=1e-6) and worst == pytest.approx(0.25)
    # training: token levels 100, 200, 400 at 0.2, 0.3, 0.6 s: the same numbers
    t = fit_train_calibrated([100, 200, 400], [0.2, 0.3, 0.6], [1, 2, 3])
    assert [lv.rel_err for lv in t.levels] == pytest.approx([-0.25, 1 / 9, -1 / 6], abs=1e-6)


def test_levels_are_half_octaves():
    assert list(level_key([1, 2, 3, 4, 1024, 1000])) == [0, 2, 3, 4, 20, 20]


def test_fit_trace_uses_calibration_rows(tmp_path):
    spec = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, c_knee=2e-4, knee=200,
                     calibrate=True, noise=0.02)
    m = fit_trace(read_trace(synthetic_trace(tmp_path / "c.parquet", spec)))
    assert m.gen.form == "knee" and m.validation.calibrated and m.validation.gen_form == "knee"
    assert m.gen.concurrency_range == (1, 1024)
    assert m.update.slope == pytest.approx(spec.update_b, rel=0.05) and m.update.intercept == pytest.approx(spec.update_a, rel=0.2)
    n = np.array([1, 64, 256, 1024])
    assert m.gen.predict(n, 20 * n) == pytest.approx(true_step_seconds(spec, n, 20 * n, 0), rel=0.05)
    assert m.replicates is not None and len(m.replicates) >= 32
    assert not any("rlrun calibrate" in w for w in m.warnings)


def test_a_v1_trace_reads_and_fits_as_before_with_a_warning():
    t = read_trace(ROOT / "tests" / "golden" / "traces" / "grpo_p32.parquet")  # as shipped before calibration
    assert t.meta["schema_version"] == 1 and t.count(CALIB_GEN) == 0 and np.all(np.isnan(t.table["calib_level"].to_numpy(zero_copy_only=False).astype(float)))
    m = fit_trace(t)
    assert m.gen.form == "linear" and m.gen.c_knee == 0 and not m.validation.calibrated
    assert any("rlrun calibrate" in w for w in m.warnings)
    assert math.isfinite(m.validation.gen_cv)


def test_a_calibration_at_other_threads_stands_for_its_device_unanchored(tmp_path):
    # the run at 2 threads; `rlrun calibrate --threads 1` measured steps and training passes twice as slow
    fast = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, calibrate=True, noise=0.01)
    slow = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=4e-3, c_seq=2e-4, calibrate=True, noise=0.01,
                     calib_train_a=0.008, update_b=2 * fast.update_b)
    ref = read_trace(synthetic_trace(tmp_path / "run.parquet", fast, meta_overrides={"calibration": {"threads": 2}}))
    n = np.array([1.0, 64, 512])
    for threads, want in ((1, slow), (2, fast)):
        cal = read_trace(synthetic_trace(tmp_path / f"cal{threads}.parquet", slow,
                                         meta_overrides={"calibration": {"threads": threads}}))
        m = fit_trace(ref, calibration=[cal])
        # at another thread count the calibration is taken as measured; at the run's own it is put on the run's clock
        assert m.gen.predict(n, 20 * n) == pytest.approx(true_step_seconds(want, n, 20 * n, 0), rel=0.1), threads
        assert m.update.slope == pytest.approx(want.update_b, rel=0.1), threads
        assert any("thread" in note for note in m.validation.notes) == (threads == 1)


def test_run_level_is_the_runs_total_over_the_predicted_total():
    from rlsim.replay.calibration import run_level

    coef = np.array([2e-3, 1e-4, 0.0, 0.0, 0.0, 0.0])
    n = np.arange(1, 41, dtype=float)
    run = {"num_running": n, "context_tokens": 20 * n, "prefill_tokens": np.zeros_like(n),
           "duration": 1.1 * (2e-3 + 1e-4 * n)}
    assert run_level(coef, run) == pytest.approx(1.1)
    assert math.isnan(run_level(coef, {k: v[:5] for k, v in run.items()}))  # too few run steps to set a level


def test_the_calibrated_fit_sums_to_the_runs_own_engine_time(tmp_path):
    # the calibration ladder (a knee) and the run agree in shape but the run's steps carry skewed noise: the
    # level-weighted fit alone can pass a few % off the run's operating point; the fit's level is the run's
    spec = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, c_knee=2e-4, knee=200,
                     calibrate=True, noise=0.15)
    t = read_trace(synthetic_trace(tmp_path / "c.parquet", spec))
    m = fit_trace(t)
    g = t.rows("gen_step")
    keep = g["step"] > 0 if "step" in g else np.ones(len(g["duration"]), bool)
    pred = m.gen.predict(g["num_running"][keep], g["context_tokens"][keep], g["prefill_tokens"][keep])
    assert pred.sum() == pytest.approx(g["duration"][keep].sum(), rel=0.005)  # without the level: 1.4 % low
