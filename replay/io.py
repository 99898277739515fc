"""Incremental, crash-safe trace writer and the validating reader.

Crash safety: Parquet is readable only once its footer is written, so a SIGKILLed run would lose
everything. The writer therefore appends each flushed group of rows (one RL step) to an Arrow IPC
stream beside the output (`<out>.partial.arrow`), which stays readable up to its last complete
batch, and writes the Parquet atomically (temporary file, then rename) on close. The reader
recovers a run that died from that stream, and says so.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from rlsim.replay.columns import Columns, as_float
from rlsim.replay.errors import TraceError
from rlsim.replay.schema import COLUMN_NAMES, COLUMNS, EVENT_KINDS, META_KEY, SCHEMA_VERSION, arrow_schema
from rlsim.replay.util import exclusive
from rlsim.replay.validate import validate

_KIND_COLUMNS = {k: tuple(n for n, _, kinds, _ in COLUMNS if k in kinds) for k in EVENT_KINDS}
# what verl, OpenRLHF and TRL logs are saved as (`rlsim import` reads them); a trace is Parquet
LOG_SUFFIXES = (".log", ".txt", ".out", ".jsonl", ".json", ".csv")


def partial_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}.partial.arrow")


class TraceWriter:
    """Append events as the run goes; `flush()` after each RL step makes them survive a SIGKILL.

    >>> with TraceWriter("run.parquet", meta) as w:
    ...     w.add("gen_step", t_start=0.1, duration=0.01, step=0, policy_version=0, num_running=8, ...)
    ...     w.flush()
    """

    def __init__(self, path: str | os.PathLike, meta: dict[str, Any], *, overwrite: bool = False):
        self.path, self.meta, self.overwrite = Path(path), dict(meta), overwrite
        self._rows: list[dict[str, Any]] = []
        self._stream = self._sink = None
        self._lock: contextlib.ExitStack | None = None
        self.rows_written = 0

    def __enter__(self) -> "TraceWriter":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is KeyboardInterrupt:
            self.meta["status"] = "interrupted"
        elif exc_type is not None:
            self.meta["status"] = f"failed: {exc_type.__name__}"
        self.close()

    def open(self) -> "TraceWriter":
        """Take the output's lock (held until `close`; a second writer of the same path is refused with one
        line), then refuse an existing output unless `overwrite`, then start the stream."""
        if self._lock is not None:
            raise ValueError(f"TraceWriter for {self.path} is already open")
        lock = contextlib.ExitStack()
        lock.enter_context(exclusive(self.path, what="--out"))
        try:
            for p in (self.path, partial_path(self.path)):  # checked under the lock: no other writer between
                if p.exists() and not self.overwrite:
                    raise TraceError(f"{p} already exists; pass --overwrite to replace it or choose another --out")
            self.meta.setdefault("schema_version", SCHEMA_VERSION)
            self.meta["status"] = "partial"
            self._sink = pa.OSFile(str(partial_path(self.path)), "wb")
            self._stream = ipc.new_stream(self._sink, arrow_schema(json.dumps(self.meta)))
        except BaseException:
            if self._sink is not None:
                self._sink.close()
                self._sink = None
            lock.close()
            raise
        self._lock = lock
        return self

    def add(self, kind: str, **fields: Any) -> None:
        if kind not in _KIND_COLUMNS:
            raise ValueError(f"unknown event kind {kind!r}")
        extra = set(fields) - set(_KIND_COLUMNS[kind])
        if extra:
            raise ValueError(f"columns {sorted(extra)} do not apply to {kind!r} rows")
        self._rows.append({"kind": kind, **fields})

    def flush(self) -> None:
        if not self._rows:
            return
        batch = pa.RecordBatch.from_pylist(self._rows, schema=arrow_schema())
        self._stream.write_batch(batch)
        self._sink.flush()
        self.rows_written += len(self._rows)
        self._rows.clear()

    def close(self) -> None:
        if self._stream is None:
            return
        try:
            self.flush()
            self._stream.close()
            self._sink.close()
            self._stream = None
            if self.meta.get("status") == "partial":
                self.meta["status"] = "complete"
            table = _read_stream(partial_path(self.path))[0]
            write_parquet(self.path, table, self.meta)
            partial_path(self.path).unlink()
        finally:
            self._stream = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None


@contextlib.contextmanager
def recording(writer: TraceWriter, log: Callable[[str], None] = print) -> Iterator[TraceWriter]:
    """A run's trace from open to close: Ctrl-C ends the run cleanly (status "interrupted", every row so far
    kept), any other error closes the trace as "failed: <type>" and propagates; then says where the trace is."""
    interrupted = False
    try:
        with writer:
            yield writer
    except KeyboardInterrupt:
        interrupted = True
    log(f"{'interrupted; ' if interrupted else ''}trace written: {writer.path} ({writer.rows_written} rows)")


def write_parquet(path: str | os.PathLike, table: pa.Table, meta: dict[str, Any]) -> None:
    """Write atomically: a reader never sees a half-written file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    table = table.cast(arrow_schema(json.dumps(meta)))
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def write_trace(path: str | os.PathLike, meta: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """Write a whole trace at once (synthetic traces in tests, converters)."""
    meta = {"schema_version": SCHEMA_VERSION, "status": "complete", **meta}
    table = pa.Table.from_pylist([{c: r.get(c) for c in COLUMN_NAMES} for r in rows], schema=arrow_schema())
    write_parquet(path, table, meta)
    return Path(path)


def _read_stream(path: Path) -> tuple[pa.Table, dict | None]:
    """Every complete record batch of a (possibly truncated) IPC stream."""
    batches, meta = [], None
    try:
        reader = ipc.open_stream(pa.memory_map(str(path)))
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceError(f"{path} is not a readable partial trace ({e}); the run died before recording "
                         "anything") from None
    meta = _parse_meta((reader.schema.metadata or {}).get(META_KEY), path)
    try:
        for b in reader:
            batches.append(b)
    except (pa.ArrowInvalid, OSError):
        pass  # truncated tail: the batch being written when the process died
    return pa.Table.from_batches(batches, schema=reader.schema), meta


@dataclass
class Trace:
    """A validated trace: the events table, the run metadata, and per-kind column views."""

    path: Path
    meta: dict[str, Any]
    table: pa.Table
    recovered: bool = False
    # "kind.column" -> rows dropped by read_trace(drop_invalid=True)
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # one line per group of dropped rows
    _cache: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    _columns: Columns | None = field(default=None, repr=False, compare=False)

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config") or {}

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".partial.arrow").removesuffix(".parquet")

    @property
    def columns(self) -> Columns:
        """Numpy views of the table's columns (rlsim.replay.columns), made on first use, and made anew (the rows
        cached from the old ones dropped) for a table swapped in by `dataclasses.replace`, e.g. a run cut short."""
        if self._columns is None or self._columns.table is not self.table:
            self._columns, self._cache = Columns(self.table), {}
        return self._columns

    def rows(self, kind: str) -> dict[str, np.ndarray]:
        """Columns of one event kind as numpy arrays: int64 for an integer column, float64 for an integer column
        with nulls in these rows and for a float column (NaN where null), object (str or None) for text."""
        cols = self.columns  # first: it drops the rows cached from a table this one replaced
        if kind not in self._cache:
            pos, out = cols.positions(kind), {}
            for name, dtype, _, _ in COLUMNS:
                if name not in _KIND_COLUMNS[kind]:
                    continue
                if name == "kind":
                    out[name] = np.full(len(pos), kind, object)
                elif pa.types.is_string(dtype):
                    out[name] = cols.text(name)[pos]
                else:
                    values, null = cols.numbers(name)
                    values, null = values[pos], null[pos]
                    whole = pa.types.is_integer(dtype) and not null.any()
                    out[name] = values.astype(np.int64) if whole else as_float(values, null)
            self._cache[kind] = out
        return self._cache[kind]

    def count(self, kind: str) -> int:
        return len(self.columns.positions(kind))

    def dropped_rows(self, kind: str) -> int:
        """Rows of `kind` that read_trace(drop_invalid=True) removed (each row is counted once)."""
        return sum(n for k, n in self.dropped.items() if k.split(".", 1)[0] == kind)


