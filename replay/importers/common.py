"""What the importers share: reading metric tables (JSONL, CSV, YAML configs), numbers as frameworks
print them, batch arithmetic with flag-vs-config checks, and writing the step-level trace.

A step-level trace (the kinds of schema version 2, written at the current version; docs/importing.md) holds
per RL step: one `update` row (batch,
tokens, step and phase totals), one `phase` row per timed phase, one `step_stats` row (length and score
statistics and every logged metric under its original name), `sync` rows for a timed weight sync and
`eval` rows for validation scores. Its metadata says where it came from (`source`).

Size: the one place every importer shares (parsing, batch arithmetic, the trace writer), so that the
per-framework modules stay small.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from rlsim.replay.devices import get_profile, known_names
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import write_trace
from rlsim.replay.schema import EVAL, PHASE, STEP_STATS, SYNC, UPDATE

# What each phase is to rlsim. gen: generation (incl. a weight reshard done inside it); reward: rewards
# and advantages; prep: batch preparation (old log-probs, reference, values); update: optimizer updates;
# sync: a separate weight sync; eval: validation; checkpoint: saving; nested: timed inside another phase
# (not summed); whole: the whole step, not split into phases; other: anything else (summed as "other").
ROLES = ("gen", "reward", "prep", "update", "sync", "eval", "checkpoint", "nested", "whole", "other")
# roles whose time is outside the RL step proper (rlsim's step_time excludes them, like rlrun's evals)
OUTSIDE_STEP = ("eval", "checkpoint")


def parse_number(text: str) -> float | None:
    """A number as Python/numpy/torch print it: 0.5, 1e-06, nan, inf, np.float64(0.5), np.int64(3),
    numpy.float32(2.0), tensor(0.5, device='cuda:0'), True. None if it is not one."""
    t = text.strip()
    m = re.fullmatch(r"(?:np|numpy)\.(?:float|int|uint)\d*\((.*)\)|(?:np|numpy)\.bool_?\((.*)\)"
                     r"|tensor\(([^,()]*)(?:,.*)?\)", t)
    if m:
        t = next(g for g in m.groups() if g is not None).strip()
    if t in ("True", "False"):
        return 1.0 if t == "True" else 0.0
    try:
        return float(t)
    except ValueError:
        return None


def parse_params(text: str | float | int | None) -> float | None:
    """Model parameters from '7B', '0.5b', '500M', '1.5e9' or a number."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    t = str(text).strip().lower().replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmbt]?)", t)
    if m:
        return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2)]
    try:
        return float(t)
    except ValueError:
        raise RlsimError(f"--model-params must be a count such as 7B, 0.5B, 500M or 1.5e9, got {text!r}") from None


def params_from_name(name: str | None) -> float | None:
    """Parameters read from a model path such as Qwen/Qwen2.5-3B-Instruct (3e9) or Llama-3.1-8B (8e9);
    None if the name has no size in it. An '8x7B' mixture counts 8 x 7B."""
    if not name:
        return None
    base = str(name).rstrip("/").rsplit("/", 1)[-1]
    m = re.search(r"(?:(\d+)x)?(\d+(?:\.\d+)?)([bBmM])(?![a-zA-Z0-9])", base)
    if not m:
        return None
    n = float(m.group(2)) * (1e9 if m.group(3) in "bB" else 1e6)
    return n * int(m.group(1)) if m.group(1) else n


def model_params_of(flag: str | float | None, model_name: str | None) -> tuple[float | None, str]:
    """The model's parameter count and where it came from: --model-params, else the size in the model path."""
    if flag is not None:
        return parse_params(flag), "--model-params"
    n = params_from_name(model_name)
    return n, (f"parsed from the model path {model_name!r} (pass --model-params to override)" if n else "")


