"""Chrome trace JSON (opened by the Perfetto UI and chrome://tracing) for recorded and simulated runs.

A recorded trace and a simulated run arrive as the same `Slice`s and `Counter`s
(rlsim.replay.timeline, which also fixes the lanes and tracks and their order), so both show the same
processes and tracks. Each lane is one process; each track one thread, or numbered slot threads where
its slices overlap (responses: each takes the lowest free slot, so slices never overlap on a thread and
there are as many slots as sequences ran at once).

Format: `{"traceEvents": [...]}` with complete events (`ph: "X"`, `ts`/`dur` in microseconds),
metadata events (`ph: "M"`: process_name, thread_name, sort indices) and counters (`ph: "C"`).
Times are kept on a nanosecond grid so slices that touch in the source touch (never overlap) here.
"""
from __future__ import annotations

import heapq
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.timeline import TRACKS, Counter, Slice, json_scalar, lane_key, recorded_timeline, simulated_timeline
from rlsim.replay.util import atomic_write, dumps

# ----------------------------------------------------------------------------------------------
# packing and JSON


def _ns(t: float) -> int:
    return int(round(t * 1e9))


def assign_slots(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """Lowest free slot for each (start, end) interval, so intervals on one slot never overlap.
    Intervals that touch (end == next start) may share a slot."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1], i))
    busy: list[tuple[int, int]] = []  # (end, slot)
    free: list[int] = []
    n_slots = 0
    slots = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            slot = heapq.heappop(free)
        else:
            slot, n_slots = n_slots, n_slots + 1
        slots[i] = slot
        heapq.heappush(busy, (end, slot))
    return slots


def chrome_trace(spans: Sequence[Slice], counters: Sequence[Counter] = (), *,
                 other: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the Chrome trace JSON object. Every (pid, tid) track holds non-overlapping slices."""
    lanes = sorted({s.lane for s in spans} | {c.lane for c in counters}, key=lane_key)
    pid_of = {lane: i + 1 for i, lane in enumerate(lanes)}
    meta_events: list[dict] = []
    for lane, pid in pid_of.items():
        meta_events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": lane}})
        meta_events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})

    by_group: dict[tuple[str, str], list[Slice]] = defaultdict(list)
    for s in spans:
        by_group[(s.lane, s.track)].append(s)
    kind_order = {k: i for i, k in enumerate(TRACKS)}
    next_tid: dict[str, int] = defaultdict(lambda: 1)
    events: list[dict] = []
    for (lane, kind) in sorted(by_group, key=lambda g: (lane_key(g[0]), kind_order.get(g[1], 99), g[1])):
        group = by_group[(lane, kind)]
        iv = [(_ns(s.start), _ns(s.start) + max(_ns(s.start + s.dur) - _ns(s.start), 0)) for s in group]
        slots = assign_slots(iv)
        label, always_slots = TRACKS.get(kind, (kind, False))
        n_slots = max(slots) + 1 if slots else 0
        pid = pid_of[lane]
        base = next_tid[lane]
        next_tid[lane] = base + n_slots
        for k in range(n_slots):
            tname = f"{label} {k}" if (always_slots or n_slots > 1) else label
            meta_events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": base + k, "args": {"name": tname}})
            meta_events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": base + k,
                                "args": {"sort_index": base + k}})
        for s, (a, b), slot in zip(group, iv, slots):
            events.append({"ph": "X", "cat": kind, "name": s.name, "pid": pid, "tid": base + slot,
                           "ts": a / 1000.0, "dur": (b - a) / 1000.0, "args": s.args})
    for c in counters:
        short = c.name.split(".")[-1]
        events.append({"ph": "C", "cat": "counter", "name": c.name, "pid": pid_of[c.lane], "tid": 0,
                       "ts": _ns(c.t) / 1000.0, "args": {short: json_scalar(c.value)}})
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    out = {"traceEvents": meta_events + events, "displayTimeUnit": "ms"}
    if other:
        out["otherData"] = other
    return out


def recorded_chrome_trace(trace) -> dict[str, Any]:
    spans, counters = recorded_timeline(trace)
    return chrome_trace(spans, counters, other={"source": "recorded", "trace": str(trace.path),
                                                 "config": trace.config})


def simulated_chrome_trace(run, *, other: dict[str, Any] | None = None) -> dict[str, Any]:
    spans, counters = simulated_timeline(run)
    return chrome_trace(spans, counters, other={"source": "simulated", **(other or {})})


def write_json(obj: dict[str, Any], out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    out = Path(out)
    if out.exists() and not overwrite:
        raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
    return atomic_write(out, dumps(obj, compact=True))


# ----------------------------------------------------------------------------------------------
# validation by the format's own rules (the perfetto package's trace processor cannot run here)


def check_chrome_trace(obj: dict[str, Any]) -> dict[str, int]:
    """Validate a Chrome trace object: required fields per phase, non-negative durations, and slices on
    every (pid, tid) track nesting (each pair either disjoint or one inside the other).
    Returns the number of `X` events per `cat`. Raises ValueError on the first violation."""
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ValueError("not a Chrome trace: no `traceEvents` list")
    tracks: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    named_pids, named_tids = set(), set()
    for ev in obj["traceEvents"]:
        ph = ev.get("ph")
        if ph == "X":
            for k in ("name", "pid", "tid", "ts", "dur"):
                if k not in ev:
                    raise ValueError(f"X event without `{k}`: {ev}")
            if not (isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))) or ev["dur"] < 0:
                raise ValueError(f"X event with bad ts/dur: {ev}")
            a = int(round(ev["ts"] * 1000))
            tracks[(ev["pid"], ev["tid"])].append((a, a + int(round(ev["dur"] * 1000)), ev["name"]))
            counts[ev.get("cat", "")] += 1
        elif ph == "M":
            if ev.get("name") == "process_name":
                named_pids.add(ev["pid"])
            elif ev.get("name") == "thread_name":
                named_tids.add((ev["pid"], ev["tid"]))
            if not isinstance(ev.get("args"), dict):
                raise ValueError(f"M event without args: {ev}")
        elif ph == "C":
            if not isinstance(ev.get("args"), dict) or not ev["args"] or "ts" not in ev:
                raise ValueError(f"C event without ts or args: {ev}")
            for v in ev["args"].values():
                if v is not None and not isinstance(v, (int, float)):
                    raise ValueError(f"C event with a non-numeric value: {ev}")
        elif ph is None:
            raise ValueError(f"event without `ph`: {ev}")
    for (pid, tid), sl in tracks.items():
        if pid not in named_pids or (pid, tid) not in named_tids:
            raise ValueError(f"track pid={pid} tid={tid} has no process_name/thread_name metadata")
        sl.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[int, int, str]] = []
        for a, b, name in sl:
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack and b > stack[-1][1]:
                top = stack[-1]
                raise ValueError(f"slices overlap without nesting on pid={pid} tid={tid}: {top[2]!r} "
                                 f"[{top[0]}, {top[1]}] ns and {name!r} [{a}, {b}] ns")
            stack.append((a, b, name))
    return dict(counts)


def export_recorded(trace_path: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False,
                    drop_invalid: bool = False) -> dict[str, int]:
    trace = read_trace(trace_path, drop_invalid=drop_invalid)
    obj = recorded_chrome_trace(trace)
    counts = check_chrome_trace(obj)
    write_json(obj, out, overwrite=overwrite)
    return counts
