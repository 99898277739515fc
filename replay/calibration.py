"""Calibrated, validated step-cost fits and their bootstrap replicates (intervals).

A run at one batch size runs almost every engine step at the batch's own concurrency, so its rows cannot
pin how the step time grows with concurrency (fitted at P and asked about 4P, responses/s erred by +34 %),
and on CPU the step time is not one line in concurrency. `rlrun record` therefore profiles, before the
first update, engine steps at a geometric ladder of concurrencies (`calib_gen` rows) and forward +
backward passes at a ladder of token counts (`calib_train` rows); `rlrun calibrate` writes the same alone,
for older traces (`rlsim run --calibration FILE`). Here (`calibrate`, called at the end of
`fit.fit_trace`):

- engine step: fitted on calibration + run rows, each concurrency level (half-octave bins of
  num_running) given the same total weight (weights 1 / (sqrt(rows) x median seconds) of its level, so the
  squared relative errors of the levels count alike; a level of fewer than 8 rows counts rows/8), by
  non-negative least squares. Two forms:
      linear  t = c_step + c_seq n + c_ctx ctx + c_prefill prefill
      knee    t = c_step + s1 min(n, k) + s2 max(0, n - k) + c_ctx ctx + c_prefill prefill   (s1, s2 >= 0)
  i.e. piecewise linear in n with a fitted knee k (convex: a roofline max(memory-bound, compute-bound);
  concave: per-step overheads that saturate); `GenStepModel` holds it as c_seq = s1, c_knee = s2 - s1.
  A round's cost stays a closed form of summed features: sum over steps of max(0, n - k) is the one
  added feature (`sim.engine.hinge_sums`). The form is chosen by leave-one-level-out cross-validation
  (each level's summed seconds predicted from the other levels), not by in-sample R2: the knee form only
  when it cuts the CV error by at least KNEE_GAIN. The calibration is put on the run's clock first: its
  rows are scaled by the run's step times at the run's own concurrency over what the calibration alone
  predicts there (`anchor_gen`; a shared machine may run at another speed during the calibration, and a
  `rlrun calibrate` file comes from another time); the training line likewise by the run's forward +
  backward seconds. Last, the fitted times are scaled so that they sum to the run's own engine time over its
  steps (`run_level`): the calibration sets the shape, the run its level, in total rather than at one level.
- training: the forward + backward seconds of the calibration's token levels give the per-token slope
  (a line through the level medians, relative errors); the per-update fixed cost (optimizer step and the
  rest) is the robust location of (measured update seconds - slope x tokens) over the run's updates.
  Cross-validated by leaving one token level out.
- replicates: a bootstrap over concurrency levels (calibrated) or RL steps (run rows only) and over token
  levels or updates: REPLICATES refits of both models. The simulator turns each into a responses/s; the
  interval is the point estimate times the 5 %-95 % quantiles of replicate / median replicate.

Without calibration rows the point fits are those of `fit.py`, unchanged; the validation is computed on
the run's rows and a warning names `rlrun calibrate`. Imports neither torch nor SimPy.

Size: one concern, the calibrated engine and training fits, with the leave-one-level-out validation and
the bootstrap replicates that must refit exactly those fits; the entry point is `calibrate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
from scipy.optimize import nnls

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace
from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN, GEN_STEP

KNEE_GRID = 12          # knee candidates, geometric between the second-lowest and second-highest level
KNEE_GAIN = 0.8         # the knee form is used when its CV error is below this fraction of the linear form's
REPLICATES = 64         # bootstrap refits for the intervals
INTERVAL = 0.90         # central coverage of the reported intervals
TRIM_SIGMAS = 5.0       # rows further than this many robust sigmas from their level's median are dropped
TRIM_MIN = 0.15         # ... but never closer than this relative distance
LEVEL_FULL_ROWS = 8     # a level with fewer rows gets rows/8 of the full weight (fit and CV summary): a step or two
                        # of a run's tail cannot count as much as a calibration rung
NO_CALIBRATION = ("{name} has no calibration rows: the engine-step model is fitted on the run's own concurrency "
                  "({lo}..{hi} sequences) and extrapolates beyond it; record with `rlrun record` (calibrates by "
                  "default) or run `rlrun calibrate --out calib.parquet` with the same model on this device and pass "
                  "--calibration calib.parquet")


def level_key(n) -> np.ndarray:
    """Half-octave concurrency level of num_running (1, 1.4, 2, 2.8, 4, ... share keys 0, 1, 2, ...)."""
    return np.rint(2 * np.log2(np.maximum(np.asarray(n, float), 1.0))).astype(np.int64)


# --------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class LevelError:
    """One held-out level of a cross-validation."""

    level: float = field(metadata={"help": "median num_running (engine) or tokens (training) of the level"})
    rows: int = field(metadata={"help": "rows in the level"})
    rel_err: float = field(metadata={"help": "predicted / measured summed seconds of the level - 1, fitted without it"})


@dataclass(frozen=True, eq=False)
class Validation:
    """Out-of-sample checks of the step-cost fits: what `rlsim run` and the report print."""

    gen_form: str = field(metadata={"help": "engine-step form used: linear | knee"})
    gen_knee: float = field(metadata={"help": "knee (num_running) of the knee form, nan for linear"})
    gen_r2: float = field(metadata={"help": "R2 of the engine-step fit on the rows used"})
    gen_cv: float = field(metadata={"help": "RMS relative error of held-out concurrency levels, form used"})
    gen_cv_max: float = field(metadata={"help": "largest |relative error| of a held-out level, form used"})
    gen_cv_linear: float = field(metadata={"help": "the same RMS for the linear form"})
    gen_cv_knee: float = field(metadata={"help": "the same RMS for the knee form (nan: too few levels)"})
    gen_levels: tuple[LevelError, ...] = field(metadata={"help": "held-out errors per level, form used"})
    gen_source: str = field(metadata={"help": "rows the engine-step fit used"})
    train_r2: float = field(default=math.nan, metadata={"help": "R2 of the training fit (calibration levels and run updates)"})
    train_cv: float = field(default=math.nan, metadata={"help": "RMS relative error of held-out token levels"})
    train_cv_max: float = field(default=math.nan, metadata={"help": "largest |relative error| of a held-out token level"})
    train_levels: tuple[LevelError, ...] = field(default=(), metadata={"help": "held-out errors per token level"})
    train_run_err: float = field(default=math.nan, metadata={
        "help": "the run's median update predicted from the calibration alone (+ its optimizer time) / measured - 1"})
    train_source: str = field(default="", metadata={"help": "rows the training fit used"})
    calibrated: bool = field(default=False, metadata={"help": "calibration rows were used"})
    interval_method: str = field(default="", metadata={"help": "how the intervals are made"})
    notes: tuple[str, ...] = field(default=(), metadata={"help": "what the validation found (form chosen and why)"})

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["gen_levels"] = [vars(x) for x in self.gen_levels]
        d["train_levels"] = [vars(x) for x in self.train_levels]
        d["notes"] = list(self.notes)
        return d

    def summary(self) -> list[str]:
        """Lines for `rlsim run`."""
        pct = lambda v: "n/a" if not math.isfinite(v) else f"{100 * v:.1f}%"  # noqa: E731
        knee = f" at {self.gen_knee:.0f} running" if self.gen_form == "knee" else ""
        out = [f"engine-step fit: {self.gen_form}{knee}, R2 {self.gen_r2:.3f}, leave-one-level-out error {pct(self.gen_cv)} "
               f"RMS (max {pct(self.gen_cv_max)}; linear {pct(self.gen_cv_linear)}, knee {pct(self.gen_cv_knee)}); {self.gen_source}"]
        if self.train_source:
            run = f", run's update from the calibration {100 * self.train_run_err:+.1f}%" if math.isfinite(self.train_run_err) else ""
            out.append(f"training fit: R2 {self.train_r2:.3f}, leave-one-token-level-out error {pct(self.train_cv)} RMS "
                       f"(max {pct(self.train_cv_max)}){run}; {self.train_source}")
        return out


@dataclass(frozen=True, eq=False)
class Replicates:
    """Bootstrap refits of the engine-step and update models (one row per replicate)."""

    gen: np.ndarray = field(metadata={"help": "(R, 6): c_step, c_seq, c_ctx, c_prefill, c_knee, knee"})
    update: np.ndarray = field(metadata={"help": "(R, 2): intercept, slope (seconds, seconds per token)"})
    b_crit: np.ndarray | None = field(default=None, metadata={"help": "(R,) gradient noise scale replicates (filled by the what-if)"})
    method: str = field(default="", metadata={"help": "what was resampled"})
    level: float = field(default=INTERVAL, metadata={"help": "central coverage of the intervals"})

    def __len__(self) -> int:
        return len(self.gen)


def interval(point: float, reps: np.ndarray, level: float = INTERVAL) -> tuple[float, float]:
    """(lo, hi): `point` times the central `level` quantiles of reps / median(reps) (nan when not estimable)."""
    reps = np.asarray(reps, float)
    reps = reps[np.isfinite(reps) & (reps > 0)]
    if not (math.isfinite(point) and len(reps) >= 8):
        return math.nan, math.nan
    r = reps / np.median(reps)
    a = (1 - level) / 2
    lo, hi = np.quantile(r, [a, 1 - a])
    return float(point * min(lo, 1.0)), float(point * max(hi, 1.0))


# --------------------------------------------------------------------------------------------- engine fit
def _nnls_gram(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} x'Gx - 2g'x (least squares given its normal equations), columns rescaled."""
    d = np.sqrt(np.diag(G)).copy()
    d[~(d > 0)] = 1.0
    Gs = G / np.outer(d, d)
    p = len(g)
    L = np.linalg.cholesky(Gs + 1e-10 * np.eye(p))
    b = np.linalg.solve(L, g / d)
    return nnls(L.T, b)[0] / d


