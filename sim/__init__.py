"""rlsim: record real LLM RL runs and predict untried batch sizes, device splits and staleness limits by
time-to-target.

The package is laid out in three folders: this one (sim/: the SimPy model, what-ifs, sweeps, views),
`rlsim.replay` (replay/: the trace format, validation, fitted models; no torch, no SimPy) and
`rlsim.runner` (runner/: real runs with torch and vLLM, imported only by `rlrun`).

Notebook API (rlsim.api, loaded on first use so that `import rlsim.replay` stays light):
`load_trace`, `events`, `steps`, `split_stats`, `fit`, `predict`, `predict_sizes`, `sweep`, `check_fidelity`,
`example_trace`, `example_traces`; errors are `RlsimError`.
"""
from rlsim.replay.errors import RlsimError, TraceError

_API = ("load_trace", "events", "steps", "split_stats", "fit", "predict", "predict_sizes", "sweep", "check_fidelity",
        "example_trace", "example_traces")
__all__ = ["RlsimError", "TraceError", *_API]


def __getattr__(name: str):
    if name in _API:
        from rlsim import api  # why here: the notebook API (the simulator, pandas) loads on first use

        return getattr(api, name)
    raise AttributeError(f"module 'rlsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy API names too, so that dir() and tab completion show them before first use
    return sorted(set(globals()) | set(__all__))
