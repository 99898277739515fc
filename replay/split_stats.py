"""Measured placement metrics of a recorded run: how busy the generation engines and the trainer ranks were,
how stale the trained samples, how much generation overlapped training.

`split_stats(trace)` measures a `rlrun record --mode split` trace (schema version 3: `gen_step` rows per
engine replica, `train_rank` / `allreduce` rows per data-parallel rank, `response` rows with their start
and finish policy versions) the way `rlsim.modes.split` defines the simulated quantities, so a recorded split
can be set beside its prediction; a colocated trace (any schema version) gets the same quantities from
what it has, so colocated and split runs compare in one table.

Measured over a steady-state window (after the first `skip` updates, up to the engines' last step, evals
taken out): responses_per_s, gen_idle_ratio, train_idle_ratio, staleness_mean / _max, partial_responses,
overlap_s. Their definitions, the window and the differences from the simulator that measuring cannot remove:
docs/simulator.md, "Measured placement metrics".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsim.replay.io import read_trace
from rlsim.replay.schema import ALLREDUCE, EVAL, GEN_STEP, IDLE, RESPONSE, SYNC, TRAIN_RANK, UPDATE, placement
from rlsim.replay.steps import step_table

SKIP_UPDATES = 2  # updates before steady state (bench/studies/extrapolation.py SKIP_UPDATES)


@dataclass(frozen=True)
class SplitStats:
    """A recorded run's measured placement metrics (module doc: definitions and the window)."""

    mode: str = field(metadata={"help": "colocated | split (metadata config.mode; older traces: colocated)"})
    gen_devices: int = field(metadata={"help": "generation engine replicas (config gen_devices, or the engines the "
                                               "rows name)"})
    train_devices: int = field(metadata={"help": "data-parallel trainer ranks (config train_devices, or the ranks the "
                                                 "rows name)"})
    max_staleness: int = field(metadata={"help": "staleness limit the run was recorded with (AReaL's eta; 0: "
                                                 "synchronous)"})
    partial_rollout: bool = field(metadata={"help": "in-flight responses continued across weight syncs"})
    responses_per_s: float = field(metadata={"help": "median num_responses / step_time over the updates after the "
                                                     "first skip"})
    gen_idle_ratio: float = field(metadata={"help": "mean over engines of the fraction of the window running no engine "
                                                    "step"})
    train_idle_ratio: float = field(metadata={"help": "mean over ranks of the fraction of the window neither computing "
                                                      "nor communicating"})
    staleness_mean: float = field(metadata={"help": "mean over consumed responses of consumed_step - policy_version"})
    staleness_max: int = field(metadata={"help": "largest consumed_step - policy_version of a consumed response"})
    partial_responses: int = field(metadata={"help": "responses with finish_version > policy_version (spanned a weight "
                                                     "sync)"})
    overlap_s: float = field(metadata={"help": "seconds of the window in which an engine step and a rank's compute ran "
                                               "at once"})
    window: tuple[float, float] = field(metadata={"help": "the measurement window (start, end), seconds from run "
                                                          "start"})

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["window"] = list(d["window"])
        return d


def _f(rows: dict[str, np.ndarray], col: str) -> np.ndarray:
    return np.asarray(rows[col], float)


Intervals = list[tuple[float, float]]  # sorted, disjoint (start, end) pairs


def _union(t: np.ndarray, d: np.ndarray) -> Intervals:
    """The union of the intervals [t, t + d) (rows with NaN or empty intervals left out)."""
    t, d = np.asarray(t, float), np.asarray(d, float)
    ok = np.isfinite(t) & np.isfinite(d) & (d > 0)
    out: Intervals = []
    for a, b in sorted(zip(t[ok].tolist(), (t[ok] + d[ok]).tolist())):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(iv: Intervals) -> float:
    return float(sum(b - a for a, b in iv))


def _intersect(x: Intervals, y: Intervals) -> Intervals:
    """The intervals in both of two interval lists."""
    i = j = 0
    out: Intervals = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(x: Intervals, y: Intervals) -> Intervals:
    """The intervals of x outside y."""
    out: Intervals = []
    for a, b in x:
        for c, e in y:
            if e <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, e)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def _in(win: Intervals, t: np.ndarray, d: np.ndarray) -> Intervals:
    return _intersect(_union(t, d), win)


def _ids(rows: dict[str, np.ndarray], col: str) -> np.ndarray:
    """Engine or rank ids of the rows, null -> 0."""
    v = _f(rows, col)
    return np.where(np.isfinite(v), v, 0.0).astype(np.int64)


def _drain_start(g: dict[str, np.ndarray], e_lo: np.ndarray, e_hi: np.ndarray, hi: float) -> float:
    """The end of the engines' last step outside the evals: after it the engines only wait for the trainer to finish
    what they generated (up to the staleness limit's updates), a tail a steady state does not have. `hi` when the
    trace has no such step."""
    t = _f(g, "t_start")
    end = t + _f(g, "duration")
    in_eval = (((t[:, None] >= e_lo[None, :]) & (t[:, None] < e_hi[None, :])).any(axis=1) if len(e_lo)
               else np.zeros(len(t), bool))
    end = end[~in_eval & np.isfinite(end)]
    return float(end.max()) if len(end) else hi


