"""Sweeps: the cartesian grid of what-if configs, evaluated in parallel, ranked by time-to-target.

- `parse_list` / `build_grid`: comma lists (`--batch 64,128 --group 4,8 --lr-rule sqrt,fixed`) into
  validated `WhatIf` configs, in a fixed order (the order of the axes, then of the values).
- `prepare_studies`: the fitted `Study` for each (updates, seed) in the grid, exactly as `rlsim run`
  prepares it, so every sweep row equals `rlsim run`'s result for that config.
- `run_sweep`: evaluates every config with `sim.whatif.evaluate`: in-process for one worker, on a
  local process pool by default (the studies pickled once and unpickled once per worker, by the
  pool's initializer; several configs per task), or as Ray tasks (`ray_address`): the studies are
  `ray.put` once into the object store and each task (a chunk of configs) reads them from there.
  `evaluate` is pure, so every path gives identical results, returned in grid order.
- `rank_rows`, `write_results`: best first (smallest T_new / T_ref), `results.parquet` (with the
  grid and trace identity as key-value metadata), `results.csv`, `sweep.json`.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import math
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import types
import typing
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlsim.replay.errors import RlsimError

SWEEP_META_KEY = b"rlsim_sweep"
OUTPUT_FILES = ("results.parquet", "results.csv", "sweep.json", "charts")
RAY_HINT = "--ray-address needs Ray, an optional extra: pip install 'rlsim[ray]'"

Progress = Callable[[int], None]  # called with the number of configs just finished


# ----------------------------------------------------------------------------------------------
# grid


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, accepts None) of a field annotation like `int`, `float | None`, `Literal[...]`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        return (args[0] if len(args) == 1 else str), optional
    return tp, False


def parse_value(text: str, tp: Any, option: str) -> Any:
    """One list element converted to the field's type; RlsimError naming the option otherwise."""
    base, optional = _base_type(tp)
    s = text.strip()
    if s == "":
        raise RlsimError(f"{option}: empty element in the list (write values separated by single commas, e.g. {option} 64,128)")
    if optional and s.lower() in ("none", "null", "-"):
        return None
    try:
        if typing.get_origin(base) is typing.Literal:
            choices = typing.get_args(base)
            for c in choices:
                if str(c) == s:
                    return c
            raise ValueError(f"expected one of {', '.join(map(str, choices))}")
        if isinstance(base, type) and issubclass(base, enum.Enum):
            try:
                return base(s)
            except ValueError:
                return base[s]
        if base is bool:
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if base is int:
            f = float(s)
            if not f.is_integer():
                raise ValueError("expected an integer")
            return int(f)
        if base is float:
            v = float(s)
            if math.isnan(v):
                raise ValueError("NaN is not a value")
            return v
        return s
    except (ValueError, KeyError) as e:
        why = str(e) if str(e) and "could not convert" not in str(e) and "invalid literal" not in str(e) else \
            f"expected {getattr(base, '__name__', base)}"
        raise RlsimError(f"{option}: {s!r} is not a valid value ({why})") from None


def parse_list(text: str, tp: Any, option: str) -> list:
    """`"64,128,256"` -> [64, 128, 256]; duplicates removed (first kept)."""
    if text is None or not str(text).strip():
        raise RlsimError(f"{option}: empty list; give at least one value")
    out: list = []
    for part in str(text).split(","):
        v = parse_value(part, tp, option)
        if v not in out:
            out.append(v)
    return out


def whatif_type_hints(whatif_cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(whatif_cls)
    except Exception:  # unresolvable annotation: fall back to the raw ones
        return {f.name: f.type for f in dataclasses.fields(whatif_cls)}


def build_grid(whatif_cls: type, axes: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any] | None = None,
               *, labels: Mapping[str, str] | None = None) -> list:
    """The cartesian product of `axes` (field -> values) over `fixed` fields, as validated WhatIf configs.
    The last axis varies fastest. RlsimError for an empty grid or an invalid config (naming it)."""
    import itertools

    labels = labels or {}
    fixed = dict(fixed or {})
    for name, values in axes.items():
        if len(values) == 0:
            raise RlsimError(f"{labels.get(name, name)}: empty list; the grid would have no configs")
    names = list(axes)
    combos = list(itertools.product(*(axes[n] for n in names)))
    if not combos:
        raise RlsimError("the sweep grid is empty: give at least one value for each swept option")
    grid = []
    for combo in combos:
        kwargs = {**fixed, **dict(zip(names, combo))}
        try:
            cfg = whatif_cls(**kwargs)
            validate = getattr(cfg, "validate", None)
            if validate is not None:
                validate()
        except RlsimError as e:
            desc = " ".join(f"{labels.get(n, n)} {v}" for n, v in zip(names, combo))
            raise RlsimError(f"config [{desc}] is invalid: {e}") from None
        except (TypeError, ValueError) as e:
            raise RlsimError(f"invalid sweep values: {e}") from None
        grid.append(cfg)
    return grid


