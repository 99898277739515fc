"""Chrome trace JSON (opened by the Perfetto UI and chrome://tracing) for recorded and simulated runs.

Both sources go through one intermediate form (`Span`, `CounterSample`), so a recorded trace and a
simulated run show the same lanes (one process each, in this order):

- `rl`: track `RL steps` (one slice per RL step, generation to the end of the step);
- `gen/engine<k>`: tracks `generation rounds`, `engine steps` (one slice per engine step),
  `engine slot <k>` (one slice per response, from the engine step that computed its first token to its
  last; each response takes the lowest free slot, so slices never overlap on a track and there are as
  many slots as sequences ran at once; the queueing time is in the slice's args), counters `gen.running` (sequences in the step) and
  `gen.kv_usage` (fraction of the KV cache in use), plus `gen.waiting` where recorded;
- `host/driver0`: tracks `rewards` (and `other` in simulations: the unaccounted rest of the step);
- `train/trainer<k>`: tracks `batch prep`, `updates`;
- `sync`: track `weight sync`;
- `eval`: track `evals` and the counter `eval.score` (recorded traces only).

Recorded rewards / batch prep sit just before their update (the trace records their length, not their
start); recorded generation rounds run from the step's first request to the end of its generation.
Simulated responses are rebuilt from the engine steps' running and finished counts.

Format: `{"traceEvents": [...]}` with complete events (`ph: "X"`, `ts`/`dur` in microseconds),
metadata events (`ph: "M"`: process_name, thread_name, sort indices) and counters (`ph: "C"`).
Times are kept on a nanosecond grid so slices that touch in the source touch (never overlap) here.
"""
from __future__ import annotations

import heapq
import json
import math
import os
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlsim.replay.errors import RlsimError

# Event kind -> (track label, whether slices of that kind overlap and need slot tracks); also the track order
KIND_TRACKS = {
    "rl_step": ("RL steps", False),
    "gen_round": ("generation rounds", False),
    "gen_step": ("engine steps", False),
    "response": ("engine slot", True),
    "reward": ("rewards", False),
    "other": ("other", False),
    "prep": ("batch prep", False),
    "update": ("updates", False),
    "sync": ("weight sync", False),
    "eval": ("evals", False),
}
LANE_ORDER = ("rl", "gen", "host", "train", "sync", "eval")


@dataclass(frozen=True)
class Span:
    """One slice: `lane` is the process (`gen/engine0`), `kind` its track family (`gen_step`, `response`...)."""

    lane: str
    kind: str
    name: str
    start: float  # seconds
    dur: float  # seconds
    args: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CounterSample:
    lane: str
    name: str
    t: float
    value: float


