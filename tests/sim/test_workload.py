"""The simulator's seams: the one workload sampler (rlsim.core.workload), the one way to build a SimConfig from
fitted models (rlsim.whatif.simconfig), and the engine's uses of the one cost model (round and stretch costs)."""
from dataclasses import replace

import numpy as np
import pytest

from rlsim.modes.requests import queue_lengths as split_workload
from rlsim.core.config import EngineConfig, SimConfig, SplitConfig, WhatIf
from rlsim.core.engine import Stretch, round_cost, round_plan_exact, schedule_rounds, step_arrays
from rlsim.core.pipeline import simulate
from rlsim.replay.cost import EngineStepCost, StepSums
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.whatif.simconfig import config_for, engine_of, gen_ratio
from rlsim.whatif.study import prepare, sim_config
from rlsim.core.workload import Workload
from tests.sim.hand_models import hand_models

WL = [([3, 3, 5, 5], [4, 1, 6, 2]), ([4, 4, 1, 1], [2, 7, 1, 1]), ([9, 9, 2, 2], [250, 3, 1, 2])]
ENG = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)


def _cfg(**kw):
    return SimConfig(**{"prompts": 2, "group": 2, "updates": 4, "engine": ENG, "lengths": "recorded", **kw})


def test_recorded_rounds_cycle_with_extras_and_are_cut_to_the_model_length():
    m = hand_models(WL, prompts=2, group=2)
    wl = Workload.of(m, _cfg(gen_batch=7))
    ps, ls = wl.draw(np.random.default_rng(0), 4)
    assert [len(L) for L in ls] == [7] * 4 and wl.extra == 3
    assert ls[3][:4].tolist() == WL[0][1] and ps[3][:4].tolist() == WL[0][0]  # update 3 replays recorded update 0
    assert ps[0][4:].tolist() == [3, 5, 3]  # the extras cycle over the round's prompts (prompt j at j x G)
    assert ls[2][0] == 256 - 9  # prompt + response cut to max_model_len
    assert wl.context_bound() == 9 + 250
    one = Workload.of(m, _cfg(gen_batch=7)).draw(np.random.default_rng(0), 1, first=3)
    assert one[0][0][:4].tolist() == WL[0][0]
    with pytest.raises(RlsimError, match="do not cover"):
        Workload.of(hand_models([WL[0], ([1, 1], [])]), _cfg())


def test_sampled_rounds_draw_all_prompts_then_all_responses_then_the_extras():
    m = hand_models(WL, prompts=2, group=2)
    ps, ls = Workload.of(m, _cfg(lengths="sampled", gen_batch=5)).draw(np.random.default_rng(4), 3)
    rng = np.random.default_rng(4)
    p, L = m.lengths.sample(rng, 2, 2, rounds=3)
    ex = rng.choice(m.lengths.response_tokens, size=(3, 1))
    assert (np.array_equal(np.stack(ps)[:, :4], p)
            and np.array_equal(np.stack(ls)[:, 4:], np.minimum(ex, 256 - p[:, :1])))


def test_the_split_loop_takes_blocks_of_whole_batches_from_the_same_sampler():
    m = hand_models(WL, prompts=2, group=2)
    cfg = _cfg(split=SplitConfig(1, 1))
    p, L = split_workload(m, cfg, np.random.default_rng(0), 5)  # 5 prompts: 3 blocks of P = 2
    ps, ls = Workload.of(m, cfg, over_generate=False).draw(np.random.default_rng(0), 3)
    assert np.array_equal(p, np.concatenate(ps)) and np.array_equal(L, np.concatenate(ls)) and len(L) == 12
    with pytest.raises(RlsimError, match="update 1 has 3 responses"):
        split_workload(hand_models([WL[0], ([1, 1, 1], [1, 1, 1])]), cfg, np.random.default_rng(0), 4)


def test_one_config_from_fitted_models(tmp_path):
    m = hand_models(WL, prompts=2, group=2)
    m = replace(m, config={**m.config, "gen_batch": 6})
    cfg = config_for(m, updates=3, lengths="recorded")
    assert (cfg.prompts, cfg.group, cfg.updates, cfg.engine, cfg.gen_batch) == (2, 2, 3, engine_of(m), 6)
    assert gen_ratio(m) == 1.5 and engine_of(m).max_model_len == 256
    assert config_for(m, updates=3, prompts=4, split=SplitConfig(1, 1)).gen_batch == 0  # a split generates B
    with pytest.raises(RlsimError, match="--gen-batch 3 is smaller"):
        config_for(m, updates=3, gen_batch=3)
    st = prepare([read_trace(synthetic_trace(tmp_path / "t.parquet", SynthSpec()))])
    assert sim_config(st, WhatIf(updates=7)) == config_for(st.models, updates=7, engine=st.engine)


@pytest.mark.parametrize("hinges", [((3.5, 2e-5),), ((1.5, 3e-5), (2.5, 4e-5), (3.5, -2e-5), (4.5, -1e-5))])
def test_round_and_stretch_costs_are_the_steps_summed(hinges):
    cost = EngineStepCost(1e-3, 1e-4, 1e-7, 1e-6, hinges=hinges)  # a knee, and an interpolated form's hinges
    rng = np.random.default_rng(2)
    p = np.repeat(rng.integers(3, 20, size=(3, 10)), 2, axis=1)
    L = rng.integers(1, 30, size=(3, 20))
    plan = schedule_rounds(p, L, 6, p * 0.5)
    steps = [step_arrays(plan.start[u], L[u], p[u], p[u] * 0.5) for u in range(3)]
    per_step = [cost.step(sa["num_running"], sa["context_tokens"], sa["prefill_tokens"]).sum() for sa in steps]
    assert round_cost(cost, plan) == pytest.approx(per_step, rel=1e-12)
    assert cost.total(plan.sums(hist=True).row(1)) == pytest.approx(per_step[1], rel=1e-12)
    eng = EngineConfig(max_num_seqs=6, kv_cache_tokens=10**6, block_size=16, max_model_len=512)
    for x in round_plan_exact(p, L, eng, 0.5)[0][-1]:
        assert x.cost(cost) == pytest.approx(x.durations(cost).sum(), rel=1e-12)
        assert cost.total(x.sums(hist=True)) == pytest.approx(x.cost(cost), rel=1e-12)
    assert Stretch(0, 2, 0, 0.0, 0.0, 0, 0).cost(cost) == 0.0


@pytest.mark.parametrize("kv", [4096, 48])
def test_the_simulated_engine_time_is_the_cost_of_its_summed_features(kv):
    # fast path (kv 4096) and the step-level loop with KV accounting (kv 48: 3 blocks for 4 slots): one cost model
    m = hand_models(WL[:2], c=(1.0, 0.1, 0.01, 0.001), overhead=(0.0, 0.0, 0.0), update=(0.0, 0.0), sync=0.0, prompts=2,
                    group=2, kv_cache_tokens=kv, max_num_seqs=4)
    cfg = replace(_cfg(updates=3), engine=replace(ENG, kv_cache_tokens=kv))
    for rbr in (False, True):
        run = simulate(m, cfg, rng=np.random.default_rng(0), round_by_round=rbr)
        assert run.exact_engine == (kv == 48)
        assert m.gen.total(StepSums.from_dict(run.features)) == pytest.approx(run.gen_time.sum(), rel=1e-12)
