"""`rlsim run | replay | rank` through typer's CliRunner, and bad input: one line, exit 2, no traceback."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlsim.replay.io import write_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return synthetic_trace(tmp_path_factory.mktemp("cli") / "p16.parquet", SynthSpec(prompts=16, group=4, steps=5))


def _ok(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output


def test_run_json_keys_and_values(trace):
    d = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--json"]))
    for k in ("prompts", "group", "responses_per_s", "step_time_s", "sigma", "rho", "time_to_target_ratio",
              "gen_s", "train_s", "sync_s", "idle_s", "regime", "rho_model", "reference"):
        assert k in d
    assert (d["prompts"], d["group"]) == (64, 4)
    assert d["reference"]["prompts"] == 16 and d["reference"]["sigma"] == 1.0
    assert (d["reference"]["rho"], d["reference"]["time_to_target_ratio"]) == (1.0, 1.0)
    bc = SynthSpec().tr_sigma / SynthSpec().g2  # the gradient noise scale the synthetic trace was made with
    assert d["rho_model"] == "noise-scale" and d["rho"] == pytest.approx((1 + 256 / bc) / (1 + 64 / bc), rel=0.02)


def test_rho_from_one_trace_is_flagged_as_a_guess(trace, tmp_path):
    d = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--json"]))
    assert d["rho_model"] == "noise-scale" and any("treat rho and the ranking as a guess" in w for w in d["warnings"])
    # a model the user chose, or curves from runs at other sizes: no such warning
    d = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--rho", "invariant", "--json"]))
    assert not any("as a guess" in w for w in d["warnings"])
    other = synthetic_trace(tmp_path / "p64.parquet", SynthSpec(prompts=64, group=4, steps=5, seed=1))
    d = json.loads(_ok(["run", "--trace", str(trace), "--trace", str(other), "--batch", "32", "--json"]))
    assert not any("as a guess" in w for w in d["warnings"])


def test_run_is_deterministic_with_seed(trace):
    args = ["run", "--trace", str(trace), "--batch", "32", "--seed", "5", "--updates", "10", "--json"]
    assert _ok(args) == _ok(args)


def test_run_table_names_the_rho_model(trace):
    out = _ok(["run", "--trace", str(trace), "--batch", "64", "--group", "8", "--lr-rule", "fixed", "--rho",
               "invariant"])
    assert "rho model: invariant" in out and "T / T_ref" in out
    assert "--lr-rule fixed" in out  # the warning


def test_run_lr_aware_rho(trace, tmp_path):
    from rlsim.replay.rho import lr_aware_rho

    # the synthetic trace's batch is 16 x 4 = 64 responses; --batch 64 is 256
    d = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--rho", "lr-aware", "--bend-batch", "300",
                        "--kappa", "0.3", "--json"]))
    assert d["rho_model"] == "lr-aware"
    assert d["rho"] == pytest.approx(lr_aware_rho(64, 300, 0.3).rho(256))
    assert any("kappa = 0.3 as given" in n for n in d["notes"])  # how the answer was made: a note, not a warning
    # it takes the candidate's lr rule (noise-scale ignores it): a fixed lr is another rho
    fixed = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--rho", "lr-aware", "--bend-batch", "300",
                            "--kappa", "0.3", "--lr-rule", "fixed", "--json"]))
    assert fixed["rho"] == pytest.approx(lr_aware_rho(64, 300, 0.3).rho(256, "fixed"))
    assert fixed["rho"] != pytest.approx(d["rho"])
    # no parameters and one trace: nothing to fit them on, and no defaults (they are the task's): one line, exit 2
    r = runner.invoke(app, ["run", "--trace", str(trace), "--batch", "64", "--rho", "lr-aware"])
    assert r.exit_code == 2 and "needs its two constants" in r.output and len(r.output.strip().splitlines()) == 1
    # another batch size's run: m and kappa fitted on it
    other = synthetic_trace(tmp_path / "p64.parquet", SynthSpec(prompts=64, group=4, steps=5, seed=1))
    d = json.loads(_ok(["run", "--trace", str(trace), "--trace", str(other), "--batch", "32", "--rho", "lr-aware",
                        "--json"]))
    assert any("fitted on 1 runs" in w and "not identified" in w for w in d["warnings"])
    # nothing to fit on when the reference has no evals: one line, exit 2
    a_, b_ = (synthetic_trace(tmp_path / f"noeval{p}.parquet", SynthSpec(prompts=p, group=4, steps=3, eval_every=99))
              for p in (16, 64))
    r = runner.invoke(app, ["run", "--trace", str(a_), "--trace", str(b_), "--batch", "32", "--rho", "lr-aware"])
    assert r.exit_code == 2 and "no eval rows" in r.output and len(r.output.strip().splitlines()) == 1


def test_replay_prints_errors(trace):
    out = _ok(["replay", str(trace)])
    assert "step time" in out and "median err" in out and "0.00%" in out
    d = json.loads(_ok(["replay", str(trace), "--json"]))
    assert d["errors"]["step_time"]["median"] < 1e-9


def test_rank(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("config,sigma,rho\np128,1,1\np1024,1.41,1\np2048,1.30,1.6\n")
    out = _ok(["rank", "--measurements", str(f), "--reference", "p128"])
    assert "best: p1024" in out and "0.709" in out


def _bad_files(tmp_path):
    text = tmp_path / "not.parquet"
    text.write_text("hello")
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), plain)
    v2 = write_trace(tmp_path / "v99.parquet", {"schema_version": 99}, [])
    cols = tmp_path / "cols.parquet"
    t = pq.read_table(synthetic_trace(tmp_path / "full.parquet", SynthSpec(steps=2)))
    pq.write_table(t.drop(["context_tokens"]).replace_schema_metadata(t.schema.metadata), cols)
    return {"missing": tmp_path / "nope.parquet", "text": text, "plain": plain, "v99": v2, "cols": cols}


@pytest.mark.parametrize("case,msg", [("missing", "not found"), ("text", "not a readable Parquet"),
                                      ("plain", "no `rlsim` metadata"), ("v99", "schema version 99"),
                                      ("cols", "lacks columns context_tokens")])
def test_bad_trace_files(tmp_path, case, msg):
    path = _bad_files(tmp_path)[case]
    for args in (["run", "--trace", str(path), "--batch", "64"], ["replay", str(path)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2
        assert msg in r.output and "Traceback" not in r.output
        assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,msg", [(["--batch", "0"], "--prompts must be a positive integer"),
                                      (["--batch", "-4"], "--prompts must be a positive integer"),
                                      (["--group", "1"], "GRPO needs a group of at least 2"),
                                      (["--lr-rule", "cubic"], "--lr-rule must be one of"),
                                      (["--rho", "magic"], "--rho must be one of"),
                                      (["--bend-batch", "800", "--kappa", "0.5"], "add --rho lr-aware"),
                                      (["--rho", "lr-aware", "--kappa", "0.5"], "give both --bend-batch and --kappa"),
                                      (["--rho", "lr-aware", "--bend-batch", "800", "--kappa", "1.5"], "in [0, 1)"),
                                      (["--updates", "0"], "--updates must be a positive integer")])
def test_bad_options(trace, args, msg):
    r = runner.invoke(app, ["run", "--trace", str(trace), *args])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def _refused(args) -> str:
    """The one line of a refusal: exit 2, no traceback."""
    r = runner.invoke(app, args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def test_a_group_on_a_ppo_trace_is_refused(tmp_path):
    ppo = synthetic_trace(tmp_path / "ppo.parquet", SynthSpec(algo="ppo", prompts=32, group=1, steps=3))
    msg = _refused(["run", "--trace", str(ppo), "--batch", "32", "--group", "8"])
    assert "PPO trains one response per prompt (G = 1" in msg and "got --group 8" in msg and "--prompts 256" in msg
    msg = _refused(["sweep", "--trace", str(ppo), "--batch", "32,64", "--group", "1,4", "--out", str(tmp_path / "sw")])
    assert "--group 4" in msg and "PPO trains one response per prompt" in msg
    assert json.loads(_ok(["run", "--trace", str(ppo), "--batch", "64", "--group", "1", "--json"]))["group"] == 1


def test_a_target_above_what_the_reference_reached_is_refused(trace, tmp_path):
    from rlsim.replay.io import read_trace
    from rlsim.replay.learning import fit_learning_curve

    best = fit_learning_curve(read_trace(trace)).best
    msg = _refused(["run", "--trace", str(trace), "--batch", "64", "--target", "2.0"])
    assert msg.startswith(f"error: --target 2 is above the reference's best eval score {best:.4g}")
    d = json.loads(_ok(["run", "--trace", str(trace), "--batch", "64", "--target", repr(best), "--json"]))
    assert d["target"] == best and d["n_star_ref"] > 0  # what it reached is a target
    other = synthetic_trace(tmp_path / "p64.parquet", SynthSpec(prompts=64, group=4, steps=5, seed=1))
    msg = _refused(["run", "--trace", str(trace), "--trace", str(other), "--batch", "32", "--target", "2"])
    common = min(best, fit_learning_curve(read_trace(other)).best)
    assert f"the best all 2 traces reached is {common:.4g}" in msg
    assert "best eval score" in _refused(["sweep", "--trace", str(trace), "--batch", "32,64", "--target", "2",
                                          "--out", str(tmp_path / "sw")])


def test_rank_bad_input(tmp_path):
    r = runner.invoke(app, ["rank", "--measurements", str(tmp_path / "none.csv"), "--reference", "a"])
    assert r.exit_code == 2 and "not found" in r.output


def test_traces_as_arguments(trace, tmp_path):
    flags = ["--batch", "32", "--updates", "5", "--json"]
    assert _ok(["run", str(trace), *flags]) == _ok(["run", "--trace", str(trace), *flags])
    other = synthetic_trace(tmp_path / "p64.parquet", SynthSpec(prompts=64, group=4, steps=5, seed=1))
    d = json.loads(_ok(["run", str(other), "--trace", str(trace), *flags]))  # the arguments first: the reference
    assert d["reference"]["prompts"] == 64
    d = json.loads(_ok(["run", "--trace", str(trace), str(other), *flags]))
    assert d["reference"]["prompts"] == 64
    _ok(["sweep", str(trace), "--batch", "16,32", "--updates", "5", "--workers", "1", "--no-charts", "--out",
         str(tmp_path / "s")])
    assert (tmp_path / "s" / "results.csv").exists()
    r = runner.invoke(app, ["run", "--batch", "32"])
    assert r.exit_code == 2 and r.output.strip() == ("error: give a trace with --trace or as an argument "
                                                     "(e.g. --trace traces/grpo_p128.parquet)")


@pytest.mark.parametrize("name", ["train.log", "metrics.jsonl", "wandb_history.csv", "trainer_state.json"])
def test_a_framework_log_is_pointed_to_rlsim_import(tmp_path, name):
    log = tmp_path / name
    log.write_text("step:1 - actor/pg_loss:0.1 - timing_s/step:12.5\n")
    for args in (["run", "--trace", str(log), "--batch", "64"], ["run", str(log)], ["replay", str(log)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "Traceback" not in r.output
        assert r.output.strip() == (f"error: {log} is a training log, not an rlsim trace: import it first with "
                                    f"`rlsim import verl|openrlhf|trl {log} -o out.parquet` (docs/importing.md), "
                                    "then pass out.parquet")


def test_prompts_is_batch(trace, tmp_path):
    """`--batch`, `-P` and `-b` are `--prompts` (P, as rlrun spells it), in run and in sweep; messages say --prompts,
    whichever spelling was typed."""
    flags = ["--updates", "5", "--json"]
    same = _ok(["run", str(trace), "--prompts", "32", *flags])
    assert _ok(["run", str(trace), "--batch", "32", *flags]) == same == _ok(["run", str(trace), "-b", "32", *flags])
    assert _ok(["run", str(trace), "-P", "32", "-G", "4", *flags]) == same
    assert _ok(["run", str(trace), "-g", "4", "-P", "32", *flags]) == same
    _ok(["sweep", str(trace), "--prompts", "16,32", "--updates", "5", "--workers", "1", "--no-charts", "--out",
         str(tmp_path / "s")])
    assert (tmp_path / "s" / "results.csv").exists()
    r = runner.invoke(app, ["run", str(trace), "--prompts", "0"])
    assert r.exit_code == 2 and r.output.strip() == "error: --prompts must be a positive integer, got 0"
    r = runner.invoke(app, ["run", str(trace), "--prompts", "x"])
    assert r.exit_code == 2 and r.output.strip() == "error: --prompts/--batch: 'x' is not a valid value (expected int)"
    r = runner.invoke(app, ["run", str(trace), "--batch", "0"])
    assert r.exit_code == 2 and r.output.strip() == "error: --prompts must be a positive integer, got 0"


def test_run_keeps_a_command_on_one_line():
    # piped output is 80 columns to rich: the probe command an undecided verdict names must not be broken
    trace = Path(__file__).resolve().parents[2] / "traces" / "grpo_p128.parquet"
    r = runner.invoke(app, ["run", "--trace", str(trace), "--batch", "256"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "rlrun probe" in x)
    assert "rlrun probe --algo grpo --prompts 128,256 --group 8 --task add2)" in line, r.output