def _design(n: np.ndarray, ctx: np.ndarray, pre: np.ndarray, knee: float | None) -> np.ndarray:
    one = np.ones_like(n)
    if knee is None:
        return np.column_stack([one, n, ctx, pre])
    return np.column_stack([one, np.minimum(n, knee), np.maximum(n - knee, 0.0), ctx, pre])


def _coef6(x: np.ndarray, knee: float | None) -> np.ndarray:
    """c_step, c_seq, c_ctx, c_prefill, c_knee, knee from a variant's coefficients."""
    if knee is None:
        return np.array([x[0], x[1], x[2], x[3], 0.0, 0.0])
    return np.array([x[0], x[1], x[3], x[4], x[2] - x[1], knee])


class _GenProblem:
    """Weighted NNLS of engine-step seconds on features, by groups of rows (sufficient statistics), so that
    refits on subsets of levels (CV) and resamples (bootstrap) cost a few small matrix operations."""

    def __init__(self, n, ctx, pre, y, w, level, cluster, knees: Sequence[float], fixed_c0: float | None = None,
                 cal: np.ndarray | None = None, anchor: np.ndarray | None = None):
        self.level_ids, lev = np.unique(level, return_inverse=True)
        self.cluster_ids, clu = np.unique(cluster, return_inverse=True)
        grp_keys, grp = np.unique(lev * (len(self.cluster_ids) + 1) + clu, return_inverse=True)
        self.grp_level = grp_keys // (len(self.cluster_ids) + 1)
        self.grp_cluster = grp_keys % (len(self.cluster_ids) + 1)
        ng = len(grp_keys)
        self.fixed_c0 = fixed_c0
        yy = y - (fixed_c0 or 0.0)
        self.variants: list[float | None] = [None] + list(knees)
        self.G, self.g, self.S = [], [], []
        self.Y = np.bincount(grp, weights=y, minlength=ng)
        self.count = np.bincount(grp, minlength=ng).astype(float)
        self.yy = np.bincount(grp, weights=(yy * w) ** 2, minlength=ng)
        self.level_center = np.array([np.median(n[lev == i]) for i in range(len(self.level_ids))])
        self.level_rows = np.bincount(lev, minlength=len(self.level_ids))
        self.level_weight = np.minimum(self.level_rows, LEVEL_FULL_ROWS) / LEVEL_FULL_ROWS
        # groups of calibration rows (their seconds scale with the anchor) and of the run rows that anchor them
        self.grp_cal = np.bincount(grp, weights=np.asarray(cal, float), minlength=ng) > 0 if cal is not None else np.zeros(ng, bool)
        self.grp_anchor = (np.bincount(grp, weights=np.asarray(anchor, float), minlength=ng) > 0 if anchor is not None
                           else np.zeros(ng, bool))
        for k in self.variants:
            X = _design(n, ctx, pre, k)
            if fixed_c0 is not None:
                X = X[:, 1:]
            Xw = X * w[:, None]
            G = np.zeros((ng, X.shape[1], X.shape[1]))
            np.add.at(G, grp, Xw[:, :, None] * Xw[:, None, :])
            g = np.zeros((ng, X.shape[1]))
            np.add.at(g, grp, Xw * (yy * w)[:, None])
            S = np.zeros((ng, X.shape[1]))
            np.add.at(S, grp, X)
            self.G.append(G)
            self.g.append(g)
            self.S.append(S)

    def _knee_ok(self, k: float, m_level: np.ndarray) -> bool:
        """Two or more levels with data on each side of the knee."""
        c = self.level_center[m_level > 0]
        return int(np.sum(c < k)) >= 2 and int(np.sum(c > k)) >= 2

    def fit(self, m_grp: np.ndarray, form: str, cal_factor: float = 1.0) -> tuple[np.ndarray, float | None]:
        """Coefficients (c6) of `form` on groups weighted by m_grp, the calibration rows' seconds times
        `cal_factor`; the knee chosen by least weighted SS."""
        m_level = np.bincount(self.grp_level, weights=m_grp, minlength=len(self.level_ids))
        f = np.where(self.grp_cal, cal_factor, 1.0)
        best, best_ss, best_k = None, math.inf, None
        for v, k in enumerate(self.variants):
            if (form == "linear") != (k is None):
                continue
            if k is not None and not self._knee_ok(k, m_level):
                continue
            G = np.tensordot(m_grp, self.G[v], 1)
            g = np.tensordot(m_grp * f, self.g[v], 1)
            x = _nnls_gram(G, g)
            ss = float((m_grp * f * f) @ self.yy - 2 * x @ g + x @ G @ x)
            if ss < best_ss:
                best, best_ss, best_k = x, ss, k
        if best is None:
            return None, None
        if self.fixed_c0 is not None:
            best = np.concatenate([[self.fixed_c0], best])
        return _coef6(best, best_k), best_k

    def predict_groups(self, c6: np.ndarray) -> np.ndarray:
        """Predicted summed seconds of every group under c6 (any form)."""
        k = c6[5] if c6[4] != 0 else None
        if k is None:
            S = self.S[0]
            x = np.array([c6[0], c6[1], c6[2], c6[3]])
        else:
            # S of the variant with this knee when it is one of the grid's, else the linear S plus the hinge term
            v = next((i for i, kk in enumerate(self.variants) if kk is not None and kk == k), None)
            if v is None:
                return None  # pragma: no cover - knees always come from the grid
            S = self.S[v]
            x = np.array([c6[0], c6[1], c6[1] + c6[4], c6[2], c6[3]])
        if self.fixed_c0 is not None:
            return S @ x[1:] + c6[0] * self.count
        return S @ x

    def cross_validate(self, form: str) -> tuple[float, float, tuple[LevelError, ...]]:
        """Leave one level out: (RMS, max |error|, per level) of its summed seconds predicted from the rest; the RMS
        weighs levels of fewer than LEVEL_FULL_ROWS rows less (as the fit does), the max is over full levels."""
        errs = []
        for li in range(len(self.level_ids)):
            m = (self.grp_level != li).astype(float)
            c6, _ = self.fit(m, form)
            if c6 is None:
                return math.nan, math.nan, ()
            pred = self.predict_groups(c6)
            sel = self.grp_level == li
            meas = float(self.Y[sel].sum())
            errs.append(LevelError(float(self.level_center[li]), int(self.level_rows[li]),
                                   float(pred[sel].sum() / meas - 1) if meas > 0 else math.nan))
        e = np.array([x.rel_err for x in errs])
        lw = self.level_weight
        ok = np.isfinite(e)
        if not ok.any():
            return math.nan, math.nan, tuple(errs)
        full = ok & (self.level_rows >= LEVEL_FULL_ROWS)
        worst = float(np.max(np.abs(e[full if full.any() else ok])))
        return float(np.sqrt(np.sum(lw[ok] * e[ok] ** 2) / np.sum(lw[ok]))), worst, tuple(errs)


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


