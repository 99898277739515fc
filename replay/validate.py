"""Every value of a trace checked in one place, after the file is parsed and before anything uses it.

`validate(table, meta, path)` is what `read_trace` calls. The checks are derived from the schema tables
(`schema.COLUMNS`, `REQUIRED`, `EVENT_KINDS`), so a kind or column added there is covered with no edit here:
metadata (`META_FIELDS`, always an error, never dropped); columns present and typed; kinds known to the file's
schema version; rows, per kind, over the columns it fills: required non-null, finite, integers within
`schema.INT_RANGES`, durations and counts non-negative, within the run, update steps increasing, response counts
consistent; the split-mode rules (an `idle` row names one of engine and rank, `finish_version` >=
`policy_version`). The rules in full: docs/trace-format.md, "Validation".

A bad row raises `TraceError` with one line: the file, kind, column, the first offending row (index
within its kind, and step), how many rows are bad and the fix. With `drop_invalid=True` such rows are
removed instead and reported in `dropped` ("kind.column" -> rows) and `warnings`. Nothing here mutates
the values that pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from rlsim.replay.columns import Columns, as_float
from rlsim.replay.errors import TraceError
from rlsim.replay.schema import (CALIB_KINDS, COLUMN_NAMES, COLUMNS, EVENT_KINDS, EVAL, IDLE, INT_RANGES, MODES,
                                 READABLE_VERSIONS, REQUIRED, RESPONSE, SCHEMA_VERSION, UPDATE, arrow_schema,
                                 columns_for_version, kinds_for_version)

FIX = "re-record it, or pass --drop-invalid to drop such rows"
META_FIX = "the trace's `rlsim` metadata is corrupt; re-record it with `rlrun record`"

# columns every row needs besides REQUIRED: the update it belongs to; the five kinds `rlrun record`
# writes also always have the run's clock (kinds added later say in REQUIRED what they must have)
COMMON_REQUIRED = ("step",)
RECORDED_REQUIRED = {k: ("t_start", "duration") for k in ("gen_step", "response", "update", "sync", "eval")}
# kinds whose `t_start` is the event's end (the time the eval score was taken), not its start
END_AT_START = (EVAL,)  # kinds whose `t_start` is their end: the run's end holds their start, t_start - duration


def _clock_groups() -> list[tuple[str, ...]]:
    """Kinds that share a clock: the calibration kinds run on the calibration's own clock, every other
    kind on the run's."""
    return [tuple(k for k in EVENT_KINDS if k not in CALIB_KINDS), tuple(CALIB_KINDS)]


# a row may end this long after the run's end (seconds, or this fraction of the run, whichever is larger)
RUN_END_TOLERANCE_S = 10.0
RUN_END_TOLERANCE_FRAC = 0.25

# count-like column names that the suffix rules below do not catch
_COUNT_NAMES = frozenset({"num_running", "num_waiting", "finished", "num_responses", "num_tokens", "bytes",
                          "cum_responses", "eval_k", "eval_prompts", "micro_batch", "t_start"})


def nonnegative(name: str, dtype: pa.DataType) -> bool:
    """Whether a column can never be negative: an integer column whose range starts at 0 (counts, sizes, steps,
    indices), durations and times (`duration`, `*_time`, `t_*`), token counts (`*tokens`), and named counts."""
    if pa.types.is_integer(dtype):
        return INT_RANGES[name][0] >= 0
    return name in _COUNT_NAMES or name.endswith(("tokens", "duration", "_time")) or name.startswith("t_")


def range_text(lo: int, hi: int) -> str:
    """`lo..hi`, a power of two (or one less) written as such: 0..2**20, 0..2**31 - 1."""
    def one(v: int) -> str:
        for k, suffix in ((0, ""), (1, " - 1")):
            p = v + k
            if p >= 1024 and p & (p - 1) == 0:
                return f"2**{p.bit_length() - 1}{suffix}"
        return str(v)
    return f"{one(lo)}..{one(hi)}"


# ---------------------------------------------------------------------------------------------- metadata
def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _nonneg_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _nonneg_num(v: Any) -> bool:
    return _finite(v) and v >= 0


