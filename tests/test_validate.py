"""The reader's value checks (replay/validate.py), --drop-invalid, and one writer per output path."""
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsim.replay.errors import RlsimError, TraceError
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import TraceWriter, partial_path, read_trace
from rlsim.replay.schema import COLUMNS, META_KEY

TRACES = Path(__file__).resolve().parents[1] / "traces"
SHIPPED = sorted(TRACES.glob("*.parquet"))


def _mutate(src: Path, dst: Path, kind: str, col: str, rows, value) -> Path:
    """Copy `src` with `col` of the given rows (indices within `kind`) set to `value`."""
    t = pq.read_table(src)
    pos = np.nonzero(t["kind"].to_numpy(zero_copy_only=False) == kind)[0][list(rows)]
    vals = t[col].to_numpy(zero_copy_only=False).astype(float)
    null = t[col].is_null().to_numpy(zero_copy_only=False)
    vals[pos] = np.nan if value is None else value
    null[pos] = value is None
    typ = t.schema.field(col).type
    arr = pa.array(vals, mask=null) if pa.types.is_floating(typ) else pa.array(vals, mask=null).cast(typ, safe=False)
    t = t.set_column(t.schema.get_field_index(col), col, arr)
    pq.write_table(t, dst)
    return dst


def _set_meta(src: Path, dst: Path, edit) -> Path:
    t = pq.read_table(src)
    meta = json.loads(t.schema.metadata[META_KEY])
    edit(meta)
    pq.write_table(t.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), dst)
    return dst


def test_a_long_final_eval_is_part_of_the_run_and_a_wild_eval_time_is_not(tmp_path):
    t = pq.read_table(P32)
    last = int(np.nonzero(t["kind"].to_numpy(zero_copy_only=False) == "eval")[0].size) - 1
    end = float(np.nanmax(t["t_start"].to_numpy(zero_copy_only=False)))
    # the final eval takes 1000 s (stamped at its end): it started within the run
    long_eval = _mutate(_mutate(P32, tmp_path / "a.parquet", "eval", "t_start", [last], end + 1000.0),
                        tmp_path / "long.parquet", "eval", "duration", [last], 1000.0)
    assert read_trace(long_eval).count("eval") == last + 1
    wild = _mutate(P32, tmp_path / "wild.parquet", "eval", "t_start", [last], end + 1000.0)
    with pytest.raises(TraceError, match="end after the run"):
        read_trace(wild)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_traces_pass_unchanged(path):
    t = read_trace(path)
    assert t.dropped == {} and t.warnings == []
    assert t.table.num_rows == pq.read_metadata(path).num_rows


P32 = TRACES / "grpo_p32.parquet"


@pytest.mark.parametrize("kind, col, rows, value, what", [
    ("gen_step", "duration", [5], float("nan"), "non-finite `duration`"),
    ("gen_step", "num_running", [7, 9], None, "have no `num_running`"),
    ("response", "response_tokens", [3], -4, "negative `response_tokens`"),
    ("update", "step_time", [2], float("inf"), "non-finite `step_time`"),
    ("update", "gen_time", [4], -0.5, "negative `gen_time`"),
    ("eval", "score", [1], float("-inf"), "non-finite `score`"),
    ("sync", "t_start", [0], -1.0, "negative `t_start`"),
    ("gen_step", "duration", [11], 1e300, "end after the run"),
    ("update", "num_responses", [6], 255, "other than the number of response rows"),
    ("update", "step", [6], 5, "update steps must strictly increase"),
])
def test_bad_values_fail_in_one_line_or_are_dropped(tmp_path, kind, col, rows, value, what):
    bad = _mutate(P32, tmp_path / "bad.parquet", kind, col, rows, value)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    msg = str(err.value)
    assert "\n" not in msg and what in msg, msg
    assert str(bad) in msg and f"`{kind}` row {rows[0]}," in msg and "--drop-invalid" in msg
    assert f"{len(rows)} of " in msg
    t = read_trace(bad, drop_invalid=True)
    assert sum(t.dropped.values()) == len(rows) and len(t.warnings) == 1 and "dropped" in t.warnings[0]
    assert t.dropped_rows(kind) == len(rows)
    assert t.count(kind) == read_trace(P32).count(kind) - len(rows)


