"""The CLI's options, derived from the config dataclasses, in one place for `run`, `sweep`, `export`
and `report`.

- One option per `WhatIf` field (its help text is the field's), spelt `--field-name`; `prompts` is also
  `--batch` (verl's train_batch_size is P), `-P` or `-b`, and `group` also `-G` or `-g`, as rlrun spells them.
  `rlsim sweep` takes each as a comma list (the grid's axes); `run` and `export perfetto --simulate` take one
  value. Both are parsed by `rlsim.core.grid` with the field's type, so a new field (device split, staleness)
  appears in every command at once.
- One option per `rlsim.core.config.StudyOptions` field: the traces and how they are fitted (`rlsim.fit`'s
  keywords). The traces may also be given as arguments (`rlsim run TRACE`, as `replay` and `export` take them):
  they come first, then the --trace ones, so the first argument is the reference. A command with its own argument
  (`export perfetto`) keeps it.

`command(app, name, whatif=...)` wraps a function `fn(configs, study, **own)`: typer sees the function's
own parameters plus the generated ones; `fn` receives a `WhatIf` (or the grid's axes) and a
`StudyOptions`. How a field becomes an option, and its text a value, is `rlsim.cli.opts`, which `rlrun`
shares (its options are `rlsim.runner.config.RunConfig`'s fields).
"""
from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console

from rlsim.cli import opts as cliopts
from rlsim.cli.opts import Group, Spec, generated
from rlsim.core.config import StudyOptions, WhatIf
from rlsim.core.grid import parse_list
from rlsim.modes.registry import ALIASES, MODES
from rlsim.replay.errors import RlsimError, cli_errors
from rlsim.replay.io import read_trace
from rlsim.replay.probe import refuse_probe

# P and G as rlrun spells them (runner/config.py); --batch/-b is P too (verl's data.train_batch_size), -g is G
SPELLING = {"prompts": ["--prompts", "--batch", "-P", "-b"], "group": ["--group", "-G", "-g"]}


def read_traces(so: StudyOptions) -> list:
    """The traces, read and validated; a probe trace is refused (it measures sigma, it is not a run to fit)."""
    if not so.trace:
        raise RlsimError("give a trace with --trace or as an argument (e.g. --trace traces/grpo_p128.parquet)")
    return [refuse_probe(read_trace(p, drop_invalid=so.drop_invalid)) for p in so.trace]


def read_calibrations(so: StudyOptions) -> list:
    """The --calibration traces, read and validated."""
    return [read_trace(p, drop_invalid=so.drop_invalid) for p in so.calibration]


def whatif_specs() -> list[Spec]:
    """The WhatIf fields that are options (numbers, text, flags, choices); --mode lists the registered modes."""
    modes = " | ".join([*MODES, *(f"{a} (= {b})" for a, b in ALIASES.items())])
    text = {"mode": f"execution mode, as the frameworks name them: {modes} (docs/simulator.md states each; None: the "
                    "mode the trace records (an imported framework log), else split when --gen-gpus/--train-gpus are "
                    "given, else colocated)"}
    return [s for s in cliopts.specs(WhatIf, spelling=SPELLING, help=text)
            if s.base in (int, float, str, bool) or typing.get_origin(s.base) is typing.Literal]


def study_specs() -> list[Spec]:
    return cliopts.specs(StudyOptions)


def labels() -> dict[str, str]:
    """WhatIf field -> the option that sets it (for messages and tables)."""
    return {s.field: s.label for s in whatif_specs()}


def _whatif_params(as_list: bool) -> list[inspect.Parameter]:
    params = []
    for s in whatif_specs():
        text, unset = cliopts.split_default(s.help)
        text = text[:1].upper() + text[1:] + "." + (" Comma list of values to sweep." if as_list else "")
        if unset:
            text += f" (None: {unset})"  # shown as the default, after the sentence
        # `run` takes one value (a bool a flag: --partial-rollout), `sweep` a comma list (true,false)
        params.append(cliopts.param(s, "wi_", as_list=as_list, help=text, panel="Grid" if as_list else "Config"))
    return params


def _study_params(help: dict | None = None) -> list[inspect.Parameter]:
    return [cliopts.param(s, "so_", panel="Traces") for s in cliopts.specs(StudyOptions, help=help)]


def _trace_args() -> inspect.Parameter:
    return inspect.Parameter(
        "so_trace_args", inspect.Parameter.KEYWORD_ONLY, annotation=typing.List[Path],
        default=typer.Argument(None, metavar="TRACE", show_default=False,
                               help="Recorded trace(s), as --trace; these come first (the first is the reference)."))


def _study_options(kw: dict[str, Any]) -> StudyOptions:
    """Pop the generated StudyOptions from `kw` (the trace arguments, then the --trace options)."""
    args = tuple(kw.pop("so_trace_args", None) or ())
    vals = cliopts.values(study_specs(), kw, "so_")
    if args:
        vals["trace"] = args + vals.get("trace", ())
    return StudyOptions(**vals)


def console() -> Console:
    """The commands' output console. Soft wrap: the terminal wraps long lines, and a command named in a message stays
    one line to copy (rich would break it at the width, 80 columns when piped); tables keep their widths."""
    return Console(highlight=False, soft_wrap=True)


def parse_whatif(kw: dict[str, Any], *, as_list: bool) -> dict[str, Any]:
    """Pop the generated WhatIf options from `kw`: field -> list of values (as_list) or value."""
    out = {}
    for s in whatif_specs():
        raw = kw.pop("wi_" + s.field, None)
        if raw is None:
            continue
        vals = parse_list(str(raw), s.type, s.spellings)
        if not as_list and len(vals) != 1:
            raise RlsimError(f"{s.spellings}: give one value here (lists are for `rlsim sweep`)")
        out[s.field] = vals if as_list else vals[0]
    return out


def command(app: typer.Typer, name: str, *, help: str, whatif: str | None = "one", study: bool = True,
            study_help: dict | None = None) -> Callable:
    """Register `fn(cfg, study_options, **own)` as `rlsim NAME`. whatif: 'one' (fn gets a WhatIf, or a
    dict of the fields given when the command fits nothing), 'grid' (a dict field -> values) or None.
    study_help: StudyOptions field -> this command's help text for it."""
    def deco(fn: Callable) -> Callable:
        own = list(inspect.signature(fn).parameters.values())[2:]
        grid = whatif == "grid"
        wi = Group(_whatif_params(grid) if whatif else [], lambda kw: parse_whatif(kw, as_list=grid) if whatif else {})
        so = Group([], lambda kw: None)
        if study:
            params = _study_params(study_help)
            if not any(isinstance(p.default, typer.models.ArgumentInfo) for p in own):
                params.append(_trace_args())
            so = Group(params, _study_options)
        app.command(name, help=help)(cli_errors(generated(wi, so)(fn)))
        return fn

    return deco
