"""What-if: prepare / evaluate / run on synthetic traces: sigma, rho, T ratio, warnings, determinism."""
import pickle

import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.core.config import WhatIf
from rlsim.whatif.fidelity import replay_trace
from rlsim.whatif.predict import evaluate, run, timeline
from rlsim.whatif.study import prepare

SPEC = SynthSpec(prompts=16, group=4, steps=6, max_num_seqs=32)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    ref = read_trace(synthetic_trace(d / "p16.parquet", SPEC))
    # the same setup at 4x the batch, learning slower per response
    big = read_trace(synthetic_trace(d / "p64.parquet",
                                     SynthSpec(prompts=64, group=4, steps=3, max_num_seqs=32, score_scale=3000.0)))
    return ref, big


@pytest.fixture(scope="module")
def study(traces):
    return prepare([traces[0]])


def test_reference_config_gives_unit_ratios(traces, study):
    out = evaluate(study, WhatIf())
    assert (out.prompts, out.group, out.responses_per_update) == (16, 4, 64)
    assert out.sigma == pytest.approx(1.0) and out.rho == pytest.approx(1.0)
    assert out.time_to_target_ratio == pytest.approx(1.0) and out.regime == "reference"  # as rank and the JSON say
    other = evaluate(study, WhatIf(max_num_seqs=16))  # the reference's P and G on another engine: not the reference
    assert other.regime != "reference"


def test_noise_scale_rho_and_t_ratio(study):
    assert study.noise.b_crit == pytest.approx(SPEC.tr_sigma / SPEC.g2)
    out = evaluate(study, WhatIf(prompts=64))
    assert out.rho_model == "noise-scale"
    assert out.rho == pytest.approx((1 + 256 / 64) / (1 + 64 / 64))
    assert out.sigma > 1  # the fixed step cost amortises over more concurrent sequences
    same = evaluate(study, WhatIf())  # the reference's own configuration, simulated as a candidate
    assert (same.sigma, same.rho, same.time_to_target_ratio, same.regime) == (1.0, 1.0, 1.0, "reference")
    # colocated: the device idles exactly while rewards and the rest run
    assert out.idle_s == pytest.approx(out.other_s)


def test_invariant_and_curves_models(traces):
    inv = evaluate(prepare([traces[0]], rho_model="invariant"), WhatIf(prompts=64))
    assert inv.rho == 1.0 and inv.rho_model == "invariant"
    st = prepare(list(traces), rho_model="curves", target=0.1)
    out = evaluate(st, WhatIf(prompts=64))
    n_ref = st.curves[0].samples_to_target(0.1)
    n_big = st.curves[1].samples_to_target(0.1)
    assert out.rho_model == "curves" and out.rho == pytest.approx(n_big / n_ref)
    # halfway in log batch between 64 and 256 responses
    mid = evaluate(st, WhatIf(prompts=32))
    assert mid.rho == pytest.approx((n_ref + n_big) / 2 / n_ref)
    assert prepare(list(traces), target=0.1).rho_for(256, "sqrt")[1] == "curves"  # auto prefers curves
    with pytest.raises(RlsimError):
        prepare([traces[0]], rho_model="curves")


def test_curves_follow_the_lr_each_run_trained_at(traces, tmp_path):
    """A candidate's curve is made of the runs at the lr its rule gives their batch: the reference (P = 16, B = 64, sqrt
    rule from 3e-4 at 256: lr 1.5e-4) and, for a fixed lr at B = 256, a run at 1.5e-4 there, not one at 3e-4."""
    spec = dict(prompts=64, group=4, steps=3, max_num_seqs=32)
    on = read_trace(synthetic_trace(tmp_path / "on.parquet", SynthSpec(**spec, lr_rule="fixed", score_scale=3000.0),
                                    meta_overrides={"config": {"lr": 1.5e-4}}))
    off = read_trace(synthetic_trace(tmp_path / "off.parquet", SynthSpec(**spec, lr_rule="fixed", score_scale=6000.0)))
    st = prepare([traces[0], on, off], rho_model="curves", target=0.1)
    n = [c.samples_to_target(0.1) for c in st.curves]
    assert evaluate(st, WhatIf(prompts=64, lr_rule="fixed")).rho == pytest.approx(n[1] / n[0])
    # under the sqrt rule B = 256 trains at 3e-4: the "fixed" run at 3e-4 is that point, the one at 1.5e-4 is not
    assert evaluate(st, WhatIf(prompts=64, lr_rule="sqrt")).rho == pytest.approx(n[2] / n[0])


