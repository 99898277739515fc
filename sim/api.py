"""The notebook API: the same library calls the CLI makes, returning pandas DataFrames, raising the
`RlsimError` the CLI prints (one line saying what is wrong and how to fix it), in the API's keywords.

    import rlsim
    tr = rlsim.load_trace("traces/grpo_p128.parquet")   # validated; tr.table is the pyarrow Table
    rlsim.events(tr)                                     # one row per recorded event
    rlsim.steps(tr)                                      # one row per RL step (rlsim.replay.steps)
    rlsim.split_stats(tr)                                # measured idle ratios, staleness, overlap (rlsim.replay.split_stats)
    study = rlsim.fit([tr])                              # cost and learning models, fitted once
    rlsim.predict(study, prompts=2048)                   # reference and candidate, sigma, rho, T ratio
    rlsim.predict_sizes(study, prompts=[256, 512, 1024]) # the reference and one row per size
    rlsim.sweep([tr], {"prompts": [256, 1024], "group": [4, 8]})   # ranked, best first
    rlsim.check_fidelity(tr)                             # recorded vs simulated, per update (rlsim replay)
    rlsim.example_trace("grpo_p128")                     # the path of a trace shipped under traces/

Config keywords are the fields of `rlsim.config.WhatIf`; `batch` is accepted for `prompts` (the CLI's
`--batch` is P). Errors name those keywords, not the CLI's options.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlsim.config import WhatIf, keyword_names
from rlsim.fidelity import replay_trace
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace, read_trace
from rlsim.replay.probe import refuse_probe
from rlsim.replay.split_stats import split_stats as measure
from rlsim.replay.steps import step_table
from rlsim.study import sweep_study
from rlsim.whatif import Study, evaluate, prepare, reference_outcome

ALIASES = {"batch": "prompts"}  # the CLI's --batch is P


def _keywords(fn: Callable) -> Callable:
    """Run `fn` with its RlsimErrors naming WhatIf fields as keywords (`prompts`), not CLI options (`--batch`)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with keyword_names():
            return fn(*args, **kwargs)

    return wrapper


