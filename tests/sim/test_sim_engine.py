"""The engine and the SimPy pipeline on hand-made cost models: exact event times."""
import numpy as np
import pytest

from rlsim.core.config import EngineConfig, SimConfig
from rlsim.core.engine import round_plan_exact, run_round_steps, schedule_rounds, step_arrays
from rlsim.core.pipeline import simulate
from tests.sim.hand_models import hand_models

RNG = np.random.default_rng(0)


def _cfg(models, updates=1, exact=False, **eng):
    e = dict(max_num_seqs=models.engine["max_num_seqs"], kv_cache_tokens=models.engine["kv_cache_tokens"],
             block_size=models.engine["block_size"], max_model_len=256)
    e.update(eng)
    return SimConfig(prompts=1, group=2, updates=updates, engine=EngineConfig(**e), lengths="recorded",
                     exact_engine=exact)


@pytest.mark.parametrize("exact", [False, True])
def test_two_step_generation_and_update_exact_times(exact):
    # two requests: prompts 2 and 3 tokens, responses 2 and 1 tokens, both admitted at step 0
    m = hand_models([([2, 3], [2, 1])])
    run = simulate(m, _cfg(m, exact=exact), rng=RNG, record_timeline=True)
    # step 0: n=2, context 2+3=5, prefill 5 -> 1 + 0.2 + 0.05 + 0.005 = 1.255
    # step 1: n=1 (the 1-token response finished), context 2+1 = 3 -> 1 + 0.1 + 0.03 = 1.13
    steps = [s for s in run.timeline if s.name == "gen.step"]
    assert [v for s in steps for v in (s.start, s.dur)] == pytest.approx([0.0, 1.255, 1.255, 1.13])
    assert [s.args["num_running"] for s in steps] == [2, 1]
    upd = next(s for s in run.timeline if s.name == "train.update")
    # update: 0.5 + 0.1 * tokens, tokens = 2 + 3 + 2 + 1 = 8
    assert (upd.start, upd.dur) == pytest.approx((2.385, 1.3))
    syn = next(s for s in run.timeline if s.name == "sync.weights")
    assert (syn.start, syn.dur) == pytest.approx((3.685, 0.2))
    assert run.step_time[0] == pytest.approx(3.885)
    assert run.gen_time[0] == pytest.approx(2.385)
    assert run.gen_steps[0] == 2
    assert run.responses_per_s == pytest.approx(2 / 3.885)
    assert {s.lane for s in run.timeline} >= {"gen/engine0", "train/trainer0", "sync"}


def test_one_slot_runs_requests_back_to_back_and_updates_follow():
    m = hand_models([([2, 3], [2, 1]), ([1, 1], [1, 1])], max_num_seqs=1)
    run = simulate(m, _cfg(m, updates=2), rng=RNG, record_timeline=True)
    steps = [s for s in run.timeline if s.name == "gen.step"]
    # round 0: req0 steps 0,1 (ctx 2, 3; prefill 2 at step 0), req1 step 2 (ctx 3, prefill 3)
    d0 = [1 + 0.1 + 0.02 + 0.002, 1 + 0.1 + 0.03, 1 + 0.1 + 0.03 + 0.003]
    assert [s.dur for s in steps[:3]] == pytest.approx(d0)
    t1 = sum(d0) + 0.5 + 0.1 * 8 + 0.2
    assert run.step_time[0] == pytest.approx(t1)
    # round 1 starts when update 0's sync ends
    assert steps[3].start == pytest.approx(t1)
    assert run.total_time == pytest.approx(run.step_time.sum())


def test_round_overhead_and_step_gaps():
    m = hand_models([([2, 3], [2, 1])], overhead=(0.05, 0.01, 0.002))
    run = simulate(m, _cfg(m), rng=RNG, record_timeline=True)
    steps = [s for s in run.timeline if s.name == "gen.step"]
    assert steps[0].start == pytest.approx(0.05 + 0.02)
    assert steps[1].start == pytest.approx(0.07 + 1.255 + 0.002)
    assert run.gen_time[0] == pytest.approx(0.07 + 2.385 + 2 * 0.002)


def test_kv_preemption_exact_steps():
    # block 4, capacity 2 blocks; two requests p=3, L=3. Steps 0-1 both run; at step 2 both need a
    # second block: the later one is preempted; step 2 runs request 0 alone (finishes); step 3
    # readmits request 1, recomputing 3+2 = 5 tokens, and finishes it.
    eng = EngineConfig(max_num_seqs=2, kv_cache_tokens=8, block_size=4, max_model_len=64)
    st = list(run_round_steps(np.array([3, 3]), np.array([3, 3]), eng))
    got = [(x.step, x.steps, x.num_running, x.context0, x.prefill, pre) for x, pre in st]
    assert got == [(0, 2, 2, 6.0, 6.0, 0), (2, 1, 1, 5.0, 0.0, 1), (3, 1, 1, 5.0, 5.0, 0)]
    m = hand_models([([3, 3], [3, 3])], kv_cache_tokens=8, block_size=4)
    run = simulate(m, _cfg(m, kv_cache_tokens=8, block_size=4), rng=RNG, record_timeline=True)
    assert run.exact_engine and run.preemptions[0] == 1 and run.gen_steps[0] == 4
    d = [1 + 0.2 + 0.06 + 0.006, 1 + 0.2 + 0.08, 1 + 0.1 + 0.05, 1 + 0.1 + 0.05 + 0.005]
    assert [s.dur for s in run.timeline if s.name == "gen.step"] == pytest.approx(d)
    assert run.gen_time[0] == pytest.approx(sum(d))


