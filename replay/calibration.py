"""Calibrated, validated step-cost fits and their bootstrap replicates (intervals).

A run at one batch size runs almost every engine step at the batch's own concurrency, so its rows cannot pin how
the step time grows with concurrency, and on CPU the step time is not one line in concurrency. `rlrun record`
therefore profiles engine steps at a ladder of concurrencies (`calib_gen` rows) and forward + backward passes at a
ladder of token counts (`calib_train` rows); `rlrun calibrate` writes the same alone, for older traces
(`rlsim run --calibration FILE`). Here (`calibrate`, called at the end of `fit.fit_trace`):

- engine step: fitted on calibration + run rows by weighted non-negative least squares, each concurrency level
  weighted alike, in one of three `EngineStepCost` forms (linear, knee, interpolated over the ladder's levels),
  chosen by leave-one-level-out cross-validation; put on the run's clock (`anchor_gen`) and scaled to the run's
  own engine time (`run_level`);
- training: forward + backward seconds interpolated in tokens between the calibration's levels, plus the
  run's per-update fixed cost (`PiecewiseLinear`), cross-validated by leaving one token level out;
- replicates: REPLICATES Bayesian-bootstrap refits of both, turned into the responses/s interval.

Without calibration rows the point fits are those of `fit.py`; a warning names `rlrun calibrate`. Imports
neither torch nor SimPy. The forms, weights, validation and intervals: docs/simulator.md, "Calibration,
validation out of sample, intervals"; what each choice bought: docs/results.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from rlsim.replay.cost import EngineStepCost
from rlsim.replay.device_speed import device_phase
from rlsim.replay.errors import RlsimError
from rlsim.replay.fit_quality import check_fits, flat_span
from rlsim.replay.io import Trace
from rlsim.replay.learning import isotonic
from rlsim.replay.models import INTERVAL, FittedModels, GenStepModel, LevelError, Replicates, Validation
from rlsim.replay.robust import (AffineModel, FitQuality, PiecewiseLinear, fit_affine, fit_quality, hinge_predict,
                                 nnls_gram, nnls_gram_many, robust_location)
from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN, GEN_STEP

KNEE_GRID = 12          # knee candidates, geometric between the second-lowest and second-highest level, at least (and
                        # two per level, so that the grid is finer than a dense ladder's levels)
KNEE_GAIN = 0.8         # the knee form is used when its CV error is below this fraction of the linear form's
REPLICATES = 64         # bootstrap refits for the intervals
MIN_CAL_GEN_ROWS = 8    # calibration engine steps needed to refit the engine-step model on them
TRIM_SIGMAS = 5.0       # rows further than this many robust sigmas from their level's median are dropped
TRIM_MIN = 0.15         # ... but never closer than this relative distance
LEVEL_FULL_ROWS = 8     # a level with fewer rows gets rows/8 of the full weight (fit and CV summary): a step or two
                        # of a run's tail cannot count as much as a calibration rung
KNOT_CAL_ROWS = 3       # a level gets a knot of the interpolated form when it holds at least this many calibration rows
                        # (a rung: a concurrency measured on purpose, at the calibration's short contexts); the run's
                        # own levels (the tails of its rounds, longer contexts, its own clock) lie on the segments
                        # between knots and set the level (anchor_gen, run_level) instead of bending the curve
INTERP_LEVELS = 4       # the interpolated form is used when calibration rungs cover at least this many levels
NO_CALIBRATION = ("{name} has no calibration rows: the engine-step model is fitted on the run's own concurrency "
                  "({lo}..{hi} sequences) and extrapolates beyond it; record with `rlrun record` (calibrates by "
                  "default) or run `rlrun calibrate --out calib.parquet` with the same model on this device and pass "
                  "--calibration calib.parquet")
GEN_COLUMNS = ("duration", "num_running", "context_tokens", "prefill_tokens")
FORMS = ("linear", "knee", "interp")


def level_key(n) -> np.ndarray:
    """Half-octave concurrency level of num_running (1, 1.4, 2, 2.8, 4, ... share keys 0, 1, 2, ...)."""
    return np.rint(2 * np.log2(np.maximum(np.asarray(n, float), 1.0))).astype(np.int64)


# --------------------------------------------------------------------------------------------- engine fit
def _nnls_gram(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} x'Gx - 2g'x (least squares given its normal equations), columns rescaled; G (..., p, p) and
    g (..., p): one problem or a stack of them."""
    d = np.sqrt(np.diagonal(G, axis1=-2, axis2=-1)).copy()
    d[~(d > 0)] = 1.0
    Gs = G / (d[..., :, None] * d[..., None, :]) + 1e-10 * np.eye(g.shape[-1])
    return (nnls_gram_many(Gs, g / d) if g.ndim > 1 else nnls_gram(Gs, g / d)) / d


