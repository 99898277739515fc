"""The notebook API: the same library calls the CLI makes, returning pandas DataFrames, raising the
`RlsimError` the CLI prints (one line saying what is wrong and how to fix it), in the API's keywords.

    import rlsim
    tr = rlsim.load_trace("traces/grpo_p128.parquet")   # validated; tr.table is the pyarrow Table
    rlsim.events(tr)                                     # one row per recorded event
    rlsim.steps(tr)                                      # one row per RL step (rlsim.replay.steps)
    rlsim.split_stats(tr)                                # idle ratios, staleness, overlap (replay/split_stats.py)
    study = rlsim.fit([tr])                              # cost and learning models, fitted once
    rlsim.predict(study, prompts=2048)                   # reference and candidate, sigma, rho, T ratio
    rlsim.predict_sizes(study, prompts=[256, 512, 1024]) # the reference and one row per size
    rlsim.predict(study, mode="fully_async", gen_gpus=4, train_gpus=4, staleness_threshold=0.5)  # a framework's mode
    rlsim.sweep([tr], {"prompts": [256, 1024], "group": [4, 8]})   # ranked, best first
    rlsim.check_fidelity(tr)                             # recorded vs simulated, per update (rlsim replay)
    rlsim.example_trace("grpo_p128")                     # the path of a trace shipped under traces/

Keywords are the CLI's option names (`--rho` is `rho=`, `--sampled` `sampled=`): the fit's are the fields of
`rlsim.core.config.StudyOptions`, the config's those of `WhatIf`, which the CLI's options are made from (`batch` is
`prompts`, as the CLI's --batch). Errors name keywords; a deprecated one (`DEPRECATED`) works, with a warning.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from numbers import Real
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlsim.core.config import StudyOptions, WhatIf
from rlsim.modes.registry import as_recorded, check as check_mode
from rlsim.whatif.fidelity import replay_trace
from rlsim.replay.errors import RlsimError, did_you_mean, keyword_names
from rlsim.replay.io import Trace, read_trace
from rlsim.replay.probe import refuse_probe
from rlsim.replay.split_stats import split_stats as measure
from rlsim.replay.steps import step_table
from rlsim.replay.util import is_count
from rlsim.sweeps.study import sweep_study
from rlsim.whatif.predict import evaluate, reference_outcome
from rlsim.whatif.study import Study, prepare

ALIASES = {"batch": "prompts"}  # the CLI's --batch is P
# Keywords spelt otherwise before they took the CLI's names: old -> (new, the old value as the new keyword takes it)
DEPRECATED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "rho_model": ("rho", lambda v: v),  # the CLI's --rho
    "lengths": ("sampled", lambda v: {"sampled": True, "recorded": False}.get(v, v)),  # rlsim replay --sampled
}


def _path_like(v: Any) -> bool:
    return isinstance(v, (str, os.PathLike))


def _traces_like(v: Any) -> bool:
    """A trace, a path, or an iterable of them (not a mapping, not a Study)."""
    if isinstance(v, Trace) or _path_like(v) or isinstance(v, Iterator):  # an iterator's items: checked as read
        return True
    return isinstance(v, Iterable) and not isinstance(v, (Mapping, bytes)) and all(
        isinstance(t, Trace) or _path_like(t) for t in v)


def _number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


_TRACE = "a path (str or pathlib.Path) or a Trace from rlsim.load_trace"
_TRACES = f"{_TRACE}, or a list of them (the first is the reference)"
# Every parameter of a public function -> (whether a value is acceptable, what is expected), checked before any work;
# None: the library checks it where it is used (rho: parse_rho, target: prepare, prompts: WhatIf.validate; the ranges
# of bend_batch and kappa: lr_aware_rho).
CHECKS: dict[str, tuple[Callable[[Any], bool], str] | None] = {
    "path": (_path_like, "a path (str or pathlib.Path)"),
    "trace": (lambda v: isinstance(v, Trace) or _path_like(v), _TRACE),
    "traces": (_traces_like, _TRACES),
    "calibration": (_traces_like, f"calibration traces: {_TRACES.removesuffix(' (the first is the reference)')}"),
    "study_or_traces": (lambda v: isinstance(v, Study) or _traces_like(v), f"a Study from rlsim.fit, or {_TRACES}"),
    "drop_invalid": (lambda v: isinstance(v, bool), "True or False"),
    "overwrite": (lambda v: isinstance(v, bool), "True or False"),
    "skip": (lambda v: is_count(v, 0), "a non-negative integer (updates)"),
    "seed": (lambda v: is_count(v, 0), "a non-negative integer"),
    "sampled": (lambda v: isinstance(v, bool), "True or False (draw lengths from the fit, not the recorded ones)"),
    "axes": (lambda v: isinstance(v, Mapping), "a dict of WhatIf field -> values, e.g. {'prompts': [256, 1024]}"),
    "out": (lambda v: v is None or _path_like(v), "None or a folder path"),
    "workers": (lambda v: v is None or is_count(v, 1), "None or a positive integer"),
    "chunk_size": (lambda v: v is None or is_count(v, 1), "None or a positive integer"),
    "ray_address": (lambda v: v is None or isinstance(v, str), "None or a Ray address (text)"),
    "name": (lambda v: isinstance(v, str), "a trace's name, e.g. 'grpo_p128' (rlsim.example_traces() lists them)"),
    "bend_batch": (lambda v: v is None or _number(v), "None or a number (responses; with kappa and rho='lr-aware')"),
    "kappa": (lambda v: v is None or _number(v), "None or a number in [0, 1) (with bend_batch and rho='lr-aware')"),
    "progress": (lambda v: v is None or callable(v), "None or a function of the configs just finished, progress(k)"),
    "rho": None, "target": None, "prompts": None,
}


def _check(call: str, key: str, value: Any) -> None:
    rule = CHECKS[key]
    if rule is not None and not rule[0](value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise RlsimError(f"{call}: {key} must be {rule[1]}, got {type(value).__name__} {shown}")


def _unknown(call: str, key: str, choices: Sequence[str], listed: str = "") -> RlsimError:
    """The one error for a keyword a function does not take: the closest it does take, then what it takes; a config
    field given to a function of grid axes belongs in the axes."""
    if "axes" in choices and (key in ALIASES or key in {f.name for f in dataclasses.fields(WhatIf)}):
        return RlsimError(f"{call}: {key} is a config field: put it in the axes, e.g. {{{key!r}: [value]}}")
    return RlsimError(f"{call}: unknown keyword {key!r}{did_you_mean(key, choices)}; "
                      f"{listed or 'the keywords are ' + (', '.join(choices) or '(none)')}")


def _bind(call: str, sig: inspect.Signature, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    """The call's arguments bound to the parameters of `sig`; an unknown keyword (with the closest one), a missing or
    an extra argument is one RlsimError showing the signature."""
    named = [n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        for key in kwargs:
            if key not in named:
                raise _unknown(call, key, named)
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as e:
        plain = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                            return_annotation=sig.empty)
        raise RlsimError(f"{call}{plain}: {e}") from None


def _renamed(call: str, names: Sequence[str], kwargs: dict) -> dict:
    """`kwargs` with each deprecated keyword of `call` (one whose new name is in `names`) under its new name, with a
    DeprecationWarning; both spellings at once is an RlsimError."""
    out = dict(kwargs)
    for old, (new, convert) in DEPRECATED.items():
        if old in out and new in names:
            if new in out:
                raise RlsimError(f"{call}: give {new}, not both {new} and {old} (its deprecated spelling)")
            warnings.warn(f"{call}: {old}= is deprecated; use {new}= (the CLI's name)", DeprecationWarning,
                          stacklevel=3)
            out[new] = convert(out.pop(old))
    return out


def _public(fn: Callable) -> Callable:
    """A function of the notebook API: its arguments are bound and checked (`CHECKS`) before it runs, and its
    RlsimErrors name keywords (`prompts`, `rho`) as the API spells them, not the CLI's options. A deprecated keyword
    (`DEPRECATED`) is read as its new name, with a warning."""
    sig = inspect.signature(fn)
    unchecked = [n for n, p in sig.parameters.items()
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in CHECKS]
    if unchecked:
        raise TypeError(f"{fn.__name__}: add the parameters {unchecked} to rlsim.api.CHECKS")

    names = list(sig.parameters)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with keyword_names():
            kwargs = _renamed(fn.__name__, names, kwargs)
            bound = _bind(fn.__name__, sig, args, kwargs)
            for key, value in bound.arguments.items():
                if key in CHECKS and sig.parameters[key].kind is not sig.parameters[key].VAR_KEYWORD:
                    _check(fn.__name__, key, value)
            return fn(*args, **kwargs)

    return wrapper


def _fit_options(fn: Callable) -> Callable:
    """`fn(..., **options)` takes `rlsim.core.config.StudyOptions`' fields (but the trace: the traces are its first
    argument) as keyword-only parameters with their defaults, named as the CLI's options: a field added there is a
    keyword here (and `_public` asks for its check in CHECKS)."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    study = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
             for f in dataclasses.fields(StudyOptions) if f.name != "trace"]
    fn.__signature__ = sig.replace(parameters=own + study)
    return fn


