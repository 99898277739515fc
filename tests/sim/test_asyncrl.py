"""Split devices and asynchronous rollout (rlsim.modes.split) on hand-made cost models: exact event times, the
staleness gate, partial rollout, eta = 0 as a synchronous schedule, idle ratios; sweeps and the CLI."""
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.core.config import EngineConfig, SimConfig, SplitConfig, WhatIf
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.modes.registry import simulate
from tests.sim.hand_models import hand_models

RNG = np.random.default_rng(0)
runner = CliRunner()


def _cfg(models, *, prompts=1, group=1, updates=2, split=None, max_num_seqs=4):
    eng = EngineConfig(max_num_seqs=max_num_seqs, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    return SimConfig(prompts=prompts, group=group, updates=updates, engine=eng, lengths="recorded", split=split)


def _spans(run, name, lane=None):
    """(start, dur) pairs of the named slices, flattened for pytest.approx."""
    return [v for s in run.timeline if s.name == name and (lane is None or s.lane == lane) for v in (s.start, s.dur)]


def _flat(pairs):
    return [v for pair in pairs for v in pair]


def test_staleness_gate_binds_with_eta_1():
    # One replica (4 slots), one trainer; P=1, G=1; every response 2 tokens, prompt 1 token. Engine step
    # = 1 + 0.25 x running (c_step, c_seq); update 3 s; sync 0.5 s; no rewards, prep or other.
    m = hand_models([([1], [2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    run = simulate(m, _cfg(m, split=SplitConfig(1, 1, staleness=1)), rng=RNG, record_timeline=True)
    # version 0: the gate admits (eta + v + 1) x P = 2 prompts; both run two steps of 2 sequences: 1.5 s each
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.5), (1.5, 1.5),
                                                     # version 1 (t = 6.5): the gate admits a 3rd prompt; alone: 1.25 s
                                                     (6.5, 1.25), (7.75, 1.25)]))
    # prompt 0 is batch 0 at t = 3: update [3, 6], sync [6, 6.5]; prompt 1 finished at 3 is batch 1: [6.5, 9.5],
    # sync [9.5, 10]
    assert _spans(run, "train.update") == pytest.approx(_flat([(3.0, 3.0), (6.5, 3.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(6.0, 0.5), (9.5, 0.5)]))
    # the gate is what binds: from 3 to 6 the replica has free slots and nothing it may start (idle, waiting for
    # the sync request), it joins the sync at once; from 9.0 likewise
    assert _spans(run, "gen.weight_sync", "gen/engine0") == pytest.approx(_flat([(6.0, 0.5), (9.5, 0.5)]))
    assert run.step_time == pytest.approx([6.5, 3.5]) and run.total_time == pytest.approx(10.0)
    assert run.gen_time == pytest.approx([3.0, 0.0])  # the trainer waited 3 s for batch 0, not for batch 1
    # batch 0 started at version 0 (lag 0), batch 1 at version 0 and trained by update 1 (lag 1)
    assert (run.staleness_mean, run.staleness_max) == (0.5, 1)
    resp = sorted((s.args["prompt_id"], s.args["start_version"], s.args["consumed_update"]) for s in run.timeline
                  if s.track == "response")
    assert resp == [(0, 0, 0), (1, 0, 1), (2, 1, None)]
    # idle ratios: the engine ran 3 + 2.5 s of 10 (idle 0.45); the trainer computed 2 x 3.5 s (idle 0.3)
    assert run.gen_idle_ratio == pytest.approx(0.45) and run.train_idle_ratio == pytest.approx(0.3)


def test_eta_0_is_the_synchronous_schedule():
    # the same models with eta = 0: one prompt per version, generated alone (2 x 1.25 s), then update and sync
    m = hand_models([([1], [2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4)
    run = simulate(m, _cfg(m, split=SplitConfig(1, 1, staleness=0)), rng=RNG, record_timeline=True)
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.25), (1.25, 1.25), (6.0, 1.25), (7.25, 1.25)]))
    assert _spans(run, "train.update") == pytest.approx(_flat([(2.5, 3.0), (8.5, 3.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(5.5, 0.5), (11.5, 0.5)]))
    assert run.step_time == pytest.approx([6.0, 6.0]) and (run.staleness_mean, run.staleness_max) == (0.0, 0)
    # and the colocated loop gives the same schedule (generate, update, sync) with the same models
    colo = simulate(m, _cfg(m), rng=RNG, record_timeline=True)
    assert colo.step_time == pytest.approx(run.step_time)
    assert _spans(colo, "gen.step") == pytest.approx(_spans(run, "gen.step"))


@pytest.mark.parametrize("max_num_seqs", [2, 8])
def test_eta_0_one_to_one_equals_colocated_on_a_richer_workload(max_num_seqs):
    # several prompts and groups, slots binding or not, rewards, prep, per-step and per-response overheads
    # (no per-round fixed overhead, and no `other`, which a split overlaps with the next generation)
    wl = [([3, 3, 5, 5, 2, 2], [4, 1, 6, 2, 3, 5]), ([4, 4, 1, 1, 6, 6], [2, 7, 1, 1, 4, 3])]
    m = hand_models(wl, update=(0.5, 0.1), sync=0.2, reward=0.01, prep=0.02, overhead=(0.0, 0.003, 0.002),
                    max_num_seqs=max_num_seqs, prompts=3, group=2)
    split = simulate(m, _cfg(m, prompts=3, group=2, updates=4, split=SplitConfig(1, 1), max_num_seqs=max_num_seqs),
                     rng=RNG)
    colo = simulate(m, _cfg(m, prompts=3, group=2, updates=4, max_num_seqs=max_num_seqs), rng=RNG)
    for k in ("step_time", "gen_time", "train_time", "sync_time", "other_time", "responses", "tokens", "gen_steps"):
        assert getattr(split, k) == pytest.approx(getattr(colo, k)), k
    # with `other`, the next generation starts at the sync's end while the trainer finishes the step
    m2 = replace(m, other=replace(m.other, intercept=0.3))
    split = simulate(m2, _cfg(m2, prompts=3, group=2, updates=4, split=SplitConfig(1, 1), max_num_seqs=max_num_seqs),
                     rng=RNG)
    colo = simulate(m2, _cfg(m2, prompts=3, group=2, updates=4, max_num_seqs=max_num_seqs), rng=RNG)
    assert split.step_time[0] == pytest.approx(colo.step_time[0])
    assert split.step_time[1:] == pytest.approx(colo.step_time[1:] - 0.3)


def _partial_models():
    # P=1, G=1, prompts of 1 token; responses: 1, 6, 3 tokens. Step = 1 s + 0.1 s per prefill token; update 2.5 s;
    # sync 0.5 s
    return hand_models([([1], [1]), ([1], [6]), ([1], [3])], c=(1.0, 0.0, 0.0, 0.1), update=(2.5, 0.0), sync=0.5)


def test_partial_rollout_continues_a_response_across_a_sync():
    m = _partial_models()
    run = simulate(m, _cfg(m, split=SplitConfig(1, 1, staleness=1, partial_rollout=True)), rng=RNG,
                   record_timeline=True)
    # step 0: prompts 0 and 1 (eta = 1 admits 2), prefill 2 tokens: 1.2 s; prompt 0 finishes -> batch 0,
    # update [1.2, 3.7]
    # prompt 1 runs alone from 1.2 (1 s steps); the sync request at 3.7 falls in the step [3.2, 4.2]: the engine
    # finishes it, joins, and the sync runs [4.2, 4.7] (the trainer waited 0.5 s)
    # at 4.7 (version 1): prompt 1 continues, its 1 + 4 tokens recomputed, with prompt 2 admitted (1 prompt token):
    # prefill 6 -> 1.6 s; prompt 1's 6th token ends it at 7.3 -> batch 1, update [7.3, 9.8]; prompt 2 runs to 8.3
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.2), (1.2, 1.0), (2.2, 1.0), (3.2, 1.0), (4.7, 1.6),
                                                     (6.3, 1.0), (7.3, 1.0)]))
    assert [s.args["prefill_tokens"] for s in run.timeline if s.name == "gen.step"] == [2, 0, 0, 0, 6, 0, 0]
    assert _spans(run, "train.update") == pytest.approx(_flat([(1.2, 2.5), (7.3, 2.5)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(4.2, 0.5), (9.8, 0.5)]))
    assert _spans(run, "gen.weight_sync") == pytest.approx(_flat([(4.2, 0.5), (9.8, 0.5)]))
    # the trainer waited for batch 0 (1.2 s) and for the engine to join the sync (0.5 s), then for batch 1 (4.7 to 7.3)
    assert run.gen_time == pytest.approx([1.2 + 0.5, 2.6]) and run.total_time == pytest.approx(10.3)
    p1 = next(s for s in run.timeline if s.track == "response" and s.args["prompt_id"] == 1)
    assert (p1.start, p1.dur) == pytest.approx((0.0, 7.3))
    assert (p1.args["start_version"], p1.args["finish_version"], p1.args["consumed_update"],
            p1.args["staleness"]) == (0, 1, 1, 1)


