"""Calibrated step-cost fits (replay/calibration.py): known coefficients recovered, hand-computed
cross-validation, the interpolated form over a calibration ladder (exact at its knots, close between them,
non-decreasing), linear or knee by held-out error without one, the training interpolation, old traces read
with a warning."""
import math
from pathlib import Path

import numpy as np
import pytest

from rlsim.replay.calibration import fit_gen_calibrated, fit_train_calibrated, level_key
from rlsim.replay.cost import EngineStepCost
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN, EVENT_KINDS, KIND_SINCE, SCHEMA_VERSION, columns_for_version
from rlsim.replay.synthetic import SynthSpec, calibration_rows, synthetic_trace, true_step_seconds

ROOT = Path(__file__).resolve().parents[2]


def _rows(spec: SynthSpec) -> dict[str, np.ndarray]:
    rows = [r for r in calibration_rows(spec) if r["kind"] == CALIB_GEN]
    return {k: np.array([r[k] for r in rows], float)
            for k in ("duration", "num_running", "context_tokens", "prefill_tokens")}


def test_calibration_kinds_are_schema_v2():
    assert SCHEMA_VERSION >= 2 and {CALIB_GEN, CALIB_TRAIN} <= set(EVENT_KINDS)
    assert KIND_SINCE[CALIB_GEN] == KIND_SINCE[CALIB_TRAIN] == 2
    assert "calib_level" in columns_for_version(2) and "calib_level" not in columns_for_version(1)


def test_fit_recovers_a_knee_and_its_coefficients():
    spec = SynthSpec(prompts=16, group=4, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, c_ctx=2e-7, c_prefill=1e-6,
                     c_knee=2e-4, knee=200, noise=0.005, calib_steps=12)
    f0 = fit_gen_calibrated(_rows(spec))  # a sharp knee between rungs: the knee form predicts held-out levels best
    assert f0.form == "knee" and f0.cv["knee"][0] < f0.cv["interp"][0]
    f = fit_gen_calibrated(_rows(spec), forms=("linear", "knee"))  # the parametric forms, as without a ladder
    assert f.form == "knee"
    c_step, c_seq, c_ctx, c_prefill, c_knee, knee = f.coef
    assert knee == pytest.approx(200, rel=0.08)
    assert c_step == pytest.approx(2e-3, rel=0.05) and c_seq == pytest.approx(1e-4, rel=0.05)
    assert c_knee == pytest.approx(2e-4, rel=0.05) and c_prefill == pytest.approx(1e-6, rel=0.25)
    # the linear form misses held-out levels, the knee does not
    assert f.cv["knee"][0] < 0.05 and f.cv["linear"][0] > 2 * f.cv["knee"][0]
    # a concave curve (slope falls above the knee) is the same form with c_knee < 0
    g = fit_gen_calibrated(_rows(SynthSpec(prompts=16, group=4, max_num_seqs=1024, c_step=2e-3, c_seq=2e-4,
                                           c_knee=-1.5e-4, knee=64, noise=0.005, calib_steps=12)),
                           forms=("linear", "knee"))
    assert (g.form == "knee" and g.coef[4] == pytest.approx(-1.5e-4, rel=0.1)
            and g.coef[5] == pytest.approx(64, rel=0.15))


def test_a_straight_line_keeps_the_linear_form():
    rows = _rows(SynthSpec(prompts=16, group=4, max_num_seqs=1024, noise=0.01, calib_steps=12))
    f = fit_gen_calibrated(rows, forms=("linear", "knee"))
    assert f.form == "linear" and len(f.coef) == 4
    assert f.coef[1] == pytest.approx(SynthSpec().c_seq, rel=0.05)
    g = fit_gen_calibrated(rows)  # interpolating a straight line costs little out of sample; the line is kept
    assert g.form == "linear" and g.cv["interp"][0] < 0.02 and g.cv["linear"][0] < 0.02


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
    v = m.validation
    # a sharp knee: the form that predicts held-out levels best is the knee; all three were cross-validated
    assert m.gen.form == v.gen_form == "knee" and v.calibrated
    assert v.gen_cv == v.gen_cv_knee <= v.gen_cv_interp and math.isfinite(v.gen_cv_linear)
    assert "leave-one-level-out" in v.summary()[0]
    assert m.gen.concurrency_range == (1, 1024)
    tok = np.array([2e3, 1e4, 4e4])
    assert m.update.predict(tok) == pytest.approx(spec.update_a + spec.update_b * tok, rel=0.05)
    n = np.array([1, 64, 256, 1024])
    assert m.gen.predict(n, 20 * n) == pytest.approx(true_step_seconds(spec, n, 20 * n, 0), rel=0.05)
    assert m.replicates is not None and len(m.replicates) >= 32
    assert m.replicates.gen.shape[1] == 4 + 2 * len(m.gen.hinges)
    assert m.replicates.update_seconds(tok).shape == (len(m.replicates), 3)
    assert not any("rlrun calibrate" in w for w in m.warnings)


