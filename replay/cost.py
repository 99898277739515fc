"""The engine-step cost model: one formula, its features, and its sums (an execution-time predictor in
the manner of Vidur's).

One engine step that runs n sequences, holds `context` KV tokens after the step and computes `prefill`
prompt tokens takes

    t = c_step [n > 0] + c_seq n + c_ctx context + c_prefill prefill + c_knee max(0, n - knee)

seconds. c_step is what a step costs whatever it runs (weight reads, scheduling); a step with nothing
running does not happen, so it costs nothing. c_knee = 0 is the linear form; otherwise the slope in n
changes at `knee` (replay/calibration.py fits it).

The formula is linear in its five features (`FEATURES`), so the seconds of any set of steps are the same
coefficients applied to the features summed over those steps (`StepSums`): a generation round of the
simulator, a stretch of steps at one composition (the context grows by n each step), a group of
calibration rows, under one coefficient set or a matrix of bootstrap replicates (`EngineStepCost.totals`).
max(0, n - knee) summed over steps is not a function of the other sums, so sums keep the histogram of n
when a knee needs it.

The fits (replay/fit.py, replay/calibration.py) use the same features in a non-negative least squares
parametrisation (`EngineStepCost.design`): the knee form as s1 min(n, k) + s2 max(0, n - k) with s1, s2
>= 0, so that the slope may rise or fall at the knee (c_seq = s1, c_knee = s2 - s1).

Imports numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

COEFS = ("c_step", "c_seq", "c_ctx", "c_prefill", "c_knee", "knee")
FEATURES = ("step", "running", "context", "prefill", "hinge")  # columns of EngineStepCost.features


def _hinge(n, knee):
    return np.maximum(n - knee, 0.0)


@dataclass(frozen=True, eq=False)
class StepSums:
    """Engine-step features summed over a set of steps: scalars for one set, or arrays of shape (U,) for U
    sets (the rounds of a schedule)."""

    steps: float | np.ndarray = field(default=0.0, metadata={"help": "K: engine steps (each has n > 0)"})
    running: float | np.ndarray = field(default=0.0, metadata={"help": "S1: sum over steps of num_running"})
    context: float | np.ndarray = field(default=0.0, metadata={"help": "S2: sum over steps of context tokens"})
    prefill: float | np.ndarray = field(default=0.0, metadata={"help": "S3: sum over steps of prefill tokens"})
    hist: np.ndarray | None = field(default=None, metadata={
        "help": "steps per num_running, (max n + 1,) or (U, max n + 1); needed only to price a knee form (None: not kept)"})

    @classmethod
    def zero(cls, hist: bool) -> StepSums:
        """Nothing summed yet; `hist`: keep the histogram of num_running."""
        return cls(hist=np.zeros(1) if hist else None)

    @classmethod
    def of_requests(cls, prompt: np.ndarray, length: np.ndarray, prefill: np.ndarray, steps,
                    hist: np.ndarray | None = None) -> StepSums:
        """Requests of (..., B) prompt and response lengths, summed over the last axis: a request of L tokens runs
        L consecutive steps with context prompt + k at its k-th step (k = 1..L), so it adds L to S1 and
        L p + L (L - 1) / 2 to S2 wherever it is scheduled. `steps`: the schedule's engine steps (..., )."""
        L = np.asarray(length).astype(float)
        p = np.asarray(prompt).astype(float)
        return cls(steps, L.sum(axis=-1), (L * p + L * (L - 1) / 2).sum(axis=-1), np.asarray(prefill, float).sum(axis=-1), hist)

    @classmethod
    def of_stretch(cls, k: int, n: int, context0: float, prefill: float, hist: bool = False) -> StepSums:
        """k steps of n sequences: context0 tokens in the first step and n more in each next, prefill in the first."""
        h = None
        if hist:
            h = np.zeros(n + 1)
            h[n] = k
        return cls(k, k * n, k * context0 + n * k * (k - 1) / 2, prefill, h)

    @classmethod
    def of_steps(cls, running, context, prefill, hist: bool = False) -> StepSums:
        """Per-step rows (arrays of one length) summed."""
        n = np.asarray(running, float)
        h = np.bincount(n.astype(np.int64), minlength=1).astype(float) if hist else None
        return cls(float(len(n)), float(n.sum()), float(np.sum(context)), float(np.sum(prefill)), h)

    def __add__(self, other: StepSums) -> StepSums:
        hist = None
        if self.hist is not None and other.hist is not None:
            a, b = self.hist, other.hist
            if len(b) > len(a):
                a, b = b, a
            hist = np.array(a, float)
            hist[:len(b)] += b
        return StepSums(self.steps + other.steps, self.running + other.running, self.context + other.context,
                        self.prefill + other.prefill, hist)

    def row(self, u: int) -> StepSums:
        """Set u of sums over U sets."""
        return StepSums(self.steps[u], self.running[u], self.context[u], self.prefill[u],
                        self.hist[u] if self.hist is not None else None)

    def hinge(self, knee) -> np.ndarray:
        """Sum over steps of max(0, n - knee): knee a scalar, or (R,) knees -> (R,) + the sums' shape."""
        if self.hist is None:
            raise ValueError("a knee form needs the histogram of num_running over the steps (StepSums.hist)")
        h = np.asarray(self.hist, float)
        grid = _hinge(np.arange(h.shape[-1], dtype=float), np.asarray(knee, float)[..., None])  # (R, m) or (m,)
        return grid @ h.T

    def to_dict(self) -> dict:
        """The keys of SimRun.features: K, S1, S2, S3, hist."""
        return {"K": self.steps, "S1": self.running, "S2": self.context, "S3": self.prefill, "hist": self.hist}

    @classmethod
    def from_dict(cls, d: dict) -> StepSums:
        return cls(d["K"], d["S1"], d["S2"], d["S3"], d.get("hist"))


