"""rlsim.replay.rollout_costs: the weight-sync rule against the published figures it was made from, rollout
replicas as tensor-parallel groups, and the trainer pass that rollout log-probs remove."""
from __future__ import annotations

import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.robust import AffineModel, FitQuality, PiecewiseLinear
from rlsim.replay.rollout_costs import (PER_TENSOR_FACTOR, old_log_prob_share, replicas, weight_sync_seconds,
                                        without_share)

# MoonshotAI/checkpoint-engine README @ 415c3205 "Benchmark": (model bytes, broadcast update + GatherMetas seconds)
CKPT_ENGINE = [(106e9 * 2, 3.47 + 0.12), (235e9 * 2, 6.22 + 0.33), (671e9, 10.19 + 1.17), (1.03e12, 14.36 + 1.33),
               (671e9, 11.33 + 0.80), (1.03e12, 16.04 + 1.22)]


@pytest.mark.parametrize("nbytes,seconds", CKPT_ENGINE)
def test_checkpoint_engine_rule_is_within_its_published_spread(nbytes, seconds):
    assert weight_sync_seconds(nbytes, "checkpoint_engine") == pytest.approx(seconds, abs=1.25)


def test_per_tensor_nccl_costs_the_stated_factor_more_and_nothing_costs_nothing():
    ckpt = weight_sync_seconds(15e9, "checkpoint_engine")
    assert weight_sync_seconds(15e9, "nccl") == pytest.approx(PER_TENSOR_FACTOR * ckpt)
    assert weight_sync_seconds(0.0, "nccl") == 0.0
    with pytest.raises(RlsimError, match="checkpoint_engine | moe_reshard | nccl"):
        weight_sync_seconds(1e9, "rdma")


def test_replicas_are_tensor_parallel_groups():
    assert replicas(16, 4) == 4 and replicas(8, 1) == 8
    with pytest.raises(RlsimError, match="pick a multiple of 4"):
        replicas(6, 4)


def test_old_log_prob_share_and_the_pass_it_removes():
    assert old_log_prob_share({"old_log_prob": 30.0, "ref": 10.0, "gen": 100.0}) == pytest.approx(0.75)
    assert old_log_prob_share({"gen": 1.0}) == 1.0  # no named prep phases: all of prep is the old log-prob pass
    q = FitQuality(0, 0, 0, 0, 0)
    a = without_share(AffineModel("prep", "tokens", 2.0, 4.0, q), 0.75)
    assert (a.intercept, a.slope) == (0.5, 1.0)
    p = without_share(PiecewiseLinear("prep", "tokens", (1.0, 2.0), (4.0, 8.0), q, offset=2.0), 1.0)
    assert p.values == (0.0, 0.0) and p.offset == 0.0


def test_nemo_rl_refit_path_reproduces_its_deepseek_v3_figure_and_scales_with_bytes():
    # NVIDIA-NeMo/RL docs/guides/checkpoint-engine-refit.md @ 7ea279ab: NCCL refit of DeepSeek-V3 (bf16) 14.21 s
    dsv3 = 671e9 * 2
    assert weight_sync_seconds(dsv3, "nemo_nccl") == pytest.approx(14.21, rel=1e-3)
    assert weight_sync_seconds(dsv3 / 40, "nemo_nccl") == pytest.approx(14.21 / 40, rel=1e-3)  # no fixed term
    assert weight_sync_seconds(dsv3, "nemo_nccl") < weight_sync_seconds(dsv3, "nccl") / 3  # verl's rule: 54 s
