"""The notebook API returns what the CLI prints, as DataFrames, and raises the CLI's errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlsim
from rlsim.cli import app

TRACE = Path(__file__).resolve().parents[1] / "traces" / "grpo_p32.parquet"


def test_api_tables_equal_the_cli():
    tr = rlsim.load_trace(TRACE)
    ev = rlsim.events(tr)
    assert len(ev) == tr.table.num_rows and set(ev["kind"]) == {"gen_step", "response", "update", "sync", "eval",
                                                                 "calib_gen", "calib_train", "drift_gen", "drift_train"}
    st = rlsim.steps(tr)
    assert len(st) == tr.count("update") and (st["step_time"] >= st["gen_time"]).all()
    pred = rlsim.predict(rlsim.fit([tr]), prompts=64, updates=5)
    cli = json.loads(CliRunner().invoke(app, ["run", "-t", str(TRACE), "--batch", "64", "--updates", "5",
                                              "--json"]).output)
    assert pred.loc["candidate", "responses_per_s"] == cli["responses_per_s"]
    assert pred.loc["reference", "responses_per_s"] == cli["reference"]["responses_per_s"]
    swept = rlsim.sweep([tr], {"prompts": [16, 64], "updates": [5]})
    assert list(swept.index) == [1, 2]
    assert swept[swept["prompts"] == 64]["time_to_target_ratio"].item() == cli["time_to_target_ratio"]
    assert len(rlsim.check_fidelity(tr)) == tr.count("update")  # the engine was warmed up before recording: all kept


def test_api_raises_the_cli_errors(tmp_path):
    with pytest.raises(rlsim.RlsimError, match="trace not found"):
        rlsim.load_trace(tmp_path / "missing.parquet")
    with pytest.raises(rlsim.RlsimError, match="^prompts must be a positive integer, got -1$"):
        rlsim.predict([TRACE], prompts=-1)


@pytest.mark.parametrize("call, message", [
    (lambda: rlsim.predict(TRACE, batchsize=64),
     r"^predict: unknown keyword 'batchsize' \(did you mean batch\?\); the keywords are "
     r"rlsim.core.config.WhatIf's fields: prompts, group, lr_rule, "),
    (lambda: rlsim.predict(TRACE, batch=64, prompts=64), "give prompts or batch, not both"),
    (lambda: rlsim.predict(TRACE, batch=0), "^prompts must be a positive integer, got 0$"),
    (lambda: rlsim.predict(TRACE, staleness=2), r"^staleness=2 needs split devices: add gen_gpus=N, train_gpus=M \("),
    (lambda: rlsim.predict(TRACE, gen_gpus=2), "^gen_gpus needs train_gpus too"),
    (lambda: rlsim.sweep(TRACE, {"batch": [16, 0]}), r"^config \[prompts 0\] is invalid: prompts must be a positive"),
    (lambda: rlsim.sweep(TRACE, {"batchsize": [16]}), "^sweep: unknown keyword 'batchsize'"),
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, updates=5),
     r"^sweep: updates is a config field: put it in the axes"),
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, workerz=2),
     r"^sweep: unknown keyword 'workerz' \(did you mean workers\?\); the keywords are traces, axes, out, workers"),
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, rhoo="curves"),
     r"^sweep: unknown keyword 'rhoo' \(did you mean rho\?\)"),
    (lambda: rlsim.fit([TRACE], rhoo="magic"),
     r"^fit: unknown keyword 'rhoo' \(did you mean rho\?\); the keywords are traces, rho, bend_batch, kappa, target, "
     r"calibration, drop_invalid$"),
    (lambda: rlsim.fit(TRACE, bend_batch=3000), r"^bend_batch and kappa set the lr-aware rho model: add rho=lr-aware$"),
    (lambda: rlsim.fit(TRACE, rho="lr-aware", kappa=0.5), r"^give both bend_batch and kappa \(or neither"),
    (lambda: rlsim.fit(TRACE, rho="lr-aware", bend_batch=3000, kappa=1.5),
     r"^lr-aware constants out of range: bend_batch must be > 0 responses \(got 3000\) and kappa in \[0, 1\)"),
    (lambda: rlsim.fit(TRACE, rho="lr-aware"), r"^rho=lr-aware needs its two constants: .* give bend_batch and kappa"),
    (lambda: rlsim.fit(TRACE, kappa="0.5"), r"^fit: kappa must be None or a number in \[0, 1\)"),
    (lambda: rlsim.fit([TRACE], rho="magic"),
     "^rho must be one of invariant, noise-scale, curves, lr-aware, auto, got 'magic'$"),
    (lambda: rlsim.fit([TRACE], rho="noise_scale"), r"got 'noise_scale' \(did you mean noise-scale\?\)$"),
    (lambda: rlsim.fit(TRACE, rho="curves"),
     r"^rho=curves needs two or more traces .* with traces=\[\.\.\.\]\)$"),
    (lambda: rlsim.fit(TRACE, rho="curves", rho_model="curves"),
     r"^fit: give rho, not both rho and rho_model \(its deprecated spelling\)$"),
    (lambda: rlsim.fit(TRACE, target=float("nan")), "^target must be a finite eval score, got nan$"),
    (lambda: rlsim.load_trace(42), r"^load_trace: path must be a path \(str or pathlib.Path\), got int 42$"),
    (lambda: rlsim.predict_sizes(TRACE, group=4), r"^predict_sizes: give the sizes to predict, e.g. prompts=\[256"),
    (lambda: rlsim.fit([]), "^fit: give at least one trace"),
])
def test_api_errors_are_one_line_in_keywords(call, message):
    with pytest.raises(rlsim.RlsimError, match=message) as e:
        call()
    assert "\n" not in str(e.value) and "--" not in str(e.value)


def test_cli_keeps_its_option_names(tmp_path):
    r = CliRunner().invoke(app, ["run", str(TRACE), "--batch", "0"])
    assert r.exit_code == 2 and r.output.strip() == "error: --prompts must be a positive integer, got 0"
    r = CliRunner().invoke(app, ["run", str(TRACE), "--staleness", "2"])
    assert "error: --staleness 2 needs split devices: add --gen-gpus N --train-gpus M" in r.output
    from rlsim.core.config import name
    from rlsim.cli.options import labels, study_specs

    assert labels() == {f: name(f) for f in labels()}  # messages and options spell each field alike
    assert {s.field: s.label for s in study_specs()} == {s.field: name(s.field) for s in study_specs()}


# command -> the API functions that together take its options (`run` is fit, then predict); `rlsim replay` is
# check_fidelity; load_trace's drop_invalid is every command's --drop-invalid
API_COMMANDS = {"run": ("fit", "predict"), "sweep": ("sweep",), "replay": ("check_fidelity",)}
# API keywords with no option: the traces (arguments or --trace), sweep's grid (the options themselves), its progress
# callback, split_stats' skip, example_trace's name
NO_OPTION = {"path", "trace", "traces", "study_or_traces", "axes", "progress", "skip", "name"}
# options with no keyword, each with its reason: what they change is how the answer is shown, not the answer
CLI_ONLY = {"--json": "the API returns the result as data, not text",
            "--help": "the docstrings",
            "--top": "rows of the ranking printed; the API returns every row",
            "--no-charts": "the API writes no charts",
            "--per-update": "check_fidelity returns every update",
            "--trace": "the traces are the first argument"}


def _keywords(fname: str) -> set[str]:
    """A function's keywords as options (--name-with-dashes); predict's and sweep's axes are WhatIf's fields, as
    `rlsim run` and `rlsim sweep` take them."""
    import dataclasses
    import inspect

    from rlsim.core.config import WhatIf

    params = set(inspect.signature(getattr(rlsim, fname)).parameters)
    config = {f.name for f in dataclasses.fields(WhatIf)} if {"config", "axes"} & params else set()
    return {"--" + k.replace("_", "-") for k in (params - NO_OPTION - {"config"}) | config}


def test_api_keywords_are_the_cli_option_names():
    """Each command's options are the keywords of its API functions, spelt alike (rho= is --rho, sampled= is
    --sampled, bend_batch= is --bend-batch), but the ones in CLI_ONLY, which only change how the answer is shown;
    and every keyword of those functions is an option of the command."""
    import typer

    from rlsim.api import DEPRECATED

    commands = typer.main.get_command(app).commands
    for cmd, fnames in API_COMMANDS.items():
        opts = {p.opts[0] for p in commands[cmd].params if p.opts[0].startswith("--")} | {"--help"}
        keywords = set().union(*map(_keywords, fnames))
        assert opts - keywords - set(CLI_ONLY) == set(), (cmd, "options without a keyword")
        assert keywords - opts == set(), (cmd, "keywords without an option")
        assert not {k[2:].replace("-", "_") for k in keywords} & set(DEPRECATED), cmd
    assert _keywords("load_trace") == {"--drop-invalid"}


P128 = TRACE.parent / "grpo_p128.parquet"
SHOWN = ("responses_per_s", "sigma", "rho", "rho_lo", "rho_hi", "time_to_target_ratio", "time_to_target_s", "rho_model")


def _cli_json(*args: str) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _nan_step(tmp_path) -> Path:
    """grpo_p128 with one engine step's duration NaN: refused unless invalid rows are dropped."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(P128)
    dur = t["duration"].to_numpy(zero_copy_only=False).astype(float)
    dur[np.nonzero(t["kind"].to_numpy(zero_copy_only=False) == "gen_step")[0][5]] = np.nan
    pq.write_table(t.set_column(t.schema.get_field_index("duration"), "duration", pa.array(dur)),
                   tmp_path / "bad.parquet")
    return tmp_path / "bad.parquet"