def _pos_num(v: Any) -> bool:
    return _finite(v) and v > 0


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _mode(v: Any) -> bool:
    return v in MODES


_TYPE_TEXT: dict[Callable[[Any], bool], str] = {
    _pos_int: "a positive integer", _nonneg_int: "a non-negative integer", _finite: "a finite number",
    _nonneg_num: "a non-negative finite number", _pos_num: "a positive finite number", _str: "a string",
    _int: "an integer", _bool: "true or false", _mode: " or ".join(MODES),
}

# sections that must be JSON objects when present (null is not an object)
META_SECTIONS = ("config", "engine", "trainer", "hardware", "model", "packages", "task")
# (section or "" for the top level, key) -> type check; a missing or null field is not checked
META_FIELDS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("", "seed"): _int, ("", "status"): _str,
    ("config", "prompts"): _pos_int, ("config", "group"): _pos_int, ("config", "G"): _pos_int,
    ("config", "batch"): _pos_int, ("config", "gen_batch"): _nonneg_int, ("config", "gen_responses"): _pos_int,
    ("config", "max_tokens"): _pos_int, ("config", "max_num_seqs"): _pos_int, ("config", "max_model_len"): _pos_int,
    ("config", "lr_ref_batch"): _pos_int, ("config", "steps"): _nonneg_int, ("config", "eval_every"): _nonneg_int,
    ("config", "lr"): _finite, ("config", "lr_effective"): _finite, ("config", "algo"): _str,
    ("config", "lr_rule"): _str, ("config", "task"): _str,
    # placement (schema version 3; missing in older traces: schema.CONFIG_DEFAULTS)
    ("config", "mode"): _mode, ("config", "gen_devices"): _pos_int, ("config", "train_devices"): _pos_int,
    ("config", "max_staleness"): _nonneg_int, ("config", "partial_rollout"): _bool, ("config", "off_policy"): _str,
    ("config", "tis_cap"): _finite, ("config", "threads"): _nonneg_int,
    ("engine", "max_num_seqs"): _pos_int, ("engine", "kv_cache_tokens"): _pos_int, ("engine", "block_size"): _pos_int,
    ("engine", "max_model_len"): _pos_int,
    ("model", "bytes"): _nonneg_num, ("model", "parameters"): _nonneg_num, ("model", "name"): _str,
    ("hardware", "mem_bandwidth_gbs"): _pos_num, ("hardware", "device"): _str, ("hardware", "device_name"): _str,
}


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def validate_meta(meta: Any, path: Path) -> None:
    """Raise TraceError (one line) unless the metadata is a JSON object with the expected types."""
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: the `rlsim` metadata is {type(meta).__name__}, not a JSON object; {META_FIX}")
    version = meta.get("schema_version")
    if not _int(version) or version not in READABLE_VERSIONS:
        reads = (f"version {SCHEMA_VERSION}" if len(READABLE_VERSIONS) == 1
                 else "versions " + ", ".join(map(str, READABLE_VERSIONS)))
        raise TraceError(f"{path} has trace schema version {_short(version)}, this rlsim reads {reads}; "
                         "re-record it with this rlsim's `rlrun record`")
    for sec in META_SECTIONS:
        if sec in meta and not isinstance(meta[sec], dict):
            raise TraceError(f"{path}: metadata `{sec}` must be a JSON object, got {_short(meta[sec])}; {META_FIX}")
    for (sec, key), ok in META_FIELDS.items():
        obj = meta if not sec else (meta.get(sec) or {})
        v = obj.get(key)
        if v is not None and not ok(v):
            name = f"{sec}.{key}" if sec else key
            raise TraceError(f"{path}: metadata `{name}` must be {_TYPE_TEXT[ok]}, got {_short(v)}; {META_FIX}")
    eng = meta.get("engine") or {}
    if (eng.get("kv_cache_tokens") is not None and eng.get("block_size") is not None
            and eng["kv_cache_tokens"] < eng["block_size"]):
        raise TraceError(f"{path}: metadata `engine.kv_cache_tokens` {eng['kv_cache_tokens']} is less than one KV "
                         f"block (`engine.block_size` {eng['block_size']}): no engine runs like that; {META_FIX}")


