"""The execution modes of rlsim.modes.registry on hand-made cost models: each mode's timeline computed by hand,
its settings checked up front, and the CLI and API selecting it."""
import json
from pathlib import Path

import numpy as np
import pytest
import simpy
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.core.config import EngineConfig, SimConfig, SplitConfig, WhatIf
from rlsim.modes.registry import MODES, check, simulate, spec_of, split_config
from rlsim.modes.requests import AdmissionGate, FinishedGroups
from rlsim.replay.errors import RlsimError
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from tests.sim.hand_models import hand_models

RNG = np.random.default_rng(0)
NOT_STARTED = np.iinfo(np.int64).max
runner = CliRunner()


def _run(m, prompts=1, updates=2, **whatif):
    """Simulate WhatIf(**whatif)'s mode, as the registry configures it, with the hand models m."""
    sp = split_config(WhatIf(**whatif), m, None)
    eng = EngineConfig(max_num_seqs=4, kv_cache_tokens=4096, block_size=16, max_model_len=256)
    cfg = SimConfig(prompts=prompts, group=1, updates=updates, engine=eng, lengths="recorded", split=sp)
    return simulate(m, cfg, rng=RNG, record_timeline=True)


def _spans(run, name, lane=None):
    return [v for s in run.timeline if s.name == name and (lane is None or s.lane == lane) for v in (s.start, s.dur)]


def _flat(pairs):
    return [v for pair in pairs for v in pair]


def _gate_models(n=3):
    # P=1, G=1; prompts of 1 token, responses of 2. Engine step = 1 + 0.25 x running; update 3 s; sync 0.5 s
    return hand_models([([1], [2])] * n, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4)


def _partial_models():
    # P=1, G=1, prompts of 1 token; responses 1, 6, 3 tokens. Step = 1 s + 0.1 s per prefill token; update 2.5 s;
    # sync 0.5 s
    return hand_models([([1], [1]), ([1], [6]), ([1], [3])], c=(1.0, 0.0, 0.0, 0.1), update=(2.5, 0.0), sync=0.5)


def _stream_models(n=6):
    # P=2, G=1; prompts of 1 token; per batch responses of 1 and 3 tokens. Step = 1 + 0.25 x running; update 3 s;
    # sync 0.5 s
    return hand_models([([1, 1], [1, 3])] * n, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4,
                       prompts=2, group=1)


def test_every_framework_mode_is_registered_with_its_source():
    names = {"colocated", "split", "areal", "nemo_async", "one_step_off", "fully_async", "colocate_async",
             "separate_async", "separate_async_switch"}
    assert names <= set(MODES) and all(MODES[n].source for n in names)