def config_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    return dict(vars(cfg))


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple):
        return list(v)
    return v


# ----------------------------------------------------------------------------------------------
# evaluation


def _default_evaluate() -> Callable:
    from rlsim.whatif import evaluate

    return evaluate


def outcome_row(cfg: Any, outcome: Any) -> dict[str, Any]:
    """One results row: the config's fields, then the outcome's flat dict (which wins on equal keys)."""
    row = config_dict(cfg)
    d = outcome.to_dict() if hasattr(outcome, "to_dict") else dict(outcome)
    row.update(d)
    return row


REFERENCE_KEYS = ("updates", "seed")  # WhatIf fields `prepare` also takes: the reference is simulated with them


@dataclasses.dataclass(frozen=True, eq=False)
class StudySet:
    """One fitted study per (updates, seed) of the grid, exactly as `rlsim run` prepares it for a config
    (the reference is simulated with the candidate's updates and seed), so every sweep row equals the
    `rlsim run` result of its config. Picklable; shipped to workers once."""

    studies: dict

    @staticmethod
    def key(cfg: Any) -> tuple:
        return tuple(getattr(cfg, k, None) for k in REFERENCE_KEYS)

    def for_config(self, cfg: Any) -> Any:
        return self.studies[self.key(cfg)]

    @property
    def first(self) -> Any:
        return next(iter(self.studies.values()))


def prepare_studies(traces: Sequence[Any], cfgs: Sequence[Any], *, rho_model: str = "auto",
                    target: float | None = None) -> StudySet:
    """Fit the traces for every distinct (updates, seed) in `cfgs` (usually one)."""
    from rlsim.whatif import prepare

    studies: dict = {}
    for cfg in cfgs:
        k = StudySet.key(cfg)
        if k not in studies:
            kw = {name: v for name, v in zip(REFERENCE_KEYS, k) if v is not None}
            studies[k] = prepare(traces, rho_model=rho_model, target=target, **kw)
    return StudySet(studies)


