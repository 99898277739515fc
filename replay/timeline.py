"""The one timeline type: what a run did, when, on which lane and track.

The simulator records `Slice`s and `Counter`s as it runs (rlsim.core.pipeline), `recorded_timeline` reads
the same from a recorded trace, and every view takes them as they are: the Perfetto export
(rlsim.present.perfetto), the Gantt chart (rlsim.present.charts), the report.

Lanes (one Perfetto process each), in this order: `rl` (RL steps); `gen/engine<k>` (rounds, engine steps, one
slice per response, counters `gen.running`, `gen.kv_usage`, `gen.waiting`); `host/driver<k>` (rewards, `other`);
`train/trainer<k>` (batch preparation, updates, all-reduces); `sync` (weight syncs); `eval` (evaluations, counter
`eval.score`). A simulated split has one engine lane per replica and one trainer lane per rank.

A slice's `track` is its family within a lane (TRACKS, in display order); its `name` is the namespaced
event name (`gen.step`, `train.update`...). Recorded rewards and batch preparation sit just before their
update (the trace records their length, not their start); recorded generation rounds run from the step's
first request to the end of its generation. Times are seconds from the run's start.

No torch, no SimPy: both the simulator and the recorded-trace views use it.
"""
from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from rlsim.replay.steps import step_table

LANE_RL, LANE_GEN, LANE_HOST, LANE_TRAIN, LANE_SYNC, LANE_EVAL = (
    "rl", "gen/engine0", "host/driver0", "train/trainer0", "sync", "eval")
LANES = ("rl", "gen", "host", "train", "sync", "eval")  # display order, by the lane's head

# track -> (label, whether its slices overlap and are laid out on numbered slot tracks); display order
TRACKS = {
    "rl_step": ("RL steps", False),
    "gen_round": ("generation rounds", False),
    "gen_step": ("engine steps", False),
    "response": ("engine slot", True),
    "weight_load": ("weight sync (engine)", False),
    "reward": ("rewards", False),
    "other": ("other", False),
    "prep": ("batch prep", False),
    "update": ("updates", False),
    "allreduce": ("all-reduce", False),
    "sync": ("weight sync", False),
    "eval": ("evals", False),
}


@dataclass(frozen=True)
class Slice:
    """One interval of activity."""

    lane: str = field(metadata={"help": "process: rl, gen/engine0, host/driver0, train/trainer0, sync, eval"})
    track: str = field(metadata={"help": "family within the lane, a key of TRACKS (gen_step, update, ...)"})
    name: str = field(metadata={"help": "namespaced event name: gen.step, train.update, sync.weights, ..."})
    start: float = field(metadata={"help": "seconds from the run's start"})
    dur: float = field(metadata={"help": "seconds"})
    args: dict[str, Any] = field(default_factory=dict, compare=False,
                                 metadata={"help": "extra values (update index, batch composition, ...)"})


@dataclass(frozen=True)
class Counter:
    """One sample of a time series (`gen.running`, `gen.kv_usage`, `eval.score`)."""

    lane: str = field(metadata={"help": "process the series belongs to"})
    name: str = field(metadata={"help": "namespaced series name"})
    t: float = field(metadata={"help": "seconds from the run's start"})
    value: float = field(metadata={"help": "the value from t on"})


def lane_key(lane: str) -> tuple:
    """Sort key: LANES order by the lane's head, then the full name."""
    head = lane.split("/")[0]
    return (LANES.index(head) if head in LANES else len(LANES), lane)


