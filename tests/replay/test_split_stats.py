"""Schema version 3 (split-mode rows) and the measured placement metrics (replay/split_stats.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlsim.replay.errors import RlsimError, TraceError
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import TraceWriter, read_trace
from rlsim.replay.schema import (ALLREDUCE, COLUMN_SINCE, CONFIG_DEFAULTS, IDLE, KIND_SINCE, READABLE_VERSIONS,
                                 REQUIRED, SCHEMA_VERSION, TRAIN_RANK, columns_for_version, kinds_for_version,
                                 placement)
from rlsim.replay.split_stats import SplitStats, split_stats
from rlsim.replay.steps import step_table

ROOT = Path(__file__).resolve().parents[2]
V1 = sorted((ROOT / "tests" / "golden" / "traces").glob("*.parquet"))
# colocated recordings of other schema versions: the golden net's (v1) and the shipped traces (v2 before the drift
# probe; v4 now): none has split rows
V2 = sorted((ROOT / "traces").glob("*.parquet"))

SPLIT_CONFIG = {"prompts": 2, "group": 2, "G": 2, "batch": 4, "mode": "split", "gen_devices": 2, "train_devices": 2,
                "max_staleness": 1, "partial_rollout": True, "off_policy": "tis", "tis_cap": 2.0, "threads": 1}
# per update u: (sync end, step_time); the syncs end at 2, 4, 8, 10
ENDS, STEP_TIMES = (2.0, 4.0, 8.0, 10.0), (2.0, 2.0, 4.0, 2.0)
# per update: (start version, finish version) of its 4 responses; staleness = u - start
VERSIONS = {0: [(0, 0)] * 4, 1: [(0, 1), (0, 1), (1, 1), (1, 1)], 2: [(1, 1), (1, 1), (2, 2), (2, 2)],
            3: [(1, 2), (2, 2), (3, 3), (3, 3)]}


def _row(**kw):
    return dict(policy_version=kw.pop("policy_version", kw.get("step", 0)), **kw)


def split_rows() -> list[tuple[str, dict]]:
    """A 2-engine, 2-rank split run of 4 updates (B = 4): every split-mode kind, times chosen for hand sums."""
    rows: list[tuple[str, dict]] = []
    gen = {0: [(0.0, 1.5), (3.5, 1.0), (4.5, 1.0), (8.2, 0.6)], 1: [(1.0, 1.0), (6.0, 1.0), (9.0, 0.5)]}
    for e, steps in gen.items():
        for t, d in steps:
            rows.append(("gen_step", _row(t_start=t, duration=d, step=0, engine_id=e, num_running=4, num_waiting=0,
                                          prefill_tokens=8, decode_tokens=4, context_tokens=40, finished=1)))
    syncs = {0: [(1.8, 0.2), (1.8, 0.2)], 1: [(3.8, 0.2), (3.8, 0.2)], 2: [(7.6, 0.3), (7.7, 0.3)],
             3: [(9.8, 0.2), (9.8, 0.2)]}
    for u, per_engine in syncs.items():
        for e, (t, d) in enumerate(per_engine):
            rows.append(("sync", _row(t_start=t, duration=d, step=u, policy_version=u + 1, bytes=1000, engine_id=e)))
    ranks = {1: [(2.5, 1.0), (2.5, 1.0)], 2: [(4.5, 2.0), (4.5, 1.5)], 3: [(8.6, 0.8), (8.6, 0.6)]}
    allreduce = {1: (3.5, 0.2), 2: (6.5, 0.5), 3: (9.4, 0.2)}
    for u, per_rank in ranks.items():
        for m, (t, d) in enumerate(per_rank):
            rows.append(("train_rank", _row(t_start=t, duration=d, step=u, rank=m, num_responses=2, num_tokens=20,
                                            t_forward=d / 2, t_backward=d / 2)))
            rows.append(("allreduce", _row(t_start=allreduce[u][0], duration=allreduce[u][1], step=u, rank=m,
                                           bytes=4000)))
    for u in range(4):
        host = {"reward_time": 0.1, "prep_time": 0.05 if u == 2 else None, "t_optimizer": 0.05}
        rows.append(("update", _row(t_start=ENDS[u] - 1.0, duration=0.8, step=u, num_responses=4, num_tokens=40,
                                    lr=1e-3, step_time=STEP_TIMES[u], gen_time=0.5, loss=0.1, reward=1.0, grad_norm=1.0,
                                    grad_norm_micro=1.0, micro_batch=2, **host)))
        for i, (v0, v1) in enumerate(VERSIONS[u]):
            rows.append(("response", _row(t_start=0.5, duration=1.0, step=u, policy_version=v0, finish_version=v1,
                                          engine_id=i % 2, prompt_id=2 * u + i // 2, group_index=i % 2, prompt_tokens=3,
                                          response_tokens=5, reward=1.0, consumed_step=u)))
    # not consumed
    rows.append(("response", _row(t_start=9.0, duration=0.9, step=3, policy_version=3, finish_version=3, engine_id=1,
                                  prompt_id=8, group_index=0, prompt_tokens=3, response_tokens=5, reward=0.0)))
    # ran 8.5..9.0
    rows.append(("eval", _row(t_start=9.0, duration=0.5, step=3, engine_id=0, cum_responses=12, score=0.5)))
    rows.append(("idle", _row(t_start=7.0, duration=1.2, step=2, engine_id=1)))
    rows.append(("idle", _row(t_start=6.0, duration=0.5, step=2, rank=1)))
    return rows


def write(path: Path, rows, config=SPLIT_CONFIG) -> Path:
    with TraceWriter(path, {"seed": 0, "config": dict(config)}) as w:
        for kind, r in rows:
            w.add(kind, **r)
    return path


@pytest.fixture(scope="module")
def split_path(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("split") / "split.parquet", split_rows())


def test_version_3_is_additive():
    assert SCHEMA_VERSION >= 3 and READABLE_VERSIONS[:3] == (1, 2, 3)
    new = ("engine_id", "rank", "finish_version")
    assert all(COLUMN_SINCE[c] == 3 for c in new)
    assert not set(new) & set(columns_for_version(2)) and set(new) <= set(columns_for_version(3))
    assert ({IDLE, TRAIN_RANK, ALLREDUCE} <= set(kinds_for_version(3))
            and not {IDLE, TRAIN_RANK, ALLREDUCE} & set(kinds_for_version(2)))
    assert all(KIND_SINCE[k] == 3 for k in (IDLE, TRAIN_RANK, ALLREDUCE))
    assert REQUIRED[TRAIN_RANK] == ("t_start", "duration", "rank", "num_responses", "num_tokens")
    assert REQUIRED[ALLREDUCE] == ("t_start", "duration", "bytes", "rank")


def test_version_4_is_additive():
    from rlsim.replay.schema import DRIFT_GEN, DRIFT_TRAIN

    assert SCHEMA_VERSION >= 4 and READABLE_VERSIONS[:4] == (1, 2, 3, 4)
    assert (COLUMN_SINCE["threads"] == 4 and "threads" not in columns_for_version(3)
            and "threads" in columns_for_version(4))
    assert (KIND_SINCE[DRIFT_GEN] == KIND_SINCE[DRIFT_TRAIN] == 4
            and not {DRIFT_GEN, DRIFT_TRAIN} & set(kinds_for_version(3)))


def test_placement_defaults_for_older_configs():
    assert placement(None) == CONFIG_DEFAULTS == {"mode": "colocated", "gen_devices": 1, "train_devices": 1,
                                                  "max_staleness": 0, "partial_rollout": False, "off_policy": "none",
                                                  "tis_cap": 2.0, "threads": 0}
    assert placement({"ranks": 2})["train_devices"] == 2 and placement({"mode": None})["mode"] == "colocated"
    assert placement(SPLIT_CONFIG) == {k: SPLIT_CONFIG[k] for k in CONFIG_DEFAULTS}


def test_split_trace_round_trips(split_path):
    t = read_trace(split_path)
    assert t.meta["schema_version"] == SCHEMA_VERSION and t.dropped == {}
    assert t.count(IDLE) == 2 and t.count(TRAIN_RANK) == 6 and t.count(ALLREDUCE) == 6 and t.count("sync") == 8
    idle = t.rows(IDLE)
    assert (np.isnan(idle["rank"][0]) and idle["engine_id"][0] == 1 and idle["rank"][1] == 1
            and np.isnan(idle["engine_id"][1]))
    assert sorted(t.rows(ALLREDUCE)["bytes"].tolist()) == [4000] * 6
    assert int(np.sum(t.rows("response")["finish_version"] > t.rows("response")["policy_version"])) == 3


def test_split_stats_by_hand(split_path):
    s = split_stats(read_trace(split_path))
    assert isinstance(s, SplitStats)
    assert (s.mode, s.gen_devices, s.train_devices, s.max_staleness, s.partial_rollout) == ("split", 2, 2, 1, True)
    # end of update 1's sync .. the end of the engines' last step outside the eval (engine 1's [9.0, 9.5); after it
    # they only wait for the trainer's last update), not update 3's sync at 10.0; the eval's 0.5 s leave W = 5.0
    assert s.window == (4.0, 9.5)
    assert s.responses_per_s == pytest.approx(1.5)  # median(4 / 4, 4 / 2) over updates 2, 3
    # the trace has idle rows, so those define idleness: engine 0 only loads weights in the window, [7.6, 7.9): 0.3;
    # engine 1 waits [7.0, 8.2) (its load [7.7, 8.0) inside it): 1.2
    assert s.gen_idle_ratio == pytest.approx((0.3 / 5.0 + 1.2 / 5.0) / 2)
    # rank 1 waited [6.0, 6.5); rank 0 never
    assert s.train_idle_ratio == pytest.approx((0.0 + 0.5 / 5.0) / 2)
    # without idle rows, the busy intervals: engine 0: [4.0, 4.5) of the step at 3.5, 1.0, and [8.2, 8.5) (the eval
    # took 8.5..9.0): 1.8; engine 1: 1.0 + 0.5
    busy_only = read_trace(write(split_path.with_name("no_idle.parquet"), [r for r in split_rows() if r[0] != "idle"]))
    b = split_stats(busy_only)
    assert b.gen_idle_ratio == pytest.approx(((1 - 1.8 / 5.0) + (1 - 1.5 / 5.0)) / 2)
    # syncs in the window: [7.6, 8.0) = 0.4; host: rewards 0.2 + prep 0.05 + optimizer 0.1 = 0.35
    # rank 0: 2.0 + 0.4 (its 8.6..9.4 less the eval) + all-reduces 0.5 + 0.1 (9.4..9.5); rank 1: 1.5 + 0.2 + 0.5 + 0.1
    busy0, busy1 = 2.0 + 0.4 + 0.6 + 0.4 + 0.35, 1.5 + 0.2 + 0.6 + 0.4 + 0.35
    assert b.train_idle_ratio == pytest.approx(((1 - busy0 / 5.0) + (1 - busy1 / 5.0)) / 2)
    assert s.staleness_mean == pytest.approx(7 / 16) and s.staleness_max == 2  # lags 0 x4, 1 1 0 0, 1 1 0 0, 2 1 0 0
    assert s.partial_responses == 3
    # engine steps [4.0, 5.5) [6.0, 7.0) [8.2, 8.5) [9.0, 9.5) x rank compute [4.5, 6.5) [9.0, 9.4)
    assert s.overlap_s == pytest.approx(1.0 + 0.5 + 0.4)
    d = s.to_dict()
    assert d["window"] == [4.0, 9.5] and set(d) == set(SplitStats.__dataclass_fields__)
    assert all(f.metadata.get("help") for f in SplitStats.__dataclass_fields__.values())


def test_split_stats_whole_run(split_path):
    s = split_stats(read_trace(split_path), skip=0)
    assert s.window == (0.0, 10.0) and s.responses_per_s == pytest.approx(2.0)  # median(2, 2, 1, 2)
    assert split_stats(read_trace(split_path), skip=4).window == (0.0, 10.0)  # no more updates than skip: all of them


def test_colocated_by_hand(tmp_path):
    rows = []
    for u, (gens, upd, syn) in enumerate([([(0.0, 1.0), (1.0, 1.0)], (2.5, 1.0), (3.5, 0.5)),
                                          ([(4.0, 1.5)], (6.0, 1.5), (7.5, 0.5))]):
        for t, d in gens:
            rows.append(("gen_step", _row(t_start=t, duration=d, step=u, num_running=2, prefill_tokens=3,
                                          decode_tokens=2, context_tokens=10)))
        rows.append(("update", _row(t_start=upd[0], duration=upd[1], step=u, num_responses=2, num_tokens=20, lr=1e-3,
                                    step_time=4.0, gen_time=2.0, reward_time=0.5, t_optimizer=0.1, prep_time=0.0)))
        rows.append(("sync", _row(t_start=syn[0], duration=syn[1], step=u, policy_version=u + 1, bytes=100)))
        for g in range(2):
            rows.append(("response", _row(t_start=0.0, duration=1.0, step=u, prompt_id=u, group_index=g,
                                          prompt_tokens=3, response_tokens=2, reward=1.0, consumed_step=u)))
    s = split_stats(read_trace(write(tmp_path / "c.parquet", rows, {"prompts": 1, "group": 2})), skip=1)
    assert (s.mode, s.gen_devices, s.train_devices, s.max_staleness, s.partial_rollout) == ("colocated", 1, 1, 0, False)
    assert s.window == (4.0, 8.0) and s.responses_per_s == pytest.approx(0.5)
    assert s.gen_idle_ratio == pytest.approx(1 - 1.5 / 4)
    assert s.train_idle_ratio == pytest.approx(1 - (1.5 + 0.5 + 0.5) / 4)  # update (optimizer inside) + sync + rewards
    assert (s.staleness_mean, s.staleness_max, s.partial_responses, s.overlap_s) == (0.0, 0, 0, 0.0)


@pytest.mark.parametrize("path", V1 + V2, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_older_traces_read_and_give_colocated_stats(path):
    version = json.loads(pq.read_schema(path).metadata[b"rlsim"])["schema_version"]
    assert version in (1, 2, 4)
    t = read_trace(path)
    assert t.meta["schema_version"] == version and t.dropped == {}
    for c in ("engine_id", "rank", "finish_version"):
        assert t.table[c].null_count == t.table.num_rows
    s = split_stats(t)
    assert (s.mode, s.gen_devices, s.train_devices, s.max_staleness, s.partial_rollout) == ("colocated", 1, 1, 0, False)
    st = step_table(t)
    assert s.responses_per_s == pytest.approx(float(np.median((st["num_responses"] / st["step_time"])[2:])))
    assert 0 < s.gen_idle_ratio < 1 and 0 < s.train_idle_ratio < 1
    assert (s.staleness_mean, s.staleness_max, s.partial_responses, s.overlap_s) == (0.0, 0, 0, 0.0)


def _bad(tmp_path, edit) -> Path:
    rows = split_rows()
    edit(rows)
    return write(tmp_path / "bad.parquet", rows)


@pytest.mark.parametrize("edit, kind, col, what", [
    (lambda rows: rows[0][1].update(engine_id=-1), "gen_step", "engine_id", "negative `engine_id`"),
    (lambda rows: next(r for k, r in rows if k == IDLE).update(rank=0), IDLE, "engine_id",
     "both or neither of `engine_id` and `rank`"),
    (lambda rows: next(r for k, r in rows if k == IDLE).pop("engine_id"), IDLE, "engine_id", "both or neither"),
    (lambda rows: next(r for k, r in rows if k == TRAIN_RANK).update(rank=-2), TRAIN_RANK, "rank", "negative `rank`"),
    (lambda rows: next(r for k, r in rows if k == ALLREDUCE).update(duration=-0.1), ALLREDUCE, "duration",
     "negative `duration`"),
    (lambda rows: next(r for k, r in rows if k == "response" and r["policy_version"] == 1).update(finish_version=0),
     "response", "finish_version", "`finish_version` below their `policy_version`"),
])
def test_invalid_split_rows_fail_in_one_line_or_are_dropped(tmp_path, edit, kind, col, what):
    bad = _bad(tmp_path, edit)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    msg = str(err.value)
    assert "\n" not in msg and what in msg and f"`{kind}` row" in msg and "--drop-invalid" in msg, msg
    t = read_trace(bad, drop_invalid=True)
    assert t.dropped == {f"{kind}.{col}": 1} and len(t.warnings) == 1 and t.dropped_rows(kind) == 1
    assert t.count(kind) == sum(k == kind for k, _ in split_rows()) - 1


@pytest.mark.parametrize("field, value, what", [("mode", "async", "colocated or split"),
                                                 ("gen_devices", 0, "a positive integer"),
                                                 ("partial_rollout", 1, "true or false"),
                                                 ("max_staleness", -1, "non-negative")])
def test_bad_placement_metadata_fails(tmp_path, field, value, what):
    with pytest.raises(TraceError, match=f"config.{field}.*{what}"):
        read_trace(write(tmp_path / "m.parquet", split_rows(), {**SPLIT_CONFIG, field: value}))


def test_fit_and_replay_refuse_a_split_trace(split_path):
    want = ("split was recorded in split mode; fit a colocated recording (rlrun record --mode colocated) and predict "
            "the split with --gen-gpus/--train-gpus/--staleness")
    t = read_trace(split_path)
    with pytest.raises(RlsimError) as err:
        fit_trace(t)
    assert str(err.value) == want
    with pytest.raises(RlsimError) as err:
        fit_trace([read_trace(V2[0]), t])
    assert str(err.value) == want
    from rlsim.whatif.fidelity import replay_trace

    with pytest.raises(RlsimError, match="recorded in split mode"):
        replay_trace(t)


def test_fit_ignores_split_kinds_in_a_colocated_trace(tmp_path):
    """A colocated v3 trace with train_rank / allreduce / idle rows fits as without them."""
    from rlsim.replay.synthetic import SynthSpec, synthetic_trace

    base = read_trace(synthetic_trace(tmp_path / "base.parquet", SynthSpec(steps=4)))
    rows = [{k: v for k, v in r.items() if v is not None} for r in base.table.to_pylist()]
    extra = [("train_rank", _row(t_start=0.0, duration=0.1, step=0, rank=0, num_responses=1, num_tokens=5)),
             ("allreduce", _row(t_start=0.1, duration=0.0, step=0, rank=0, bytes=10)),
             ("idle", _row(t_start=0.0, duration=0.01, step=0, rank=0))]
    with TraceWriter(tmp_path / "more.parquet", base.meta) as w:
        for r in rows:
            w.add(r.pop("kind"), **r)
        for kind, r in extra:
            w.add(kind, **r)
    a, b = fit_trace(base), fit_trace(read_trace(tmp_path / "more.parquet"))
    assert a.gen == b.gen and a.update.slope == b.update.slope and a.sync_bytes == b.sync_bytes


def test_notebook_api_and_inspect(split_path):
    import rlsim
    from rlsim.runner.summary import summarize

    d = rlsim.split_stats(split_path)
    assert d["mode"] == "split" and d["staleness_max"] == 2 and d["window"] == [4.0, 9.5]
    out = summarize(str(split_path))
    assert "2 generation engines : 2 trainer ranks, max staleness 1, partial rollout on, off-policy tis" in out
    assert "staleness  mean 0.44, max 2 policy versions; 3 responses spanned a weight sync" in out
    assert "generation overlapped training 1.9 s" in out
    assert "split " not in summarize(str(V2[0]))


def test_recorded_timeline_has_a_lane_per_engine_and_rank(split_path):
    from rlsim.replay.timeline import recorded_timeline

    spans, _ = recorded_timeline(read_trace(split_path))
    steps = {s.lane for s in spans if s.name == "gen.step"}
    assert steps == {"gen/engine0", "gen/engine1"}
    assert sum(s.name == "gen.step" and s.lane == "gen/engine1" for s in spans) == 3
    assert {s.lane for s in spans if s.name == "train.compute"} == {"train/trainer0", "train/trainer1"}
    assert {s.lane for s in spans if s.name == "train.allreduce"} == {"train/trainer0", "train/trainer1"}
    assert any(s.name == "gen.idle" for s in spans) and any(s.name == "train.idle" for s in spans)
    assert not any(s.name == "gen.round" for s in spans)  # no generation rounds in a split run
    assert {s.args.get("engine_id") for s in spans if s.name == "sync.weights"} == {0, 1}