def _parse_meta(raw: bytes | None, path: Path) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        raise TraceError(f"{path}: the `rlsim` metadata is not valid JSON; the trace is corrupt, re-record it with "
                         "`rlrun record`") from None


def read_trace(path: str | os.PathLike, *, drop_invalid: bool = False) -> Trace:
    """Read and validate a trace (`replay.validate`). Raises TraceError with a one-line, actionable
    message; with `drop_invalid` rows with invalid values are dropped instead and listed in
    `trace.dropped` / `trace.warnings` (bad metadata is always an error)."""
    path = Path(path)
    recovered = False
    part = partial_path(path)
    if str(path).endswith(".partial.arrow") and path.exists():
        table, meta = _read_stream(path)
        recovered = True
    elif part.exists() and (not path.exists() or part.stat().st_mtime > path.stat().st_mtime):
        # a run in progress or one that died; after `--overwrite` it sits beside the older complete
        # trace (kept until the new run finishes) and is the newer recording of this path
        table, meta = _read_stream(part)
        path, recovered = part, True
    elif not path.exists():
        raise TraceError(f"trace not found: {path} (record one with `rlrun record --out {path}` or use one under "
                         "traces/)")
    else:
        try:
            pf = pq.ParquetFile(path)
            table = pf.read()
        except Exception as e:  # pyarrow raises several types for corrupt files
            if path.suffix.lower() in LOG_SUFFIXES:
                raise TraceError(f"{path} is a training log, not an rlsim trace: import it first with `rlsim import "
                                 f"verl|openrlhf|trl {path} -o out.parquet` (docs/importing.md), then pass "
                                 "out.parquet") from None
            raise TraceError(f"{path} is not a readable Parquet file ({type(e).__name__}); pass a trace written by "
                             "`rlrun record`") from None
        meta = _parse_meta((pf.schema_arrow.metadata or {}).get(META_KEY), path)
    res = validate(table, meta, path, drop_invalid=drop_invalid)
    return Trace(path=path, meta=meta, table=res.table, recovered=recovered, dropped=res.dropped, warnings=res.warnings,
                 _columns=res.columns)