def test_without_partial_rollout_the_sync_waits_for_in_flight_responses():
    m = _partial_models()
    run = simulate(m, _cfg(m, split=SplitConfig(1, 1, staleness=1)), rng=RNG, record_timeline=True)
    # prompt 1 finishes on version 0's weights at 1.2 + 5 = 6.2; only then the engine joins: sync [6.2, 6.7]
    assert _spans(run, "sync.weights")[:2] == pytest.approx([6.2, 0.5])
    assert _spans(run, "gen.step")[:12] == pytest.approx(_flat([(0.0, 1.2), (1.2, 1.0), (2.2, 1.0), (3.2, 1.0),
                                                                (4.2, 1.0), (5.2, 1.0)]))  # not interrupted at 3.7
    p1 = next(s for s in run.timeline if s.track == "response" and s.args["prompt_id"] == 1)
    assert (p1.args["start_version"], p1.args["finish_version"]) == (0, 0)
    # prompt 2 starts at 6.7 (1.1 s, then 1 s steps) and runs to 9.8: the second sync waits for it
    assert _spans(run, "sync.weights")[2:] == pytest.approx([9.8, 0.5])
    assert run.gen_time == pytest.approx([1.2 + 2.5, 0.0 + 0.6])


def _straggler_run(c, update, partial, updates=6):
    # P=1, G=2, eta = 1, prompts of 1 token, each group a 1-token and a 3-token response; no prefill cost, so
    # partial rollout's re-prefill is free and only the order of generation differs; sync 0 s
    m = hand_models([([1, 1], [1, 3])] * 6, c=c, update=(update, 0.0), sync=0.0, max_num_seqs=4, group=2)
    return simulate(m, _cfg(m, group=2, updates=updates, split=SplitConfig(1, 1, staleness=1,
                                                                           partial_rollout=partial)),
                    rng=RNG, record_timeline=True)


