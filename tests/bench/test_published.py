"""bench/published.py: the transcribed rows load with their sources, a reference row imports as a verl log, and
each published mode maps to its what-if."""
from __future__ import annotations

import math
import re

import pytest

from bench.published import (Row, changes, interval_terms, leave_one_source_out, load_groups, main, predict_group,
                             summary, unusable, verl_log, what_if)
from rlsim.replay.importers.verl import parse_console

GROUPS = load_groups()


def test_every_group_names_its_source_and_rows_are_positive():
    assert len(GROUPS) >= 10
    for g in GROUPS:
        src = g.meta["source"]
        assert re.search(r"\b[0-9a-f]{40}\b", src) or "arXiv" in src, g.id  # a commit or a paper
        assert g.rows and all(r.step > 0 and r.gpus > 0 for r in g.rows), g.id
        assert g.rows[0].mode in ("colocate", "sync", "split_sync") or all(r.mode == g.rows[0].mode for r in g.rows)


def test_reference_row_becomes_a_console_log_with_the_published_phases(tmp_path):
    g = next(g for g in GROUPS if g.id == "verl-7b-h20-gpus")
    log, config = verl_log(g, g.rows[0])
    (tmp_path / "x.log").write_text(log)
    steps, notes = parse_console(tmp_path / "x.log")
    assert notes == [] and len(steps) == 8
    m = steps[3]
    assert m["timing_s/step"] == 790.10 and m["timing_s/gen"] == 357.41 and m["timing_s/update_actor"] == 269.80
    assert "train_batch_size: 512" in config and "n: 16" in config and "nnodes: 4" in config


def test_modes_map_to_what_ifs():
    g = next(g for g in GROUPS if g.id == "verl-7b-h20-gpus")
    ref = g.rows[0]
    w = what_if(g, ref, Row("x", "fully_async", 32, 1.0, {}, gen_gpus=16, train_gpus=16, staleness=0.5,
                            partial_rollout=True, device="h20", weight_sync="checkpoint_engine",
                            rollout_log_probs=True))
    assert (w.mode, w.gen_gpus, w.train_gpus, w.staleness_threshold, w.partial_rollout, w.device) == (
        "fully_async", 16, 16, 0.5, True, None)
    assert (w.trigger_parameter_sync_step, w.require_batches) == (4, 4)  # the group's, as the doc prints them
    assert (w.gen_tp, w.weight_sync, w.rollout_log_probs) == (4, "checkpoint_engine", True)  # the group's tp
    one_off = Row("x", "one_step_off", 16, 1.0, {}, gen_gpus=4, train_gpus=12, device="h20")
    assert what_if(g, ref, one_off).mode == "one_step_off"
    nemo = next(g for g in GROUPS if g.meta["file"] == "nemo_rl.toml")
    n = what_if(nemo, nemo.rows[0], next(r for r in nemo.rows if r.gen_gpus))
    assert (n.mode, n.max_trajectory_age_steps, n.in_flight_weight_updates, n.weight_sync) == ("nemo_async", 1, True,
                                                                                             "nemo_nccl")
    assert what_if(g, ref, Row("x", "colocate", 64, 1.0, {}, device="gb200")).device == "gb200"
    assert changes(ref, Row("x", "colocate", 64, 1.0, {}, device="h20")) == "32 -> 64 GPUs"


def test_a_group_predicts_its_other_rows_with_an_interval(tmp_path):
    g = next(g for g in GROUPS if g.id == "verl-7b-h20-one-step-off-megatron")
    rows = predict_group(g, tmp_path)
    assert len(rows) == len(g.rows) - 1
    r = rows[0]
    assert r["lo_s"] <= r["predicted_s"] <= r["hi_s"] and math.isfinite(r["error"])
    s = summary(rows)
    assert s["pairs"] == 1 and s["max_abs_error"] == abs(r["error"])


def test_groups_without_a_batch_are_named_not_guessed():
    why = {g.id: unusable(g) for g in GROUPS}
    assert why["areal-v03-r1-distill-qwen-7b-sync-vs-async"] == "the source does not state prompts, group, max_response"
    assert why["verl-7b-h20-gpus"] == "" and why["nemo-rl-v04-llama3.1-8b-grpo-h100"] == ""


def test_a_broken_rows_file_is_one_line(tmp_path):
    (tmp_path / "x.toml").write_text('[[group]]\nid = "g"\n[[group.row]]\nlabel = "r"\n')
    with pytest.raises(SystemExit, match=r"x.toml is not a rows file .*row without gpus, step"):
        load_groups(tmp_path)
    (tmp_path / "x.toml").write_text("[[group]\n")
    with pytest.raises(SystemExit, match="is not a rows file"):
        load_groups(tmp_path)


def test_a_split_reference_scales_its_own_layout():
    ref = Row("r", "split_sync", 8, 1.0, {}, gen_gpus=4, train_gpus=4)
    g = next(g for g in GROUPS if g.id.startswith("areal-v02"))
    w = what_if(g, ref, Row("x", "split_sync", 32, 1.0, {}, gen_gpus=16, train_gpus=16))
    assert (w.gpus, w.gen_gpus) == (32, None)
    assert what_if(g, ref, Row("x", "split_sync", 32, 1.0, {}, gen_gpus=8, train_gpus=24)).gen_gpus == 8


def test_leave_one_source_out_scores_each_source_at_the_value_the_other_chose():
    def row(fold, err):
        return {"fold": fold, "error": err, "covered": True, "hi_lo": 1.5, "split": True}
    by_value = {0.0: [row("verl", 0.1), row("nemo_rl+areal", 0.9)], 0.01: [row("verl", 0.8), row("nemo_rl+areal", 0.2)]}
    rows, chosen = leave_one_source_out(by_value)
    assert chosen == {"verl": 0.01, "nemo_rl+areal": 0.0}  # each fold takes the value best on the *other* fold's rows
    assert sorted((r["fold"], r["error"]) for r in rows) == [("nemo_rl+areal", 0.9), ("verl", 0.8)]
    assert not any(r["in_sample"] for r in rows)
    s = summary(rows)
    assert s["split"]["pairs"] == 2 and s["colocated"]["pairs"] == 0 and s["covered_within_2x"] == 2


def test_interval_terms_name_what_the_log_leaves_unidentified():
    how = ("bootstrap; both ends of what the trace cannot identify (the per-step generation cost 1..2 ms); the split "
           "free of the colocated run's device-sharing costs at the other end")
    assert interval_terms(how) == "per-step vs per-token generation cost; the colocated log's device-sharing costs"


def test_only_filters_by_rows_file_and_an_unknown_one_is_one_line(capsys):
    with pytest.raises(SystemExit, match="no group matches.*nemo_rl"):
        main(["--only", "nemo"])


def test_a_bad_fit_grid_is_one_line():
    with pytest.raises(SystemExit, match="--fit-gain takes comma-separated numbers"):
        main(["--only", "areal", "--fit-gain", "1,x"])
    with pytest.raises(SystemExit, match="--fit values must be finite and at least 0"):
        main(["--only", "areal", "--fit", "-0.01"])