def _num(v: Any) -> Any:
    """JSON-safe scalar (numpy types out, NaN -> None)."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if math.isnan(f) or math.isinf(f):
            return None
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    return v


# ----------------------------------------------------------------------------------------------
# sources


def spans_from_trace(trace) -> tuple[list[Span], list[CounterSample]]:
    """The recorded run as spans and counter samples (one engine, one trainer: the trace format's v1 layout)."""
    spans: list[Span] = []
    counters: list[CounterSample] = []
    gen, train = "gen/engine0", "train/trainer0"
    g = trace.rows("gen_step")
    for i in range(len(g["kind"])):
        t0, d = float(g["t_start"][i]), float(g["duration"][i])
        args = {k: _num(g[k][i]) for k in ("step", "policy_version", "num_running", "num_waiting", "prefill_tokens",
                                          "decode_tokens", "context_tokens", "kv_usage", "finished")}
        spans.append(Span(gen, "gen_step", "gen.step", t0, d, args))
        counters.append(CounterSample(gen, "gen.running", t0, float(g["num_running"][i])))
        if not np.isnan(float(g["num_waiting"][i])):
            counters.append(CounterSample(gen, "gen.waiting", t0 + d, float(g["num_waiting"][i])))
        if not np.isnan(float(g["kv_usage"][i])):
            counters.append(CounterSample(gen, "gen.kv_usage", t0 + d, float(g["kv_usage"][i])))
    # a response occupies an engine slot from the start of the step that computed its first token to its end
    order = np.argsort(np.asarray(g["t_start"], float), kind="stable")
    step_starts = np.asarray(g["t_start"], float)[order]
    step_ends = step_starts + np.asarray(g["duration"], float)[order]
    r = trace.rows("response")
    for i in range(len(r["kind"])):
        queued = r["t_queued"][i]
        queued = float(r["t_start"][i]) if np.isnan(queued) else float(queued)
        end = r["t_finished"][i]
        end = float(r["t_start"][i]) + float(r["duration"][i]) if np.isnan(end) else float(end)
        first = float(r["t_first_token"][i])
        t0 = queued
        if np.isfinite(first) and len(step_starts):
            k = int(np.searchsorted(step_ends, first - 1e-9))  # the step that ended at its first token
            t0 = float(step_starts[k]) if k < len(step_starts) and step_starts[k] <= first else first
            t0 = min(max(t0, queued), end)
        name = f"p{int(r['prompt_id'][i])}/g{int(r['group_index'][i])}"
        args = {k: _num(r[k][i]) for k in ("step", "policy_version", "prompt_id", "group_index", "prompt_tokens",
                                          "response_tokens", "reward", "consumed_step", "t_queued", "t_first_token")}
        args["queued_s"] = _num(t0 - queued)
        spans.append(Span(gen, "response", name, t0, max(end - t0, 0.0), args))
    # first request and first engine step of each RL step: where its generation round starts
    round_start: dict[int, float] = {}
    for st, t0 in zip(np.asarray(r["step"], float), np.where(np.isnan(r["t_queued"]), r["t_start"], r["t_queued"])):
        if np.isfinite(st) and np.isfinite(t0):
            round_start[int(st)] = min(round_start.get(int(st), math.inf), float(t0))
    gen_end: dict[int, float] = {}
    for st, t0, d in zip(np.asarray(g["step"], float), g["t_start"], g["duration"]):
        if np.isfinite(st):
            round_start[int(st)] = min(round_start.get(int(st), math.inf), float(t0))
            gen_end[int(st)] = max(gen_end.get(int(st), -math.inf), float(t0) + float(d))
    s = trace.rows("sync")
    sync_end: dict[int, float] = {}
    for i in range(len(s["kind"])):
        args = {k: _num(s[k][i]) for k in ("step", "policy_version", "bytes")}
        t0, d = float(s["t_start"][i]), float(s["duration"][i])
        spans.append(Span("sync", "sync", "sync.weights", t0, d, args))
        if np.isfinite(float(s["step"][i])):
            sync_end[int(s["step"][i])] = max(sync_end.get(int(s["step"][i]), -math.inf), t0 + d)
    u = trace.rows("update")
    for i in range(len(u["kind"])):
        args = {k: _num(u[k][i]) for k in ("step", "policy_version", "num_responses", "num_tokens", "lr", "loss",
                                          "reward", "t_forward", "t_backward", "t_optimizer", "grad_norm",
                                          "step_time", "gen_time", "reward_time", "prep_time")}
        t0, d = float(u["t_start"][i]), float(u["duration"][i])
        spans.append(Span(train, "update", "train.update", t0, d, args))
        step = int(u["step"][i])
        prep, rew = float(u["prep_time"][i]), float(u["reward_time"][i])
        t = t0
        if np.isfinite(prep) and prep > 0:
            t -= prep
            spans.append(Span(train, "prep", "train.prep", t, prep, {"step": step}))
        if np.isfinite(rew) and rew > 0:
            spans.append(Span("host/driver0", "reward", "host.reward", t - rew, rew, {"step": step}))
        gt = float(u["gen_time"][i])
        if step in round_start:
            start = round_start[step]
            dur = gt if np.isfinite(gt) and gt > 0 else gen_end.get(step, start) - start
            spans.append(Span(gen, "gen_round", "gen.round", start, dur, {"step": step, "requests": args["num_responses"]}))
        st = float(u["step_time"][i])
        end = sync_end.get(step, t0 + d)
        if np.isfinite(st) and st > 0:
            spans.append(Span("rl", "rl_step", "rl.step", end - st, st, {"step": step, "responses": args["num_responses"]}))
    e = trace.rows("eval")
    for i in range(len(e["kind"])):
        args = {k: _num(e[k][i]) for k in ("step", "policy_version", "cum_responses", "cum_tokens", "score",
                                          "eval_k", "eval_prompts")}
        t0, d = float(e["t_start"][i]), float(e["duration"][i])
        spans.append(Span("eval", "eval", "eval", t0, 0.0 if np.isnan(d) else d, args))
        counters.append(CounterSample("eval", "eval.score", t0, float(e["score"][i])))
    counters += _round_end_samples(spans)
    return spans, counters


_SIM_KIND_BY_NAME = {
    "gen.step": "gen_step", "gen.round": "gen_round", "gen.response": "response", "host.reward": "reward",
    "host.other": "other", "train.prep": "prep", "train.update": "update", "sync.weights": "sync", "rl.step": "rl_step",
    "eval": "eval",
}


def sim_kind(lane: str, name: str) -> str:
    """Track family of a simulated slice, from its namespaced name (`gen.step`, `train.update`...)."""
    if name in _SIM_KIND_BY_NAME:
        return _SIM_KIND_BY_NAME[name]
    tail = name.split(".")[-1]
    if tail in KIND_TRACKS:
        return tail
    return name.replace(".", "_") or lane


def spans_from_simrun(run) -> tuple[list[Span], list[CounterSample]]:
    """A simulated run (`SimRun` with its timeline) in the same intermediate form as a recorded trace,
    with one response slice per finished sequence rebuilt from the engine steps."""
    spans: list[Span] = []
    round_start: dict[tuple[str, object], float] = {}
    steps = []
    for sl in run.timeline:
        args = {k: _num(v) for k, v in (getattr(sl, "args", None) or {}).items() if k != "id"}
        kind = sim_kind(sl.lane, sl.name)
        sp = Span(sl.lane, kind, sl.name, float(sl.start), float(sl.dur), args)
        spans.append(sp)
        if kind == "gen_round":
            round_start[(sl.lane, args.get("update"))] = sp.start
        elif kind == "gen_step":
            steps.append(sp)
    if not any(s.kind == "response" for s in spans):
        spans += _responses_from_steps(steps, round_start)
    counters = []
    for c in getattr(run, "counters", ()) or ():
        t, name, value = (c.t, c.name, c.value) if hasattr(c, "name") else c
        lane = getattr(c, "lane", None) or _counter_lane(name, spans)
        counters.append(CounterSample(lane, name, float(t), float(value)))
    counters += _round_end_samples(spans)
    return spans, counters


def _round_end_samples(spans: Sequence[Span]) -> list[CounterSample]:
    """The engine is empty when a generation round ends: running sequences and KV use drop to 0 there
    (the per-step samples only say what ran in each step)."""
    out = []
    for s in spans:
        if s.kind == "gen_round":
            out.append(CounterSample(s.lane, "gen.running", s.start + s.dur, 0.0))
            out.append(CounterSample(s.lane, "gen.kv_usage", s.start + s.dur, 0.0))
    return out


def _responses_from_steps(steps: Sequence[Span], round_start: dict) -> list[Span]:
    """One slice per finished sequence, rebuilt from engine steps' `num_running` and `finished`: sequences
    admitted in a step (running now minus those left from the step before) start there; each finished
    sequence closes the earliest open one (FIFO). Any matching gives the same running count at every
    instant, so the slot tracks never exceed the engine's concurrency. A fall in running without
    finishes (preemption) drops the newest open sequences; they start again when re-admitted."""
    out: list[Span] = []
    by_round: dict[tuple, list[Span]] = defaultdict(list)
    for sp in steps:
        by_round[(sp.lane, sp.args.get("update"))].append(sp)
    for (lane, update), group in by_round.items():
        group.sort(key=lambda s: s.start)
        if any("num_running" not in s.args for s in group):
            q = round_start.get((lane, update), group[0].start)
            for sp in group:
                for _ in range(int(sp.args.get("finished") or 0)):
                    out.append(Span(lane, "response", "response", q, sp.start + sp.dur - q, {"update": update}))
            continue
        open_: deque[float] = deque()
        left = 0
        for sp in group:
            running = int(sp.args.get("num_running") or 0)
            done = int(sp.args.get("finished") or 0)
            admitted = running - left
            if admitted > 0:
                open_.extend([sp.start] * admitted)
            else:
                for _ in range(min(-admitted, len(open_))):
                    open_.pop()
            end = sp.start + sp.dur
            for _ in range(min(done, len(open_))):
                t0 = open_.popleft()
                out.append(Span(lane, "response", "response", t0, end - t0, {"update": update}))
            left = running - done
    return out


def _counter_lane(name: str, spans: Sequence[Span]) -> str:
    head = name.split(".")[0]
    for s in spans:
        if s.lane.split("/")[0] == head:
            return s.lane
    return f"{head}/engine0" if head == "gen" else head


# ----------------------------------------------------------------------------------------------
# packing and JSON


def _ns(t: float) -> int:
    return int(round(t * 1e9))


def _lane_key(lane: str) -> tuple:
    head = lane.split("/")[0]
    return (LANE_ORDER.index(head) if head in LANE_ORDER else len(LANE_ORDER), lane)


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


def chrome_trace(spans: Sequence[Span], counters: Sequence[CounterSample] = (), *,
                 other: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the Chrome trace JSON object. Every (pid, tid) track holds non-overlapping slices."""
    lanes = sorted({s.lane for s in spans} | {c.lane for c in counters}, key=_lane_key)
    pid_of = {lane: i + 1 for i, lane in enumerate(lanes)}
    meta_events: list[dict] = []
    for lane, pid in pid_of.items():
        meta_events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": lane}})
        meta_events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})

    by_group: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for s in spans:
        by_group[(s.lane, s.kind)].append(s)
    kind_order = {k: i for i, k in enumerate(KIND_TRACKS)}
    next_tid: dict[str, int] = defaultdict(lambda: 1)
    events: list[dict] = []
    for (lane, kind) in sorted(by_group, key=lambda g: (_lane_key(g[0]), kind_order.get(g[1], 99), g[1])):
        group = by_group[(lane, kind)]
        iv = [(_ns(s.start), _ns(s.start) + max(_ns(s.start + s.dur) - _ns(s.start), 0)) for s in group]
        slots = assign_slots(iv)
        label, always_slots = KIND_TRACKS.get(kind, (kind, False))
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
                       "ts": _ns(c.t) / 1000.0, "args": {short: _num(c.value)}})
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    out = {"traceEvents": meta_events + events, "displayTimeUnit": "ms"}
    if other:
        out["otherData"] = other
    return out


def recorded_chrome_trace(trace) -> dict[str, Any]:
    spans, counters = spans_from_trace(trace)
    return chrome_trace(spans, counters, other={"source": "recorded", "trace": str(trace.path),
                                                 "config": trace.config})


def simulated_chrome_trace(run, *, other: dict[str, Any] | None = None) -> dict[str, Any]:
    spans, counters = spans_from_simrun(run)
    return chrome_trace(spans, counters, other={"source": "simulated", **(other or {})})


def write_json(obj: dict[str, Any], out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    out = Path(out)
    if out.exists() and not overwrite:
        raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"), allow_nan=False, default=_json_default)
    os.replace(tmp, out)
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer, np.floating)):
        return _num(o)
    if isinstance(o, np.ndarray):
        return [_num(x) for x in o.tolist()]
    if isinstance(o, Path):
        return str(o)
    return str(o)


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


def export_recorded(trace_path: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> dict[str, int]:
    from rlsim.replay.io import read_trace

    trace = read_trace(trace_path)
    obj = recorded_chrome_trace(trace)
    counts = check_chrome_trace(obj)
    write_json(obj, out, overwrite=overwrite)
    return counts