class _GenProblem:
    """Weighted NNLS of engine-step seconds on features, with a weight per group of rows (a level and a cluster),
    so that refits on subsets of levels (CV) and resamples (bootstrap) reuse one weighted design matrix per set of
    knees (a variant: none, one knee of the grid, the interpolated form's knots with or without a held-out
    level's), made on first use and kept."""

    def __init__(self, n, ctx, pre, y, w, level, cluster, knees: Sequence[float] = (), fixed_c0: float | None = None,
                 cal: np.ndarray | None = None, anchor: np.ndarray | None = None):
        self.level_ids, lev = np.unique(level, return_inverse=True)
        self.cluster_ids, clu = np.unique(cluster, return_inverse=True)
        grp_keys, grp = np.unique(lev * (len(self.cluster_ids) + 1) + clu, return_inverse=True)
        self.grp_level = grp_keys // (len(self.cluster_ids) + 1)
        self.grp_cluster = grp_keys % (len(self.cluster_ids) + 1)
        ng = len(grp_keys)
        self.fixed_c0 = fixed_c0
        self.knee_grid = [float(k) for k in knees]
        self._grp, self._n, self._ctx, self._pre, self._w = grp, n, ctx, pre, w
        self._yw = (y - (fixed_c0 or 0.0)) * w
        self._designs: dict[tuple[float, ...], np.ndarray] = {}
        self._hinge_sums: dict[float, np.ndarray] = {}
        self.Y = np.bincount(grp, weights=y, minlength=ng)
        # summed base features [steps, n, context, prefill] per group (predictions of any form add hinge sums)
        self.S = np.column_stack([np.bincount(grp, weights=v, minlength=ng) for v in (np.ones_like(n), n, ctx, pre)])
        n_lev = len(self.level_ids)
        self.level_center = np.array([np.median(n[lev == i]) for i in range(n_lev)])
        self.level_rows = np.bincount(lev, minlength=n_lev)
        self.level_weight = np.minimum(self.level_rows, LEVEL_FULL_ROWS) / LEVEL_FULL_ROWS
        cal_rows = (np.bincount(lev, weights=np.asarray(cal, float), minlength=n_lev) if cal is not None
                    else np.zeros(n_lev))
        self.knot_level = cal_rows >= KNOT_CAL_ROWS  # the interpolated form's knots (KNOT_CAL_ROWS)
        # groups of calibration rows (their seconds scale with the anchor) and of the run rows that anchor them
        self.grp_cal = (np.bincount(grp, weights=np.asarray(cal, float), minlength=ng) > 0 if cal is not None
                        else np.zeros(ng, bool))
        self.grp_anchor = (np.bincount(grp, weights=np.asarray(anchor, float), minlength=ng) > 0 if anchor is not None
                           else np.zeros(ng, bool))

    def _design(self, knees: tuple[float, ...]) -> np.ndarray:
        """The row-weighted design with these knees (c_step's column left out under the prior)."""
        if knees not in self._designs:
            X = EngineStepCost.design(self._n, self._ctx, self._pre, knees)
            self._designs[knees] = (X[:, 1:] if self.fixed_c0 is not None else X) * self._w[:, None]
        return self._designs[knees]

    def _knee_ok(self, k: float, m_level: np.ndarray) -> bool:
        """Two or more levels with data on each side of the knee."""
        c = self.level_center[m_level > 0]
        return int(np.sum(c < k)) >= 2 and int(np.sum(c > k)) >= 2

    def knots(self, m_level: np.ndarray | None = None) -> np.ndarray:
        """Centres of the knot levels with data under level weights m_level (default: all): the interpolated form's
        knots, the first and last of which only end the first and last segments."""
        present = self.knot_level if m_level is None else self.knot_level & (m_level > 0)
        return np.sort(self.level_center[present])

    def _candidates(self, form: str, m_level: np.ndarray) -> list[tuple[float, ...]]:
        """The knee sets `form` may use with data on these levels (`design`'s knees)."""
        if form == "linear":
            return [()]
        if form == "knee":  # `_knee_ok` of every knee of the grid at once
            c, k = self.level_center[m_level > 0], np.asarray(self.knee_grid)[:, None]
            ok = (np.sum(c < k, axis=1) >= 2) & (np.sum(c > k, axis=1) >= 2)
            return [(knee,) for knee, good in zip(self.knee_grid, ok) if good]
        if form == "interp":
            c = self.knots(m_level)
            return [tuple(float(v) for v in c[1:-1])] if len(c) >= 2 else []
        raise ValueError(f"unknown engine-step form {form!r} (one of {', '.join(FORMS)})")

    def fit(self, m_grp: np.ndarray, form: str, cal_factor: float = 1.0) -> np.ndarray | None:
        """Coefficients (replay.cost array layout) of `form` on groups weighted by m_grp, the calibration rows'
        seconds times `cal_factor`; of several knee sets, the one of least weighted SS (None: none applies)."""
        m_level = np.bincount(self.grp_level, weights=m_grp, minlength=len(self.level_ids))
        m = m_grp[self._grp]
        yw = np.where(self.grp_cal, cal_factor, 1.0)[self._grp] * self._yw
        cands = self._candidates(form, m_level)  # knee sets of one size: one stack of problems
        if not cands:
            return None
        designs = [self._design(knees) for knees in cands]
        my = m * yw
        G = np.stack([Xw.T @ (Xw * m[:, None]) for Xw in designs])
        g = np.stack([Xw.T @ my for Xw in designs])
        best, best_ss, best_k = None, math.inf, ()
        for knees, x, Gk, gk in zip(cands, _nnls_gram(G, g), G, g):
            ss = float(m @ yw ** 2 - 2 * x @ gk + x @ Gk @ x)
            if ss < best_ss:
                best, best_ss, best_k = x, ss, knees
        if self.fixed_c0 is not None:
            best = np.concatenate([[self.fixed_c0], best])
        return EngineStepCost.from_design(best, best_k).array

    def predict_groups(self, coefs: np.ndarray) -> np.ndarray:
        """Predicted summed seconds of every group under `coefs` (any form): summed features times coefficients."""
        c = np.asarray(coefs, float)
        t = self.S @ c[:4]
        for d, k in zip(c[4::2], c[5::2]):
            if d:
                if k not in self._hinge_sums:
                    self._hinge_sums[k] = np.bincount(self._grp, weights=np.maximum(self._n - k, 0.0),
                                                      minlength=len(self.Y))
                t = t + d * self._hinge_sums[k]
        return t

    def cross_validate(self, form: str) -> tuple[float, float, tuple[LevelError, ...]]:
        """Leave one level out: (RMS, max |error|, per level) of its summed seconds predicted from the rest (for the
        interpolated form without the level's knot: between its neighbours, or along the end segment beyond them);
        the RMS weighs levels of fewer than LEVEL_FULL_ROWS rows less (as the fit does), the max is over full levels."""
        errs = []
        for li in range(len(self.level_ids)):
            m = (self.grp_level != li).astype(float)
            coefs = self.fit(m, form)
            if coefs is None:
                return math.nan, math.nan, ()
            pred = self.predict_groups(coefs)
            sel = self.grp_level == li
            meas = float(self.Y[sel].sum())
            errs.append(LevelError(float(self.level_center[li]), int(self.level_rows[li]),
                                   float(pred[sel].sum() / meas - 1) if meas > 0 else math.nan))
        return (*_cv_summary(np.array([x.rel_err for x in errs]), self.level_weight, self.level_rows), tuple(errs))


def _cv_summary(e: np.ndarray, weight: np.ndarray, rows: np.ndarray) -> tuple[float, float]:
    """(weighted RMS, max |error| over full levels, else over all) of held-out relative errors."""
    ok = np.isfinite(e)
    if not ok.any():
        return math.nan, math.nan
    full = ok & (rows >= LEVEL_FULL_ROWS)
    worst = float(np.max(np.abs(e[full if full.any() else ok])))
    return float(np.sqrt(np.sum(weight[ok] * e[ok] ** 2) / np.sum(weight[ok]))), worst


