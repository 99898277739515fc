"""A probe trace (`rlrun probe`): each size's measured throughput and its throughput gain sigma, paired by round.

A probe runs full RL steps at several sizes in one process, every size once per round in a shuffled order.
Here each update row is one step: its size is B = num_responses (P = B / G), its round step // (number of
sizes), its throughput num_responses / step_time. sigma of a size is its responses/s over the smallest
size's IN THE SAME ROUND, so the machine's drift between rounds cancels; over rounds it is summarised by the
geometric mean, with a t interval on the log ratios (none from one round). This is the measured truth that
`rlsim run` predicts (bench/studies/extrapolation.py compares them).

A probe is not a run: its steps change size and it has no evals, so the simulator's commands refuse it as
a trace to fit (`refuse_probe`, called wherever they load traces), and `rlrun inspect` prints this instead.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace, read_trace
from rlsim.replay.steps import step_table

PROBE = "probe"  # metadata `kind` of a probe trace
LEVEL = 0.90


def is_probe(trace: Trace) -> bool:
    return trace.meta.get("kind") == PROBE


def _sizes(trace: Trace) -> list[int]:
    return sorted(int(p) for p in (trace.meta.get(PROBE) or {}).get("sizes") or [])


def refuse_probe(trace: Trace) -> Trace:
    """`trace` as it is, unless it is a probe trace: that is one line saying where its measured sigma is read."""
    if is_probe(trace):
        sizes = ",".join(map(str, _sizes(trace))) or "several sizes"
        raise RlsimError(f"{trace.path} is an `rlrun probe` trace (paired throughput at P={sizes}), not a run to "
                         f"extrapolate from: read its measured sigma with `rlrun inspect {trace.path}`")
    return trace


@dataclass(frozen=True)
class ProbeSize:
    """One probed size: its measured throughput and its throughput gain over the smallest size."""
    prompts: int  # P
    group: int  # G
    responses: int  # B = P x G
    rounds: int  # rounds that measured both this size and the smallest (the pairs sigma rests on)
    responses_per_s: float  # median over rounds of num_responses / step_time
    per_round: tuple[float, ...]  # responses/s in each round (NaN where the round did not run it: an interrupted probe)
    sigma: float  # geometric mean over rounds of responses/s over the smallest size's in the same round
    sigma_lo: float  # its interval (NaN with fewer than two pairs)
    sigma_hi: float
    sigma_per_round: tuple[float, ...]  # each round's ratio (NaN where unpaired)


@dataclass(frozen=True)
class ProbeSigma:
    """Every probed size, the smallest (sigma 1, the reference) first."""
    trace: str
    rows: tuple[ProbeSize, ...]
    rounds: int  # rounds with at least one probed step
    level: float
    interval: str  # how the intervals were made, or why there are none

    def row(self, prompts: int) -> ProbeSize:
        for r in self.rows:
            if r.prompts == prompts:
                return r
        raise RlsimError(f"{self.trace} did not probe P={prompts}; it probed "
                         f"P={','.join(str(r.prompts) for r in self.rows)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_sigma(trace: Trace | str | os.PathLike, *, level: float = LEVEL) -> ProbeSigma:
    """Each size's responses/s per round and sigma paired within rounds, from a probe trace's update rows."""
    t = trace if isinstance(trace, Trace) else read_trace(trace)
    if not is_probe(t):
        raise RlsimError(f"{t.path} is not an `rlrun probe` trace (metadata kind {t.meta.get('kind')!r}); record one "
                         "with `rlrun probe --prompts 16,64,256 ...`")
    sizes, group = _sizes(t), int((t.meta.get(PROBE) or {}).get("group") or t.config.get("group") or 0)
    if len(sizes) < 2 or group < 1:
        raise RlsimError(f"{t.path}: its `probe` metadata lacks the sizes or the group; re-record it with "
                         "`rlrun probe`")
    rps = _per_round(t, sizes, group)  # rounds x sizes
    if not rps.size:
        raise RlsimError(f"{t.path} has no probed steps (no update rows): the probe stopped before its first step")
    log_ratio = np.log(rps) - np.log(rps[:, :1])
    rows = tuple(_size(p, group, rps[:, i], log_ratio[:, i], level) for i, p in enumerate(sizes))
    n = int(np.sum(np.isfinite(log_ratio[:, 1:]).any(axis=1)))
    interval = (f"{100 * level:g} % t interval on the log ratios over {n} rounds" if n >= 2 else
                f"{n} paired round{'s' if n != 1 else ''}: no interval (probe with --rounds 2 or more for one)")
    return ProbeSigma(str(t.path), rows, len(rps), level, interval)


def _per_round(t: Trace, sizes: list[int], group: int) -> np.ndarray:
    """responses/s of each (round, size), NaN where not measured: over the steps of its visit after the first when a
    visit ran several (`visit_steps`; the first settles the switch from the previous size)."""
    u = t.rows("update")
    steps, resp, step_time = u["step"].astype(int), u["num_responses"].astype(float), step_table(t)["step_time"]
    k, v = len(sizes), int((t.meta.get(PROBE) or {}).get("visit_steps") or 1)
    rounds = int(steps.max()) // (k * v) + 1 if len(steps) else 0
    b_sum, t_sum = np.zeros((rounds, k)), np.zeros((rounds, k))
    for s, b, dt in zip(steps, resp, step_time):
        p = b / group
        if p not in sizes:
            raise RlsimError(f"{t.path}: update step {s} trained {b:g} responses, not P x G of a probed size "
                             f"(P={','.join(map(str, sizes))}, G={group}); re-record it with `rlrun probe`")
        r, i = s // (k * v), sizes.index(int(p))
        if v > 1 and s % v == 0:
            continue  # the visit's first step: the switch of size
        if t_sum[r, i] > 0 and v == 1:
            raise RlsimError(f"{t.path}: round {r + 1} ran P={int(p)} twice; re-record it with `rlrun probe`")
        if dt > 0:
            b_sum[r, i] += b
            t_sum[r, i] += dt
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t_sum > 0, b_sum / t_sum, np.nan)


def _size(p: int, group: int, rps: np.ndarray, log_ratio: np.ndarray, level: float) -> ProbeSize:
    """One size's row: the median throughput, and the paired ratios' geometric mean with a t interval."""
    x = log_ratio[np.isfinite(log_ratio)]
    n = len(x)
    mean = float(np.mean(x)) if n else math.nan
    lo = hi = math.nan
    if n >= 2:
        from scipy.stats import t as student_t  # why here: scipy.stats adds ~0.3 s to every import of this module

        half = float(student_t.ppf(0.5 + level / 2, n - 1)) * float(np.std(x, ddof=1)) / math.sqrt(n)
        lo, hi = math.exp(mean - half), math.exp(mean + half)
    finite = rps[np.isfinite(rps)]
    return ProbeSize(prompts=p, group=group, responses=p * group, rounds=n,
                     responses_per_s=float(np.median(finite)) if len(finite) else math.nan,
                     per_round=tuple(float(v) for v in rps), sigma=math.exp(mean) if n else math.nan,
                     sigma_lo=lo, sigma_hi=hi, sigma_per_round=tuple(float(v) for v in np.exp(log_ratio)))
