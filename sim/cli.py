"""`rlsim`: a thin typer CLI. Commands live in sim/commands_*.py; each parses options, builds a config,
calls one library function and turns RlsimError into exit code 2."""
from rlsim.cliopts import App

app = App(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Fit recorded RL runs and predict time-to-target for untried configurations.")

from rlsim import commands_import, commands_plan, commands_run, commands_study  # noqa: E402  (they register on `app`)

commands_run.register(app)
commands_study.register(app)
commands_import.register(app)
commands_plan.register(app)


def main() -> None:
    app()