def _weighted_median(v: np.ndarray, w: np.ndarray) -> float:
    o = np.argsort(v)
    c = np.cumsum(w[o])
    return float(v[o][np.searchsorted(c, 0.5 * c[-1])])


def _trim(y: np.ndarray, level: np.ndarray, prefill: np.ndarray) -> np.ndarray:
    """Rows kept: within TRIM_SIGMAS robust sigmas (at least TRIM_MIN) of their (level, prefill?) median, in log."""
    keep = np.ones(len(y), bool)
    key = level * 2 + (prefill > 0)
    ly = np.log(np.maximum(y, 1e-12))
    for k in np.unique(key):
        m = key == k
        if m.sum() < 5:
            continue
        med = np.median(ly[m])
        s = 1.4826 * np.median(np.abs(ly[m] - med))
        keep[m] = np.abs(ly[m] - med) <= max(TRIM_SIGMAS * s, math.log1p(TRIM_MIN))
    return keep


def knee_grid(centers: np.ndarray, k: int | None = None) -> list[float]:
    """Knee candidates: k (default: KNEE_GRID, or two per level if more) geometric between the second-lowest and
    second-highest level centre (>= 4 levels)."""
    c = np.unique(np.asarray(centers, float))
    if len(c) < 4:
        return []
    lo, hi = c[1], c[-2]
    if hi <= lo:
        return []
    return [float(v) for v in np.unique(np.round(np.geomspace(lo, hi, k or max(KNEE_GRID, 2 * len(c))), 3))]


@dataclass(frozen=True, eq=False)
class GenFit:
    """The engine-step fit of `fit_gen_calibrated`."""

    coef: np.ndarray = field(metadata={"help": "(4 + 2K,) coefficients of the form used (replay.cost array layout)"})
    form: str = field(metadata={"help": "linear | knee | interp"})
    problem: _GenProblem = field(metadata={"help": "the weighted NNLS by groups of rows (refits for CV and the "
                                                   "bootstrap)"})
    cv: dict[str, tuple[float, float, tuple[LevelError, ...]]] = field(metadata={
        "help": "form -> leave-one-level-out (RMS, max |error|, per level)"})
    r2: float = field(metadata={"help": "R2 on the rows used"})
    rows: int = field(metadata={"help": "rows used"})
    dropped: int = field(metadata={"help": "rows left out (invalid, trimmed)"})
    concurrency_range: tuple[int, int] = field(metadata={"help": "min and max num_running of the rows used"})
    notes: tuple[str, ...] = field(metadata={"help": "the form chosen and why"})

    @property
    def knots(self) -> int:
        """Measured levels the interpolated form has knots at (0 for the other forms)."""
        return len(self.problem.knots()) if self.form == "interp" else 0


def fit_gen_calibrated(rows: dict[str, np.ndarray], *, forms: Sequence[str] = FORMS,
                       knees: Sequence[float] | None = None, cal: np.ndarray | None = None,
                       anchor: np.ndarray | None = None) -> GenFit:
    """Fit the engine-step model on rows (duration, num_running, context_tokens, prefill_tokens), every level
    weighted alike. `cal` (bool per row): the calibration rows (None: all rows are); `anchor`: the run rows that
    anchor them (bootstrap). The interpolated form when calibration rungs cover INTERP_LEVELS levels, else linear
    or knee by leave-one-level-out CV; every form's CV is kept. `knees`: knee candidates (default: grid)."""
    y, n, ctx, pre = (np.asarray(rows[k], float) for k in GEN_COLUMNS)
    ok = np.isfinite(y) & (y > 0) & (n > 0) & np.isfinite(ctx) & np.isfinite(pre)
    lev = level_key(n)
    ok &= _trim(np.where(ok, y, 1.0), lev, pre)
    dropped = int((~ok).sum())
    y, n, ctx, pre, lev = y[ok], n[ok], ctx[ok], pre[ok], lev[ok]
    cal = np.asarray(cal, bool)[ok] if cal is not None else np.ones(len(y), bool)
    anchor = np.asarray(anchor, bool)[ok] if anchor is not None else None
    if len(np.unique(lev)) < 3:
        raise RlsimError(f"calibration covers {len(np.unique(lev))} concurrency levels; at least 3 are needed "
                         "(re-run `rlrun calibrate`)")
    w, centers = _level_weights(y, n, lev)
    grid = (list(knees) if knees is not None else knee_grid(centers)) if "knee" in forms else []
    prob = _GenProblem(n, ctx, pre, y, w, lev, np.arange(len(y)), grid, cal=cal, anchor=anchor)  # clusters: rows
    cv = {"linear": prob.cross_validate("linear")}
    if grid:
        cv["knee"] = prob.cross_validate("knee")
    if "interp" in forms and int(prob.knot_level.sum()) >= INTERP_LEVELS:
        cv["interp"] = prob.cross_validate("interp")
    form = "interp" if set(forms) == {"interp"} and "interp" in cv else _choose_form(cv)
    coef = prob.fit(np.ones(len(prob.grp_level)), form)
    if form == "knee":
        coef = _refine_knee(coef, grid, prob, (n, ctx, pre, y, w))
    pred = EngineStepCost.from_array(coef).step(n, ctx, pre)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return GenFit(coef=coef, form=form, problem=prob, cv=cv, r2=r2, rows=len(y), dropped=dropped,
                  concurrency_range=(int(n.min()), int(n.max())), notes=_form_note(form, cv, prob, coef))


