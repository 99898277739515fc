"""verl importer: real public console lines, round trips of every phase and the batch arithmetic, the
JSONL and W&B CSV exports, and bad input (truncated lines, no steps, conflicting flags, unknown device)."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from rlsim.replay.errors import RlsimError
from rlsim.replay.importers import import_log
from rlsim.replay.importers.common import parse_number, params_from_name, parse_params
from rlsim.replay.importers.verl import parse_console
from rlsim.replay.io import read_trace
from rlsim.replay.schema import EVAL, PHASE, STEP_STATS, UPDATE
from tests.importers.fixtures import (VERL_1208_STEP2, VERL_2060_STEP0, VERL_2060_STEP1_CUT, VERL_316_STEP5_CUT,
                                      VERL_7412_STEP34_CUT, VERL_CONFIG, VERL_NP_FRAGMENTS, verl_line, verl_phase_table,
                                      write_step_lines, write_verl_log)

PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")


def test_numbers_as_frameworks_print_them():
    assert [parse_number(f.split(":", 1)[1]) for f in VERL_NP_FRAGMENTS] == [0.00247, 1.776]
    assert parse_number("np.int64(3)") == 3.0 and parse_number("1e-06") == 1e-06 and parse_number("-0.000") == 0.0
    assert parse_number("tensor(0.5, device='cuda:0')") == 0.5 and parse_number("True") == 1.0
    assert math.isnan(parse_number("nan")) and parse_number("np.float64(0.1") is None and parse_number("") is None
    assert (params_from_name("Qwen/Qwen2.5-0.5B-Instruct") == 0.5e9
            and params_from_name("meta-llama/Llama-3.1-8B") == 8e9)
    assert params_from_name("Qwen/Qwen2.5-3B-Instruct") == 3e9 and params_from_name("gpt2") is None
    assert parse_params("7B") == 7e9 and parse_params("500M") == 5e8 and parse_params("1.5e9") == 1.5e9


def test_real_lines_parse(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(VERL_2060_STEP0 + "\n" + VERL_1208_STEP2 + "\n")
    steps, notes = parse_console(log)
    assert sorted(steps) == [0, 2] and notes == []
    m = steps[2]  # the Ray actor tag is not part of the first key
    assert m["global_seqlen/min"] == 538646.0 and m["timing_s/gen"] == 74.020 and m["timing_s/step"] == 96.551
    out = import_log("verl", log, prompts=256, group=5, gpus=4, out=tmp_path / "t.parquet")
    t = read_trace(out)
    u = t.rows(UPDATE)
    assert u["step"].tolist() == [1] and u["num_responses"].tolist() == [1280]  # global_step 2 -> 0-based step 1
    assert u["gen_time"][0] == 74.020 and u["prep_time"][0] == pytest.approx(3.566 + 3.420)
    assert u["reward_time"][0] == pytest.approx(1.167) and u["duration"][0] == 14.302 and u["step_time"][0] == 96.551
    ph = t.rows(PHASE)
    assert dict(zip(ph["phase"], ph["duration"])) == {"gen": 74.020, "old_log_prob": 3.566, "ref": 3.420, "adv": 1.167,
                                                      "update_actor": 14.302}
    ev = t.rows(EVAL)  # step 0: acc preferred over reward/score
    assert ev["score"].tolist() == [0.508] and ev["step"].tolist() == [0] and ev["eval_k"].tolist() == [1]
    st = t.rows(STEP_STATS)
    assert st["response_len_mean"][0] == 324.958 and st["response_clip_ratio"][0] == 0.004
    assert json.loads(st["metrics"][0])["perf/mfu/actor"] == 1.018  # every metric kept under its name
    assert "perf/mfu/actor" in t.meta["source"]["unknown_metrics"]
    assert t.meta["source"]["metric_names"]["timing_s/step"].startswith("step time")
    assert t.meta["schema_version"] >= 2 and t.meta["granularity"] == "step"


@pytest.mark.parametrize("cut", [VERL_2060_STEP1_CUT, VERL_316_STEP5_CUT, VERL_7412_STEP34_CUT])
def test_truncated_real_lines(tmp_path, cut):
    log = tmp_path / "train.log"
    log.write_text(VERL_1208_STEP2 + "\n" + cut + "\n")
    with pytest.raises(RlsimError, match=r"line 2: the line of step \d+ is truncated"):
        import_log("verl", log, prompts=256, group=5, out=tmp_path / "t.parquet")
    out = import_log("verl", log, prompts=256, group=5, drop_truncated=True, out=tmp_path / "t.parquet")
    t = read_trace(out)
    assert t.count(UPDATE) == 1 and "skipped: truncated" in t.meta["source"]["notes"][0]


def test_line_cut_at_a_field_boundary(tmp_path):
    """A line cut before its timing_s/step (the other lines have one) is truncated too."""
    a, _ = verl_line(1, gen=10, reward=1, old_log_prob=1, ref=1, adv=0.1, update_actor=5)
    b, _ = verl_line(2, gen=10, reward=1, old_log_prob=1, ref=1, adv=0.1, update_actor=5)
    log = tmp_path / "train.log"
    log.write_text(a + "\n" + b.split(" - timing_s/step")[0] + "\n")
    with pytest.raises(RlsimError, match="line 2: the line of step 2 is truncated .no timing_s/step"):
        import_log("verl", log, prompts=64, group=4, out=tmp_path / "t.parquet")


def test_log_without_steps(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("(TaskRunner pid=1) Size of train dataloader: 29, Size of val dataloader: 1\n"
                   + VERL_2060_STEP0 + "\n")
    with pytest.raises(RlsimError, match="no verl training steps found"):
        import_log("verl", log, prompts=256, group=5, out=tmp_path / "t.parquet")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(RlsimError, match="no verl training steps found"):
        import_log("verl", tmp_path / "empty.jsonl", prompts=256, group=5, out=tmp_path / "t.parquet")


def test_conflicting_and_missing_batch_flags(tmp_path):
    log = tmp_path / "train.log"
    write_verl_log(log, verl_phase_table(3))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(VERL_CONFIG)
    for flags, msg in (({"prompts": 128}, r"--prompts 128 disagrees with data.train_batch_size = 64 in config.yaml"),
                       ({"group": 8}, r"--group 8 disagrees with actor_rollout_ref.rollout.n = 4"),
                       ({"gpus": 4}, r"--gpus 4 disagrees with trainer.n_gpus_per_node x trainer.nnodes = 8")):
        with pytest.raises(RlsimError, match=msg):
            import_log("verl", log, config=cfg, out=tmp_path / "t.parquet", **flags)
    with pytest.raises(RlsimError, match="does not state the batch"):
        import_log("verl", log, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="--prompts must be a positive integer"):
        import_log("verl", log, prompts=0, group=4, out=tmp_path / "t.parquet")
    # agreeing flags are fine
    import_log("verl", log, config=cfg, prompts=64, group=4, gpus=8, out=tmp_path / "t.parquet")


def test_unknown_device(tmp_path):
    log = tmp_path / "train.log"
    write_verl_log(log, verl_phase_table(2))
    with pytest.raises(RlsimError, match=r"unknown device 'v100'; known devices: a100-40gb, a100-80gb, h100-sxm, h200, "
                                         r"b200, mi300x, l40s"):
        import_log("verl", log, prompts=64, group=4, device="v100", out=tmp_path / "t.parquet")


def test_round_trip_every_phase_and_the_batch(tmp_path):
    table = verl_phase_table(8)
    log = tmp_path / "train.log"
    walls = write_verl_log(log, table)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(VERL_CONFIG)
    t = read_trace(import_log("verl", log, config=cfg, device="h100", out=tmp_path / "t.parquet"))
    c = t.config
    assert (c["prompts"], c["group"], c["batch"], c["gpus"], c["algo"], c["max_tokens"],
            c["task"]) == (64, 4, 256, 8, "grpo", 1024, "gsm8k")
    assert t.meta["hardware"]["profile"] == "h100-sxm" and t.meta["hardware"]["device_count"] == 8
    assert t.meta["model"]["parameters"] == 0.5e9 and t.meta["model"]["bytes"] == 1e9
    assert t.meta["engine"]["max_num_seqs"] == 1024 * 8 and t.meta["engine"]["prefill_ratio"] == 0.25
    u, ph = t.rows(UPDATE), t.rows(PHASE)
    assert u["step"].tolist() == list(range(8))
    for i, r in enumerate(table):
        got = {n: d for n, d, s in zip(ph["phase"], ph["duration"], ph["step"]) if s == i}
        want = {k: r[k] for k in PHASES}
        if r["testing"] is not None:
            want["testing"] = r["testing"]
        assert got == want  # every phase, exactly
        assert u["gen_time"][i] == r["gen"] and u["duration"][i] == r["update_actor"]
        assert u["reward_time"][i] == pytest.approx(r["reward"] + r["adv"], abs=1e-12)
        assert u["prep_time"][i] == pytest.approx(r["old_log_prob"] + r["ref"], abs=1e-12)
        # evals are outside the RL step
        assert u["step_time"][i] == pytest.approx(walls[i] - (r["testing"] or 0.0), abs=1e-9)
        assert u["num_responses"][i] == 64 * 4
        assert u["num_tokens"][i] == round(256 * (r["resp_mean"] + 100.0))
        assert u["lr"][i] == 1e-06
    ev = t.rows(EVAL)
    assert ev["step"].tolist() == [0, 4, 8] and ev["cum_responses"].tolist() == [0, 4 * 256, 8 * 256]
    assert ev["score"].tolist() == [0.4, table[3]["val"], table[7]["val"]]
    assert ev["duration"].tolist() == [0.0, 14.0, 14.0]
    # phases of a step laid end to end from the step's start; steps follow each other
    starts = t.rows(STEP_STATS)["t_start"]
    assert starts[0] == 0.0 and np.allclose(np.diff(starts), walls[:-1])


def _metrics_rows(table):
    rows = []
    for i, r in enumerate(table, 1):
        line, _ = verl_line(i, **r)
        body = line.split(f"step:{i} - ", 1)[1]
        rows.append({k: parse_number(v) for k, v in (f.split(":", 1) for f in body.split(" - "))})
    return rows


def test_jsonl_and_wandb_csv_exports_match_the_console(tmp_path):
    table = verl_phase_table(5)
    log = tmp_path / "train.log"
    write_verl_log(log, table, val0=None)
    rows = _metrics_rows(table)
    jl = tmp_path / "metrics.jsonl"  # verl-style {"step": N, "data": {...}} lines
    jl.write_text("\n".join(json.dumps({"step": i + 1, "data": r}) for i, r in enumerate(rows)) + "\n")
    cv = tmp_path / "history.csv"  # a W&B history export: one column per metric plus _step, _runtime
    keys = sorted({k for r in rows for k in r})
    with cv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["_step", "_runtime"] + keys)
        for i, r in enumerate(rows, 1):
            w.writerow([i, 10.0 * i] + ["" if r.get(k) is None else repr(r[k]) for k in keys])
    got = []
    for src in (log, jl, cv):
        t = read_trace(import_log("verl", src, prompts=64, group=4, gpus=8, out=tmp_path / f"{src.stem}.parquet"))
        ph = t.rows(PHASE)
        got.append(sorted(zip(ph["step"].tolist(), ph["phase"].tolist(), ph["duration"].tolist())))
        assert t.meta["source"]["format"] == {"train": "console", "metrics": "jsonl", "history": "wandb-csv"}[src.stem]
    assert got[0] == got[1] == got[2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(jl.read_text()[:-40] + "\n")
    with pytest.raises(RlsimError, match="is not a complete JSON object"):
        import_log("verl", bad, prompts=64, group=4, out=tmp_path / "b.parquet")


def test_gpus_from_throughput_and_fully_async_runs(tmp_path):
    table = verl_phase_table(4)
    log = tmp_path / "train.log"
    write_verl_log(log, table, extra_lines=[])
    text = log.read_text().replace("training/epoch:0", "training/epoch:0 - trainer/idle_ratio:0.12 - "
                                                       "rollouter/idle_ratio:0.05 - my/custom:1.5")
    log.write_text(text)
    t = read_trace(import_log("verl", log, prompts=64, group=4, out=tmp_path / "t.parquet"))
    assert t.meta["hardware"]["device_count"] == 8  # perf/throughput = tokens / (step time x GPUs)
    assert any("from perf/throughput" in n for n in t.meta["source"]["notes"])
    assert t.config["fully_async"] is True and "my/custom" in t.meta["source"]["unknown_metrics"]
    from rlsim.replay.fit import fit_trace

    assert any("fully asynchronous" in w for w in fit_trace(t).warnings)


def test_existing_output_needs_overwrite(tmp_path):
    log = tmp_path / "train.log"
    write_verl_log(log, verl_phase_table(2))
    out = import_log("verl", log, prompts=64, group=4, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="already exists; pass --overwrite"):
        import_log("verl", log, prompts=64, group=4, out=out)
    import_log("verl", log, prompts=64, group=4, out=out, overwrite=True)
    with pytest.raises(RlsimError, match="log not found"):
        import_log("verl", tmp_path / "nope.log", prompts=64, group=4, out=tmp_path / "x.parquet")
    with pytest.raises(RlsimError, match="unknown framework 'deepspeed'"):
        import_log("deepspeed", log, out=tmp_path / "x.parquet")


def test_mismatches_the_import_proceeds_past_are_warnings(tmp_path):
    # phases 30 + 20 s in a 40 s step, and a throughput implying 4 GPUs where the config says 8
    write_step_lines(tmp_path / "x.log", "timing_s/gen:30.0 - timing_s/update_actor:20.0 - timing_s/step:40.0 - "
                     "perf/total_num_tokens:100000 - perf/throughput:625.0 - response_length/mean:300 - "
                     "response_length/max:900 - response_length/min:20 - actor/lr:1e-06")
    (tmp_path / "c.yaml").write_text(VERL_CONFIG)
    out = import_log("verl", tmp_path / "x.log", out=tmp_path / "x.parquet", config=str(tmp_path / "c.yaml"), gpus=8)
    w = read_trace(out).meta["source"]["warnings"]
    assert any("phases add up to more than the step time in 6 of 6 steps (step 6: 50 s of phases in a 40 s step)" in x
               for x in w)
    assert any("implies 4 GPUs, the config/flags say 8" in x for x in w)
    from rlsim.replay.importers import describe
    assert "warning: the phases add up to more" in describe(out)


V1_SEPARATE = """
trainer:
  use_v1: true
  n_gpus_per_node: 8
  nnodes: 1
  v1:
    trainer_mode: separate_async
    separate_async:
      parameter_sync_step: 4
      num_warmup_batches: 1
      hybrid_rollout:
        enable_switch: true
        switch_threshold_ratio: 0.5
    sampler:
      max_off_policy_threshold: 2
      max_off_policy_strategy: wait
