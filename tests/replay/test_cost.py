"""The engine-step cost model (replay/cost.py): one formula per step, per stretch, summed over steps and over
replicate coefficient rows; the fits' parametrisation; GenStepModel is it; the roofline prior's bandwidth."""
import numpy as np
import pytest

from rlsim.replay.cost import COEFS, FEATURES, EngineStepCost, StepSums
from rlsim.replay.robust import FitQuality
from rlsim.replay.models import GenStepModel
from rlsim.replay.fit import default_bandwidth_gbs

KNEE = EngineStepCost(2e-3, 1e-4, 2e-7, 1e-6, hinges=((37.5, -4e-5),))
# the interpolated form: a hinge per measured level, the slope rising then falling (convex, then concave)
INTERP = EngineStepCost(2e-3, 1e-5, 2e-7, 1e-6,
                        hinges=((2.0, 5e-6), (4.0, 2e-5), (16.0, 8e-5), (64.0, -5e-5), (256.0, -4e-5)))


def by_hand(c: EngineStepCost, n, ctx, pre):
    n = np.asarray(n, float)
    return (c.c_step * (n > 0) + c.c_seq * n + c.c_ctx * np.asarray(ctx, float) + c.c_prefill * np.asarray(pre, float)
            + sum(d * np.maximum(n - k, 0.0) for k, d in c.hinges))


def test_a_step_is_the_formula_of_its_features():
    n, ctx, pre = np.array([1, 20, 37, 38, 200]), np.array([5, 400, 900, 1000, 9000]), np.array([5, 0, 0, 30, 0])
    assert KNEE.step(n, ctx, pre) == pytest.approx(by_hand(KNEE, n, ctx, pre), rel=1e-12)
    f = EngineStepCost.features(n, ctx, pre, KNEE.knees)
    assert f.shape == (5, len(FEATURES) + 1) and f @ KNEE.linear == pytest.approx(KNEE.step(n, ctx, pre), rel=1e-12)
    assert INTERP.step(n, ctx, pre) == pytest.approx(by_hand(INTERP, n, ctx, pre), rel=1e-12)
    assert np.ndim(KNEE.step(3, 30.0)) == 0  # scalars in, a scalar out


def test_a_step_with_nothing_running_costs_nothing():
    assert KNEE.step(0, 0.0) == 0.0  # no sequence, no step: c_step is not charged
    assert KNEE.step(1, 0.0) == pytest.approx(KNEE.c_step + KNEE.c_seq)
    assert KNEE.stretch(3, 0, 0.0) == 0.0


@pytest.mark.parametrize("cost", [KNEE, INTERP])
@pytest.mark.parametrize("k,n,ctx0,pre", [(1, 5, 50.0, 50.0), (7, 40, 1234.0, 0.0), (12, 3, 9.0, 7.0),
                                          (4, 300, 9e3, 0.0)])
def test_a_stretch_in_closed_form_is_the_sum_of_its_steps(cost, k, n, ctx0, pre):
    d = cost.stretch_steps(k, n, ctx0, pre)
    assert d == pytest.approx(by_hand(cost, n, ctx0 + n * np.arange(k), np.r_[pre, np.zeros(k - 1)]), rel=1e-12)
    assert cost.stretch(k, n, ctx0, pre) == pytest.approx(d.sum(), rel=1e-12)
    assert cost.total(StepSums.of_stretch(k, n, ctx0, pre, hist=True)) == pytest.approx(d.sum(), rel=1e-12)


def test_totals_price_summed_steps_under_every_replicate_row():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 80, 500)
    ctx, pre = n * rng.uniform(10, 50, 500), np.where(rng.random(500) < 0.1, 100.0, 0.0)
    sums = StepSums.of_steps(n, ctx, pre, hist=True)
    coefs = np.column_stack([rng.uniform(0, 1e-3, (8, 4)), rng.uniform(-1e-5, 1e-5, 8), rng.uniform(5, 60, 8)])
    coefs[:3, 4] = 0.0  # linear rows (a hinge of no slope change) beside knee rows
    want = [EngineStepCost.from_array(c).step(n, ctx, pre).sum() for c in coefs]
    assert EngineStepCost.totals(coefs, sums) == pytest.approx(want, rel=1e-10)
    linear = StepSums.of_steps(n, ctx, pre)  # no histogram: only linear rows can be priced
    assert EngineStepCost.totals(coefs[:3], linear) == pytest.approx(want[:3], rel=1e-10)
    with pytest.raises(ValueError, match="histogram"):
        EngineStepCost.totals(coefs, linear)


