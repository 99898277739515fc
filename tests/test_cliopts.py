"""rlsim.cli.opts: the one mechanism both CLIs make their options with (dataclass field -> typer option)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from rlsim.cli import opts as cliopts
from rlsim.replay.errors import RlsimError, cli_errors


def _f(default, help, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Toy:
    size: int = _f(8, "how many", flags=["--size", "-n"])
    rate: float = _f(0.5, "how fast")
    name: str = _f("a b", "what to call it")
    limit: Optional[int] = _f(None, "cap (none: no cap)")
    fast: bool = _f(True, "go fast")
    force: bool = _f(False, "replace", flags=["--force"])
    files: tuple[Path, ...] = _f((), "inputs", flags=["--file"])
    out: str = _f("x.txt", "where", required=True)


def test_specs_take_flags_help_and_defaults_from_the_fields():
    s = {x.field: x for x in cliopts.specs(Toy)}
    assert s["size"].flags == ("--size", "-n") and s["size"].label == "--size" and s["size"].default == 8
    assert s["rate"].flags == ("--rate",) and s["rate"].help == "how fast" and s["rate"].base is float
    assert s["limit"].base is int and s["limit"].default is None
    assert s["fast"].pair and not s["force"].pair  # a bool is --x/--no-x unless its flags are named
    assert s["files"].repeated and s["out"].required and not s["size"].required
    only = cliopts.specs(Toy, names=("rate", "size"), spelling={"size": ["--count"]}, help={"rate": "other"})
    assert ([(x.field, x.flags, x.help) for x in only]
            == [("size", ("--count",), "how many"), ("rate", ("--rate",), "other")])


def test_values_parse_text_with_the_field_type():
    s = {x.field: x for x in cliopts.specs(Toy)}
    assert cliopts.value(s["size"], "16") == 16 and cliopts.value(s["size"], "1e2") == 100
    assert cliopts.value(s["rate"], "3e-4") == 3e-4
    assert cliopts.value(s["limit"], "none") is None and cliopts.value(s["limit"], "4") == 4
    assert cliopts.value(s["name"], " a,b ") == " a,b "  # names and paths as typed
    assert cliopts.value(s["size"], "4,8", as_list=True) == [4, 8]
    assert cliopts.value(s["files"], [Path("a")]) == (Path("a"),) and cliopts.value(s["fast"], False) is False
    for raw, msg in (("x", "--size: 'x' is not a valid value (expected int)"),
                     ("1.5", "--size: '1.5' is not a valid value (expected an integer)"),
                     ("", "--size is empty; give a value")):
        with pytest.raises(RlsimError) as e:
            cliopts.value(s["size"], raw)
        assert str(e.value) == msg
    with pytest.raises(RlsimError, match="NaN is not a value"):
        cliopts.value(s["rate"], "nan")


def _app(**style):
    app = typer.Typer()
    seen = {}

    @app.command()
    @cli_errors
    @cliopts.generated(cliopts.options(cliopts.specs(Toy), "t_", **style))
    def go(given: dict, verbose: bool = typer.Option(False, "--verbose", help="own option")) -> None:
        seen.update(given, verbose=verbose)

    @app.command()
    def other() -> None:  # two commands, so `go` is a subcommand
        pass

    return app, seen


def test_generated_command_with_defaults():
    app, seen = _app(defaults=True)
    r = CliRunner().invoke(app, ["go", "--out", "o.txt"])
    assert r.exit_code == 0, r.output
    assert Toy(**{k: v for k, v in seen.items() if k != "verbose"}) == Toy(out="o.txt")  # the defaults are the fields'
    seen.clear()
    r = CliRunner().invoke(app, ["go", "--out", "o", "-n", "3", "--rate", "2", "--no-fast", "--force", "--file", "a",
                                 "--file", "b", "--limit", "7", "--verbose"])
    assert r.exit_code == 0, r.output
    assert seen == {"size": 3, "rate": 2.0, "name": "a b", "limit": 7, "fast": False, "force": True,
                    "files": (Path("a"), Path("b")), "out": "o", "verbose": True}
    help_text = CliRunner().invoke(app, ["go", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: 8]" in help_text and "--no-fast" in help_text and "--no-force" not in help_text
    assert "own option" in help_text and "[required]" in help_text


def test_generated_command_given_only_and_bad_input():
    app, seen = _app()
    r = CliRunner().invoke(app, ["go", "--out", "o"])
    assert r.exit_code == 0 and seen == {"force": False, "files": (), "out": "o", "verbose": False}  # not given: absent
    for args, msg in ((["-n", "x"], "error: --size: 'x' is not a valid value (expected int)"),
                      (["--rate", "fast"], "error: --rate: 'fast' is not a valid value (expected float)")):
        r = CliRunner().invoke(app, ["go", "--out", "o", *args])
        assert r.exit_code == 2 and r.output.strip() == msg and "Traceback" not in r.output


@pytest.mark.parametrize("argv, says", [
    (["rlsim", "run", "--trace", "t.parquet", "--bogus"], "error: No such option: --bogus"),
    (["rlsim", "import", "verl", "train.log"], "error: Missing option '--out' / '-o' (see `rlsim import verl --help`)"),
    (["rlrun", "inspect"], "error: Missing argument 'TRACE' (see `rlrun inspect --help`)"),
    (["rlrun", "record", "--prompts"], "error: Option '--prompts' requires an argument")])
def test_a_usage_error_is_one_line_and_exit_2_from_both_programs(argv, says, capsys):
    """Run as programs (the App called, as `main` does): click's usage errors read as every other bad input."""
    import rlsim.cli
    import rlsim.runner.cli

    cli = rlsim.cli.build(argv[1]) if argv[0] == "rlsim" else rlsim.runner.cli.app
    with pytest.raises(SystemExit) as e:
        cli(args=argv[1:], prog_name=argv[0])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(says) and err.count("\n") == 1, err