# ---------------------------------------------------------------------------------------------- columns
def _string_like(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)
            or (pa.types.is_dictionary(t)
                and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))))


def _numeric_like(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)


def check_columns(table: pa.Table, path: Path, version: int = SCHEMA_VERSION) -> pa.Table:
    """The schema's columns, in schema order, string columns as string; numeric columns of any numeric
    type. Columns newer than the file's schema version are added as nulls."""
    names = table.column_names
    missing = [c for c in columns_for_version(version) if c not in names]
    if missing:
        raise TraceError(f"{path} lacks columns {', '.join(missing)}; it was not written by a compatible "
                         "`rlrun record`")
    dup = [c for c in COLUMN_NAMES if names.count(c) > 1]
    if dup:
        raise TraceError(f"{path} has columns {', '.join(dup)} more than once; it was not written by `rlrun record`")
    cols = []
    for name, dtype, _, _ in COLUMNS:
        if name not in names:  # newer than the file's version
            cols.append(pa.nulls(table.num_rows, dtype))
            continue
        col = table[name]
        ok = _string_like(col.type) if pa.types.is_string(dtype) else _numeric_like(col.type)
        if not ok:
            raise TraceError(f"{path}: column `{name}` has type {col.type}, expected {dtype}; the trace is corrupt, "
                             "re-record it with `rlrun record`")
        if pa.types.is_string(dtype) and col.type != dtype:
            col = col.cast(dtype)
        cols.append(col)
    return pa.table(cols, names=list(COLUMN_NAMES))


def check_kinds(columns: Columns, path: Path, version: int = SCHEMA_VERSION) -> None:
    known = kinds_for_version(version)
    kinds = [k for k in EVENT_KINDS if len(columns.positions(k))] + columns.other_kinds()
    unknown = sorted(str(k) for k in kinds if k not in known)
    if unknown:
        raise TraceError(f"{path} has unknown event kinds {unknown}; expected {', '.join(known)}")


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class _Rows:
    """The rows of one kind: their positions in the table, values as float64 (null -> NaN), null masks."""

    kind: str
    pos: np.ndarray
    values: dict[str, np.ndarray]
    null: dict[str, np.ndarray]
    alive: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.alive = np.ones(len(self.pos), bool)


@dataclass
class Result:
    table: pa.Table
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    columns: Columns | None = None  # numpy views of `table`'s rows (None: rows were dropped, views of the rest unmade)