def knee_grid(centers: np.ndarray, k: int = KNEE_GRID) -> list[float]:
    """Knee candidates: geometric between the second-lowest and second-highest level centre (>= 4 levels)."""
    c = np.unique(np.asarray(centers, float))
    if len(c) < 4:
        return []
    lo, hi = c[1], c[-2]
    if hi <= lo:
        return []
    return [float(v) for v in np.unique(np.round(np.geomspace(lo, hi, k), 3))]


@dataclass(frozen=True, eq=False)
class GenFit:
    """The engine-step fit of `fit_gen_calibrated`."""

    coef: np.ndarray      # c6 of the form used
    form: str
    problem: _GenProblem
    cv: dict[str, tuple[float, float, tuple[LevelError, ...]]]
    r2: float
    rows: int
    dropped: int
    concurrency_range: tuple[int, int]
    notes: tuple[str, ...]


def fit_gen_calibrated(rows: dict[str, np.ndarray], *, forms: Sequence[str] = ("linear", "knee"),
                       knees: Sequence[float] | None = None, cal: np.ndarray | None = None,
                       anchor: np.ndarray | None = None) -> GenFit:
    """Fit the engine-step model on rows (duration, num_running, context_tokens, prefill_tokens), every
    level weighted alike; choose the form by leave-one-level-out CV. `knees`: candidates (default: grid)."""
    y = np.asarray(rows["duration"], float)
    n = np.asarray(rows["num_running"], float)
    ctx = np.asarray(rows["context_tokens"], float)
    pre = np.asarray(rows["prefill_tokens"], float)
    ok = np.isfinite(y) & (y > 0) & (n > 0) & np.isfinite(ctx) & np.isfinite(pre)
    lev = level_key(n)
    ok &= _trim(np.where(ok, y, 1.0), lev, pre)
    dropped = int((~ok).sum())
    y, n, ctx, pre, lev = y[ok], n[ok], ctx[ok], pre[ok], lev[ok]
    cal = np.asarray(cal, bool)[ok] if cal is not None else None
    anchor = np.asarray(anchor, bool)[ok] if anchor is not None else None
    if len(np.unique(lev)) < 3:
        raise RlsimError(f"calibration covers {len(np.unique(lev))} concurrency levels; at least 3 are needed "
                         "(re-run `rlrun calibrate`)")
    ul, inv = np.unique(lev, return_inverse=True)
    cnt = np.bincount(inv)
    med = np.array([np.median(y[inv == i]) for i in range(len(ul))])
    lw = np.minimum(cnt, LEVEL_FULL_ROWS) / LEVEL_FULL_ROWS
    w = np.sqrt(lw[inv]) / (np.sqrt(cnt[inv]) * med[inv])
    centers = np.array([np.median(n[inv == i]) for i in range(len(ul))])
    grid = list(knees) if knees is not None else knee_grid(centers)
    if "knee" not in forms:
        grid = []
    prob = _GenProblem(n, ctx, pre, y, w, lev, np.arange(len(y)), grid, cal=cal, anchor=anchor)  # clusters: rows
    cv = {"linear": prob.cross_validate("linear")}
    if grid:
        cv["knee"] = prob.cross_validate("knee")
    notes = []
    form = "linear"
    lin, kn = cv["linear"][0], cv.get("knee", (math.nan,))[0]
    if math.isfinite(kn) and (not math.isfinite(lin) or kn < KNEE_GAIN * lin):
        form = "knee"
    m_all = np.ones(len(prob.grp_level))
    coef, k = prob.fit(m_all, form)
    if form == "knee":  # refine the knee between the grid's neighbours of the one chosen
        i = grid.index(k)
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        best_ss = math.inf
        for kk in np.geomspace(lo, hi, 25):
            if not prob._knee_ok(kk, np.ones(len(prob.level_ids))):
                continue
            Xw = _design(n, ctx, pre, kk) * w[:, None]
            x = _nnls_gram(Xw.T @ Xw, Xw.T @ (y * w))
            ss = float(np.sum((Xw @ x - y * w) ** 2))
            if ss < best_ss:
                best_ss, coef, k = ss, _coef6(x, float(kk)), float(kk)
    if form == "knee":
        notes.append(f"the engine-step time is not one line in concurrency: the linear form misses held-out levels by "
                     f"{100 * lin:.1f}% (RMS), a knee at {k:.0f} running by {100 * kn:.1f}%; the knee form is used")
    elif math.isfinite(kn):
        notes.append(f"linear engine-step form kept: held-out levels {100 * lin:.1f}% (RMS) vs {100 * kn:.1f}% with a knee")
    pred = _predict_rows(coef, n, ctx, pre)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return GenFit(coef=coef, form=form, problem=prob, cv=cv, r2=r2, rows=len(y), dropped=dropped,
                  concurrency_range=(int(n.min()), int(n.max())), notes=tuple(notes))