@pytest.mark.parametrize("kind, col, rows, value, allowed", [
    ("sync", "engine_id", [3], 1e18, "0..2**20"),  # beyond float64's exact integers: the reader's float view failed
    ("drift_gen", "threads", [0, 5], 2 ** 20 + 1, "0..2**20"),
    ("update", "step", [4], 2 ** 31, "0..2**31 - 1"),
    ("response", "policy_version", [7], 2 ** 40, "0..2**31 - 1"),
    ("response", "prompt_tokens", [2], -3, "0..2**31 - 1"),
    ("gen_step", "context_tokens", [1], 2 ** 53 + 2, "0..2**53"),
    ("update", "num_tokens", [0], 2 ** 60, "0..2**53"),
])
def test_an_integer_out_of_its_range_is_one_line_naming_it(tmp_path, kind, col, rows, value, allowed):
    """Every integer column has one range (schema.INT_RANGES); a value outside is refused in one line naming the
    column, the kind, the row and the range, or dropped with --drop-invalid."""
    bad = _mutate(P32, tmp_path / "bad.parquet", kind, col, rows, value)
    with pytest.raises(TraceError) as err:
        read_trace(bad)
    msg = str(err.value)
    assert "\n" not in msg and f"`{col}` holds integers {allowed}" in msg, msg
    assert ("negative" if value < 0 else "above its range") in msg and f"{len(rows)} of " in msg
    assert f"`{kind}` row {rows[0]}," in msg and "--drop-invalid" in msg
    t = read_trace(bad, drop_invalid=True)
    assert t.dropped == {f"{kind}.{col}": len(rows)} and t.count(kind) == read_trace(P32).count(kind) - len(rows)


def test_every_integer_column_has_one_range_within_exact_floats():
    from rlsim.replay.schema import INT_RANGES

    ints = {n for n, t, _, _ in COLUMNS if pa.types.is_integer(t)}
    assert set(INT_RANGES) == ints
    assert all(0 <= lo < hi <= 2 ** 53 for lo, hi in INT_RANGES.values())


def test_an_out_of_range_id_reaches_the_cli_as_one_line_and_exit_2(tmp_path):
    """The fuzz campaign's case: a PPO trace whose `sync` row has engine_id 1e18, through `rlsim run --json`."""
    from typer.testing import CliRunner

    from rlsim.cli import app

    bad = _mutate(TRACES / "ppo_b256.parquet", tmp_path / "ppo.parquet", "sync", "engine_id", [5], 1e18)
    r = CliRunner().invoke(app, ["run", "--trace", str(bad), "--batch", "64", "--updates", "2", "--json"])
    err = (r.stderr if hasattr(r, "stderr") else r.output).strip().splitlines()
    assert r.exit_code == 2 and len(err) == 1 and err[0].startswith("error:"), r.output
    assert "`sync` row 5" in err[0] and "`engine_id` holds integers 0..2**20" in err[0]


def test_scores_need_not_be_fractions(tmp_path):
    t = read_trace(_mutate(P32, tmp_path / "s.parquet", "eval", "score", [0, 1], -3.5))
    assert list(t.rows("eval")["score"][:2]) == [-3.5, -3.5]


def test_dropped_gen_steps_count_in_the_fit_quality(tmp_path):
    bad = _mutate(P32, tmp_path / "bad.parquet", "gen_step", "duration", [100, 200, 300], float("nan"))
    t = read_trace(bad, drop_invalid=True)
    assert t.dropped == {"gen_step.duration": 3}
    with_invalid = fit_trace(t).gen.quality.dropped
    t.dropped = {}
    assert with_invalid == fit_trace(t).gen.quality.dropped + 3


@pytest.mark.parametrize("edit, what", [
    (lambda m: m["config"].update(prompts=0), "`config.prompts` must be a positive integer"),
    (lambda m: m["config"].update(group=2.5), "`config.group` must be a positive integer"),
    (lambda m: m["engine"].update(max_num_seqs="1024"), "`engine.max_num_seqs` must be a positive integer"),
    (lambda m: m["engine"].update(kv_cache_tokens=-1), "`engine.kv_cache_tokens` must be a positive integer"),
    (lambda m: m.update(schema_version="1"), "schema version '1'"),
    (lambda m: m.update(schema_version=True), "schema version True"),
    (lambda m: m.update(config=[1, 2]), "`config` must be a JSON object"),
    (lambda m: m["config"].update(lr=float("nan")), "`config.lr` must be a finite number"),
    (lambda m: m.update(engine=None), "`engine` must be a JSON object"),
    (lambda m: m["engine"].update(kv_cache_tokens=64), "is less than one KV block"),
])
def test_bad_metadata_is_always_an_error(tmp_path, edit, what):
    bad = _set_meta(P32, tmp_path / "m.parquet", edit)
    for drop in (False, True):
        with pytest.raises(TraceError) as err:
            read_trace(bad, drop_invalid=drop)
        assert "\n" not in str(err.value) and what in str(err.value), str(err.value)


