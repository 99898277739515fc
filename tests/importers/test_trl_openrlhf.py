"""TRL (trainer_state.json) and OpenRLHF (W&B history export) importers: batch arithmetic, step times,
phases, evals, bad input, and a what-if on the imported traces."""
from __future__ import annotations

import json

import pytest

from rlsim.core.config import WhatIf
from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import fit_trace
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace
from rlsim.replay.schema import EVAL, PHASE, STEP_STATS, UPDATE
from rlsim.whatif.predict import run
from tests.importers.fixtures import (OPENRLHF_CONFIG, TRL_ENTRY_STEP1, trl_entry, write_openrlhf_csv, write_trl_state)

GRPO_YAML = ("# GRPOConfig fields (TRL recipe YAML); values the tests'\nper_device_train_batch_size: 8\n"
             "gradient_accumulation_steps: 4\nnum_generations: 8\nmax_completion_length: 1024\n"
             "model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\nlearning_rate: 1.0e-06\n")


def _trl(tmp_path, n=12, **kw):
    cum = [sum(64 * (400.0 - k) for k in range(1, s + 1)) for s in range(1, n + 1)]
    entries = [trl_entry(s, step_time=20 + 0.1 * s, mean_len=300.0 - s, num_tokens=cum[s - 1]) for s in range(1, n + 1)]
    p = tmp_path / "trainer_state.json"
    write_trl_state(p, entries, evals=[{"eval_reward": 0.5, "eval_loss": 0.1, "eval_runtime": 30.0, "step": 6},
                                       {"eval_reward": 0.6, "step": 12}], **kw)
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(GRPO_YAML)
    return p, cfg, entries


def test_trl_batch_arithmetic_and_rows(tmp_path):
    p, cfg, entries = _trl(tmp_path)
    t = read_trace(import_log("trl", p, config=cfg, gpus=2, out=tmp_path / "t.parquet"))
    # completions per optimizer step = 8 per device x 2 processes x 4 accumulation = 64; G = 8 -> P = 8
    assert (t.config["prompts"], t.config["group"], t.config["batch"]) == (8, 8, 64)
    u = t.rows(UPDATE)
    assert u["step"].tolist() == list(range(12)) and set(u["num_responses"]) == {64}
    assert u["step_time"].tolist() == [e["step_time"] for e in entries]
    assert u["num_tokens"].tolist() == [64 * (400 - s) for s in range(1, 13)]  # cumulative num_tokens differenced
    ph = t.rows(PHASE)
    assert set(ph["phase"]) == {"step"} and set(ph["phase_role"]) == {"whole"}
    st = t.rows(STEP_STATS)
    assert st["response_len_mean"].tolist() == [300.0 - s for s in range(1, 13)]
    assert st["prompt_len_mean"][0] == pytest.approx(399 - 299)  # tokens / B - completion mean
    ev = t.rows(EVAL)
    assert (ev["step"].tolist() == [6, 12] and ev["score"].tolist() == [0.5, 0.6]
            and ev["cum_responses"].tolist() == [384, 768])
    assert t.meta["model"]["parameters"] == 1.5e9 and t.meta["source"]["metric_names"]["eval_reward"] == "eval score"


def test_trl_verbatim_entry_without_step_time(tmp_path):
    p = tmp_path / "trainer_state.json"
    final = {"epoch": 0.02, "step": 1, "total_flos": 0.0, "train_loss": 0.0, "train_runtime": 42.5}
    write_trl_state(p, [TRL_ENTRY_STEP1, final])
    t = read_trace(import_log("trl", p, prompts=1, group=4, out=tmp_path / "t.parquet"))
    assert t.rows(UPDATE)["step_time"].tolist() == [42.5]  # train_runtime / global_step
    assert "train_runtime / global_step" in t.meta["source"]["notes"][0]
    assert t.rows(STEP_STATS)["response_len_max"].tolist() == [11.0]


def test_trl_bad_input(tmp_path):
    p, cfg, _ = _trl(tmp_path)
    with pytest.raises(RlsimError, match=r"--prompts 16 disagrees with per_device_train_batch_size x GPUs"):
        import_log("trl", p, config=cfg, gpus=2, prompts=16, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="--group 4 disagrees with num_generations = 8"):
        import_log("trl", p, config=cfg, gpus=2, group=4, out=tmp_path / "t.parquet")
    odd = tmp_path / "odd.yaml"
    odd.write_text(GRPO_YAML.replace("per_device_train_batch_size: 8", "per_device_train_batch_size: 6")
                   .replace("gradient_accumulation_steps: 4", "gradient_accumulation_steps: 1"))
    with pytest.raises(RlsimError, match="6 x 1 processes x gradient_accumulation_steps 1 = 6 completions is not a "
                                         "multiple of num_generations 8"):
        import_log("trl", p, config=odd, gpus=1, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="cannot work out prompts per step"):
        import_log("trl", p, group=8, out=tmp_path / "t.parquet")
    cut = tmp_path / "cut.json"
    cut.write_text(p.read_text()[:-200])
    with pytest.raises(RlsimError, match="is not complete JSON .* truncated"):
        import_log("trl", cut, prompts=8, group=8, out=tmp_path / "t.parquet")
    none = tmp_path / "none.json"
    none.write_text(json.dumps({"log_history": [{"epoch": 1.0, "step": 5, "train_runtime": 10.0}]}))
    with pytest.raises(RlsimError, match="no training log entries"):
        import_log("trl", none, prompts=8, group=8, out=tmp_path / "t.parquet")