def _level_weights(y: np.ndarray, n: np.ndarray, lev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row weights 1 / (sqrt(rows) x median seconds) of its level, times sqrt(rows / LEVEL_FULL_ROWS) up to 1:
    each full level counts alike in squared relative error; level centres)."""
    ul, inv = np.unique(lev, return_inverse=True)
    cnt = np.bincount(inv)
    med = np.array([np.median(y[inv == i]) for i in range(len(ul))])
    lw = np.minimum(cnt, LEVEL_FULL_ROWS) / LEVEL_FULL_ROWS
    return np.sqrt(lw[inv]) / (np.sqrt(cnt[inv]) * med[inv]), np.array([np.median(n[inv == i]) for i in range(len(ul))])


def _choose_form(cv: dict[str, tuple]) -> str:
    """By held-out error: the knee form when its CV error is below KNEE_GAIN x the linear form's, else linear; the
    interpolated form (a calibration ladder exists) when its CV error is at most that parametric form's, so the
    measured curve is used between its levels unless the ladder is too noisy for it to predict a held-out level."""
    lin, kn = cv["linear"][0], cv.get("knee", (math.nan,))[0]
    best = "knee" if math.isfinite(kn) and (not math.isfinite(lin) or kn < KNEE_GAIN * lin) else "linear"
    it = cv.get("interp", (math.nan,))[0]
    return "interp" if math.isfinite(it) and not (cv[best][0] < it) else best


def _form_note(form: str, cv: dict[str, tuple], prob: _GenProblem, coef: np.ndarray) -> tuple[str, ...]:
    """What the form is and the held-out errors of the forms it was chosen among."""
    pct = lambda v: f"{100 * v:.1f}%" if math.isfinite(v) else "n/a"  # noqa: E731
    lin, kn = cv["linear"][0], cv.get("knee", (math.nan,))[0]
    if form == "interp":
        return (f"engine-step time interpolated over {len(prob.knots())} measured concurrency levels (non-decreasing, "
                f"piecewise linear; straight beyond the end levels): held-out levels {pct(cv['interp'][0])} (RMS) vs "
                f"{pct(lin)} linear and {pct(kn)} with one knee",)
    it = cv.get("interp", (math.nan,))[0]
    beside = f" and {pct(it)} interpolated over the measured levels" if math.isfinite(it) else ""
    if form == "knee":
        return ("the engine-step time is not one line in concurrency: the linear form misses held-out levels by "
                f"{pct(lin)} (RMS), a knee at {coef[5]:.0f} running by {pct(kn)}{beside}; the knee form is used",)
    if not math.isfinite(kn):
        return ()
    return (f"linear engine-step form kept: held-out levels {pct(lin)} (RMS) vs {pct(kn)} with a knee{beside}",)


def _refine_knee(coef: np.ndarray, grid: list[float], prob: _GenProblem, rows: tuple[np.ndarray, ...]) -> np.ndarray:
    """The knee form refitted with its knee searched between the grid's neighbours of the one chosen."""
    n, ctx, pre, y, w = rows
    i = grid.index(float(coef[5]))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best_ss = math.inf
    for kk in np.geomspace(lo, hi, 25):
        if not prob._knee_ok(kk, np.ones(len(prob.level_ids))):
            continue
        Xw = EngineStepCost.design(n, ctx, pre, (kk,)) * w[:, None]
        x = _nnls_gram(Xw.T @ Xw, Xw.T @ (y * w))
        ss = float(np.sum((Xw @ x - y * w) ** 2))
        if ss < best_ss:
            best_ss, coef = ss, EngineStepCost.from_design(x, (float(kk),)).array
    return coef


def bootstrap_gen(prob: _GenProblem, form: str, reps: int, rng: np.random.Generator, by: str = "level") -> np.ndarray:
    """(reps, 4 + 2K) coefficient sets refitted under Bayesian-bootstrap weights (independent Exp(1) draws, i.e.
    Dirichlet weights: no level is dropped whole, which would make the knee form swing and would take a knot
    out of the interpolated form): `by`="level", a weight per concurrency level times a weight per cluster (row)
    within it (two stages: which levels there are, and the noise within each); "cluster", a weight per cluster
    (an RL step of a run)."""
    n_lev = len(prob.level_ids)
    n_clu = len(prob.cluster_ids)
    out = []
    tries = 0
    while len(out) < reps and tries < 4 * reps:
        tries += 1
        m = rng.exponential(1.0, n_clu)[prob.grp_cluster]
        if by == "level":
            m = m * rng.exponential(1.0, n_lev)[prob.grp_level]
        f = 1.0
        if prob.grp_cal.any() and prob.grp_anchor.sum() >= 5:
            # the anchor re-estimated under the same weights: the calibration alone, against the run's anchor rows
            cc = prob.fit(m * prob.grp_cal, form)
            if cc is None:
                continue
            pred = prob.predict_groups(cc)[prob.grp_anchor]
            lr = np.log(np.maximum(prob.Y[prob.grp_anchor], 1e-12) / np.maximum(pred, 1e-12))
            f = float(np.exp(_weighted_median(lr, m[prob.grp_anchor])))
        if len(np.unique(prob.grp_level[m > 0])) < (4 if form == "knee" else 2):
            continue
        c = prob.fit(m, form, cal_factor=f)
        if c is not None:
            out.append(c)
    return np.array(out) if out else np.zeros((0, 4))


# --------------------------------------------------------------------------------------------- training fit
def _token_levels(tok: np.ndarray, dur: np.ndarray, level: np.ndarray):
    """(median tokens ascending, median seconds, passes, each pass's index into them) of the token levels; levels
    of equal median tokens are one level."""
    ul, inv = np.unique(level, return_inverse=True)
    x, idx = np.unique([np.median(tok[inv == i]) for i in range(len(ul))], return_inverse=True)
    row = idx[inv]
    y = np.array([np.median(dur[row == i]) for i in range(len(x))])
    return x, y, np.bincount(row, minlength=len(x)), row