def test_a_v1_trace_reads_and_fits_as_before_with_a_warning():
    t = read_trace(ROOT / "tests" / "golden" / "traces" / "grpo_p32.parquet")  # as shipped before calibration
    assert (t.meta["schema_version"] == 1 and t.count(CALIB_GEN) == 0
            and np.all(np.isnan(t.table["calib_level"].to_numpy(zero_copy_only=False).astype(float))))
    m = fit_trace(t)
    assert m.gen.form == "linear" and m.gen.hinges == () and not m.validation.calibrated
    assert any("rlrun calibrate" in w for w in m.warnings)
    assert math.isfinite(m.validation.gen_cv)


def test_a_calibration_at_other_threads_stands_for_its_device_unanchored(tmp_path):
    # the run at 2 threads; `rlrun calibrate --threads 1` measured steps and training passes twice as slow
    fast = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, calibrate=True,
                     noise=0.01)
    slow = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=4e-3, c_seq=2e-4, calibrate=True,
                     noise=0.01, calib_train_a=0.008, update_b=2 * fast.update_b)
    ref = read_trace(synthetic_trace(tmp_path / "run.parquet", fast, meta_overrides={"calibration": {"threads": 2}}))
    n = np.array([1.0, 64, 512])
    for threads, want in ((1, slow), (2, fast)):
        cal = read_trace(synthetic_trace(tmp_path / f"cal{threads}.parquet", slow,
                                         meta_overrides={"calibration": {"threads": threads}}))
        m = fit_trace(ref, calibration=[cal])
        # at another thread count the calibration is taken as measured; at the run's own it is put on the run's clock
        assert m.gen.predict(n, 20 * n) == pytest.approx(true_step_seconds(want, n, 20 * n, 0), rel=0.1), threads
        slope = float(np.diff(m.update.predict([5e3, 2e4]))[0]) / 1.5e4
        assert slope == pytest.approx(want.update_b, rel=0.1), threads
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


# --------------------------------------------------------------------------------------------- interpolated form
def _ladder(f, levels, steps: int = 12, c_ctx: float = 2e-7, c_prefill: float = 1e-6, noise: float = 0.0,
            seed: int = 0):
    """Calibration rows at each concurrency level: a prefill step then decode steps (context grows by n per step)."""
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("duration", "num_running", "context_tokens", "prefill_tokens")}
    for n in levels:
        for k in range(steps + 1):
            ctx, pre = n * (20 + k), (20 * n if k == 0 else 0)
            rows["duration"].append((f(n) + c_ctx * ctx + c_prefill * pre) * (1 + noise * rng.standard_normal()))
            rows["num_running"].append(n)
            rows["context_tokens"].append(ctx)
            rows["prefill_tokens"].append(pre)
    return {k: np.array(v, float) for k, v in rows.items()}


def _s_curve(n):
    """Monotone, convex below ~150 running and concave above: a fixed cost, a per-sequence cost, and a 4 ms rise
    (a Hill function of n, half-way at 256) that speeds up and then saturates."""
    n = np.asarray(n, float)
    return 3e-3 + 2e-5 * n + 4e-3 * n ** 1.5 / (n ** 1.5 + 256.0 ** 1.5)


HALF_OCTAVES = np.unique(np.round(2 ** (np.arange(0, 21) / 2))).astype(int)  # 1, 1.4, 2, 2.8, ... 1024


def test_interpolation_reproduces_a_curve_at_its_knots_and_between_them():
    rows = _ladder(_s_curve, HALF_OCTAVES)
    f = fit_gen_calibrated(rows)
    assert f.form == "interp" and f.knots == len(HALF_OCTAVES)
    cost = EngineStepCost.from_array(f.coef)
    # exact at the knots (no noise): the curve passes through every measured level, context and prefill recovered
    assert cost.step(HALF_OCTAVES, 0.0) == pytest.approx(_s_curve(HALF_OCTAVES), rel=1e-6)
    assert (cost.c_ctx, cost.c_prefill) == pytest.approx((2e-7, 1e-6), rel=1e-4)
    # each level held out is predicted from its neighbours within 1 %; the linear and knee forms miss by far more
    rms, worst, levels = f.cv["interp"]
    assert worst < 0.01 and len(levels) == len(HALF_OCTAVES)
    assert f.cv["linear"][0] > 5 * rms and f.cv["knee"][0] > 2 * rms
    # and between the levels (mid-points in log n), within 1 %
    mid = np.sqrt(HALF_OCTAVES[1:] * HALF_OCTAVES[:-1])
    assert cost.step(mid, 0.0) == pytest.approx(_s_curve(mid), rel=0.01)
    # beyond the ends the end segments continue straight (parametric extrapolation)
    top, below = HALF_OCTAVES[-2:], HALF_OCTAVES[-1] * 2
    slope = np.diff(_s_curve(top))[0] / np.diff(top)[0]
    assert cost.step(below, 0.0) == pytest.approx(_s_curve(top[-1]) + slope * (below - top[-1]), rel=1e-6)