def test_trl_whole_steps_use_priors_or_say_why_not(tmp_path):
    p, cfg, _ = _trl(tmp_path)
    with_prior = fit_trace(read_trace(import_log("trl", p, config=cfg, gpus=2, device="a100-80gb",
                                                 out=tmp_path / "a.parquet")))
    assert with_prior.gen.prior and with_prior.gen.c_step == pytest.approx(3e9 / 2039e9)
    assert any("whole steps only" in w and "roofline priors" in w for w in with_prior.warnings)
    no_prior = fit_trace(read_trace(import_log("trl", p, config=cfg, gpus=2, out=tmp_path / "b.parquet")))
    assert no_prior.gen.c_step == 0 and any("no roofline prior is available" in w for w in no_prior.warnings)
    res = run([read_trace(tmp_path / "a.parquet")], WhatIf(prompts=16, updates=20))
    assert res.candidate.responses_per_update == 128
    assert res.reference.step_time_s == pytest.approx(res.recorded_step_time_s, rel=0.1)


def _orl(tmp_path, n=10):
    steps = [dict(gen=30.0 + i, avrm=3.0, wait=0.5, train=12.0 + 0.1 * i, resp=400.0 + i, total=550.0 + i)
             for i in range(n)]
    c = tmp_path / "history.csv"
    walls = write_openrlhf_csv(c, steps)
    cfg = tmp_path / "wandb_config.yaml"
    cfg.write_text(OPENRLHF_CONFIG)
    return c, cfg, steps, walls


def test_openrlhf_phases_and_batch(tmp_path):
    c, cfg, steps, walls = _orl(tmp_path)
    t = read_trace(import_log("openrlhf", c, config=cfg, device="h100", out=tmp_path / "t.parquet"))
    assert (t.config["prompts"], t.config["group"], t.config["batch"], t.config["gpus"]) == (128, 8, 1024, 8)
    assert t.meta["engine"]["engines"] == 4 and t.meta["engine"]["max_num_seqs"] == 4 * 1024 and t.config["tp"] == 2
    assert t.meta["model"]["parameters"] == 8e9 and t.config["lr"] == 5e-07
    u, ph = t.rows(UPDATE), t.rows(PHASE)
    assert u["step_time"][1:].tolist() == pytest.approx(walls[1:])  # _runtime differences
    assert u["step_time"][0] == pytest.approx(120.0 + walls[0])     # the first includes the startup (_runtime)
    for i, s in enumerate(steps[1:], 1):
        got = {n: d for n, d, k in zip(ph["phase"], ph["duration"], ph["step"]) if k == i}
        assert got["generate"] == s["gen"] and got["actor_value_rm"] == s["avrm"] and got["wait"] == s["wait"]
        assert got["train_rest"] == pytest.approx(s["train"])
        assert u["num_tokens"][i] == round(1024 * s["total"])
    assert t.rows(STEP_STATS)["prompt_len_mean"][3] == pytest.approx(150.0)
    m = fit_trace(t)
    assert any("only the mean response length" in w for w in m.warnings)


def test_openrlhf_bad_input(tmp_path):
    c, cfg, _, _ = _orl(tmp_path)
    with pytest.raises(RlsimError, match="--prompts 64 disagrees with rollout_batch_size = 128 in wandb_config.yaml"):
        import_log("openrlhf", c, config=cfg, prompts=64, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="does not state the batch"):
        import_log("openrlhf", c, out=tmp_path / "t.parquet")
    lines = c.read_text().splitlines()
    cut = tmp_path / "cut.csv"
    cut.write_text("\n".join(lines[:-1] + [lines[-1].rsplit(",", 3)[0]]) + "\n")
    with pytest.raises(RlsimError, match=r"line 11 has 11 fields, the header 14 \(truncated line\?\)"):
        import_log("openrlhf", cut, config=cfg, out=tmp_path / "t.parquet")
    empty = tmp_path / "empty.csv"
    empty.write_text(lines[0] + "\n")
    with pytest.raises(RlsimError, match="no OpenRLHF training steps"):
        import_log("openrlhf", empty, config=cfg, out=tmp_path / "t.parquet")
    with pytest.raises(RlsimError, match="unknown device 'h900'"):
        import_log("openrlhf", c, config=cfg, device="h900", out=tmp_path / "t.parquet")