def test_one_step_off_generates_the_next_batch_on_the_previous_weights():
    run = _run(_gate_models(), mode="one_step_off", gen_gpus=1, train_gpus=1)
    # version 0 admits batches 0 and 1 (2 sequences: 1.5 s steps); batch 0 ready at 3: update [3, 6], sync [6, 6.5];
    # version 1 admits batch 2, alone: 1.25 s steps; batch 1 (finished at 3) trains [6.5, 9.5], sync [9.5, 10]
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.5), (1.5, 1.5), (6.5, 1.25), (7.75, 1.25)]))
    assert _spans(run, "train.update") == pytest.approx(_flat([(3.0, 3.0), (6.5, 3.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(6.0, 0.5), (9.5, 0.5)]))
    assert (run.staleness_mean, run.staleness_max) == (0.5, 1) and run.split.mode == "one_step_off"


def test_colocate_async_stops_its_hybrid_replicas_for_training_and_resumes_partial_rollouts():
    run = _run(_gate_models(), mode="colocate_async", train_gpus=1, num_warmup_batches=1)
    # warm-up: (1 + 1) x P = 2 prompts dispatched, both run [0, 1.5], [1.5, 3]; at 3 the trainer takes prompt 0 (one
    # prompt refilled) and switches the replica (idle) to training at once: update [3, 6], sync [6, 6.5]
    # version 1: prompt 2 (the refill) runs alone from 6.5 (1.25 s steps); the trainer takes prompt 1 (finished at 3)
    # at 6.5 and switches the replica at the end of its step in progress: 7.75; update [7.75, 10.75],
    # sync [10.75, 11.25]
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.5), (1.5, 1.5), (6.5, 1.25)]))
    assert _spans(run, "gen.weight_sync") == pytest.approx(_flat([(3.0, 3.5), (7.75, 3.5)]))
    assert _spans(run, "train.update") == pytest.approx(_flat([(3.0, 3.0), (7.75, 3.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(6.0, 0.5), (10.75, 0.5)]))
    assert run.step_time == pytest.approx([6.5, 4.75]) and run.gen_time == pytest.approx([3.0, 1.25])
    assert (run.staleness_mean, run.staleness_max) == (0.5, 1) and run.split.hybrid


def test_separate_async_trains_each_mini_batch_as_it_is_ready():
    run = _run(_stream_models(), prompts=2, mode="separate_async", gen_gpus=1, train_gpus=1, num_warmup_batches=0,
               parameter_sync_step=2)
    # P = 2 prompts, parameter_sync_step = 2: a fetch is 1 prompt, trained at 3 / 2 = 1.5 s (its share of the step);
    # a prompt trained is refilled, and joins the engine at its next step (the stretch in progress is cut).
    # 0: prompts 0 (1 token) and 1 (3 tokens) [0, 1.5]; prompt 0 trained [1.5, 3]; prompt 1 steps alone [1.5, 2.75],
    # then with the refill, prompt 2 (1 token), [2.75, 4.25]: both done; prompt 1 trained [4.25, 5.75]; its refill,
    # prompt 3 (3 tokens), runs from 4.25 (1.25 s steps); the sync asked at 5.75 waits for the step [5.5, 6.75]:
    # sync [6.75, 7.25]. Version 1: prompt 3's last token [7.25, 8.5]; prompt 2 trained [7.25, 8.75]; prompt 4 (1
    # token) [8.5, 9.75]; prompt 3 trained [8.75, 10.25]; prompt 5 from 9.75, the sync waits for [9.75, 11]: [11, 11.5]
    assert _spans(run, "train.update") == pytest.approx(_flat([(1.5, 1.5), (4.25, 1.5), (7.25, 1.5), (8.75, 1.5)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(6.75, 0.5), (11.0, 0.5)]))
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.5), (1.5, 1.25), (2.75, 1.5), (4.25, 1.25),
                                                     (5.5, 1.25), (7.25, 1.25), (8.5, 1.25), (9.75, 1.25)]))
    assert run.step_time == pytest.approx([7.25, 4.25]) and run.train_time == pytest.approx([3.0, 3.0])
    assert run.gen_time == pytest.approx([1.5 + 1.25 + 1.0, 0.0 + 0.0 + 0.75])
    p3 = next(s for s in run.timeline if s.track == "response" and s.args["prompt_id"] == 3)
    assert (p3.args["start_version"], p3.args["finish_version"], p3.args["consumed_update"]) == (0, 1, 1)


def test_separate_async_switch_lends_the_training_devices_replica_until_the_threshold():
    run = _run(_stream_models(), prompts=2, mode="separate_async_switch", gen_gpus=1, train_gpus=1,
               num_warmup_batches=1, switch_threshold_ratio=1.0)
    # 4 prompts dispatched, dealt out over 2 replicas. The trainer finds none ready: the hybrid replica switches to
    # rollout (the fitted sync, 0.5 s) while the standalone one runs prompts 0 (1 token) and 1 (3 tokens) at 1.5 s a
    # step. At 0.5 the hybrid one takes prompt 2 (1 token): [0.5, 1.75]; at 1.5 the standalone one takes prompt 3.
    # At 1.75 prompts 0 and 2 are ready (the threshold, 1.0 x P): the hybrid replica switches back (idle) and the
    # trainer trains them [1.75, 4.75]; their refills: the standalone replica ends its step [1.5, 3] and takes prompt
    # 4 beside 1 and 3: [3, 4.75] (1.75 s), where 1 and 4 finish; the sync asked at 4.75 runs at once: [4.75, 5.25]
    assert _spans(run, "gen.switch", "gen/engine1") == pytest.approx([0.0, 0.5])
    assert _spans(run, "gen.step", "gen/engine1") == pytest.approx([0.5, 1.25])
    assert _spans(run, "gen.step", "gen/engine0")[:6] == pytest.approx(_flat([(0.0, 1.5), (1.5, 1.5), (3.0, 1.75)]))
    assert _spans(run, "train.update")[:4] == pytest.approx(_flat([(1.75, 3.0), (5.25, 3.0)]))
    assert _spans(run, "sync.weights")[:2] == pytest.approx([4.75, 0.5])
    assert run.step_time[0] == pytest.approx(5.25) and run.gen_time[0] == pytest.approx(1.75)


