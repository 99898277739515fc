"""`rlrun probe`: bad input (no engine needed), the KV check, `rlrun inspect` of a probe trace, and one tiny real
probe."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.replay.errors import RlsimError
from rlsim.runner.cli import app
from rlsim.runner.config import ProbeConfig, RunConfig
from rlsim.runner.probe import check_kv, orders
from rlsim.runner.summary import summarize
from tests.replay.test_probe import write_probe

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize("args,line", [
    (["--prompts", "16"], "error: give at least two sizes to compare, e.g. --prompts 16,64,256 (sigma is each size's "
                          "responses/s over the smallest's)"),
    (["--prompts", "16,64,16"], "error: --prompts lists 16 more than once (16,64,16); give each size once"),
    (["--prompts", "16,64", "--rounds", "0"],
     "error: --rounds is 0; it must be at least 1 (2 or more give sigma a 90 % interval)"),
    (["--prompts", "16,64", "--rounds", "-2"],
     "error: --rounds is -2; it must be at least 1 (2 or more give sigma a 90 % interval)"),
    (["--prompts", "16,6x"], "error: --prompts: '6x' is not a valid value (expected int)"),
    (["--prompts", "16,1.5"], "error: --prompts: '1.5' is not a valid value (expected an integer)"),
    (["--prompts", "16,64", "--rounds", "two"], "error: --rounds: 'two' is not a valid value (expected int)"),
    # RunConfig's checks at every size: one that only some sizes fail names the size
    (["--prompts", "6,5", "--train-gpus", "2", "--micro-batch", "2"],
     "error: --prompts 5 is not divisible by --train-gpus 2: each rank trains whole groups; choose P as a multiple "
     "of 2"),
    (["--prompts", "4,12", "--minibatches", "3"],
     "error: at --prompts 4: batch per rank 32 is not divisible by --minibatches 3; choose P or "
     "--minibatches so it divides"),
    (["--prompts", "4,8", "--task", "sudoku"],
     "error: unknown --task 'sudoku'; choose one of add2, add3, add4, addmix, sum3, sub3 or pass --dataset FILE"),
    (["--prompts", "4,8", "--train-gpus", "2"],
     "error: rlrun probe with --train-gpus 2 needs --micro-batch N with N at most 16 (the smallest size's responses "
     "per rank and minibatch), so that every size trains in micro-batches of N on every rank"),
])
def test_bad_input_is_one_line_exit_2(args, line, tmp_path):
    res = runner.invoke(app, ["probe", "--out", str(tmp_path / "p.parquet"), *args])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.stderr.strip() == line
    assert not list(tmp_path.iterdir())


def test_bad_input_is_refused_before_torch_loads():
    code = ("import sys; from typer.testing import CliRunner; from rlsim.runner.cli import app; "
            "rs = [CliRunner().invoke(app, ['probe', '--out', '/tmp/x.parquet', *a]) for a in "
            "(['-P', '16'], ['-P', '16,16'], ['-P', '16,64', '--rounds', '0'])]; "
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
            "print([r.exit_code for r in rs], bad); "
            "sys.exit(0 if all(r.exit_code == 2 for r in rs) and not bad else 1)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_missing_engine_is_one_line(tmp_path, monkeypatch):
    for mod in ("torch", "vllm", "transformers"):
        monkeypatch.setitem(sys.modules, mod, None)
    res = runner.invoke(app, ["probe", "--out", str(tmp_path / "p.parquet"), "--prompts", "4,8"])
    assert res.exit_code == 2 and res.stderr.strip().startswith("error: rlrun needs torch and vLLM"), res.output


@pytest.fixture
def probed(monkeypatch):
    """The ProbeConfig `rlrun probe` would run, instead of running it."""
    import rlsim.runner.cli as cli

    got = []
    monkeypatch.setattr(cli, "_probe", lambda pc, interrupted: got.append(pc))
    return got


def test_cli_values_reach_the_config(probed, tmp_path):
    out = str(tmp_path / "p.parquet")
    res = runner.invoke(app, ["probe", "-o", out, "-P", "64,16,256", "-G", "4", "--lr-rule", "linear", "--max-tokens",
                              "16", "--seed", "3", "--max-num-seqs", "512", "--kv-cache-gib", "0.5"])
    assert res.exit_code == 0, res.output
    pc = probed[-1]
    assert pc == ProbeConfig(prompts=(64, 16, 256), rounds=3,
                             run=RunConfig(out=out, group=4, lr_rule="linear", max_tokens=16, seed=3, max_num_seqs=512,
                                           kv_cache_gib=0.5))
    ref = pc.reference
    # 3 rounds x 3 sizes x 2 steps a visit
    assert (ref.prompts, ref.steps, ref.eval_every, ref.calibrate, ref.drift_every) == (16, 18, 0, False, 0)
    assert pc.at(256).lr_effective == pytest.approx(3e-4 * 1024 / 1024)  # linear rule at B = 1024 = B_ref
    assert pc.to_meta()["batch"] == [256, 64, 1024]


PROBE_FLAGS = ['--algo', '--batch', '--compile', '--critic-lr', '--dataset', '--dtype', '--epochs', '--gamma',
               '--group', '--kv-cache-gib', '--lam', '--loss-agg', '--lr', '--lr-ref-batch', '--lr-rule',
               '--max-model-len', '--max-num-seqs', '--max-tokens', '--micro-batch', '--minibatches', '--model',
               '--no-compile', '--no-record-steps', '--no-std-scale', '--off-policy', '--out', '--overwrite',
               '--prompts', '--record-steps', '--reward', '--rounds', '--seed', '--std-scale', '--task',
               '--temperature', '--threads', '--tis-cap', '--train-gpus', '--visit-steps', '-G', '-P', '-b', '-g',
               '-o']


def test_probe_options_keep_their_spellings():
    import typer

    params = typer.main.get_command(app).commands["probe"].params
    shown = [p for p in params if p.name != "help" and not p.hidden]
    assert sorted(f for p in shown for f in p.opts + p.secondary_opts) == PROBE_FLAGS
    assert sorted(f for p in params if p.hidden for f in p.opts) == ["--train-devices"]  # the old spelling, still taken
    run_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for p in shown:
        if p.name.startswith("rc_"):  # a RunConfig option: the field says probe takes it, its default is the field's
            f = run_fields[p.name.removeprefix("rc_")]
            assert ("probe" in f.metadata["cli"]
                    and (p.required or f.default is None or str(p.default) == str(f.default)))
    assert [p.name for p in params if p.required] == ["pc_prompts", "rc_out"]


def test_orders_are_seeded_shuffles():
    a = orders((4, 16, 64), 5, seed=0)
    assert a == orders((4, 16, 64), 5, seed=0) and a != orders((4, 16, 64), 5, seed=1)
    assert all(sorted(o) == [4, 16, 64] for o in a) and len({tuple(o) for o in a}) > 1
    # balanced: over 6 rounds every size takes every position twice
    b = orders((4, 16, 64), 6, seed=0)
    assert all(sorted(o[i] for o in b) == [4, 4, 16, 16, 64, 64] for i in range(3))


def test_kv_check_names_the_size_and_the_fix(tmp_path):
    pc = ProbeConfig(prompts=(16, 64, 256),
                     run=RunConfig(group=8, max_tokens=48, kv_cache_gib=1.0, out=str(tmp_path / "p.parquet")))
    engine = SimpleNamespace(max_num_seqs=1024, kv_cache_tokens=40_000)
    with pytest.raises(RlsimError) as e:  # P=256: 1024 running (max_num_seqs) x (10 + 48) = 59392 > 40000
        check_kv(pc, engine, longest=10)
    assert str(e.value) == ("--prompts 256 (B = 2048) needs 59392 KV tokens (1024 sequences at once x (10 prompt + 48 "
                            "new tokens)), the engine's KV cache holds 40000: drop 256 from --prompts, or give the "
                            "cache --kv-cache-gib 1.5 (vLLM's VLLM_CPU_KVCACHE_SPACE on CPU) or fewer --max-num-seqs")
    check_kv(pc, SimpleNamespace(max_num_seqs=512, kv_cache_tokens=40_000), longest=10)  # 512 x 58 fits


def test_inspect_prints_the_sigma_table(tmp_path, monkeypatch):
    for mod in ("torch", "vllm", "transformers"):
        monkeypatch.setitem(sys.modules, mod, None)
    p = write_probe(tmp_path / "probe.parquet")
    res = runner.invoke(app, ["inspect", str(p)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "config     grpo probe P=16,4,64 G=2 rounds=3" in out
    assert "probe      3 rounds, every size once per round in a shuffled order: 16,4,64; 64,16,4; 4,64,16" in out
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if "round 1" in ln)
    assert lines[head].split() == ["P", "G", "B", "round", "1", "round", "2", "round", "3", "median", "sigma", "(90",
                                   "%", "interval)"]
    assert lines[head + 1].split() == ["4", "2", "8", "100.0", "80.0", "120.0", "100.0", "1.000x", "(1.000..1.000)"]
    assert lines[head + 2].split()[:7] == ["16", "2", "32", "145.0", "124.0", "180.0", "145.0"]
    # (1.45 1.55 1.5)^(1/3)
    assert lines[head + 2].split()[7] == "1.499x" and "90 % t interval on the log ratios over 3 rounds" in out


# ---- one tiny real probe --------------------------------------------------------------------------------------------

@pytest.mark.engine
def test_tiny_probe_end_to_end(tmp_path, tiny_model):
    from rlsim.replay.io import read_trace
    from rlsim.replay.probe import probe_sigma
    from rlsim.runner.probe import probe

    run = RunConfig(group=2, max_tokens=16, eval_prompts=16, kv_cache_gib=0.1, max_num_seqs=64, progress=False,
                    out=str(tmp_path / "probe.parquet"))
    logs: list[str] = []
    path = probe(ProbeConfig(prompts=(4, 2), rounds=2, run=run), log=logs.append)
    t = read_trace(path)
    m = t.meta
    assert m["status"] == "complete" and m["kind"] == "probe" and not t.recovered
    assert (t.config["prompts"], t.config["group"], t.config["steps"], t.config["calibrate"]) == (2, 2, 8, False)
    pr = m["probe"]
    assert (pr["sizes"], pr["group"], pr["batch"], pr["rounds"], pr["warmup_steps"]) == ([4, 2], 2, [8, 4], 2, 2)
    assert pr["order"] == orders((4, 2), 2, seed=0) and "command" in pr
    for key in ("engine", "trainer", "hardware", "model", "packages", "seed"):
        assert key in m
    assert m["engine"]["warmup_excluded"] is True
    # every update a full RL step of its size, in the recorded order, at its size's lr; no evals, no calibration
    u, r, s = t.rows("update"), t.rows("response"), t.rows("sync")
    # two steps a visit (the first settles the switch of size): 2 rounds x 2 sizes x 2
    assert list(u["step"]) == list(range(8)) and t.count("eval") == 0 and t.count("calib_gen") == 0
    assert t.count("drift_gen") == 0 and pr["visit_steps"] == 2
    assert list(u["num_responses"]) == [p * 2 for o in pr["order"] for p in o for _ in range(2)]
    lr = dict(zip(pr["batch"], pr["lr_effective"]))
    assert [float(x) for x in u["lr"]] == pytest.approx([lr[int(b)] for b in u["num_responses"]])
    assert lr[8] == pytest.approx(3e-4 * (8 / 1024) ** 0.5)
    assert np.all(u["step_time"] >= u["gen_time"] + u["duration"]) and np.all(u["gen_time"] > 0)
    for step in range(8):
        assert (r["step"] == step).sum() == u["num_responses"][step]
        assert t.count("gen_step") and (t.rows("gen_step")["step"] == step).any()
    assert list(s["policy_version"]) == list(range(1, 9))
    assert sum("warm-up step P=" in line for line in logs) == 2 and sum(line.startswith("round ") for line in logs) == 8
    ps = probe_sigma(t)
    assert [x.prompts for x in ps.rows] == [2, 4] and ps.rows[0].sigma == 1.0 and ps.rows[1].rounds == 2
    assert ps.rows[1].sigma > 0 and ps.rows[1].sigma_lo <= ps.rows[1].sigma <= ps.rows[1].sigma_hi
    text = summarize(str(path))
    print(text)
    assert "sigma (90 % interval)" in text and f"{ps.rows[1].sigma:.3f}x" in text
    for head in ("trace ", "status ", "config ", "hardware ", "model ", "engine ", "packages ", "events "):
        assert any(line.startswith(head) for line in text.splitlines()), head
    # and the simulator refuses it as a run
    from rlsim.cli.options import StudyOptions, read_traces

    with pytest.raises(RlsimError, match="is an `rlrun probe` trace"):
        read_traces(StudyOptions(trace=(path,)))