actor_rollout_ref:
  rollout:
    n: 4
    nnodes: 1
    n_gpus_per_node: 8
data:
  train_batch_size: 64
"""

FULLY_ASYNC = """
trainer: {n_gpus_per_node: 16, nnodes: 1}
rollout: {n_gpus_per_node: 16, nnodes: 1}
actor_rollout_ref: {rollout: {n: 4}}
data: {train_batch_size: 64}
async_training: {staleness_threshold: 0.5, trigger_parameter_sync_step: 4, require_batches: 1, partial_rollout: true}
"""


@pytest.mark.parametrize("text, mode, settings", [
    (V1_SEPARATE, "separate_async_switch",
     {"num_warmup_batches": 1, "parameter_sync_step": 4, "max_off_policy_threshold": 2,
      "max_off_policy_strategy": "wait", "switch_threshold_ratio": 0.5, "train_gpus": 8, "gen_gpus": 8}),
    (V1_SEPARATE.replace("separate_async\n", "colocate_async\n", 1), "colocate_async",
     {"max_off_policy_threshold": 2, "max_off_policy_strategy": "wait", "train_gpus": 8}),
    (V1_SEPARATE.replace("separate_async\n", "sync\n", 1), "sync", None),
    (FULLY_ASYNC, "fully_async", {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 4, "require_batches": 1,
                                  "partial_rollout": True, "train_gpus": 16, "gen_gpus": 16}),
    (FULLY_ASYNC.replace("require_batches: 1", "require_batches: 1, concurrent_samples_per_replica: 8"),
     "fully_async", {"staleness_threshold": 0.5, "trigger_parameter_sync_step": 4, "require_batches": 1,
                     "partial_rollout": True, "concurrent_samples_per_replica": 8, "train_gpus": 16, "gen_gpus": 16}),
    (FULLY_ASYNC.replace("async_training", "other"), "one_step_off", {"train_gpus": 16, "gen_gpus": 16}),
    (VERL_CONFIG, None, None),
])
def test_the_execution_mode_is_read_from_a_v1_or_fully_async_config(tmp_path, text, mode, settings):
    log, cfg = tmp_path / "train.log", tmp_path / "config.yaml"
    write_verl_log(log, verl_phase_table(3))
    cfg.write_text(text)
    t = read_trace(import_log("verl", log, config=cfg, out=tmp_path / "t.parquet", **({"gpus": 8} if text == VERL_CONFIG
                                                                                      else {})))
    assert t.config.get("execution_mode") == mode and t.config.get("mode_settings") == settings
    if mode and mode != "sync":
        assert any(f"`rlsim run TRACE` asks about it, as --mode {mode}" in n for n in t.meta["source"]["notes"])


@pytest.mark.parametrize("text, message", [
    (V1_SEPARATE.replace("separate_async\n", "bogus\n", 1),
     "trainer.v1.trainer_mode 'bogus' is not a verl V1 trainer mode (sync | colocate_async | separate_async); "
     "correct it in the config"),
    (FULLY_ASYNC.replace("staleness_threshold: 0.5", "staleness_threshold: -0.5"),
     "config async_training.staleness_threshold must be a non-negative number, got -0.5; correct it in the config"),
    (FULLY_ASYNC.replace("partial_rollout: true", "partial_rollout: 3"),
     "config async_training.partial_rollout must be true or false, got 3"),
    (VERL_CONFIG.replace("    max_num_seqs: 1024\n",
                         "    max_num_seqs: 1024\n    log_prob_micro_batch_size_per_gpu: abc\n"),
     "config.yaml: actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu must be a positive integer, got 'abc'"),
])
def test_a_bad_mode_or_micro_batch_setting_in_the_config_is_refused_in_one_line(tmp_path, text, message):
    """Found by hand-checking the settings the execution modes and the memory model read: each was imported
    silently (a bogus trainer_mode as the classic trainer) and failed, if at all, in a later `rlsim run`."""
    log, cfg = tmp_path / "train.log", tmp_path / "config.yaml"
    write_verl_log(log, verl_phase_table(3))
    cfg.write_text(text)
    with pytest.raises(RlsimError) as e:
        import_log("verl", log, config=cfg, out=tmp_path / "t.parquet")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unresolved_micro_batch_interpolation_keeps_verls_default(tmp_path):
    log, cfg = tmp_path / "train.log", tmp_path / "config.yaml"
    write_verl_log(log, verl_phase_table(3))
    cfg.write_text(VERL_CONFIG.replace("    max_num_seqs: 1024\n", "    max_num_seqs: 1024\n"
                                       "    log_prob_micro_batch_size_per_gpu: ${oc.select:x,null}\n"))
    assert read_trace(import_log("verl", log, config=cfg, out=tmp_path / "t.parquet", gpus=8)).config
