"""The split's GPU-scale cost terms (rlsim.replay.rollout_costs in rlsim.modes.split): rollout replicas as
tensor-parallel groups and a weight sync priced by its path, on hand-made cost models with timelines by hand."""
import numpy as np
import pytest

from rlsim.core.config import EngineConfig, SimConfig, SplitConfig, WhatIf
from rlsim.modes.registry import simulate
from rlsim.replay.errors import RlsimError
from rlsim.replay.rollout_costs import group_models
from tests.sim.hand_models import hand_models

RNG = np.random.default_rng(0)


def _cfg(split, *, prompts=2, updates=2):
    eng = EngineConfig(max_num_seqs=1, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    return SimConfig(prompts=prompts, group=1, updates=updates, engine=eng, lengths="recorded", split=split)


def _lanes(run):
    return sorted({s.lane for s in run.timeline if s.name == "gen.step"})


def test_four_generation_gpus_at_tensor_parallel_two_are_two_replicas():
    # prompts 0 and 1 (2 tokens each) run at once, one per replica of 1 slot: steps of 1 + 0.25 s, 2 per response;
    # the trainer's update 1 s and the sync 0.5 s: each update 2.5 + 1 + 0.5 s
    m = hand_models([([1, 1], [2, 2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(1.0, 0.0), sync=0.5, prompts=2, group=1)
    run = simulate(m, _cfg(SplitConfig(4, 1, gen_tp=2)), rng=RNG, record_timeline=True)
    assert _lanes(run) == ["gen/engine0", "gen/engine1"]
    assert run.total_time == pytest.approx(2 * (2.5 + 1.0 + 0.5))


def test_a_weight_sync_priced_by_its_path_replaces_the_fitted_one():
    m = hand_models([([1, 1], [2, 2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(1.0, 0.0), sync=0.5, prompts=2, group=1)
    run = simulate(m, _cfg(SplitConfig(2, 1, sync_s=3.0)), rng=RNG, record_timeline=True)
    assert [s.dur for s in run.timeline if s.name == "sync.weights"] == pytest.approx([3.0, 3.0])
    assert run.total_time == pytest.approx(2 * (2.5 + 1.0 + 3.0))


def test_tensor_parallel_must_divide_the_generation_gpus():
    m = hand_models([([1, 1], [2, 2])], prompts=2, group=1)
    with pytest.raises(RlsimError, match="pick a multiple of 4"):
        simulate(m, _cfg(SplitConfig(6, 1, gen_tp=4), updates=1), rng=RNG)
    with pytest.raises(RlsimError, match="--gen-tp must be a positive integer"):
        WhatIf(gen_gpus=2, train_gpus=1, gen_tp=0).validate()


def test_a_replica_group_reads_the_weights_over_its_own_devices():
    one = hand_models([([1], [2])], c=(1.0, 0.25, 0.0, 0.0))
    group = hand_models([([1], [2])], c=(1.0, 0.5, 0.0, 0.0), max_num_seqs=8)
    # recorded at tp 4: a tp-2 group reads each step's weights 2x slower
    m, note = group_models(one, group, tp_ref=4, tp=2)
    assert (m.gen.c_step, m.gen.c_seq, m.engine["max_num_seqs"], m.update) == (2.0, 0.5, 8, one.update)
    assert "tensor-parallel group of 2" in note and "x 4/2" in note