def config_subset(cfg: dict[str, Any], keys: Iterable[str], *, dotted: bool = False) -> dict[str, Any]:
    """The config values an imported trace keeps in its metadata: `keys` as given (dotted paths with `dotted`)."""
    if dotted:
        return {k: dig(cfg, k) for k in keys if dig(cfg, k) is not None}
    return {k: cfg[k] for k in keys if k in cfg}


def unwrap(cfg: Any) -> Any:
    """A W&B config export ({key: {desc, value}}) as plain values; anything else as it is."""
    if isinstance(cfg, dict):
        if set(cfg) <= {"desc", "value"} and "value" in cfg:
            return unwrap(cfg["value"])
        return {k: unwrap(v) for k, v in cfg.items() if k not in ("_wandb", "wandb_version")}
    return cfg


def load_config(path: str | Path | None) -> dict[str, Any]:
    """A saved config: YAML (Hydra's .hydra/config.yaml, a W&B config.yaml, a TRL recipe) or JSON."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise RlsimError(f"config file not found: {p}")
    text = p.read_text(errors="replace")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError, json.JSONDecodeError
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RlsimError(f"{p} is not a readable YAML/JSON config ({first}); pass the run's saved config") from None
    if not isinstance(data, dict):
        raise RlsimError(f"{p} does not hold a mapping of config keys; pass the run's saved config (e.g. "
                         ".hydra/config.yaml)")
    return unwrap(data)


def dig(cfg: dict[str, Any], dotted: str) -> Any:
    """cfg['a']['b']['c'] for 'a.b.c', also accepting a flat key 'a.b.c'; None when absent."""
    if dotted in cfg:
        return cfg[dotted]
    cur: Any = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def pick(flag: Any, config_value: Any, flag_name: str, config_key: str, config_file: str | None) -> Any:
    """A flag and a config value for the same thing: the one given, or an error when both are given and disagree."""
    if config_value is not None and flag is not None:
        try:
            same = float(flag) == float(config_value)
        except (TypeError, ValueError):
            same = str(flag) == str(config_value)
        if not same:
            raise RlsimError(f"{flag_name} {flag} disagrees with {config_key} = {config_value} in {config_file}; "
                             f"drop {flag_name} or pass the config of this run")
    return flag if flag is not None else config_value


def positive_int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise RlsimError(f"{what} must be a positive integer, got {v!r}") from None
    if not math.isfinite(f) or f <= 0 or f != int(f):
        raise RlsimError(f"{what} must be a positive integer, got {v!r}")
    return int(f)


# ------------------------------------------------------------------------------------------ tables
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object per line: flat metrics ({"step": 3, "timing_s/gen": 1.2}) or verl-style
    {"step": 3, "data": {...}}. A line that is not JSON is a truncated line: an error naming it."""
    rows = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise RlsimError(f"{path} line {i} is not a complete JSON object (truncated?): {line[:80]!r}; "
                             "cut the line or re-export the log") from None
        if not isinstance(obj, dict):
            raise RlsimError(f"{path} line {i} is not a JSON object of metrics: {line[:80]!r}")
        if isinstance(obj.get("data"), dict):
            obj = {**{k: v for k, v in obj.items() if k != "data"}, **obj["data"]}
        rows.append(flatten(obj))
    return rows


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def read_csv(path: Path) -> list[dict[str, Any]]:
    """A W&B history export: one row per logged step, one column per metric (`_step`, `_runtime`,
    `_timestamp` included). A panel export ("Step", "<run> - <metric>", "<run> - <metric>__MIN") is
    accepted too: the run prefix is stripped and the __MIN/__MAX columns are left out."""
    text = path.read_text(errors="replace")
    reader = csv.reader(text.splitlines())
    try:
        header = next(reader)
    except StopIteration:
        return []
    names = []
    for h in header:
        h = h.strip()
        if h.endswith(("__MIN", "__MAX")):
            names.append(None)
            continue
        if " - " in h:
            h = h.rsplit(" - ", 1)[1]
        names.append("_step" if h == "Step" else h)
    rows = []
    for i, rec in enumerate(reader, 2):
        if not any(c.strip() for c in rec):
            continue
        if len(rec) != len(header):
            raise RlsimError(f"{path} line {i} has {len(rec)} fields, the header {len(header)} (truncated line?); "
                             "cut the line or re-export the CSV")
        row = {}
        for n, v in zip(names, rec):
            if n is None or v.strip() == "":
                continue
            x = parse_number(v)
            row[n] = x if x is not None else v
        rows.append(row)
    return rows


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of a row (booleans as 0/1); strings and NaN dropped."""
    out = {}
    for k, v in row.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            if math.isfinite(float(v)):
                out[k] = float(v)
        elif isinstance(v, str):
            x = parse_number(v)
            if x is not None and math.isfinite(x):
                out[k] = x
    return out


# ------------------------------------------------------------------------------------------ model
@dataclass
class Phase:
    name: str
    role: str
    seconds: float


@dataclass
class Step:
    """One RL step as a framework logged it, in rlsim's terms."""

    index: int                                   # 0-based update index (verl global_step - 1)
    metrics: dict[str, float]                    # every numeric metric of the step, original names
    phases: list[Phase] = field(default_factory=list)
    total_time: float = math.nan                 # wall seconds of the whole step as logged (evals included)
    num_tokens: float = math.nan                 # prompt + response tokens trained on
    responses: int = 0                           # responses trained on (B)
    response: tuple[float, float, float, float] = (math.nan,) * 4   # mean, min, max, clip ratio
    prompt: tuple[float, float, float, float] = (math.nan,) * 4
    score: tuple[float, float, float] = (math.nan,) * 3              # mean, min, max
    lr: float = math.nan
    loss: float = math.nan
    grad_norm: float = math.nan
    critic_loss: float = math.nan
    critic_grad_norm: float = math.nan


