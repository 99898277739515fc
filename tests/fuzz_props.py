"""Properties the fuzzer checks, shared by tests/test_fuzz.py (a few hundred cases per CI run) and
bench/fuzz_campaign.py (thousands).

Every property runs real inputs through the real code and accepts exactly two outcomes:
- success: exit 0 and, for `--json`, strict JSON (no NaN / Infinity) on stdout; a library call returns;
- refusal: exit 2 with exactly one line on stderr starting with `error:` and no traceback; a library
  call raises `RlsimError` with a one-line message.
Anything else (a traceback, exit 1, NaN in JSON, a multi-line error) raises `Bug` with the input and the
last lines of the traceback.

Inputs: mutations of the shipped traces (values set to NaN / inf / negative / huge, rows deleted or
reordered, the file truncated, a column retyped or dropped, the metadata JSON altered) and CLI
configurations at the edges (P, G, gen batch, updates, target: 0, negative, 1, huge, non-integers).
"""
from __future__ import annotations

import functools
import json
import math
import shutil
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from rlsim.replay.errors import RlsimError
from rlsim.replay.schema import COLUMNS, META_KEY

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
BASES = ("grpo_p32", "ppo_b256")
MAX_RESPONSES = 65536  # P x G (or gen batch) bound of the ordinary config property; bigger ones: prop_cli_huge
MAX_UPDATES = 5


class Bug(AssertionError):
    """The code under test did something neither a success nor a one-line refusal."""


