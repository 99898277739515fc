"""Perfetto / Chrome trace export: valid JSON by the format's rules, slices nest on every track, counts match the
trace."""
import json
from collections import Counter

import pytest

from tests.sim.study_synth import make_trace

from rlsim.replay.io import read_trace  # noqa: E402
from rlsim.present import perfetto as pf
from rlsim.replay.timeline import Counter as Sample, Slice, _responses_from_steps  # noqa: E402


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("tr") / "syn.parquet", prompts=8, group=4, updates=4, max_num_seqs=12)


def _threads(obj):
    return {(e["pid"], e["tid"]): e["args"]["name"]
            for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def _processes(obj):
    return {e["pid"]: e["args"]["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def test_recorded_export_parses_nests_and_counts_match(trace_path, tmp_path):
    out = tmp_path / "recorded.json"
    pf.export_recorded(trace_path, out)
    obj = json.loads(out.read_text())  # strict JSON (no NaN)
    counts = pf.check_chrome_trace(obj)
    trace = read_trace(trace_path)
    for kind in ("gen_step", "response", "update", "sync", "eval"):
        assert counts.get(kind, 0) == trace.count(kind), kind
    procs = _processes(obj)
    assert sorted(procs.values()) == ["eval", "gen/engine0", "host/driver0", "rl", "sync", "train/trainer0"]
    assert counts["gen_round"] == counts["rl_step"] == counts["prep"] == counts["reward"] == trace.count("update")
    threads = _threads(obj)
    gen_pid = next(p for p, n in procs.items() if n == "gen/engine0")
    slot_tracks = [n for (p, _), n in threads.items() if p == gen_pid and n.startswith("engine slot")]
    # a response holds a slot while the engine runs it: as many slots as sequences ran at once
    assert len(slot_tracks) == int(trace.rows("gen_step")["num_running"].max()) == 12
    assert "engine steps" in threads.values() and "updates" in threads.values() and "weight sync" in threads.values()
    counters = Counter(e["name"] for e in obj["traceEvents"] if e["ph"] == "C")
    # one sample per engine step, and 0 when each generation round ends
    assert counters["gen.running"] == trace.count("gen_step") + trace.count("update")
    assert counters["gen.kv_usage"] == trace.count("gen_step") + trace.count("update")
    assert counters["eval.score"] == trace.count("eval")
    for e in obj["traceEvents"]:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0


def test_engine_steps_are_in_microseconds(trace_path):
    trace = read_trace(trace_path)
    obj = pf.recorded_chrome_trace(trace)
    g = trace.rows("gen_step")
    first = min((e for e in obj["traceEvents"] if e.get("cat") == "gen_step"), key=lambda e: e["ts"])
    assert first["ts"] == pytest.approx(g["t_start"].min() * 1e6, abs=1e-3)
    assert first["dur"] == pytest.approx(g["duration"][g["t_start"].argmin()] * 1e6, abs=2e-3)


def test_slot_assignment_uses_lowest_free_slot():
    iv = [(0, 10), (0, 5), (5, 8), (6, 20), (10, 12), (8, 9)]
    slots = pf.assign_slots(iv)
    assert slots == [0, 1, 1, 2, 0, 1]
    per = {}
    for (a, b), s in zip(iv, slots):
        per.setdefault(s, []).append((a, b))
    for spans in per.values():
        spans.sort()
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:]))


def test_checker_rejects_overlap_that_does_not_nest():
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}]
    ok = {"traceEvents": meta + [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                                 {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
                                 {"ph": "X", "name": "c", "pid": 1, "tid": 1, "ts": 10, "dur": 1}]}
    assert pf.check_chrome_trace(ok) == {"": 3}
    bad = {"traceEvents": meta + [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                                  {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]}
    with pytest.raises(ValueError, match="overlap"):
        pf.check_chrome_trace(bad)
    with pytest.raises(ValueError, match="traceEvents"):
        pf.check_chrome_trace({"events": []})


def test_simulated_responses_rebuilt_from_running_and_finished_counts():
    S = Slice
    steps = [S("gen/engine0", "gen_step", "gen.step", 0.0, 1.0, {"update": 0, "num_running": 3, "finished": 1}),
             # 1 admitted
             S("gen/engine0", "gen_step", "gen.step", 1.0, 1.0, {"update": 0, "num_running": 3, "finished": 0}),
             S("gen/engine0", "gen_step", "gen.step", 2.0, 1.0, {"update": 0, "num_running": 3, "finished": 3})]
    rs = _responses_from_steps(steps, {})
    assert sorted((r.start, r.start + r.dur) for r in rs) == [(0.0, 1.0), (0.0, 3.0), (0.0, 3.0), (1.0, 3.0)]
    slots = pf.assign_slots([(int(r.start * 1e9), int((r.start + r.dur) * 1e9)) for r in rs])
    assert max(slots) + 1 == 3  # never more slots than sequences running at once


def test_simulated_spans_take_the_same_lanes():
    class Run:
        timeline = [Slice("gen/engine0", "gen_step", "gen.step", 0.0, 0.01, {"num_running": 2}),
                    Slice("gen/engine0", "gen_step", "gen.step", 0.01, 0.01),
                    Slice("gen/engine0", "response", "p0/g0", 0.0, 0.02, {"prompt_id": 0}),
                    Slice("gen/engine0", "response", "p0/g1", 0.0, 0.01),
                    Slice("train/trainer0", "update", "train.update", 0.02, 0.05),
                    Slice("sync", "sync", "sync.weights", 0.07, 0.001)]
        counters = [Sample("gen/engine0", "gen.running", 0.0, 2), Sample("gen/engine0", "gen.kv_usage", 0.01, 0.1)]

    obj = pf.simulated_chrome_trace(Run())
    counts = pf.check_chrome_trace(obj)
    assert counts == {"gen_step": 2, "response": 2, "update": 1, "sync": 1}
    assert sorted(_processes(obj).values()) == ["gen/engine0", "sync", "train/trainer0"]
    assert sorted(n for n in _threads(obj).values()) == ["engine slot 0", "engine slot 1", "engine steps", "updates",
                                                       "weight sync"]