def test_a_reclaimed_hybrid_replica_hands_its_response_back_with_its_tokens():
    m = hand_models([([1, 1], [3, 1])] * 6, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, max_num_seqs=4,
                    prompts=2, group=1)
    run = _run(m, prompts=2, mode="separate_async_switch", gen_gpus=1, train_gpus=1, num_warmup_batches=1,
               switch_threshold_ratio=1.0)
    # prompts of 3, 1, 3, 1 ... tokens. Standalone: prompts 0, 1 [0, 1.5]; prompt 1 done, 3 joins [1.5, 3]: 3 done;
    # prompts 1 and 3 are the threshold at 3. Hybrid (lent [0, 0.5]): prompt 2 from 0.5, 1.25 s steps; reclaimed at
    # 3, the end of its 2nd step: prompt 2 goes back with 2 tokens. The standalone replica finishes prompt 0
    # [3, 4.25], then resumes prompt 2 (its 1 + 2 tokens prefilled) beside prompt 4 (1 token): prefill 4,
    # [4.25, 5.75], where prompt 2 ends; then 4 and 5 [5.75, 7.25]; the sync asked at 6 waits for that step
    assert _spans(run, "gen.step", "gen/engine1") == pytest.approx(_flat([(0.5, 1.25), (1.75, 1.25)]))
    assert _spans(run, "gen.step", "gen/engine0")[:10] == pytest.approx(_flat(
        [(0.0, 1.5), (1.5, 1.5), (3.0, 1.25), (4.25, 1.5), (5.75, 1.5)]))
    steps0 = [s for s in run.timeline if s.name == "gen.step" and s.lane == "gen/engine0"]
    assert steps0[3].args["prefill_tokens"] == 4
    assert _spans(run, "train.update")[:2] == pytest.approx([3.0, 3.0])
    assert _spans(run, "sync.weights")[:2] == pytest.approx([7.25, 0.5])
    p2 = next(s for s in run.timeline if s.track == "response" and s.args["prompt_id"] == 2)
    assert (p2.start, p2.dur) == pytest.approx((0.5, 5.25))


def test_fully_async_on_policy_stream_waits_for_the_sync_to_admit_more():
    run = _run(_stream_models(), prompts=2, mode="fully_async", gen_gpus=1, train_gpus=1,
               trigger_parameter_sync_step=2)
    # staleness_threshold 0: 2 prompts per version. Prompt 0 trained [1.5, 3], prompt 1 (done at 4) [4, 5.5]; the
    # replica is idle, joins at once: sync [5.5, 6]; version 1 repeats the step 6 s later
    assert _spans(run, "train.update") == pytest.approx(_flat([(1.5, 1.5), (4.0, 1.5), (7.5, 1.5), (10.0, 1.5)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(5.5, 0.5), (11.5, 0.5)]))
    assert run.step_time == pytest.approx([6.0, 6.0]) and (run.staleness_mean, run.staleness_max) == (0.0, 0)