def _raise_constant(name: str) -> Any:
    raise ValueError(f"non-strict JSON constant {name}")


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (what jq, JavaScript and Go refuse)."""
    return json.loads(text, parse_constant=_raise_constant)


# ---------------------------------------------------------------------------------------------- CLI
@functools.lru_cache(maxsize=1)
def _cli():
    from typer.testing import CliRunner

    from rlsim.cli import app

    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()  # click >= 8.2 keeps stderr apart by default
    return runner, app


def _tail(exc: BaseException | None, n: int = 6) -> str:
    if exc is None:
        return ""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    return "\n".join(lines[-n:])


def invoke(args: list[str], *, json_out: bool = True) -> dict[str, Any]:
    """Run `rlsim ARGS` in-process; return {"exit": 0, "json": ...} or {"exit": 2, "error": line}; raise
    Bug for anything else."""
    runner, app = _cli()
    res = runner.invoke(app, [str(a) for a in args])
    stderr = res.stderr if hasattr(res, "stderr") else ""
    where = f"rlsim {' '.join(map(str, args))}"
    if res.exit_code == 0 and res.exception is None:
        if not json_out:
            return {"exit": 0}
        try:
            return {"exit": 0, "json": strict_loads(res.stdout)}
        except ValueError as e:
            bad = [ln.strip() for ln in res.stdout.splitlines() if "NaN" in ln or "Infinity" in ln][:3]
            raise Bug(f"{where}: exit 0 but stdout is not strict JSON ({e}); lines: {bad}") from None
    if res.exit_code == 2 and (res.exception is None or isinstance(res.exception, SystemExit)):
        lines = stderr.strip().splitlines()
        if len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.output:
            return {"exit": 2, "error": lines[0]}
        raise Bug(f"{where}: exit 2 but stderr is not one `error:` line: {stderr.strip()[:600]!r}")
    raise Bug(f"{where}: exit {res.exit_code}, {type(res.exception).__name__ if res.exception else 'no exception'}\n"
              f"{_tail(res.exception)}\nstderr: {stderr.strip()[-400:]}")


@functools.lru_cache(maxsize=1)
def cli_has_drop_invalid() -> bool:
    import typer.main

    _, app = _cli()
    cmd = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return any("--drop-invalid" in p.opts for p in cmd.params)


def library_read(path: Path, *, drop_invalid: bool) -> Any:
    """read_trace: a Trace, or None after a one-line RlsimError; Bug otherwise."""
    from rlsim.replay.io import read_trace

    try:
        return read_trace(path, drop_invalid=drop_invalid)
    except RlsimError as e:
        if "\n" in str(e) or not str(e):
            raise Bug(f"read_trace({path.name}, drop_invalid={drop_invalid}): multi-line or empty error "
                      f"{str(e)!r}") from None
        return None
    except Exception as e:
        raise Bug(f"read_trace({path.name}, drop_invalid={drop_invalid}) raised {type(e).__name__}: "
                  f"{e}\n{_tail(e)}") from None


# ---------------------------------------------------------------------------------------------- traces
@functools.lru_cache(maxsize=None)
def base_table(base: str) -> pa.Table:
    return pq.read_table(TRACES / f"{base}.parquet")


@functools.lru_cache(maxsize=None)
def base_bytes(base: str) -> bytes:
    return (TRACES / f"{base}.parquet").read_bytes()


def base_meta(base: str) -> dict:
    return json.loads(base_table(base).schema.metadata[META_KEY])


NUMERIC = [(n, kinds) for n, t, kinds, _ in COLUMNS if pa.types.is_integer(t) or pa.types.is_floating(t)]
KINDS = sorted({k for _, kinds in NUMERIC for k in kinds})
BAD_VALUES = [math.nan, math.inf, -math.inf, -1.0, -1e-9, 0.0, 0.5, 1e9, 1e18, 2.0 ** 62, 1e300, -1e300, None]
META_VALUES = [None, 0, -1, 1, 2, 2 ** 40, 10 ** 30, 1.5, -0.5, "8", "", "x", [], {}, True, False, math.nan, math.inf]
META_PATHS = [("schema_version",), ("config", "prompts"), ("config", "group"), ("config", "G"), ("config", "batch"),
              ("config", "gen_batch"), ("config", "gen_responses"), ("config", "algo"), ("config", "lr_rule"),
              ("config", "max_tokens"), ("config", "lr"), ("engine", "max_num_seqs"), ("engine", "kv_cache_tokens"),
              ("engine", "block_size"), ("engine", "max_model_len"), ("engine", "warmup_excluded"), ("model", "bytes"),
              ("model", "name"), ("hardware", "mem_bandwidth_gbs"), ("hardware", "device_name"), ("trainer",),
              ("config",), ("engine",), ("model",), ("hardware",), ("status",), ("seed",)]
# columns a version-1 trace (every shipped one) holds: the mutations pick among these
_V1 = pq.read_schema(TRACES / f"{BASES[0]}.parquet").names
ALL_COLUMNS = [c[0] for c in COLUMNS if c[0] in _V1]
NUMERIC = [(n, kinds) for n, kinds in NUMERIC if n in _V1]
KINDS = sorted({k for _, kinds in NUMERIC for k in kinds})
RETYPES = ["string", "float64", "int32", "bool", "null", "dictionary", "large_string"]


def _value_mutation():
    return st.sampled_from(NUMERIC).flatmap(lambda nk: st.fixed_dictionaries({
        "op": st.just("value"), "column": st.just(nk[0]), "kind": st.sampled_from(sorted(nk[1])),
        "rows": st.one_of(st.just("all"), st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=4)),
        "value": st.sampled_from(BAD_VALUES)}))


MUTATIONS = st.one_of(
    _value_mutation(), _value_mutation(),  # twice the weight: the most varied
    st.fixed_dictionaries({"op": st.just("delete"),
                           "rows": st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=50)}),
    st.fixed_dictionaries({"op": st.just("slice"), "start": st.floats(0, 1), "length": st.floats(0, 1)}),
    st.fixed_dictionaries({"op": st.just("kind_only"), "kind": st.sampled_from(KINDS), "keep": st.booleans()}),
    st.fixed_dictionaries({"op": st.just("reorder"), "how": st.sampled_from(["reverse", "shuffle"]),
                           "seed": st.integers(0, 1000)}),
    st.fixed_dictionaries({"op": st.just("truncate"), "frac": st.floats(0, 1, exclude_max=True)}),
    st.fixed_dictionaries({"op": st.just("retype"), "column": st.sampled_from(ALL_COLUMNS),
                           "to": st.sampled_from(RETYPES)}),
    st.fixed_dictionaries({"op": st.just("drop_column"), "column": st.sampled_from(ALL_COLUMNS)}),
    st.fixed_dictionaries({"op": st.just("meta"), "path": st.sampled_from(META_PATHS),
                           "value": st.one_of(st.sampled_from(META_VALUES), st.just("<delete>"))}),
    st.fixed_dictionaries({"op": st.just("meta_raw"),
                           "text": st.sampled_from([b"", b"{", b"null", b"[]", b"1", b'"x"', b"NaN",
                                                    b'{"schema_version": 1}', b"\xff\xfe", b"[" * 5000,
                                                    b'{"schema_version": 1, "config": {"prompts": 1e999}}'])}),
)

META_MUTATIONS = st.one_of(
    st.fixed_dictionaries({"op": st.just("meta"), "path": st.sampled_from(META_PATHS),
                           "value": st.one_of(st.sampled_from(META_VALUES), st.just("<delete>"))}),
    st.fixed_dictionaries({"op": st.just("meta_raw"), "text": st.sampled_from(
        [b"", b"{", b"null", b"[]", b"1", b'"x"', b"NaN", b'{"schema_version": 1}', b"\xff\xfe", b"[" * 5000,
         b'{"schema_version": 1, "config": {"prompts": 1e999}}'])}),
)


def _positions(n: int, rows: Any) -> np.ndarray:
    if rows == "all":
        return np.arange(n)
    return np.unique(np.array([int(f * n) for f in rows], dtype=np.int64)) if n else np.zeros(0, np.int64)


def mutate(base: str, m: dict, out: Path) -> Path:
    """Write the base trace with mutation `m` applied to `out`."""
    if m["op"] == "truncate":
        data = base_bytes(base)
        out.write_bytes(data[: int(m["frac"] * len(data))])
        return out
    t = base_table(base)
    meta_raw = t.schema.metadata[META_KEY]
    op = m["op"]
    if op == "value":
        kind = t["kind"].to_numpy(zero_copy_only=False)
        pos = np.nonzero(kind == m["kind"])[0]
        pos = pos[_positions(len(pos), m["rows"])]
        col = t[m["column"]]
        vals = col.to_numpy(zero_copy_only=False).astype(float)
        null = col.is_null().to_numpy(zero_copy_only=False)
        vals[pos] = np.nan if m["value"] is None else m["value"]
        null = null.copy()
        null[pos] = m["value"] is None
        typ = col.type
        arr = pa.array(vals, mask=null)
        if not pa.types.is_floating(typ):
            # an int column cannot hold NaN/inf/fractions: write it as float64 (a writer that got the type wrong)
            ok = (np.isfinite(vals[~null]).all() and (np.floor(vals[~null]) == vals[~null]).all()
                  and (np.abs(vals[~null]) < 2 ** 62).all())
            arr = arr.cast(typ) if ok else arr
        t = t.set_column(t.schema.get_field_index(m["column"]), m["column"], arr)
    elif op == "delete":
        keep = np.ones(t.num_rows, bool)
        keep[_positions(t.num_rows, m["rows"])] = False
        t = t.filter(pa.array(keep))
    elif op == "slice":
        start = int(m["start"] * t.num_rows)
        t = t.slice(start, int(m["length"] * (t.num_rows - start)))
    elif op == "kind_only":
        eq = pa.compute.equal(t["kind"], m["kind"])
        t = t.filter(eq if m["keep"] else pa.compute.invert(eq))
    elif op == "reorder":
        idx = (np.arange(t.num_rows)[::-1] if m["how"] == "reverse"
               else np.random.default_rng(m["seed"]).permutation(t.num_rows))
        t = t.take(pa.array(idx))
    elif op == "retype":
        c, i = m["column"], t.schema.get_field_index(m["column"])
        col = t[c]
        to = m["to"]
        if to == "null":
            arr = pa.nulls(t.num_rows)
        elif to == "dictionary":
            arr = (col.cast(pa.string()).dictionary_encode() if not pa.types.is_string(col.type)
                   else col.dictionary_encode())
        elif to in ("string", "large_string"):
            arr = col.cast(pa.string() if to == "string" else pa.large_string())
        elif to == "bool":
            arr = pa.array(np.asarray(col.is_valid()), pa.bool_())
        elif pa.types.is_string(col.type):
            arr = pa.array(np.arange(t.num_rows) % 5, getattr(pa, to)())
        else:
            arr = col.cast(getattr(pa, to)(), safe=False)
        t = t.set_column(i, c, arr)
    elif op == "drop_column":
        t = t.drop_columns([m["column"]])
    elif op == "meta":
        meta = json.loads(meta_raw)
        obj, key = meta, m["path"][-1]
        for p in m["path"][:-1]:
            obj = obj.setdefault(p, {}) if isinstance(obj.get(p), dict) or p not in obj else obj[p]
        if m["value"] == "<delete>":
            obj.pop(key, None)
        else:
            obj[key] = m["value"]
        meta_raw = json.dumps(meta).encode()  # allow_nan: NaN / Infinity as JSON tokens, as a sloppy writer would
    elif op == "meta_raw":
        meta_raw = m["text"]
    else:  # pragma: no cover
        raise ValueError(op)
    pq.write_table(t.replace_schema_metadata({META_KEY: meta_raw}), out)
    return out


@contextmanager
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rlsim-fuzz-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


COMMANDS = ("replay", "run", "run-drop")


def prop_mutated_trace(base: str, mutation: dict, command: str) -> str:
    """A mutated trace: the reader returns or refuses in one line (with and without drop_invalid), and
    `rlsim replay|run` exit 0 with strict JSON or 2 with one line. Returns the outcome (for tables)."""
    with workdir() as d:
        p = mutate(base, mutation, d / f"{base}.parquet")
        strict = library_read(p, drop_invalid=False)
        lenient = library_read(p, drop_invalid=True)
        if strict is not None and lenient is None:
            raise Bug(f"{mutation}: read_trace accepts the file but refuses it with drop_invalid=True")
        if strict is not None and (strict.dropped or strict.warnings):
            raise Bug(f"{mutation}: read_trace without drop_invalid reports dropped rows {strict.dropped}")
        if command == "replay":
            r = invoke(["replay", p, "--json"])
        else:
            extra = ["--drop-invalid"] if command == "run-drop" and cli_has_drop_invalid() else []
            r = invoke(["run", "--trace", p, "--batch", "64", "--updates", "2", "--json", *extra])
        if strict is None and command != "run-drop" and r["exit"] == 0:
            raise Bug(f"{mutation}: read_trace refuses the file but `rlsim {command}` accepted it")
        return "ok" if r["exit"] == 0 else "refused"


# ---------------------------------------------------------------------------------------------- configs
INT_EDGES = [0, -1, 1, 2, 3, 7, 64, 1000, 10 ** 9]
TEXT_EDGES = ["1.5", "abc", "1e3", "", " 8", "0x10", "nan", "inf", "-0", "2,3"]
# per option: ordinary values (None: not given), and edge values; a config takes up to 3 options at an edge
VALID = {"batch": [None, 1, 2, 3, 64, 1000], "group": [None, 2, 3, 16], "gen_batch": [None],
         "updates": [None, 1, 2, MAX_UPDATES], "target": [None, 0.0, 0.5, 0.9, 1.0, 2.0, -1.0],
         "max_num_seqs": [None, 1, 64, 1024], "kv_cache_tokens": [None, 4096, 10 ** 6],
         "lr_rule": [None, "sqrt", "linear", "fixed"], "rho": [None, "auto", "invariant", "noise-scale"],
         "seed": [None, 0, 1]}
EDGES = {"batch": INT_EDGES + TEXT_EDGES, "group": INT_EDGES + TEXT_EDGES,
         "gen_batch": [0, -1, 1, 7, 65536, 10 ** 9] + TEXT_EDGES, "updates": [0, -1] + TEXT_EDGES,
         "target": [1e300, -1e300, "nan", "inf", "-inf", "abc"], "max_num_seqs": [0, -1, 10 ** 9] + TEXT_EDGES,
         "kv_cache_tokens": [0, -1, 1, 16, 64, 10 ** 12] + TEXT_EDGES, "lr_rule": ["", "SQRT", "x"],
         "rho": ["", "x", "curves"], "seed": [-1, 2 ** 63, "x"]}


@st.composite
def _configs(draw) -> dict:
    edged = set(draw(st.lists(st.sampled_from(sorted(EDGES)), max_size=3, unique=True)))
    cfg = {"base": draw(st.sampled_from(BASES)), "json": draw(st.booleans())}
    for k in VALID:
        cfg[k] = draw(st.sampled_from(EDGES[k] if k in edged else VALID[k]))
    return cfg


CONFIGS = _configs()


def _int_or_none(v: Any) -> int | None:
    try:
        return int(str(v).strip()) if v is not None else None
    except ValueError:
        return None


def responses(cfg: dict) -> int:
    """An upper bound of the responses per update a config would simulate (0 when it cannot parse)."""
    meta = base_meta(cfg["base"])["config"]
    p = _int_or_none(cfg["batch"]) or meta["prompts"]
    g = _int_or_none(cfg["group"]) or meta["G"]
    gb = _int_or_none(cfg["gen_batch"]) or 0
    return max(abs(p) * abs(g), abs(gb))


BOUNDED_CONFIGS = CONFIGS.filter(lambda c: responses(c) <= MAX_RESPONSES)


def cli_args(cfg: dict) -> list[str]:
    args = ["run", "--trace", TRACES / f"{cfg['base']}.parquet"]
    for key, flag in (("batch", "--batch"), ("group", "--group"), ("gen_batch", "--gen-batch"),
                      ("updates", "--updates"), ("target", "--target"), ("max_num_seqs", "--max-num-seqs"),
                      ("kv_cache_tokens", "--kv-cache-tokens"), ("lr_rule", "--lr-rule"), ("rho", "--rho"),
                      ("seed", "--seed")):
        if cfg.get(key) is not None:
            args += [flag, str(cfg[key])]
    if cfg["updates"] is None:
        args += ["--updates", str(MAX_UPDATES)]
    if cfg["json"]:
        args.append("--json")
    return [str(a) for a in args]


def prop_cli_config(cfg: dict) -> str:
    """`rlsim run` with edge-case options: exit 0 (strict JSON with --json, finite numbers where the
    config is valid) or exit 2 with one line."""
    r = invoke(cli_args(cfg), json_out=cfg["json"])
    return "ok" if r["exit"] == 0 else "refused"


HUGE = st.fixed_dictionaries({"base": st.sampled_from(BASES),
                              "batch": st.sampled_from([10 ** 6, 10 ** 9, 2 ** 40, 10 ** 18]),
                              "group": st.sampled_from([None, 1, 2, 16, 10 ** 6]), "gen_batch": st.just(None),
                              "updates": st.just(1), "target": st.just(None), "json": st.just(True),
                              "max_num_seqs": st.sampled_from([None, 10 ** 6])})


def prop_cli_huge(cfg: dict, timeout_s: float = 20.0, mem_gb: float = 6.0) -> str:
    """A batch far beyond any real run: refused in one line or finished, in a subprocess with a time and
    memory limit. Returns 'ok', 'refused' or 'timeout' (neither within the limits; the caller decides)."""
    import resource
    import subprocess
    import sys

    def limit() -> None:  # an address-space cap so a runaway allocation fails instead of swapping the machine
        resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2 ** 30), int(mem_gb * 2 ** 30)))

    args = cli_args(cfg)
    try:
        proc = subprocess.run([sys.executable, "-c", "from rlsim.cli import main; main()", *args], capture_output=True,
                              text=True, timeout=timeout_s, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return "timeout"
    where = f"rlsim {' '.join(args)}"
    if proc.returncode == 0:
        try:
            strict_loads(proc.stdout)
        except ValueError as e:
            raise Bug(f"{where}: exit 0 but not strict JSON ({e})") from None
        return "ok"
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"):
        return "refused"
    raise Bug(f"{where}: exit {proc.returncode}; stderr tail: {chr(10).join(lines[-6:])}")


# ---------------------------------------------------------------------------------------------- execution modes
MODE_NAMES = [None, "colocated", "sync", "split", "colocate_async", "separate_async", "separate_async_switch",
              "fully_async", "one_step_off", "areal", "nemo_async"]
BAD_MODES = ["", "bogus", "SPLIT", "sync ", "colocated,split"]
NUM_EDGES = ["nan", "inf", "-inf", "-1", "-0.5", "1e300", str(10 ** 19), "abc", "", "1.5"]
# mode setting -> (CLI flag, ordinary values, edge values); bools are flags (True: given)
MODE_SETTINGS = {
    "staleness_threshold": ("--staleness-threshold", ["0", "0.5", "1", "2"], NUM_EDGES),
    "trigger_parameter_sync_step": ("--trigger-parameter-sync-step", ["1", "2", "4"], NUM_EDGES + ["0", "3"]),
    "require_batches": ("--require-batches", ["1", "2"], NUM_EDGES + ["0"]),
    "num_warmup_batches": ("--num-warmup-batches", ["0.5", "1", "2"], NUM_EDGES + ["0"]),
    "parameter_sync_step": ("--parameter-sync-step", ["1", "2", "4"], NUM_EDGES + ["0", "3"]),
    "max_off_policy_threshold": ("--max-off-policy-threshold", ["0", "1", "8"], NUM_EDGES),
    "max_off_policy_strategy": ("--max-off-policy-strategy", ["drop", "wait"], ["", "DROP", "x", "1"]),
    "switch_threshold_ratio": ("--switch-threshold-ratio", ["0.2", "0.4", "1"], NUM_EDGES + ["0", "1.01"]),
    "max_head_offpolicyness": ("--max-head-offpolicyness", ["0", "1", "4"], NUM_EDGES),
    "max_trajectory_age_steps": ("--max-trajectory-age-steps", ["1", "2"], NUM_EDGES + ["0"]),
    "concurrent_samples_per_replica": ("--concurrent-samples-per-replica", ["1", "4", "16"], NUM_EDGES + ["0"]),
    "max_concurrent_rollouts": ("--max-concurrent-rollouts", ["1", "8", "64"], NUM_EDGES + ["0"]),
    "staleness": ("--staleness", ["0", "0.5", "1"], NUM_EDGES),
    "weight_sync": ("--weight-sync", ["nccl", "nemo_nccl", "checkpoint_engine", "moe_reshard"], ["", "NCCL", "x"]),
    "in_flight_weight_updates": ("--in-flight-weight-updates", [True], [True]),
    "recompute_kv_cache_after_weight_updates": ("--recompute-kv-cache-after-weight-updates", [True], [True]),
    "partial_rollout": ("--partial-rollout", [True], [True]),
    "rollout_log_probs": ("--rollout-log-probs", [True], [True]),
}
DEVICE_VALUES = [None, None, 1, 2, 4, 8]
DEVICE_EDGES = [0, -1, 3, 10 ** 6, 10 ** 19, "x", "1.5", ""]
MODE_TIMEOUT_S = 20.0  # per case, as prop_cli_huge's subprocess limit


def _mode_spec(mode: Any):
    from rlsim.modes.registry import ALIASES, MODES

    return MODES.get(ALIASES.get(mode, mode)) if isinstance(mode, str) else None


@st.composite
def _mode_configs(draw) -> dict:
    """A mode (registered, alias, absent or bad), 0-3 settings, devices, P / G, and the command (mostly run, a
    few sweep / plan). Two cases in three are coherent (the mode's own settings and the devices its kind needs,
    values ordinary or at an edge), so that most reach the simulator; the rest mix any settings and devices (a
    setting given to a mode that does not read it is part of the domain)."""
    base = draw(st.sampled_from(BASES))
    cfg = {"base": base, "json": draw(st.booleans()), "command": draw(st.sampled_from(["run"] * 8 + ["sweep", "plan"])),
           "mode": draw(st.sampled_from(MODE_NAMES + BAD_MODES if draw(st.integers(0, 9)) == 0 else MODE_NAMES)),
           "batch": draw(st.sampled_from([None, 4, 6, 8, 16] + ([0, -1, "x"] if draw(st.integers(0, 5)) == 0
                                                                  else []))),
           "group": None if base == "ppo_b256" else draw(st.sampled_from([None, 2, 4]))}
    spec, coherent = _mode_spec(cfg["mode"]), draw(st.integers(0, 2)) > 0
    for k in ("gen_gpus", "train_gpus", "gen_tp"):
        cfg[k] = draw(st.sampled_from(DEVICE_EDGES if draw(st.integers(0, 7)) == 0 else DEVICE_VALUES))
    if coherent and spec is not None:
        if spec.devices == "colocated":
            cfg["gen_gpus"] = cfg["train_gpus"] = None
        if spec.devices == "hybrid":
            cfg["gen_gpus"] = None
        cfg["train_gpus"] = cfg["train_gpus"] if spec.devices == "colocated" else cfg["train_gpus"] or 2
        cfg["gen_gpus"] = cfg["gen_gpus"] or 2 if spec.devices == "split" else cfg["gen_gpus"]
        devs, tp = _int_or_none(cfg["gen_gpus"] or cfg["train_gpus"]), _int_or_none(cfg["gen_tp"])
        if spec.devices == "colocated" or cfg["command"] == "plan" or (tp and devs and devs % tp):
            cfg["gen_tp"] = None
    pool = sorted(MODE_SETTINGS)
    if coherent:
        split_only = (["weight_sync", "rollout_log_probs"] if spec is not None and spec.devices != "colocated"
                      and cfg["command"] != "plan" else [])
        pool = sorted(set(spec.settings if spec else ()) | set(split_only)) or pool[:0]
    settings = draw(st.lists(st.sampled_from(pool), max_size=3, unique=True)) if pool else []
    cfg["settings"] = {}
    for s in settings:
        _, ok, bad = MODE_SETTINGS[s]
        cfg["settings"][s] = draw(st.sampled_from(bad if draw(st.integers(0, 2)) == 0 else ok))
    return cfg


MODE_CONFIGS = _mode_configs()


def mode_args(cfg: dict) -> list[str]:
    cmd = cfg["command"]
    args = [cmd, TRACES / f"{cfg['base']}.parquet"]
    if cmd == "plan" and isinstance(cfg["batch"], int) and cfg["batch"] > 0:  # plan takes two or more sizes
        args += ["--batch", f"{cfg['batch']},{2 * cfg['batch']}"]
    for key, flag in (("mode", "--mode"), ("group", "--group"), ("gen_gpus", "--gen-gpus"),
                      ("train_gpus", "--train-gpus"), ("gen_tp", "--gen-tp")):
        if cfg.get(key) is not None:
            args += [flag, str(cfg[key])]
    if cfg["batch"] is not None and (cmd != "plan" or not isinstance(cfg["batch"], int) or cfg["batch"] <= 0):
        args += ["--batch", str(cfg["batch"])]
    for s, v in cfg["settings"].items():
        flag = MODE_SETTINGS[s][0]
        args += ([flag] if cmd == "run" else [flag, "true"]) if v is True else [flag, v]
    if cmd != "plan":
        args += ["--updates", "2"]
    if cmd == "sweep":
        args += ["--out", "{out}", "--no-charts"]
    if cfg["json"] and cmd != "sweep":
        args.append("--json")
    return [str(a) for a in args]


class Hang(BaseException):
    """Raised by the alarm in the middle of the code under test (a BaseException, so no `except Exception` in the
    CLI turns it into an exit code)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM after `seconds` raises Hang (main thread only; elsewhere no limit)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def prop_cli_mode(cfg: dict, timeout_s: float = MODE_TIMEOUT_S) -> str:
    """`rlsim run|sweep|plan` with an execution mode, its settings and devices: exit 0 (strict JSON with --json)
    or exit 2 with one `error:` line, within `timeout_s`."""
    with workdir() as d:
        args = [a.replace("{out}", str(d / "sweep")) for a in mode_args(cfg)]
        try:
            with time_limit(timeout_s):
                r = invoke(args, json_out=cfg["json"] and cfg["command"] != "sweep")
        except Hang:
            raise Bug(f"rlsim {' '.join(args)}: no answer within {timeout_s:.0f} s") from None
    return "ok" if r["exit"] == 0 else "refused"