def test_fixed_lr_beyond_reference_warns_without_curves(study):
    out = evaluate(study, WhatIf(prompts=32, lr_rule="fixed"))
    assert any("--lr-rule fixed" in w for w in out.warnings)
    assert not any("--lr-rule fixed" in w for w in evaluate(study, WhatIf(prompts=32)).warnings)


def test_extrapolation_and_kv_warnings(study):
    big = evaluate(study, WhatIf(prompts=256, max_num_seqs=1024, updates=3))
    assert any("16x the measured" in w for w in big.warnings)
    kv = evaluate(study, WhatIf(kv_cache_tokens=256, updates=3))
    assert kv.preemptions > 0 and any("KV-cache capacity" in w for w in kv.warnings)


def test_grpo_group_of_one_refused(study):
    with pytest.raises(RlsimError, match="group of at least 2"):
        evaluate(study, WhatIf(group=1))
    for bad in (WhatIf(prompts=0), WhatIf(prompts=-3), WhatIf(lr_rule="cubic"), WhatIf(updates=0)):
        with pytest.raises(RlsimError):
            bad.validate()


def test_deterministic_picklable_and_run_matches_evaluate(traces, study):
    cfg = WhatIf(prompts=48, seed=3, updates=20)
    a = evaluate(study, cfg)
    b = evaluate(pickle.loads(pickle.dumps(study)), cfg)
    assert a.to_dict() == b.to_dict()
    assert evaluate(study, WhatIf(prompts=48, seed=4, updates=20)).responses_per_s != a.responses_per_s
    r = run([traces[0]], WhatIf(prompts=48))
    assert r.candidate.to_dict() == evaluate(study, WhatIf(prompts=48)).to_dict()
    d = r.to_dict()
    for k in ("prompts", "group", "responses_per_s", "step_time_s", "sigma", "rho", "time_to_target_ratio",
              "reference"):
        assert k in d
    assert all(not isinstance(v, (list, dict)) for k, v in evaluate(study, cfg).to_dict().items())


def test_timeline_lanes_and_counters(study):
    tl = timeline(study, WhatIf(prompts=8, updates=2))
    names = {s.name for s in tl.timeline}
    assert {"gen.step", "gen.round", "train.update", "sync.weights", "rl.step"} <= names
    assert {(c.lane, c.name) for c in tl.counters} == {("gen/engine0", "gen.running"), ("gen/engine0", "gen.kv_usage")}
    steps = sorted((s for s in tl.timeline if s.name == "gen.step"), key=lambda s: s.start)
    assert all(a.start + a.dur <= b.start + 1e-12 for a, b in zip(steps, steps[1:]))  # no overlap on the engine lane


def test_replay_of_a_synthetic_trace_is_exact(traces):
    res = replay_trace(traces[0])
    e = res.errors()
    assert e["step_time"]["max"] < 1e-9 and e["gen_time"]["max"] < 1e-9
    assert res.skipped_warmup and len(res.step) == SPEC.steps - 1
    sampled = replay_trace(traces[0], lengths="sampled").errors()
    assert sampled["step_time"]["median"] < 0.1


def test_over_generation_option(study):
    base = evaluate(study, WhatIf(prompts=16, updates=20))
    over = evaluate(study, WhatIf(prompts=16, gen_batch=96, updates=20))
    assert over.responses_per_update == 64 and over.gen_s > base.gen_s  # more requests generated, the same trained
    with pytest.raises(RlsimError, match="smaller than the train batch"):
        evaluate(study, WhatIf(prompts=16, gen_batch=32))


def test_traces_of_other_algorithms_refused(tmp_path, traces):
    ppo = read_trace(synthetic_trace(tmp_path / "ppo.parquet", SynthSpec(algo="ppo", prompts=32, group=1, steps=3)))
    with pytest.raises(RlsimError, match="ppo run"):
        prepare([traces[0], ppo])


def test_default_target_with_several_traces_is_reached_by_all(traces):
    st = prepare(list(traces))
    assert st.target == pytest.approx(min(c.best for c in st.curves))
    assert all(c.samples_to_target(st.target) is not None for c in st.curves)
