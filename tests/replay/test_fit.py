"""Fitting recovers the coefficients of a known cost model from synthetic traces."""
import math

import numpy as np
import pytest

from rlsim.replay.robust import fit_affine, nnls_fit
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace


@pytest.fixture(scope="module")
def exact_trace(tmp_path_factory):
    return read_trace(synthetic_trace(tmp_path_factory.mktemp("fit") / "exact.parquet", SynthSpec(steps=6)))


def test_gen_step_coefficients_recovered_exactly(exact_trace):
    spec = SynthSpec()
    gen = fit_trace(exact_trace).gen
    assert gen.c_step == pytest.approx(spec.c_step, rel=1e-6)
    assert gen.c_seq == pytest.approx(spec.c_seq, rel=1e-6)
    assert gen.c_ctx == pytest.approx(spec.c_ctx, rel=1e-5)
    assert gen.c_prefill == pytest.approx(spec.c_prefill, rel=1e-5)
    assert gen.quality.r2 == pytest.approx(1.0)
    assert not gen.prior


def test_gen_step_fit_with_noise_and_warmup(tmp_path):
    spec = SynthSpec(prompts=32, group=4, steps=8, noise=0.02, warmup_extra=0.5, seed=3)
    m = fit_trace(read_trace(synthetic_trace(tmp_path / "noisy.parquet", spec)))
    assert m.gen.c_step == pytest.approx(spec.c_step, rel=0.05)
    assert m.gen.c_seq == pytest.approx(spec.c_seq, rel=0.15)
    assert 0.9 < m.gen.quality.r2 <= 1.0
    assert m.gen.quality.median_rel_err < 0.03
    # the warm-up step's rows (step 0) are left out: they would inflate c_step by 0.5 s
    assert m.gen.quality.dropped > 0


def test_prediction_matches_rows(exact_trace):
    m = fit_trace(exact_trace)
    g = exact_trace.rows("gen_step")
    pred = m.predict_gen_step(g["num_running"], g["context_tokens"], g["prefill_tokens"])
    assert np.allclose(pred, g["duration"], rtol=1e-6)


def test_step_costs_recovered(exact_trace):
    spec = SynthSpec()
    m = fit_trace(exact_trace)
    tokens = 1000.0
    assert m.update.predict(tokens) == pytest.approx(spec.update_a + spec.update_b * tokens, rel=1e-6)
    assert m.prep.predict(tokens) == pytest.approx(spec.prep_b * tokens, rel=1e-6)
    assert m.reward.predict(64) == pytest.approx(spec.reward_b * 64, rel=1e-6)
    assert m.sync.predict(m.sync_bytes) == pytest.approx(spec.sync_s, rel=1e-6)
    assert m.other.predict(64) == pytest.approx(spec.other_s, rel=1e-6)
    assert m.gen_overhead.per_step == pytest.approx(spec.step_gap, rel=1e-6)


def test_lengths_and_recorded_workload(exact_trace):
    m = fit_trace(exact_trace)
    r = exact_trace.rows("response")
    assert sorted(m.lengths.response_tokens.tolist()) == sorted(r["response_tokens"].astype(int).tolist())
    assert len(m.lengths.prompt_tokens) == SynthSpec().prompts * SynthSpec().steps
    assert len(m.recorded.workload) == SynthSpec().steps
    assert all(len(w[1]) == SynthSpec().prompts * SynthSpec().group for w in m.recorded.workload)
    p, L = m.lengths.sample(np.random.default_rng(0), 5, 3, rounds=2)
    assert p.shape == L.shape == (2, 15)
    assert np.all(p[:, 0:3] == p[:, [0]])  # a group shares its prompt
    assert m.lengths.prefill_ratio == pytest.approx(1.0)


def test_roofline_prior_with_too_little_concurrency_range(tmp_path):
    spec = SynthSpec(prompts=4, group=2, max_num_seqs=2, steps=4)
    m = fit_trace(read_trace(synthetic_trace(tmp_path / "narrow.parquet", spec)))
    assert m.gen.prior
    assert any("roofline prior" in w for w in m.warnings)
    # model bytes / 20 GB/s (cpu default), capped by the fastest steps
    assert m.gen.c_step == pytest.approx(min(spec.model_bytes / 20e9, 1.0), rel=1e-6)