def test_partial_rollout_shares_the_engine_between_the_straggler_and_the_next_batch():
    # Step cost 1 s per running sequence (no per-step cost: batching saves nothing, as on a CPU where the
    # per-sequence term dominates); update 3 s. Prompts 0 and 1: step [0, 4] with 4 running, then 2 x 2 s: both
    # complete at 8, update 0 [8, 11]. At 11 (v1) prompt 2 starts: [11, 13] 2 running, [13, 14] its straggler alone.
    # Update 1 [11, 14] then asks for the sync.
    # Waiting: the straggler's last token [14, 15], sync at 15, update 2 [15, 18]; prompt 3 [15, 17], [17, 18],
    # [18, 19]; the sync waits for it to 19: 4 s per update.
    wait = _straggler_run((0.0, 1.0, 0.0, 0.0), 3.0, False)
    assert _spans(wait, "train.update")[:8] == pytest.approx(_flat([(8, 3), (11, 3), (15, 3), (19, 3)]))
    assert wait.step_time[1:] == pytest.approx([4.0] * 5)
    # Partial rollout: the engine joins at 14, prompt 3 starts beside the straggler's last token, a 3-running step
    # [14, 17]: prompt 2 completes at 17, not 15 -> update 2 [17, 20]; prompt 3 still ends at 19 ([17, 18], [18, 19]:
    # starting 1 s earlier gained nothing), the engine idles to the sync at 20, update 3 [20, 23]; then again from
    # prompt 4 at 20 as from prompt 2 at 11: 3 s and 6 s, 4.5 s per update, 1/8 slower than waiting
    part = _straggler_run((0.0, 1.0, 0.0, 0.0), 3.0, True)
    assert _spans(part, "gen.step")[8:14] == pytest.approx(_flat([(13, 1), (14, 3), (17, 1)]))
    assert _spans(part, "train.update") == pytest.approx(_flat([(8, 3), (11, 3), (17, 3), (20, 3), (26, 3), (29, 3)]))
    assert part.step_time[1:] == pytest.approx([3.0, 6.0, 3.0, 6.0, 3.0])
    assert part.gen_time[1:] == pytest.approx([0.0, 3.0, 0.0, 3.0, 0.0])  # the trainer waits for the straggler
    # With a per-step cost only (1 s a step whatever runs: batching is free, as in memory-bound GPU decoding) the
    # next batch costs the straggler nothing, and with update 2 s partial rollout wins: 2.5 s per update against 3
    flat_wait, flat_part = (_straggler_run((1.0, 0.0, 0.0, 0.0), 2.0, p, updates=12) for p in (False, True))
    assert flat_wait.step_time[1:] == pytest.approx([3.0] * 11)
    assert flat_part.step_time[1:] == pytest.approx([2.0, 3.0] * 5 + [2.0])