def test_lr_aware_constants_as_the_cli_takes_them():
    """fit(rho="lr-aware", bend_batch=, kappa=) then predict is `rlsim run --rho lr-aware --bend-batch --kappa`;
    sweep takes them alike."""
    cli = _cli_json("run", "-t", str(P128), "--batch", "256", "--updates", "5", "--rho", "lr-aware",
                    "--bend-batch", "3000", "--kappa", "0.5")
    study = rlsim.fit(P128, rho="lr-aware", bend_batch=3000, kappa=0.5)
    got = rlsim.predict(study, prompts=256, updates=5).loc["candidate"]
    assert {k: got[k] for k in SHOWN} == {k: cli[k] for k in SHOWN}
    assert cli["rho_model"] == "lr-aware" and any("B_bend = 3000, kappa = 0.5 as given" in n for n in cli["notes"])
    other = rlsim.predict(rlsim.fit(P128, rho="lr-aware", bend_batch=3000, kappa=0.2), prompts=256, updates=5)
    assert other.loc["candidate", "rho"] != got["rho"]  # kappa reaches the answer
    swept = rlsim.sweep(P128, {"prompts": [256], "updates": [5]}, rho="lr-aware", bend_batch=3000, kappa=0.5)
    assert swept.loc[1, "time_to_target_ratio"] == cli["time_to_target_ratio"]


