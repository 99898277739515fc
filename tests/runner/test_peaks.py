"""Measured memory peaks: the per-phase high-water mark (runner/peaks.py), the update row's v5 columns, and
`rlrun inspect`'s memory line. No engine needed."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlsim.replay.errors import TraceError
from rlsim.replay.io import read_trace, write_trace
from rlsim.replay.schema import COLUMN_SINCE, INT_RANGES, READABLE_VERSIONS, SCHEMA_VERSION, TOTALS, columns_for_version
from rlsim.runner import peaks
from rlsim.runner.peaks import PhasePeak, resident_peak
from rlsim.runner.summary import memory_lines, summarize

ROOT = Path(__file__).resolve().parents[2]
MEM = ("mem_gen_peak_bytes", "mem_train_peak_bytes")
MB = 1 << 20

linux_hwm = pytest.mark.skipif(not (os.access("/proc/self/clear_refs", os.W_OK) and resident_peak()),
                               reason="needs Linux's /proc/self/clear_refs and VmHWM")


def _phase(nbytes: int) -> None:
    """A fake phase: a block of `nbytes` made resident (every page written), then freed."""
    block = np.ones(nbytes // 8)
    assert block.sum() == nbytes // 8
    del block


@linux_hwm
def test_phase_peak_rises_by_the_block_a_phase_held():
    p = PhasePeak(None)
    p.reset()
    base = resident_peak()
    _phase(256 * MB)
    rise = p.peak() - base
    assert 0.9 * 256 * MB <= rise <= 256 * MB + 64 * MB  # the block, plus a little interpreter noise
    p.reset()  # the next phase does not see the previous one's peak
    _phase(32 * MB)
    assert p.peak() - resident_peak() < 8 * MB and p.peak() - base < 128 * MB


def test_phase_peak_is_none_where_the_high_water_mark_cannot_be_reset(monkeypatch, tmp_path):
    monkeypatch.setattr(peaks, "CLEAR_REFS", tmp_path / "no" / "clear_refs")
    p = PhasePeak("cpu")
    p.reset()
    assert p.peak() is None  # not the whole run's peak passed off as the phase's
    monkeypatch.setattr(peaks, "STATUS", tmp_path / "missing")
    assert resident_peak() is None


def test_version_5_is_additive():
    assert SCHEMA_VERSION >= 5 and READABLE_VERSIONS[:5] == (1, 2, 3, 4, 5)  # version 6 (interference) is additive
    for c in MEM:
        assert COLUMN_SINCE[c] == 5 and c not in columns_for_version(4) and c in columns_for_version(5)
        assert INT_RANGES[c] == TOTALS


def _update(step: int, **kw) -> dict:
    return {"kind": "update", "t_start": step + 0.5, "duration": 0.2, "step": step, "policy_version": step,
            "num_responses": 8, "num_tokens": 160, "lr": 1e-3, "step_time": 1.0, "gen_time": 0.6, "micro_batch": 4,
            "grad_norm": 1.0, "grad_norm_micro": 1.0, "loss": 0.1, "reward": 0.5, **kw}


def test_peaks_round_trip_and_inspect_shows_median_and_max(tmp_path):
    gen, train = [3 * 2 ** 30, 1 * 2 ** 30, 2 * 2 ** 30], [5 * 2 ** 30, 4 * 2 ** 30, 6 * 2 ** 30]
    rows = [_update(s, mem_gen_peak_bytes=g, mem_train_peak_bytes=t) for s, (g, t) in enumerate(zip(gen, train))]
    path = write_trace(tmp_path / "mem.parquet", {"config": {"prompts": 2, "group": 4}, "hardware": {"device": "cpu"}},
                       rows)
    t = read_trace(path)
    u = t.rows("update")
    assert u["mem_gen_peak_bytes"].tolist() == gen and u["mem_train_peak_bytes"].tolist() == train
    line = "memory     peak per update: generation median 2.000, max 3.000 GiB (3 updates); training median 5.000, " \
           "max 6.000 GiB (3 updates) (the recording process's resident-set peak)"
    assert memory_lines(t) == [line] and line in summarize(str(path)).splitlines()


def test_split_trace_inspect_says_generation_was_not_measured(tmp_path):
    rows = [_update(s, mem_train_peak_bytes=(s + 1) * 2 ** 30) for s in range(2)]
    t = read_trace(write_trace(tmp_path / "s.parquet", {"hardware": {"device": "cuda"}}, rows))
    assert memory_lines(t) == ["memory     peak per update: generation not measured; training median 1.500, max 2.000 "
                               "GiB (2 updates) (torch's max_memory_allocated)"]


def test_a_negative_peak_is_refused(tmp_path):
    path = write_trace(tmp_path / "neg.parquet", {}, [_update(0, mem_gen_peak_bytes=-1)])
    with pytest.raises(TraceError, match="mem_gen_peak_bytes"):
        read_trace(path)


def test_an_older_trace_reads_with_null_peaks_and_no_memory_line(tmp_path):
    shipped = ROOT / "traces" / "grpo_p32.parquet"
    raw = pq.read_table(shipped)
    assert not set(MEM) & set(raw.column_names)
    t = read_trace(shipped)
    assert t.meta["schema_version"] < 5
    u = t.rows("update")
    assert all(np.isnan(u[c]).all() for c in MEM) and len(u["step"]) > 0
    assert memory_lines(t) == [] and "memory     peak" not in summarize(str(shipped))
    # a version-5 file must hold them (the reader adds them as nulls only to older files)
    meta = json.loads(raw.schema.metadata[b"rlsim"])
    pq.write_table(raw.replace_schema_metadata({b"rlsim": json.dumps({**meta, "schema_version": 5}).encode()}),
                   tmp_path / "v5_without.parquet")
    with pytest.raises(TraceError, match="lacks columns mem_gen_peak_bytes, mem_train_peak_bytes"):
        read_trace(tmp_path / "v5_without.parquet")
