"""RunConfig arithmetic and validation, tasks, and the rlrun CLI's bad-input handling (no engine needed)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.replay.errors import RlsimError
from rlsim.runner.cli import app
from rlsim.runner.config import RunConfig
from rlsim.runner.tasks import ArithmeticTask, DatasetTask, load_dataset, make_task, scratchpad, scratchpad_sub

ROOT = Path(__file__).resolve().parents[2]


def test_derived_values_and_lr_rules():
    c = RunConfig(prompts=128, group=8, lr=3e-4, lr_ref_batch=256)
    assert c.responses_per_update == 1024 and c.G == 8
    assert c.lr_effective == pytest.approx(3e-4 * 2.0)  # sqrt(1024/256)
    assert dataclasses.replace(c, lr_rule="linear").lr_effective == pytest.approx(3e-4 * 4)
    assert dataclasses.replace(c, lr_rule="fixed").lr_effective == pytest.approx(3e-4)
    assert RunConfig(algo="ppo", prompts=256).responses_per_update == 256  # PPO: G defaults to 1
    meta = RunConfig(prompts=16).to_meta()
    for key in ("algo", "prompts", "group", "lr", "lr_rule", "lr_ref_batch", "max_tokens", "temperature",
                "eval_every", "task", "batch", "lr_effective", "micro_batch"):
        assert key in meta
    assert meta["group"] == 8 and meta["batch"] == 128
    json.dumps(meta)  # goes into the trace metadata


def test_micro_batch_divides_batch():
    for P in (1, 3, 16, 128):
        c = RunConfig(prompts=P, group=8)
        assert c.micro >= 1 and c.micro <= c.responses_per_update


def test_construction_does_no_io(tmp_path):
    RunConfig(model=str(tmp_path / "missing"), dataset=str(tmp_path / "missing.jsonl"))  # no error until validate


@pytest.mark.parametrize("kw,needle", [
    (dict(prompts=0), "--prompts"),
    (dict(group=1), "GRPO needs --group"),
    (dict(algo="ppo", group=4), "PPO uses one response"),
    (dict(steps=-1), "--steps"),
    (dict(prompts=5, train_devices=3), "not divisible by --train-gpus"),
    (dict(prompts=4, group=4, minibatches=3), "--minibatches"),
    (dict(prompts=4, group=4, gen_batch=8), "--gen-batch"),
    (dict(task="mul"), "unknown --task"),
    (dict(algo="dpo"), "unknown --algo"),
    (dict(lr_rule="cubic"), "--lr-rule"),
    (dict(lr=-1.0), "--lr"),
    (dict(max_tokens=300), "--max-tokens"),
])
def test_validate_rejects(kw, needle, tmp_path):
    with pytest.raises(RlsimError, match=needle.replace("-", "\\-")) as e:
        RunConfig(out=str(tmp_path / "t.parquet"), **kw).validate()
    assert "\n" not in str(e.value)


def test_validate_files(tmp_path):
    with pytest.raises(RlsimError, match="model folder not found"):
        RunConfig(model=str(tmp_path / "nope"), out=str(tmp_path / "t.parquet")).validate()
    (tmp_path / "m").mkdir()
    with pytest.raises(RlsimError, match="no config.json"):
        RunConfig(model=str(tmp_path / "m"), out=str(tmp_path / "t.parquet")).validate()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(RlsimError, match="cannot read dataset"):
        RunConfig(dataset=str(bad), out=str(tmp_path / "t.parquet")).validate()
    (tmp_path / "t.parquet").write_text("x")
    with pytest.raises(RlsimError, match="--overwrite"):
        RunConfig(out=str(tmp_path / "t.parquet")).validate()


def test_scratchpad_and_reward():
    assert scratchpad(59, 63) == "9+3+0=12;5+6+1=12#122"
    assert scratchpad(7, 215) == "7+5+0=12;0+1+1=2;0+2+0=2#222"
    t = ArithmeticTask("add2")
    ex = t.example(59, 63)
    assert ex.prompt == "59+63=" and t.reward("9+3+0=12;5+6+1=12#122", ex) == 1.0
    assert t.reward("9+3+0=12;5+6+1=12#121", ex) == 0.0
    assert t.reward("122", ex) == 0.0  # the answer must follow '#'


def test_subtraction_scratchpad_and_stream():
    # every column writes 10 + x - y - borrow; one digit means it borrowed from the next column
    assert scratchpad_sub(523, 187) == "3-7-0=6;2-8-1=3;5-1-1=13#336"
    assert scratchpad_sub(100, 99) == "0-9-0=1;0-9-1=0;1-0-1=10#1"
    t = ArithmeticTask("sub3")
    s = t.train_stream(0)
    pairs = [next(s) for _ in range(300)]
    for ex in pairs:  # the larger operand first, the answer what the scratchpad ends with
        a, b = map(int, ex.prompt[:-1].split("-"))
        assert 100 <= b <= a <= 999 and ex.answer == str(a - b)
        assert t.reward(t.sft_text(ex), ex) == 1.0
    assert t.reward("3-7-0=6;2-8-1=3;5-1-1=13#337", t.example(523, 187)) == 0.0
    assert not {e.prompt for e in t.eval_set(100)} & {e.prompt for e in pairs}


def test_four_digit_addition_fits_the_default_response_length():
    t = ArithmeticTask("add4")
    s = t.train_stream(0)
    pairs = [next(s) for _ in range(300)]
    for ex in pairs:
        a, b = map(int, ex.prompt[:-1].split("+"))
        assert 1000 <= min(a, b) and max(a, b) <= 9999 and t.reward(t.sft_text(ex), ex) == 1.0
        assert len(t.sft_text(ex)) + 1 <= RunConfig().max_tokens  # the scratchpad and its end token
    assert not {e.prompt for e in t.eval_set(100)} & {e.prompt for e in pairs}


def test_three_operand_sum_scratchpad_and_stream():
    # one column per digit: the three digits and the carry in (which can be 2), then their sum
    assert scratchpad(12, 34, 56) == "2+4+6+0=12;1+3+5+1=10#102"
    assert scratchpad(99, 99, 99) == "9+9+9+0=27;9+9+9+2=29#297"
    t = ArithmeticTask("sum3")
    s = t.train_stream(0)
    triples = [next(s) for _ in range(300)]
    for ex in triples:
        ops = list(map(int, ex.prompt[:-1].split("+")))
        assert len(ops) == 3 and all(10 <= n <= 99 for n in ops) and ex.answer == str(sum(ops))
        assert t.reward(t.sft_text(ex), ex) == 1.0
        assert len(t.sft_text(ex)) + 1 <= RunConfig().max_tokens
    assert not {e.prompt for e in t.eval_set(100)} & {e.prompt for e in triples}


def test_streams_deterministic_and_eval_disjoint():
    t = ArithmeticTask("add2")
    a = [next(s) for s in [t.train_stream(1)] for _ in range(200)]
    s = t.train_stream(1)
    b = [next(s) for _ in range(200)]
    assert a == b
    s2 = t.train_stream(2)
    assert [next(s2) for _ in range(200)] != a
    ev = {e.prompt for e in t.eval_set(200)}
    s = t.train_stream(0)
    train = {next(s).prompt for _ in range(5000)}
    assert len(ev) == 200 and not (ev & train)
    lens = [len(scratchpad(*map(int, e.prompt[:-1].split("+")))) for e in ArithmeticTask("addmix").eval_set(200)]
    assert max(lens) - min(lens) >= 15  # addmix has a real length spread


def test_dataset_jsonl_and_parquet(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]
    j = tmp_path / "d.jsonl"
    j.write_text("\n".join(json.dumps(r) for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    assert load_dataset(str(j)) == load_dataset(str(p))
    t = make_task("add2", str(j), "numeric")
    ev = t.eval_set(100)
    assert len(ev) == 2 and not ({e.prompt for e in ev} & {e.prompt for e in t.train})
    assert t.reward("the answer is 19.0", ev[-1]) == 1.0 and t.reward("18", ev[-1]) == 0.0
    assert DatasetTask(str(j), "exact").reward(" 19 ", ev[-1]) == 1.0
    (tmp_path / "e.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(RlsimError, match="lacks `prompt` or `answer`"):
        load_dataset(str(tmp_path / "e.jsonl"))


runner = CliRunner()


@pytest.mark.parametrize("args,needle", [
    (["--prompts", "0"], "--prompts (P) is 0"),
    (["--group", "1"], "GRPO needs --group"),
    (["--algo", "ppo", "--group", "8"], "PPO uses one response"),
    (["--prompts", "5", "--train-gpus", "3"], "not divisible by --train-gpus 3"),
    (["--model", "/no/such/model"], "model folder not found"),
    (["--task", "sudoku"], "unknown --task"),
    (["--dataset", "/no/such.jsonl"], "dataset not found"),
    (["--steps", "0"], "--steps is 0"),
])
def test_cli_bad_input_one_line_exit_2(args, needle, tmp_path):
    res = runner.invoke(app, ["record", "--out", str(tmp_path / "t.parquet"), *args])
    assert res.exit_code == 2, res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    assert "Traceback" not in res.output


def test_cli_unreadable_dataset(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    bad = tmp_path / "d.parquet"
    bad.write_bytes(b"not parquet at all")
    res = runner.invoke(app, ["record", "--out", str(tmp_path / "t.parquet"), "--dataset", str(bad), "--model",
                              str(model)])
    assert res.exit_code == 2 and "cannot read dataset" in res.stderr


def test_cli_inspect_missing_trace(tmp_path):
    res = runner.invoke(app, ["inspect", str(tmp_path / "none.parquet")])
    assert res.exit_code == 2 and "trace not found" in res.stderr


def test_help_and_errors_fast_without_torch():
    code = ("import sys; from typer.testing import CliRunner; from rlsim.runner.cli import app; "
            "r = CliRunner().invoke(app, ['record', '--out', '/tmp/x.parquet', '--prompts', '0']); "
            "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
            "print(r.exit_code, bad); sys.exit(0 if r.exit_code == 2 and not bad else 1)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("cmd", ["record", "calibrate"])
def test_missing_engine_is_one_line(cmd, tmp_path, monkeypatch):
    for mod in ("torch", "vllm", "transformers"):  # the base install: importing them fails
        monkeypatch.setitem(sys.modules, mod, None)
    out = tmp_path / "t.parquet"
    res = runner.invoke(app, [cmd, "--out", str(out), "--prompts", "4"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == ('error: rlrun needs torch and vLLM (torch, vllm, transformers not installed): '
                                  'pip install torch==2.13.0 && pip install -e ".[cpu]" (CPU) or '
                                  'pip install -e ".[gpu]" (CUDA)')
    assert not list(tmp_path.iterdir())  # refused before anything was written
    res = runner.invoke(app, [cmd, "--out", str(out), "--prompts", "0"])  # bad input is still reported first
    assert res.exit_code == 2 and "--prompts (P) is 0" in res.stderr


def test_inspect_needs_no_engine(monkeypatch):
    for mod in ("torch", "vllm", "transformers"):
        monkeypatch.setitem(sys.modules, mod, None)
    res = runner.invoke(app, ["inspect", str(ROOT / "traces" / "grpo_p32.parquet")])
    assert res.exit_code == 0 and "responses/s" in res.output, res.output


# ---- the options are RunConfig's fields (rlsim.cli.opts, shared with rlsim) ---------------------------------------

# --max-model-len: record takes it too, as its own error message ("must be below --max-model-len") says
RECORD_FLAGS = ['--algo', '--batch', '--calibrate', '--compile', '--critic-lr', '--dataset', '--drift-every',
                '--dtype', '--epochs', '--eval-every', '--eval-k', '--eval-prompts', '--gamma', '--gen-batch',
                '--gen-gpus', '--group', '--kv-cache-gib', '--lam', '--loss-agg', '--lr', '--lr-ref-batch',
                '--lr-rule', '--max-model-len', '--max-num-seqs', '--max-tokens', '--micro-batch', '--minibatches',
                '--mode', '--model', '--no-calibrate', '--no-compile', '--no-partial-rollout', '--no-progress',
                '--no-record-steps', '--no-std-scale', '--off-policy', '--out', '--overwrite', '--partial-rollout',
                '--progress', '--prompts', '--record-steps', '--reward', '--seed', '--staleness', '--std-scale',
                '--steps', '--task', '--temperature', '--threads', '--tis-cap', '--train-gpus', '-G', '-P', '-b',
                '-g', '-o']
CALIBRATE_FLAGS = ['--algo', '--batch', '--compile', '--dataset', '--dtype', '--gen-batch', '--group',
                   '--kv-cache-gib', '--max-model-len', '--max-num-seqs', '--max-tokens', '--micro-batch', '--model',
                   '--no-compile', '--out', '--overwrite', '--prompts', '--reward', '--seed', '--task',
                   '--temperature', '--threads', '-G', '-P', '-b', '-g', '-o']


def _params(name):
    import typer

    return typer.main.get_command(app).commands[name].params


# the old spellings of the split options, still taken, not shown (rlsim's vocabulary: --gen-gpus, --staleness)
RECORD_ALIASES = ['--gen-devices', '--max-staleness', '--train-devices']


@pytest.mark.parametrize("name,flags,aliases", [("record", RECORD_FLAGS, RECORD_ALIASES),
                                                ("calibrate", CALIBRATE_FLAGS, [])])
def test_rlrun_options_keep_their_spellings(name, flags, aliases):
    shown = [p for p in _params(name) if p.name != "help" and not p.hidden]
    assert sorted(f for p in shown for f in p.opts + p.secondary_opts) == flags
    assert sorted(f for p in _params(name) if p.hidden for f in p.opts) == aliases
    fields_ = {f.name: f for f in dataclasses.fields(RunConfig)}
    for p in shown:
        f = fields_[p.name.removeprefix("rc_")]
        assert name in f.metadata["cli"]
        if p.required:  # --out: the library's default is not the CLI's
            assert f.name == "out"
        elif f.default is not None:  # the default shown and used is the field's
            assert str(p.default) == str(f.default), p.name


@pytest.fixture
def recorded(monkeypatch):
    """The RunConfig `rlrun record`/`calibrate` would run, instead of running it."""
    import rlsim.runner.cli as cli

    got = []
    monkeypatch.setattr(cli, "_run", lambda cfg, interrupted, **kw: got.append((cfg, kw)))
    return got


def test_cli_defaults_are_the_fields(recorded, tmp_path):
    out = str(tmp_path / "t.parquet")
    assert runner.invoke(app, ["record", "--out", out]).exit_code == 0
    assert recorded[-1] == (RunConfig(out=out), {})
    assert recorded[-1][0].to_meta() == RunConfig(out=out).to_meta()  # what goes into the trace metadata
    assert runner.invoke(app, ["calibrate", "-o", out]).exit_code == 0
    assert recorded[-1] == (RunConfig(out=out, steps=1, calibrate=True, progress=False), {"only_calibration": True})


def test_cli_values_reach_the_config(recorded, tmp_path):
    out = str(tmp_path / "t.parquet")
    args = ["record", "-o", out, "-P", "16", "-G", "4", "--steps", "3", "--lr", "1e-3", "--lr-rule", "fixed",
            "--no-std-scale", "--compile", "--no-progress", "--no-record-steps", "--no-calibrate", "--loss-agg", "seq",
            "--kv-cache-gib", "0.5", "--overwrite", "--mode", "split", "--staleness", "1", "--partial-rollout"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert recorded[-1][0] == RunConfig(out=out, prompts=16, group=4, steps=3, lr=1e-3, lr_rule="fixed",
                                        std_scale=False, compile=True, progress=False, record_steps=False,
                                        calibrate=False, loss_agg="seq", kv_cache_gib=0.5, overwrite=True, mode="split",
                                        max_staleness=1, partial_rollout=True)
    assert runner.invoke(app, ["calibrate", "-o", out, "--max-model-len", "512", "--group", "none"]).exit_code == 0
    assert recorded[-1][0].max_model_len == 512 and recorded[-1][0].group is None


@pytest.mark.parametrize("cmd", ["record", "calibrate"])
@pytest.mark.parametrize("args,line", [
    (["--prompts", "abc"], "error: --prompts/--batch: 'abc' is not a valid value (expected int)"),
    (["-P", "1.5"], "error: --prompts/--batch: '1.5' is not a valid value (expected an integer)"),
    (["--temperature", "hot"], "error: --temperature: 'hot' is not a valid value (expected float)"),
    (["--max-tokens", ""], "error: --max-tokens is empty; give a value"),
])
def test_cli_bad_number_is_one_line(cmd, args, line, tmp_path):
    res = runner.invoke(app, [cmd, "--out", str(tmp_path / "t.parquet"), *args])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.strip() == line


@pytest.mark.parametrize("args", [["--train-gpus", "5", "--gen-gpus", "1", "--staleness", "1"],
                                  ["--train-devices", "5", "--gen-devices", "1", "--max-staleness", "1"]])
def test_split_options_take_rlsim_spellings_and_the_old_ones(tmp_path, args):
    """rlrun speaks rlsim's vocabulary (--gen-gpus/--train-gpus/--staleness, --batch for --prompts); the old
    spellings still set the same fields, hidden from --help."""
    res = CliRunner().invoke(app, ["record", "--mode", "split", "--batch", "32", *args,
                                   "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and res.output.strip() == (
        "error: batch B = P x G = 256 is not divisible by --train-gpus 5; choose P so that P x G is a multiple of 5")
    assert not (tmp_path / "t.parquet").exists()