def check_configs(studies: StudySet, cfgs: Sequence[Any], labels: Mapping[str, str] | None = None) -> None:
    """Resolve every config against its study before any work is shipped (e.g. a group of 1 for GRPO):
    one clear RlsimError naming the config instead of a failure inside a worker."""
    from rlsim.whatif import sim_config

    labels = labels or {}
    for cfg in cfgs:
        try:
            sim_config(studies.for_config(cfg), cfg)
        except RlsimError as e:
            desc = " ".join(f"{labels.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in config_dict(cfg).items() if v is not None)
            raise RlsimError(f"config [{desc}] is invalid: {e}") from None


def evaluate_chunk(study: Any, chunk: Sequence[tuple[int, Any]], evaluate: Callable | None = None) -> list[tuple[int, dict]]:
    evaluate = evaluate or _default_evaluate()
    if isinstance(study, StudySet):
        return [(i, outcome_row(cfg, evaluate(study.for_config(cfg), cfg))) for i, cfg in chunk]
    return [(i, outcome_row(cfg, evaluate(study, cfg))) for i, cfg in chunk]


_WORKER: dict[str, Any] = {}


def _pool_init(study_blob: bytes, evaluate: Callable | None) -> None:
    # One unpickle per worker process; the chunks then only carry configs.
    _WORKER["study"] = pickle.loads(study_blob)
    _WORKER["evaluate"] = evaluate or _default_evaluate()


def _pool_chunk(chunk: Sequence[tuple[int, Any]]) -> list[tuple[int, dict]]:
    return evaluate_chunk(_WORKER["study"], chunk, _WORKER["evaluate"])


def chunks_of(items: Sequence[Any], size: int) -> list[list]:
    """ceil(n / size) chunks of at most `size` items, strided (chunk k holds items k, k + m, k + 2m, ...):
    grids list the batch outermost, so strided chunks mix cheap and costly configs and finish together."""
    m = max(1, math.ceil(len(items) / max(1, size)))
    return [list(items[k::m]) for k in range(m)] if items else []


def default_chunk_size(n: int, workers: int) -> int:
    # about 8 tasks per worker: balanced load and a live progress bar, small per-task overhead
    return max(1, min(64, math.ceil(n / max(1, 8 * workers))))


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_local(study: Any, cfgs: Sequence[Any], *, workers: int | None = None, chunk_size: int | None = None,
              progress: Progress | None = None, evaluate: Callable | None = None) -> list[dict]:
    """Evaluate on a local process pool (or in this process for one worker); rows in grid order."""
    n = len(cfgs)
    workers = max(1, workers or default_workers())
    chunk_size = chunk_size or default_chunk_size(n, workers)
    indexed = list(enumerate(cfgs))
    chunks = chunks_of(indexed, chunk_size)
    workers = min(workers, len(chunks))
    rows: list[dict | None] = [None] * n
    if workers <= 1:
        for ch in chunks:
            for i, row in evaluate_chunk(study, ch, evaluate):
                rows[i] = row
            if progress:
                progress(len(ch))
        return rows  # type: ignore[return-value]
    blob = pickle.dumps(study, protocol=pickle.HIGHEST_PROTOCOL)
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_pool_init,
                             initargs=(blob, evaluate)) as pool:
        pending = {pool.submit(_pool_chunk, ch): len(ch) for ch in chunks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                for i, row in fut.result():
                    rows[i] = row
                if progress:
                    progress(pending[fut])
                del pending[fut]
    return rows  # type: ignore[return-value]


def _ray_chunk(study: Any, chunk: Sequence[tuple[int, Any]], evaluate: Callable | None) -> list[tuple[int, dict]]:
    """A Ray task. The study arrives as a top-level ObjectRef argument, so Ray resolves it from the object
    store before the task starts (numpy arrays zero-copy). A `ray.get` inside the task would block the
    worker, release its CPU, and make Ray start extra worker processes that then compete for the cores."""
    return evaluate_chunk(study, chunk, evaluate)


def import_ray():
    try:
        import ray  # noqa: F401
    except ImportError:
        raise RlsimError(RAY_HINT) from None
    return ray


def ship_package(dest: str | os.PathLike) -> Path:
    """Lay the simulator side of the `rlsim` package out as one folder `dest/rlsim` (what Ray's
    `py_modules` uploads): the package's own folder maps to sim/ and its `replay` subpackage to
    replay/ (pyproject's package-dir), so neither folder alone is importable as `rlsim`. The runner
    is left out: sweeps never import it."""
    import rlsim
    import rlsim.replay

    root = Path(dest) / "rlsim"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(rlsim.__file__).parent, root, ignore=skip)
    shutil.copytree(Path(rlsim.replay.__file__).parent, root / "replay", ignore=skip, dirs_exist_ok=True)
    return root


def run_ray(study: Any, cfgs: Sequence[Any], *, address: str | None, chunk_size: int | None = None,
            progress: Progress | None = None, evaluate: Callable | None = None) -> list[dict]:
    """Evaluate as Ray tasks on the cluster at `address` (`auto`, `ray://host:10001`, or `local` for a new
    local instance). Reuses an already initialised Ray. Rows in grid order, identical to `run_local`."""
    ray = import_ray()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address and address != "local":
            # the cluster's workers import the simulator from the `rlsim` package, shipped from this install
            kwargs["runtime_env"] = {"py_modules": [str(ship_package(tempfile.mkdtemp(prefix="rlsim-ray-")))]}
        try:
            ray.init(address=address or "local", **kwargs)
        except ConnectionError as e:
            raise RlsimError(f"cannot reach the Ray cluster at {address!r}: {e}") from None
    n = len(cfgs)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    chunk_size = chunk_size or default_chunk_size(n, cpus)
    study_ref = ray.put(study)  # once, into the object store
    task = ray.remote(num_cpus=1)(_ray_chunk)
    pending = {}
    for ch in chunks_of(list(enumerate(cfgs)), chunk_size):
        pending[task.remote(study_ref, ch, evaluate)] = len(ch)
    rows: list[dict | None] = [None] * n
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            for i, row in ray.get(ref):
                rows[i] = row
            if progress:
                progress(pending[ref])
            del pending[ref]
    return rows  # type: ignore[return-value]