# API: predict(trace, mode=..., settings as keywords); values as Python objects, wrong types included
API_VALUES = [None, 0, 1, 2, -1, 0.5, 1.5, math.nan, math.inf, -math.inf, 10 ** 19, 1e300, "1", "x", "", True,
              False, [1], {}]


def _py(v: Any) -> Any:
    """A CLI value as a notebook user would pass it: a number where it parses, else the string as given."""
    if not isinstance(v, str):
        return v
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


@st.composite
def _api_calls(draw) -> dict:
    """One of MODE_CONFIGS as keywords (numbers as Python numbers), one keyword in three swapped for any Python
    value (wrong types included), and one call in four fitted with rho / bend_batch / kappa / drop_invalid."""
    cfg = draw(MODE_CONFIGS)
    kw: dict[str, Any] = {"updates": 2}
    for k in ("mode", "gen_gpus", "train_gpus", "gen_tp"):
        if cfg[k] is not None:
            kw[k] = _py(cfg[k])
    if cfg["batch"] is not None:
        kw["prompts"] = _py(cfg["batch"])
    kw.update({k: _py(v) for k, v in cfg["settings"].items()})
    if len(kw) > 1 and draw(st.integers(0, 2)) == 0:
        kw[draw(st.sampled_from(sorted(kw)))] = draw(st.sampled_from(API_VALUES))
    extra = draw(st.lists(st.sampled_from(["rho", "bend_batch", "kappa", "drop_invalid"]), max_size=2, unique=True)
                 if draw(st.integers(0, 3)) == 0 else st.just([]))
    fit = {k: draw(st.sampled_from(API_VALUES + ["lr-aware", "invariant"])) for k in extra}
    return {"base": cfg["base"], "kw": kw, "fit": fit}


API_CALLS = _api_calls()


def prop_api_mode(call: dict, timeout_s: float = MODE_TIMEOUT_S) -> str:
    """rlsim.predict(trace, mode=..., ...), of rlsim.fit(trace, rho=..., ...) where the call has fit keywords:
    returns, or raises RlsimError with one line; never another exception."""
    import rlsim

    trace = str(TRACES / f"{call['base']}.parquet")
    where = f"rlsim.predict({call['base']} fitted with {call['fit']!r}, **{call['kw']!r})"
    try:
        with time_limit(timeout_s):
            rlsim.predict(rlsim.fit(trace, **call["fit"]) if call["fit"] else trace, **call["kw"])
    except Hang:
        raise Bug(f"{where}: no answer within {timeout_s:.0f} s") from None
    except RlsimError as e:
        if "\n" in str(e) or not str(e):
            raise Bug(f"{where}: multi-line or empty RlsimError {str(e)!r}") from None
        return "refused"
    except Exception as e:
        raise Bug(f"{where} raised {type(e).__name__}: {e}\n{_tail(e)}") from None
    return "ok"