def test_fully_async_holds_at_most_its_cap_of_prompts_in_flight():
    run = _run(_stream_models(), prompts=2, mode="fully_async", gen_gpus=1, train_gpus=1,
               trigger_parameter_sync_step=2, concurrent_samples_per_replica=1)
    # one prompt in flight, though the engine has 4 slots: prompt 0 (1 token) alone [0, 1.25], trained [1.25, 2.75];
    # prompt 1 (3 tokens) then alone, 1.25 s a step, [1.25, 5], trained [5, 6.5]; the idle replica joins the sync at
    # once [6.5, 7]; version 1 repeats it 7 s later
    assert _spans(run, "gen.step") == pytest.approx(_flat([(t, 1.25) for t in (0.0, 1.25, 2.5, 3.75)]
                                                          + [(t + 7.0, 1.25) for t in (0.0, 1.25, 2.5, 3.75)]))
    assert _spans(run, "train.update") == pytest.approx(_flat([(1.25, 1.5), (5.0, 1.5), (8.25, 1.5), (12.0, 1.5)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(6.5, 0.5), (13.5, 0.5)]))
    assert run.step_time == pytest.approx([7.0, 7.0])
    assert any("at most 1 prompt in flight per replica" in n for n in run.notes)
    assert split_config(WhatIf(mode="fully_async", gen_gpus=1, train_gpus=1), _stream_models(), None).inflight == 16
    with pytest.raises(RlsimError, match="the cap on prompts in flight per replica must be 0 .* or more, got -1"):
        SplitConfig(inflight=-1).validate(64, 8)


