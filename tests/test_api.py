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
    cli = json.loads(CliRunner().invoke(app, ["run", "-t", str(TRACE), "--batch", "64", "--updates", "5", "--json"]).output)
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
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, updates=5), r"^sweep: updates is a config field: put it in the axes"),
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, workerz=2),
     r"^sweep: unknown keyword 'workerz' \(did you mean workers\?\); the options are out, workers"),
    (lambda: rlsim.sweep(TRACE, {"prompts": [16]}, rhoo="curves"),
     r"^sweep: unknown keyword 'rhoo' \(did you mean rho\?\)"),
    (lambda: rlsim.fit([TRACE], rhoo="magic"),
     r"^fit: unknown keyword 'rhoo' \(did you mean rho\?\); the keywords are traces, rho, target, calibration$"),
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


# API keyword -> the CLI command that takes it as --keyword-name; keywords with no option: the traces (arguments or
# --trace), sweep's grid (the options themselves), its progress callback, split_stats' skip, example_trace's name
API_COMMANDS = {"load_trace": "run", "fit": "run", "sweep": "sweep", "check_fidelity": "replay"}
NO_OPTION = {"path", "trace", "traces", "study_or_traces", "axes", "progress", "skip", "name"}


def test_api_keywords_are_the_cli_option_names():
    """Every keyword of fit, sweep, check_fidelity and load_trace is an option of the command doing the same, spelt
    alike (rho= is --rho, sampled= is --sampled); predict's are WhatIf's fields, as `rlsim run` takes them."""
    import dataclasses
    import inspect

    import typer

    from rlsim.api import DEPRECATED
    from rlsim.core.config import WhatIf

    commands = typer.main.get_command(app).commands
    for fname, cmd in API_COMMANDS.items():
        opts = {o for p in commands[cmd].params for o in (*p.opts, *p.secondary_opts)}
        keywords = set(inspect.signature(getattr(rlsim, fname)).parameters) - NO_OPTION - {"options"}
        if fname == "sweep":
            keywords |= {"rho", "target", "overwrite", "ray_address", "chunk_size", "calibration"}
        assert keywords and {k for k in keywords if "--" + k.replace("_", "-") not in opts} == set(), (fname, opts)
        assert not keywords & set(DEPRECATED), fname
    run = {o for p in commands["run"].params for o in p.opts}
    assert {"--" + f.name.replace("_", "-") for f in dataclasses.fields(WhatIf)} <= run


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
    assert sizes.loc["prompts=16"].equals(rlsim.predict(study, prompts=16, updates=5).loc["candidate"].rename("prompts=16"))
    assert rlsim.predict_sizes(TRACE, batch=64, updates=5).loc["prompts=64"].equals(sizes.loc["prompts=64"])
    swept = rlsim.sweep(TRACE, {"batch": [16, 64], "updates": 5})
    assert sorted(swept["prompts"]) == [16, 64] and set(swept["updates"]) == {5}


def test_dir_shows_the_lazy_api():
    code = ("import sys, rlsim; names = dir(rlsim); "
            "assert set(rlsim.__all__) <= set(names) and {'predict', 'predict_sizes', 'example_trace'} <= set(names), names; "
            "assert 'rlsim.api' not in sys.modules and 'pandas' not in sys.modules; "
            "import rlsim.replay; assert 'rlsim.api' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_example_traces(monkeypatch, tmp_path):
    assert rlsim.example_trace("grpo_p32") == TRACE and rlsim.example_trace("grpo_p32.parquet") == TRACE
    names = rlsim.example_traces()
    assert {"grpo_p128", "grpo_p32", "ppo_b256", "study/grpo_p32_s0"} <= set(names)
    assert rlsim.load_trace(rlsim.example_trace("study/grpo_p32_s0")).config["prompts"] == 32
    with pytest.raises(rlsim.RlsimError, match=r"^no example trace 'grpo_p100' \(did you mean grpo_p128\?\); shipped: "
                                               r"grpo_addmix_p64, grpo_p128, .*rlsim.example_traces\(\) lists them all\)$"):
        rlsim.example_trace("grpo_p100")
    from rlsim import api

    monkeypatch.setattr(api, "__file__", str(tmp_path / "site-packages" / "rlsim" / "api.py"))  # a non-editable install
    with pytest.raises(rlsim.RlsimError, match=r"the example traces ship in the source checkout .* pip install -e \."):
        rlsim.example_trace("grpo_p32")
