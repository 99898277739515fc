"""The machine's speed over a run, from its drift probe, and the run's timings normalised to it.

`rlrun record` repeats a small fixed probe every few updates (`drift_gen`: one engine visit at a fixed
concurrency; `drift_train`: one forward + backward of a fixed batch; replay/schema.py). The same work
should take the same time; what it takes instead is the machine's speed at that moment (a shared VM drifts
between processes and from minute to minute: docs/results.md sections 3 and 10). Here:

- `drift_of(trace)`: per probe, its time on the run's clock and the engine's and the trainer's slowness
  relative to the run's median probe (1.10 = 10 % slower than usual), with a summary;
- `Drift.factor(kind, t)`: that slowness at any time of the run, interpolated between probes (the nearest
  probe's value before the first and after the last);
- the fit (replay/fit.py) divides the run's engine-step and training seconds by it, so the cost models
  describe the machine at its median speed over the run instead of whatever it was doing when each row was
  taken, and says by how much the speed moved. What the run recorded (replay/steps.py: `rlsim replay`'s and
  `rlsim run`'s recorded step times) stays as measured.

Imports numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.replay.io import Trace
from rlsim.replay.schema import DRIFT_GEN, DRIFT_TRAIN, KIND_SINCE

MIN_PROBES = 3  # fewer probes than this: no drift estimate (one or two points say nothing of a trend)


@dataclass(frozen=True, eq=False)
class Drift:
    """Relative slowness of the engine and of the trainer at each probe (1 = the run's median)."""

    t: np.ndarray = field(metadata={"help": "(K,) probe times, seconds on the run's clock"})
    gen: np.ndarray = field(metadata={"help": "(K,) median decode-step seconds of each engine probe over their median"})
    train: np.ndarray = field(metadata={"help": "(K,) seconds of each training probe over their median"})

    def factor(self, kind: str, t) -> np.ndarray:
        """Slowness of `kind` ("gen" or "train") at times t (any shape), interpolated between probes."""
        v = self.gen if kind == "gen" else self.train
        return np.interp(np.asarray(t, float), self.t, v)

    def spread(self, kind: str) -> tuple[float, float]:
        """(lowest, highest) slowness over the probes."""
        v = self.gen if kind == "gen" else self.train
        return float(v.min()), float(v.max())

    def describe(self) -> str:
        (g0, g1), (t0, t1) = self.spread("gen"), self.spread("train")
        return (f"machine speed over the run ({len(self.t)} drift probes): engine steps {g0:.2f}x..{g1:.2f}x and "
                f"training {t0:.2f}x..{t1:.2f}x of their median time; the fits normalise the run's timings to the "
                "median (the recorded step times stay as measured)")


def drift_of(trace: Trace) -> Drift | None:
    """The run's drift from its probe rows; None for a trace without MIN_PROBES probes of both kinds."""
    version = int(trace.meta.get("schema_version") or 1)
    if version < KIND_SINCE[DRIFT_GEN] or trace.count(DRIFT_GEN) == 0 or trace.count(DRIFT_TRAIN) < MIN_PROBES:
        return None
    g, tr = trace.rows(DRIFT_GEN), trace.rows(DRIFT_TRAIN)
    # a probe = the engine visit and the training pass after one update (`step`)
    steps = np.intersect1d(np.unique(g["step"]), np.unique(tr["step"]))
    if len(steps) < MIN_PROBES:
        return None
    t, gen, train = [], [], []
    for s in steps:
        m = g["step"] == s
        n = g["num_running"][m]
        decode = g["duration"][m][(n == n.max()) & (g["prefill_tokens"][m] == 0)]
        k = tr["step"] == s
        if not len(decode) or not k.any():
            continue
        t.append(float(g["t_start"][m].min()))
        gen.append(float(np.median(decode)))
        train.append(float(np.median(tr["duration"][k])))
    if len(t) < MIN_PROBES:
        return None
    gen_a, train_a = np.array(gen), np.array(train)
    if not (np.median(gen_a) > 0 and np.median(train_a) > 0):
        return None
    return Drift(np.array(t), gen_a / np.median(gen_a), train_a / np.median(train_a))


def moved(d: Drift | None, tolerance: float = 0.03) -> bool:
    """True when the speed moved by more than `tolerance` either way over the run."""
    if d is None:
        return False
    return any(abs(x - 1) > tolerance for k in ("gen", "train") for x in d.spread(k)) and not math.isnan(d.gen.sum())