def run_sweep(study: Any, cfgs: Sequence[Any], *, workers: int | None = None, ray_address: str | None = None,
              chunk_size: int | None = None, progress: Progress | None = None,
              evaluate: Callable | None = None) -> list[dict]:
    if not cfgs:
        raise RlsimError("the sweep grid is empty: give at least one value for each swept option")
    if ray_address:
        return run_ray(study, cfgs, address=ray_address, chunk_size=chunk_size, progress=progress, evaluate=evaluate)
    return run_local(study, cfgs, workers=workers, chunk_size=chunk_size, progress=progress, evaluate=evaluate)


def same_rows(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Exact equality of two result lists, NaN equal to NaN (NaN != NaN would make equal sweeps differ)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return type(x) is type(y) and x == y

    return len(a) == len(b) and all(ra.keys() == rb.keys() and all(same(ra[k], rb[k]) for k in ra) for ra, rb in zip(a, b))


# ----------------------------------------------------------------------------------------------
# ranking and output


def _ratio(row: Mapping[str, Any]) -> float:
    v = row.get("time_to_target_ratio")
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.inf
    return f if math.isfinite(f) else math.inf


def rank_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Best first: smallest T_new / T_ref, then shortest step, then grid order. Adds `rank` and `config_id`."""
    keyed = []
    for i, r in enumerate(rows):
        st = r.get("step_time_s")
        st = float(st) if isinstance(st, (int, float)) and math.isfinite(st) else math.inf
        keyed.append((_ratio(r), st, i, r))
    keyed.sort(key=lambda k: k[:3])
    out = []
    for rank, (_, _, i, r) in enumerate(keyed, start=1):
        out.append({"rank": rank, "config_id": i, **r})
    return out


def reference_row(study: Any) -> dict[str, Any] | None:
    """The reference config's outcome (the trace's own P, G, lr rule), JSON-safe, for the sweep metadata."""
    from rlsim.whatif import reference_outcome

    if isinstance(study, StudySet):
        study = study.first
    if getattr(study, "ref_run", None) is None:  # a stand-in study (tests) has no reference run
        return None
    d = reference_outcome(study).to_dict()
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


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
            "status": meta.get("status"), "recovered": bool(getattr(trace, "recovered", False)),
            "config": meta.get("config", {}), "engine": meta.get("engine", {}), "model": meta.get("model", {}),
            "hardware": meta.get("hardware", {})}


def prepare_out_dir(out: str | os.PathLike, overwrite: bool, *, clear: bool = True) -> Path:
    """Refuse an existing output folder unless `overwrite`; then (`clear`) remove only the files a sweep writes."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise RlsimError(f"{out} exists and is not a folder; choose another --out")
        if not overwrite:
            raise RlsimError(f"output folder {out} already exists; pass --overwrite to replace its results or choose another --out")
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


def write_results(out: str | os.PathLike, ranked: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Path]:
    """results.parquet (metadata under key `rlsim_sweep`), results.csv and sweep.json in `out`."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

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
    import pyarrow.parquet as pq

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
    rows = table.to_pylist()
    rows.sort(key=lambda r: r.get("rank", 0))
    return rows, meta


def sweep_metadata(*, traces: Sequence[Any], axes: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any],
                   labels: Mapping[str, str], n_configs: int, study_options: Mapping[str, Any],
                   backend: Mapping[str, Any], seconds: float | None = None) -> dict[str, Any]:
    from importlib import metadata as md

    try:
        version = md.version("rlsim")
    except md.PackageNotFoundError:  # pragma: no cover
        version = None
    return {
        "kind": "rlsim sweep", "rlsim": version,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "grid": {"axes": {name: [_plain(v) for v in vals] for name, vals in axes.items()},
                 "options": {name: labels.get(name, name) for name in axes},
                 "fixed": {k: _plain(v) for k, v in fixed.items()}, "n_configs": n_configs},
        "study": dict(study_options), "backend": dict(backend), "seconds": seconds,
        "traces": [trace_identity(t) for t in traces],
        "ranking": "ascending time_to_target_ratio (T_new / T_ref = rho / sigma), then step_time_s",
    }