@dataclass
class Eval:
    updates: int          # updates completed when the score was taken (0: the base policy)
    score: float
    k: int | None
    metric: str
    seconds: float = math.nan


@dataclass(frozen=True)
class ImportFlags:
    """What `rlsim import` takes beside the log, stated once; each importer names the ones it reads
    (`Importer.flags`) and how its framework spells them (`Importer.help`)."""

    config: Path | None = field(default=None, metadata={
        "help": "the run's saved config (YAML or JSON) for batch sizes, GPUs, model and caps",
        "flags": ["--config", "-c"]})
    prompts: int | None = field(default=None, metadata={"help": "P: prompts per step", "flags": ["--prompts"]})
    group: int | None = field(default=None, metadata={"help": "G: responses per prompt", "flags": ["--group"]})
    gpus: int | None = field(default=None, metadata={"help": "GPUs the run trained on", "flags": ["--gpus"]})
    device: str | None = field(default=None, metadata={
        "help": f"the GPU the run used (a device profile: {known_names()}); enables the roofline priors and --device "
                "rescaling", "flags": ["--device"]})
    model_params: str | None = field(default=None, metadata={
        "help": "model parameters, e.g. 7B, 0.5B, 1.5e9 (None: read from the model path in the config)",
        "flags": ["--model-params"]})
    model_config: Path | None = field(default=None, metadata={
        "help": "the model's Hugging Face config.json: its layer shapes size the KV cache and activations in the "
                "memory estimate (None: the model's name, if rlsim knows it, else --model-params alone)",
        "flags": ["--model-config"]})
    tp: int | None = field(default=None, metadata={"help": "rollout tensor parallel size", "flags": ["--tp"]})
    eval_metric: str | None = field(default=None, metadata={
        "help": "the validation metric to use as the eval score (None: chosen per framework, see docs/importing.md)",
        "flags": ["--eval-metric"]})
    drop_truncated: bool = field(default=False, metadata={
        "help": "skip truncated step lines instead of failing", "flags": ["--drop-truncated"]})


