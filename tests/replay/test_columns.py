"""replay.columns reads Arrow buffers as pyarrow's own conversions would (to_numpy, is_null, equal), with no pandas."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rlsim.replay.columns import Columns, as_float, kind_positions, null_mask, numbers, text
from rlsim.replay.schema import EVENT_KINDS


def _chunked(values, type_, cut=(3, 7)):
    """values as a chunked array of several chunks, one of them a slice (non-zero offset)."""
    arr = pa.array(values, type=type_)
    a, b = cut
    return pa.chunked_array([arr.slice(0, a), pa.concat_arrays([arr.slice(a, b - a)]).slice(0), arr.slice(b)])


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.uint16(), pa.float64(), pa.float32()])
def test_numbers_equal_pyarrows_conversion(type_):
    rng = np.random.default_rng(0)
    vals = [None if rng.random() < 0.3 else int(rng.integers(0, 1000)) for _ in range(23)]
    col = _chunked(vals, type_)
    values, null = numbers(col)
    assert np.array_equal(null, col.is_null().to_numpy(zero_copy_only=False))
    assert np.array_equal(as_float(values, null), pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False),
                          equal_nan=True)
    assert values.dtype == np.dtype(type_.to_pandas_dtype())


def test_a_sliced_array_and_no_nulls():
    arr = pa.array(np.arange(20, dtype=np.int64)).slice(5, 9)
    values, null = numbers(arr)
    assert np.array_equal(values, np.arange(5, 14)) and not null.any()
    assert np.array_equal(null_mask(pa.array([1, None, 3]).slice(1)), [True, False])


def test_null_typed_and_empty_columns():
    values, null = numbers(pa.nulls(4))
    assert np.isnan(values).all() and null.all()
    values, null = numbers(pa.chunked_array([], type=pa.float64()))
    assert len(values) == 0 and len(null) == 0


def test_text_keeps_nulls():
    col = _chunked(["a", None, "bc", "", None, "x", "y", "z", "w"], pa.string())
    assert list(text(col)) == col.to_pylist()


def test_kind_positions_equal_string_comparison():
    rng = np.random.default_rng(3)
    pool = list(EVENT_KINDS) + ["gen_stepx", "gen_ste", "", None, "rEsponse"]
    vals = [pool[i] for i in rng.integers(0, len(pool), 200)]
    col = _chunked(vals, pa.string(), cut=(50, 120))
    pos, rest = kind_positions(col, EVENT_KINDS)
    for k in EVENT_KINDS:
        assert np.array_equal(pos[k], np.flatnonzero([v == k for v in vals]))
    assert np.array_equal(rest, np.flatnonzero([v not in EVENT_KINDS for v in vals]))
    table = pa.table({"kind": col})
    assert set(Columns(table).other_kinds()) == {v for v in vals if v not in EVENT_KINDS}


def test_reading_a_trace_imports_neither_pandas_nor_pyarrow_compute():
    code = ("import sys; from rlsim.replay.io import read_trace; t = read_trace('traces/grpo_p128.parquet'); "
            "t.rows('response'), t.rows('eval'), t.count('update'); "
            "print([m for m in ('pandas', 'pyarrow.compute', 'scipy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.strip() == "[]"
