"""TRL GRPOTrainer: `trainer_state.json` (its `log_history`), or the console's printed log dicts.

Each training entry of `log_history` holds the metrics of one logging window (`logging_steps`
optimizer steps, averaged), under the names TRL's GRPOTrainer logs (docs "Logging" and grpo_trainer.py):
`step` (the optimizer step at the end of the window), `loss`, `grad_norm`, `learning_rate`, `num_tokens`
(cumulative prompt + completion tokens seen), `completions/mean_length|min_length|max_length|clipped_ratio`
(older versions: `completion_length`), `reward`, `reward_std`, `rewards/<func>/mean`, `kl`, `entropy`,
`clip_ratio/*`, `epoch` and, in recent versions, `step_time` (seconds per optimizer step, generation
included). Evaluation entries hold `eval_*` keys; the last entry `train_runtime` etc.

TRL times whole steps only (no phases): the trace's phase is `step` with role `whole`.
Batch semantics: completions per optimizer step B = per_device_train_batch_size x processes x
gradient_accumulation_steps; G = num_generations; P = B / G.
"""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers.common import (Eval, ImportFlags, Importer, Phase, RunSpec, Step, config_subset,
                                           fill_from_steps, load_config, model_params_of, numeric, pick, positive_int)

USE = {
    "step": "step index (0-based in the trace: step - 1)",
    "step_time": "step time (whole optimizer step, generation included)",
    "num_tokens": "update num_tokens (difference of the cumulative count per step)",
    "completions/mean_length": "step_stats response_len_mean",
    "completion_length": "step_stats response_len_mean (older TRL)",
    "completions/min_length": "step_stats response_len_min", "completions/max_length": "step_stats response_len_max",
    "completions/clipped_ratio": "step_stats response_clip_ratio", "reward": "update reward, step_stats score_mean",
    "learning_rate": "update lr", "loss": "update loss", "grad_norm": "update grad_norm",
    "train_runtime": "mean step time when step_time is not logged",
}
_EVAL_SKIP = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def _entries(path: Path) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    text = path.read_text(errors="replace")
    if path.suffix.lower() == ".json":
        try:
            state = json.loads(text)
        except json.JSONDecodeError as e:
            raise RlsimError(f"{path} is not complete JSON ({e.msg} at line {e.lineno}; truncated?); pass the "
                             "trainer_state.json of a TRL checkpoint") from None
        if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
            raise RlsimError(f"{path} has no `log_history`: it is not a TRL/transformers trainer_state.json")
        return [e for e in state["log_history"] if isinstance(e, dict)], "trainer_state", state
    entries = []  # the console: one printed dict per logging step, e.g. {'loss': 0.0632, 'grad_norm': ...}
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        j = s.find("{'")
        if j < 0:
            continue
        try:
            d = ast.literal_eval(s[j:])
        except (ValueError, SyntaxError):
            raise RlsimError(f"{path} line {i}: a truncated log dict ({s[j:j + 60]!r}...); cut the line or pass "
                             "trainer_state.json") from None
        if isinstance(d, dict):
            entries.append(d)
    return entries, "console", {}


CONFIG_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
               "max_prompt_length", "learning_rate", "use_vllm", "vllm_mode", "steps_per_generation",
               "generation_batch_size", "logging_steps")