@dataclass(frozen=True)
class Importer:
    """One framework's importer: what `rlsim import NAME` says and takes, and the function that reads its log."""

    name: str = field(metadata={"help": "the subcommand, `rlsim import NAME`"})
    help: str = field(metadata={"help": "the subcommand's one-line help"})
    log_help: str = field(metadata={"help": "what LOG is for this framework"})
    load: Callable[..., tuple[Any, list, list]] = field(metadata={
        "help": "load(path, **flags) -> (RunSpec, steps, evals)"})
    flags: tuple[str, ...] = field(metadata={"help": "the ImportFlags fields it reads"})
    flag_help: dict[str, str] = field(default_factory=dict, metadata={
        "help": "ImportFlags field -> its help in this framework's words (else the shared text)"})


@dataclass
class RunSpec:
    """The run's setup: batch semantics, hardware, model, caps; and where it all came from."""

    framework: str
    file: Path
    fmt: str
    prompts: int
    group: int
    gpus: int | None = None
    device: str | None = None            # a replay.devices profile key
    version: str | None = None
    model_name: str | None = None
    model_params: float | None = None
    model_params_source: str = ""
    model_dims: dict[str, int] | None = None  # layers, hidden, heads, kv_heads, head_dim, intermediate, vocab
    tp: int = 1
    engines: int | None = None           # generation engines (default: GPUs / tp)
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    algo: str = "grpo"
    adv_estimator: str | None = None
    lr: float | None = None
    max_num_seqs_per_engine: int = 1024
    gen_responses: int | None = None     # responses generated per step when more than trained (B_gen)
    prefill_ratio: float | None = None   # prompt tokens computed / submitted (1/G when a group shares its prompt)
    task: str | None = None
    fully_async: bool = False            # generation and training overlapped (verl fully_async)
    execution_mode: str | None = None     # the rlsim mode its config asks for (rlsim.modes.registry's names)
    mode_settings: dict[str, Any] = field(default_factory=dict)  # that mode's settings and devices, rlsim's names
    config_file: str | None = None
    config: dict[str, Any] = field(default_factory=dict)   # the framework config values used
    flags: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # mismatches the import proceeds past (printed as warnings)
    metric_use: dict[str, str] = field(default_factory=dict)  # original metric name -> what rlsim used it for

    @property
    def responses_per_update(self) -> int:
        """B = P x G responses trained per step."""
        return self.prompts * self.group


def fill_from_steps(spec: RunSpec, steps: list[Step]) -> list[str]:
    """Fill what a log's config left out from its steps: the response and prompt caps (the longest
    logged) and the learning rate (the last logged). Returns a note per value filled in."""
    notes = []

    def longest(i: int, which: str) -> float:
        return max((getattr(s, which)[i] for s in steps if math.isfinite(getattr(s, which)[i])), default=math.nan)

    if spec.max_response_len is None and math.isfinite(mx := longest(2, "response")):
        spec.max_response_len = int(mx)
        notes.append(f"no response-length cap in the config: the longest logged response ({int(mx)}) stands in for it")
    if spec.max_prompt_len is None and math.isfinite(mx := longest(2, "prompt")):
        spec.max_prompt_len = int(mx)
    if spec.lr is None:
        lrs = [s.lr for s in steps if math.isfinite(s.lr) and s.lr > 0]
        spec.lr = lrs[-1] if lrs else None
    spec.warnings += phases_exceeding(steps)
    return notes


def phases_exceeding(steps: list[Step]) -> list[str]:
    """A warning when the summed phases exceed the logged step time by over 5 % (overlapping or nested timers),
    naming the worst step; none otherwise."""
    over = []
    for s in steps:
        summed = sum(p.seconds for p in s.phases if p.role not in ("nested", "whole"))
        if math.isfinite(s.total_time) and s.total_time > 0 and summed > 1.05 * s.total_time:
            over.append((summed / s.total_time, s.index + 1, summed, s.total_time))
    if not over:
        return []
    r, step, summed, total = max(over)
    return [f"the phases add up to more than the step time in {len(over)} of {len(steps)} steps (step {step}: "
            f"{summed:.4g} s of phases in a {total:.4g} s step): overlapping or nested timers; the simulator runs the "
            "phases one after the other, so its reference step is their sum"]