def test_interpolation_is_non_decreasing_through_a_noisy_dip():
    # level 64 measured 25 % low (a dip no engine has: more sequences never take less time), 3 % noise elsewhere
    dip = lambda n: _s_curve(n) * (0.75 if n == 64 else 1.0)  # noqa: E731
    f = fit_gen_calibrated(_ladder(dip, HALF_OCTAVES, noise=0.03, seed=1), forms=("interp",))
    assert f.form == "interp"
    cost = EngineStepCost.from_array(f.coef)
    grid = np.arange(1, 2049, dtype=float)
    assert np.all(np.diff(cost.step(grid, 0.0)) >= -1e-12)
    slopes = cost.c_seq + np.concatenate([[0.0], np.cumsum(cost.dslopes)])
    assert np.all(slopes >= -1e-15)


def test_interpolation_knots_are_the_calibrations_rungs_not_the_runs_tail():
    cal = _ladder(_s_curve, [1, 2, 4, 8, 16, 32, 64, 128])
    run = _ladder(lambda n: 1.3 * _s_curve(n), [3, 6], steps=20)  # a run's tail levels, slower: not knots
    rows = {k: np.concatenate([cal[k], run[k]]) for k in cal}
    f = fit_gen_calibrated(rows, cal=np.arange(len(rows["duration"])) < len(cal["duration"]))
    assert (f.form == "interp" and f.knots == 8
            and sorted(EngineStepCost.from_array(f.coef).knees) == [2, 4, 8, 16, 32, 64])
    few = fit_gen_calibrated(_ladder(_s_curve, [1, 4, 16]))  # three rungs: too few to interpolate, the parametric forms
    assert few.form in ("linear", "knee") and "interp" not in few.cv


def test_training_interpolation_and_its_extrapolation():
    # forward + backward at five token levels: a fixed cost, then a slope that rises (attention) and saturates
    x = np.array([1e3, 4e3, 1.6e4, 6.4e4, 2.56e5])
    fb = lambda t: 0.01 + 2e-5 * t + 1e-10 * t ** 2 / (1 + t / 1e5)  # noqa: E731
    tok, dur, lev = np.repeat(x, 3), np.repeat(fb(x), 3), np.repeat(np.arange(5), 3)
    dur = dur * np.tile([1.0, 1.02, 0.99], 5)  # the median of each level's passes is the measured value
    t = fit_train_calibrated(tok, dur, lev)
    assert t.curve.predict(x) == pytest.approx(fb(x), rel=1e-9)  # exact at the levels
    mid = np.sqrt(x[1:] * x[:-1])
    assert t.curve.predict(mid) == pytest.approx(fb(mid), rel=0.05)  # close between them
    # leave-one-level-out: the inner levels from their neighbours, the end ones along the line through the next two
    assert [lv.level for lv in t.levels] == list(x)
    inner = [lv.rel_err for lv in t.levels[1:-1]]
    want = [(fb(x[i - 1]) + (fb(x[i + 1]) - fb(x[i - 1])) * (x[i] - x[i - 1]) / (x[i + 1] - x[i - 1])) / fb(x[i]) - 1
            for i in range(1, 4)]
    assert inner == pytest.approx(want, rel=1e-9)
    top = fb(x[3]) + (fb(x[3]) - fb(x[2])) / (x[3] - x[2]) * (x[4] - x[3])
    assert t.levels[-1].rel_err == pytest.approx(top / fb(x[4]) - 1, rel=1e-9)
    assert t.cv == pytest.approx(math.sqrt(np.mean([lv.rel_err ** 2 for lv in t.levels])))
    assert t.cv_max == pytest.approx(max(abs(lv.rel_err) for lv in t.levels))
    # beyond the ends: the straight line through the two end levels (parametric extrapolation)
    s_hi = (fb(x[4]) - fb(x[3])) / (x[4] - x[3])
    assert t.curve.predict(1e6) == pytest.approx(fb(x[4]) + s_hi * (1e6 - x[4]), rel=1e-9)
    s_lo = (fb(x[1]) - fb(x[0])) / (x[1] - x[0])
    assert t.curve.predict(500.0) == pytest.approx(fb(x[0]) - s_lo * 500.0, rel=1e-9)
    # a slower larger level is noise: made non-decreasing first; a line that would go below 0 at 0 tokens starts at 0
    u = fit_train_calibrated([1e3, 2e3, 4e3, 8e3], [0.5, 0.45, 1.0, 2.0], [0, 1, 2, 3])
    assert u.curve.values == pytest.approx((0.475, 0.475, 1.0, 2.0))
    v = fit_train_calibrated([1e3, 2e3, 4e3], [0.1, 0.3, 0.7], [0, 1, 2])
    assert v.curve.predict([0.0, 500.0]) == pytest.approx([0.0, 0.05])