def load(path: str | Path, *, config: str | Path | None = None, prompts: int | None = None, group: int | None = None,
         gpus: int | None = None, device: str | None = None, model_params: str | float | None = None,
         eval_metric: str | None = None, tp: int | None = None) -> tuple[RunSpec, list[Step], list[Eval]]:
    """Parse a TRL GRPOTrainer log (trainer_state.json, a JSONL of its entries, or the console dicts) and its
    GRPOConfig into (spec, steps, evals)."""
    path = Path(path)
    if not path.is_file():
        raise RlsimError(f"log not found: {path}")
    entries, fmt, state = _entries(path)
    cfg = load_config(config)
    train = [e for e in entries if not any(str(k).startswith("eval_") for k in e) and "train_runtime" not in e
             and any(k in e for k in ("loss", "reward", "step_time", "grad_norm"))]
    if not train:
        raise RlsimError(f"{path}: no training log entries (loss, reward, step_time per logging step); is this a TRL "
                         "GRPOTrainer log?")
    spec = _spec(path, fmt, cfg, Path(config).name if config else None, state, prompts=prompts, group=group,
                 gpus=gpus, device=device, model_params=model_params)
    spec.flags = {"prompts": prompts, "group": group, "gpus": gpus, "device": device, "model_params": model_params,
                  "eval_metric": eval_metric}
    steps = _steps(path, fmt, entries, train, state, cfg, spec)
    evals = _evals(entries, spec, eval_metric)
    fill_from_steps(spec, steps)
    steps.sort(key=lambda s: s.index)
    return spec, steps, evals


def _spec(path: Path, fmt: str, cfg: dict[str, Any], cfile: str | None, state: dict[str, Any], *, prompts, group,
          gpus, device, model_params) -> RunSpec:
    """The batch from GRPOConfig's per-device batch x processes x accumulation / num_generations (or the flags)."""
    G = positive_int(pick(group, cfg.get("num_generations"), "--group", "num_generations", cfile), "--group")
    if G is None:
        raise RlsimError(f"{path}: the log does not state the group size; pass the GRPOConfig (--config) or --group G "
                         "(num_generations)")
    per_dev = cfg.get("per_device_train_batch_size") or state.get("train_batch_size")
    ga = cfg.get("gradient_accumulation_steps") or 1
    n_gpus = positive_int(gpus if gpus is not None else cfg.get("num_processes"), "--gpus")
    derived = None
    if per_dev and n_gpus:
        b = int(per_dev) * n_gpus * int(ga)
        if b % G:
            raise RlsimError(f"per_device_train_batch_size {per_dev} x {n_gpus} processes x "
                             f"gradient_accumulation_steps {ga} = {b} completions is not a multiple of "
                             f"num_generations {G}")
        derived = b // G
    P = positive_int(pick(prompts, derived, "--prompts", "per_device_train_batch_size x GPUs x "
                          "gradient_accumulation_steps / num_generations", cfile or "trainer_state.json"), "--prompts")
    if P is None:
        raise RlsimError(f"{path}: cannot work out prompts per step; pass --gpus (training processes) with the "
                         "GRPOConfig (--config), or --prompts P")
    model_name = cfg.get("model_name_or_path") or cfg.get("model")
    n_params, psrc = model_params_of(model_params, model_name)
    spec = RunSpec(framework="trl", file=path, fmt=fmt, prompts=P, group=G, gpus=n_gpus, tp=1, model_name=model_name,
                   model_params=n_params, model_params_source=psrc,
                   max_prompt_len=positive_int(cfg.get("max_prompt_length"), "max_prompt_length"),
                   max_response_len=positive_int(cfg.get("max_completion_length"), "max_completion_length"),
                   algo="grpo" if G > 1 else "ppo", adv_estimator=cfg.get("loss_type"),
                   lr=float(cfg["learning_rate"]) if cfg.get("learning_rate") is not None else None,
                   max_num_seqs_per_engine=max(P * G, 256), prefill_ratio=1.0, config_file=cfile, notes=[],
                   metric_use=dict(USE))
    if device:
        spec.device = get_profile(device).key
    spec.config = config_subset(cfg, CONFIG_KEYS)
    return spec


