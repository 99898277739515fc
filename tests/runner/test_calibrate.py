"""Calibration on the real engine and trainer: rows written, weights and optimizer state untouched."""
from __future__ import annotations

import numpy as np
import pytest

from rlsim.replay.io import read_trace

pytestmark = pytest.mark.engine


def test_calibration_rows_and_untouched_weights(tmp_path, tiny_model, small_config):
    import torch
    from transformers import AutoModelForCausalLM

    from rlsim.runner.algo import Sample, Trainer
    from rlsim.runner.calibrate import run_calibration
    from rlsim.runner.engine import Engine

    cfg = small_config(tmp_path, prompts=4, group=4)
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    trainer = Trainer(policy, cfg, 0, torch.device("cpu"))
    engine = Engine(str(tiny_model), max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    kv_cache_gib=cfg.kv_cache_gib, dtype="float32")
    prompts = [[1, 5 + i % 9, 14, 6 + i % 7, 15] for i in range(64)]
    outs = engine.generate([(None, p, 1) for p in prompts[:8]], engine.sampling(12, 1.0))
    samples = [Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids), reward=float(i % 2), advantage=1.0 - 2 * (i % 2))
               for i, c in enumerate(outs)]
    trainer.update(samples, 1e-3)  # the optimizer has state (Adam moments) before the calibration
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    opt_before = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for i, s in trainer.opt.state_dict()["state"].items()}

    rows, info = run_calibration(engine, trainer, cfg, prompts, [list(c.token_ids) for c in outs])

    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    opt_after = trainer.opt.state_dict()["state"]
    assert opt_after.keys() == opt_before.keys()
    for i, s in opt_before.items():
        for k, v in s.items():
            assert torch.equal(v, opt_after[i][k]) if torch.is_tensor(v) else v == opt_after[i][k]
    assert all(p.grad is None for p in policy.parameters())
    gen = [r for k, r in rows if k == "calib_gen"]
    train = [r for k, r in rows if k == "calib_train"]
    levels = sorted({r["calib_level"] for r in gen})
    # 1 .. min(16 x B, max_num_seqs) = 64 in doublings, then a rung of 1.5 x 64 = 96 in two waves
    assert levels == [1, 2, 4, 8, 16, 32, 64, 96]
    assert max(r["num_running"] for r in gen) == 64 and any(r["num_waiting"] > 0 for r in gen)
    for lv in levels[:-1]:
        steps = [r for r in gen if r["calib_level"] == lv]
        assert len(steps) >= 7 and all(r["num_running"] == lv for r in steps)
    tok = sorted({r["num_tokens"] for r in train})
    assert len(tok) >= 3 and tok[-1] / tok[0] >= 30  # 1/8x (at least one group: 1/4x here) .. 8x the responses per update
    assert all(r["duration"] > 0 and r["t_forward"] > 0 for r in train)
    assert info["duration_s"] > 0 and not info["skipped"]


def test_record_writes_calibration_rows_first(tmp_path, tiny_model, small_config):
    from rlsim.replay.fit import fit_trace
    from rlsim.runner.loop import record

    t = read_trace(record(small_config(tmp_path, prompts=4, group=4, steps=2, eval_every=0)))
    assert t.meta["schema_version"] >= 2 and t.meta["calibration"]["duration_s"] > 0
    assert t.count("calib_gen") > 50 and t.count("calib_train") >= 4 and t.count("update") == 2
    g = t.rows("calib_gen")
    assert np.all(g["step"] == 0) and np.all(g["t_start"] >= 0)
    m = fit_trace(t)
    assert m.validation.calibrated and m.gen.concurrency_range[1] == 64
    assert not any("rlrun calibrate" in w for w in m.warnings)
