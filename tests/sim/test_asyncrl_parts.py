"""The split simulator's parts (rlsim.modes) on their own: the admission gate, the consumption rule, the
weight-sync barrier, and the choice between the colocated and the split loop (rlsim.modes.registry)."""
from dataclasses import replace

import numpy as np
import pytest
import simpy

from rlsim.core import pipeline
from rlsim.modes.split import simulate_split
from rlsim.modes.requests import AdmissionGate, FinishedGroups
from rlsim.modes.sync import WeightSync
from rlsim.core.config import EngineConfig, SimConfig, SplitConfig
from rlsim.replay.errors import RlsimError
from rlsim.modes.registry import MODES, mode_of, register_mode, simulate
from tests.sim.hand_models import hand_models

NOT_STARTED = np.iinfo(np.int64).max


def test_the_gate_counts_started_prompts_against_eta_plus_version_plus_one_batches():
    pv = np.full(8, NOT_STARTED, np.int64)
    gate = AdmissionGate(prompts=2, staleness=1, pv=pv)
    assert gate.pull(0, 3) == (0, 3) and gate.pull(0, 3) == (3, 4)  # (1 + 0 + 1) x 2 = 4 at version 0
    assert not gate.is_open(0) and gate.is_open(1)
    assert gate.pull(1, 5) == (4, 6) and list(pv) == [0, 0, 0, 0, 1, 1] + [NOT_STARTED] * 2


def _take(env, groups, u, out):
    picked = yield from groups.take(u)
    out.append((env.now, picked.tolist()))


def test_consumption_takes_due_prompts_first_and_waits_for_them():
    env = simpy.Environment()
    pv = np.array([0, 0, 1, 1], np.int64)
    groups = FinishedGroups(env, prompts=2, staleness=1, pv=pv)  # prompt 1 still running
    groups.put(np.array([2, 0, 3]))
    out = []
    env.process(_take(env, groups, 1, out))  # update 1, eta 1: prompts started at version 0 (0 and 1) are due

    def finish_prompt_1():
        yield env.timeout(2.0)
        groups.put(np.array([1]))

    env.process(finish_prompt_1())
    env.run()
    assert out == [(2.0, [0, 1])] and list(groups.items) == [2, 3]


def test_consumption_takes_the_oldest_started_then_completion_order():
    env = simpy.Environment()
    groups = FinishedGroups(env, prompts=2, staleness=1, pv=np.array([0, 0, 1, 1], np.int64))
    groups.put(np.array([3, 2, 0]))
    out = []
    env.process(_take(env, groups, 0, out))  # nothing due at update 0: prompt 0 (version 0), then 3 (finished before 2)
    env.run()
    assert out == [(0.0, [3, 0])] and list(groups.items) == [2]


def test_the_sync_starts_when_the_last_replica_joins_and_resumes_them_in_join_order():
    env = simpy.Environment()
    sync = WeightSync(env, replicas=2)
    told, log = [], []
    sync.listeners += [lambda: told.append(0), lambda: told.append(1)]

    def replica(r, at):
        yield env.timeout(at)
        yield sync.join(r)
        log.append((r, env.now, sync.version))

    def trainer():
        yield env.timeout(0.5)
        yield sync.request()
        log.append(("start", env.now))
        yield env.timeout(1.0)
        sync.publish()

    env.process(trainer())
    env.process(replica(0, 3.0))
    env.process(replica(1, 2.0))
    env.run()
    assert told == [0, 1] and log == [("start", 3.0), (1, 4.0, 1), (0, 4.0, 1)] and not sync.requested