def _mean_step(path: Path, entries: list[dict[str, Any]], train: list[dict[str, Any]], state: dict[str, Any],
               spec: RunSpec) -> float | None:
    """An older TRL logs no step_time: every step then takes the run's mean, train_runtime / global_step."""
    if any("step_time" in e for e in train):
        return None
    final = next((e for e in entries if "train_runtime" in e), None)
    gs = state.get("global_step") or (final or {}).get("step")
    if not (final and gs):
        raise RlsimError(f"{path}: no step times (step_time, or train_runtime at the end); recent TRL versions log "
                         "step_time per step: import a log that has it")
    mean_step = float(final["train_runtime"]) / float(gs)
    spec.notes.append(f"no step_time logged (older TRL): every step takes the run's mean, train_runtime / global_step "
                      f"= {mean_step:.4g} s (startup included)")
    return mean_step


def _steps(path: Path, fmt: str, entries: list[dict[str, Any]], train: list[dict[str, Any]], state: dict[str, Any],
           cfg: dict[str, Any], spec: RunSpec) -> list[Step]:
    mean_step = _mean_step(path, entries, train, state, spec)
    B = spec.prompts * spec.group
    steps: list[Step] = []
    prev_tok, prev_step = 0.0, 0
    for i, e in enumerate(train):
        m = numeric(e)
        s = int(m.get("step", (i + 1) * int(cfg.get("logging_steps") or 1)))
        if fmt == "console" and "step" not in m and i == 0:
            spec.notes.append("console dicts carry no step: step = entry number x logging_steps")
        t = m.get("step_time", mean_step if mean_step is not None else math.nan)
        tokens = math.nan
        if "num_tokens" in m:  # cumulative: this entry's share per step since the last entry
            tokens = (m["num_tokens"] - prev_tok) / max(s - prev_step, 1)
            prev_tok = m["num_tokens"]
        prev_step = s
        steps.append(_step(m, s, t, tokens, B))
    if any(not math.isfinite(s.total_time) for s in steps):
        raise RlsimError(f"{path}: some training entries have no step_time (a truncated log?); import a complete "
                         "trainer_state.json")
    return steps


def _step(m: dict[str, float], s: int, t: float, tokens: float, B: int) -> Step:
    rmean = m.get("completions/mean_length", m.get("completion_length", math.nan))
    pmean = (tokens / B - rmean) if math.isfinite(tokens) and math.isfinite(rmean) else math.nan
    return Step(index=s - 1, metrics=m, phases=[Phase("step", "whole", t)] if math.isfinite(t) else [], total_time=t,
                num_tokens=tokens, responses=B,
                response=(rmean, m.get("completions/min_length", math.nan), m.get("completions/max_length", math.nan),
                          m.get("completions/clipped_ratio", math.nan)),
                prompt=(pmean if math.isfinite(pmean) and pmean > 0 else math.nan, math.nan, math.nan, math.nan),
                score=(m.get("reward", math.nan), math.nan, math.nan), lr=m.get("learning_rate", math.nan),
                loss=m.get("loss", math.nan), grad_norm=m.get("grad_norm", math.nan))


def _evals(entries: list[dict[str, Any]], spec: RunSpec, eval_metric: str | None) -> list[Eval]:
    evals = []
    for e in entries:
        m = numeric(e)
        keys = [k for k in m if k.startswith("eval_") and k not in _EVAL_SKIP]
        if not keys:
            continue
        key = eval_metric if eval_metric else ("eval_reward" if "eval_reward" in keys else sorted(keys)[0])
        if key in m:
            spec.metric_use[key] = "eval score"
            evals.append(Eval(updates=int(m.get("step", 0)), score=m[key], k=None, metric=key,
                              seconds=m.get("eval_runtime", math.nan)))
    return evals


IMPORTER = Importer(
    name="trl", help="Import a TRL GRPOTrainer run.", load=load,
    log_help="trainer_state.json of a GRPOTrainer checkpoint (its log_history)",
    flags=("config", "prompts", "group", "gpus", "device", "model_params", "model_config", "eval_metric"),
    flag_help={"config": ImportFlags.__dataclass_fields__["config"].metadata["help"]
               + " (the GRPOConfig recipe YAML/JSON)",
               "prompts": "P: prompts per optimizer step", "group": "G: num_generations",
               "gpus": "training processes (GPUs)"})