def _fields(given: Mapping[str, Any], call: str) -> dict[str, Any]:
    """Keywords -> WhatIf fields (`batch` read as `prompts`); an unknown keyword is one line listing the valid ones."""
    valid = [f.name for f in dataclasses.fields(WhatIf)]
    out: dict[str, Any] = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if name not in valid:
            close = difflib.get_close_matches(key, valid + list(ALIASES), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RlsimError(f"{call}: unknown keyword {key!r}{hint}; the keywords are rlsim.config.WhatIf's fields: "
                             f"{', '.join(valid)} (batch = prompts)")
        if name in out:
            raise RlsimError(f"{call}: give prompts or batch, not both (batch is the CLI's name for prompts)")
        out[name] = value
    return out


def load_trace(path: str | os.PathLike, *, drop_invalid: bool = False) -> Trace:
    """Read and validate a trace (`drop_invalid`: drop rows with invalid values, with warnings)."""
    return read_trace(path, drop_invalid=drop_invalid)


def _trace(t: Trace | str | os.PathLike) -> Trace:
    return t if isinstance(t, Trace) else load_trace(t)


def _listed(v: Any) -> list:
    """A value or an iterable of values, as a list."""
    return [v] if isinstance(v, str) or not isinstance(v, Iterable) else list(v)


def _traces(traces: Any) -> list[Trace]:
    """A trace, a path, or a sequence of them (the first is the reference), read to be fitted: a probe trace is
    refused (it measures sigma, it is not a run)."""
    one = isinstance(traces, (Trace, str, os.PathLike))
    return [refuse_probe(_trace(t)) for t in ([traces] if one else traces)]


def events(trace: Trace | str | os.PathLike):
    """The trace's events as a DataFrame (columns: docs/trace-format.md)."""
    return _trace(trace).table.to_pandas()


def steps(trace: Trace | str | os.PathLike):
    """One row per RL step: phase seconds, responses and tokens (rlsim.replay.steps.COLUMNS)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    return pd.DataFrame(step_table(_trace(trace)))


def split_stats(trace: Trace | str | os.PathLike, *, skip: int = 2) -> dict[str, Any]:
    """Measured placement metrics of a recorded run (colocated or split): responses/s, generator and trainer
    idle ratios, staleness, partial rollouts, generation/training overlap (rlsim.replay.split_stats.SplitStats)."""
    return measure(_trace(trace), skip=skip).to_dict()


@_keywords
def fit(traces: Any, *, rho_model: str = "auto", target: float | None = None, calibration: Any = ()):
    """Fit the traces (a trace or path, or a list of them; the first is the reference): a `rlsim.whatif.Study`.
    `calibration`: traces of `rlrun calibrate` for a reference recorded without calibration."""
    read = _traces(traces)
    if not read:
        raise RlsimError("fit: give at least one trace (a path or a loaded Trace; the first is the reference)")
    return prepare(read, rho_model=rho_model, target=target, calibration=_traces(calibration))


def _study(study_or_traces: Any):
    return study_or_traces if isinstance(study_or_traces, Study) else fit(study_or_traces)


def _frame(study_or_traces: Any, candidates: Sequence[dict[str, Any]], roles: Sequence[str]):
    """The reference and each candidate (WhatIf fields) as one DataFrame indexed by role; configs are checked
    before anything is fitted."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    cfgs = [WhatIf(**c) for c in candidates]
    for cfg in cfgs:
        cfg.validate()
    study = _study(study_or_traces)
    outs = [reference_outcome(study, cfgs[0].updates, cfgs[0].seed, like=cfgs[0])] + [evaluate(study, c) for c in cfgs]
    # each row carries the study's warnings beside its own, as `rlsim run` prints them
    rows = [{**o.to_dict(), "warnings": "; ".join(list(study.warnings) + list(o.warnings))} for o in outs]
    return pd.DataFrame(rows, index=pd.Index(["reference", *roles], name="role"))


@_keywords
def predict(study_or_traces: Any, **config: Any):
    """The reference and one candidate (`rlsim.config.WhatIf` fields, e.g. prompts=2048, group=16; `batch` is an
    alias of `prompts`, as the CLI's --batch is P) as a two-row DataFrame indexed by role. `study_or_traces`: a
    fitted Study, or traces to fit."""
    return _frame(study_or_traces, [_fields(config, "predict")], ["candidate"])


@_keywords
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


@_keywords
def sweep(traces: Any, axes: Mapping[str, Sequence[Any]], *, out: str | os.PathLike | None = None,
          workers: int | None = 1, **options: Any):
    """Every config of the grid `axes` (WhatIf field -> values; `batch` is an alias of `prompts`), ranked best
    first (smallest T / T_ref). `out` also writes results.parquet/csv and sweep.json there; other options as
    `rlsim.study.sweep_study` (rho_model, target, overwrite, ray_address, chunk_size, calibration)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    allowed = set(inspect.signature(sweep_study).parameters) - {"traces", "axes", "out", "workers", "charts", "labels"}
    for key in options:
        if key in ALIASES or key in {f.name for f in dataclasses.fields(WhatIf)}:
            raise RlsimError(f"sweep: {key} is a config field: put it in the axes, e.g. {{{key!r}: [value]}}")
        if key not in allowed:
            raise RlsimError(f"sweep: unknown keyword {key!r}; the options are out, workers, {', '.join(sorted(allowed))}")
    if "calibration" in options:
        options["calibration"] = _traces(options["calibration"])
    res = sweep_study(_traces(traces), _axes(axes), out=out, workers=workers, charts=False, **options)
    return pd.DataFrame(res.rows).set_index("rank")


def check_fidelity(trace: Trace | str | os.PathLike, *, seed: int = 0, lengths: str = "recorded"):
    """Recorded vs simulated step time, generation time and responses/s per update (rlsim replay)."""
    import pandas as pd  # why here: pandas loads only for the calls that return DataFrames

    res = replay_trace(refuse_probe(_trace(trace)), seed=seed, lengths=lengths)
    return pd.DataFrame(res.to_dict()["per_update"]).set_index("step")


def _traces_dir() -> Path:
    """traces/ of the source checkout: beside the package folder (sim/) in an editable install."""
    root = Path(__file__).resolve().parent.parent / "traces"
    if not root.is_dir() or not any(root.glob("*.parquet")):
        raise RlsimError(f"the example traces ship in the source checkout (traces/ beside sim/), and this rlsim at "
                         f"{Path(__file__).resolve().parent} has none: install from a clone with pip install -e ., or "
                         "load your own trace's path")
    return root


def example_traces() -> list[str]:
    """Names of the traces shipped under traces/ ('grpo_p128', 'study/grpo_p32_s0', ...), for `example_trace`."""
    root = _traces_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.parquet"))


def example_trace(name: str) -> Path:
    """The path of a trace shipped under traces/, e.g. example_trace("grpo_p128") (traces/README.md says how each
    was recorded). A path, not a loaded Trace: every function here and the CLI's --trace take it as it is."""
    names = example_traces()
    key = str(name).removesuffix(".parquet")
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        top = [n for n in names if "/" not in n]
        folders = sorted({n.split("/")[0] + "/" for n in names if "/" in n})
        raise RlsimError(f"no example trace {name!r}{f' (did you mean {close[0]}?)' if close else ''}; shipped: "
                         f"{', '.join(top)}, and {len(names) - len(top)} more in {', '.join(folders)} "
                         "(rlsim.example_traces() lists them all)")
    return _traces_dir() / f"{key}.parquet"
