"""OpenRLHF (Ray PPO trainer): a W&B history export (CSV or JSONL) of its logged metrics.

OpenRLHF logs per rollout step, in `save_logs_and_checkpoints` of its PPO trainer, `train/<key>` for
each key of the training status (`policy_loss`, `actor_lr`, `kl`, `reward`, `return`,
`response_length` (mean), `total_length` (mean prompt + response), `critic_loss`, `values`,
`critic_lr`, ...) plus `train/global_step`, and with `--perf` `perf/experience_maker/<key>` for the
experience maker's `perf_stats` (`generate_time`, `actor_value_rm_time`, `wait_time`); evaluations
go under `eval/*`. W&B adds `_step`, `_runtime` (seconds since the run started) and `_timestamp` to
every row: the step's wall time is the `_runtime` (else `_timestamp`) difference to the previous row.

Phases: generate (gen), actor_value_rm and wait (prep: reference, critic and reward-model forwards,
then waiting for them) when `--perf` was on; the rest of the step, which OpenRLHF does not time
separately, is the PPO training (update; the trace names it `train_rest`).
Batch semantics: `--rollout_batch_size` prompts per rollout x `--n_samples_per_prompt`; GPUs
`--actor_num_nodes` x `--actor_num_gpus_per_node`; generation on `--vllm_num_engines` engines of
`--vllm_tensor_parallel_size` GPUs.
"""
from __future__ import annotations

import math
from pathlib import Path

from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers.common import (Eval, ImportFlags, Importer, Phase, RunSpec, Step, config_subset,
                                           fill_from_steps, load_config, model_params_of, numeric, pick, positive_int,
                                           read_csv, read_jsonl)

PERF = {"perf/experience_maker/generate_time": ("generate", "gen"),
        "perf/experience_maker/actor_value_rm_time": ("actor_value_rm", "prep"),
        "perf/experience_maker/wait_time": ("wait", "prep")}
USE = {"train/global_step": "step index (0-based in the trace: global_step - 1)",
       "_runtime": "step time (difference to the previous row)", "_timestamp": "step time when _runtime is absent",
       "train/response_length": "step_stats response_len_mean",
       "train/total_length": "prompt length = total_length - response_length; tokens = B x total_length",
       "train/reward": "update reward, step_stats score_mean", "train/actor_lr": "update lr",
       "train/policy_loss": "update loss", "train/critic_loss": "update critic_loss",
       **{k: f"phase {v[0]} ({v[1]})" for k, v in PERF.items()}}


def _get(m: dict[str, float], *names: str) -> float:
    for n in names:
        if n in m:
            return m[n]
    return math.nan


CONFIG_KEYS = ("rollout_batch_size", "n_samples_per_prompt", "train_batch_size", "micro_rollout_batch_size",
               "actor_num_nodes", "actor_num_gpus_per_node", "vllm_num_engines", "vllm_tensor_parallel_size",
               "pretrain", "prompt_max_len", "generate_max_len", "advantage_estimator", "actor_learning_rate",
               "colocate_all_models", "max_epochs")


def load(path: str | Path, *, config: str | Path | None = None, prompts: int | None = None, group: int | None = None,
         gpus: int | None = None, device: str | None = None, model_params: str | float | None = None,
         tp: int | None = None, eval_metric: str | None = None) -> tuple[RunSpec, list[Step], list[Eval]]:
    """Parse an OpenRLHF W&B history export (.csv or .jsonl) and its config into (spec, steps, evals)."""
    path = Path(path)
    fmt, rows = _read(path)
    train = [r for r in rows if "train/global_step" in r or "global_step" in r]
    if not train:
        raise RlsimError(f"{path}: no OpenRLHF training steps (rows with train/global_step); export the run's W&B "
                         "history")
    spec = _spec(path, fmt, config, prompts=prompts, group=group, gpus=gpus, device=device,
                 model_params=model_params, tp=tp)
    spec.flags = {"prompts": prompts, "group": group, "gpus": gpus, "device": device, "model_params": model_params,
                  "tp": tp, "eval_metric": eval_metric}
    steps = _steps(path, train, spec)
    evals = _evals(rows, spec, eval_metric)
    fill_from_steps(spec, steps)
    return spec, steps, evals


def _read(path: Path) -> tuple[str, list[dict[str, float]]]:
    if not path.is_file():
        raise RlsimError(f"log not found: {path}")
    if path.suffix.lower() == ".jsonl":
        fmt, rows = "wandb-jsonl", read_jsonl(path)
    elif path.suffix.lower() == ".csv":
        fmt, rows = "wandb-csv", read_csv(path)
    else:
        raise RlsimError(f"{path}: pass OpenRLHF's W&B history export as .csv or .jsonl (train/* metrics per step)")
    return fmt, [numeric(r) for r in rows]


