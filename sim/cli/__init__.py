"""`rlsim`: a thin typer CLI. Commands live in this package's modules; each parses options, builds a config,
calls one library function and turns RlsimError into exit code 2.

`main` registers only the module of the command it runs: importing every command's dependencies (the log
importers, the planner) would slow each command. `app`, the whole CLI, is built on first use (tests, docs)."""
from __future__ import annotations

import importlib
import sys

from rlsim.cli.opts import App

# command -> the module that registers it
COMMANDS = {"run": "run", "replay": "run", "rank": "run", "sweep": "study", "report": "study", "export": "study",
            "import": "imports", "plan": "plan"}


def build(command: str | None = None) -> App:
    """The CLI with every command, or only with the module that registers `command` (when it names one)."""
    cli = App(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
              help="Fit recorded RL runs and predict time-to-target for untried configurations.")
    cli.callback()(_group)  # a group even with one command registered (typer would run that command bare)
    modules = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in modules:
        importlib.import_module(f"rlsim.cli.{name}").register(cli)
    return cli


def _group() -> None:
    pass


def __getattr__(name: str) -> App:
    if name == "app":
        globals()["app"] = built = build()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    build(command)()