def split_stats(trace: Any, skip: int = SKIP_UPDATES) -> SplitStats:
    """Measure a trace (a `Trace` or a path): see the module doc for every definition."""
    if isinstance(trace, (str, os.PathLike)):
        trace = read_trace(trace)
    if skip < 0:
        raise ValueError(f"skip must be 0 or more, got {skip}")
    pl = placement(trace.config)
    u, g, s = trace.rows(UPDATE), trace.rows(GEN_STEP), trace.rows(SYNC)
    tr, ar, r = trace.rows(TRAIN_RANK), trace.rows(ALLREDUCE), trace.rows(RESPONSE)
    n = len(u["kind"])
    k = skip if n > skip else 0

    # the window: end of update k-1 (its last sync's end, else the update row's) to the end of the last update
    s_step, s_end = _f(s, "step"), _f(s, "t_start") + _f(s, "duration")
    u_step, u_end = _f(u, "step"), _f(u, "t_start") + _f(u, "duration")

    def end_of(i: int) -> float:
        mine = (s_step == u_step[i]) & np.isfinite(s_end)
        return float(s_end[mine].max()) if mine.any() else float(u_end[i])

    lo = 0.0 if (k == 0 or n == 0) else end_of(k - 1)
    hi = end_of(n - 1) if n else 0.0
    ev = trace.rows(EVAL)  # an eval's t_start is when its score was taken: it ran over [t_start - duration, t_start)
    e_d = np.nan_to_num(_f(ev, "duration"))
    if pl["mode"] == "split" and k:
        hi = min(hi, _drain_start(g, _f(ev, "t_start") - e_d, _f(ev, "t_start"), hi))
    win = _minus([(lo, hi)] if hi > lo else [], _union(_f(ev, "t_start") - e_d, e_d))
    W = _length(win)

    st = step_table(trace)
    if n:
        rate = st["num_responses"] / st["step_time"]
        rps = float(np.median(rate[k:]))
    else:
        rps = math.nan

    # generation engines
    g_t, g_d = _f(g, "t_start"), _f(g, "duration")
    g_id = _ids(g, "engine_id")
    engines = max(int(pl["gen_devices"]), int(g_id.max()) + 1 if len(g_id) else 0, 1)
    g_busy = np.array([_length(_in(win, g_t[g_id == e], g_d[g_id == e])) for e in range(engines)])

    # trainer ranks: each rank's own rows, with the syncs (one collective counts once), plus host seconds
    s_t, s_d = _f(s, "t_start"), _f(s, "duration")
    steady_u = np.arange(n) >= k
    host_cols = ("reward_time",) if not len(tr["kind"]) else ("reward_time", "prep_time", "t_optimizer")
    host = float(sum(np.nansum(_f(u, c)[steady_u]) for c in host_cols))
    if len(tr["kind"]):
        t_id, a_id = _ids(tr, "rank"), _ids(ar, "rank")
        ranks = max(int(pl["train_devices"]), int(t_id.max()) + 1, int(a_id.max()) + 1 if len(a_id) else 0)
        t_t, t_d, a_t, a_d = _f(tr, "t_start"), _f(tr, "duration"), _f(ar, "t_start"), _f(ar, "duration")
        busy = np.array([_length(_in(win, np.concatenate([t_t[t_id == m], a_t[a_id == m], s_t]),
                                     np.concatenate([t_d[t_id == m], a_d[a_id == m], s_d]))) for m in range(ranks)])
        compute = _in(win, t_t, t_d)
    else:  # one trainer: the update rows
        ranks = max(int(pl["train_devices"]), 1)
        u_t, u_d = _f(u, "t_start"), _f(u, "duration")
        busy = np.full(ranks, _length(_in(win, np.concatenate([u_t, s_t]), np.concatenate([u_d, s_d]))))
        compute = _in(win, u_t, u_d)
    busy = np.minimum(busy + host, W)

    overlap = _length(_intersect(_in(win, g_t, g_d), compute))

    # staleness and partial rollouts, over the run's responses
    cs, pv, fv = _f(r, "consumed_step"), _f(r, "policy_version"), _f(r, "finish_version")
    ok = np.isfinite(cs) & np.isfinite(pv)
    lag = cs[ok] - pv[ok]
    with np.errstate(invalid="ignore"):
        partial = int(np.count_nonzero(np.isfinite(fv) & np.isfinite(pv) & (fv > pv)))

    def ratio(b: np.ndarray) -> float:
        return float(np.mean(1.0 - b / W)) if W > 0 else math.nan

    idle = trace.rows(IDLE)
    if len(idle["kind"]):  # a split recording's own idle intervals (see the module doc): idle = 1 - busy here
        i_t, i_d = _f(idle, "t_start"), _f(idle, "duration")
        i_e, i_r = _f(idle, "engine_id"), _f(idle, "rank")
        s_id = _ids(s, "engine_id")
        g_busy = np.array([W - _length(_in(win, np.concatenate([i_t[i_e == e], s_t[s_id == e]]),
                                                np.concatenate([i_d[i_e == e], s_d[s_id == e]])))
                           for e in range(engines)])
        busy = np.array([W - _length(_in(win, i_t[i_r == m], i_d[i_r == m])) for m in range(ranks)])

    return SplitStats(mode=str(pl["mode"]), gen_devices=int(engines), train_devices=int(ranks),
                      max_staleness=int(pl["max_staleness"]), partial_rollout=bool(pl["partial_rollout"]),
                      responses_per_s=rps, gen_idle_ratio=ratio(g_busy), train_idle_ratio=ratio(busy),
                      staleness_mean=float(lag.mean()) if len(lag) else 0.0,
                      staleness_max=int(lag.max()) if len(lag) else 0,
                      partial_responses=partial, overlap_s=float(overlap), window=(float(lo), float(hi)))
