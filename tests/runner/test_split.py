"""Split mode (runner/split.py) and device placement: a small real asynchronous run, and the bad input."""
from __future__ import annotations

import os

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.replay.errors import RlsimError
from rlsim.runner.cli import app
from rlsim.runner.config import RunConfig
from rlsim.runner.placement import place

runner = CliRunner()
CORES = len(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(CORES < 2, reason="split mode needs a core per side")


def _split_run(tmp_path, small_config, **kw):
    from rlsim.replay.io import read_trace
    from rlsim.runner.loop import record

    cfg = small_config(tmp_path, mode="split", gen_devices=1, train_devices=1, eval_every=0, eval_prompts=8, **kw)
    record(cfg, log=lambda m: None)
    return read_trace(cfg.out)


def _intervals(rows):
    if not len(rows["t_start"]):
        return np.zeros((0, 2))
    return np.stack([rows["t_start"], rows["t_start"] + rows["duration"]], axis=1)


@two_cores
@pytest.mark.engine
def test_split_run_overlaps_generation_with_training_and_keeps_the_staleness_limit(tmp_path, tiny_model, small_config):
    tr = _split_run(tmp_path, small_config, steps=4, max_staleness=1, off_policy="tis")
    assert tr.config["mode"] == "split" and tr.config["max_staleness"] == 1
    resp = tr.rows("response")
    assert len(resp["t_start"]) == 4 * 4 * 4  # steps x P x G, every consumed response recorded
    lag = np.asarray(resp["consumed_step"]) - np.asarray(resp["policy_version"])
    assert lag.min() >= 0 and lag.max() <= 1
    assert (lag == 1).any()  # batch 1 was admitted at version 0 beside batch 0 and trained by update 1
    assert (np.asarray(resp["finish_version"]) >= np.asarray(resp["policy_version"])).all()
    # generation overlaps training: some engine step runs while the trainer computes an update
    gen = _intervals(tr.rows("gen_step"))
    upd = _intervals(tr.rows("update"))
    overlap = sum(max(0.0, min(g[1], u[1]) - max(g[0], u[0])) for u in upd for g in gen)
    assert overlap > 0
    sync = tr.rows("sync")
    assert (len(sync["t_start"]) == 4 and (np.asarray(sync["engine_id"]) == 0).all()
            and (np.asarray(sync["bytes"]) > 0).all())
    assert list(sync["policy_version"]) == [1, 2, 3, 4]
    idle = tr.rows("idle")
    assert len(idle["t_start"]) > 0  # the replica waited for prompts or weights at least once
    assert tr.meta["placement"]["gen"] != tr.meta["placement"]["train"]
    u = tr.rows("update")  # the trainer process's peak; generation runs in the engines' processes: not measured
    assert np.isnan(u["mem_gen_peak_bytes"]).all() and np.all(u["mem_train_peak_bytes"] > tr.meta["model"]["bytes"])


@two_cores
@pytest.mark.engine
def test_split_run_with_staleness_0_is_synchronous(tmp_path, tiny_model, small_config):
    tr = _split_run(tmp_path, small_config, steps=3, max_staleness=0, partial_rollout=True)
    resp = tr.rows("response")
    assert (np.asarray(resp["consumed_step"]) == np.asarray(resp["policy_version"])).all()
    # with nothing admitted beyond the current batch no response spans a sync
    assert (np.asarray(resp["finish_version"]) == np.asarray(resp["policy_version"])).all()


@two_cores
@pytest.mark.engine
def test_split_over_generation_and_partial_rollout_keep_g_per_prompt(tmp_path, tiny_model, small_config):
    # P = 4, G = 4, 24 responses generated per 16 trained: the first G of each prompt to finish are kept
    tr = _split_run(tmp_path, small_config, steps=3, max_staleness=2, partial_rollout=True, gen_batch=24)
    resp = tr.rows("response")
    per_prompt = np.bincount(np.asarray(resp["prompt_id"], int))
    assert len(per_prompt) == 12 and (per_prompt == 4).all()
    assert sorted(set(np.asarray(resp["group_index"], int).tolist())) == [0, 1, 2, 3]
    lag = np.asarray(resp["consumed_step"]) - np.asarray(resp["policy_version"])
    assert lag.max() <= 2 and (np.asarray(resp["finish_version"]) >= np.asarray(resp["policy_version"])).all()


def test_placement_gives_each_side_its_own_devices():
    pl = place("split", 1, 2, have=("cpu", [0, 1, 2, 3]))
    assert pl.gen == ((0,),) and pl.train == ((1,), (2,))
    co = place("colocated", 1, 2, have=("cpu", [0, 1, 2, 3]))
    assert co.gen == () and co.train == ((0, 1), (2, 3))
    with pytest.raises(RlsimError, match="separate devices.*at most 2"):
        place("split", 2, 1, have=("cpu", [0, 1]))
    with pytest.raises(RlsimError, match="more than the 2 GPUs"):
        place("colocated", 1, 3, have=("cuda", [0, 1]))
    with pytest.raises(RlsimError, match="--threads 3 is more than the 2 CPU cores"):
        place("colocated", 1, 1, have=("cpu", [0, 1]), threads=3)
    # GPUs: torch indices for the trainer, physical ids (CUDA_VISIBLE_DEVICES=2,3,5) for an engine process
    gpu = place("split", 1, 2, have=("cuda", [2, 3, 5]))
    assert gpu.gen == ((0,),) and gpu.train == ((1,), (2,)) and gpu.physical(gpu.gen[0]) == (2,)
    assert gpu.physical(gpu.train[1]) == (5,)


@pytest.mark.parametrize("kw, msg", [
    (dict(partial_rollout=True), "--partial-rollout needs --mode split"),
    (dict(max_staleness=2), "--staleness needs --mode split"),
    (dict(mode="split", max_staleness=-1), "--staleness is -1"),
    (dict(mode="async"), "unknown --mode"),
    (dict(off_policy="is"), "unknown --off-policy"),
    (dict(prompts=3, group=4, train_devices=2), "--prompts 3 is not divisible by --train-gpus 2"),
    (dict(mode="split", gen_batch=8), "smaller than the train batch"),
])
def test_bad_split_config_is_one_line(kw, msg):
    with pytest.raises(RlsimError, match=msg.replace("-", r"\-")):
        RunConfig(**{"prompts": 4, "group": 4, **kw}).validate(check_files=False)


def test_cli_split_bad_input_exit_2_without_traceback(tmp_path):
    out = tmp_path / "x.parquet"
    out.write_bytes(b"keep")
    r = runner.invoke(app, ["record", "--out", str(tmp_path / "y.parquet"), "--mode", "split",
                            "--gen-gpus", str(CORES), "--train-gpus", "1"])
    assert r.exit_code == 2 and "separate devices" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["record", "--out", str(out), "--partial-rollout"])
    assert r.exit_code == 2 and "needs --mode split" in r.output
    assert out.read_bytes() == b"keep"  # nothing recorded is lost