def _predict_rows(c6: np.ndarray, n, ctx, pre) -> np.ndarray:
    t = c6[0] + c6[1] * n + c6[2] * ctx + c6[3] * pre
    return t + c6[4] * np.maximum(n - c6[5], 0.0) if c6[4] else t


def bootstrap_gen(prob: _GenProblem, form: str, reps: int, rng: np.random.Generator, by: str = "level") -> np.ndarray:
    """(reps, 6) coefficient sets refitted under Bayesian-bootstrap weights (independent Exp(1) draws, i.e.
    Dirichlet weights: no level is dropped whole, which would make the knee form swing): `by`="level", a
    weight per concurrency level times a weight per cluster (row) within it (two stages: which levels
    there are, and the noise within each); "cluster", a weight per cluster (an RL step of a run)."""
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
            cc, _ = prob.fit(m * prob.grp_cal, form)
            if cc is None:
                continue
            pred = prob.predict_groups(cc)[prob.grp_anchor]
            lr = np.log(np.maximum(prob.Y[prob.grp_anchor], 1e-12) / np.maximum(pred, 1e-12))
            f = float(np.exp(_weighted_median(lr, m[prob.grp_anchor])))
        if len(np.unique(prob.grp_level[m > 0])) < (4 if form == "knee" else 2):
            continue
        c6, _ = prob.fit(m, form, cal_factor=f)
        if c6 is not None:
            out.append(c6)
    return np.array(out) if out else np.zeros((0, 6))