def _fitted(call: str, traces: Any, options: Mapping[str, Any]) -> tuple[list[Trace], StudyOptions, list[Trace]]:
    """The traces, the StudyOptions of the call's fit keywords, and the calibration traces, read as the options say."""
    so = StudyOptions(**{k: v for k, v in options.items() if k != "calibration"})
    read = _traces(traces, so.drop_invalid)
    if not read:
        raise RlsimError(f"{call}: give at least one trace (a path or a loaded Trace; the first is the reference)")
    return read, so, _traces(options.get("calibration", ()), so.drop_invalid)


def _fields(given: Mapping[str, Any], call: str) -> dict[str, Any]:
    """Keywords -> WhatIf fields (`batch` read as `prompts`); an unknown keyword is one line listing the valid ones."""
    valid = [f.name for f in dataclasses.fields(WhatIf)]
    out: dict[str, Any] = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if name not in valid:
            raise _unknown(call, key, valid + list(ALIASES),
                           f"the keywords are rlsim.core.config.WhatIf's fields: {', '.join(valid)} (batch = prompts)")
        if name in out:
            raise RlsimError(f"{call}: give prompts or batch, not both (batch is the CLI's name for prompts)")
        out[name] = value
    return out


@_public
def load_trace(path: str | os.PathLike, *, drop_invalid: bool = False) -> Trace:
    """Read and validate a trace (`drop_invalid`: drop rows with invalid values, with warnings)."""
    return read_trace(path, drop_invalid=drop_invalid)