def test_drop_invalid_as_the_cli_takes_it(tmp_path):
    """A trace with an invalid row: refused by fit and `rlsim run` alike, and with drop_invalid=True /
    --drop-invalid both give the same answer; check_fidelity(drop_invalid=True) is `rlsim replay --drop-invalid`."""
    bad = _nan_step(tmp_path)
    r = CliRunner().invoke(app, ["run", "-t", str(bad), "--batch", "256", "--updates", "5", "--json"])
    assert r.exit_code == 2 and "non-finite `duration`" in r.output
    msg = _refused(lambda: rlsim.fit(bad))
    assert "non-finite `duration`" in msg
    cli = _cli_json("run", "-t", str(bad), "--batch", "256", "--updates", "5", "--drop-invalid")
    got = rlsim.predict(rlsim.fit(bad, drop_invalid=True), prompts=256, updates=5).loc["candidate"]
    assert {k: got[k] for k in SHOWN} == {k: cli[k] for k in SHOWN}
    assert any("dropped" in w for w in got["warnings"].split("; "))
    swept = rlsim.sweep(bad, {"prompts": [256], "updates": [5]}, drop_invalid=True)
    assert swept.loc[1, "time_to_target_ratio"] == cli["time_to_target_ratio"]
    _refused(lambda: rlsim.check_fidelity(bad))
    replay = _cli_json("replay", str(bad), "--drop-invalid")
    fid = rlsim.check_fidelity(bad, drop_invalid=True)
    assert fid.reset_index().to_dict("records") == replay["per_update"] and len(fid) > 0


def test_deprecated_keywords_still_work_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"^fit: rho_model= is deprecated; use rho= \(the CLI's name\)$"):
        old = rlsim.predict(rlsim.fit(TRACE, rho_model="invariant"), prompts=64, updates=3)
    assert old.equals(rlsim.predict(rlsim.fit(TRACE, rho="invariant"), prompts=64, updates=3))
    assert old.loc["candidate", "rho"] == 1.0  # invariant: the old keyword chose the model
    with pytest.warns(DeprecationWarning, match="lengths= is deprecated; use sampled="):
        msg = _refused(lambda: rlsim.check_fidelity(TRACE, lengths="drawn"))
    assert msg.startswith("check_fidelity: sampled must be True or False"), msg


def _public_functions() -> dict:
    """Every public callable `dir(rlsim)` shows, but the error classes."""
    out = {n: getattr(rlsim, n) for n in dir(rlsim) if not n.startswith("_")}
    return {n: f for n, f in out.items() if callable(f) and not (isinstance(f, type) and issubclass(f, BaseException))}


VALID = {"path": TRACE, "trace": TRACE, "traces": [TRACE], "study_or_traces": TRACE, "axes": {"prompts": [16]},
         "name": "grpo_p32"}  # a valid value of each required parameter, so that one wrong argument is what is refused