def json_scalar(v: Any) -> Any:
    """JSON-safe scalar for slice args (numpy types out, NaN -> None, integral floats as ints)."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if math.isnan(f) or math.isinf(f):
            return None
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    return v


# phase role (schema `phase_role`) -> (lane, track, name prefix) of its slices
PHASE_LANES = {"gen": (LANE_GEN, "gen_round", "gen"), "reward": (LANE_HOST, "reward", "host"),
               "prep": (LANE_TRAIN, "prep", "train"), "update": (LANE_TRAIN, "update", "train"),
               "sync": (LANE_SYNC, "sync", "sync"), "eval": (LANE_EVAL, "eval", "eval"),
               "checkpoint": (LANE_HOST, "other", "host"), "other": (LANE_HOST, "other", "host")}


def _phase_slices(trace) -> list[Slice]:
    """One slice per logged phase of a step-level trace (`phase` rows; nested phases, which sit inside
    another one, are left out). Empty for traces recorded by rlrun."""
    if "phase" not in trace.table.column_names:
        return []
    p = trace.rows("phase")
    out = []
    for i in range(len(p["kind"])):
        role = str(p["phase_role"][i])
        if role not in PHASE_LANES or not np.isfinite(float(p["t_start"][i])):
            continue
        lane, track, head = PHASE_LANES[role]
        out.append(Slice(lane, track, f"{head}.{p['phase'][i]}", float(p["t_start"][i]), float(p["duration"][i]),
                         {"step": json_scalar(p["step"][i]), "phase": str(p["phase"][i])}))
    return out


def _ids(rows, col: str) -> np.ndarray:
    """Integer ids of a column (engine_id / rank), 0 where null or absent (v1/v2 traces)."""
    n = len(rows["kind"])
    if col not in rows:
        return np.zeros(n, np.int64)
    v = np.asarray(rows[col], float)
    return np.where(np.isfinite(v), v, 0).astype(np.int64)


def recorded_timeline(trace) -> tuple[list[Slice], list[Counter]]:
    """The recorded run as slices and counter samples: a lane per engine replica (`engine_id`) and per training
    rank (`rank`) in split and data-parallel traces; one engine and one trainer in v1/v2 traces."""
    g, r = trace.rows("gen_step"), trace.rows("response")
    spans, counters = _engine_slices(g)
    spans += _response_slices(g, r) + _rank_slices(trace)
    sync, sync_end = _sync_slices(trace)
    spans += sync
    phases = _phase_slices(trace)  # a step-level (imported) trace: its logged phases are the step's lanes
    spans += phases
    spans += _update_slices(trace, phases, *_round_bounds(g, r), sync_end)
    e = trace.rows("eval")
    for i in range(len(e["kind"])):
        args = {k: json_scalar(e[k][i]) for k in ("step", "policy_version", "cum_responses", "cum_tokens", "score",
                                                  "eval_k", "eval_prompts")}
        t0, d = float(e["t_start"][i]), float(e["duration"][i])
        spans.append(Slice(LANE_EVAL, "eval", "eval", t0, 0.0 if np.isnan(d) else d, args))
        counters.append(Counter(LANE_EVAL, "eval.score", t0, float(e["score"][i])))
    counters += _round_end_samples(spans)
    return spans, counters


def _engine_slices(g) -> tuple[list[Slice], list[Counter]]:
    """Each engine step on its replica's lane (engine_id; v1/v2 traces: engine 0), with its counters."""
    spans: list[Slice] = []
    counters: list[Counter] = []
    eng = _ids(g, "engine_id")
    for i in range(len(g["kind"])):
        t0, d = float(g["t_start"][i]), float(g["duration"][i])
        lane = f"gen/engine{eng[i]}"
        args = {k: json_scalar(g[k][i]) for k in ("step", "policy_version", "num_running", "num_waiting",
                                                  "prefill_tokens", "decode_tokens", "context_tokens", "kv_usage",
                                                  "finished")}
        spans.append(Slice(lane, "gen_step", "gen.step", t0, d, args))
        counters.append(Counter(lane, "gen.running", t0, float(g["num_running"][i])))
        if not np.isnan(float(g["num_waiting"][i])):
            counters.append(Counter(lane, "gen.waiting", t0 + d, float(g["num_waiting"][i])))
        if not np.isnan(float(g["kv_usage"][i])):
            counters.append(Counter(lane, "gen.kv_usage", t0 + d, float(g["kv_usage"][i])))
    return spans, counters