def write_step_trace(out: str | Path, spec: RunSpec, steps: list[Step], evals: list[Eval], *,
                     overwrite: bool = False) -> Path:
    """Write the step-level trace of `steps` (sorted by index) and `evals`; returns the path."""
    out = _output_path(out, spec, steps, overwrite)
    model_bytes = 2.0 * spec.model_params if spec.model_params else None  # bf16 weights
    rows: list[dict[str, Any]] = []
    t = 0.0
    cum_tokens = 0.0
    step_start: dict[int, float] = {}
    step_tokens: dict[int, float] = {}
    for s in steps:  # one after another on one clock: a step starts where the last one ended
        step_start[s.index] = t
        step_rows, total, tokens = _step_rows(s, spec, t, model_bytes)
        rows += step_rows
        cum_tokens += tokens
        step_tokens[s.index] = cum_tokens
        t += total
    rows += _eval_rows(evals, spec.responses_per_update, step_start, step_tokens, run_end=t)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_trace(out, _step_meta(spec, steps, evals, model_bytes), rows)


def _output_path(out: str | Path, spec: RunSpec, steps: list[Step], overwrite: bool) -> Path:
    """The trace's path, refused when it exists (without `overwrite`), is not .parquet, or there is nothing to write."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise RlsimError(f"{out} already exists; pass --overwrite to replace it or choose another -o")
    if out.suffix != ".parquet":
        raise RlsimError(f"-o {out}: the trace must be a .parquet file")
    if not steps:
        raise RlsimError(f"{spec.file}: no training steps found; nothing to import")
    return out


def _step_rows(s: Step, spec: RunSpec, t: float,
               model_bytes: float | None) -> tuple[list[dict[str, Any]], float, float]:
    """One step starting at `t`: its phase (and sync) rows, its update row and its stats row; with its seconds
    and its tokens (logged, else B x (mean prompt + mean response))."""
    rows, roles, pos, first_update_t = _phase_rows(s, t, model_bytes)
    total = s.total_time if math.isfinite(s.total_time) else pos - t
    B = spec.responses_per_update
    tokens = s.num_tokens
    if not math.isfinite(tokens):
        tokens = B * ((s.prompt[0] if math.isfinite(s.prompt[0]) else 0.0)
                      + (s.response[0] if math.isfinite(s.response[0]) else 0.0))
    rows.append(_update_row(s, spec, t, roles, total, tokens, first_update_t))
    rows.append(_stats_row(s, t, total))
    return rows, total, tokens


def _phase_rows(s: Step, t: float,
                model_bytes: float | None) -> tuple[list[dict[str, Any]], dict[str, float], float, float]:
    """The step's phases laid end to end from `t` (a nested phase takes no time of its own), a sync row beside each
    sync phase; with the seconds per role, where the last phase ended, and when the first update began (nan)."""
    rows: list[dict[str, Any]] = []
    roles: dict[str, float] = {}
    pos = t
    first_update_t = math.nan
    for ph in s.phases:
        start = pos
        if ph.role != "nested":
            pos += ph.seconds
            roles[ph.role] = roles.get(ph.role, 0.0) + ph.seconds
        if ph.role in ("update", "whole") and not math.isfinite(first_update_t):
            first_update_t = start
        rows.append(dict(kind=PHASE, t_start=start, duration=ph.seconds, step=s.index, policy_version=s.index,
                         phase=ph.name, phase_role=ph.role))
        if ph.role == "sync":
            rows.append(dict(kind=SYNC, t_start=start, duration=ph.seconds, step=s.index, policy_version=s.index + 1,
                             bytes=int(model_bytes or 0)))
    return rows, roles, pos, first_update_t


def _update_row(s: Step, spec: RunSpec, t: float, roles: dict[str, float], total: float, tokens: float,
                first_update_t: float) -> dict[str, Any]:
    """The step's `update` row: its batch, tokens, lr (logged, else the config's), the RL part of its time and the
    seconds per role ('whole': one duration for the lot), and the losses, reward and gradient norms logged."""
    B = spec.responses_per_update
    outside = sum(roles.get(r, 0.0) for r in OUTSIDE_STEP)
    lr = s.lr if math.isfinite(s.lr) and s.lr > 0 else (spec.lr if spec.lr is not None else s.lr)
    if not math.isfinite(lr):
        raise RlsimError(f"{spec.file}: step {s.index + 1} has no learning rate and the config gives none; "
                         "pass the run's config (--config)")
    upd = dict(kind=UPDATE, t_start=first_update_t if math.isfinite(first_update_t) else t, step=s.index,
               policy_version=s.index, num_responses=s.responses or B, num_tokens=int(round(tokens)),
               response_tokens_total=(int(round((s.responses or B) * s.response[0])) if math.isfinite(s.response[0])
                                      else None), lr=float(lr), step_time=max(total - outside, 0.0))
    if "whole" in roles:
        upd.update(duration=roles["whole"])
    else:
        upd.update(duration=roles.get("update", 0.0), gen_time=roles.get("gen", 0.0),
                   reward_time=roles.get("reward", 0.0), prep_time=roles.get("prep", 0.0))
    for col, v in (("loss", s.loss), ("reward", s.score[0]), ("grad_norm", s.grad_norm),
                   ("critic_loss", s.critic_loss), ("critic_grad_norm", s.critic_grad_norm)):
        if math.isfinite(v):
            upd[col] = float(v)
    return upd


def _stats_row(s: Step, t: float, total: float) -> dict[str, Any]:
    """The step's `step_stats` row: its metrics as JSON, and the response, prompt and score summaries logged."""
    st = dict(kind=STEP_STATS, t_start=t, duration=total, step=s.index, policy_version=s.index,
              metrics=json.dumps(s.metrics, sort_keys=True, allow_nan=False))
    for cols, vals in ((("response_len_mean", "response_len_min", "response_len_max", "response_clip_ratio"),
                        s.response),
                       (("prompt_len_mean", "prompt_len_min", "prompt_len_max", "prompt_clip_ratio"), s.prompt),
                       (("score_mean", "score_min", "score_max"), s.score)):
        for col, v in zip(cols, vals):
            st[col] = v if math.isfinite(v) else None
    return st


