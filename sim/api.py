"""The notebook API: the same library calls the CLI makes, returning pandas DataFrames, raising the
same `RlsimError` (one line saying what is wrong and how to fix it) the CLI prints.

    import rlsim
    tr = rlsim.load_trace("traces/grpo_p128.parquet")   # validated; tr.table is the pyarrow Table
    rlsim.events(tr)                                     # one row per recorded event
    rlsim.steps(tr)                                      # one row per RL step (rlsim.replay.steps)
    rlsim.split_stats(tr)                                # measured idle ratios, staleness, overlap (rlsim.replay.split_stats)
    study = rlsim.fit([tr])                              # cost and learning models, fitted once
    rlsim.predict(study, prompts=2048)                   # reference and candidate, sigma, rho, T ratio
    rlsim.sweep([tr], {"prompts": [256, 1024], "group": [4, 8]})   # ranked, best first
    rlsim.check_fidelity(tr)                             # recorded vs simulated, per update (rlsim replay)
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from rlsim.replay.io import Trace


def load_trace(path: str | os.PathLike, *, drop_invalid: bool = False) -> Trace:
    """Read and validate a trace (`drop_invalid`: drop rows with invalid values, with warnings)."""
    from rlsim.replay.io import read_trace

    return read_trace(path, drop_invalid=drop_invalid)


def _trace(t: Trace | str | os.PathLike) -> Trace:
    return t if isinstance(t, Trace) else load_trace(t)


def events(trace: Trace | str | os.PathLike):
    """The trace's events as a DataFrame (columns: docs/trace-format.md)."""
    return _trace(trace).table.to_pandas()


def steps(trace: Trace | str | os.PathLike):
    """One row per RL step: phase seconds, responses and tokens (rlsim.replay.steps.COLUMNS)."""
    import pandas as pd

    from rlsim.replay.steps import step_table

    return pd.DataFrame(step_table(_trace(trace)))


def split_stats(trace: Trace | str | os.PathLike, *, skip: int = 2) -> dict[str, Any]:
    """Measured placement metrics of a recorded run (colocated or split): responses/s, generator and trainer
    idle ratios, staleness, partial rollouts, generation/training overlap (rlsim.replay.split_stats.SplitStats)."""
    from rlsim.replay.split_stats import split_stats as measure

    return measure(_trace(trace), skip=skip).to_dict()


def fit(traces: Sequence[Trace | str | os.PathLike], *, rho_model: str = "auto", target: float | None = None,
        calibration: Sequence[Trace | str | os.PathLike] = ()):
    """Fit the traces (the first is the reference): a `rlsim.whatif.Study`. `calibration`: traces of
    `rlrun calibrate` for a reference recorded without calibration."""
    from rlsim.whatif import prepare

    return prepare([_trace(t) for t in traces], rho_model=rho_model, target=target,
                   calibration=[_trace(t) for t in calibration])


def predict(study_or_traces: Any, **config: Any):
    """The reference and one candidate (`rlsim.config.WhatIf` fields, e.g. prompts=2048, group=16) as a
    two-row DataFrame indexed by role."""
    import pandas as pd

    from rlsim.config import WhatIf
    from rlsim.whatif import Study, evaluate, reference_outcome

    study = study_or_traces if isinstance(study_or_traces, Study) else fit(study_or_traces)
    cfg = WhatIf(**config)
    cfg.validate()
    rows = [reference_outcome(study, cfg.updates, cfg.seed).to_dict(), evaluate(study, cfg).to_dict()]
    return pd.DataFrame(rows, index=pd.Index(["reference", "candidate"], name="role"))


def sweep(traces: Sequence[Trace | str | os.PathLike], axes: Mapping[str, Sequence[Any]], *,
          out: str | os.PathLike | None = None, workers: int | None = 1, **options: Any):
    """Every config of the grid `axes` (WhatIf field -> values), ranked best first (smallest T / T_ref).
    `out` also writes results.parquet/csv and sweep.json there; other options as `rlsim.study.sweep_study`."""
    import pandas as pd

    from rlsim.study import sweep_study

    res = sweep_study([_trace(t) for t in traces], axes, out=out, workers=workers, charts=False, **options)
    return pd.DataFrame(res.rows).set_index("rank")


def check_fidelity(trace: Trace | str | os.PathLike, *, seed: int = 0, lengths: str = "recorded"):
    """Recorded vs simulated step time, generation time and responses/s per update (rlsim replay)."""
    import pandas as pd

    from rlsim.fidelity import replay_trace

    res = replay_trace(_trace(trace), seed=seed, lengths=lengths)
    return pd.DataFrame(res.to_dict()["per_update"]).set_index("step")