def _fb_coefs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (`PiecewiseLinear.array`) of the non-decreasing interpolation through level medians: isotonic
    first (a level measured slower than the next larger one is noise: forward + backward does not get faster
    with more tokens)."""
    return PiecewiseLinear.coefs(x, isotonic(y))


@dataclass(frozen=True)
class TrainFit:
    """Forward + backward seconds vs tokens of `fit_train_calibrated`: interpolated through the token levels."""

    curve: PiecewiseLinear = field(metadata={"help": "forward + backward seconds (no optimizer step) vs tokens"})
    cv: float = field(metadata={"help": "RMS relative error of held-out token levels"})
    cv_max: float = field(metadata={"help": "largest |relative error| of a held-out token level"})
    levels: tuple[LevelError, ...] = field(metadata={"help": "held-out errors per token level"})
    r2: float = field(metadata={"help": "R2 of the curve on the calibration passes"})
    rows: int = field(metadata={"help": "calibration passes used"})


def fit_train_calibrated(tok, dur, level) -> TrainFit:
    """Forward + backward seconds vs tokens over the calibration's token levels: linear in tokens between the
    level medians (made non-decreasing), along the line through the two end levels beyond either end; with
    leave-one-level-out errors (a held-out level predicted from the others: between its neighbours, or beyond
    the remaining ends)."""
    tok, dur, level = (np.asarray(a, float) for a in (tok, dur, level))
    ok = np.isfinite(tok) & np.isfinite(dur) & (tok > 0) & (dur > 0)
    tok, dur, level = tok[ok], dur[ok], level[ok]
    x, y, n, _ = _token_levels(tok, dur, level)
    if len(x) < 2:
        raise RlsimError(f"calibration has {len(x)} training token levels; at least 2 are needed (re-run `rlrun "
                         "calibrate`)")
    errs = []
    if len(x) >= 3:
        for i in range(len(x)):
            m = np.arange(len(x)) != i
            errs.append(LevelError(float(x[i]), int(n[i]),
                                   float(hinge_predict(_fb_coefs(x[m], y[m]), x[i]) / y[i] - 1)))
    e = np.array([v.rel_err for v in errs])
    knots, values = tuple(float(v) for v in x), tuple(float(v) for v in isotonic(y))
    pred = hinge_predict(PiecewiseLinear.coefs(knots, values), tok)
    q = fit_quality(pred[:, None], dur, np.ones(1), 0, f"interpolated through {len(x)} token levels' medians")
    curve = PiecewiseLinear("forward+backward", "tokens", knots, values, q)
    return TrainFit(curve, float(np.sqrt(np.mean(e**2))) if len(e) else math.nan,
                    float(np.max(np.abs(e))) if len(e) else math.nan, tuple(errs), q.r2, int(len(tok)))


# --------------------------------------------------------------------------------------------- sources
def _identity(t: Trace) -> dict[str, Any]:
    m, h, e = t.meta.get("model") or {}, t.meta.get("hardware") or {}, t.meta.get("engine") or {}
    return {"model": m.get("name"), "parameters": m.get("parameters"), "device": h.get("device"),
            "device_name": h.get("device_name"), "dtype": e.get("dtype")}


def threads_of(t: Trace) -> int | None:
    """CPU threads the trace's timings were taken at (its calibration's, else the run's torch threads)."""
    c, h = t.meta.get("calibration") or {}, t.meta.get("hardware") or {}
    v = c.get("threads") or h.get("torch_threads")
    return int(v) if v else None


def check_compatible(ref: Trace, cal: Trace) -> None:
    """One-line RlsimError unless `cal` was calibrated with the same model on the same kind of device."""
    a, b = _identity(ref), _identity(cal)
    for key, what in (("model", "model"), ("parameters", "model size (parameters)"), ("device", "device type"),
                      ("device_name", "device"), ("dtype", "dtype")):
        if a[key] is not None and b[key] is not None and a[key] != b[key]:
            raise RlsimError(f"{cal.path} was calibrated with {what} {b[key]!r}, the trace {ref.name} ran with "
                             f"{a[key]!r}: a calibration applies only to the same model on the same device; run `rlrun "
                             "calibrate` with the trace's model on its device")
    if not (cal.count(CALIB_GEN) or cal.count(CALIB_TRAIN)):
        raise RlsimError(f"{cal.path} has no calibration rows (calib_gen / calib_train); make one with "
                         "`rlrun calibrate --out calib.parquet`")


def _rows(traces: Sequence[Trace], kind: str, cols: Sequence[str]) -> dict[str, np.ndarray]:
    """Calibration rows of `kind` over the traces at the run's threads (one device's rows are `device_speed`'s)."""
    out = {c: [] for c in cols}
    for t in traces:
        r = t.rows(kind)
        keep = ~device_phase(t, kind)
        for c in cols:
            out[c].append(np.asarray(r[c], float)[keep])
    return {c: (np.concatenate(v) if v else np.zeros(0)) for c, v in out.items()}


# --------------------------------------------------------------------------------------------- entry point
def anchor_rows(n_run: np.ndarray) -> np.ndarray:
    """The run rows that anchor the calibration: its main concurrency level (most rows) and the neighbours."""
    key = level_key(n_run)
    if not len(key):
        return np.zeros(0, bool)
    return np.abs(key - np.bincount(key).argmax()) <= 1


def anchor_gen(cal: dict[str, np.ndarray], run: dict[str, np.ndarray]) -> float:
    """Factor s that puts the calibration on the run's clock: the run's steps at its main concurrency level
    (the half-octave with most run rows, and its neighbours) over what a fit of the calibration rows alone
    predicts for them. A shared machine (or a calibration file from another day) can run at another speed
    during the calibration than during the run; the calibration then gives the shape in concurrency, the
    run its level. nan when not estimable."""
    n_run = np.asarray(run["num_running"], float)
    if len(n_run) < 5 or len(cal["duration"]) < 8:
        return math.nan
    m = anchor_rows(n_run)
    try:
        f = fit_gen_calibrated(cal)
    except RlsimError:
        return math.nan
    pred = EngineStepCost.from_array(f.coef).step(n_run[m], np.asarray(run["context_tokens"], float)[m],
                                                  np.asarray(run["prefill_tokens"], float)[m])
    ratio = np.asarray(run["duration"], float)[m] / np.maximum(pred, 1e-12)
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    return float(np.exp(np.median(np.log(ratio)))) if len(ratio) >= 5 else math.nan


def run_level(coef: np.ndarray, run: dict[str, np.ndarray], min_rows: int = 20) -> float:
    """Sum of the run's engine-step seconds over the sum the coefficients predict for those steps (nan with too few
    run steps, e.g. a calibration measured on another thread count, whose run rows are set aside)."""
    y = np.asarray(run["duration"], float)
    n = np.asarray(run["num_running"], float)
    ok = np.isfinite(y) & (n > 0)
    if ok.sum() < min_rows:
        return math.nan
    pred = EngineStepCost.from_array(coef).step(n[ok], np.asarray(run["context_tokens"], float)[ok],
                                                np.asarray(run["prefill_tokens"], float)[ok])
    tot = float(pred.sum())
    return float(y[ok].sum()) / tot if tot > 0 else math.nan