def _response_slices(g, r) -> list[Slice]:
    """A response occupies an engine slot from the start of the step that computed its first token to its end."""
    order = np.argsort(np.asarray(g["t_start"], float), kind="stable")
    step_starts = np.asarray(g["t_start"], float)[order]
    step_ends = step_starts + np.asarray(g["duration"], float)[order]
    r_eng = _ids(r, "engine_id")
    spans = []
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
        args = {k: json_scalar(r[k][i]) for k in ("step", "policy_version", "prompt_id", "group_index",
                                                  "prompt_tokens", "response_tokens", "reward", "consumed_step",
                                                  "t_queued", "t_first_token")}
        args["queued_s"] = json_scalar(t0 - queued)
        if "finish_version" in r:
            args["finish_version"] = json_scalar(r["finish_version"][i])
        spans.append(Slice(f"gen/engine{r_eng[i]}", "response", name, t0, max(end - t0, 0.0), args))
    return spans


def _rank_slices(trace) -> list[Slice]:
    """Split and data-parallel traces (schema v3): per-rank compute and all-reduce, and idle intervals."""
    spans = []
    for kind, track, name in (("train_rank", "update", "train.compute"), ("allreduce", "allreduce", "train.allreduce")):
        x = trace.rows(kind)
        ranks = _ids(x, "rank")
        for i in range(len(x["kind"])):
            spans.append(Slice(f"train/trainer{ranks[i]}", track, name, float(x["t_start"][i]),
                               float(x["duration"][i]), {"step": json_scalar(x["step"][i]), "rank": int(ranks[i])}))
    x = trace.rows("idle")
    for i in range(len(x["kind"])):
        e, k = json_scalar(x["engine_id"][i]), json_scalar(x["rank"][i])
        lane, nm = (f"gen/engine{int(e)}",
                    "gen.idle") if e is not None else (f"train/trainer{int(k or 0)}", "train.idle")
        spans.append(Slice(lane, "idle", nm, float(x["t_start"][i]), float(x["duration"][i]),
                           {"policy_version": json_scalar(x["policy_version"][i])}))
    return spans


def _round_bounds(g, r) -> tuple[dict[int, float], dict[int, float]]:
    """Per RL step: where its generation round starts (its first request or engine step), where it ends."""
    round_start: dict[int, float] = {}
    for st, t0 in zip(np.asarray(r["step"], float), np.where(np.isnan(r["t_queued"]), r["t_start"], r["t_queued"])):
        if np.isfinite(st) and np.isfinite(t0):
            round_start[int(st)] = min(round_start.get(int(st), math.inf), float(t0))
    gen_end: dict[int, float] = {}
    for st, t0, d in zip(np.asarray(g["step"], float), g["t_start"], g["duration"]):
        if np.isfinite(st):
            round_start[int(st)] = min(round_start.get(int(st), math.inf), float(t0))
            gen_end[int(st)] = max(gen_end.get(int(st), -math.inf), float(t0) + float(d))
    return round_start, gen_end


def _sync_slices(trace) -> tuple[list[Slice], dict[int, float]]:
    """The weight syncs, and per RL step where its last sync ends."""
    s = trace.rows("sync")
    spans, sync_end = [], {}
    keys = ("step", "policy_version", "bytes") + (("engine_id",) if "engine_id" in s else ())
    for i in range(len(s["kind"])):
        t0, d = float(s["t_start"][i]), float(s["duration"][i])
        spans.append(Slice(LANE_SYNC, "sync", "sync.weights", t0, d, {k: json_scalar(s[k][i]) for k in keys}))
        if np.isfinite(float(s["step"][i])):
            sync_end[int(s["step"][i])] = max(sync_end.get(int(s["step"][i]), -math.inf), t0 + d)
    return spans, sync_end