def test_few_gen_steps_warned(tmp_path):
    m = fit_trace(read_trace(synthetic_trace(tmp_path / "few.parquet",
                                             SynthSpec(prompts=2, group=2, steps=3, max_tokens=6))))
    assert any("generation steps after warm-up" in w for w in m.warnings)


def test_nnls_trims_outliers():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 100, 200)
    y = 2.0 + 0.5 * x
    y[:5] += 1000
    coef, keep = nnls_fit(np.column_stack([np.ones_like(x), x]), y)
    assert coef == pytest.approx([2.0, 0.5], rel=1e-6)
    assert (~keep).sum() == 5


def test_fit_affine_narrow_range_is_proportional_through_hint():
    m = fit_affine("update", "tokens", [1000, 1010, 990, 1005, 995], [1.2, 1.212, 1.188, 1.206, 1.194],
                   intercept_hint=0.2)
    assert m.quality.method == "proportional"
    assert m.intercept == pytest.approx(0.2)
    assert m.predict(2000) == pytest.approx(0.2 + 2.0, rel=1e-3)


def test_fitted_models_pickle(exact_trace):
    import pickle

    m = fit_trace(exact_trace)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.gen == m.gen and np.array_equal(m2.lengths.response_tokens, m.lengths.response_tokens)
    assert set(m.quality) >= {"gen_step", "update", "sync"}
    assert all(math.isfinite(q.rmse) for q in m.quality.values() if q.n)


def test_robust_fit_ignores_contended_windows():
    # 40% of the rows come from windows slowed down 2-8x (another process on the CPU): the fit keeps
    # the clean majority and recovers the true coefficients
    rng = np.random.default_rng(1)
    n = 600
    X = np.column_stack([np.ones(n), rng.integers(1, 257, n), rng.uniform(100, 8000, n), np.zeros(n)])
    true = np.array([4e-3, 5e-5, 2e-7, 0.0])
    y = X @ true * (1 + 0.02 * rng.standard_normal(n))
    groups = np.repeat(np.arange(20), 30)
    slow = np.isin(groups, [0, 1, 2, 3, 7, 9, 12, 18])
    y[slow] *= np.repeat(rng.uniform(2, 8, 8), 30)
    coef, keep = nnls_fit(X, y, groups=groups)
    assert coef[:3] == pytest.approx(true[:3], rel=0.1)
    assert not keep[slow].any() and keep[~slow].mean() > 0.95


def test_robust_location_is_the_clean_mode():
    from rlsim.replay.robust import robust_location

    v = np.r_[np.full(7, 0.8) + np.linspace(-0.02, 0.02, 7), 2.0, 4.5, 7.9, 13.8, 20.3, 6.5]
    assert robust_location(v) == pytest.approx(0.8, abs=0.01)


def test_missing_step_time_rebuilt_from_parts(tmp_path):
    import pyarrow.parquet as pq
    import pyarrow.compute as pc
    import pyarrow as pa

    p = synthetic_trace(tmp_path / "s.parquet", SynthSpec(steps=3))
    t = pq.read_table(p)
    is_upd = pc.equal(t["kind"], "update")
    t = t.set_column(t.column_names.index("step_time"), "step_time",
                     pc.if_else(is_upd, pa.scalar(None, pa.float64()), t["step_time"]))
    pq.write_table(t, p)
    m = fit_trace(read_trace(p))
    assert np.all(np.isfinite(m.recorded.step_time)) and np.all(m.recorded.step_time > m.recorded.gen_time)


def test_step_costs_fitted_across_traces_of_several_batch_sizes(tmp_path):
    # one trace only spans its own batch: the update intercept is the optimizer time; two traces at
    # 4x apart recover the true intercept and slope, while the generation model stays the first's
    a = read_trace(synthetic_trace(tmp_path / "a.parquet", SynthSpec(prompts=16, steps=4, update_a=0.2)))
    b = read_trace(synthetic_trace(tmp_path / "b.parquet", SynthSpec(prompts=64, steps=3, update_a=0.2, c_step=9.0)))
    spec = SynthSpec(update_a=0.2)
    m = fit_trace([a, b])
    assert m.update.intercept == pytest.approx(0.2, rel=1e-6)
    assert m.update.slope == pytest.approx(spec.update_b, rel=1e-6)
    assert "2 traces" in m.update.quality.method
    assert m.gen.c_step == pytest.approx(spec.c_step, rel=1e-6)  # not the second trace's 9 s
    assert m.prompts == 16 and len(m.recorded.step) == 4