def test_the_colocated_loop_refuses_a_split_and_simulate_picks_the_loop():
    m = hand_models([([1], [2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    eng = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    colo = SimConfig(prompts=1, group=1, updates=2, engine=eng, lengths="recorded")
    split = SimConfig(prompts=1, group=1, updates=2, engine=eng, lengths="recorded",
                      split=SplitConfig(1, 1, staleness=1))
    with pytest.raises(RlsimError, match="colocated loop"):
        pipeline.simulate(m, split, rng=np.random.default_rng(0))
    assert (simulate(m, split, rng=np.random.default_rng(0)).total_time
            == simulate_split(m, split, rng=np.random.default_rng(0)).total_time == 10.0)
    assert simulate(m, colo, rng=np.random.default_rng(0)).step_time == pytest.approx(
        pipeline.simulate(m, colo, rng=np.random.default_rng(0)).step_time)


def test_ranks_get_token_balanced_shares_in_id_order():
    from rlsim.modes.trainer import balanced
    tokens = np.array([1, 9, 2, 8, 3, 7, 4, 6])
    sh = balanced(np.arange(8), tokens, 2)
    assert sh.shape == (2, 4) and (np.diff(sh, axis=1) > 0).all()
    assert sorted(tokens[sh].sum(axis=1)) == [20, 20]  # snake: 9 8 / 7 6 ... -> {9, 6, 4, 1} and {8, 7, 3, 2}
    assert sorted(np.concatenate(sh)) == list(range(8))


def test_a_data_parallel_gpu_reference_holds_its_gradient_collective():
    from rlsim.modes.split import data_parallel
    assert data_parallel({"device": "cuda", "device_name": "NVIDIA H20", "device_count": 32})
    assert (not data_parallel({"device": "cuda", "device_count": 1})
            and not data_parallel({"device": "cpu", "torch_threads": 2}))
    assert not data_parallel(None)
    sp = SplitConfig(1, 4, allreduce_fitted=True)
    sp.validate(8)  # no interconnect needed: the fitted update already holds the collective
    m = hand_models([([1, 1, 1, 1, 1, 1, 1, 1], [1] * 8)], c=(1.0, 0.0, 0.0, 0.0), update=(0.5, 0.5), sync=0.2,
                    prompts=8, group=1)
    from rlsim.modes.trainer import TrainerCosts
    cfg = SimConfig(prompts=8, group=1, updates=1, split=sp)
    assert TrainerCosts.of(m, cfg).allreduce == 0.0
    assert TrainerCosts.of(m, replace(cfg, split=SplitConfig(1, 4, allreduce_gbs=1.0))).allreduce > 0


def test_a_fractional_staleness_admits_that_share_of_a_batch_ahead():
    # verl's staleness_threshold: eta = 0.5 with P = 4 lets 6 prompts start at version 0, 10 at version 1
    gate = AdmissionGate(4, 0.5, np.full(32, np.iinfo(np.int64).max, np.int64))
    assert (gate.bound(0), gate.bound(1)) == (6, 10)
    assert gate.pull(0, 100) == (0, 6) and not gate.is_open(0) and gate.is_open(1)
    assert AdmissionGate(4, 1, np.zeros(32, np.int64)).bound(0) == 8  # integer eta as before


def test_the_gate_deals_admitted_prompts_out_evenly_over_replicas():
    # P = 8, eta = 0, 4 replicas: a replica with room for everything still takes only its share, 2 prompts
    gate = AdmissionGate(8, 0, np.full(32, np.iinfo(np.int64).max, np.int64), replicas=4)
    assert gate.pull(0, 100) == (0, 2) and gate.pull(0, 100) == (2, 4)  # ceil(8 / 4), then ceil(6 / 4)
    assert gate.pull(0, 1) == (4, 5)  # less room: what fits
    assert AdmissionGate(8, 0, np.zeros(32, np.int64)).pull(0, 100) == (0, 8)  # one replica: all of them


def test_the_gate_floors_its_bound_as_written_not_as_rounded():
    from rlsim.modes.requests import admitted
    assert admitted(0.3, 1, 100) == 230 and admitted(0.1, 3, 30) == 123  # 229.99999..., 122.99999... in floats
    assert admitted(0.55, 0, 10) == 15
    from rlsim.present.tables import describe
    assert describe({"staleness": 1.0, "prompts": 64}, ["staleness", "prompts"]) == "staleness 1 prompts 64"


def test_execution_modes_are_one_registry():
    assert {"colocated", "split"} <= set(MODES)
    with pytest.raises(ValueError, match="registered twice"):
        register_mode("split")(lambda *a, **k: None)
    cfg = SimConfig(prompts=2, group=2, updates=1)
    assert mode_of(cfg) == "colocated" and mode_of(replace(cfg, split=SplitConfig(1, 1))) == "split"


def test_a_long_split_simulates_its_first_updates_and_repeats_those_past_the_fill():
    from rlsim.modes.split import PER_UPDATE
    m = hand_models([([1, 1], [2, 3]), ([1, 1], [4, 1]), ([1, 1], [1, 2])], c=(1.0, 0.25, 0.0, 0.0),
                    update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    eng = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    cfg = SimConfig(prompts=1, group=2, updates=7, engine=eng, lengths="recorded", split=SplitConfig(1, 1, staleness=1))
    every = simulate_split(m, cfg, rng=np.random.default_rng(0))  # 14 responses in all: every update simulated
    assert every.rounds_simulated == 7 and every.approximation == ""
    head = simulate_split(m, replace(cfg, updates=3), rng=np.random.default_rng(0))
    run = simulate(m, cfg, rng=np.random.default_rng(0), max_rounds=3)
    assert run.rounds_simulated == 3 and "3 of 7 updates simulated" in run.approximation
    for f in PER_UPDATE:  # updates 0, 1, 2 simulated; then 1, 2, 1, 2
        assert list(getattr(run, f)) == list(getattr(head, f)[[0, 1, 2, 1, 2, 1, 2]]), f
    assert run.total_time == pytest.approx(head.step_time[0] + 3 * head.step_time[1:].sum())
    assert simulate_split(m, cfg, rng=np.random.default_rng(0), max_rounds=50).step_time.tolist() == \
        every.step_time.tolist()


def test_a_split_runs_head_is_the_first_updates_of_the_long_run_itself():
    m = hand_models([([1, 1], [2, 3]), ([1, 1], [4, 1]), ([1, 1], [1, 2])], c=(1.0, 0.25, 0.0, 0.0),
                    update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    eng = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    cfg = SimConfig(prompts=1, group=2, updates=7, engine=eng, lengths="recorded", split=SplitConfig(1, 1, staleness=1))
    every = simulate_split(m, cfg, rng=np.random.default_rng(0))
    head = simulate(m, cfg, rng=np.random.default_rng(0), head=3)
    assert head.rounds_simulated == 3 and head.approximation == ""
    assert head.step_time.tolist() == every.step_time[:3].tolist()  # the first updates of the 7-update run
    assert head.responses_per_s == every.responses[:3].sum() / every.step_time[:3].sum()
    assert simulate_split(m, cfg, rng=np.random.default_rng(0), head=7).step_time.tolist() == every.step_time.tolist()
    with pytest.raises(RlsimError, match="head must be a positive number of updates, got 0"):
        simulate_split(m, cfg, rng=np.random.default_rng(0), head=0)


def test_a_long_split_stops_once_its_mean_update_time_is_known_within_the_bound(monkeypatch):
    from rlsim.modes import split
    m = hand_models([([1, 1], [2, 3]), ([1, 1], [4, 1]), ([1, 1], [1, 2])], c=(1.0, 0.25, 0.0, 0.0),
                    update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    eng = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    cfg = SimConfig(prompts=1, group=2, updates=40, engine=eng, lengths="recorded",
                    split=SplitConfig(1, 1, staleness=1))
    every = simulate_split(m, cfg, rng=np.random.default_rng(0))
    monkeypatch.setattr(split, "STEADY_REQUESTS", 0)  # every run is long enough to stop early
    run = simulate_split(m, cfg, rng=np.random.default_rng(0))
    k = run.rounds_simulated
    # the first k updates are those of the full run, and k is the first count at which the stop rule holds
    assert split.STEADY_UPDATES <= k < 40 and "stopped once the mean update time" in run.approximation
    assert run.step_time[:k].tolist() == every.step_time[:k].tolist()
    assert split.steady_enough(every.step_time[:k]) and not any(split.steady_enough(every.step_time[:j])
                                                                for j in range(1, k))


def test_the_steady_stop_reads_batch_means_of_the_updates_past_the_first():
    from rlsim.modes.split import STEADY_ERROR, STEADY_T, steady_enough
    assert not steady_enough(np.r_[100.0, np.ones(9)])  # fewer than 2 updates per block of 5
    flat = np.r_[100.0, np.ones(10)]  # the first update (the fill) is left out; no spread: known
    assert steady_enough(flat)
    # blocks of 2: means 1 +- d alternating; sd of the 5 means, times t over sqrt(5), against STEADY_ERROR
    for d, ok in ((0.5, False), (0.001, True)):
        x = np.r_[100.0, np.repeat(1 + d * np.array([1, -1, 1, -1, 1]), 2)]
        means = 1 + d * np.array([1, -1, 1, -1, 1])
        assert steady_enough(x) == (STEADY_T * means.std(ddof=1) / np.sqrt(5) <= STEADY_ERROR * x[1:].mean()) == ok


def test_a_split_stops_early_only_past_the_steady_budget_and_never_with_a_timeline():
    from rlsim.modes.split import steady_updates
    sp = SplitConfig(1, 1, staleness=1)

    def k(prompts, updates=100, timeline=False, max_rounds=None):
        return steady_updates(SimConfig(prompts=prompts, group=8, updates=updates, split=sp), timeline, max_rounds)

    assert k(128) == 100  # 102,400 responses <= STEADY_REQUESTS: every update
    assert k(1024) is None and k(4096) is None  # may stop once steady
    assert k(1024, timeline=True) == 100 and k(1024, updates=11) == 11
    assert k(1024, max_rounds=1) == 2 and k(128, max_rounds=5) == 5
