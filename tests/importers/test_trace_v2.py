"""Schema version 2: additive kinds and columns; a version-1 trace reads as before."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rlsim.replay.errors import TraceError
from rlsim.replay.io import read_trace, write_trace
from rlsim.replay.schema import (COLUMN_SINCE, COLUMNS, PHASE, READABLE_VERSIONS, REQUIRED, SCHEMA_VERSION, STEP_STATS,
                                 UPDATE, columns_for_version, kinds_for_version)

ROOT = Path(__file__).resolve().parents[2]
NEW = ("phase", "phase_role", "response_len_mean", "response_len_min", "response_len_max", "response_clip_ratio",
       "prompt_len_mean", "prompt_len_min", "prompt_len_max", "prompt_clip_ratio", "score_mean", "score_min",
       "score_max", "metrics")


def test_version_2_is_additive():
    assert SCHEMA_VERSION >= 2 and READABLE_VERSIONS[:2] == (1, 2)  # version 3 (split mode) is additive too
    assert all(COLUMN_SINCE[c] == 2 for c in NEW)
    assert not set(NEW) & set(columns_for_version(1)) and set(NEW) <= set(columns_for_version(2))
    assert PHASE not in kinds_for_version(1) and STEP_STATS not in kinds_for_version(1)
    assert {PHASE, STEP_STATS} <= set(kinds_for_version(2))
    kinds = {n: k for n, _, k, _ in COLUMNS}
    assert all(set(kinds[c]) <= {PHASE, STEP_STATS} for c in NEW)  # no new column on an old kind
    assert REQUIRED[PHASE] == ("phase", "phase_role", "duration") and REQUIRED[STEP_STATS] == ("metrics",)


def test_a_version_1_trace_reads_as_before():
    path = ROOT / "tests" / "golden" / "traces" / "grpo_p128.parquet"  # as shipped before version 2
    raw = pq.read_table(path)
    assert json.loads(raw.schema.metadata[b"rlsim"])["schema_version"] == 1 and "phase" not in raw.column_names
    t = read_trace(path)
    assert t.meta["schema_version"] == 1  # the file's own metadata
    u = t.rows(UPDATE)
    update_cols = [n for n, _, k, _ in COLUMNS if UPDATE in k]
    v1_update_cols = [n for n in update_cols if COLUMN_SINCE.get(n, 1) == 1]
    assert sorted(u) == sorted(update_cols)
    for c in set(update_cols) - set(v1_update_cols):  # newer columns (version 5's memory peaks): null
        assert np.isnan(u[c].astype(float)).all(), c
    sub = raw.filter(pc.equal(raw["kind"], "update"))
    for c in v1_update_cols:  # the same values as in the file
        if c != "kind":
            want = np.array([np.nan if v is None else v for v in sub[c].to_pylist()], float)
            np.testing.assert_array_equal(u[c].astype(float), want)
    assert t.count(PHASE) == 0 and t.count(STEP_STATS) == 0


def _row(kind, **kw):
    return {"kind": kind, "t_start": 0.0, "duration": 1.0, "step": 0, "policy_version": 0, **kw}


def test_version_2_rows_and_their_required_columns(tmp_path):
    rows = [_row(UPDATE, num_responses=8, num_tokens=80, lr=1e-6), _row(PHASE, phase="gen", phase_role="gen"),
            _row(STEP_STATS, metrics=json.dumps({"a/b": 1.0}), response_len_mean=10.0)]
    t = read_trace(write_trace(tmp_path / "ok.parquet", {"config": {"prompts": 2, "group": 4}}, rows))
    assert t.meta["schema_version"] == SCHEMA_VERSION
    assert t.rows(PHASE)["phase"].tolist() == ["gen"] and json.loads(t.rows(STEP_STATS)["metrics"][0]) == {"a/b": 1.0}
    bad = [rows[0], _row(PHASE, phase="gen")]
    with pytest.raises(TraceError, match="phase_role"):
        read_trace(write_trace(tmp_path / "bad.parquet", {}, bad))
    newer = write_trace(tmp_path / "v99.parquet", {"schema_version": 99}, rows)
    with pytest.raises(TraceError, match="schema version 99"):
        read_trace(newer)
