"""Sweep results: ranked best first (smallest T_new / T_ref = rho / sigma), written as
`results.parquet` (the grid and the traces' identity as key-value metadata), `results.csv` and
`sweep.json`, and read back."""
from __future__ import annotations

import datetime as _dt
import enum
import hashlib
import json
import math
import os
import shutil
from importlib import metadata as md
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rlsim.core.grid import plain
from rlsim.replay.errors import RlsimError
from rlsim.replay.util import json_safe
from rlsim.whatif.predict import reference_outcome
from rlsim.whatif.study import Study

SWEEP_META_KEY = b"rlsim_sweep"
OUTPUT_FILES = ("results.parquet", "results.csv", "sweep.json", "charts")


def _ratio(row: Mapping[str, Any]) -> float:
    v = row.get("time_to_target_ratio")
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.inf
    return f if math.isfinite(f) else math.inf


def rank_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Best first: every config that fits in memory (or is not known not to) before any that does not, then
    smallest T_new / T_ref, then shortest step, then grid order. Adds `rank` and `config_id`."""
    keyed = []
    for i, r in enumerate(rows):
        st = r.get("step_time_s")
        st = float(st) if isinstance(st, (int, float)) and math.isfinite(st) else math.inf
        keyed.append((r.get("fits") is False, _ratio(r), st, i, r))
    keyed.sort(key=lambda k: k[:4])
    out = []
    for rank, (_, _, _, i, r) in enumerate(keyed, start=1):
        out.append({"rank": rank, "config_id": i, **r})
    return out


def reference_row(study: Study, updates: int = 100, seed: int = 0) -> dict[str, Any] | None:
    """The reference config's outcome (the trace's own P, G, lr rule), JSON-safe, for the sweep metadata."""
    if not isinstance(study, Study):  # a stand-in study (tests) has no reference
        return None
    return json_safe(reference_outcome(study, updates, seed).to_dict())


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def trace_identity(trace: Any) -> dict[str, Any]:
    p = Path(trace.path)
    meta = trace.meta
    return {"path": str(p), "abspath": str(p.resolve()), "sha256": sha256_file(p) if p.exists() else None,
            "name": trace.name, "created": meta.get("created"), "seed": meta.get("seed"),
            "status": meta.get("status"), "recovered": bool(trace.recovered),
            "config": meta.get("config", {}), "engine": meta.get("engine", {}), "model": meta.get("model", {}),
            "hardware": meta.get("hardware", {})}


def prepare_out_dir(out: str | os.PathLike, overwrite: bool, *, clear: bool = True) -> Path:
    """Refuse an existing output folder unless `overwrite`; then (`clear`) remove only the files a sweep writes."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise RlsimError(f"{out} exists and is not a folder; choose another --out")
        if not overwrite:
            raise RlsimError(f"output folder {out} already exists; pass --overwrite to replace its results or choose "
                             "another --out")
        if not clear:
            return out
        for name in OUTPUT_FILES:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    return out


def _column_safe(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Parquet/CSV-friendly rows: nested values (lists, dicts) become JSON text, numpy scalars plain."""
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    out = []
    for r in rows:
        d = {}
        for k in keys:
            v = r.get(k)
            if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
                v = v.item()
            if isinstance(v, enum.Enum):
                v = v.value
            if isinstance(v, (list, tuple, dict)):
                v = json.dumps(v, default=str)
            d[k] = v
        out.append(d)
    # a column mixing ints and floats becomes float; one mixing anything with text becomes text
    for k in keys:
        vals = [d[k] for d in out if d[k] is not None]
        if any(isinstance(v, str) for v in vals) and not all(isinstance(v, str) for v in vals):
            for d in out:
                if d[k] is not None:
                    d[k] = str(d[k])
        elif any(isinstance(v, float) for v in vals) and not all(isinstance(v, bool) for v in vals):
            for d in out:
                if d[k] is not None and not isinstance(d[k], bool):
                    d[k] = float(d[k])
    return out


def write_results(out: str | os.PathLike, ranked: Sequence[Mapping[str, Any]],
                  meta: Mapping[str, Any]) -> dict[str, Path]:
    """results.parquet (metadata under key `rlsim_sweep`), results.csv and sweep.json in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(_column_safe(ranked))
    meta_json = json.dumps(meta, default=str, allow_nan=False)
    table = table.replace_schema_metadata({SWEEP_META_KEY: meta_json.encode()})
    paths = {"parquet": out / "results.parquet", "csv": out / "results.csv", "json": out / "sweep.json"}
    pq.write_table(table, paths["parquet"])
    pacsv.write_csv(table, paths["csv"])
    paths["json"].write_text(json.dumps(meta, indent=2, default=str, allow_nan=False) + "\n")
    return paths


def read_results(sweep_dir: str | os.PathLike) -> tuple[list[dict], dict[str, Any]]:
    """Rows (best first) and metadata of a finished sweep."""
    d = Path(sweep_dir)
    p = d / "results.parquet"
    if not p.exists():
        raise RlsimError(f"{d} holds no sweep results (no results.parquet); run `rlsim sweep --out {d}` first")
    try:
        table = pq.read_table(p)
    except Exception as e:
        raise RlsimError(f"{p} is not readable Parquet ({type(e).__name__}); re-run the sweep") from None
    raw = (table.schema.metadata or {}).get(SWEEP_META_KEY)
    meta = json.loads(raw) if raw else {}
    if not meta and (d / "sweep.json").exists():
        meta = json.loads((d / "sweep.json").read_text())
    # a sweep written before B's column was named responses_per_update calls it batch
    rows = [{("responses_per_update" if k == "batch" else k): v for k, v in r.items()} for r in table.to_pylist()]
    rows.sort(key=lambda r: r.get("rank", 0))
    return rows, meta


def sweep_metadata(*, traces: Sequence[Any], axes: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any],
                   labels: Mapping[str, str], n_configs: int, study_options: Mapping[str, Any],
                   backend: Mapping[str, Any], seconds: float | None = None) -> dict[str, Any]:
    try:
        version = md.version("rlsim")
    except md.PackageNotFoundError:  # pragma: no cover
        version = None
    return {
        "kind": "rlsim sweep", "rlsim": version,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "grid": {"axes": {name: [plain(v) for v in vals] for name, vals in axes.items()},
                 "options": {name: labels.get(name, name) for name in axes},
                 "fixed": {k: plain(v) for k, v in fixed.items()}, "n_configs": n_configs},
        "study": dict(study_options), "backend": dict(backend), "seconds": seconds,
        "traces": [trace_identity(t) for t in traces],
        "ranking": "configs that fit in memory first (fits not false), then ascending time_to_target_ratio "
                   "(T_new / T_ref = rho / sigma), then step_time_s",
    }