class _Checker:
    def __init__(self, table: pa.Table, columns: Columns, path: Path, drop_invalid: bool):
        self.table, self.path, self.drop = table, path, drop_invalid
        self.result = Result(table)
        self.columns = columns  # the table's numpy views (rlsim.replay.columns), kept for the Trace
        self.rows: dict[str, _Rows] = {}
        for k in EVENT_KINDS:
            pos = self.columns.positions(k)
            values, null = {}, {}
            for name, dtype, kinds, _ in COLUMNS:
                if k not in kinds or name == "kind":
                    continue
                if not (pa.types.is_integer(dtype) or pa.types.is_floating(dtype)):  # text: only null-checked
                    values[name], null[name] = np.zeros(len(pos)), self.columns.nulls(name)[pos]
                    continue
                v, nul = self.columns.numbers(name)
                null[name] = nul[pos]
                values[name] = as_float(v[pos], null[name])  # float64, NaN where null
            self.rows[k] = _Rows(k, pos, values, null)

    def flag(self, r: _Rows, col: str, bad: np.ndarray, what: str, detail: Callable[[int], str] | None = None) -> None:
        """`bad`: mask over r's rows (only live rows count). Raise, or drop them."""
        bad = bad & r.alive
        n = int(bad.sum())
        if not n:
            return
        i = int(np.argmax(bad))
        step = r.values["step"][i]
        where = f"`{r.kind}` row {i}, step {int(step) if math.isfinite(step) else '?'}"
        if detail is not None:
            where += f", {detail(i)}"
        total = len(r.pos)
        text = f"{n} of {total} `{r.kind}` rows {what} (first: {where})"
        if not self.drop:
            raise TraceError(f"{self.path}: {text}; the trace is corrupt: {FIX}")
        r.alive &= ~bad
        key = f"{r.kind}.{col}"
        self.result.dropped[key] = self.result.dropped.get(key, 0) + n
        self.result.warnings.append(f"{self.path.name}: dropped {text}")

    def run(self) -> Result:
        for r in self.rows.values():
            self.check_values(r)
        self.check_run_end()
        self.check_updates()
        self.check_split()
        keep = np.ones(self.table.num_rows, bool)
        for r in self.rows.values():
            keep[r.pos[~r.alive]] = False
        table = self.table if keep.all() else self.table.filter(pa.array(keep))
        self.result.columns = self.columns if keep.all() else None
        schema = arrow_schema()
        if all(f.type == s.type for f, s in zip(table.schema, schema)):  # (cast, equal here, imports pyarrow.compute)
            self.result.table = pa.Table.from_arrays(table.columns, schema=schema)
            return self.result
        try:
            self.result.table = table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:  # pragma: no cover - the checks above prevent it
            raise TraceError(f"{self.path}: values do not fit the trace schema ({str(e).splitlines()[0][:120]}); "
                             f"{FIX}") from None
        return self.result

    def check_values(self, r: _Rows) -> None:
        required = set(COMMON_REQUIRED) | set(RECORDED_REQUIRED.get(r.kind, ())) | set(REQUIRED.get(r.kind, ()))
        for name, dtype, kinds, _ in COLUMNS:
            if name not in r.values:
                continue
            v, null = r.values[name], r.null[name]
            val = lambda i, _v=v: f"value {_v[i].item() if hasattr(_v[i], 'item') else _v[i]!r}"  # noqa: E731
            if name in required:
                self.flag(r, name, null, f"have no `{name}`")
            if not (pa.types.is_integer(dtype) or pa.types.is_floating(dtype)):
                continue
            present = ~null
            with np.errstate(invalid="ignore"):
                self.flag(r, name, present & ~np.isfinite(v), f"have a non-finite `{name}` (NaN or infinity)", val)
                if pa.types.is_integer(dtype):
                    self.check_range(r, name, present & np.isfinite(v), val)
                elif nonnegative(name, dtype):
                    self.flag(r, name, present & (v < 0), f"have a negative `{name}`", val)

    def check_range(self, r: _Rows, name: str, present: np.ndarray, val: Callable[[int], str]) -> None:
        """An integer column: integral and within its range (schema.INT_RANGES), each failure named with the range."""
        v = r.values[name]
        lo, hi = INT_RANGES[name]
        allowed = f"`{name}` holds integers {range_text(lo, hi)}"
        self.flag(r, name, present & (np.floor(v) != v), f"have a `{name}` that is not an integer ({allowed})", val)
        low = f"a negative `{name}`" if lo == 0 else f"a `{name}` below {lo}"
        self.flag(r, name, present & (v < lo), f"have {low} ({allowed})", val)
        self.flag(r, name, present & (v > hi), f"have a `{name}` above its range ({allowed})", val)

    def check_run_end(self) -> None:
        for group in _clock_groups():
            self._check_run_end({k: self.rows[k] for k in group if k in self.rows})

    def _check_run_end(self, rows: dict[str, _Rows]) -> None:
        """Every row ends within the run: the run's end is the second-latest of the kinds' latest ends (one
        kind with a wild time cannot move it), plus a tolerance. An eval, stamped at its end, need only start
        within it: the final eval can take longer than the tolerance (many held-out prompts, short steps)."""
        ends: dict[str, np.ndarray] = {}
        latest = []
        for k, r in rows.items():
            t, d = r.values["t_start"], np.nan_to_num(r.values["duration"], nan=0.0)
            ends[k] = e = t - d if k in END_AT_START else t + d
            e = e[r.alive & np.isfinite(e)]
            if len(e):
                latest.append(float(np.max(e)))
        latest.sort()
        if len(latest) < 2:
            return
        run_end = latest[-2] if len(latest) >= 3 else latest[-1]
        limit = run_end + max(RUN_END_TOLERANCE_S, RUN_END_TOLERANCE_FRAC * run_end)
        for k, r in rows.items():
            e = ends[k]
            self.flag(r, "t_start", e > limit,
                      f"end after the run (`t_start` {'-' if k in END_AT_START else '+'} `duration` past "
                      f"{limit:.6g} s, "
                      f"the run's end {run_end:.6g} s plus tolerance)", lambda i, _e=e: f"end {_e[i]:.6g} s")

    def check_updates(self) -> None:
        u = self.rows.get(UPDATE)
        if u is None or not len(u.pos):
            return
        steps = u.values["step"]
        # strictly increasing update steps: a row whose step is not above every earlier live row's
        prev = np.maximum.accumulate(np.where(u.alive, steps, -np.inf))
        before = np.concatenate([[-np.inf], prev[:-1]])
        self.flag(u, "step", steps <= before, "repeat or go back in `step` (update steps must strictly increase)",
                  lambda i: f"previous step {before[i]:.0f}")
        resp = self.rows.get(RESPONSE)
        if resp is None or "consumed_step" not in resp.values or not len(resp.pos):
            return
        # the response rows as recorded (a response dropped for a bad value was still trained on)
        cs = resp.values["consumed_step"][np.isfinite(resp.values["consumed_step"])]
        uniq, counts = np.unique(cs, return_counts=True)
        n = np.zeros(len(steps))
        idx = np.searchsorted(uniq, steps)
        hit = ((idx < len(uniq)) & (uniq[np.minimum(idx, len(uniq) - 1)] == steps) if len(uniq)
               else np.zeros(len(steps), bool))
        n[hit] = counts[idx[hit]]
        nr = u.values["num_responses"]
        self.flag(u, "num_responses", hit & (nr != n),
                  "have a `num_responses` other than the number of response rows with that `consumed_step`",
                  lambda i: f"num_responses {nr[i]:.0f} vs {n[i]:.0f} response rows")


    def check_split(self) -> None:
        """Split-mode rows: an idle row is one engine's or one rank's wait (exactly one id set); a response
        does not finish on an older policy version than it started on."""
        idle = self.rows.get(IDLE)
        if idle is not None and len(idle.pos):
            has_e, has_r = ~idle.null["engine_id"], ~idle.null["rank"]
            self.flag(idle, "engine_id", has_e == has_r,
                      "have both or neither of `engine_id` and `rank` (an idle row is "
                      "one engine's wait or one trainer rank's: exactly one of them)",
                      lambda i: f"engine_id {'set' if has_e[i] else 'null'}, rank {'set' if has_r[i] else 'null'}")
        resp = self.rows.get(RESPONSE)
        if resp is not None and len(resp.pos):
            fv, pv = resp.values["finish_version"], resp.values["policy_version"]
            both = ~resp.null["finish_version"] & ~resp.null["policy_version"]
            with np.errstate(invalid="ignore"):
                self.flag(resp, "finish_version", both & (fv < pv),
                          "have a `finish_version` below their `policy_version` (a response cannot finish on older "
                          "weights than it started on)",
                          lambda i: f"policy_version {pv[i]:.0f}, finish_version {fv[i]:.0f}")


def validate(table: pa.Table, meta: Any, path: str | Path, *, drop_invalid: bool = False) -> Result:
    """Check a parsed trace (see the module doc). Returns the table (schema columns and types, invalid
    rows removed when `drop_invalid`), what was dropped and the warnings; raises TraceError otherwise."""
    path = Path(path)
    if meta is None:
        raise TraceError(f"{path} has no `rlsim` metadata: it is not an rlsim trace (record one with `rlrun record`)")
    validate_meta(meta, path)
    version = meta["schema_version"]
    table = check_columns(table, path, version)
    columns = Columns(table)
    check_kinds(columns, path, version)
    return _Checker(table, columns, path, drop_invalid).run()
