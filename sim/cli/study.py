"""`rlsim sweep`, `rlsim report` and `rlsim export perfetto`: parse options (rlsim.cli.options), call one
library function (rlsim.sweeps.study, rlsim.present.report, rlsim.present.perfetto), print."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from rlsim.present import perfetto as pf
from rlsim.core.config import WhatIf
from rlsim.core.grid import build_grid
from rlsim.cli.opts import App, default_text
from rlsim.cli.options import StudyOptions, command, console, labels, read_calibrations, read_traces
from rlsim.replay.errors import RlsimError
from rlsim.present.report import build_report
from rlsim.sweeps.study import export_simulated, sweep_study
from rlsim.present.tables import config_warning_items, describe, own, plan_lines, ranking_table, sweep_verdict, varying

MAX_NOTES = 8  # notes printed under a sweep's verdict; the rest are in results.csv and the report
# updates in a simulated timeline export unless --updates is given (a timeline, not a throughput estimate)
EXPORT_UPDATES = 5


def print_verdict(console: Any, rows: list, meta: dict, axes: list, names: dict) -> None:
    """The sweep's verdict as the report's headline gives it (rlsim.present.tables.sweep_verdict): best, tied or
    undecided, with intervals; then the warnings, then the notes (dim)."""
    swept = varying(rows, axes)
    v = sweep_verdict(rows, meta, describe_row=lambda r: describe(r, swept, names))
    style = "bold green" if v["kind"] == "clear" else "bold yellow"
    console.print(Text.assemble((v["title"], style), f": {v['text']}"))
    for line in plan_lines(meta):
        console.print(line)
    for w in v["warnings"]:
        console.print(Text.assemble(("warning: ", "yellow"), w))
    for configs, w in config_warning_items(v):  # each config named once, a warning shared by several said once
        console.print(Text.assemble(("warning", "yellow"), f" ({configs}): ", w))
    if any(own(r, "warnings", meta) for r in rows if r is not v["best"] and all(r is not t for t in v["tied"])):
        console.print(Text("other configs have warnings of their own (! after the rank; column `warnings` of "
                           "results.csv)",
                           style="yellow"))
    for n in v["notes"][:MAX_NOTES]:
        console.print(Text(f"note: {n}", style="dim"))
    if len(v["notes"]) > MAX_NOTES:
        console.print(Text(f"note: {len(v['notes']) - MAX_NOTES} more notes on how the numbers were made: column "
                           "`notes` of results.csv, or `rlsim report`", style="dim"))


def _print_sweep(res: Any, axes: list, names: dict, top: int) -> None:
    """The mode line (where the trace's recorded mode was asked), the ranking, the verdict and where it was written."""
    con = console()
    for line in res.meta.get("mode_from_trace", ()):
        con.print(line, markup=False)
    con.print(ranking_table(res.rows, axes, top=top, labels=names, meta=res.meta, width=con.width))
    print_verdict(con, res.rows, res.meta, axes, names)
    con.print(f"{len(res.rows)} configs in {res.seconds:.1f} s ({res.meta['backend']['kind']})")
    p = res.paths
    con.print(f"results: {p['parquet']}, {p['csv']}, {p['json']}"
              + (f", charts in {p['charts']}" if "charts" in p else ""))


def register(app: typer.Typer) -> None:
    @command(app, "sweep", whatif="grid",
             help="Evaluate the cartesian grid of comma-listed run options and rank it by time-to-target.")
    def sweep(axes: dict, so: StudyOptions,
              out: Optional[Path] = typer.Option(None, "--out", "-o",
                                                 help="Output folder (must not exist unless --overwrite)."),
              workers: Optional[int] = typer.Option(None, "--workers", "-j",
                                                    help=default_text("Local worker processes.", "all cores")),
              ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Run as Ray tasks on this cluster "
                                                                                    "(`auto`, `ray://host:10001`, "
                                                                                    "`local`). Needs the ray extra."),
              chunk_size: Optional[int] = typer.Option(
                  None, "--chunk-size", help=default_text("Configs per task.", "about 8 tasks per worker")),
              top: int = typer.Option(10, "--top", help="Rows of the ranking shown in the terminal."),
              no_charts: bool = typer.Option(False, "--no-charts", help="Skip the HTML/PNG charts."),
              overwrite: bool = typer.Option(False, "--overwrite",
                                             help="Replace the results in an existing output folder.")) -> None:
        if out is None:
            raise RlsimError("give the output folder with --out (e.g. --out results/grpo_sweep)")
        if not so.trace:
            raise RlsimError("give a trace with --trace (e.g. --trace traces/grpo_p128.parquet)")
        if not axes:
            raise RlsimError("nothing to sweep: give at least one option as a comma list, e.g. --prompts 64,128,256")
        names = labels()
        n = len(build_grid(WhatIf, axes, labels=names))  # validates every config before anything is printed
        bar: list = []  # the progress bar starts with the first finished chunk, after fitting and checks

        def advance(k: int) -> None:
            if not bar:
                # no auto-refresh thread: the local pool forks its workers while the bar is shown
                bar.append(Progress(TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(),
                                    TimeRemainingColumn(), console=Console(stderr=True), auto_refresh=False))
                bar[0].start()
                bar.append(bar[0].add_task("configs", total=n))
            bar[0].advance(bar[1], k)
            bar[0].refresh()

        try:
            res = sweep_study(read_traces(so), axes, out=out, overwrite=overwrite, rho_model=so.rho_model,
                              target=so.target, workers=workers, ray_address=ray_address, chunk_size=chunk_size,
                              progress=advance, charts=not no_charts, labels=names, calibration=read_calibrations(so))
        finally:
            if bar:
                bar[0].stop()
        _print_sweep(res, list(axes), names, top)

    @command(app, "report", whatif=None,
             help="One self-contained HTML page: trace summary, fitted models, charts, the sweep's ranking.")
    def report(_: Any, so: StudyOptions,
               sweep_dir: Optional[Path] = typer.Option(None, "--sweep", help="Folder written by `rlsim sweep`."),
               out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write."),
               overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing report file.")) -> None:
        if out.exists() and not overwrite:
            raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
        path = build_report(read_traces(so), sweep_dir, out, rho_model=so.rho_model if so.rho else None,
                            target=so.target, calibration=read_calibrations(so))
        typer.echo(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")

    export = App(no_args_is_help=True, help="Export timelines.")
    app.add_typer(export, name="export")

    @command(export, "perfetto",
             help="Chrome trace JSON (Perfetto UI) of a recorded trace, or of a simulated run with --simulate.")
    def perfetto(fixed: dict, so: StudyOptions,
                 trace_arg: Optional[Path] = typer.Argument(None, metavar="TRACE", help="Recorded trace to export."),
                 out: Optional[Path] = typer.Option(None, "--out", "-o", help="Chrome trace JSON to write."),
                 simulate: bool = typer.Option(False, "--simulate",
                                               help="Export a simulated run of the given config instead."),
                 overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output file.")) -> None:
        if out is None:
            raise RlsimError("give the output file with -o (e.g. -o recorded.json)")
        if out.exists() and not overwrite:
            raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
        if not simulate:
            if trace_arg and so.trace:
                raise RlsimError("give the trace once (TRACE or --trace)")
            src = trace_arg or (so.trace[0] if so.trace else None)
            if src is None:
                raise RlsimError("give the trace to export: rlsim export perfetto TRACE -o recorded.json")
            if fixed:
                raise RlsimError("config options (" + ", ".join(labels()[f] for f in fixed) + ") need --simulate")
            counts = pf.export_recorded(src, out, overwrite=overwrite, drop_invalid=so.drop_invalid)
        else:
            traces = read_traces(StudyOptions(trace=((trace_arg,) if trace_arg else ()) + so.trace,
                                              drop_invalid=so.drop_invalid))
            if "updates" not in fixed:
                fixed["updates"] = EXPORT_UPDATES
                typer.echo(f"simulating {EXPORT_UPDATES} updates (pass --updates N for more)")
            counts = export_simulated(traces, fixed, out, rho_model=so.rho_model, overwrite=overwrite,
                                      calibration=read_calibrations(so))
        typer.echo(f"wrote {out}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                   + " slices (open in https://ui.perfetto.dev)")