def _trace(t: Any, drop_invalid: bool = False) -> Trace:
    if not (isinstance(t, Trace) or _path_like(t)):
        raise RlsimError(f"expected {_TRACE}, got {type(t).__name__} {t!r:.60}")
    return t if isinstance(t, Trace) else read_trace(t, drop_invalid=drop_invalid)


def _listed(v: Any) -> list:
    """A value or an iterable of values, as a list."""
    return [v] if isinstance(v, str) or not isinstance(v, Iterable) else list(v)


def _traces(traces: Any, drop_invalid: bool = False) -> list[Trace]:
    """A trace, a path, or a sequence of them (the first is the reference), read to be fitted: a probe trace is
    refused (it measures sigma, it is not a run)."""
    one = isinstance(traces, (Trace, str, os.PathLike))
    return [refuse_probe(_trace(t, drop_invalid)) for t in ([traces] if one else traces)]


@_public
def events(trace: Trace | str | os.PathLike):
    """The trace's events as a DataFrame (columns: docs/trace-format.md)."""
    return _trace(trace).table.to_pandas()


@_public
def steps(trace: Trace | str | os.PathLike):
    """One row per RL step: phase seconds, responses and tokens (rlsim.replay.steps.COLUMNS)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    return pd.DataFrame(step_table(_trace(trace)))


@_public
def split_stats(trace: Trace | str | os.PathLike, *, skip: int = 2) -> dict[str, Any]:
    """Measured placement metrics of a recorded run (colocated or split): responses/s, generator and trainer
    idle ratios, staleness, partial rollouts, generation/training overlap (rlsim.replay.split_stats.SplitStats)."""
    return measure(_trace(trace), skip=skip).to_dict()


@_public
@_fit_options
def fit(traces: Any, **options: Any):
    """Fit the traces (a trace or path, or a list of them; the first is the reference): a `rlsim.whatif.study.Study`.
    Keywords: `rlsim.core.config.StudyOptions`' fields, the options of `rlsim run`'s fit: `rho` (the sample-cost
    model; None: auto), `bend_batch` and `kappa` (lr-aware rho's constants), `target`, `calibration` (traces of
    `rlrun calibrate` for a reference recorded without calibration), `drop_invalid` (as `load_trace`'s)."""
    read, so, calibration = _fitted("fit", traces, options)
    return prepare(read, rho_model=so.rho_model, target=so.target, calibration=calibration)


def _study(study_or_traces: Any):
    return study_or_traces if isinstance(study_or_traces, Study) else fit(study_or_traces)


def _frame(study_or_traces: Any, candidates: Sequence[dict[str, Any]], roles: Sequence[str]):
    """The reference and each candidate (WhatIf fields) as one DataFrame indexed by role; configs are checked
    before anything is fitted."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    cfgs = [WhatIf(**c) for c in candidates]
    for cfg in cfgs:
        if cfg.mode is not None:  # a named mode and its settings (rlsim.modes.registry), before any trace is read
            cfg.validate()
            check_mode(cfg)
    given = study_or_traces if isinstance(study_or_traces, Study) else _traces(study_or_traces)
    recorded = given.recorded_mode if isinstance(given, Study) else given[0].config if given else {}
    # the mode the reference trace records where a config names none, checked before anything is fitted
    cfgs, lines = zip(*(as_recorded(c, recorded) for c in cfgs))
    study = _study(given)
    outs = [reference_outcome(study, cfgs[0].updates, cfgs[0].seed, like=cfgs[0])] + [evaluate(study, c) for c in cfgs]
    # each row carries the study's warnings beside its own, as `rlsim run` prints them, and the mode line in its notes
    rows = [{**o.to_dict(), "warnings": "; ".join(list(study.warnings) + list(o.warnings)),
             "notes": "; ".join([line, *o.notes] if line else o.notes)} for o, line in zip(outs, ("",) + lines)]
    return pd.DataFrame(rows, index=pd.Index(["reference", *roles], name="role"))


@_public
def predict(study_or_traces: Any, **config: Any):
    """The reference and one candidate (`rlsim.core.config.WhatIf` fields, e.g. prompts=2048, group=16; `batch` is an
    alias of `prompts`, as the CLI's --batch is P) as a two-row DataFrame indexed by role. `study_or_traces`: a
    fitted Study, or traces to fit."""
    return _frame(study_or_traces, [_fields(config, "predict")], ["candidate"])


@_public
def predict_sizes(study_or_traces: Any, prompts: Sequence[int] | int | None = None, **config: Any):
    """The reference and one candidate per size in `prompts` (P; `batch=` is an alias), the other WhatIf fields
    fixed (e.g. group=8, updates=50): one DataFrame indexed by role ('reference', 'prompts=256', ...), the columns
    of `predict`."""
    given = dict(config, **({} if prompts is None else {"prompts": prompts}))
    fields = _fields(given, "predict_sizes")
    sizes = list(dict.fromkeys(_listed(fields.pop("prompts", []))))
    if not sizes:
        raise RlsimError("predict_sizes: give the sizes to predict, e.g. prompts=[256, 512, 1024]")
    return _frame(study_or_traces, [dict(fields, prompts=p) for p in sizes], [f"prompts={p}" for p in sizes])


def _axes(axes: Mapping[str, Any]) -> dict[str, list]:
    """Grid axes with WhatIf field names (`batch` read as `prompts`); a single value is a one-value axis."""
    return {k: _listed(v) for k, v in _fields(axes, "sweep").items()}


@_public
@_fit_options
def sweep(traces: Any, axes: Mapping[str, Sequence[Any]], *, out: str | os.PathLike | None = None,
          workers: int | None = 1, overwrite: bool = False, ray_address: str | None = None,
          chunk_size: int | None = None, progress: Callable[[int], None] | None = None, **options: Any):
    """Every config of the grid `axes` (WhatIf field -> values; `batch` is an alias of `prompts`), ranked best
    first (smallest T / T_ref). `out` also writes results.parquet/csv and sweep.json there (`overwrite`: into an
    existing folder); `ray_address`, `chunk_size`: as `rlsim sweep`'s; `progress(k)` is called as k configs finish;
    the fit's keywords as `fit`'s (rho, bend_batch, kappa, target, calibration, drop_invalid)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    read, so, calibration = _fitted("sweep", traces, options)
    res = sweep_study(read, _axes(axes), out=out, overwrite=overwrite, rho_model=so.rho_model, target=so.target,
                      workers=workers, ray_address=ray_address, chunk_size=chunk_size, progress=progress,
                      charts=False, calibration=calibration)
    return pd.DataFrame(res.rows).set_index("rank")


@_public
def check_fidelity(trace: Trace | str | os.PathLike, *, seed: int = 0, sampled: bool = False,
                   drop_invalid: bool = False):
    """Recorded vs simulated step time, generation time and responses/s per update (rlsim replay; `sampled`: draw
    response lengths from the fitted distribution instead of replaying the recorded ones, as --sampled;
    `drop_invalid`: as `load_trace`'s)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    res = replay_trace(refuse_probe(_trace(trace, drop_invalid)), seed=seed,
                       lengths="sampled" if sampled else "recorded")
    return pd.DataFrame(res.to_dict()["per_update"]).set_index("step")


def _traces_dir() -> Path:
    """traces/ of the source checkout: beside the package folder (sim/) in an editable install."""
    root = Path(__file__).resolve().parent.parent / "traces"
    if not root.is_dir() or not any(root.glob("*.parquet")):
        raise RlsimError(f"the example traces ship in the source checkout (traces/ beside sim/), and this rlsim at "
                         f"{Path(__file__).resolve().parent} has none: install from a clone with pip install -e ., or "
                         "load your own trace's path")
    return root


@_public
def example_traces() -> list[str]:
    """Names of the traces shipped under traces/ ('grpo_p128', 'study/grpo_p32_s0', ...), for `example_trace`."""
    root = _traces_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.parquet"))


@_public
def example_trace(name: str) -> Path:
    """The path of a trace shipped under traces/, e.g. example_trace("grpo_p128") (traces/README.md says how each
    was recorded). A path, not a loaded Trace: every function here and the CLI's --trace take it as it is."""
    names = example_traces()
    key = str(name).removesuffix(".parquet")
    if key not in names:
        top = [n for n in names if "/" not in n]
        folders = sorted({n.split("/")[0] + "/" for n in names if "/" in n})
        raise RlsimError(f"no example trace {name!r}{did_you_mean(key, names)}; shipped: "
                         f"{', '.join(top)}, and {len(names) - len(top)} more in {', '.join(folders)} "
                         "(rlsim.example_traces() lists them all)")
    return _traces_dir() / f"{key}.parquet"