def _eval_rows(evals: list[Eval], B: int, step_start: dict[int, float], step_tokens: dict[int, float],
               run_end: float) -> list[dict[str, Any]]:
    """One `eval` row per eval, taken after update `e.updates` (its step is e.updates - 1, and it is timed at the
    next step's start) or before training (0)."""
    rows = []
    for e in evals:
        if e.updates > 0 and (e.updates - 1) in step_start:
            when, tok = step_start.get(e.updates, run_end), step_tokens[e.updates - 1]
        else:
            when, tok = 0.0, 0.0
        rows.append(dict(kind=EVAL, t_start=when, duration=e.seconds if math.isfinite(e.seconds) else 0.0,
                         step=e.updates,
                         policy_version=e.updates, cum_responses=e.updates * B, cum_tokens=int(round(tok)),
                         score=float(e.score), eval_k=e.k))
    return rows


def _step_meta(spec: RunSpec, steps: list[Step], evals: list[Eval], model_bytes: float | None) -> dict[str, Any]:
    """The trace's metadata: where it came from, the run's config, engine, hardware and model as the log and its
    config give them (engine limits estimated where they do not), and the phases seen."""
    hardware, engine = _hardware_and_engine(spec)
    B = spec.responses_per_update
    config = {"algo": spec.algo, "prompts": spec.prompts, "group": spec.group, "batch": B,
              "gen_responses": spec.gen_responses or B,
              "lr": spec.lr if spec.lr is not None else float(steps[-1].lr) if math.isfinite(steps[-1].lr) else None,
              "lr_rule": "sqrt", "max_tokens": spec.max_response_len, "max_prompt_tokens": spec.max_prompt_len,
              "task": spec.task, "adv_estimator": spec.adv_estimator, "tp": spec.tp, "gpus": spec.gpus,
              "framework": spec.framework, "framework_config": spec.config, "fully_async": spec.fully_async or None,
              "execution_mode": spec.execution_mode, "mode_settings": spec.mode_settings or None}
    model = {"name": spec.model_name, "parameters": spec.model_params, "bytes": model_bytes,
             "parameters_source": spec.model_params_source or None, **(spec.model_dims or {})}
    phases: dict[str, str] = {}
    for s in steps:
        for ph in s.phases:
            phases.setdefault(ph.name, ph.role)
    return {
        "status": "complete",
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "granularity": "step",
        "source": _source_meta(spec, steps, evals),
        "config": {k: v for k, v in config.items() if v is not None}, "engine": engine,
        "trainer": {"share_prompts": False},
        "hardware": hardware, "model": {k: v for k, v in model.items() if v is not None}, "phases": phases,
        "packages": {"rlsim": _package_version()},
    }


