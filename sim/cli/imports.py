"""`rlsim import NAME`: turn a run another framework logged into a step-level trace.

Thin: one subcommand per importer in `rlsim.replay.importers.IMPORTERS`, its options the `ImportFlags` fields the
importer reads (made by `rlsim.cli.opts`, as every other option); it calls `import_log`, prints what was imported
and the next command; an RlsimError is one line and exit code 2. Formats and caveats: docs/importing.md.
"""
from __future__ import annotations

from pathlib import Path

import typer

from rlsim.cli.opts import App, generated, options, specs
from rlsim.replay.errors import cli_errors
from rlsim.replay.importers import IMPORTERS, ImportFlags, Importer, describe, import_log


def register(app: typer.Typer) -> None:
    imp = App(no_args_is_help=True, add_completion=False,
              help="Import a verl, OpenRLHF or TRL run's log as a step-level trace for `rlsim run --trace`.")
    app.add_typer(imp, name="import")
    for importer in IMPORTERS.values():
        _command(imp, importer)


def _command(imp: App, importer: Importer) -> None:
    flags = options(specs(ImportFlags, names=importer.flags, help=importer.flag_help), "if_")

    @generated(flags)
    def command(got: dict,
                log: Path = typer.Argument(..., help=importer.log_help),
                out: Path = typer.Option(..., "--out", "-o", help="the step-level trace to write (.parquet)"),
                overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out")) -> None:
        path = import_log(importer.name, log, out=out, overwrite=overwrite, **got)
        typer.echo(describe(path))

    command.__doc__ = importer.help
    imp.command(importer.name)(cli_errors(command))
