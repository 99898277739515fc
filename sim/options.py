"""The CLI's options, derived from the config dataclasses, in one place for `run`, `sweep`, `export`
and `report`.

- One option per `WhatIf` field (its help text is the field's), spelt `--field-name` except `prompts`,
  which is `--batch`/`-b` (and `group` also `-g`). `rlsim sweep` takes each as a comma list (the grid's
  axes); `run` and `export perfetto --simulate` take one value. Both are parsed by `rlsim.grid` with the
  field's type, so a new field (device split, staleness) appears in every command at once.
- One option per `StudyOptions` field: the traces and how they are fitted. The traces may also be given
  as arguments (`rlsim run TRACE`, as `replay` and `export` take them): they come first, then the --trace
  ones, so the first argument is the reference. A command with its own argument (`export perfetto`) keeps it.

`command(app, name, grid=...)` wraps a function `fn(configs, study, **own)`: typer sees the function's
own parameters plus the generated ones; `fn` receives a `WhatIf` (or the grid's axes) and a
`StudyOptions`.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from rlsim.config import WhatIf
from rlsim.grid import base_type, parse_list, parse_value, whatif_type_hints
from rlsim.replay.errors import RlsimError, cli_errors

SPELLING = {"prompts": ["--batch", "--prompts", "-b"], "group": ["--group", "-g"]}  # as verl/TRL users say P and G


@dataclass(frozen=True)
class StudyOptions:
    """Which traces are fitted and how: shared by every command that fits."""

    trace: tuple[Path, ...] = field(default=(), metadata={
        "help": "Recorded trace (first = reference); repeat for learning curves at other batch sizes.",
        "flags": ["--trace", "-t"]})
    rho_model: Optional[str] = field(default=None, metadata={
        "help": "Sample-cost model: invariant | noise-scale | curves | lr-aware | auto (default: auto; `report`: the sweep's).",
        "flags": ["--rho", "--rho-model"]})
    bend_batch: Optional[float] = field(default=None, metadata={
        "help": "lr-aware rho: the batch (responses) where rho bends upward, B_bend (with --kappa; without both, they are "
                "fitted on the other --trace runs).", "flags": ["--bend-batch"]})
    kappa: Optional[float] = field(default=None, metadata={
        "help": "lr-aware rho: share of the reference update's gain that curvature takes back, in [0, 1) (with --bend-batch).",
        "flags": ["--kappa"]})
    target: Optional[float] = field(default=None, metadata={
        "help": "Eval score that defines time-to-target (default: the best the reference reached; with several "
                "traces, the best all reached).", "flags": ["--target"]})
    calibration: tuple[Path, ...] = field(default=(), metadata={
        "help": "Calibration trace from `rlrun calibrate` (same model and device) for a trace recorded without one; "
                "its engine-step and training profiles refit the step costs over the calibrated range. Repeatable.",
        "flags": ["--calibration"]})
    drop_invalid: bool = field(default=False, metadata={
        "help": "Drop trace rows with invalid values (NaN, negative durations...) with a warning instead of refusing "
                "the trace.", "flags": ["--drop-invalid"]})

    @property
    def rho(self) -> str:
        """The rho model, with the lr-aware parameters when given ('lr-aware:B_BEND,KAPPA', parsed by `parse_rho`)."""
        if self.bend_batch is None and self.kappa is None:
            return self.rho_model or "auto"
        if (self.rho_model or "auto") != "lr-aware":
            raise RlsimError("--bend-batch and --kappa set the lr-aware rho model: add --rho lr-aware")
        if self.bend_batch is None or self.kappa is None:
            raise RlsimError("give both --bend-batch and --kappa (or neither, to fit them on the --trace runs)")
        return f"lr-aware:{self.bend_batch:g},{self.kappa:g}"

    def traces(self) -> list:
        """The traces, read and validated."""
        from rlsim.replay.io import read_trace

        if not self.trace:
            raise RlsimError("give a trace with --trace or as an argument (e.g. --trace traces/grpo_p128.parquet)")
        return [read_trace(p, drop_invalid=self.drop_invalid) for p in self.trace]

    def calibrations(self) -> list:
        """The --calibration traces, read and validated."""
        from rlsim.replay.io import read_trace

        return [read_trace(p, drop_invalid=self.drop_invalid) for p in self.calibration]


@dataclass(frozen=True)
class Spec:
    """One generated option."""

    field: str
    flags: list
    type: Any
    default: Any
    help: str


def whatif_specs() -> list[Spec]:
    hints = whatif_type_hints(WhatIf)
    out = []
    for f in dataclasses.fields(WhatIf):
        base, _ = base_type(hints.get(f.name, f.type))
        if not (base in (int, float, str, bool) or typing.get_origin(base) is typing.Literal):
            continue
        out.append(Spec(f.name, SPELLING.get(f.name, ["--" + f.name.replace("_", "-")]), hints.get(f.name, f.type),
                        f.default, str(f.metadata.get("help", ""))))
    return out


def labels() -> dict[str, str]:
    """WhatIf field -> the option that sets it (for messages and tables)."""
    return {s.field: s.flags[0] for s in whatif_specs()}


def _whatif_params(as_list: bool) -> list[inspect.Parameter]:
    params = []
    for s in whatif_specs():
        dflt = "" if s.default in (dataclasses.MISSING, None) else f" (default: {s.default})"
        text = s.help[:1].upper() + s.help[1:] + "." + (f" Comma list of values to sweep{dflt}." if as_list else dflt)
        if not as_list and base_type(s.type)[0] is bool:  # a flag in `run` (--partial-rollout); `sweep` takes true,false
            params.append(inspect.Parameter(
                "wi_" + s.field, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[bool],
                default=typer.Option(None, f"{s.flags[0]}/--no-{s.flags[0][2:]}", help=text, rich_help_panel="Config")))
            continue
        params.append(inspect.Parameter(
            "wi_" + s.field, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
            default=typer.Option(None, *s.flags, help=text, metavar="V1,V2,..." if as_list else "VALUE",
                                 rich_help_panel="Grid" if as_list else "Config")))
    return params


def _study_params() -> list[inspect.Parameter]:
    params = []
    hints = typing.get_type_hints(StudyOptions)
    for f in dataclasses.fields(StudyOptions):
        listed = typing.get_origin(hints[f.name]) is tuple  # repeatable options: typer takes them as lists
        # numbers arrive as text and are parsed by rlsim.grid, so a bad one is one `error:` line, not click's box
        ann = typing.List[Path] if listed else Optional[str] if base_type(hints[f.name])[0] is float else hints[f.name]
        default = [] if listed else f.default
        params.append(inspect.Parameter(
            "so_" + f.name, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
            default=typer.Option(default, *f.metadata["flags"], help=f.metadata["help"], rich_help_panel="Traces",
                                 metavar="PATH" if listed else None)))
    return params


def _trace_args() -> inspect.Parameter:
    return inspect.Parameter(
        "so_trace_args", inspect.Parameter.KEYWORD_ONLY, annotation=typing.List[Path],
        default=typer.Argument(None, metavar="TRACE", show_default=False,
                               help="Recorded trace(s), as --trace; these come first (the first is the reference)."))


def _study_options(kw: dict[str, Any]) -> StudyOptions:
    """Pop the generated StudyOptions from `kw` (the trace arguments, then the --trace options)."""
    hints = typing.get_type_hints(StudyOptions)
    vals: dict[str, Any] = {}
    args = tuple(kw.pop("so_trace_args", None) or ())
    for f in dataclasses.fields(StudyOptions):
        v = kw.pop("so_" + f.name, None)
        if v is None:
            continue
        if isinstance(v, list):
            v = tuple(v)
        elif isinstance(v, str) and base_type(hints[f.name])[0] is float:
            v = parse_value(v, float, f.metadata["flags"][0])
        vals[f.name] = v
    if args:
        vals["trace"] = args + vals.get("trace", ())
    return StudyOptions(**vals)


def parse_whatif(kw: dict[str, Any], *, as_list: bool) -> dict[str, Any]:
    """Pop the generated WhatIf options from `kw`: field -> list of values (as_list) or value."""
    out = {}
    for s in whatif_specs():
        raw = kw.pop("wi_" + s.field, None)
        if raw is None:
            continue
        vals = parse_list(raw, s.type, s.flags[0])
        if not as_list and len(vals) != 1:
            raise RlsimError(f"{s.flags[0]}: give one value here (lists are for `rlsim sweep`)")
        out[s.field] = vals if as_list else vals[0]
    return out


def command(app: typer.Typer, name: str, *, help: str, whatif: str | None = "one", study: bool = True) -> Callable:
    """Register `fn(cfg, study_options, **own)` as `rlsim NAME`. whatif: 'one' (fn gets a WhatIf, or a
    dict of the fields given when the command fits nothing), 'grid' (a dict field -> values) or None."""
    def deco(fn: Callable) -> Callable:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in list(inspect.signature(fn).parameters.values())[2:]]
        params = own + (_whatif_params(whatif == "grid") if whatif else []) + (_study_params() if study else [])
        if study and not any(isinstance(p.default, typer.models.ArgumentInfo) for p in own):
            params.append(_trace_args())

        def wrapper(**kw: Any) -> Any:
            wi = parse_whatif(kw, as_list=whatif == "grid") if whatif else {}
            so = _study_options(kw) if study else None
            return fn(wi, so, **kw)

        wrapper.__signature__ = inspect.Signature(params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__doc__ = fn.__doc__
        wrapper.__name__ = fn.__name__
        app.command(name, help=help)(cli_errors(wrapper))
        return fn

    return deco