def calibrate(models: FittedModels, traces: Sequence[Trace], gen_rows: dict[str, np.ndarray], *, upd_proper: np.ndarray,
              n_tok: np.ndarray, t_opt: np.ndarray, sel: np.ndarray, t_fb: np.ndarray | None = None,
              calibration: Sequence[Trace] = (), reps: int = REPLICATES, seed: int = 0,
              ref_rows: np.ndarray | None = None) -> FittedModels:
    """`models` (FittedModels of `fit_trace`) with calibrated engine-step and update models when calibration
    rows exist (in the first trace or in `calibration`), and with validation and replicates in every case.
    `ref_rows` (bool per update row): the reference trace's; a calibrated update model is anchored to those
    alone, since traces recorded at other times ran at another machine speed."""
    ref = traces[0]
    for c in calibration:
        check_compatible(ref, c)
    rng = np.random.default_rng(seed)
    warnings, notes = list(models.warnings), []
    src = _Sources.of(ref, calibration, gen_rows, sel & np.isfinite(upd_proper) & np.isfinite(n_tok), notes)
    calibrated = len(src.cal_gen["duration"]) >= MIN_CAL_GEN_ROWS
    if calibrated:
        gen = _gen_calibrated(ref, src, reps, rng, warnings, notes)
    else:
        gen = _gen_run_only(ref, models.gen, src, reps, rng, warnings)
    upd_ok = src.upd_ok
    calibrated_train = len(np.unique(src.cal_train["calib_level"][np.isfinite(src.cal_train["calib_level"])])) >= 2
    if calibrated_train and ref_rows is not None and (upd_ok & ref_rows).sum() >= 3:
        upd_ok = upd_ok & ref_rows
    run_upd = _RunUpdates(tokens=n_tok[upd_ok], seconds=upd_proper[upd_ok], t_opt=t_opt[upd_ok],
                          t_fb=np.asarray(t_fb, float)[upd_ok] if t_fb is not None else None, t_opt_all=t_opt)
    if calibrated_train:
        train = _train_calibrated(src.cal_train, run_upd, reps, rng, notes)
    else:
        train = _Part(models.update, _bootstrap_update_rows(run_upd.tokens, run_upd.seconds, run_upd.t_opt, reps, rng),
                      dict(train_r2=models.update.quality.r2,
                           train_source=f"{len(run_upd.tokens)} run updates only (no calibration)"),
                      f"{len(run_upd.tokens)} updates")
    out = _with_validation(models, gen, train, calibrated=calibrated, warnings=warnings, notes=notes)
    unusable = check_fits(out.validation, len(out.recorded.step)).warning(ref.name, ref.config)  # the one rule
    return replace(out, warnings=out.warnings + (unusable,)) if unusable else out


def _foreign(ref: Trace, calibration: Sequence[Trace]) -> list[Trace]:
    """The calibrations at another thread count than the run's (`rlrun calibrate --threads`, for a split side's
    cores): each stands for that device as measured, its rows alone, not anchored to the run's clock (the run ran
    on more threads); when there are any, the fits use only theirs."""
    return [c for c in calibration if threads_of(c) and threads_of(ref) and threads_of(c) != threads_of(ref)]


def _cal_sources(ref: Trace, calibration: Sequence[Trace]) -> list[Trace]:
    """The traces whose calibration rows the fits use: the foreign calibrations when there are any, else all."""
    return _foreign(ref, calibration) or [ref] + list(calibration)


def calibrates_gen(ref: Trace, calibration: Sequence[Trace] = ()) -> bool:
    """Whether `calibrate` refits the engine-step model on calibration rows (then it replaces the run-only fit)."""
    return len(_rows(_cal_sources(ref, calibration), CALIB_GEN, ("duration",))["duration"]) >= MIN_CAL_GEN_ROWS


@dataclass(frozen=True, eq=False)
class _Sources:
    """The rows the calibrated fits use: calibration rows (scaled later) and the run's own."""

    cal_gen: dict[str, np.ndarray] = field(metadata={"help": "calib_gen rows: duration, num_running, context_tokens, "
                                                             "prefill_tokens"})
    cal_train: dict[str, np.ndarray] = field(metadata={"help": "calib_train rows: duration, num_tokens, calib_level"})
    run: dict[str, np.ndarray] = field(metadata={"help": "the run's gen_step rows after warm-up (empty for a foreign "
                                                         "calibration)"})
    rounds: np.ndarray = field(metadata={"help": "(run rows,) RL step of each run row (bootstrap clusters)"})
    upd_ok: np.ndarray = field(metadata={"help": "(updates,) update rows usable (none for a foreign calibration)"})

    @classmethod
    def of(cls, ref: Trace, calibration: Sequence[Trace], gen_rows: dict[str, np.ndarray], upd_ok: np.ndarray,
           notes: list[str]) -> _Sources:
        foreign, sources = _foreign(ref, calibration), _cal_sources(ref, calibration)
        run_keep = (gen_rows["step"] != 0) if np.any(gen_rows["step"] != 0) else np.ones(len(gen_rows["step"]), bool)
        run_keep &= np.isfinite(gen_rows["duration"]) & (gen_rows["num_running"] > 0)
        run = {k: np.asarray(gen_rows[k], float)[run_keep] for k in GEN_COLUMNS}
        rounds = np.asarray(gen_rows.get("round", np.zeros(len(run_keep))), float)[run_keep]
        if foreign:
            run = {k: v[:0] for k, v in run.items()}
            rounds = rounds[:0]
            upd_ok = np.zeros_like(upd_ok)
            notes.append(f"calibration at {threads_of(foreign[0])} thread(s) (the run: {threads_of(ref)}): engine "
                         "steps and training passes as measured there, not rescaled to the run; the optimizer step "
                         "from the run")
        return cls(cal_gen=_rows(sources, CALIB_GEN, GEN_COLUMNS),
                   cal_train=_rows(sources, CALIB_TRAIN, ("duration", "num_tokens", "calib_level")),
                   run=run, rounds=rounds, upd_ok=upd_ok)


@dataclass(frozen=True, eq=False)
class _Part:
    """One refitted model (engine step or update) with its bootstrap replicates and validation fields."""

    model: GenStepModel | AffineModel | PiecewiseLinear = field(metadata={"help": "the point fit"})
    reps: np.ndarray = field(metadata={"help": "(R, 4 + 2K) engine-step or (R, 2 + 2K) update coefficient replicates "
                                               "(the array layouts of EngineStepCost and PiecewiseLinear)"})
    validation: dict[str, Any] = field(metadata={"help": "Validation fields of this part"})
    method: str = field(metadata={"help": "what the replicates resampled"})