@dataclass(frozen=True)
class EngineStepCost:
    """Seconds of an engine step from its batch composition (module doc): the formula and its coefficients."""

    c_step: float = field(metadata={"help": "fixed seconds per engine step, amortised over the batch (weight reads, scheduling)"})
    c_seq: float = field(metadata={"help": "seconds per sequence in the batch"})
    c_ctx: float = field(metadata={"help": "seconds per KV token attended"})
    c_prefill: float = field(metadata={"help": "seconds per prompt token computed"})
    c_knee: float = field(default=0.0, kw_only=True, metadata={
        "help": "change of the per-sequence slope above `knee` (piecewise-linear form; 0: linear)"})
    knee: float = field(default=0.0, kw_only=True, metadata={"help": "num_running at which the slope changes"})

    # ---------------------------------------------------------------------------------- coefficients
    @staticmethod
    def from_array(c6) -> EngineStepCost:
        """From (6,) coefficients in COEFS order."""
        c = [float(v) for v in c6]
        return EngineStepCost(c[0], c[1], c[2], c[3], c_knee=c[4], knee=c[5])

    @property
    def array(self) -> np.ndarray:
        """(6,) coefficients in COEFS order (a row of Replicates.gen)."""
        return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill, self.c_knee, self.knee])

    @property
    def linear(self) -> np.ndarray:
        """(5,) the coefficients of `features`."""
        return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill, self.c_knee])

    # ---------------------------------------------------------------------------------- per step
    @staticmethod
    def features(running, context, prefill=0.0, knee: float = 0.0) -> np.ndarray:
        """(..., 5) FEATURES of steps (arguments broadcast): [n > 0], n, context, prefill, max(0, n - knee)."""
        n, ctx, pre = np.broadcast_arrays(np.asarray(running, float), np.asarray(context, float), np.asarray(prefill, float))
        return np.stack([(n > 0).astype(float), n, ctx, pre, _hinge(n, knee)], axis=-1)

    def step(self, running, context, prefill=0.0):
        """Seconds of each step (arguments broadcast; scalars give a scalar)."""
        return self.features(running, context, prefill, self.knee) @ self.linear

    def stretch_steps(self, k: int, n: int, context0: float, prefill: float = 0.0) -> np.ndarray:
        """(k,) seconds of each step of a stretch (`StepSums.of_stretch`)."""
        pre = np.zeros(k)
        pre[:1] = prefill
        return self.step(n, context0 + n * np.arange(k, dtype=float), pre)

    def stretch(self, k: int, n: int, context0: float, prefill: float = 0.0) -> float:
        """Seconds of a stretch in closed form: `total` of its StepSums, in plain floats (the simulators' inner loop)."""
        cost = (k * (self.c_step * (n > 0) + self.c_seq * n) + self.c_ctx * (k * context0 + n * k * (k - 1) / 2)
                + self.c_prefill * prefill)
        return cost + k * self.c_knee * max(n - self.knee, 0.0) if self.c_knee else cost

    # ---------------------------------------------------------------------------------- summed
    def total(self, sums: StepSums):
        """Seconds of the steps summed in `sums` (a float, or (U,) for U sets)."""
        return self.totals(self.array, sums)[0]

    @staticmethod
    def totals(coefs: np.ndarray, sums: StepSums) -> np.ndarray:
        """Seconds of `sums` under each row of (R, 6) coefficients (COEFS order): (R,) + the sums' shape."""
        c = np.atleast_2d(np.asarray(coefs, float))
        lead = (-1,) + (1,) * np.ndim(sums.steps)  # coefficient rows against the sums' axes

        def col(j: int) -> np.ndarray:
            return c[:, j].reshape(lead)

        t = col(0) * sums.steps + col(1) * sums.running + col(2) * sums.context + col(3) * sums.prefill
        if np.any(c[:, 4] != 0):
            t = t + col(4) * sums.hinge(c[:, 5])
        return t

    # ---------------------------------------------------------------------------------- fitting
    @staticmethod
    def design(running, context, prefill, knee: float | None = None) -> np.ndarray:
        """(N, 4) NNLS columns of the linear form [1, n, context, prefill]; with a knee k, (N, 5)
        [1, min(n, k), max(0, n - k), context, prefill], whose coefficients are all >= 0 (`from_design`)."""
        running = np.asarray(running, float)
        one = np.ones_like(running)
        if knee is None:
            return np.column_stack([one, running, context, prefill])
        return np.column_stack([one, np.minimum(running, knee), _hinge(running, knee), context, prefill])

    @staticmethod
    def from_design(x: np.ndarray, knee: float | None = None) -> EngineStepCost:
        """The cost whose `design(..., knee)` coefficients are x."""
        if knee is None:
            return EngineStepCost(float(x[0]), float(x[1]), float(x[2]), float(x[3]))
        return EngineStepCost(float(x[0]), float(x[1]), float(x[3]), float(x[4]), c_knee=float(x[2] - x[1]), knee=float(knee))

    def design_coef(self) -> np.ndarray:
        """Its coefficients in `design` order: (4,) linear, (5,) with a knee."""
        if not self.c_knee:
            return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill])
        return np.array([self.c_step, self.c_seq, self.c_seq + self.c_knee, self.c_ctx, self.c_prefill])
