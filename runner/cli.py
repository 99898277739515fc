"""`rlrun`: record real RL runs as rlsim traces, probe throughput at several sizes, and summarise a trace.

Thin: parse -> RunConfig (ProbeConfig) -> one library call. The options of `record`, `calibrate` and `probe`
are RunConfig's fields (runner/config.py states each default, help text and flag once), and `probe`'s own
ProbeConfig's, made by `rlsim.cli.opts`, the mechanism `rlsim` uses. torch and vLLM are imported only when a run
starts, so `--help` and bad-input errors are fast, and `inspect` works in the base install. Every RlsimError, a bad
number or a missing engine extra included, is one line and exit code 2.
"""
from __future__ import annotations

import importlib.util
from dataclasses import fields, replace
from typing import Any, Callable

import typer

from rlsim.cli.opts import App, Group, generated, options, param, placeholder, specs, values
from rlsim.core.grid import parse_value
from rlsim.replay.errors import RlsimError, cli_errors
from rlsim.runner.config import ProbeConfig, RunConfig, field_help

app = App(add_completion=False, no_args_is_help=True,
                  help="Record real GRPO/PPO runs (vLLM generates, torch trains) as rlsim traces.")
ENGINE = ("torch", "vllm", "transformers")  # what `record` and `calibrate` import: the cpu or gpu extra


def _engine_installed() -> None:
    missing = [m for m in ENGINE if importlib.util.find_spec(m) is None]
    if missing:
        raise RlsimError(f"rlrun needs torch and vLLM ({', '.join(missing)} not installed): "
                         'pip install torch==2.13.0 && pip install -e ".[cpu]" (CPU) or pip install -e ".[gpu]" (CUDA)')


def _interruptible(fn: Callable[[], Any], interrupted: str) -> None:
    try:
        fn()
    except KeyboardInterrupt:  # before the trace was opened (model build, engine start)
        typer.echo(interrupted, err=True)
        raise typer.Exit(130) from None


def _run(cfg: RunConfig, interrupted: str, **kw) -> None:
    """Record after checking the engine is installed (bad input was reported first, whatever is installed)."""
    _engine_installed()
    from rlsim.runner.loop import record as run_record

    _interruptible(lambda: run_record(cfg, **kw), interrupted)


def _probe(pc: ProbeConfig, interrupted: str) -> None:
    """Probe after checking the engine is installed, as `_run`."""
    _engine_installed()
    from rlsim.runner.probe import probe as run_probe

    _interruptible(lambda: run_probe(pc), interrupted)


def _options(command: str, **help: str) -> Group:
    """`rlrun COMMAND`'s options: the RunConfig fields whose metadata names the command, with their defaults and
    help (`help` overrides a field's text here), the required ones (--out) first. The command gets a dict."""
    names = [f.name for f in fields(RunConfig) if command in f.metadata["cli"]]
    return options(sorted(specs(RunConfig, names=names, help=help), key=lambda s: not s.required), "rc_", defaults=True)


@app.command()
@cli_errors
@generated(_options("record"))
def record(given: dict[str, Any]) -> None:
    """Run GRPO or PPO for --steps updates and record every event to a Parquet trace."""
    _run(RunConfig(**given).validate(), "interrupted before recording started; no trace written")


@app.command("calibrate")
@cli_errors
@generated(_options("calibrate", out="output calibration trace (.parquet)",
                    prompts=field_help()["prompts"] + "; the ladders are sized from P x G"))
def calibrate_cmd(given: dict[str, Any]) -> None:
    """Profile engine steps and training passes alone (what `record` does before its first update) and write
    a trace with only the calibration rows; `rlsim run --trace OLD --calibration FILE` uses it."""
    cfg = RunConfig(**given, steps=1, calibrate=True, progress=False).validate()
    _run(cfg, "interrupted; no calibration written", only_calibration=True)


def _probe_options() -> Group:
    """ProbeConfig's options; --prompts is text here, a comma list of sizes that `_sizes` parses."""
    names = [f.name for f in fields(ProbeConfig) if "probe" in f.metadata["cli"]]
    group = [replace(s, type=str) if s.field == "prompts" else s for s in specs(ProbeConfig, names=names)]
    sizes = placeholder(int, as_list=True)  # parsed by `_sizes`, a comma list of ints
    return Group([param(s, "pc_", defaults=True, metavar=sizes if s.field == "prompts" else None) for s in group],
                 lambda kw: values(group, kw, "pc_"))


def _sizes(text: str) -> tuple[int, ...]:
    """`16,64,256` -> (16, 64, 256), as typed: ProbeConfig.validate refuses a size given twice."""
    return tuple(parse_value(part, int, "--prompts") for part in text.split(","))


@app.command()
@cli_errors
@generated(_probe_options(), _options("probe", out="output probe trace (.parquet)"))
def probe(own: dict[str, Any], given: dict[str, Any]) -> None:
    """Run full RL steps at several sizes (P x G responses each) in one process, each round in a shuffled order,
    and record them: each size's responses/s paired with the smallest's in the same round, a ground truth of
    sigma free of the drift between recordings. `rlrun inspect` prints it."""
    pc = ProbeConfig(prompts=_sizes(own.pop("prompts")), run=RunConfig(**given), **own).validate()
    _probe(pc, "interrupted before probing started; no trace written")


@app.command()
@cli_errors
def inspect(trace: str = typer.Argument(..., metavar="TRACE",
                                        help="trace file (.parquet, or a .partial.arrow left by a killed run)")):
    """Print a human summary of a trace: config, hardware, events, step-time split, throughput, evals."""
    from rlsim.runner.summary import summarize

    typer.echo(summarize(trace))


def main() -> None:
    try:
        app()
    except RlsimError as e:  # pragma: no cover - commands wrap their own
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