def test_totals_of_a_multi_hinge_cost_are_the_sum_of_its_steps():
    # the interpolated form prices random steps, and rounds of them, from summed features and the histogram of n
    rng = np.random.default_rng(3)
    n = rng.integers(1, 600, (5, 300))
    ctx, pre = n * rng.uniform(10, 50, n.shape), np.where(rng.random(n.shape) < 0.1, 100.0, 0.0)
    m = int(n.max()) + 1
    sums = StepSums(np.full(5, 300.0), n.sum(1).astype(float), ctx.sum(1), pre.sum(1),
                    np.array([np.bincount(r, minlength=m) for r in n], float))
    want = INTERP.step(n, ctx, pre).sum(axis=1)
    assert INTERP.total(sums) == pytest.approx(want, rel=1e-10)
    assert INTERP.total(sums.row(2)) == pytest.approx(want[2], rel=1e-10)
    reps = np.stack([INTERP.array, EngineStepCost.scale_array(INTERP.array, 2.0)])  # replicate rows of one layout
    assert EngineStepCost.totals(reps, sums) == pytest.approx(np.stack([want, 2 * want]), rel=1e-10)


def test_sums_add_and_take_rows():
    a = StepSums.of_stretch(3, 4, 10.0, 2.0, hist=True)
    b = StepSums.of_stretch(2, 6, 0.0, 0.0, hist=True)
    s = a + b
    assert (s.steps, s.running, s.context, s.prefill) == (5, 24, 3 * 10 + 4 * 3 + 6, 2.0)
    assert s.hist.tolist() == [0, 0, 0, 0, 3, 0, 2] and s.hinge(4.5) == pytest.approx(2 * 1.5)
    assert (StepSums.zero(hist=False) + a).hist is None
    both = StepSums(np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0]), np.array([0.0, 1.0]))
    lin = EngineStepCost(1e-3, 1e-4, 1e-7, 1e-6)
    assert (lin.total(both.row(1)) == pytest.approx(lin.total(both)[1])
            and StepSums.from_dict(both.to_dict()).steps is both.steps)
    # a request of L tokens adds L to S1 and L p + L (L - 1) / 2 to S2 wherever it runs
    r = StepSums.of_requests(np.array([10, 10]), np.array([3, 1]), np.array([10.0, 10.0]), steps=3)
    assert (r.running, r.context, r.prefill) == (4.0, 33.0 + 10.0, 20.0)


def test_the_fit_parametrisation_maps_to_the_same_cost():
    rng = np.random.default_rng(1)
    n, ctx, pre = rng.integers(1, 100, 50).astype(float), rng.uniform(0, 5000, 50), rng.uniform(0, 50, 50)
    for knees, x in (((), [1e-3, 2e-4, 1e-7, 1e-6]), ((30.0,), [1e-3, 2e-4, 5e-5, 1e-7, 1e-6]),
                     ((4.0, 8.0, 30.0), [1e-3, 1e-4, 3e-4, 0.0, 2e-4, 1e-7, 1e-6])):
        c = EngineStepCost.from_design(np.array(x), knees)
        assert EngineStepCost.design(n, ctx, pre, knees) @ x == pytest.approx(c.step(n, ctx, pre), rel=1e-12)
        assert c.knees == knees and EngineStepCost.from_array(c.array) == c
        assert len(c.array) == len(COEFS) + 2 * len(knees)
        grid = np.arange(1.0, 100.0)
        assert np.all(np.diff(c.step(grid, 0.0)) >= -1e-15)  # slopes >= 0: non-decreasing in n
    # the one-hinge array is the knee form's layout: [c_step, c_seq, c_ctx, c_prefill, slope change, knee]
    assert KNEE.array.tolist() == [2e-3, 1e-4, 2e-7, 1e-6, -4e-5, 37.5]
    scaled = KNEE.scaled(step=2.0, seq=3.0, ctx=5.0, prefill=7.0)
    assert scaled.array == pytest.approx([4e-3, 3e-4, 1e-6, 7e-6, -1.2e-4, 37.5])  # the knee does not move


def test_the_fitted_model_is_the_cost_model():
    q = FitQuality(0, 0, 0, 0, 0)
    g = GenStepModel(2e-3, 1e-4, 2e-7, 1e-6, q, hinges=KNEE.hinges, form="knee")  # positional as before
    assert isinstance(g, EngineStepCost) and g.quality is q and g.form == "knee"
    assert g.predict([5, 50], [100, 1000]) == pytest.approx(KNEE.step([5, 50], [100, 1000]))
    assert g.throughput(50, 20.0) == pytest.approx(50 / KNEE.step(50, 1000.0))


def test_the_roofline_prior_takes_its_bandwidth_from_the_device_profiles():
    assert default_bandwidth_gbs({"mem_bandwidth_gbs": 123}) == (123.0, "trace metadata hardware.mem_bandwidth_gbs")
    bw, src = default_bandwidth_gbs({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"})
    assert bw == 3350.0 and "h100-sxm" in src
    assert default_bandwidth_gbs({"device": "cuda", "device_name": "NVIDIA A100-SXM4-40GB"})[0] == 1555.0
    assert (default_bandwidth_gbs({"device": "cuda", "device_name": "Tesla T4"})
            == (2000.0, "default for device type cuda"))
    assert default_bandwidth_gbs({"device": "cpu", "device_name": "synthetic"})[0] == 20.0
