"""`rlsim sweep`, `rlsim report` and `rlsim export perfetto`.

The sweep takes every option `rlsim run` takes, as a comma list: the options are built from the fields
of `sim.config.WhatIf` (one option per field, `prompts` spelt `--batch` as in `rlsim run`), so new
`run` options (device split, staleness) join the grid with no change here.
"""
from __future__ import annotations

import dataclasses
import inspect
import time
import typing
from pathlib import Path
from typing import Any, Optional

import typer

from rlsim.replay.errors import RlsimError, cli_errors

# WhatIf field -> the option `rlsim run` spells it with (others: --field-name-with-dashes)
OPTION_NAMES = {"prompts": "--batch"}
SHORT_NAMES = {"prompts": "-b", "group": "-g"}  # as `rlsim run` spells them
EXPORT_UPDATES = 5  # updates in a simulated timeline export unless --updates is given (a timeline, not a throughput estimate)
# WhatIf fields that are not per-config knobs (none today; kept for fields like free-form notes)
NOT_SWEPT: set[str] = set()


@dataclasses.dataclass(frozen=True)
class AxisSpec:
    field: str
    option: str
    type: Any
    default: Any
    help: str


def _whatif_cls():
    from rlsim.config import WhatIf

    return WhatIf


def _scalar(tp: Any) -> bool:
    from rlsim.sweep import _base_type

    base, _ = _base_type(tp)
    if typing.get_origin(base) is typing.Literal:
        return True
    import enum

    return base in (int, float, str, bool) or (isinstance(base, type) and issubclass(base, enum.Enum))


def axis_specs() -> list[AxisSpec]:
    """One spec per WhatIf field a sweep can vary."""
    cls = _whatif_cls()
    from rlsim.sweep import whatif_type_hints

    hints = whatif_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        if f.name in NOT_SWEPT or not f.init or not _scalar(hints.get(f.name, f.type)):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            default = dataclasses.MISSING
        option = OPTION_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        specs.append(AxisSpec(f.name, option, hints.get(f.name, f.type), default,
                              str(f.metadata.get("help", "")) if f.metadata else ""))
    return specs


def _with_signature(fn, params: list[inspect.Parameter]):
    """Give a **kwargs function an explicit signature typer can read."""
    fn.__signature__ = inspect.Signature(params)
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn


def _axis_params(specs: list[AxisSpec], *, as_list: bool) -> list[inspect.Parameter]:
    params = []
    for s in specs:
        dflt = "" if s.default in (dataclasses.MISSING, None) else f" (default: {s.default})"
        helptext = (s.help + "." if s.help else "") + (f" Comma list of values to sweep{dflt}." if as_list else dflt)
        names = [s.option] + ([SHORT_NAMES[s.field]] if s.field in SHORT_NAMES else [])
        params.append(inspect.Parameter(
            "ax_" + s.field, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
            default=typer.Option(None, *names, help=helptext, metavar="V1,V2,..." if as_list else "VALUE",
                                 rich_help_panel="Config" if not as_list else "Grid")))
    return params


def _collect_axes(specs: list[AxisSpec], kwargs: dict[str, Any], *, as_list: bool) -> tuple[dict, dict]:
    """(axes field -> values, fixed field -> value) from the parsed options."""
    from rlsim.sweep import parse_list

    axes, fixed = {}, {}
    for s in specs:
        raw = kwargs.get("ax_" + s.field)
        if raw is None:
            continue
        vals = parse_list(raw, s.type, s.option)
        if as_list:
            axes[s.field] = vals
        else:
            if len(vals) != 1:
                raise RlsimError(f"{s.option}: give one value here (lists are for `rlsim sweep`)")
            fixed[s.field] = vals[0]
    return axes, fixed


def _load_traces(paths: list[Path]):
    from rlsim.replay.io import read_trace

    if not paths:
        raise RlsimError("give a trace with --trace (e.g. --trace traces/grpo_p128.parquet)")
    return [read_trace(p) for p in paths]


def _prepare(traces, rho_model: str, target: Optional[float]):
    from rlsim.whatif import prepare

    return prepare(traces, rho_model=rho_model, target=target)


