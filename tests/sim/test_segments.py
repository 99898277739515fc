"""A split replica plans stretches ahead in segments (rlsim.modes.replica.Replica.plan_ahead) and applies them as time
reaches them, cutting a segment where something outside the replica acts. Every mode's run must equal the run made
one stretch per SimPy event (SEGMENT_FINISHES = 1: a segment ends at the first finish), on the shipped trace."""
from pathlib import Path

import numpy as np
import pytest
import simpy

from rlsim.core.config import WhatIf
from rlsim.core.engine import KvCache
from rlsim.modes import replica
from rlsim.modes.requests import AdmissionGate, FinishedGroups, Requests
from rlsim.modes.sync import WeightSync
from rlsim.modes.timeline import Recorder
from rlsim.replay.cost import EngineStepCost
from rlsim.modes.registry import simulate
from rlsim.replay.io import read_trace
from rlsim.whatif.study import models_for, prepare, sim_config

TRACE = Path(__file__).resolve().parents[2] / "traces" / "grpo_p128.parquet"
PLAN = replica.Replica.plan
FIELDS = ("step_time", "gen_time", "train_time", "sync_time", "responses", "tokens", "staleness_mean")
CASES = {
    "split, staleness 1": dict(prompts=64, gen_gpus=2, train_gpus=1, staleness=1),
    "areal, partial rollout": dict(prompts=64, gen_gpus=2, train_gpus=1, mode="areal", max_head_offpolicyness=2,
                                   partial_rollout=True),
    "fully_async": dict(prompts=64, gen_gpus=2, train_gpus=2, mode="fully_async", staleness_threshold=0.5,
                        partial_rollout=True, trigger_parameter_sync_step=2, require_batches=2),
    "fully_async, 3 prompts in flight a replica": dict(prompts=64, gen_gpus=2, train_gpus=2, mode="fully_async",
                                                       staleness_threshold=1, concurrent_samples_per_replica=3),
    "separate_async": dict(prompts=64, gen_gpus=2, train_gpus=2, mode="separate_async"),
    "separate_async_switch": dict(prompts=64, gen_gpus=2, train_gpus=2, mode="separate_async_switch"),
    "colocate_async": dict(prompts=64, train_gpus=2, mode="colocate_async"),
    "nemo_async, in-flight updates": dict(prompts=64, gen_gpus=2, train_gpus=2, mode="nemo_async",
                                          max_trajectory_age_steps=1, in_flight_weight_updates=True),
}


@pytest.fixture(scope="module")
def study():
    return prepare([read_trace(TRACE)])


def _run(study, kw, monkeypatch, finishes):
    monkeypatch.setattr(replica, "SEGMENT_FINISHES", finishes)
    stretches = []

    def counted(self, *a):
        seg = PLAN(self, *a)
        stretches.append(len(seg.rows))
        return seg

    monkeypatch.setattr(replica.Replica, "plan", counted)
    cfg = WhatIf(updates=8, **kw)
    run = simulate(models_for(study, cfg)[0], sim_config(study, cfg), rng=np.random.default_rng(1),
                   record_timeline=True)
    return run, stretches


@pytest.mark.parametrize("case", list(CASES))
def test_segments_replay_the_run_made_stretch_by_stretch(study, case, monkeypatch):
    ahead, segs = _run(study, CASES[case], monkeypatch, replica.SEGMENT_FINISHES)
    one, singles = _run(study, CASES[case], monkeypatch, 1)
    assert max(singles) == 1 and max(segs) > 1  # the reference ran stretch by stretch; the segments spanned several
    assert len(segs) < len(singles)
    for f in FIELDS:
        np.testing.assert_allclose(getattr(ahead, f), getattr(one, f), rtol=1e-9, atol=1e-12, err_msg=f)
    assert ahead.gen_steps.sum() == one.gen_steps.sum()
    spans = sorted((s.lane, s.name, round(s.start, 9), round(s.dur, 9)) for s in ahead.timeline)
    assert spans == sorted((s.lane, s.name, round(s.start, 9), round(s.dur, 9)) for s in one.timeline)


def _two_replicas(finishes, monkeypatch):
    """Prompt 0's sequences run on two replicas (as after a reclaimed replica handed them back): sequence 0 (3
    tokens) on replica 0, sequence 1 (5 tokens) on replica 1 beside prompt 1's sequence 2 (9 tokens). Steps of 1 s.
    Returns (time, prompts) of each hand-over to the trainer."""
    monkeypatch.setattr(replica, "SEGMENT_FINISHES", finishes)
    env = simpy.Environment()
    q = Requests.of(np.ones(4, np.int64), np.array([3, 5, 9, 9]), 2, 1.0)
    q.pv[:], q.v0[:3], q.shared[0], q.shared_any = 0, 0, True, True
    q.a[:3], q.fin[:3] = 0, q.L[:3] - 1
    gate = AdmissionGate(2, 0.0, q.pv, started=2, replicas=2)
    finished = FinishedGroups(env, 2, 0.0, q.pv)
    puts = []
    put = finished.put
    monkeypatch.setattr(finished, "put", lambda g: (puts.append((env.now, g.tolist())), put(g)))
    spec = replica.ReplicaSpec(cost=EngineStepCost(1.0, 0.0, 0.0, 0.0), gap=0.0, per_response=0.0, max_seqs=4,
                               kv=KvCache(16, 1000), kv_cache_tokens=16000, kv_bind=False, partial=False)
    sync, totals, rec = WeightSync(env, 2), replica.EngineTotals(), Recorder(False)
    for r, seqs in enumerate(([0], [1, 2])):
        rep = replica.Replica(r, env, spec, q, gate, finished, sync, totals, rec)
        rep.b.run, rep.b.last = np.array(seqs), q.fin[seqs]
        rep.b.sum_p = len(seqs)
    env.run(until=20)
    return puts


def test_a_prompt_shared_by_two_replicas_goes_to_the_trainer_when_its_last_sequence_finishes(monkeypatch):
    # sequence 1 finishes at the end of replica 1's fifth step (t = 5), after sequence 0 (t = 3): prompt 0 is
    # complete then, though replica 1 planned its segment at t = 0, before replica 0 applied sequence 0's finish
    assert _two_replicas(replica.SEGMENT_FINISHES, monkeypatch) == [(5.0, [0])]
    assert _two_replicas(1, monkeypatch) == [(5.0, [0])]