# --------------------------------------------------------------------------------------------- training fit
def _line_through(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(a, b) >= 0 of y = a + b x by least squares on relative errors."""
    w = 1.0 / np.maximum(y, 1e-12)
    A = np.column_stack([np.ones_like(x), x]) * w[:, None]
    return nnls(A, y * w)[0]


def _level_medians(tok: np.ndarray, dur: np.ndarray, level: np.ndarray):
    ul = np.unique(level)
    x = np.array([np.median(tok[level == k]) for k in ul])
    y = np.array([np.median(dur[level == k]) for k in ul])
    n = np.array([int(np.sum(level == k)) for k in ul])
    return x, y, n


@dataclass(frozen=True)
class TrainFit:
    intercept_calib: float
    slope: float
    cv: float
    cv_max: float
    levels: tuple[LevelError, ...]
    r2: float
    rows: int


def fit_train_calibrated(tok, dur, level) -> TrainFit:
    """Forward + backward seconds vs tokens over the calibration's token levels (line through level
    medians, relative errors), with leave-one-level-out errors."""
    tok, dur, level = (np.asarray(a, float) for a in (tok, dur, level))
    ok = np.isfinite(tok) & np.isfinite(dur) & (tok > 0) & (dur > 0)
    tok, dur, level = tok[ok], dur[ok], level[ok]
    x, y, n = _level_medians(tok, dur, level)
    if len(x) < 2:
        raise RlsimError(f"calibration has {len(x)} training token levels; at least 2 are needed (re-run `rlrun calibrate`)")
    a, b = _line_through(x, y)
    errs = []
    if len(x) >= 3:
        for i in range(len(x)):
            m = np.arange(len(x)) != i
            aa, bb = _line_through(x[m], y[m])
            errs.append(LevelError(float(x[i]), int(n[i]), float((aa + bb * x[i]) / y[i] - 1)))
    e = np.array([v.rel_err for v in errs])
    pred = a + b * x
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return TrainFit(float(a), float(b), float(np.sqrt(np.mean(e**2))) if len(e) else math.nan,
                    float(np.max(np.abs(e))) if len(e) else math.nan, tuple(errs), r2, int(len(tok)))


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
            raise RlsimError(f"{cal.path} was calibrated with {what} {b[key]!r}, the trace {ref.name} ran with {a[key]!r}: "
                             "a calibration applies only to the same model on the same device; run `rlrun calibrate` "
                             "with the trace's model on its device")
    if not (cal.count(CALIB_GEN) or cal.count(CALIB_TRAIN)):
        raise RlsimError(f"{cal.path} has no calibration rows (calib_gen / calib_train); make one with "
                         "`rlrun calibrate --out calib.parquet`")


def _rows(traces: Sequence[Trace], kind: str, cols: Sequence[str]) -> dict[str, np.ndarray]:
    out = {c: [] for c in cols}
    for t in traces:
        r = t.rows(kind)
        for c in cols:
            out[c].append(np.asarray(r[c], float))
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
    pred = _predict_rows(f.coef, n_run[m], np.asarray(run["context_tokens"], float)[m], np.asarray(run["prefill_tokens"], float)[m])
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
    pred = _predict_rows(coef, n[ok], np.asarray(run["context_tokens"], float)[ok], np.asarray(run["prefill_tokens"], float)[ok])
    tot = float(pred.sum())
    return float(y[ok].sum()) / tot if tot > 0 else math.nan


def calibrate(models, traces: Sequence[Trace], gen_rows: dict[str, np.ndarray], *, upd_proper: np.ndarray,
              n_tok: np.ndarray, t_opt: np.ndarray, sel: np.ndarray, t_fb: np.ndarray | None = None,
              calibration: Sequence[Trace] = (), reps: int = REPLICATES, seed: int = 0, ref_rows: np.ndarray | None = None):
    """`models` (FittedModels of `fit_trace`) with calibrated engine-step and update models when calibration
    rows exist (in the first trace or in `calibration`), and with validation and replicates in every case.
    `ref_rows` (bool per update row): the reference trace's; a calibrated update model is anchored to those
    alone, since traces recorded at other times ran at another machine speed."""
    from rlsim.replay.fit import AffineModel, FitQuality, GenStepModel

    ref = traces[0]
    for c in calibration:
        check_compatible(ref, c)
    sources = [ref] + list(calibration)
    # a calibration at another thread count (`rlrun calibrate --threads`, for a split side's cores) stands for
    # that device as measured: its rows alone, not anchored to the run's clock (the run ran on more threads)
    foreign = [c for c in calibration if threads_of(c) and threads_of(ref) and threads_of(c) != threads_of(ref)]
    if foreign:
        sources = foreign
    cg = _rows(sources, CALIB_GEN, ("duration", "num_running", "context_tokens", "prefill_tokens"))
    ct = _rows(sources, CALIB_TRAIN, ("duration", "num_tokens", "calib_level"))
    rng = np.random.default_rng(seed)
    warnings = list(models.warnings)
    run_keep = (gen_rows["step"] != 0) if np.any(gen_rows["step"] != 0) else np.ones(len(gen_rows["step"]), bool)
    run_keep &= np.isfinite(gen_rows["duration"]) & (gen_rows["num_running"] > 0)
    run = {k: np.asarray(gen_rows[k], float)[run_keep] for k in ("duration", "num_running", "context_tokens", "prefill_tokens")}
    rounds = np.asarray(gen_rows.get("round", np.zeros(len(run_keep))), float)[run_keep]
    gen, update = models.gen, models.update
    notes: list[str] = []
    upd_ok = sel & np.isfinite(upd_proper) & np.isfinite(n_tok)
    if foreign:
        run = {k: v[:0] for k, v in run.items()}
        upd_ok = np.zeros_like(upd_ok)
        notes.append(f"calibration at {threads_of(foreign[0])} thread(s) (the run: {threads_of(ref)}): engine steps and "
                     "training passes as measured there, not rescaled to the run; the optimizer step from the run")

    if len(cg["duration"]) >= 8:
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
        c = gf.coef.copy()
        # The level: the level-weighted fit gives the run's own concurrencies one vote among the calibration's
        # levels, so where the curve is not one line it can pass a few % off the run's operating point (and its
        # anchor is a median at one level). What the run's engine steps took in total is measured: scale the
        # times (not the knee position) so that the fit sums to it over the run's own steps.
        level = run_level(c, run)
        if math.isfinite(level):
            c[:5] *= level
            if abs(level - 1) > 0.01:
                notes.append(f"engine-step fit scaled by {level:.3g} to the run's total engine time over its own steps")
        invalid = sum(t.dropped_rows(GEN_STEP) for t in traces[:1] if hasattr(t, "dropped_rows"))  # rows the reader dropped
        q = FitQuality(n=gf.rows, r2=gf.r2, rmse=math.nan, median_rel_err=math.nan, p95_rel_err=math.nan, dropped=gf.dropped + invalid,
                       method=f"calibrated {gf.form} (level-weighted nnls)")
        pred = _predict_rows(c, both["num_running"], both["context_tokens"], both["prefill_tokens"])
        okr = np.isfinite(both["duration"]) & (both["num_running"] > 0)
        res = both["duration"][okr] - pred[okr]
        rel = np.abs(res) / np.maximum(both["duration"][okr], 1e-12)
        q = replace(q, rmse=float(np.sqrt(np.mean(res**2))), median_rel_err=float(np.median(rel)),
                    p95_rel_err=float(np.percentile(rel, 95)))
        gen = GenStepModel(c_step=float(c[0]), c_seq=float(c[1]), c_ctx=float(c[2]), c_prefill=float(c[3]), quality=q,
                           prior=False, concurrency_range=gf.concurrency_range, c_knee=float(c[4]),
                           knee=float(c[5]) if gf.form == "knee" else 0.0, form=gf.form)
        notes += gf.notes
        cv_used = gf.cv[gf.form]
        gen_source = (f"{len(cg['duration'])} calibration steps + {len(run['duration'])} run steps, "
                      f"{len(gf.problem.level_ids)} concurrency levels {gf.concurrency_range[0]}..{gf.concurrency_range[1]}")
        gen_reps = bootstrap_gen(gf.problem, gf.form, reps, rng, by="level")
        if math.isfinite(level) and len(gen_reps):
            gen_reps[:, :5] *= level
        val_gen = dict(gen_form=gf.form, gen_knee=float(c[5]) if gf.form == "knee" else math.nan, gen_r2=gf.r2,
                       gen_cv=cv_used[0], gen_cv_max=cv_used[1], gen_cv_linear=gf.cv["linear"][0],
                       gen_cv_knee=gf.cv.get("knee", (math.nan,))[0], gen_levels=cv_used[2], gen_source=gen_source)
        gen_method = f"{len(gf.problem.level_ids)} concurrency levels"
    else:
        lo, hi = gen.concurrency_range
        warnings.append(NO_CALIBRATION.format(name=ref.name, lo=lo, hi=hi))
        # validation and replicates of the run rows' own (linear, unweighted) fit; the point fit stays fit.py's
        y = run["duration"]
        lev = level_key(run["num_running"])
        fixed = gen.c_step if gen.prior else None
        prob = _GenProblem(run["num_running"], run["context_tokens"], run["prefill_tokens"], y, np.ones(len(y)), lev,
                           rounds, [], fixed_c0=fixed)
        cv = prob.cross_validate("linear") if len(prob.level_ids) >= 3 else (math.nan, math.nan, ())
        val_gen = dict(gen_form="linear", gen_knee=math.nan, gen_r2=gen.quality.r2, gen_cv=cv[0], gen_cv_max=cv[1],
                       gen_cv_linear=cv[0], gen_cv_knee=math.nan, gen_levels=cv[2],
                       gen_source=f"{len(y)} run steps only, {lo}..{hi} running (no calibration)")
        gen_reps = bootstrap_gen(prob, "linear", reps, rng, by="cluster") if len(prob.cluster_ids) >= 3 else np.zeros((0, 6))
        gen_method = f"{len(prob.cluster_ids)} RL steps"

    # training
    val_train: dict[str, Any] = {}
    calibrated_train = len(np.unique(ct["calib_level"][np.isfinite(ct["calib_level"])])) >= 2
    if calibrated_train and ref_rows is not None and (upd_ok & ref_rows).sum() >= 3:
        upd_ok = upd_ok & ref_rows
    tok_run, upd_run = n_tok[upd_ok], upd_proper[upd_ok]
    if calibrated_train:
        tf = fit_train_calibrated(ct["num_tokens"], ct["duration"], ct["calib_level"])
        s_train = math.nan
        if t_fb is not None and len(tok_run):
            fb = np.asarray(t_fb, float)[upd_ok]
            ok_fb = np.isfinite(fb) & (fb > 0)
            if ok_fb.sum() >= 3:
                r = fb[ok_fb] / np.maximum(tf.intercept_calib + tf.slope * tok_run[ok_fb], 1e-12)
                s_train = float(np.exp(np.median(np.log(r))))
        if math.isfinite(s_train):  # the calibration's line on the run's clock (see anchor_gen)
            ct = {**ct, "duration": ct["duration"] * s_train}
            tf = fit_train_calibrated(ct["num_tokens"], ct["duration"], ct["calib_level"])
            if abs(s_train - 1) > 0.05:
                notes.append(f"calibration training passes scaled by {s_train:.3g} to the run's own forward + backward time")
        if len(tok_run):
            a = float(max(_robust_loc(upd_run - tf.slope * tok_run), 0.0))
        else:
            a = tf.intercept_calib + float(np.nanmedian(t_opt)) if np.isfinite(t_opt).any() else tf.intercept_calib
        # quality over the calibration rows (forward + backward) and the run's updates (the whole update)
        xs = np.concatenate([ct["num_tokens"], tok_run])
        ys = np.concatenate([ct["duration"], upd_run])
        ps = np.concatenate([tf.intercept_calib + tf.slope * ct["num_tokens"], a + tf.slope * tok_run])
        okq = np.isfinite(xs) & np.isfinite(ys)
        res = ys[okq] - ps[okq]
        ss_tot = float(np.sum((ys[okq] - ys[okq].mean()) ** 2))
        r2 = 1 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else math.nan
        rel = np.abs(res) / np.maximum(np.abs(ys[okq]), 1e-12)
        update = AffineModel("update", "tokens", a, tf.slope,
                             FitQuality(n=int(okq.sum()), r2=r2, rmse=float(np.sqrt(np.mean(res**2))),
                                        median_rel_err=float(np.median(rel)), p95_rel_err=float(np.percentile(rel, 95)),
                                        dropped=0, method="calibrated slope + run intercept"))
        run_err = math.nan
        if len(tok_run) and np.isfinite(t_opt[upd_ok]).any():
            meas = float(np.median(upd_run))
            predicted = tf.intercept_calib + tf.slope * float(np.median(tok_run)) + float(np.nanmedian(t_opt[upd_ok]))
            run_err = predicted / meas - 1 if meas > 0 else math.nan
        x_l, _, _ = _level_medians(ct["num_tokens"], ct["duration"], ct["calib_level"])
        val_train = dict(train_r2=r2, train_cv=tf.cv, train_cv_max=tf.cv_max, train_levels=tf.levels, train_run_err=run_err,
                         train_source=f"{tf.rows} calibration passes at {len(x_l)} token levels "
                                      f"{x_l.min():.0f}..{x_l.max():.0f} + {len(tok_run)} run updates")
        upd_reps = _bootstrap_train(ct, tok_run, upd_run, reps, rng)
        train_method = f"{len(x_l)} token levels and {len(tok_run)} updates"
    else:
        val_train = dict(train_r2=update.quality.r2, train_source=f"{len(tok_run)} run updates only (no calibration)")
        upd_reps = _bootstrap_update_rows(tok_run, upd_run, t_opt[upd_ok], reps, rng)
        train_method = f"{len(tok_run)} updates"

    k = min(len(gen_reps), len(upd_reps))
    calibrated = len(cg["duration"]) >= 8
    method = (f"{100 * INTERVAL:.0f}% bootstrap ({k} refits) over {gen_method} and {train_method}"
              f"{'' if calibrated else ' (no calibration: the run rows only)'}")
    replicates = Replicates(gen=gen_reps[:k], update=upd_reps[:k], method=method) if k >= 8 else None
    validation = Validation(**val_gen, **val_train, calibrated=calibrated,
                            interval_method=method if replicates is not None else "none (too few levels or updates to resample)",
                            notes=tuple(notes))
    return replace(models, gen=gen, update=update, warnings=tuple(warnings), validation=validation, replicates=replicates)


def _robust_loc(v: np.ndarray) -> float:
    from rlsim.replay.fit import robust_location

    return robust_location(v)


def _bootstrap_train(ct: dict[str, np.ndarray], tok_run: np.ndarray, upd_run: np.ndarray, reps: int,
                     rng: np.random.Generator) -> np.ndarray:
    ok = np.isfinite(ct["num_tokens"]) & np.isfinite(ct["duration"]) & (ct["duration"] > 0)
    x, y, _ = _level_medians(ct["num_tokens"][ok], ct["duration"][ok], ct["calib_level"][ok])
    out = []
    for _ in range(4 * reps):
        if len(out) == reps:
            break
        i = rng.integers(0, len(x), len(x))
        if len(np.unique(i)) < 2:
            continue
        a_cal, b = _line_through(x[i], y[i])
        if len(tok_run):
            j = rng.integers(0, len(tok_run), len(tok_run))
            a = max(_robust_loc(upd_run[j] - b * tok_run[j]), 0.0)
        else:
            a = a_cal
        out.append((a, b))
    return np.array(out) if out else np.zeros((0, 2))


def _bootstrap_update_rows(tok: np.ndarray, upd: np.ndarray, t_opt: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    from rlsim.replay.fit import fit_affine

    if len(tok) < 3:
        return np.zeros((0, 2))
    hint = _robust_loc(t_opt) if np.isfinite(t_opt).any() else 0.0
    out = []
    for _ in range(reps):
        j = rng.integers(0, len(tok), len(tok))
        m = fit_affine("update", "tokens", tok[j], upd[j], intercept_hint=hint)
        out.append((m.intercept, m.slope))
    return np.array(out)


# --------------------------------------------------------------------------------------------- replicate costs
def engine_seconds(gen_coefs: np.ndarray, K: float, S1: float, S2: float, S3: float, hist: np.ndarray | None) -> np.ndarray:
    """Summed engine-step seconds of a simulation for each coefficient row (c_step, c_seq, c_ctx, c_prefill,
    c_knee, knee), from its summed features: K steps, S1 running, S2 context, S3 prefill tokens, and the
    histogram of num_running over its steps (needed only for rows with a knee)."""
    c = np.atleast_2d(np.asarray(gen_coefs, float))
    t = c[:, 0] * K + c[:, 1] * S1 + c[:, 2] * S2 + c[:, 3] * S3
    if np.any(c[:, 4] != 0):
        if hist is None:
            raise ValueError("a knee form needs the num_running histogram of the simulation")
        n = np.arange(len(hist), dtype=float)
        H = np.maximum(n[None, :] - c[:, 5:6], 0.0) @ np.asarray(hist, float)
        t = t + c[:, 4] * H
    return t