def register(app: typer.Typer) -> None:
    specs = axis_specs()
    labels = {s.field: s.option for s in specs}

    # ------------------------------------------------------------------ sweep
    def sweep(**kw: Any) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from rlsim import sweep as sw

        out: Path = kw["out"]
        if out is None:
            raise RlsimError("give the output folder with --out (e.g. --out results/grpo_sweep)")
        if not kw["trace"]:
            raise RlsimError("give a trace with --trace (e.g. --trace traces/grpo_p128.parquet)")
        axes, _ = _collect_axes(specs, kw, as_list=True)
        if not axes:
            raise RlsimError("nothing to sweep: give at least one option as a comma list, e.g. --batch 64,128,256")
        if kw["workers"] is not None and kw["workers"] < 1:
            raise RlsimError("--workers must be at least 1")
        if kw["ray_address"]:
            sw.import_ray()  # fail fast, before fitting, when the extra is missing
        grid = sw.build_grid(_whatif_cls(), axes, {}, labels=labels)
        sw.prepare_out_dir(out, kw["overwrite"], clear=False)  # refuse early; old results go only once new ones exist
        traces = _load_traces(kw["trace"])
        studies = sw.prepare_studies(traces, grid, rho_model=kw["rho_model"], target=kw["target"])
        sw.check_configs(studies, grid, labels)
        err = Console(stderr=True)
        t0 = time.perf_counter()
        # no auto-refresh thread: the local pool forks its workers while the bar is shown
        with Progress(TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=err, transient=False, auto_refresh=False) as bar:
            task = bar.add_task("configs", total=len(grid))

            def advance(k: int) -> None:
                bar.advance(task, k)
                bar.refresh()

            rows = sw.run_sweep(studies, grid, workers=kw["workers"], ray_address=kw["ray_address"],
                                chunk_size=kw["chunk_size"], progress=advance)
        seconds = time.perf_counter() - t0
        ranked = sw.rank_rows(rows)
        backend = ({"kind": "ray", "address": kw["ray_address"]} if kw["ray_address"] else
                   {"kind": "local", "workers": min(kw["workers"] or sw.default_workers(), len(grid))})
        meta = sw.sweep_metadata(traces=traces, axes=axes, fixed={}, labels=labels, n_configs=len(grid),
                                 study_options={"rho_model": kw["rho_model"], "target": kw["target"]},
                                 backend=backend, seconds=round(seconds, 3))
        meta["reference"] = sw.reference_row(studies)
        sw.prepare_out_dir(out, kw["overwrite"])
        paths = sw.write_results(out, ranked, meta)
        if not kw["no_charts"]:
            from rlsim.report import sweep_charts

            sweep_charts(out / "charts", traces=traces, study=studies.first, rows=ranked, meta=meta)
        console = Console()
        from rlsim.report import ranking_table

        console.print(ranking_table(ranked, list(axes), top=kw["top"], labels=labels))
        best = ranked[0]
        console.print(f"{len(grid)} configs in {seconds:.1f} s ({backend['kind']}); best: "
                      + " ".join(f"{labels[a]} {best.get(a)}" for a in axes)
                      + f" (T ratio {best.get('time_to_target_ratio', float('nan')):.3f}, {best.get('regime', '')})")
        console.print(f"results: {paths['parquet']}, {paths['csv']}, {paths['json']}"
                      + ("" if kw["no_charts"] else f", charts in {out / 'charts'}"))

    sweep_params = [
        inspect.Parameter("trace", inspect.Parameter.KEYWORD_ONLY, annotation=list[Path],
                          default=typer.Option([], "--trace", "-t", help="Recorded trace (first = reference); repeat for learning curves at other batch sizes.")),
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                          default=typer.Option(None, "--out", "-o", help="Output folder (must not exist unless --overwrite).")),
        *_axis_params(specs, as_list=True),
        inspect.Parameter("rho_model", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                          default=typer.Option("auto", "--rho", "--rho-model", help="Sample-cost model: invariant | noise-scale | curves | auto (as `rlsim run`).")),
        inspect.Parameter("target", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[float],
                          default=typer.Option(None, "--target", help="Target eval score (default: best the reference reached).")),
        inspect.Parameter("workers", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                          default=typer.Option(None, "--workers", "-j", help="Local worker processes (default: all cores).")),
        inspect.Parameter("ray_address", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                          default=typer.Option(None, "--ray-address", help="Run as Ray tasks on this cluster (`auto`, `ray://host:10001`, `local`). Needs the ray extra.")),
        inspect.Parameter("chunk_size", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                          default=typer.Option(None, "--chunk-size", help="Configs per task (default: about 8 tasks per worker).")),
        inspect.Parameter("top", inspect.Parameter.KEYWORD_ONLY, annotation=int,
                          default=typer.Option(10, "--top", help="Rows of the ranking shown in the terminal.")),
        inspect.Parameter("no_charts", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--no-charts", help="Skip the HTML/PNG charts.")),
        inspect.Parameter("overwrite", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--overwrite", help="Replace the results in an existing output folder.")),
    ]
    app.command("sweep", help="Evaluate the cartesian grid of comma-listed run options and rank it by time-to-target.")(
        cli_errors(_with_signature(sweep, sweep_params)))

    # ------------------------------------------------------------------ report
    @app.command("report", help="One self-contained HTML page: trace summary, fitted models, charts, the sweep's ranking.")
    @cli_errors
    def report(trace: list[Path] = typer.Option([], "--trace", "-t", help="Recorded trace (repeat for several)."),
               sweep_dir: Optional[Path] = typer.Option(None, "--sweep", help="Folder written by `rlsim sweep`."),
               out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write."),
               rho_model: Optional[str] = typer.Option(None, "--rho", "--rho-model", help="Sample-cost model (default: the sweep's)."),
               target: Optional[float] = typer.Option(None, "--target", help="Default: the sweep's."),
               overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing report file.")) -> None:
        from rlsim.report import build_report

        if out.exists() and not overwrite:
            raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
        path = build_report(trace, sweep_dir, out, rho_model=rho_model, target=target)
        typer.echo(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")

    # ------------------------------------------------------------------ export perfetto
    export = typer.Typer(no_args_is_help=True, help="Export timelines.")
    app.add_typer(export, name="export")

    def perfetto(**kw: Any) -> None:
        from rlsim import perfetto as pf

        out: Path = kw["out"]
        if out is None:
            raise RlsimError("give the output file with -o (e.g. -o recorded.json)")
        if out.exists() and not kw["overwrite"]:
            raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
        if not kw["simulate"]:
            src = kw["trace_arg"] or (kw["trace"][0] if kw["trace"] else None)
            if src is None:
                raise RlsimError("give the trace to export: rlsim export perfetto TRACE -o recorded.json")
            if kw["trace"] and kw["trace_arg"] and len(kw["trace"]) > 0:
                raise RlsimError("give the trace once (TRACE or --trace)")
            _, fixed = _collect_axes(specs, kw, as_list=False)
            if fixed:
                raise RlsimError("config options (" + ", ".join(labels[f] for f in fixed) + ") need --simulate")
            counts = pf.export_recorded(src, out, overwrite=kw["overwrite"])
        else:
            paths = ([kw["trace_arg"]] if kw["trace_arg"] else []) + list(kw["trace"] or [])
            traces = _load_traces(paths)
            _, fixed = _collect_axes(specs, kw, as_list=False)
            if "updates" not in fixed:
                fixed["updates"] = EXPORT_UPDATES
                typer.echo(f"simulating {EXPORT_UPDATES} updates (pass --updates N for more)")
            counts = export_simulated(traces, fixed, out, rho_model=kw["rho_model"], overwrite=kw["overwrite"])
        typer.echo(f"wrote {out}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                   + " slices (open in https://ui.perfetto.dev)")

    perfetto_params = [
        inspect.Parameter("trace_arg", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                          default=typer.Argument(None, metavar="[TRACE]", help="Recorded trace to export.")),
        inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                          default=typer.Option(None, "--out", "-o", help="Chrome trace JSON to write.")),
        inspect.Parameter("simulate", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--simulate", help="Export a simulated run of the given config instead.")),
        inspect.Parameter("trace", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[list[Path]],
                          default=typer.Option(None, "--trace", "-t", help="Trace(s) the simulation is fitted to.")),
        *_axis_params(specs, as_list=False),
        inspect.Parameter("rho_model", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                          default=typer.Option("auto", "--rho", "--rho-model", help="Sample-cost model: invariant | noise-scale | curves | auto.")),
        inspect.Parameter("overwrite", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--overwrite", help="Replace an existing output file.")),
    ]
    export.command("perfetto", help="Chrome trace JSON (Perfetto UI) of a recorded trace, or of a simulated run with --simulate.")(
        cli_errors(_with_signature(perfetto, perfetto_params)))


def export_simulated(traces, fixed: dict[str, Any], out: Path, *, rho_model: str = "auto",
                     overwrite: bool = False) -> dict[str, int]:
    """Simulate one config (fields not given: the reference trace's) with its timeline and write it as
    Chrome trace JSON. Returns the slice counts per kind."""
    from rlsim import perfetto as pf
    from rlsim.sweep import build_grid, config_dict
    from rlsim.whatif import timeline

    cfg = build_grid(_whatif_cls(), {k: [v] for k, v in fixed.items()}, {})[0]
    study = _prepare(traces, rho_model, None)
    run = timeline(study, cfg)
    obj = pf.simulated_chrome_trace(run, other={"config": config_dict(cfg), "traces": [str(t.path) for t in traces]})
    counts = pf.check_chrome_trace(obj)
    pf.write_json(obj, out, overwrite=overwrite)
    return counts