def test_data_parallel_ranks_all_reduce_and_idle_ratios_by_hand():
    # P=2, G=1, eta = 0, one replica of 2 slots, 1 s steps: prompt 0 (1 token) ends at 1, prompt 1 (2 tokens) at 2.
    # Two ranks balanced by tokens, longest first: update = 0.5 + 0.5 x tokens -> rank 0 prompt 1 (1 + 2 tokens) 2.0 s,
    # rank 1 prompt 0 (1 + 1) 1.5 s; ring all-reduce of 1 GB at 1 GB/s over 2 ranks: 2 (2-1)/2 x 1 = 1.0 s; sync 0.2 s
    m = replace(hand_models([([1, 1], [1, 2])], c=(1.0, 0.0, 0.0, 0.0), update=(0.5, 0.5), sync=0.2, prompts=2,
                            group=1), sync_bytes=1e9)
    sp = SplitConfig(1, 2, allreduce_gbs=1.0, bandwidth_source="test")
    run = simulate(m, _cfg(m, prompts=2, updates=1, split=sp, max_num_seqs=2), rng=RNG, record_timeline=True)
    assert _spans(run, "train.update", "train/trainer0") == pytest.approx(_flat([(2.0, 2.0)]))
    assert _spans(run, "train.update", "train/trainer1") == pytest.approx(_flat([(2.0, 1.5)]))
    assert _spans(run, "train.allreduce") == pytest.approx(_flat([(4.0, 1.0), (4.0, 1.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(5.0, 0.2)])) and run.total_time == pytest.approx(5.2)
    assert run.train_time[0] == pytest.approx(3.0) and run.split.allreduce_s == pytest.approx(1.0)
    # engine busy 2 s of 5.2; rank 0 busy 2 + 1 + 0.2, rank 1 1.5 + 1 + 0.2: idle (2.5 + 2.0) / 2 of 5.2
    assert run.gen_idle_ratio == pytest.approx(3.2 / 5.2)
    assert run.train_idle_ratio == pytest.approx(2.25 / 5.2)
    lanes = {s.lane for s in run.timeline}
    assert {"gen/engine0", "train/trainer0", "train/trainer1", "sync", "rl"} <= lanes


def test_replicas_share_one_queue_and_each_is_the_recorded_engine():
    # two replicas of 1 slot: prompts 0 and 1 run at once, one on each engine, each step priced as one engine's
    m = hand_models([([1, 1], [2, 2])] * 3, c=(1.0, 0.25, 0.0, 0.0), update=(1.0, 0.0), sync=0.5, prompts=2, group=1)
    run = simulate(m, _cfg(m, prompts=2, updates=2, split=SplitConfig(2, 1), max_num_seqs=1), rng=RNG,
                   record_timeline=True)
    assert (_spans(run, "gen.step", "gen/engine0")
            == pytest.approx(_flat([(0.0, 1.25), (1.25, 1.25), (4.0, 1.25), (5.25, 1.25)])))
    assert _spans(run, "gen.step", "gen/engine1") == _spans(run, "gen.step", "gen/engine0")
    assert run.total_time == pytest.approx(2 * (2.5 + 1.0 + 0.5))


def test_kv_cache_preemption_in_a_replica():
    # the engine's own KV test case (test_sim_engine.test_kv_preemption_exact_steps), one replica, eta = 0:
    # the same four steps and one preemption
    m = hand_models([([3, 3], [3, 3])], kv_cache_tokens=8, block_size=4, prompts=2, group=1)
    cfg = SimConfig(prompts=2, group=1, updates=1, engine=EngineConfig(max_num_seqs=2, kv_cache_tokens=8, block_size=4,
                                                                        max_model_len=64), lengths="recorded",
                    split=SplitConfig(1, 1))
    run = simulate(m, cfg, rng=RNG, record_timeline=True)
    d = [1 + 0.2 + 0.06 + 0.006, 1 + 0.2 + 0.08, 1 + 0.1 + 0.05, 1 + 0.1 + 0.05 + 0.005]
    assert [s.dur for s in run.timeline if s.name == "gen.step"] == pytest.approx(d)
    assert run.preemptions.sum() == 1 and run.exact_engine


def test_split_configs_are_validated():
    with pytest.raises(RlsimError, match="does not divide"):
        m = hand_models([([1], [2])])
        simulate(m, _cfg(m, prompts=3, group=1, split=SplitConfig(1, 2, allreduce_gbs=1.0)), rng=RNG)
    for kw, msg in [(dict(staleness=-1), "--staleness must be a non-negative"),
                    (dict(partial_rollout=True), "--partial-rollout needs"),
                    (dict(gen_gpus=0, train_gpus=1), "--gen-gpus must be a positive"),
                    (dict(gen_gpus=2), "needs --train-gpus"),
                    (dict(staleness=2), "needs split devices"), (dict(gen_gpus=1, train_gpus=1, gpus=2), "--gpus"),
                    (dict(gen_gpus=1, train_gpus=1, gen_batch=64), "--gen-batch")]:
        with pytest.raises(RlsimError, match=msg):
            WhatIf(**kw).validate()
    WhatIf(staleness=0).validate()  # 0 is the colocated loop's own


# ---- the what-if layer, sweeps, the CLI -----------------------------------------------------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A synthetic CPU trace (unmeasured host cpu-synthetic: interconnect of the measured hosts), and one at the same
    batch recorded with staleness 2 whose learning is slower per response."""
    d = tmp_path_factory.mktemp("async")
    a = synthetic_trace(d / "sync.parquet", SynthSpec(prompts=8, group=4, steps=6, max_num_seqs=16))
    b = synthetic_trace(d / "stale2.parquet",
                        SynthSpec(prompts=8, group=4, steps=6, max_num_seqs=16, score_scale=3000.0),
                        meta_overrides={"config": {"staleness": 2}})
    return a, b


def test_sweep_over_the_split_equals_single_runs(traces):
    from rlsim.sweeps import backends
    from rlsim.core.grid import build_grid
    from rlsim.whatif.predict import evaluate
    from rlsim.whatif.study import prepare

    study = prepare([read_trace(traces[0])])
    grid = build_grid(WhatIf, {"prompts": [8, 16], "gen_gpus": [1, 2], "train_gpus": [1, 2], "staleness": [0, 2],
                               "partial_rollout": [False, True], "updates": [4]})
    rows = backends.run_sweep(study, grid, workers=2)
    for cfg, row in zip(grid, rows):
        one = evaluate(study, cfg).to_dict()
        assert backends.same_rows([{k: row[k] for k in one}], [one]), cfg
    fast = [r for r in rows if r["gen_gpus"] == 2 and r["staleness"] == 2]
    assert all(r["staleness_max"] >= 1 and r["mode"].startswith("split 2 gen") for r in fast)
    assert any(r["allreduce_s"] > 0 for r in rows if r["train_gpus"] == 2)
    # the report's chart of T ratio over the split, per staleness: only when the sweep varied the split
    from rlsim.present.views import build_charts

    tr = [read_trace(traces[0])]
    axes = {"prompts": [8, 16], "gen_gpus": [1, 2], "train_gpus": [1, 2], "staleness": [0, 2],
            "partial_rollout": [False, True]}
    charts = build_charts(traces=tr, study=study, rows=rows, meta={"grid": {"axes": axes}})
    layers = charts["split"].to_dict()["layer"]
    pts = [p for layer in layers for p in layer.get("data", {}).get("values", []) if "split" in p]
    assert ({p["split"] for p in pts} == {"1:1", "1:2", "2:1", "2:2"}
            and {p["staleness"] for p in pts} == {"eta=0", "eta=2"})
    assert len(pts) == len(rows)
    plain = [r for r in rows if r["gen_gpus"] == 1 and r["train_gpus"] == 1]
    assert "split" not in build_charts(traces=tr, study=study, rows=plain,
                                       meta={"grid": {"axes": {"prompts": [8, 16]}}})


def test_staleness_sample_cost_from_curves_and_the_default(traces):
    from rlsim.whatif.predict import evaluate
    from rlsim.whatif.study import prepare

    t = [read_trace(p) for p in traces]
    study = prepare(t, target=0.05)
    n0, n2 = (c.samples_to_target(0.05) for c in study.curves)
    assert n2 > n0 > 0
    out = evaluate(study, WhatIf(gen_gpus=1, train_gpus=1, staleness=1, updates=4))
    assert out.rho_staleness == pytest.approx((n0 + (n2 - n0) / 2) / n0)  # linear in eta between 0 and 2
    assert out.rho == pytest.approx(out.rho_staleness)  # the batch's own rho is 1 (same batch)
    assert any("learning curves recorded at staleness 0, 2" in w for w in out.warnings)
    # the colocated candidate is unaffected by the staleness trace (the batch curves use staleness 0 only)
    assert evaluate(study, WhatIf(updates=4)).rho == pytest.approx(1.0)
    alone = prepare([t[0]])
    for eta, beyond in ((2, False), (8, True)):
        o = evaluate(alone, WhatIf(gen_gpus=2, train_gpus=1, staleness=eta, updates=4))
        assert o.rho_staleness == 1.0 and any("arXiv:2505.24298" in w for w in o.warnings)
        assert any("beyond eta = 4" in w for w in o.warnings) == beyond


def test_cli_bad_split_input_is_one_line_exit_2(traces):
    base = ["run", "--trace", str(traces[0]), "--updates", "3"]
    for extra, msg in [(["--staleness", "-1"], "--staleness must be a non-negative"),
                       (["--partial-rollout"], "--partial-rollout needs split devices"),
                       (["--gen-gpus", "0", "--train-gpus", "1"], "--gen-gpus must be a positive"),
                       (["--gen-gpus", "2", "--train-gpus", "3"], "--train-gpus 3 does not divide"),
                       (["--gen-gpus", "2"], "needs --train-gpus")]:
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        assert msg in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_cli_run_and_perfetto_export_show_every_engine_and_rank(traces, tmp_path):
    import json

    from rlsim.present import perfetto as pf

    res = runner.invoke(app, ["run", "--trace", str(traces[0]), "--updates", "4", "--gen-gpus", "2", "--train-gpus",
                              "2", "--staleness", "1", "--partial-rollout", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["mode"] == "split 2 gen : 2 train, staleness 1, partial rollout" and 0 <= d["gen_idle_ratio"] <= 1
    assert any("all-reduce" in n and "cpu-synthetic" in n for n in d["notes"])  # how the split was modelled
    out = tmp_path / "sim.json"
    res = runner.invoke(app, ["export", "perfetto", "--simulate", "--trace", str(traces[0]), "--gen-gpus", "2",
                              "--train-gpus", "2", "--staleness", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    obj = json.loads(out.read_text())
    counts = pf.check_chrome_trace(obj)
    procs = {e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"gen/engine0", "gen/engine1", "train/trainer0", "train/trainer1", "sync", "rl"} <= procs
    assert counts["gen_step"] > 0 and counts["response"] > 0 and counts["allreduce"] == 2 * 5 and counts["sync"] == 5


def test_a_long_response_is_consumed_before_it_exceeds_the_limit():
    # P = G = 1, eta = 1, partial rollout: prompt 0 needs 10 tokens, the others 2. Consumed in completion order,
    # prompt 1 (update 0) and prompt 2 (admitted at version 1, done before prompt 0) would go first and prompt 0
    # would reach update 2, two versions after it started. The rule makes update 1 wait for prompt 0.
    m = hand_models([([1], [10]), ([1], [2]), ([1], [2]), ([1], [2])], c=(1.0, 0.0, 0.0, 0.0), update=(1.0, 0.0),
                    sync=0.1, max_num_seqs=4)
    run = simulate(m, _cfg(m, updates=3, split=SplitConfig(1, 1, staleness=1, partial_rollout=True)), rng=RNG,
                   record_timeline=True)
    resp = sorted((s.args["prompt_id"], s.args["start_version"], s.args["consumed_update"]) for s in run.timeline
                  if s.track == "response" and s.args["consumed_update"] is not None)
    assert resp == [(0, 0, 1), (1, 0, 0), (2, 1, 2)]
    assert run.staleness_max == 1
