"""The timeline of a split run (`rlsim.modes.split`): one lane per engine replica and per trainer rank, plus the
shared host, sync and rl lanes (`rlsim.replay.timeline`). Recording is off unless asked for; slice ids come
from a per-run counter, in the order the slices are recorded."""
from __future__ import annotations

import itertools

import numpy as np

from rlsim.modes.requests import Requests
from rlsim.core.engine import Stretch
from rlsim.replay.timeline import Counter, Slice


def lane_gen(r: int) -> str:
    return f"gen/engine{r}"


def lane_train(m: int) -> str:
    return f"train/trainer{m}"


class Recorder:
    """Slices and counters of one run when `on` (else every call is a no-op)."""

    def __init__(self, on: bool):
        self.on = on
        self.slices: list[Slice] = []
        self.counters: list[Counter] = []
        self.ids = itertools.count()

    def slice(self, lane: str, track: str, name: str, t: float, dur: float, **args) -> None:
        if self.on:
            self.slices.append(Slice(lane, track, name, t, dur, {"id": next(self.ids), **args}))

    def counter(self, lane: str, name: str, t: float, value: float) -> None:
        if self.on:
            self.counters.append(Counter(lane, name, t, value))

    def stretch(self, r: int, x: Stretch, t: float, d: np.ndarray, version: int, kv_tokens: float, kv_cache_tokens: int,
                gap: float) -> None:
        """The engine steps of a stretch on replica r from t: (x.steps,) seconds each in d, `gap` seconds between."""
        lane = lane_gen(r)
        for k in range(x.steps):
            self.slice(lane, "gen_step", "gen.step", t, float(d[k]), num_running=x.num_running,
                       context_tokens=x.context0 + k * x.num_running, prefill_tokens=x.prefill if k == 0 else 0.0,
                       finished=x.finished if k == x.steps - 1 else 0, policy_version=version)
            self.counter(lane, "gen.running", t, float(x.num_running))
            self.counter(lane, "gen.kv_usage", t, float(min(kv_tokens / kv_cache_tokens, 1.0)))
            t += float(d[k]) + gap

    def responses(self, q: Requests) -> None:
        """One slice per finished response, on its replica's lane, with its versions and consuming update."""
        G = q.group
        for i in np.nonzero(np.isfinite(q.t1))[0]:
            c = int(q.cons[i])
            self.slice(lane_gen(int(q.rep[i])), "response", f"p{i // G}/g{i % G}", float(q.t0[i]),
                       float(q.t1[i] - q.t0[i]),
                       prompt_id=int(i // G), group_index=int(i % G), prompt_tokens=int(q.p[i]),
                       response_tokens=int(q.L[i]),
                       start_version=int(q.v0[i]), finish_version=int(q.v1[i]), consumed_update=c if c >= 0 else None,
                       staleness=int(q.cons[i] - q.v0[i]) if c >= 0 else None)

    def ordered(self) -> tuple[list[Slice], list[Counter]]:
        """Slices by (start, longest first) and counters by time, each stable in recording order."""
        return sorted(self.slices, key=lambda s: (s.start, -s.dur)), sorted(self.counters, key=lambda c: c.t)
