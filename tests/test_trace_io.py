"""The trace format: round trip, crash recovery, and one-line errors for bad files."""
import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsim.replay.errors import TraceError
from rlsim.replay.io import TraceWriter, partial_path, read_trace, recording, write_trace
from rlsim.replay.schema import COLUMN_NAMES, SCHEMA_VERSION, arrow_schema


def _gen(step):
    return dict(t_start=step * 1.0, duration=0.25, step=step, policy_version=step, num_running=8,
                prefill_tokens=0, decode_tokens=8, context_tokens=80)


def test_writer_round_trip(tmp_path):
    out = tmp_path / "run.parquet"
    with TraceWriter(out, {"config": {"prompts": 4, "group": 2}, "seed": 3}) as w:
        for s in range(3):
            w.add("gen_step", **_gen(s))
            w.add("update", t_start=s + 0.5, duration=0.1, step=s, policy_version=s, num_responses=8,
                  num_tokens=160, lr=1e-3 * (s + 1))
            w.flush()
    assert not partial_path(out).exists()
    t = read_trace(out)
    assert t.meta["schema_version"] == SCHEMA_VERSION and t.meta["status"] == "complete"
    assert t.config == {"prompts": 4, "group": 2} and not t.recovered
    assert t.count("gen_step") == 3 and t.count("sync") == 0
    assert list(t.rows("update")["lr"]) == pytest.approx([1e-3, 2e-3, 3e-3])


def test_writer_refuses_to_clobber(tmp_path):
    out = tmp_path / "run.parquet"
    write_trace(out, {"config": {}}, [])
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(out, {}).open()


def test_writer_rejects_foreign_columns(tmp_path):
    w = TraceWriter(tmp_path / "x.parquet", {})
    with pytest.raises(ValueError, match="do not apply"):
        w.add("sync", bytes=1, score=0.5)


def test_sigkill_leaves_readable_trace(tmp_path):
    out = tmp_path / "killed.parquet"
    code = f"""
import os, signal
from rlsim.replay.io import TraceWriter
w = TraceWriter({str(out)!r}, {{"config": {{}}}}).open()
for s in range(4):
    w.add("sync", t_start=s, duration=0.01, step=s, policy_version=s + 1, bytes=100)
    w.flush()
w.add("sync", t_start=9, duration=0.01, step=9, policy_version=9, bytes=100)  # never flushed
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and partial_path(out).exists()
    t = read_trace(out)
    assert t.recovered and t.meta["status"] == "partial"
    assert list(t.rows("sync")["step"]) == [0, 1, 2, 3]


def test_newer_partial_stream_wins_over_an_older_complete_trace(tmp_path):
    """An --overwrite run that dies leaves its stream beside the older complete trace: the reader takes
    the newer of the two; the old trace is not touched until a new run completes."""
    out = tmp_path / "run.parquet"
    write_trace(out, {"config": {"prompts": 1}}, [{"kind": "gen_step", **_gen(0)}])
    w = TraceWriter(out, {"config": {"prompts": 2}}, overwrite=True).open()
    for s in range(2):
        w.add("gen_step", **_gen(s))
    w.flush()  # the run "dies" here: the stream is never closed
    os.utime(out, (1, 1))  # the complete trace is older
    t = read_trace(out)
    assert t.recovered and t.config == {"prompts": 2} and t.count("gen_step") == 2
    os.utime(partial_path(out), (0, 0))  # a stale stream older than the complete trace
    t = read_trace(out)
    assert not t.recovered and t.config == {"prompts": 1} and t.count("gen_step") == 1


def test_interrupt_finishes_cleanly(tmp_path):
    out = tmp_path / "int.parquet"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter(out, {"config": {}}) as w:
            w.add("gen_step", **_gen(0))
            raise KeyboardInterrupt
    t = read_trace(out)
    assert t.meta["status"] == "interrupted" and t.count("gen_step") == 1


def test_recording_ends_a_run_on_ctrl_c_and_fails_on_errors(tmp_path):
    logs = []
    out = tmp_path / "ctrl_c.parquet"
    with recording(TraceWriter(out, {"config": {}}), logs.append) as w:  # Ctrl-C ends the run, it does not propagate
        w.add("gen_step", **_gen(0))
        w.flush()
        w.add("gen_step", **_gen(1))
        raise KeyboardInterrupt
    t = read_trace(out)
    assert t.meta["status"] == "interrupted" and t.count("gen_step") == 2
    assert logs == [f"interrupted; trace written: {out} (2 rows)"]
    out2 = tmp_path / "failed.parquet"
    with pytest.raises(ValueError, match="boom"):
        with recording(TraceWriter(out2, {"config": {}}), logs.append) as w:
            w.add("gen_step", **_gen(0))
            raise ValueError("boom")
    assert read_trace(out2).meta["status"] == "failed: ValueError" and read_trace(out2).count("gen_step") == 1
    out3 = tmp_path / "ok.parquet"
    with recording(TraceWriter(out3, {"config": {}}), logs.append) as w:
        w.add("gen_step", **_gen(0))
    assert read_trace(out3).meta["status"] == "complete" and logs[-1] == f"trace written: {out3} (1 rows)"


@pytest.mark.parametrize("case, message", [
    ("missing", "trace not found"),
    ("not_parquet", "not a readable Parquet file"),
    ("no_meta", "no `rlsim` metadata"),
    ("old_version", "schema version 0"),
    ("missing_column", "lacks columns"),
    ("null_required", "have no `num_running`"),
])
def test_bad_files_fail_with_one_line(tmp_path, case, message):
    path = tmp_path / "bad.parquet"
    good = [{"kind": "gen_step", **_gen(0)}]
    if case == "not_parquet":
        path.write_text("not parquet at all")
    elif case == "no_meta":
        pq.write_table(pa.Table.from_pylist(good, schema=arrow_schema()), path)
    elif case == "old_version":
        write_trace(path, {"config": {}}, good)
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({b"rlsim": json.dumps({"schema_version": 0}).encode()}), path)
    elif case == "missing_column":
        write_trace(path, {"config": {}}, good)
        pq.write_table(pq.read_table(path).drop_columns(["kv_usage"]), path)
    elif case == "null_required":
        write_trace(path, {"config": {}}, [{**good[0], "num_running": None}])
    with pytest.raises(TraceError, match=message) as err:
        read_trace(path)
    assert "\n" not in str(err.value)


def test_all_columns_present_in_every_file(tmp_path):
    path = write_trace(tmp_path / "t.parquet", {"config": {}}, [{"kind": "eval", "t_start": 1.0, "duration": 0.1,
                       "step": 0, "policy_version": 0, "cum_responses": 64, "score": 0.5}])
    assert tuple(pq.read_table(path).column_names) == COLUMN_NAMES