def test_fast_path_equals_step_loop_on_random_rounds():
    rng = np.random.default_rng(7)
    U, B = 5, 300
    p = np.repeat(rng.integers(3, 20, size=(U, B // 3)), 3, axis=1)
    L = rng.integers(1, 60, size=(U, B))
    eng = EngineConfig(max_num_seqs=37, kv_cache_tokens=10**7, block_size=16, max_model_len=512)
    plan = schedule_rounds(p, L, eng.max_num_seqs)
    ref = round_plan_exact(p, L, eng)
    for u in range(U):
        K, sr, sc, sp, pre, _, _, _ = ref[u]
        assert plan.steps[u] == K
        assert plan.sum_running[u] == sr
        assert plan.sum_context[u] == pytest.approx(sc)
        assert plan.sum_prefill[u] == pytest.approx(sp)
        assert pre == 0
        sa = step_arrays(plan.start[u], L[u], p[u])
        assert sa["num_running"].max() <= 37 and sa["num_running"].sum() == L[u].sum()
        assert sa["context_tokens"].sum() == pytest.approx(sc)
        assert sa["finished"].sum() == B


def test_fewer_requests_than_slots_take_the_longest_response():
    plan = schedule_rounds(np.array([[5, 5, 5]]), np.array([[4, 9, 2]]), 8)
    assert plan.steps[0] == 9 and plan.start.tolist() == [[0, 0, 0]]


def test_simulation_deterministic_and_seed_sensitive():
    m = hand_models([([2, 3, 4, 5], [5, 9, 2, 30])], max_num_seqs=2)
    cfg = SimConfig(prompts=8, group=4, updates=5, engine=EngineConfig(max_num_seqs=4, kv_cache_tokens=4096),
                    lengths="sampled")
    a = simulate(m, cfg, rng=np.random.default_rng(1))
    b = simulate(m, cfg, rng=np.random.default_rng(1))
    c = simulate(m, cfg, rng=np.random.default_rng(2))
    assert np.array_equal(a.step_time, b.step_time)
    assert not np.array_equal(a.step_time, c.step_time)


def test_over_generation_trains_the_first_g_of_each_prompt():
    # one prompt, G=2, B_gen=3 (one extra request of the same prompt): the 1-token extra finishes
    # first, so the trained pair is it and the 2-token response; the 5-token one is generated, not trained
    m = hand_models([([4, 4], [5, 2])], max_num_seqs=4)
    m = type(m)(**{**m.__dict__, "lengths": type(m.lengths)(prompt_tokens=np.array([4]), response_tokens=np.array([1]),
                                                             max_tokens=5, prefill_ratio=1.0)})
    cfg = SimConfig(prompts=1, group=2, updates=1, engine=EngineConfig(max_num_seqs=4, kv_cache_tokens=4096),
                    lengths="recorded", gen_batch=3)
    for exact in (False, True):
        from dataclasses import replace
        run = simulate(m, replace(cfg, exact_engine=exact), rng=np.random.default_rng(0))
        assert run.gen_steps[0] == 5
        assert run.responses[0] == 2
        assert run.tokens[0] == (4 + 1) + (4 + 2)


def test_shared_prompt_traces_count_one_prompt_per_group():
    """A trace whose trainer laid each group's prompt out once: tokens trained = one prompt per group plus
    every response token, with and without over-generation; the update cost follows."""
    from dataclasses import replace

    m = replace(hand_models([([4, 4], [5, 2])], max_num_seqs=4), shared_prompts=True)
    cfg = SimConfig(prompts=1, group=2, updates=1, engine=EngineConfig(max_num_seqs=4, kv_cache_tokens=4096),
                    lengths="recorded")
    run = simulate(m, cfg, rng=np.random.default_rng(0))
    assert run.tokens[0] == 4 + 5 + 2 and run.train_time[0] == pytest.approx(0.5 + 0.1 * 11)
    m = replace(m, lengths=replace(m.lengths, prompt_tokens=np.array([4]), response_tokens=np.array([1])))
    run = simulate(m, replace(cfg, gen_batch=3), rng=np.random.default_rng(0))  # the extra (1 token) is trained
    assert run.responses[0] == 2 and run.tokens[0] == 4 + 1 + 2