def test_metadata_that_is_not_json_or_not_an_object(tmp_path):
    t = pq.read_table(P32)
    for raw, what in ((b"{not json", "not valid JSON"), (b"[1, 2]", "not a JSON object"),
                      (b"\xff\xfe", "not valid JSON")):
        p = tmp_path / "j.parquet"
        pq.write_table(t.replace_schema_metadata({META_KEY: raw}), p)
        with pytest.raises(TraceError, match=what):
            read_trace(p)


def test_column_of_the_wrong_type(tmp_path):
    t = pq.read_table(P32)
    i = t.schema.get_field_index("num_running")
    p = tmp_path / "ty.parquet"
    pq.write_table(t.set_column(i, "num_running", t["num_running"].cast(pa.string())), p)
    with pytest.raises(TraceError, match="column `num_running` has type string"):
        read_trace(p, drop_invalid=True)
    # a float column where an int is expected reads when the values are integral
    pq.write_table(t.set_column(i, "num_running", t["num_running"].cast(pa.float64())), p)
    assert read_trace(p).table.schema.field("num_running").type == pa.int64()


def test_every_numeric_column_is_checked():
    """The checks come from the schema tables: every numeric column of every kind gets the NaN check."""
    from rlsim.replay.validate import nonnegative

    assert all(nonnegative(n, t) for n, t, _, _ in COLUMNS if pa.types.is_integer(t))
    assert {n for n, t, _, _ in COLUMNS if nonnegative(n, t)} >= {"duration", "t_start", "step_time", "gen_time",
                                                                    "prefill_tokens", "cum_tokens", "bytes"}
    assert not nonnegative("score", pa.float64()) and not nonnegative("loss", pa.float64())


# ------------------------------------------------------------------ one writer per output
def _rows(w: TraceWriter, steps: int) -> None:
    for s in range(steps):
        w.add("sync", t_start=float(s), duration=0.01, step=s, policy_version=s + 1, bytes=100)
        w.flush()


def test_second_writer_of_the_same_out_is_refused(tmp_path):
    out = tmp_path / "run.parquet"
    first = TraceWriter(out, {"config": {}}).open()
    _rows(first, 2)
    for overwrite in (False, True):
        second = TraceWriter(out, {"config": {"who": "second"}}, overwrite=overwrite)
        with pytest.raises(RlsimError) as err:
            second.open()
        assert "\n" not in str(err.value) and "in use by another rlsim process" in str(err.value)
        second.close()  # nothing to close; must not touch the first run's files
    assert partial_path(out).exists()
    _rows(first, 1)
    first.close()
    t = read_trace(out)
    assert t.config == {} and t.count("sync") == 3 and t.meta["status"] == "complete"
    # the lock went with the first writer: a third one now sees the finished trace
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(out, {}).open()
    third = TraceWriter(out, {"config": {"who": "third"}}, overwrite=True).open()
    _rows(third, 1)
    third.close()
    assert read_trace(out).config == {"who": "third"}


def test_refused_writer_in_another_process(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run.parquet"
    w = TraceWriter(out, {"config": {}}).open()
    code = ("import sys\nfrom rlsim.replay.errors import RlsimError\nfrom rlsim.replay.io import TraceWriter\n"
            f"try:\n    TraceWriter({str(out)!r}, {{}}).open()\nexcept RlsimError as e:\n    print(e); sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2 and "in use" in proc.stdout
    _rows(w, 1)
    w.close()
    assert read_trace(out).count("sync") == 1


def test_a_copy_of_a_shipped_trace_reads_the_same(tmp_path):
    dst = tmp_path / "ppo.parquet"
    shutil.copy(TRACES / "ppo_b256.parquet", dst)
    assert read_trace(dst).table.equals(read_trace(TRACES / "ppo_b256.parquet").table)


def test_refusal_reaches_the_cli_as_one_line_and_exit_2(tmp_path, capsys):
    """`rlrun record` opens its TraceWriter inside `cli_errors` (runner/cli.py): the lock refusal is one
    line on stderr and exit code 2, and the first run's stream is untouched."""
    from rlsim.replay.errors import cli_errors

    out = tmp_path / "run.parquet"
    first = TraceWriter(out, {"config": {}}).open()
    with pytest.raises(SystemExit) as ex:
        cli_errors(lambda: TraceWriter(out, {}, overwrite=True).open())()
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "in use" in err[0]
    _rows(first, 2)
    first.close()
    assert read_trace(out).count("sync") == 2
