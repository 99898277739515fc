"""A trace table's columns as numpy arrays, read from their Arrow buffers, each column converted once.

pyarrow's own conversions (`to_numpy`, `np.asarray`, `pa.array`, `pa.scalar`) set up its pandas bridge on first
use, which imports pandas: about 0.2 s of every command that reads a trace (apache/arrow#34994), and nothing on
that path uses pandas. A trace holds numbers and text only, so numbers are read from their data and validity
buffers (zero-copy where the type is numpy's), text through `to_pylist`, and the row positions of each kind by
comparing the `kind` column's bytes (pyarrow's own string kernels would import pyarrow.compute, ~0.03 s more).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from rlsim.replay.schema import EVENT_KINDS


def _one(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def null_mask(arr: pa.Array) -> np.ndarray:
    """(rows,) bool: True where arr is null (from its validity bitmap, bit i of byte i // 8, least significant
    first)."""
    n = len(arr)
    if pa.types.is_null(arr.type):
        return np.ones(n, bool)
    validity = arr.buffers()[0]
    if not arr.null_count or validity is None:
        return np.zeros(n, bool)
    bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + n] == 0


def numbers(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, null mask) of an integer or floating-point column: values in the column's own numpy dtype (a
    read-only view of the Arrow data where it has one chunk; the slots of nulls hold whatever the writer left),
    a null-typed column as float NaN."""
    arr = _one(col)
    n = len(arr)
    if pa.types.is_null(arr.type):
        return np.full(n, np.nan), np.ones(n, bool)
    dtype = np.dtype(arr.type.to_pandas_dtype())
    data = arr.buffers()[1]
    values = np.frombuffer(data, dtype, count=arr.offset + n)[arr.offset:] if n else np.zeros(0, dtype)
    return values, null_mask(arr)


def as_float(values: np.ndarray, null: np.ndarray) -> np.ndarray:
    """values as a new float64 array, NaN where null (what pyarrow's cast to float64 and to_numpy give)."""
    out = values.astype(np.float64)
    if null.any():
        out[null] = np.nan
    return out


def text(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(rows,) object array of str, None where null (as pyarrow's to_numpy gives for a string column)."""
    out = np.empty(len(col), object)
    out[:] = col.to_pylist()
    return out


def kind_positions(col: pa.ChunkedArray | pa.Array, kinds: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """({kind: (rows,) positions of its rows, in table order} for each of `kinds`, (rows,) positions of the rows of
    none of them (another kind, or null)) of a string column, by comparing its bytes to each kind's (the rows of
    the kind's length only): pyarrow's unique, dictionary_encode and comparisons import pyarrow.compute (~0.03 s)."""
    arr = _one(col)
    if not pa.types.is_string(arr.type):  # large_string or dictionary (the validator casts them to string first)
        raise TypeError(f"kind_positions reads a string column, not {arr.type}")
    n = len(arr)
    if not n:
        return {k: np.zeros(0, np.int64) for k in kinds}, np.zeros(0, np.int64)
    _, offsets, data = arr.buffers()
    off = np.frombuffer(offsets, np.int32, count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    start, length = off[:-1], np.diff(off)
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    valid = ~null_mask(arr)
    out, matched = {}, np.zeros(n, bool)
    for k in kinds:
        b = np.frombuffer(k.encode(), np.uint8)
        rows = np.flatnonzero(valid & (length == len(b)))
        same = (data[start[rows, None] + np.arange(len(b))] == b).all(axis=1) if len(b) else np.ones(len(rows), bool)
        out[k] = rows[same]
        matched[out[k]] = True
    return out, np.flatnonzero(~matched)


class Columns:
    """Numpy views of one table's columns, each converted on first use and kept; the row positions of each kind."""

    def __init__(self, table: pa.Table):
        self.table = table
        self._kinds: tuple[dict[str, np.ndarray], np.ndarray] | None = None
        self._numbers: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._text: dict[str, np.ndarray] = {}

    def positions(self, kind: str) -> np.ndarray:
        """(rows of `kind`,) their positions in the table; `kind` one of schema.EVENT_KINDS."""
        return self._kind_rows()[0][kind]

    def other_kinds(self) -> list:
        """The distinct `kind` values that are not in schema.EVENT_KINDS (None for a null), in no order."""
        rest = self._kind_rows()[1]
        return list(set(self.text("kind")[rest])) if len(rest) else []

    def _kind_rows(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if self._kinds is None:
            self._kinds = kind_positions(self.table["kind"], EVENT_KINDS)
        return self._kinds

    def numbers(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(values in the column's numpy dtype, null mask) of a numeric column, whole table."""
        if name not in self._numbers:
            self._numbers[name] = numbers(self.table[name])
        return self._numbers[name]

    def nulls(self, name: str) -> np.ndarray:
        """(rows,) null mask of any column, whole table."""
        if name in self._numbers:
            return self._numbers[name][1]
        return null_mask(_one(self.table[name]))

    def text(self, name: str) -> np.ndarray:
        """(rows,) object array of a text column, whole table."""
        if name not in self._text:
            self._text[name] = text(self.table[name])
        return self._text[name]