def _refused(call) -> str:
    with pytest.raises(rlsim.RlsimError) as e:
        call()
    err = e.value
    assert "\n" not in str(err), str(err)
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), str(err)  # no chain
    return str(err)


def test_every_public_function_refuses_wrong_types_and_unknown_keywords():
    import inspect

    funcs = _public_functions()
    assert set(rlsim.__all__) - {"RlsimError", "TraceError"} <= set(funcs)
    wrong = object()
    for fname, fn in funcs.items():
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        required = {p.name: VALID[p.name] for p in params if p.default is p.empty}
        msg = _refused(lambda: fn(**required, tracez=1))
        assert "unknown keyword 'tracez'" in msg, fname
        close = [p.name for p in params if p.name in ("trace", "traces")]
        assert not close or f"(did you mean {close[0]}?)" in msg, msg
        if not params:
            _refused(lambda: fn(wrong))  # an argument it does not take
        for p in params:
            msg = _refused(lambda: fn(**{**required, p.name: wrong}))
            assert p.name in msg or fname == "predict_sizes", (fname, msg)  # predict_sizes: WhatIf's prompts check
            assert "--" not in msg, msg
    assert "chunk_size" in _refused(lambda: rlsim.sweep(TRACE, {"prompts": [16]}, chunk_size="2"))  # its options alike


def test_api_target_and_group_refusals_name_keywords():
    best = rlsim.fit(TRACE).target  # the default: the best the reference reached
    msg = _refused(lambda: rlsim.fit(TRACE, target=best + 0.5))
    assert msg.startswith(f"target={best + 0.5:g} is above the reference's best eval score {best:.4g}")
    assert "--" not in msg
    msg = _refused(lambda: rlsim.predict(rlsim.example_trace("ppo_b256"), group=8, updates=5))
    assert msg.startswith("PPO trains one response per prompt") and "group=8" in msg and "prompts=2048" in msg


def test_batch_is_prompts_and_predict_sizes_is_predict_per_size():
    study = rlsim.fit(TRACE)
    one = rlsim.predict(study, batch=64, updates=5)
    assert one.equals(rlsim.predict(study, prompts=64, updates=5))
    sizes = rlsim.predict_sizes(study, prompts=[16, 64, 64], updates=5)
    assert list(sizes.index) == ["reference", "prompts=16", "prompts=64"] and list(sizes.columns) == list(one.columns)
    assert sizes.loc[["reference", "prompts=64"]].reset_index(drop=True).equals(one.reset_index(drop=True))
    assert sizes.loc["prompts=16"].equals(
        rlsim.predict(study, prompts=16, updates=5).loc["candidate"].rename("prompts=16"))
    assert rlsim.predict_sizes(TRACE, batch=64, updates=5).loc["prompts=64"].equals(sizes.loc["prompts=64"])
    swept = rlsim.sweep(TRACE, {"batch": [16, 64], "updates": 5})
    assert sorted(swept["prompts"]) == [16, 64] and set(swept["updates"]) == {5}


def test_dir_shows_the_lazy_api():
    code = ("import sys, rlsim; names = dir(rlsim); "
            "assert set(rlsim.__all__) <= set(names) and {'predict', 'predict_sizes', 'example_trace'} <= set(names), "
            "names; assert 'rlsim.api' not in sys.modules and 'pandas' not in sys.modules; "
            "import rlsim.replay; assert 'rlsim.api' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_example_traces(monkeypatch, tmp_path):
    assert rlsim.example_trace("grpo_p32") == TRACE and rlsim.example_trace("grpo_p32.parquet") == TRACE
    names = rlsim.example_traces()
    assert {"grpo_p128", "grpo_p32", "ppo_b256", "study/grpo_p32_s0"} <= set(names)
    assert rlsim.load_trace(rlsim.example_trace("study/grpo_p32_s0")).config["prompts"] == 32
    with pytest.raises(rlsim.RlsimError, match=r"^no example trace 'grpo_p100' \(did you mean grpo_p128\?\); shipped: "
                                               r"grpo_addmix_p64, grpo_p128, "
                                               r".*rlsim.example_traces\(\) lists them all\)$"):
        rlsim.example_trace("grpo_p100")
    from rlsim import api

    monkeypatch.setattr(api, "__file__", str(tmp_path / "site-packages" / "rlsim" / "api.py"))  # a non-editable install
    with pytest.raises(rlsim.RlsimError, match=r"the example traces ship in the source checkout .* pip install -e \."):
        rlsim.example_trace("grpo_p32")
