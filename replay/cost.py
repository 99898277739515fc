"""The engine-step cost model: one formula, its features, and its sums (an execution-time predictor in
the manner of Vidur's).

One engine step that runs n sequences, holds `context` KV tokens after the step and computes `prefill`
prompt tokens takes

    t = f(n) + c_ctx context + c_prefill prefill,    f(n) = c_step [n > 0] + c_seq n + sum_j d_j max(0, n - k_j)

seconds: f is piecewise linear in n (`EngineStepCost.hinges`: no hinge is the linear form, one the knee form,
one at each inner measured level the interpolated form; replay/calibration.py fits all three). The formula is
linear in its features, so the seconds of any set of steps are the coefficients applied to the features summed
over those steps (`StepSums`, which keep the histogram of n when a hinge needs it): a simulated round, a
stretch of steps, a group of calibration rows, under one coefficient set or a matrix of bootstrap replicates
(`EngineStepCost.totals`). Coefficient arrays are laid out `COEFS` then one (d_j, k_j) pair per hinge; the fits
use a non-negative slope-per-segment parametrisation of the same features (`design`, `from_design`).

Imports numpy only. The formula, its parametrisation and its fits: docs/simulator.md, "The engine-step formula".
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

COEFS = ("c_step", "c_seq", "c_ctx", "c_prefill")  # then (d_j, k_j) per hinge: EngineStepCost.array
FEATURES = ("step", "running", "context", "prefill")  # then one max(0, n - k_j) per knee: EngineStepCost.features


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
        "help": "steps per num_running, (max n + 1,) or (U, max n + 1); needed only to price hinges (None: not kept)"})

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
        L, p = np.asarray(length), np.asarray(prompt)
        S3 = np.asarray(prefill, float).sum(axis=-1)
        if L.dtype.kind in "iu" and p.dtype.kind in "iu":
            # integer lengths: the sums in int64 (L (L - 1) is even); they are exact, as the float sums are below 2^53
            S2 = (L * p).sum(axis=-1) + (L * (L - 1)).sum(axis=-1) // 2
            return cls(steps, L.sum(axis=-1).astype(float), S2.astype(float), S3, hist)
        L, p = L.astype(float), p.astype(float)
        return cls(steps, L.sum(axis=-1), (L * p + L * (L - 1) / 2).sum(axis=-1), S3, hist)

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
        k = np.asarray(knee, float)
        return self.hinges(np.ones(k.shape + (1,)), k[..., None])

    def hinges(self, dslope: np.ndarray, knee: np.ndarray) -> np.ndarray:
        """Sum over steps of sum_j dslope_j max(0, n - knee_j) for (R, K) or (K,) dslopes and knees: (R,) or ()
        + the sums' shape (one pass over the histogram whatever K)."""
        if self.hist is None:
            raise ValueError("a hinge (knee or interpolated form) needs the histogram of num_running over the steps "
                             "(StepSums.hist)")
        h = np.asarray(self.hist, float)
        n = np.arange(h.shape[-1], dtype=float)
        d, k = np.asarray(dslope, float), np.asarray(knee, float)
        grid = np.einsum("...j,...jm->...m", d, _hinge(n, k[..., None]))  # f's hinge part at every n: (R, m) or (m,)
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

    c_step: float = field(metadata={"help": "fixed seconds per engine step, amortised over the batch (weight reads, "
                                            "scheduling)"})
    c_seq: float = field(metadata={"help": "seconds per sequence in the batch, below the first knee"})
    c_ctx: float = field(metadata={"help": "seconds per KV token attended"})
    c_prefill: float = field(metadata={"help": "seconds per prompt token computed"})
    hinges: tuple[tuple[float, float], ...] = field(default=(), kw_only=True, metadata={
        "help": "(knee, slope change) pairs, knees ascending: the per-sequence slope changes by `slope change` above "
                "num_running = knee (none: linear; one: the knee form; one per measured level: interpolated)"})

    # ---------------------------------------------------------------------------------- coefficients
    @property
    def knees(self) -> tuple[float, ...]:
        return tuple(k for k, _ in self.hinges)

    @property
    def dslopes(self) -> tuple[float, ...]:
        return tuple(d for _, d in self.hinges)

    @staticmethod
    def from_array(c) -> EngineStepCost:
        """From coefficients in the array layout (module doc): 4 + 2 x hinges values."""
        c = [float(v) for v in c]
        if len(c) < 4 or len(c) % 2:
            raise ValueError(f"an engine-step coefficient array has 4 + 2 x hinges values, got {len(c)}")
        return EngineStepCost(c[0], c[1], c[2], c[3], hinges=tuple(zip(c[5::2], c[4::2])))

    @property
    def array(self) -> np.ndarray:
        """(4 + 2K,) coefficients [c_step, c_seq, c_ctx, c_prefill, d_1, k_1, ...] (a row of Replicates.gen)."""
        pairs = [v for k, d in self.hinges for v in (d, k)]
        return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill] + pairs, float)

    @property
    def linear(self) -> np.ndarray:
        """(4 + K,) the coefficients of `features`."""
        return np.array([self.c_step, self.c_seq, self.c_ctx, self.c_prefill, *self.dslopes], float)

    @staticmethod
    def scale_array(coefs: np.ndarray, factor) -> np.ndarray:
        """Coefficient rows (..., 4 + 2K) with every time coefficient (all but the knees) times `factor`."""
        c = np.array(coefs, float)
        c[..., :4] *= factor
        c[..., 4::2] *= factor
        return c

    def scaled(self, *, step: float = 1.0, seq: float = 1.0, ctx: float = 1.0, prefill: float = 1.0):
        """The same cost (and type) with c_step, c_ctx, c_prefill scaled and every per-sequence slope (c_seq and
        each slope change) scaled by `seq`; the knees do not move."""
        return replace(self, c_step=self.c_step * step, c_seq=self.c_seq * seq, c_ctx=self.c_ctx * ctx,
                       c_prefill=self.c_prefill * prefill, hinges=tuple((k, d * seq) for k, d in self.hinges))

    # ---------------------------------------------------------------------------------- per step
    @staticmethod
    def features(running, context, prefill=0.0, knees: Sequence[float] = ()) -> np.ndarray:
        """(..., 4 + K) features of steps (arguments broadcast): [n > 0], n, context, prefill, max(0, n - k_j)."""
        n, ctx, pre = np.broadcast_arrays(np.asarray(running, float), np.asarray(context, float),
                                          np.asarray(prefill, float))
        return np.stack([(n > 0).astype(float), n, ctx, pre] + [_hinge(n, k) for k in knees], axis=-1)

    def step(self, running, context, prefill=0.0):
        """Seconds of each step (arguments broadcast; scalars give a scalar)."""
        return self.features(running, context, prefill, self.knees) @ self.linear

    def stretch_steps(self, k: int, n: int, context0: float, prefill: float = 0.0) -> np.ndarray:
        """(k,) seconds of each step of a stretch (`StepSums.of_stretch`)."""
        pre = np.zeros(k)
        pre[:1] = prefill
        return self.step(n, context0 + n * np.arange(k, dtype=float), pre)

    def stretch(self, k: int, n: int, context0: float, prefill: float = 0.0) -> float:
        """Seconds of a stretch in closed form: `total` of its StepSums, in plain floats (the simulators' inner
        loop)."""
        cost = (k * (self.c_step * (n > 0) + self.c_seq * n) + self.c_ctx * (k * context0 + n * k * (k - 1) / 2)
                + self.c_prefill * prefill)
        for knee, d in self.hinges:
            if n > knee:
                cost += k * d * (n - knee)
        return cost

    # ---------------------------------------------------------------------------------- summed
    def total(self, sums: StepSums):
        """Seconds of the steps summed in `sums` (a float, or (U,) for U sets)."""
        return self.totals(self.array, sums)[0]

    @staticmethod
    def totals(coefs: np.ndarray, sums: StepSums) -> np.ndarray:
        """Seconds of `sums` under each row of (R, 4 + 2K) coefficients (array layout): (R,) + the sums' shape."""
        c = np.atleast_2d(np.asarray(coefs, float))
        lead = (-1,) + (1,) * np.ndim(sums.steps)  # coefficient rows against the sums' axes

        def col(j: int) -> np.ndarray:
            return c[:, j].reshape(lead)

        t = col(0) * sums.steps + col(1) * sums.running + col(2) * sums.context + col(3) * sums.prefill
        if np.any(c[:, 4::2] != 0):
            t = t + sums.hinges(c[:, 4::2], c[:, 5::2])
        return t

    # ---------------------------------------------------------------------------------- fitting
    @staticmethod
    def design(running, context, prefill, knees: Sequence[float] = ()) -> np.ndarray:
        """(N, 4 + K) NNLS columns [1, segment ramps of n (module doc), context, prefill] for ascending `knees`
        (none: [1, n, context, prefill]); their coefficients are all >= 0 (`from_design`)."""
        n = np.asarray(running, float)
        k = [float(v) for v in knees]
        if not k:
            ramps = [n]
        else:
            ramps = ([np.minimum(n, k[0])] + [np.clip(n - a, 0.0, b - a) for a, b in zip(k, k[1:])]
                     + [_hinge(n, k[-1])])
        return np.column_stack([np.ones_like(n)] + ramps + [np.asarray(context, float) * np.ones_like(n),
                                                          np.asarray(prefill, float) * np.ones_like(n)])

    @staticmethod
    def from_design(x: np.ndarray, knees: Sequence[float] = ()) -> EngineStepCost:
        """The cost whose `design(..., knees)` coefficients are x: c_seq the first segment's slope, a hinge of the
        slope difference at each knee."""
        x = [float(v) for v in x]
        K = len(knees)
        s = x[1:2 + K]  # the segments' slopes
        hinges = tuple((float(k), s[j + 1] - s[j]) for j, k in enumerate(knees))
        return EngineStepCost(x[0], s[0], x[2 + K], x[3 + K], hinges=hinges)