def _update_slices(trace, phases: list[Slice], round_start: dict[int, float], gen_end: dict[int, float],
                   sync_end: dict[int, float]) -> list[Slice]:
    """Each update with its preparation, rewards, generation round and RL step (a step-level trace: the RL step
    spans its logged phases)."""
    split = (trace.config or {}).get("mode") == "split"
    u = trace.rows("update")
    step_s = step_table(trace)["step_time"]  # the step time's one definition (replay/steps.py)
    spans = []
    for i in range(len(u["kind"])):
        args = {k: json_scalar(u[k][i]) for k in ("step", "policy_version", "num_responses", "num_tokens", "lr", "loss",
                                                  "reward", "t_forward", "t_backward", "t_optimizer", "grad_norm",
                                                  "step_time", "gen_time", "reward_time", "prep_time")}
        t0, d, step = float(u["t_start"][i]), float(u["duration"][i]), int(u["step"][i])
        if phases:  # the phases already show the update, its preparation and the rewards; the step spans them
            mine = [s for s in phases if s.args.get("step") == step]
            if mine:
                a, b = min(s.start for s in mine), max(s.start + s.dur for s in mine)
                spans.append(Slice(LANE_RL, "rl_step", "rl.step", a, b - a, {"step": step}))
            continue
        spans.append(Slice(LANE_TRAIN, "update", "train.update", t0, d, args))
        if split:  # no generation rounds: the replicas generate throughout; gen_time is the trainer's wait
            round_start.pop(step, None)
        prep, rew = float(u["prep_time"][i]), float(u["reward_time"][i])
        t = t0
        if np.isfinite(prep) and prep > 0:
            t -= prep
            spans.append(Slice(LANE_TRAIN, "prep", "train.prep", t, prep, {"step": step}))
        if np.isfinite(rew) and rew > 0:
            spans.append(Slice(LANE_HOST, "reward", "host.reward", t - rew, rew, {"step": step}))
        gt = float(u["gen_time"][i])
        if step in round_start:
            start = round_start[step]
            dur = gt if np.isfinite(gt) and gt > 0 else gen_end.get(step, start) - start
            spans.append(Slice(LANE_GEN, "gen_round", "gen.round", start, dur,
                               {"step": step, "requests": args["num_responses"]}))
        st = float(step_s[i])
        end = sync_end.get(step, t0 + d)
        if np.isfinite(st) and st > 0:
            spans.append(Slice(LANE_RL, "rl_step", "rl.step", end - st, st,
                               {"step": step, "responses": args["num_responses"]}))
    return spans


def simulated_timeline(run) -> tuple[list[Slice], list[Counter]]:
    """A simulated run (`SimRun` recorded with its timeline) in the same form as a recorded trace: its
    slices, one response slice per finished sequence rebuilt from the engine steps, and the counters."""
    slices = [replace(s, args={k: json_scalar(v) for k, v in s.args.items() if k != "id"}) for s in run.timeline]
    round_start = {(s.lane, s.args.get("update")): s.start for s in slices if s.track == "gen_round"}
    if not any(s.track == "response" for s in slices):
        slices += _responses_from_steps([s for s in slices if s.track == "gen_step"], round_start)
    return slices, list(run.counters) + _round_end_samples(slices)


def _round_end_samples(spans: Sequence[Slice]) -> list[Counter]:
    """The engine is empty when a generation round ends: running sequences and KV use drop to 0 there
    (the per-step samples only say what ran in each step)."""
    out = []
    for s in spans:
        if s.track == "gen_round":
            out.append(Counter(s.lane, "gen.running", s.start + s.dur, 0.0))
            out.append(Counter(s.lane, "gen.kv_usage", s.start + s.dur, 0.0))
    return out


def _responses_from_steps(steps: Sequence[Slice], round_start: dict) -> list[Slice]:
    """One slice per finished sequence, rebuilt from engine steps' `num_running` and `finished`: sequences
    admitted in a step (running now minus those left from the step before) start there; each finished
    sequence closes the earliest open one (FIFO). Any matching gives the same running count at every
    instant, so the slot tracks never exceed the engine's concurrency. A fall in running without
    finishes (preemption) drops the newest open sequences; they start again when re-admitted."""
    out: list[Slice] = []
    by_round: dict[tuple, list[Slice]] = defaultdict(list)
    for sp in steps:
        by_round[(sp.lane, sp.args.get("update"))].append(sp)
    for (lane, update), group in by_round.items():
        group.sort(key=lambda s: s.start)
        if any("num_running" not in s.args for s in group):
            q = round_start.get((lane, update), group[0].start)
            for sp in group:
                for _ in range(int(sp.args.get("finished") or 0)):
                    out.append(Slice(lane, "response", "response", q, sp.start + sp.dur - q, {"update": update}))
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
                out.append(Slice(lane, "response", "response", t0, end - t0, {"update": update}))
            left = running - done
    return out