def _hardware_and_engine(spec: RunSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `hardware` metadata (from the device profile named, if any) and the `engine` limits: max_num_seqs per
    engine x engines, and a KV cache assumed never to bind (the log does not say)."""
    prof = get_profile(spec.device) if spec.device else None
    hardware: dict[str, Any] = {"device": (("cpu" if prof.kind == "cpu" else "cuda") if prof else None),
                                "device_name": prof.name if prof else None, "device_count": spec.gpus,
                                "mem_bandwidth_gbs": prof.mem_bandwidth_gbs if prof else None,
                                "profile": prof.key if prof else None, "tp": spec.tp}
    engines = spec.engines or max((spec.gpus or spec.tp) // max(spec.tp, 1), 1)
    max_seqs = spec.max_num_seqs_per_engine * engines
    max_len = (spec.max_prompt_len or 0) + (spec.max_response_len or 0) or 4096
    engine = {"name": "imported", "max_num_seqs": max_seqs, "kv_cache_tokens": max_seqs * max_len, "block_size": 16,
              "max_model_len": max_len, "engines": engines, "tensor_parallel": spec.tp,
              "prefill_ratio": spec.prefill_ratio if spec.prefill_ratio is not None else 1.0,
              "estimated": ["max_num_seqs (per engine x engines)", "kv_cache_tokens (max_num_seqs x max_model_len: "
                            "assumed never to bind; the log does not say)"]}
    return hardware, engine


def _source_meta(spec: RunSpec, steps: list[Step], evals: list[Eval]) -> dict[str, Any]:
    """The `source` metadata: framework, file and flags, and which logged metric names were used and which not."""
    known = set(spec.metric_use)
    seen: set[str] = set()
    for s in steps:
        seen |= set(s.metrics)
    for e in evals:
        seen |= {n.strip() for n in e.metric.split(", ")}
    return {"framework": spec.framework, "version": spec.version, "file": spec.file.name, "format": spec.fmt,
            "config_file": spec.config_file, "flags": {k: v for k, v in spec.flags.items() if v is not None},
            "metric_names": {k: spec.metric_use[k] for k in sorted(known & seen)},
            "unknown_metrics": sorted(seen - known), "notes": spec.notes, "warnings": spec.warnings,
            "steps": len(steps), "first_step": steps[0].index + 1, "last_step": steps[-1].index + 1}


def _package_version() -> str | None:
    try:
        return metadata.version("rlsim")
    except Exception:  # not installed
        return None


def phase_list(items: Iterable[tuple[str, float]], roles: dict[str, str], default: str = "other") -> list[Phase]:
    return [Phase(n, roles.get(n, default), float(v)) for n, v in items]
