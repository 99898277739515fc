"""Calibration on the real engine and trainer: rows written, weights and optimizer state untouched."""
from __future__ import annotations

import numpy as np
import pytest

from rlsim.replay.io import read_trace
from rlsim.runner.calibrate import VISIT_STEPS, half_octaves

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
    samples = [Sample(prompt_ids=c.prompt_ids, response_ids=list(c.token_ids), reward=float(i % 2),
                      advantage=1.0 - 2 * (i % 2))
               for i, c in enumerate(outs)]
    trainer.update(samples, 1e-3)  # the optimizer has state (Adam moments) before the calibration
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    opt_before = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                  for i, s in trainer.opt.state_dict()["state"].items()}

    rows, info = run_calibration(engine, trainer, cfg, prompts, [list(c.token_ids) for c in outs], budget_s=60.0)

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
    # half-octaves 1 .. min(16 x B, max_num_seqs) = 64, then a rung of 1.5 x 64 = 96 in two waves
    assert levels == half_octaves(64) + [96]
    assert max(r["num_running"] for r in gen) == 64 and any(r["num_waiting"] > 0 for r in gen)
    for lv in levels[:-1]:
        decode = [r for r in gen if r["calib_level"] == lv and r["prefill_tokens"] == 0]
        assert len(decode) >= VISIT_STEPS and all(r["num_running"] == lv for r in decode)
    by_level = {e["level"]: e for e in info["gen_rungs"]}
    assert set(by_level) == set(levels) and all(e["n"] >= VISIT_STEPS for lv, e in by_level.items() if lv != 96)
    # training: 1/8x .. 8x the batch (at least one group: 1/8x and 1/4x are both G here), every level at least 3 passes
    tok = sorted({r["num_tokens"] for r in train})
    assert sorted({r["calib_level"] for r in train}) == [4, 8, 16, 32, 64, 128] and tok[-1] / tok[0] >= 30
    assert all(e["n"] >= 3 for e in info["train_levels"])
    assert all(r["duration"] > 0 and r["t_forward"] > 0 and r["threads"] is None for r in train)
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


def test_drift_probe_and_one_device_pairs_are_recorded(tmp_path, tiny_model, small_config):
    import os

    from rlsim.replay.device_speed import device_ratios
    from rlsim.replay.drift import drift_of
    from rlsim.runner.loop import record
    from rlsim.runner.summary import summarize

    path = record(small_config(tmp_path, prompts=4, group=4, steps=4, eval_every=0, drift_every=1))
    t = read_trace(path)
    d = drift_of(t)
    assert d is not None and len(d.t) == 4 and np.all(d.gen > 0) and np.all(d.train > 0)
    assert sorted(set(t.rows("drift_gen")["step"])) == [0, 1, 2, 3] and set(t.rows("drift_train")["calib_level"]) == {4}
    assert "drift      4 probes" in summarize(str(path))
    threads = t.rows("calib_gen")["threads"]
    if len(os.sched_getaffinity(0)) > 1:  # more than one core: the calibration also measures one (the device unit)
        dev = t.meta["calibration"]["device"]
        assert np.any(threads == 1) and np.any(threads > 1) and dev["threads"] == 1
        # paired: at least two ratios each, at the run's concurrency and one micro-batch of its update
        assert len(dev["gen_ratios"]) >= 2 and len(dev["train_ratios"]) >= 2 and dev["gen_level"] == 16
        assert set(t.rows("calib_train")["calib_level"][t.rows("calib_train")["threads"] == 1]) == {dev["train_level"]}
        # each side again beside the other (interference): rows marked with load_threads, read back by the fit
        assert dev["load_threads"] == 1 and len(dev["gen_shared_ratios"]) >= 2 and len(dev["train_shared_ratios"]) >= 2
        for kind in ("calib_gen", "calib_train"):
            r = t.rows(kind)
            loaded = r["load_threads"] == 1
            assert loaded.any() and np.all(r["threads"][loaded] == 1) and np.all(r["t_start"][loaded] >= dev["t0"])
        ratios = device_ratios(t)
        assert ratios.shared_pairs >= 2 and ratios.gen_shared > 0 and ratios.train_shared > 0
        assert "interfere  one core beside the other side" in summarize(str(path))


def test_threads_can_be_set_after_an_engine_starts(tiny_model):
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op once it binds its threads; the one-device
    # calibration and the trainer's thread count must still take effect
    import torch

    from rlsim.runner.engine import Engine
    from rlsim.runner.placement import pinned

    Engine(str(tiny_model), max_num_seqs=8, max_model_len=64, kv_cache_gib=0.05, dtype="float32")
    before = torch.get_num_threads()
    with pinned(None, 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