def _gen_calibrated(ref: Trace, src: _Sources, reps: int, rng: np.random.Generator, warnings: list[str],
                    notes: list[str]) -> _Part:
    """The engine-step fit on calibration + run rows, the calibration put on the run's clock (`anchor_gen`),
    the form chosen by `fit_gen_calibrated`, the level set by the run's total (`run_level`)."""
    cg, run = src.cal_gen, src.run
    s_gen = anchor_gen(cg, run)
    if math.isfinite(s_gen):
        cg = {**cg, "duration": cg["duration"] * s_gen}
        notes.append(f"calibration steps scaled by {s_gen:.3g} to the run's own steps at its concurrency (the machine "
                     f"ran {'slower' if s_gen < 1 else 'faster'} during the calibration than during the run)"
                     if abs(s_gen - 1) > 0.05 else f"calibration and run agree at the run's concurrency (x{s_gen:.3g})")
        if abs(math.log(s_gen)) > math.log(1.25):
            warnings.append(f"{ref.name}: the calibration's engine steps ran {s_gen:.2f}x the run's speed at the run's "
                            "concurrency (a busy machine or another machine state); they were rescaled to the run, "
                            "which assumes the slowdown was uniform across concurrencies")
    both = {k: np.concatenate([cg[k], run[k]]) for k in run}
    n_cal = len(cg["duration"])
    is_cal = np.arange(n_cal + len(run["duration"])) < n_cal
    anchor = np.concatenate([np.zeros(n_cal, bool), anchor_rows(run["num_running"])]) if math.isfinite(s_gen) else None
    gf = fit_gen_calibrated(both, cal=is_cal, anchor=anchor)
    # The level: the level-weighted fit gives the run's own concurrencies one vote among the calibration's
    # levels, so where the curve is not one line it can pass a few % off the run's operating point (and its
    # anchor is a median at one level). What the run's engine steps took in total is measured: scale the
    # times (not the knees) so that the fit sums to it over the run's own steps.
    level = run_level(gf.coef, run)
    cost = EngineStepCost.from_array(EngineStepCost.scale_array(gf.coef, level) if math.isfinite(level) else gf.coef)
    if math.isfinite(level) and abs(level - 1) > 0.01:
        notes.append(f"engine-step fit scaled by {level:.3g} to the run's total engine time over its own steps")
    q = _gen_quality(cost, both, gf, dropped=gf.dropped + ref.dropped_rows(GEN_STEP))
    gen = GenStepModel(cost.c_step, cost.c_seq, cost.c_ctx, cost.c_prefill, quality=q, prior=False,
                       concurrency_range=gf.concurrency_range, hinges=cost.hinges, form=gf.form)
    notes += gf.notes
    gen_reps = bootstrap_gen(gf.problem, gf.form, reps, rng, by="level")
    if math.isfinite(level) and len(gen_reps):
        gen_reps = EngineStepCost.scale_array(gen_reps, level)
    cv_used = gf.cv[gf.form]
    source = (f"{len(cg['duration'])} calibration steps + {len(run['duration'])} run steps, "
              f"{len(gf.problem.level_ids)} concurrency levels {gf.concurrency_range[0]}..{gf.concurrency_range[1]}")
    val = dict(gen_form=gf.form, gen_knee=cost.knees[0] if gf.form == "knee" else math.nan, gen_r2=gf.r2,
               gen_cv=cv_used[0], gen_cv_max=cv_used[1], gen_cv_linear=gf.cv["linear"][0],
               gen_cv_knee=gf.cv.get("knee", (math.nan,))[0], gen_cv_interp=gf.cv.get("interp", (math.nan,))[0],
               gen_knots=gf.knots, gen_levels=cv_used[2], gen_source=source)
    return _Part(gen, gen_reps, val, f"{len(gf.problem.level_ids)} concurrency levels")


def _gen_quality(cost: EngineStepCost, rows: dict[str, np.ndarray], gf: GenFit, dropped: int) -> FitQuality:
    """FitQuality of the (rescaled) calibrated cost on the calibration and run rows."""
    ok = np.isfinite(rows["duration"]) & (rows["num_running"] > 0)
    y = rows["duration"][ok]
    res = y - cost.step(rows["num_running"][ok], rows["context_tokens"][ok], rows["prefill_tokens"][ok])
    rel = np.abs(res) / np.maximum(y, 1e-12)
    return FitQuality(n=gf.rows, r2=gf.r2, rmse=float(np.sqrt(np.mean(res**2))), median_rel_err=float(np.median(rel)),
                      p95_rel_err=float(np.percentile(rel, 95)), dropped=dropped,
                      method=f"calibrated {gf.form} (level-weighted nnls)")


def _gen_run_only(ref: Trace, gen: GenStepModel, src: _Sources, reps: int, rng: np.random.Generator,
                  warnings: list[str]) -> _Part:
    """Without calibration rows: fit.py's point fit kept, with the validation and replicates of the run rows'
    own (linear, unweighted) fit."""
    lo, hi = gen.concurrency_range
    warnings.append(NO_CALIBRATION.format(name=ref.name, lo=lo, hi=hi))
    run = src.run
    y = run["duration"]
    prob = _GenProblem(run["num_running"], run["context_tokens"], run["prefill_tokens"], y, np.ones(len(y)),
                       level_key(run["num_running"]), src.rounds, fixed_c0=gen.c_step if gen.prior else None)
    cv = prob.cross_validate("linear") if len(prob.level_ids) >= 3 else (math.nan, math.nan, ())
    val = dict(gen_form="linear", gen_knee=math.nan, gen_r2=gen.quality.r2, gen_cv=cv[0], gen_cv_max=cv[1],
               gen_cv_linear=cv[0], gen_cv_knee=math.nan, gen_levels=cv[2],
               gen_source=f"{len(y)} run steps only, {lo}..{hi} running (no calibration)")
    gen_reps = (bootstrap_gen(prob, "linear", reps, rng, by="cluster") if len(prob.cluster_ids) >= 3
                else np.zeros((0, 4)))
    return _Part(gen, gen_reps, val, f"{len(prob.cluster_ids)} RL steps")


@dataclass(frozen=True, eq=False)
class _RunUpdates:
    """The run's update rows a training fit uses (all arrays (updates used,) unless named otherwise)."""

    tokens: np.ndarray = field(metadata={"help": "tokens trained"})
    seconds: np.ndarray = field(metadata={"help": "update seconds without batch preparation"})
    t_opt: np.ndarray = field(metadata={"help": "optimizer-step seconds"})
    t_fb: np.ndarray | None = field(metadata={"help": "forward + backward seconds (None: not recorded)"})
    t_opt_all: np.ndarray = field(metadata={"help": "(all updates,) optimizer-step seconds (when no update row is "
                                                    "usable)"})