def _spec(path: Path, fmt: str, config: str | Path | None, *, prompts, group, gpus, device, model_params,
          tp) -> RunSpec:
    """The run's batch, devices and model from the flags and the saved config (a flag that disagrees with the config
    is an error)."""
    cfg = load_config(config)
    cfile = Path(config).name if config else None
    P = positive_int(pick(prompts, cfg.get("rollout_batch_size"), "--prompts", "rollout_batch_size", cfile),
                     "--prompts")
    G = positive_int(pick(group, cfg.get("n_samples_per_prompt"), "--group", "n_samples_per_prompt", cfile), "--group")
    if P is None or G is None:
        raise RlsimError(f"{path}: the export does not state the batch; pass the run's config (--config, with "
                         "rollout_batch_size and n_samples_per_prompt) or --prompts P --group G")
    cfg_gpus = None
    if cfg.get("actor_num_gpus_per_node") is not None:
        cfg_gpus = int(cfg["actor_num_gpus_per_node"]) * int(cfg.get("actor_num_nodes") or 1)
    n_gpus = positive_int(pick(gpus, cfg_gpus, "--gpus", "actor_num_nodes x actor_num_gpus_per_node", cfile), "--gpus")
    tp_v = positive_int(pick(tp, cfg.get("vllm_tensor_parallel_size"), "--tp", "vllm_tensor_parallel_size", cfile),
                        "--tp") or 1
    model_name = cfg.get("pretrain")
    n_params, psrc = model_params_of(model_params, model_name)
    adv = cfg.get("advantage_estimator")
    spec = RunSpec(framework="openrlhf", file=path, fmt=fmt, prompts=P, group=G, gpus=n_gpus, tp=tp_v,
                   engines=positive_int(cfg.get("vllm_num_engines"), "vllm_num_engines"), model_name=model_name,
                   model_params=n_params, model_params_source=psrc,
                   max_prompt_len=positive_int(cfg.get("prompt_max_len"), "prompt_max_len"),
                   max_response_len=positive_int(cfg.get("generate_max_len"), "generate_max_len"),
                   algo="ppo" if adv == "gae" or G == 1 else "grpo", adv_estimator=adv,
                   lr=float(cfg["actor_learning_rate"]) if cfg.get("actor_learning_rate") is not None else None,
                   prefill_ratio=1.0, config_file=cfile, notes=[], metric_use=dict(USE))
    if device:
        spec.device = get_profile(device).key
    spec.config = config_subset(cfg, CONFIG_KEYS)
    return spec


def _steps(path: Path, train: list[dict[str, float]], spec: RunSpec) -> list[Step]:
    """One Step per W&B row with a positive wall time since the previous one (the clock: _runtime or _timestamp)."""
    B = spec.prompts * spec.group
    train.sort(key=lambda r: _get(r, "train/global_step", "global_step"))
    clock = ("_runtime" if all("_runtime" in r for r in train)
             else "_timestamp" if all("_timestamp" in r for r in train) else None)
    if clock is None:
        raise RlsimError(f"{path}: no per-step wall time (W&B's _runtime or _timestamp on every row); export the "
                         "history with its system columns")
    steps: list[Step] = []
    prev = None
    for r in train:
        g = int(_get(r, "train/global_step", "global_step"))
        now = r[clock]
        if prev is None:
            total = now if clock == "_runtime" else math.nan
            if clock == "_runtime":
                spec.notes.append(f"step {g}'s time is _runtime since the run started (startup included); the fit "
                                  "skips it as warm-up")
        else:
            total = now - prev
        prev = now
        if math.isfinite(total) and total > 0:
            steps.append(_step(r, g, total, B))
    if not steps:
        raise RlsimError(f"{path}: no step with a positive wall time; the export's _runtime/_timestamp columns look "
                         "corrupt")
    if not any(p.role == "gen" for s in steps for p in s.phases):
        spec.notes.append("no perf/experience_maker/* times (OpenRLHF --perf off): steps are not split into phases")
    return steps


def _step(r: dict[str, float], g: int, total: float, B: int) -> Step:
    phases = [Phase(name, role, r[k]) for k, (name, role) in PERF.items() if k in r]
    if phases:
        phases.append(Phase("train_rest", "update", max(total - sum(p.seconds for p in phases), 0.0)))
    else:
        phases = [Phase("step", "whole", total)]
    resp = _get(r, "train/response_length", "rollout/response_length")
    tot = _get(r, "train/total_length", "rollout/total_length")
    prompt = (tot - resp) if math.isfinite(tot) and math.isfinite(resp) else math.nan
    return Step(index=g - 1, metrics=r, phases=phases, total_time=total,
                num_tokens=B * tot if math.isfinite(tot) else math.nan, responses=B,
                response=(resp, math.nan, math.nan, math.nan), prompt=(prompt, math.nan, math.nan, math.nan),
                score=(_get(r, "train/reward", "rollout/reward"), math.nan, math.nan), lr=_get(r, "train/actor_lr"),
                loss=_get(r, "train/policy_loss"), critic_loss=_get(r, "train/critic_loss"))


def _evals(rows: list[dict[str, float]], spec: RunSpec, eval_metric: str | None) -> list[Eval]:
    evals = []
    last = 0
    skip = ("eval/global_step", "eval/epoch", "eval/train_step", "eval/episode")
    for r in rows:
        step = _get(r, "train/global_step", "global_step")
        last = int(step) if math.isfinite(step) else last
        keys = [k for k in r if k.startswith("eval/") and k not in skip]
        if not keys:
            continue
        key = eval_metric if eval_metric else sorted(keys)[0]
        if key in r:
            spec.metric_use[key] = "eval score"
            upd = _get(r, "eval/train_step", "eval/global_step")
            evals.append(Eval(updates=int(upd) if math.isfinite(upd) else last, score=r[key], k=None, metric=key))
    return evals


IMPORTER = Importer(
    name="openrlhf", help="Import an OpenRLHF PPO/GRPO/REINFORCE++ run (Ray trainer).", load=load,
    log_help="W&B history export (.csv or .jsonl) with train/* and perf/experience_maker/* metrics",
    flags=("config", "prompts", "group", "gpus", "device", "model_params", "model_config", "tp", "eval_metric"),
    flag_help={"config": ImportFlags.__dataclass_fields__["config"].metadata["help"]
               + " (the W&B run config or the launch args as JSON/YAML)",
               "prompts": "P: --rollout_batch_size (prompts per rollout)", "group": "G: --n_samples_per_prompt",
               "gpus": "GPUs: actor_num_nodes x actor_num_gpus_per_node", "tp": "--vllm_tensor_parallel_size"})
