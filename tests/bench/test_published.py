"""bench/published.py: the transcribed rows load with their sources, a reference row imports as a verl log, and
each published mode maps to its what-if."""
from __future__ import annotations

import math
import re

import pytest

from bench.published import Row, changes, load_groups, predict_group, summary, unusable, verl_log, what_if
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
                            partial_rollout=True, device="h20"))
    assert (w.gen_gpus, w.train_gpus, w.staleness, w.partial_rollout, w.device) == (16, 16, 0.5, True, None)
    assert (what_if(g, ref, Row("x", "one_step_off", 16, 1.0, {}, gen_gpus=4, train_gpus=12, device="h20")).staleness
            == 1)
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