def _train_calibrated(ct: dict[str, np.ndarray], run: _RunUpdates, reps: int, rng: np.random.Generator,
                      notes: list[str]) -> _Part:
    """Forward + backward seconds interpolated over the calibration's token levels (on the run's clock when the
    run's forward + backward seconds allow), plus the per-update fixed cost from the run's updates."""
    tok_run, upd_run = run.tokens, run.seconds
    tf = fit_train_calibrated(ct["num_tokens"], ct["duration"], ct["calib_level"])
    s_train = math.nan
    if run.t_fb is not None and len(tok_run):
        fb = run.t_fb
        ok_fb = np.isfinite(fb) & (fb > 0)
        if ok_fb.sum() >= 3:
            r = fb[ok_fb] / np.maximum(tf.curve.predict(tok_run[ok_fb]), 1e-12)
            s_train = float(np.exp(np.median(np.log(r))))
    if math.isfinite(s_train):  # the calibration's curve on the run's clock (see anchor_gen)
        ct = {**ct, "duration": ct["duration"] * s_train}
        tf = fit_train_calibrated(ct["num_tokens"], ct["duration"], ct["calib_level"])
        if abs(s_train - 1) > 0.05:
            notes.append(f"calibration training passes scaled by {s_train:.3g} to the run's own forward + backward "
                         "time")
    fixed = _fixed_cost(tf.curve, run.tokens, run.seconds, run.t_opt_all)
    update = _update_model(tf, fixed, ct, run)
    run_err = math.nan
    if len(tok_run) and np.isfinite(run.t_opt).any():
        meas = float(np.median(upd_run))
        predicted = float(tf.curve.predict(float(np.median(tok_run)))) + float(np.nanmedian(run.t_opt))
        run_err = predicted / meas - 1 if meas > 0 else math.nan
    x_l = np.asarray(tf.curve.knots)
    val = dict(train_r2=update.quality.r2, train_cv=tf.cv, train_cv_max=tf.cv_max, train_levels=tf.levels,
               train_run_err=run_err, train_form="interp", train_flat=flat_span(tf.curve.knots, tf.curve.values),
               train_source=f"{tf.rows} calibration passes at {len(x_l)} token levels "
                            f"{x_l.min():.0f}..{x_l.max():.0f} + {len(tok_run)} run updates")
    return _Part(update, _bootstrap_train(ct, fixed, run, reps, rng), val,
                 f"{len(x_l)} token levels and {len(tok_run)} updates")


def _fixed_cost(fb: PiecewiseLinear, tok: np.ndarray, seconds: np.ndarray, t_opt_all: np.ndarray) -> float:
    """The per-update fixed cost (optimizer step and the rest): the robust location of the run's update seconds
    less their forward + backward seconds; without usable updates, the recorded optimizer time."""
    if len(tok):
        return float(max(robust_location(seconds - fb.predict(tok)), 0.0))
    return float(np.nanmedian(t_opt_all)) if np.isfinite(t_opt_all).any() else 0.0


def _update_model(tf: TrainFit, fixed: float, ct: dict[str, np.ndarray], run: _RunUpdates) -> PiecewiseLinear:
    """The update model (fixed cost + forward + backward), its quality over the calibration passes (forward +
    backward) and the run's updates (the whole update)."""
    xs = np.concatenate([ct["num_tokens"], run.tokens])
    ys = np.concatenate([ct["duration"], run.seconds])
    ps = np.concatenate([tf.curve.predict(ct["num_tokens"]), fixed + tf.curve.predict(run.tokens)])
    ok = np.isfinite(xs) & np.isfinite(ys)
    q = fit_quality(ps[ok][:, None], ys[ok], np.ones(1), 0, "calibrated interpolation + run fixed cost")
    return replace(tf.curve, name="update", offset=fixed, quality=q)


def _with_validation(models: FittedModels, gen: _Part, train: _Part, *, calibrated: bool, warnings: list[str],
                     notes: list[str]) -> FittedModels:
    """`models` with the refitted parts, their Validation and (when there are enough) their Replicates."""
    k = min(len(gen.reps), len(train.reps))
    method = (f"{100 * INTERVAL:.0f}% bootstrap ({k} refits) over {gen.method} and {train.method}"
              f"{'' if calibrated else ' (no calibration: the run rows only)'}")
    replicates = Replicates(gen=gen.reps[:k], update=train.reps[:k], method=method) if k >= 8 else None
    validation = Validation(**gen.validation, **train.validation, calibrated=calibrated,
                            interval_method=method if replicates is not None
                            else "none (too few levels or updates to resample)", notes=tuple(notes))
    return replace(models, gen=gen.model, update=train.model, warnings=tuple(warnings), validation=validation,
                   replicates=replicates)


def _bootstrap_train(ct: dict[str, np.ndarray], fixed: float, run: _RunUpdates, reps: int,
                     rng: np.random.Generator) -> np.ndarray:
    """(reps, 2 + 2K) update coefficient rows (`PiecewiseLinear.array`): each level's median under Bayesian-bootstrap
    weights of its passes (no level dropped: each is a knot), and the fixed cost re-estimated on resampled updates."""
    tok, dur, lev = (np.asarray(ct[k], float) for k in ("num_tokens", "duration", "calib_level"))
    ok = np.isfinite(tok) & np.isfinite(dur) & (tok > 0) & (dur > 0)
    tok, dur, lev = tok[ok], dur[ok], lev[ok]
    x, _, _, row = _token_levels(tok, dur, lev)
    out = []
    for _ in range(reps):
        w = rng.exponential(1.0, len(dur))
        c = _fb_coefs(x, np.array([_weighted_median(dur[row == i], w[row == i]) for i in range(len(x))]))
        if len(run.tokens):
            j = rng.integers(0, len(run.tokens), len(run.tokens))
            c[0] += max(robust_location(run.seconds[j] - hinge_predict(c, run.tokens[j])), 0.0)
        else:
            c[0] += fixed
        out.append(c)
    return np.array(out) if out else np.zeros((0, 2))


def _bootstrap_update_rows(tok: np.ndarray, upd: np.ndarray, t_opt: np.ndarray, reps: int,
                           rng: np.random.Generator) -> np.ndarray:
    if len(tok) < 3:
        return np.zeros((0, 2))
    hint = robust_location(t_opt) if np.isfinite(t_opt).any() else 0.0
    out = []
    for _ in range(reps):
        j = rng.integers(0, len(tok), len(tok))
        m = fit_affine("update", "tokens", tok[j], upd[j], intercept_hint=hint)
        out.append((m.intercept, m.slope))
    return np.array(out)
