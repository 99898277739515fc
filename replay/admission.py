"""AReaL's staleness rule (Fu et al. 2025, "staleness-aware" rollout control), stated once for the runner
(runner/split.py) and the simulator (sim/modes/requests.py): which prompts may start, and which finished
prompts an update consumes.

Admission: at policy version v a prompt starts only while the prompts started (consumed, finished, running or
queued) number fewer than (eta + v + 1) x P, so the k-th P prompts start no earlier than version k - eta. A
fractional eta (verl's `staleness_threshold`) admits that share of a batch ahead.

Consumption: the prompt started at version s must be consumed by update ceil(s + eta) (later it would exceed
the limit). Update u takes the P oldest started of the finished prompts (ties: completion order), and only once
that keeps every open prompt schedulable: for each start version s, the open prompts started at <= s left after
this update fit into the updates before their deadline, (ceil(s + eta) - u) x P (earliest deadline first, so it
waits for an old prompt still running rather than take newer ones and leave more due prompts than a batch).
Pure numpy.
"""
from __future__ import annotations

import math

import numpy as np


def admitted(staleness: float, version: int, prompts: int) -> int:
    """Prompts that may have started by `version`: floor((eta + version + 1) x P). The small tolerance keeps a
    product such as (0.3 + 1 + 1) x 100 = 229.99999... at 230."""
    return int(math.floor((staleness + version + 1) * prompts + 1e-9))


def consumed(finished: np.ndarray, open_: np.ndarray, update: int, staleness: float, prompts: int) -> np.ndarray | None:
    """Positions, ascending, of the P finished prompts that `update` consumes, or None while it must wait.

    finished: (n,) the start version of each finished, not yet consumed prompt, in completion order.
    open_: (m,) the start version of every started, not yet consumed prompt (finished or running), m >= n.
    """
    sv = np.asarray(finished)
    if len(sv) < prompts:
        return None
    pick = np.sort(np.lexsort((np.arange(len(sv)), sv))[:prompts])  # oldest started, then completion order
    return pick if schedulable(np.asarray(open_), sv[pick], update, staleness, prompts) else None


def schedulable(open_: np.ndarray, taken: np.ndarray, update: int, staleness: float, prompts: int) -> bool:
    """Whether, after `update` takes the prompts started at `taken`, later updates (P each) can still consume
    every open prompt by its deadline ceil(s + eta)."""
    versions = np.unique(open_)
    left = (np.searchsorted(np.sort(open_), versions, "right")
            - np.searchsorted(np.sort(taken), versions, "right"))
    room = np.maximum(0.0, np.ceil(versions + staleness - 1e-9) - update) * prompts
    return bool(np.all(left <= room))