def test_areal_holds_at_most_max_concurrent_rollouts_in_flight():
    run = _run(_stream_models(), prompts=2, mode="areal", gen_gpus=1, train_gpus=1, max_concurrent_rollouts=1)
    # eta 0, one rollout in flight: prompt 0 (1 token) alone [0, 1.25], then prompt 1 (3 tokens) alone [1.25, 5];
    # update [5, 8], the idle replica joins the sync [8, 8.5]; version 1 repeats it 8.5 s later. Without the cap both
    # run together (1.5 s steps) and the step is 7.5 s
    assert _spans(run, "gen.step") == pytest.approx(_flat([(t, 1.25) for t in (0.0, 1.25, 2.5, 3.75)]
                                                          + [(t + 8.5, 1.25) for t in (0.0, 1.25, 2.5, 3.75)]))
    assert _spans(run, "train.update") == pytest.approx(_flat([(5.0, 3.0), (13.5, 3.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(8.0, 0.5), (16.5, 0.5)]))
    assert run.step_time == pytest.approx([8.5, 8.5])
    free = _run(_stream_models(), prompts=2, mode="areal", gen_gpus=1, train_gpus=1)
    assert free.step_time == pytest.approx([7.5, 7.5])
    # AReaL's default: the consumer batch (P prompts), each of the 4 replicas its share
    sp = split_config(WhatIf(mode="areal", gen_gpus=4, train_gpus=1, prompts=64), _stream_models(), None)
    assert sp.inflight == 16


def test_nemo_in_flight_weight_updates_keep_the_old_kv_unless_recomputed():
    kw = dict(mode="nemo_async", gen_gpus=1, train_gpus=1, in_flight_weight_updates=True)
    run = _run(_partial_models(), **kw)
    # as AReaL's partial rollout (tests/sim/test_asyncrl.py) up to the sync [4.2, 4.7]; then only prompt 2's 1 token is
    # prefilled (1.1 s): prompt 1's 6th token ends at 6.8 -> update [6.8, 9.3]; prompt 2 ends at 7.8; sync [9.3, 9.8]
    assert _spans(run, "gen.step") == pytest.approx(_flat([(0.0, 1.2), (1.2, 1.0), (2.2, 1.0), (3.2, 1.0), (4.7, 1.1),
                                                     (5.8, 1.0), (6.8, 1.0)]))
    assert _spans(run, "sync.weights") == pytest.approx(_flat([(4.2, 0.5), (9.3, 0.5)]))
    again = _run(_partial_models(), recompute_kv_cache_after_weight_updates=True, **kw)
    assert [s.args["prefill_tokens"] for s in again.timeline if s.name == "gen.step"] == [2, 0, 0, 0, 6, 0, 0]
    areal = _run(_partial_models(), mode="areal", gen_gpus=1, train_gpus=1, max_head_offpolicyness=1,
                 partial_rollout=True)
    assert areal.total_time == pytest.approx(again.total_time) == pytest.approx(10.3)


def _finished(pv, **kw):
    env = simpy.Environment()
    gate = AdmissionGate(1, 0.0, pv, refill=True)
    return env, gate, FinishedGroups(env, 1, 0.0, pv, fifo=True, gate=gate, **kw)


def test_verl_v1_drop_evicts_an_old_group_and_refills_one_prompt():
    pv = np.array([0, 2, 2, NOT_STARTED], np.int64)
    env, gate, fg = _finished(pv, off_policy=1)
    fg.put(np.array([0, 1]))
    out = []
    env.process((lambda: (out.append((yield from fg.take(2, 1)))))())
    env.run()
    # prompt 0 is 2 versions old at update 2 (> 1): evicted, one prompt refilled; prompt 1 is trained
    assert list(out[0]) == [1] and fg.dropped == 1 and gate.released == 2 and gate.bound(0) == 3


def test_verl_v1_wait_holds_training_for_a_group_in_flight_at_the_threshold():
    pv = np.array([0, 2, NOT_STARTED], np.int64)
    env, gate, fg = _finished(pv, off_policy=2, wait=True)
    fg.put(np.array([1]))
    out = []
    env.process((lambda: (out.append((yield from fg.take(2, 1)))))())
    env.run()
    assert out == []  # prompt 0 (2 versions old) still runs: the take waits
    fg.put(np.array([0]))
    env.run()
    assert list(out[0]) == [0] and fg.dropped == 0  # then it is trained first, oldest started


def test_areal_takes_the_finished_groups_started_first():
    pv = np.array([0, 0, 0, 0], np.int64)
    env = simpy.Environment()
    fg = FinishedGroups(env, 2, 0.0, pv, fifo=True, oldest=True)
    fg.put(np.array([3, 1, 2]))  # completion order
    out = []
    env.process((lambda: (out.append((yield from fg.take(0)))))())
    env.run()
    # the created first (ids are in start order), not the first finished
    assert list(out[0]) == [1, 2] and list(fg.items) == [3]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A synthetic CPU trace (P 8, G 4)."""
    return (synthetic_trace(tmp_path_factory.mktemp("modes") / "t.parquet",
                            SynthSpec(prompts=8, group=4, steps=6, max_num_seqs=16)),)


@pytest.mark.parametrize("kw, msg", [
    (dict(mode="bogus"), "is not an execution mode; registered: colocated, split"),
    (dict(require_batches=2), "--require-batches applies to --mode fully_async, not colocated"),
    (dict(mode="fully_async", gen_gpus=1), "add --gen-gpus N --train-gpus M"),
    (dict(mode="colocate_async", gen_gpus=1, train_gpus=1), "give --train-gpus N and no --gen-gpus"),
    (dict(mode="colocated", gen_gpus=1, train_gpus=1), "runs generation and training on the same devices"),
    (dict(mode="separate_async", gen_gpus=1, train_gpus=1, max_off_policy_strategy="later"),
     "must be one of drop | wait"),
    (dict(mode="separate_async", gen_gpus=1, train_gpus=1, parameter_sync_step=0), "must be a positive integer"),
    (dict(mode="separate_async", gen_gpus=1, train_gpus=1, prompts=127, parameter_sync_step=2),
     "P = 127 prompts per step do not split into 2 equal trainer fetches"),
    (dict(mode="one_step_off", gen_gpus=1, train_gpus=1, partial_rollout=True),
     "--mode one_step_off never uses --partial-rollout .*: drop --partial-rollout"),
    (dict(mode="one_step_off", gen_gpus=1, train_gpus=1, staleness=2),
     "--mode one_step_off always runs with --staleness 1 .*: drop --staleness"),
])
def test_mode_settings_are_checked_with_their_fix(kw, msg):
    with pytest.raises(RlsimError, match=msg.replace("|", r"\|")):
        cfg = WhatIf(**kw)
        cfg.validate()
        check(cfg)


@pytest.mark.parametrize("kw", [dict(mode="colocate_async", train_gpus=1, partial_rollout=True),
                                dict(mode="separate_async", gen_gpus=1, train_gpus=1, partial_rollout=True),
                                dict(mode="one_step_off", gen_gpus=1, train_gpus=1, staleness=1)])
def test_a_setting_a_mode_always_runs_with_is_accepted_when_given_so(kw):
    cfg = WhatIf(**kw)
    cfg.validate()
    check(cfg)
    assert spec_of(kw["mode"]).configure(cfg)["partial_rollout"] is (kw["mode"] != "one_step_off")


def test_fully_async_partial_rollout_needs_a_staleness_threshold():
    m = _gate_models()
    with pytest.raises(RlsimError, match="takes effect only with --staleness-threshold > 0"):
        split_config(WhatIf(mode="fully_async", gen_gpus=1, train_gpus=1, partial_rollout=True), m, None)


def test_cli_lists_the_registered_modes_and_refuses_a_bad_one_in_one_line(traces, tmp_path):
    res = runner.invoke(app, ["run", str(traces[0]), "--mode", "fast"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "registered: colocated, split, areal" in res.output
    help_ = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).output
    assert "colocate_async" in help_ and "--trigger-parameter-sync-step" in help_
    res = runner.invoke(app, ["sweep", str(traces[0]), "--batch", "8", "--mode", "fully_async",
                              "--require-batches", "0",
                              "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--require-batches must be a positive integer" in res.output


def test_a_sweep_takes_modes_as_an_axis_and_each_row_equals_its_single_run(traces):
    import rlsim

    df = rlsim.sweep(traces[0], {"mode": ["one_step_off", "separate_async"], "gen_gpus": [1], "train_gpus": [1],
                                 "prompts": [8], "updates": [3]})
    assert sorted(df["execution_mode"]) == ["one_step_off", "separate_async"]
    one = rlsim.predict(traces[0], mode="separate_async", gen_gpus=1, train_gpus=1, prompts=8, updates=3)
    row = df[df["execution_mode"] == "separate_async"].iloc[0]
    assert row["responses_per_s"] == pytest.approx(one.loc["candidate", "responses_per_s"], rel=1e-12)


def test_api_and_cli_run_a_mode(traces):
    import rlsim

    df = rlsim.predict(traces[0], prompts=8, updates=3, mode="colocate_async", train_gpus=1)
    assert df.loc["candidate", "execution_mode"] == "colocate_async"
    with pytest.raises(RlsimError, match="mode 'nope' is not an execution mode"):
        rlsim.predict("no/such/trace.parquet", prompts=8, mode="nope")  # checked before the trace is read
    with pytest.raises(RlsimError, match="require_batches applies to mode fully_async, not colocated; drop it or add "
                                         "mode=fully_async"):
        rlsim.predict(traces[0], require_batches=2)  # the trace records no mode; checked before the fit
    res = runner.invoke(app, ["run", str(traces[0]), "--batch", "8", "--updates", "3", "--mode", "fully_async",
                              "--gen-gpus", "1", "--train-gpus", "1", "--staleness-threshold", "0.5",
                              "--partial-rollout",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert '"mode": "fully_async 1 gen : 1 train, staleness 0.5, partial rollout"' in res.output


FULLY_ASYNC = {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 2, "require_batches": 1,
               "partial_rollout": True, "train_gpus": 1, "gen_gpus": 1}
AS_RECORDED = ["--mode", "fully_async", "--staleness-threshold", "0.5", "--trigger-parameter-sync-step", "2",
               "--require-batches", "1", "--partial-rollout", "--train-gpus", "1", "--gen-gpus", "1"]


def _recorded(tmp_path, mode, settings):
    """The synthetic trace (P 8, G 4) with an execution mode in its config, as `rlsim import verl` records one."""
    return synthetic_trace(tmp_path / f"{mode}.parquet", SynthSpec(prompts=8, group=4, steps=6, max_num_seqs=16),
                           meta_overrides={"config": {"execution_mode": mode, "mode_settings": settings}})


def _json(args):
    import json

    res = runner.invoke(app, ["run", *args, "--updates", "3", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_run_asks_about_the_mode_the_trace_records_and_says_so(tmp_path, traces):
    t = str(_recorded(tmp_path, "fully_async", FULLY_ASYNC))
    by_default, explicit = _json([t]), _json([t, *AS_RECORDED])
    line = by_default.pop("mode_from_trace")
    assert line == f"mode: fully_async (from the trace: {' '.join(AS_RECORDED)}; --mode colocated to compare)"
    assert by_default == explicit and by_default["execution_mode"] == "fully_async"
    text = runner.invoke(app, ["run", t, "--updates", "3"]).output
    assert text.startswith("mode: fully_async (from the trace: --mode fully_async")
    # an explicit --mode overrides it; a setting given overrides the recorded one
    asked = _json([t, "--mode", "colocated"])
    assert asked["execution_mode"] == "colocated" and "mode_from_trace" not in asked
    assert asked["responses_per_s"] == _json([str(traces[0])])["responses_per_s"]
    two = _json([t, "--gen-gpus", "2"])
    assert two["mode"].startswith("fully_async 2 gen : 1 train") and "--gen-gpus" not in two["mode_from_trace"]
    # a trace that records no mode: as before, no line
    assert "mode_from_trace" not in _json([str(traces[0])])
    assert not runner.invoke(app, ["run", str(traces[0]), "--updates", "3"]).output.startswith("mode:")


def test_a_setting_the_recorded_mode_cannot_take_names_it_and_the_fix(tmp_path):
    t = str(_recorded(tmp_path, "fully_async", FULLY_ASYNC))
    res = runner.invoke(app, ["run", t, "--gpus", "2"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert "error: --gpus sets the colocated device count; with a split give --gen-gpus" in res.output
    assert "(the trace records --mode fully_async --staleness-threshold 0.5" in res.output
    assert "--mode colocated asks the colocated loop)" in res.output


def test_a_recorded_mode_without_its_devices_runs_colocated_and_says_which_to_add(tmp_path):
    t = str(_recorded(tmp_path, "separate_async", {"parameter_sync_step": 2}))
    out = _json([t])
    assert out["execution_mode"] == "colocated"
    assert out["mode_from_trace"] == ("mode: colocated; the trace records separate_async but not its devices: add "
                                      "--train-gpus N --gen-gpus M to ask it")
    given = _json([t, "--gen-gpus", "1", "--train-gpus", "1"])
    assert given["mode"] == "separate_async 1 gen : 1 train, staleness 1, partial rollout, 2 fetches per sync"


def test_api_sweep_and_plan_ask_about_the_recorded_mode(tmp_path):
    import rlsim
    from rlsim.sweeps.plan import PlanConfig, _as_recorded
    from rlsim.replay.io import read_trace

    t = _recorded(tmp_path, "fully_async", FULLY_ASYNC)
    df = rlsim.predict(t, updates=3)
    assert df.loc["candidate", "execution_mode"] == "fully_async"
    assert df.loc["candidate", "notes"].startswith(
        "mode: fully_async (from the trace: mode=fully_async, staleness_threshold=0.5, trigger_parameter_sync_step=2, "
        "require_batches=1, partial_rollout=True, train_gpus=1, gen_gpus=1; mode=colocated to compare); ")
    study = rlsim.fit(t)
    same = rlsim.predict(study, updates=3)
    assert same.loc["candidate", "responses_per_s"] == df.loc["candidate", "responses_per_s"]
    assert rlsim.predict(study, updates=3, mode="colocated").loc["candidate", "execution_mode"] == "colocated"
    sw = rlsim.sweep(t, {"prompts": [8], "updates": [3]})
    assert sw.iloc[0]["execution_mode"] == "fully_async"
    res = runner.invoke(app, ["sweep", "--trace", str(t), "--prompts", "8", "--updates", "3", "--no-charts", "--out",
                              str(tmp_path / "sweep")], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and any(line.startswith("mode: fully_async (from the trace: --mode")
                                      for line in res.output.splitlines())  # after the progress bar (stderr)
    assert sw.iloc[0]["responses_per_s"] == pytest.approx(df.loc["candidate", "responses_per_s"], rel=1e-12)
    cfg, line = _as_recorded(PlanConfig(prompts=(8, 16)), read_trace(t).config)
    assert dict(cfg.fixed) == {"mode": "fully_async", **FULLY_ASYNC} and line.startswith("mode: fully_async")


def test_sync_is_verl_v1s_name_of_the_colocated_loop(traces, tmp_path):
    assert _json([str(traces[0]), "--mode", "sync"]) == _json([str(traces[0]), "--mode", "colocated"])
    out = _json([str(_recorded(tmp_path, "sync", {}))])
    assert out.pop("mode_from_trace") == "mode: sync (from the trace; the colocated loop)"
    plain = _json([str(traces[0])])
    assert [w.replace("sync", "t", 1) for w in out.pop("warnings")] == plain.pop("warnings")  # the trace's name
    assert out == plain


@pytest.mark.parametrize("devices", [{"gen_gpus": 10 ** 19, "train_gpus": 8}, {"gen_gpus": 2, "train_gpus": 65537}])
def test_a_split_of_more_devices_than_rlsim_simulates_is_refused(devices):
    """Found by the mode fuzzer (tests/fuzz_props.py prop_cli_mode): --gen-gpus 10**19 built one SimPy replica
    process per device until the process ran out of memory."""
    with pytest.raises(RlsimError, match=r"is more devices than rlsim simulates .*; give at most 65536"):
        WhatIf(mode="separate_async", **devices).validate()


@pytest.mark.parametrize("gen_gpus", ["1", "4"])
def test_step_switching_with_a_long_switch_finishes(gen_gpus):
    """Found by the mode fuzzer: with --weight-sync nccl's switch cost, the target of ready groups was reached while
    the hybrid replicas were still switching in; they missed the reclaim, waited idle, and SimPy ran out of events."""
    r = CliRunner().invoke(app, ["run", "traces/grpo_p32.parquet", "--mode", "separate_async_switch", "--gen-gpus",
                                 gen_gpus, "--train-gpus", "4", "--batch", "16", "--weight-sync", "nccl", "--updates",
                                 "2", "--json"])
    assert r.exit_code == 0, r.output


def test_plan_takes_the_split_cost_settings_every_candidate_shares():
    """--gen-tp, --weight-sync and --rollout-log-probs describe the split's hardware path as run and sweep take them;
    a plan's candidates share them like the mode and its devices."""
    trace = Path(__file__).resolve().parents[2] / "traces" / "grpo_p128.parquet"
    args = ["plan", str(trace), "--batch", "64,128", "--mode", "one_step_off", "--gen-gpus", "1", "--train-gpus", "1",
            "--gen-tp", "1", "--weight-sync", "nccl", "--rollout-log-probs", "true", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["asked"].startswith("asked: --mode one_step_off --gen-gpus 1 --train-gpus 1")
    bad = runner.invoke(app, args[:-1] + ["--gen-tp", "1,2", "--json"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1, bad.output


def test_an_async_recording_warns_that_its_phase_times_are_fitted_as_if_sequential(tmp_path, traces):
    warned = [w for w in _json([str(_recorded(tmp_path, "fully_async", FULLY_ASYNC))])["warnings"]
              if "recorded in fully_async, whose phases overlap" in w]
    assert len(warned) == 1 and "a log of a colocated (sync) run" in warned[0]
    assert not any("whose phases overlap" in w for w in _json([str(_recorded(tmp_path, "sync", {}))])["warnings"])
    assert not any("whose phases overlap" in w for w in _json([str(traces[0])])["warnings"])


def test_the_async_frameworks_score_rewards_on_the_rollout_side_off_the_trainers_path():
    m = hand_models([([1, 1], [1, 3])] * 6, c=(1.0, 0.25, 0.0, 0.0), update=(3.0, 0.0), sync=0.5, reward=0.25,
                    max_num_seqs=4, prompts=2, group=1)
    run = _run(m, prompts=2, mode="fully_async", gen_gpus=1, train_gpus=1, trigger_parameter_sync_step=2)
    # the reward-free timeline of the on-policy stream above: 0.5 s of rewards per batch are not on the trainer's path
    assert _spans(run, "train.update") == pytest.approx(_flat([(1.5, 1.5), (4.0, 1.5), (7.5, 1.5), (10.0, 1.5)]))
    assert run.step_time == pytest.approx([6.0, 6.0])
    # rlsim's own split trains after the rewards: 0.5 s per update of 2 prompts; NeMo RL's and AReaL's score them on
    # the rollout side too
    split = _run(m, prompts=2, gen_gpus=1, train_gpus=1, staleness=0)
    assert [s.dur for s in split.timeline if s.name == "host.reward"] == pytest.approx([0.5, 0.5])
    for kw in (dict(mode="nemo_async", max_trajectory_age_steps=1), dict(mode="areal")):
        run = _run(m, prompts=2, gen_gpus=1, train_gpus=1, **kw)
        assert sum(s.dur for s in run.timeline if s.name == "host.reward") == 0.0, kw