def test_help_and_success_keep_their_exit_codes(capsys):
    import rlsim.runner.cli

    for args in (["--help"], ["inspect", "--help"]):
        with pytest.raises(SystemExit) as e:
            rlsim.runner.cli.app(args=args, prog_name="rlrun")
        assert e.value.code == 0 and "Usage" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        rlsim.runner.cli.app(args=[], prog_name="rlrun")  # no command: the help, as typer prints it
    assert e.value.code == 2 and "inspect" in capsys.readouterr().out


def test_generated_command_with_lists():
    app, seen = _app(as_list=True)
    r = CliRunner().invoke(app, ["go", "--out", "o", "-n", "4,8,4", "--fast", "true,false", "--limit", "none,2"])
    assert r.exit_code == 0, r.output
    assert (seen["size"], seen["fast"], seen["limit"]) == ([4, 8], [True, False], [None, 2])
    r = CliRunner().invoke(app, ["go", "--out", "o", "-n", "4,,8"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --size: empty element in the list")


def test_help_states_placeholders_and_defaults_one_way():
    s = {x.field: x for x in cliopts.specs(Toy)}
    assert [cliopts.placeholder(s[k].type) for k in ("size", "rate", "name", "limit", "fast")] == [
        "<int>", "<float>", "<str>", "<int>", None]
    assert cliopts.placeholder(s["size"].type, as_list=True) == "<int,...>"
    assert cliopts.placeholder(Path) == "<path>"
    assert cliopts.split_default("P: prompts (None: the trace's).") == ("P: prompts.", "the trace's")
    assert cliopts.split_default("model (None: a tiny one (cached))") == ("model", "a tiny one (cached)")
    assert cliopts.split_default("cap (none: no cap)") == ("cap (none: no cap)", None)
    app, _ = _app()  # given-only: typer shows no default, the help states the field's
    text = " ".join(CliRunner().invoke(app, ["go", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "how many [default: 8]" in text and "go fast [default: fast]" in text and "[default: False]" not in text


def _commands(group, path=()):
    """(argv path, click command) of every command and subcommand under a click group."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


@pytest.mark.parametrize("cli", ["rlsim", "rlrun"])
def test_every_command_of_both_clis_reads_alike(cli):
    """Every command of `rlsim` and `rlrun`: placeholders are types (`<int>`, `<int,...>`, `<path>`; never VALUE),
    usage lines name arguments TRACE / [TRACE] / [TRACE]... (no `{trace}`, no `[[TRACE]]`), defaults read
    `[default: X]` only."""
    import re

    if cli == "rlsim":
        from rlsim.cli import app
    else:
        from rlsim.runner.cli import app
    group = typer.main.get_command(app)
    cmds = list(_commands(group))
    assert len(cmds) >= (10 if cli == "rlsim" else 4)
    for path, cmd in cmds:
        ctx = cmd.make_context(" ".join((cli,) + path), ["--help"], resilient_parsing=True)
        usage = cmd.get_usage(ctx)
        assert "{" not in usage and "[[" not in usage, usage
        for p in cmd.params:
            if isinstance(p, typer.core.TyperArgument):
                piece = p.metavar if p.required else f"[{p.metavar}]"
                assert p.metavar.isupper() and piece in usage, (path, usage)
            elif p.metavar is not None:
                assert re.fullmatch(r"<[a-z|]+(,\.\.\.)?>", p.metavar), (path, p.name, p.metavar)
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"}).output
        assert "VALUE" not in out and "V1,V2" not in out, path
        assert not re.search(r"\(default|(?<!\[)default:|default \d", out), (path, out)
        if path == ("plan",):
            trace = " ".join(out[out.index("--trace"):out.index("--rho")].split())
            assert "pilot" in trace and "learning curves" not in trace


def test_both_clis_spell_the_shared_options_alike():
    """`rlsim run` and `rlrun record` name P, G, the split devices and the staleness limit with the same options and
    short flags, the first of each as --help shows it."""
    from rlsim.cli import app as rlsim_app
    from rlsim.runner.cli import app as rlrun_app

    def shown(app, name):
        cmd = typer.main.get_command(app).commands[name]
        return {p.name: (p.opts, p.secondary_opts) for p in cmd.params if not getattr(p, "hidden", False)}

    sim = {tuple(o): s for o, s in shown(rlsim_app, "run").values()}
    run = {tuple(o): s for o, s in shown(rlrun_app, "record").values()}
    for opts in (("--prompts", "--batch", "-P", "-b"), ("--group", "-G", "-g"), ("--gen-gpus",), ("--train-gpus",),
                 ("--staleness",)):
        assert opts in sim and opts in run, (opts, sorted(sim), sorted(run))
