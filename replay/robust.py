"""Robust fitting for timings on a shared machine: non-negative least squares that trims contaminated
rows (least trimmed squares on log residuals), affine and piecewise-linear cost models with their fit quality.

Timings here are contaminated one-sidedly (contention only slows things down) and in whole time
windows; `nnls_fit` says how it copes. Imports neither torch nor SimPy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NARROW_RANGE = 1.5          # max/min of a regressor below this: a proportional model instead of a slope
_TINY = 10 * np.finfo(float).eps
_MAX_COND = 1e10  # a guessed set of free coefficients is solved for only where its equations are this well conditioned


@dataclass(frozen=True)
class FitQuality:
    """How well one model fits the rows it was fitted on."""

    n: int = field(metadata={"help": "rows used in the fit (after warm-up and trimming)"})
    r2: float = field(metadata={"help": "coefficient of determination on the rows used (nan when y is constant)"})
    rmse: float = field(metadata={"help": "root mean square residual, seconds"})
    median_rel_err: float = field(metadata={"help": "median |residual| / y"})
    p95_rel_err: float = field(metadata={"help": "95th percentile of |residual| / y"})
    dropped: int = field(default=0, metadata={"help": "rows left out (warm-up and outliers)"})
    method: str = field(default="nnls", metadata={"help": "nnls | proportional | constant | prior+nnls | default"})

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "r2": self.r2, "rmse": self.rmse, "median_rel_err": self.median_rel_err,
                "p95_rel_err": self.p95_rel_err, "dropped": self.dropped, "method": self.method}


def fit_quality(X: np.ndarray, y: np.ndarray, coef: np.ndarray, dropped: int, method: str) -> FitQuality:
    """The FitQuality of the linear fit `coef` on rows X, y (`dropped` rows left out, fitted by `method`)."""
    if len(y) == 0:
        return FitQuality(0, math.nan, math.nan, math.nan, math.nan, dropped, method)
    pred = X @ coef
    res = y - pred
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else math.nan
    rel = np.abs(res) / np.maximum(np.abs(y), 1e-12)
    return FitQuality(n=len(y), r2=r2, rmse=float(np.sqrt(np.mean(res**2))),
                      median_rel_err=float(np.median(rel)), p95_rel_err=float(np.percentile(rel, 95)),
                      dropped=dropped, method=method)


def nnls_gram(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} x'Gx - 2g'x for a symmetric positive semi-definite G (p, p): least squares with non-negative
    coefficients given its normal equations (G = A'A, g = A'b).

    The solution is that of the equations restricted to a set of free coefficients, the others 0, which meets the
    optimality conditions (free ones positive, no other one's gradient pointing into the positive side). The set is
    guessed twice: every coefficient, then those the first solution makes positive; that settles all but a few of
    the problems the fits pose (40 of 4,930 on the shipped traces), and Lawson and Hanson's active set finds the
    rest (`_active_set`). `nnls_gram_many` makes the same guesses for a stack of problems at once.

    numpy, not scipy.optimize.nnls: importing scipy.optimize (with scipy.linalg, scipy.special, numpy.testing
    and numpy.f2py) took longer than all of an `rlsim run`'s solves together (docs/results.md, section 12), and
    the solutions agree to ~1e-12 relative on every problem the shipped traces pose."""
    usable = G.diagonal() > 0  # a zero column never enters (its gradient is 0)
    tol = _TINY * len(g) * float(np.abs(g).max(initial=1e-300))
    free = usable
    for _ in range(2):
        if not _conditioned(G[free][:, free]):
            break
        x = _restricted_one(G, g, free)
        if (x[free] > 0).all():
            w = g - G @ x  # the negative half-gradient
            if (w[usable & ~free] <= tol).all():
                return x
            break
        free = free & (x > 0)
    return _active_set(G, g, usable, tol)


def nnls_gram_many(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    """`nnls_gram` of each of a stack of problems, G (K, p, p) and g (K, p) -> (K, p): its guesses made for the
    whole stack at once (one stacked solve each), the active set for the few problems they leave."""
    K, p = g.shape
    usable = np.diagonal(G, axis1=1, axis2=2) > 0
    tol = _TINY * p * np.abs(g).max(axis=1, initial=1e-300)
    x, free, todo, hard = np.zeros((K, p)), usable.copy(), np.arange(K), []
    for _ in range(2):
        s, conditioned = _restricted(G[todo], g[todo], free[todo])
        hard += list(todo[~conditioned])
        todo, s = todo[conditioned], s[conditioned]
        positive = np.where(free[todo], s > 0, True).all(axis=1)
        w = g[todo] - np.einsum("kij,kj->ki", G[todo], s)
        optimal = positive & np.where(usable[todo] & ~free[todo], w <= tol[todo, None], True).all(axis=1)
        x[todo[optimal]] = s[optimal]
        hard += list(todo[positive & ~optimal])  # a coefficient held at 0 wants to grow
        free[todo[~positive]] &= s[~positive] > 0
        todo = todo[~positive]
        if not len(todo):
            break
    for k in hard + list(todo):
        x[k] = _active_set(G[k], g[k], usable[k], float(tol[k]))
    return x


def _restricted_one(G: np.ndarray, g: np.ndarray, free: np.ndarray) -> np.ndarray:
    """(p,) the solution of G x = g over the `free` coefficients, 0 elsewhere."""
    if free.all():
        return _solve(G, g)
    x = np.zeros(len(g))
    idx = np.flatnonzero(free)
    if len(idx):
        x[idx] = _solve(G[idx][:, idx], g[idx])
    return x


def _restricted(G: np.ndarray, g: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((K, p) `_restricted_one` of a stack of problems, (K,) whether each one's equations are `_conditioned`): one
    stacked solve, the coefficients that are not free held at 0 by an identity block."""
    if not free.all():
        G = np.where(free[:, :, None] & free[:, None, :], G, np.eye(G.shape[-1]))
        g = np.where(free, g, 0.0)
    conditioned = _conditioned(G)
    try:
        x = np.linalg.solve(G, g[..., None])[..., 0]
    except np.linalg.LinAlgError:  # a singular one (not used: not conditioned); each alone
        x = np.array([_solve(a, b) for a, b in zip(G, g)]).reshape(g.shape)
    x[~free] = 0.0
    return x, conditioned


def _conditioned(G: np.ndarray) -> np.ndarray | bool:
    """Whether the equations G (..., p, p) have one solution to trust: condition number (columns scaled to unit
    diagonal) below _MAX_COND. Collinear columns have no single solution; the guesses leave such problems to the
    active set, which keeps one of the columns at 0 (as scipy's Lawson-Hanson does)."""
    if G.shape[-1] == 0:
        return np.ones(G.shape[:-2], bool) if G.ndim > 2 else True
    d = np.sqrt(np.diagonal(G, axis1=-2, axis2=-1))
    d = np.where(d > 0, d, 1.0)
    e = np.linalg.eigvalsh(G / (d[..., :, None] * d[..., None, :]))
    return e[..., 0] > e[..., -1] / _MAX_COND


def _active_set(G: np.ndarray, g: np.ndarray, usable: np.ndarray, tol: float) -> np.ndarray:
    """Lawson and Hanson's NNLS on the normal equations (Bro and de Jong's fast NNLS): from x = 0, the coefficient
    of largest gradient enters the free set; where the free set's solution turns a coefficient non-positive, x
    steps towards it until the first one reaches 0, which leaves."""
    p = len(g)
    usable = usable.copy()
    x = np.zeros(p)
    free = np.zeros(p, bool)
    w = np.where(usable, g, -np.inf)
    for _ in range(3 * p):
        j = int(np.argmax(np.where(free, -np.inf, w)))
        if free[j] or not w[j] > tol:
            break
        free[j] = True
        while True:
            s = _restricted_one(G, g, free)
            if (s[free] > 0).all():
                break
            neg = np.flatnonzero(free & (s <= 0))
            gap = x[neg] - s[neg]
            ratio = np.divide(x[neg], gap, out=np.zeros(len(neg)), where=gap > 0)
            k = int(np.argmin(ratio))
            x = x + ratio[k] * (s - x)
            x[neg[k]] = 0.0
            free &= x > 0
            x[~free] = 0.0
        if not free[j]:  # it left at once (a rounding-level gradient): it does not enter again
            usable[j] = False
        x = s
        w = np.where(usable, g - G @ x, -np.inf)
    return x


def _solve(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(G, g)
    except np.linalg.LinAlgError:  # the least-squares solution of minimum norm
        return np.linalg.lstsq(G, g, rcond=None)[0]


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} ||Ax - b|| (`nnls_gram` of its normal equations)."""
    return nnls_gram(A.T @ A, A.T @ b)


def _nnls_scaled(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    scale = np.linalg.norm(X, axis=0)
    scale[scale == 0] = 1.0
    return nnls(X / scale, y) / scale


def nnls_fit(X: np.ndarray, y: np.ndarray, *, trim: bool = True, keep_frac: float = 0.5,
             groups: np.ndarray | None = None,
             iters: int = 15, relative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Robust non-negative least squares. Returns (coef, mask of rows kept).

    Timings on a shared machine are contaminated one-sidedly (contention only slows things down, by
    varying factors) and in whole time windows. So: least trimmed squares on log(measured/predicted), by
    concentration steps (keep the `keep_frac` of rows that fit best, refit) from several starts (a
    plain fit, an L1 fit, and one fit per group of rows, e.g. per RL step, when `groups` is given);
    the start with the smallest trimmed loss wins; then every row within 3 robust sigmas of it is
    kept and a final NNLS is fitted on those. Without `trim`, or with few rows, plain NNLS."""
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    n, k = X.shape
    coef = _nnls_scaled(X, y)
    keep = np.ones(n, bool)
    if not trim or n < 12:
        return coef, keep
    floor = 1e-6 * max(float(np.median(np.abs(y))), 1e-12)
    ylog = np.log(np.maximum(y, floor))

    def lres(c):  # multiplicative residual: log(measured / predicted)
        return ylog - np.log(np.maximum(X @ c, floor))

    denom = np.maximum(np.abs(y), floor)
    starts = [coef]
    c1 = coef
    for _ in range(10):  # L1 start by iteratively reweighted least squares (relative residuals)
        w = 1.0 / np.sqrt(np.maximum(np.abs(y - X @ c1) / denom, 1e-6)) / denom
        c1 = _nnls_scaled(X * w[:, None], y * w)
    starts.append(c1)
    if groups is not None:
        for gval in np.unique(groups):
            m = groups == gval
            if m.sum() >= k + 2:
                starts.append(_nnls_scaled(X[m], y[m]))
    h = max(int(np.ceil(keep_frac * n)), k + 2)
    best, best_loss = coef, math.inf
    for c in starts:
        prev = None
        for _ in range(iters):  # concentration steps
            rel = np.abs(lres(c))
            idx = np.sort(np.argpartition(rel, h - 1)[:h])
            key = idx.tobytes()
            if key == prev:
                break
            prev = key
            c = _nnls_scaled(X[idx], y[idx])
        rel = np.abs(lres(c))
        loss = float(np.sum(np.partition(rel, h - 1)[:h] ** 2))
        if loss < best_loss - 1e-15:
            best, best_loss = c, loss
    rel = lres(best)
    # consistency: the inner half of a normal sample has RMS 0.378 sigma
    sigma = math.sqrt(best_loss / h) / 0.378 if keep_frac == 0.5 else 1.4826 * float(np.median(np.abs(rel)))
    keep = np.abs(rel) <= max(3.0 * sigma, 1e-9)
    if keep.sum() >= k + 2:
        if relative:  # least squares on relative residuals: every row counts alike, whatever its size
            w = 1.0 / denom[keep]
            best = _nnls_scaled(X[keep] * w[:, None], y[keep] * w)
        else:
            best = _nnls_scaled(X[keep], y[keep])
    else:
        keep = np.ones(n, bool)
    return best, keep


def robust_location(v: np.ndarray) -> float:
    """Mode-seeking location of one-sidedly contaminated values: the mean of the shortest half, then
    the mean of the values within 3 robust sigmas of it."""
    v = np.sort(np.asarray(v, float)[np.isfinite(v)])
    n = len(v)
    if n == 0:
        return math.nan
    if n < 4:
        return float(np.median(v))
    h = (n + 1) // 2
    widths = v[h - 1:] - v[: n - h + 1]
    i = int(np.argmin(widths))
    loc = float(v[i:i + h].mean())
    s = 1.4826 * float(np.median(np.abs(v - loc)))
    near = v[np.abs(v - loc) <= max(3 * s, 1e-12 * abs(loc))]
    return float(near.mean()) if len(near) else loc


@dataclass(frozen=True)
class AffineModel:
    """y = intercept + slope * x, fitted on recorded rows."""

    name: str = field(metadata={"help": "what is modelled, e.g. 'update'"})
    x_name: str = field(metadata={"help": "the regressor, e.g. 'tokens'"})
    intercept: float = field(metadata={"help": "seconds at x = 0"})
    slope: float = field(metadata={"help": "seconds per unit of x"})
    quality: FitQuality = field(metadata={"help": "fit quality on the recorded rows"})

    def predict(self, x):
        return self.intercept + self.slope * np.asarray(x, float)

    @property
    def array(self) -> np.ndarray:
        """(2,) [intercept, slope]: the no-hinge case of `PiecewiseLinear.array` (`hinge_predict`)."""
        return np.array([self.intercept, self.slope], float)


@dataclass(frozen=True)
class PiecewiseLinear:
    """y = offset + g(x), g the linear interpolation of measured (knots, values), continued beyond the end knots
    along the straight line through the two end knots on that side: the measured curve where it was measured, a
    parametric line beyond. A cost is not negative at x = 0: where the line below the first knot would be, g runs
    from the origin to the first knot instead. Used where an AffineModel is, through `predict` (it has no single
    intercept or slope)."""

    name: str = field(metadata={"help": "what is modelled, e.g. 'update'"})
    x_name: str = field(metadata={"help": "the regressor, e.g. 'tokens'"})
    knots: tuple[float, ...] = field(metadata={"help": "x of the measured levels, ascending, at least two"})
    values: tuple[float, ...] = field(metadata={"help": "g at each knot (e.g. forward + backward seconds)"})
    quality: FitQuality = field(metadata={"help": "fit quality on the recorded rows"})
    offset: float = field(default=0.0,
                          metadata={"help": "added everywhere (e.g. the per-update fixed cost: optimizer step)"})

    def __post_init__(self):
        k = np.asarray(self.knots, float)
        if len(k) < 2 or len(k) != len(self.values) or np.any(np.diff(k) <= 0):
            raise ValueError("a piecewise-linear model needs two or more ascending knots with one value each, got "
                             f"{self.knots}")

    def predict(self, x):
        return hinge_predict(self.array, x)

    @property
    def array(self) -> np.ndarray:
        """(2 + 2K,) [a, b, d_1, k_1, ..., d_K, k_K]: y = a + b x + sum_j d_j max(0, x - k_j), a hinge at every knot
        but the last (the row layout of Replicates.update)."""
        return self.coefs(self.knots, self.values, self.offset)

    @staticmethod
    def coefs(knots, values, offset: float = 0.0) -> np.ndarray:
        """`array` of the model through (knots, values) plus `offset`, without making one."""
        k, v = np.asarray(knots, float), np.asarray(values, float)
        s = np.diff(v) / np.diff(k)  # segment slopes
        pairs = [u for j in range(1, len(k) - 1) for u in (s[j] - s[j - 1], k[j])]
        g0 = v[0] - s[0] * k[0]  # the first segment's line at x = 0
        # below the first knot: that line, or from the origin where it would be negative (a hinge at the first knot,
        # of no slope change otherwise, so that every model through the same knots has one layout)
        b = s[0] if g0 >= 0 or k[0] <= 0 else v[0] / k[0]
        return np.array([offset + v[0] - b * k[0], b, s[0] - b, k[0]] + pairs, float)


def hinge_predict(coefs: np.ndarray, x) -> np.ndarray:
    """a + b x + sum_j d_j max(0, x - k_j) of coefficient rows [a, b, d_1, k_1, ...] ((2 + 2K,) or (R, 2 + 2K),
    `PiecewiseLinear.array`, `AffineModel.array`) at x: x's shape, or (R,) + x's shape."""
    c = np.asarray(coefs, float)
    x = np.asarray(x, float)
    lead = c.shape[:-1] + (1,) * x.ndim
    y = c[..., 0].reshape(lead) + c[..., 1].reshape(lead) * x
    for j in range(2, c.shape[-1], 2):
        y = y + c[..., j].reshape(lead) * np.maximum(x - c[..., j + 1].reshape(lead), 0.0)
    return y


def fit_affine(name: str, x_name: str, x, y, *, intercept_hint: float | None = None, groups=None) -> AffineModel:
    """NNLS of y on [1, x] when x spans a range; otherwise (x nearly constant) a proportional model
    through `intercept_hint` (default 0): slope = robust location of (y - a) / x. Empty input: a zero
    model. With `groups` (rows of several traces at different batch sizes): a line by NNLS through the
    robust centre of each group, so a noisy trace cannot tilt it and no trace is trimmed away whole."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(y) == 0:
        return AffineModel(name, x_name, 0.0, 0.0, FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default"))
    X = np.column_stack([np.ones_like(x), x])
    if groups is not None:
        g = np.asarray(groups)[ok]
        ug = np.unique(g)
        cx = np.array([robust_location(x[g == k]) for k in ug])
        cy = np.array([robust_location(y[g == k]) for k in ug])
        pos = cx[cx > 0]
        if len(ug) >= 2 and len(pos) >= 2 and pos.max() / pos.min() >= NARROW_RANGE:
            w = np.sqrt([np.sum(g == k) for k in ug])
            coef = _nnls_scaled(np.column_stack([np.ones_like(cx), cx]) * w[:, None], cy * w)
            return AffineModel(name, x_name, float(coef[0]), float(coef[1]),
                               fit_quality(X, y, coef, 0, f"nnls over {len(ug)} traces"))
    xpos = x[x > 0]
    span = xpos.max() / xpos.min() if len(xpos) else 1.0
    if len(y) >= 5 and span >= NARROW_RANGE:
        coef, keep = nnls_fit(X, y)
        return AffineModel(name, x_name, float(coef[0]), float(coef[1]),
                           fit_quality(X[keep], y[keep], coef, int((~keep).sum()), "nnls"))
    a = float(np.clip(intercept_hint or 0.0, 0.0, robust_location(y)))
    if len(xpos) and np.median(x) > 0:
        b = float(max(robust_location((y - a) / np.maximum(x, 1e-12)), 0.0))
        method = "proportional"
    else:
        a, b, method = robust_location(y), 0.0, "constant"
    coef = np.array([a, b])
    return AffineModel(name, x_name, a, b, fit_quality(X, y, coef, 0, method))
