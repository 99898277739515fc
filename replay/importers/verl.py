"""verl: console logs, JSONL and W&B CSV exports of the PPO/GRPO trainer's metrics, plus its saved
Hydra config.

The console logger (verl.utils.logger.aggregate_logger.LocalLogger) prints one line per step,
`step:N - key:value - key:value ...`; under Ray the line carries the actor's tag, e.g.
`(TaskRunner pid=222265) step:34 - ...` (verl issue #7412) or `(main_task pid=51520) step:5 - ...`
(verl issue #316); recent versions print numpy scalars as `np.float64(0.129)`. Metric names follow
verl/trainer/ppo/metric_utils.py: `timing_s/<phase>` (seconds; `step` the whole step), the phases
nested in `marked_timer` blocks of ray_trainer.fit (gen, reward, old_log_prob, ref, values, adv,
update_critic, update_actor, testing, save_checkpoint; update_weights in recent versions),
`timing_per_token_ms/*`, `perf/total_num_tokens` (prompt + response tokens of the batch),
`perf/time_per_step`, `perf/throughput` (tokens / (step time x n_gpus)), `response_length/*`,
`prompt_length/*`, `critic/score/*`, `actor/*`, `training/global_step`, `val-core/<source>/<var>/mean@k`
(older: `val/test_score/<source>`), and for fully-async runs `trainer/idle_ratio`, `rollouter/idle_ratio`.

Batch semantics: `data.train_batch_size` prompts per step x `actor_rollout_ref.rollout.n` responses per
prompt; GPUs `trainer.n_gpus_per_node` x `trainer.nnodes`.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers.common import (Eval, ImportFlags, Importer, Phase, RunSpec, Step, config_subset, dig,
                                           fill_from_steps, load_config, model_params_of, numeric, parse_number, pick,
                                           positive_int, read_csv, read_jsonl)

ROLES = {"gen": "gen", "gen_max": "gen", "reward": "reward", "adv": "reward", "old_log_prob": "prep", "ref": "prep",
         "values": "prep", "update_critic": "update", "update_actor": "update", "update_weights": "sync",
         "testing": "eval", "save_checkpoint": "checkpoint", "generate_sequences": "nested", "reshard": "nested",
         "start_profile": "other", "stop_profile": "other"}
ORDER = ("gen", "generate_sequences", "reshard", "gen_max", "reward", "old_log_prob", "ref", "values", "adv",
         "update_critic", "update_actor", "update_weights", "testing", "save_checkpoint")
ASYNC_KEYS = ("trainer/idle_ratio", "rollouter/idle_ratio")

# what rlsim uses each known metric for (metadata source.metric_names); the rest is kept unmapped
USE = {
    "timing_s/step": "step time (wall seconds of the RL step, evals and checkpoints included)",
    "perf/time_per_step": "step time when timing_s/step is absent",
    "perf/total_num_tokens": "update num_tokens (prompt + response tokens)",
    "perf/throughput": "checked against tokens / (step time x GPUs)",
    "response_length/mean": "step_stats response_len_mean", "response_length/min": "step_stats response_len_min",
    "response_length/max": "step_stats response_len_max",
    "response_length/clip_ratio": "step_stats response_clip_ratio",
    "prompt_length/mean": "step_stats prompt_len_mean", "prompt_length/min": "step_stats prompt_len_min",
    "prompt_length/max": "step_stats prompt_len_max", "prompt_length/clip_ratio": "step_stats prompt_clip_ratio",
    "critic/score/mean": "update reward, step_stats score_mean", "critic/score/min": "step_stats score_min",
    "critic/score/max": "step_stats score_max", "actor/lr": "update lr", "actor/pg_loss": "update loss",
    "actor/grad_norm": "update grad_norm", "critic/vf_loss": "update critic_loss",
    "critic/grad_norm": "update critic_grad_norm",
    "training/global_step": "step index (0-based in the trace: global_step - 1)",
    "trainer/idle_ratio": "fully-async run detected (a warning at fit time)",
    "rollouter/idle_ratio": "fully-async run detected",
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STEP = re.compile(r"(?:^|[\s)\]|])step:(\d+)\s+-\s+(.*)$")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


def parse_console(path: Path, *, drop_truncated: bool = False) -> tuple[dict[int, dict[str, float]], list[str]]:
    """{global step: metrics} from a console log, and notes. A step line cut short (a field without a
    value, a value that is not a number, or no `timing_s/step` while other lines have one) is an error
    naming the line, unless `drop_truncated`."""
    notes: list[str] = []
    steps: dict[int, dict[str, float]] = {}
    where: dict[int, int] = {}

    def bad(lineno: int, step: int, what: str) -> None:
        if not drop_truncated:
            raise RlsimError(f"{path} line {lineno}: the line of step {step} is truncated ({what}); re-copy the log "
                             "or pass --drop-truncated to skip such lines")
        notes.append(f"line {lineno} (step {step}) skipped: truncated ({what})")

    for lineno, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = _ANSI.sub("", raw).rstrip()
        m = _STEP.search(line)
        if not m:
            continue
        step = int(m.group(1))
        body = _REPEATED.sub("", m.group(2))
        metrics: dict[str, float] = {}
        broken = None
        for f in body.split(" - "):
            key, sep, val = f.partition(":")
            key = key.strip()
            x = parse_number(val) if sep else None
            if not key or x is None:
                broken = f"field {f.strip()[:40]!r}"
                break
            metrics[key] = x
        if broken:
            bad(lineno, step, broken)
            continue
        if step in steps:
            notes.append(f"step {step} appears on lines {where[step]} and {lineno} (a resumed run?): the later kept")
        steps[step] = metrics
        where[step] = lineno
    with_step = [s for s, m in steps.items() if "timing_s/step" in m]
    if with_step:
        for s in sorted(steps):
            m = steps[s]
            if "timing_s/step" not in m and not _eval_only(m):
                bad(where[s], s, "no timing_s/step, which the other step lines have")
                steps.pop(s)
    return steps, notes


def _eval_only(m: dict[str, float]) -> bool:
    return all(k.startswith("val") for k in m)


def parse_table(path: Path, rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """{global step: metrics} from JSONL/CSV rows (step from `training/global_step`, `step` or `_step`)."""
    steps: dict[int, dict[str, float]] = {}
    for r in rows:
        m = numeric(r)
        s = next((m[k] for k in ("training/global_step", "step", "_step") if k in m), None)
        if s is None:
            raise RlsimError(f"{path}: a row has no step (training/global_step, step or _step); export the run's "
                             "history with its step column")
        steps.setdefault(int(s), {}).update({k: v for k, v in m.items() if k not in ("step",)})
    return steps


def _phases(m: dict[str, float]) -> list[Phase]:
    names = [k.split("/", 1)[1] for k in m if k.startswith("timing_s/") and k.count("/") == 1 and k != "timing_s/step"]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER)))
    roles = dict(ROLES)
    if "gen" not in names and "generate_sequences" in names:
        roles["generate_sequences"] = "gen"  # only the worker-side timer was logged
    return [Phase(n, roles.get(n, "other"), m[f"timing_s/{n}"]) for n in names]


_VAL_CORE = re.compile(r"^val-core/(?P<src>.+)/(?P<var>[^/]+)/mean@(?P<k>\d+)$")
_VAL_OLD = re.compile(r"^val/test_score/(?P<src>.+)$")


def _evals(m: dict[str, float], eval_metric: str | None) -> tuple[float, int | None, str] | None:
    """(score, k, metric names) of a step's validation, or None."""
    if eval_metric:
        if eval_metric in m:
            k = re.search(r"@(\d+)$", eval_metric)
            return m[eval_metric], int(k.group(1)) if k else None, eval_metric
        return None
    core = [(mm, v) for key, v in m.items() if (mm := _VAL_CORE.match(key))]
    if core:
        for var in ("acc", "score", "reward"):
            sel = [(mm, v) for mm, v in core if mm.group("var") == var]
            if sel:
                ks = sorted({int(mm.group("k")) for mm, _ in sel})
                sel = [(mm, v) for mm, v in sel if int(mm.group("k")) == ks[0]]
                score = sum(v for _, v in sel) / len(sel)
                return score, ks[0], ", ".join(mm.group(0) for mm, _ in sel)
        mm, v = core[0]
        return v, int(mm.group("k")), mm.group(0)
    old = [(mm, v) for key, v in m.items() if (mm := _VAL_OLD.match(key))]
    if old:
        return sum(v for _, v in old) / len(old), 1, ", ".join(mm.group(0) for mm, _ in old)
    return None


def _stat(m: dict[str, float], prefix: str, names=("mean", "min", "max", "clip_ratio")) -> tuple[float, ...]:
    return tuple(m.get(f"{prefix}/{n}", math.nan) for n in names)


CONFIG_KEYS = ("data.train_batch_size", "actor_rollout_ref.rollout.n", "trainer.n_gpus_per_node", "trainer.nnodes",
               "actor_rollout_ref.model.path", "data.max_prompt_length", "data.max_response_length",
               "algorithm.adv_estimator", "actor_rollout_ref.actor.optim.lr",
               "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.name",
               "actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.actor.ppo_mini_batch_size",
               "trainer.test_freq", "data.gen_batch_size") + (
    # what the memory model reads (rlsim.replay.memory.setups_from_verl): engine arguments, FSDP offload, micro-batch
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
    "actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.actor.use_kl_loss",
    "algorithm.use_kl_in_reward", "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.hybrid_engine",
    # verl 0.1's global micro-batches (divided over the devices) and the log-prob passes' micro-batches
    "actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.model.use_remove_padding") + tuple(
    f"actor_rollout_ref.{role}.{key}" for role in ("rollout", "ref")
    for key in ("log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz",
                "log_prob_max_token_len_per_gpu"))


def load(path: str | Path, *, config: str | Path | None = None, prompts: int | None = None, group: int | None = None,
         gpus: int | None = None, device: str | None = None, model_params: str | float | None = None,
         tp: int | None = None, eval_metric: str | None = None,
         drop_truncated: bool = False) -> tuple[RunSpec, list[Step], list[Eval]]:
    """Parse a verl log (console, .jsonl or .csv) and its config into (spec, steps, evals)."""
    path = Path(path)
    fmt, raw, notes = _read(path, drop_truncated)
    train = {s: m for s, m in raw.items() if not _eval_only(m)}
    if not train:
        raise RlsimError(f"{path}: no verl training steps found (lines `step:N - key:value - ...` with timing_s/* "
                         "metrics); pass the trainer's console log (trainer.logger includes 'console') or its JSONL / "
                         "W&B CSV export")
    spec = _spec(path, fmt, config, notes, prompts=prompts, group=group, gpus=gpus, device=device,
                 model_params=model_params, tp=tp)
    spec.flags = {"prompts": prompts, "group": group, "gpus": gpus, "device": device, "model_params": model_params,
                  "tp": tp, "eval_metric": eval_metric, "drop_truncated": drop_truncated or None}
    steps, evals = _steps(path, raw, train, spec, eval_metric)
    spec.notes += fill_from_steps(spec, steps)
    return spec, steps, evals


def _read(path: Path, drop_truncated: bool) -> tuple[str, dict[int, dict[str, float]], list[str]]:
    """(format, metrics per logged step, notes) of a console log, a .jsonl or a W&B .csv export."""
    if not path.is_file():
        raise RlsimError(f"log not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl", parse_table(path, read_jsonl(path)), []
    if suffix == ".csv":
        return "wandb-csv", parse_table(path, read_csv(path)), []
    raw, notes = parse_console(path, drop_truncated=drop_truncated)
    return "console", raw, notes


def _spec(path: Path, fmt: str, config: str | Path | None, notes: list[str], *, prompts, group, gpus, device,
          model_params, tp) -> RunSpec:
    """The run's batch, devices and model from the flags and the saved Hydra config (a flag that disagrees with
    the config is an error)."""
    cfg = load_config(config)
    cfile = Path(config).name if config else None

    def setting(flag, key: str, name: str, what: str | None = None):
        return positive_int(pick(flag, dig(cfg, key), name, what or key, cfile), name)

    P = setting(prompts, "data.train_batch_size", "--prompts")
    G = setting(group, "actor_rollout_ref.rollout.n", "--group")
    cfg_gpus = None
    if dig(cfg, "trainer.n_gpus_per_node") is not None:
        cfg_gpus = int(dig(cfg, "trainer.n_gpus_per_node")) * int(dig(cfg, "trainer.nnodes") or 1)
    n_gpus = positive_int(pick(gpus, cfg_gpus, "--gpus", "trainer.n_gpus_per_node x trainer.nnodes", cfile), "--gpus")
    if P is None or G is None:
        raise RlsimError(f"{path}: the log does not state the batch; pass the run's saved Hydra config (--config "
                         ".hydra/config.yaml) or --prompts P --group G (verl data.train_batch_size, "
                         "actor_rollout_ref.rollout.n)")
    model_name = dig(cfg, "actor_rollout_ref.model.path")
    n_params, psrc = model_params_of(model_params, model_name)
    adv, lr = dig(cfg, "algorithm.adv_estimator"), dig(cfg, "actor_rollout_ref.actor.optim.lr")
    spec = RunSpec(framework="verl", file=path, fmt=fmt, prompts=P, group=G, gpus=n_gpus, device=None,
                   tp=setting(tp, "actor_rollout_ref.rollout.tensor_model_parallel_size", "--tp") or 1,
                   model_name=model_name, model_params=n_params, model_params_source=psrc,
                   max_prompt_len=positive_int(dig(cfg, "data.max_prompt_length"), "data.max_prompt_length"),
                   max_response_len=positive_int(dig(cfg, "data.max_response_length"), "data.max_response_length"),
                   algo="ppo" if adv == "gae" or G == 1 else "grpo", adv_estimator=adv,
                   lr=float(lr) if lr is not None else None,
                   max_num_seqs_per_engine=positive_int(dig(cfg, "actor_rollout_ref.rollout.max_num_seqs"),
                                                        "max_num_seqs") or 1024,
                   prefill_ratio=1.0 / G, config_file=cfile, notes=notes, metric_use=dict(USE))
    if device:
        spec.device = get_profile(device).key
    gb = dig(cfg, "data.gen_batch_size")
    if gb and dig(cfg, "algorithm.filter_groups.enable") and int(gb) > P:
        spec.gen_responses = int(gb) * G
        notes.append(f"data.gen_batch_size {gb} > train_batch_size {P} with filter_groups: {int(gb) * G} responses "
                     "generated per step")
    files = dig(cfg, "data.train_files")
    if files:
        f = files[0] if isinstance(files, list) else str(files)
        spec.task = Path(str(f)).parent.name or Path(str(f)).stem
    spec.config = config_subset(cfg, CONFIG_KEYS, dotted=True)
    for key in MICRO_KEYS:  # the memory model sizes micro-batches by them: refuse here, not in a later `rlsim run`
        v = dig(cfg, key)
        if v is not None and not str(v).startswith("${"):  # an unresolved interpolation: verl's default stands
            positive_int(v, f"{cfile}: {key}")
    _mode_of(spec, cfg)
    return spec


MICRO_KEYS = tuple(k for k in CONFIG_KEYS if k.endswith(("micro_batch_size_per_gpu", "micro_batch_size")))


def _mode_of(spec: RunSpec, cfg: dict[str, Any]) -> None:
    """Record the execution mode the config asks for, and the `rlsim run` options that ask for it."""
    mode, settings, devices = execution_mode(cfg)
    if mode is None:
        return
    spec.execution_mode, spec.mode_settings = mode, {**settings, **devices}
    if mode == "sync":
        spec.notes.append("verl V1 trainer_mode sync: the colocated loop")
        return
    opts = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in spec.mode_settings.items()
                    if v is not False)
    spec.notes.append(f"execution mode {mode} (from the config): `rlsim run TRACE` asks about it, as --mode {mode} "
                      f"{opts}" + ("" if "train_gpus" in devices else " (add the devices: --train-gpus N"
                                   + ("" if mode == "colocate_async" else " --gen-gpus M") + ")"))


# verl settings -> rlsim's mode settings (rlsim.modes.registry), per execution mode
V1 = "trainer.v1."
MODE_SETTINGS = {
    "colocate_async": {"num_warmup_batches": V1 + "colocate_async.num_warmup_batches",
                       "max_off_policy_threshold": V1 + "sampler.max_off_policy_threshold",
                       "max_off_policy_strategy": V1 + "sampler.max_off_policy_strategy"},
    "separate_async": {"num_warmup_batches": V1 + "separate_async.num_warmup_batches",
                       "parameter_sync_step": V1 + "separate_async.parameter_sync_step",
                       "max_off_policy_threshold": V1 + "sampler.max_off_policy_threshold",
                       "max_off_policy_strategy": V1 + "sampler.max_off_policy_strategy"},
    "fully_async": {"staleness_threshold": "async_training.staleness_threshold",
                    "trigger_parameter_sync_step": "async_training.trigger_parameter_sync_step",
                    "require_batches": "async_training.require_batches",
                    "partial_rollout": "async_training.partial_rollout",
                    "concurrent_samples_per_replica": "async_training.concurrent_samples_per_replica"},
}
MODE_SETTINGS["one_step_off"] = {}
MODE_SETTINGS["separate_async_switch"] = {
    **MODE_SETTINGS["separate_async"],
    "switch_threshold_ratio": V1 + "separate_async.hybrid_rollout.switch_threshold_ratio"}


def _check_setting(key: str, v: Any) -> None:
    """A verl mode setting's type, as verl reads it: a flag, max_off_policy_strategy's word, else a finite number
    >= 0 (a count or a share); the ranges of each are `rlsim run`'s (rlsim.core.config.WhatIf)."""
    if key.endswith("partial_rollout"):
        ok = isinstance(v, bool)
    elif key.endswith("max_off_policy_strategy"):
        ok = isinstance(v, str)
    else:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf
    if not ok:
        want = ("true or false" if key.endswith("partial_rollout") else "a word (drop | wait)"
                if key.endswith("strategy") else "a non-negative number")
        raise RlsimError(f"config {key} must be {want}, got {v!r}; correct it in the config")


def execution_mode(cfg: dict[str, Any]) -> tuple[str | None, dict[str, Any], dict[str, int]]:
    """(the rlsim execution mode, its settings, its devices) a verl config asks for: the V1 trainer's
    `trainer.v1.trainer_mode` (sync, colocate_async, separate_async with or without
    hybrid_rollout.enable_switch, when trainer.use_v1), the fully_async recipe's `async_training` section, or the
    one-step-off recipe's top-level `rollout` pool (verl/experimental/one_step_off_policy/config); (None, {}, {})
    for the classic trainer. Devices: trainer.n_gpus_per_node x nnodes train; the standalone
    rollout pool (rollout.* or actor_rollout_ref.rollout.* n_gpus_per_node x nnodes) generates."""
    mode = dig(cfg, V1 + "trainer_mode")
    if mode is not None and dig(cfg, "trainer.use_v1") is False:
        mode = None
    if mode == "sync":
        return "sync", {}, {}  # rlsim's name of it too: the colocated loop (rlsim.modes.registry.ALIASES)
    if mode == "separate_async" and dig(cfg, V1 + "separate_async.hybrid_rollout.enable_switch") \
            and dig(cfg, "actor_rollout_ref.hybrid_engine") is not False:
        mode = "separate_async_switch"
    if mode is None and isinstance(dig(cfg, "async_training"), dict):
        mode = "fully_async"
    elif mode is None and dig(cfg, "rollout.n_gpus_per_node") is not None:
        mode = "one_step_off"  # the one-step-off recipe: a top-level rollout pool, no async_training section
    if mode is not None and mode not in MODE_SETTINGS:
        raise RlsimError(f"{V1}trainer_mode {mode!r} is not a verl V1 trainer mode (sync | colocate_async | "
                         f"separate_async); correct it in the config, or set trainer.use_v1: false for the classic "
                         f"trainer")
    if mode is None:
        return None, {}, {}
    settings = {k: dig(cfg, key) for k, key in MODE_SETTINGS[mode].items() if dig(cfg, key) is not None}
    if settings.get("max_off_policy_threshold") == "null":
        settings.pop("max_off_policy_threshold")
    for k, v in settings.items():
        _check_setting(MODE_SETTINGS[mode][k], v)

    def count(prefix: str) -> int | None:
        n = dig(cfg, prefix + ".n_gpus_per_node")
        return int(n) * int(dig(cfg, prefix + ".nnodes") or 1) if n is not None else None

    devices = {"train_gpus": count("trainer")}
    if mode != "colocate_async":
        devices["gen_gpus"] = count("rollout") or count("actor_rollout_ref.rollout")
    return mode, settings, {k: v for k, v in devices.items() if v}


def _steps(path: Path, raw: dict[int, dict[str, float]], train: dict[int, dict[str, float]], spec: RunSpec,
           eval_metric: str | None) -> tuple[list[Step], list[Eval]]:
    """The training steps and the evals of the logged steps; the GPU count from perf/throughput where no flag or
    config gave it (and a warning where it disputes them)."""
    offset = 1 if min(train) >= 1 else 0
    steps: list[Step] = []
    evals: list[Eval] = []
    implied: list[float] = []
    async_run = False
    for g in sorted(raw):
        m = raw[g]
        ev = _evals(m, eval_metric)
        if ev is not None:
            spec.metric_use.update({k.strip(): "eval score" for k in ev[2].split(",")})
            evals.append(Eval(updates=g if offset else g + 1, score=ev[0], k=ev[1], metric=ev[2],
                              seconds=m.get("timing_s/testing", math.nan)))
        if g not in train:
            continue
        st = _step(path, g - offset, g, m, spec.prompts * spec.group)
        steps.append(st)
        total, thr = st.total_time, m.get("perf/throughput", 0.0)
        if math.isfinite(total) and total > 0 and thr > 0 and math.isfinite(st.num_tokens):
            implied.append(st.num_tokens / (total * thr))
        async_run |= any(k in m for k in ASYNC_KEYS)
    if implied:
        _gpus_from_throughput(spec, sorted(implied)[len(implied) // 2])
    if async_run:
        spec.notes.append("fully-async run (trainer/idle_ratio, rollouter/idle_ratio logged): generation and training "
                          "overlapped")
        spec.fully_async = True
    return steps, evals


def _step(path: Path, index: int, g: int, m: dict[str, float], B: int) -> Step:
    total = m.get("timing_s/step", m.get("perf/time_per_step", math.nan))
    # a log (or a table) with the step time alone: one phase for the lot, as TRL's, so training takes the rest
    phases = _phases(m) or ([Phase("step", "whole", total)] if math.isfinite(total) else [])
    if not math.isfinite(total) and not phases:
        raise RlsimError(f"{path}: step {g} has no timing (timing_s/*); verl logs it on every step, is this a verl "
                         "trainer log?")
    score = (_stat(m, "critic/score", ("mean", "min", "max")) if "critic/score/mean" in m
             else _stat(m, "critic/rewards", ("mean", "min", "max")))
    return Step(index=index, metrics=m, phases=phases, total_time=total,
                num_tokens=m.get("perf/total_num_tokens", math.nan), responses=B,
                response=_stat(m, "response_length"), prompt=_stat(m, "prompt_length"), score=score,
                lr=m.get("actor/lr", math.nan), loss=m.get("actor/pg_loss", m.get("actor/loss", math.nan)),
                grad_norm=m.get("actor/grad_norm", math.nan), critic_loss=m.get("critic/vf_loss", math.nan),
                critic_grad_norm=m.get("critic/grad_norm", math.nan))


def _gpus_from_throughput(spec: RunSpec, implied: float) -> None:
    """perf/throughput = tokens / (step time x GPUs): the GPU count it implies, where none was given, or a warning."""
    if spec.gpus is None:
        spec.gpus = max(int(round(implied)), 1)
        spec.notes.append(f"GPUs {spec.gpus} from perf/throughput = tokens / (step time x GPUs) (no --gpus or config)")
    elif abs(implied - spec.gpus) > 0.1 * spec.gpus:
        spec.warnings.append(f"perf/throughput (tokens / (step time x GPUs)) implies {implied:.3g} GPUs, the "
                             f"config/flags say {spec.gpus}: the costs are scaled by {spec.gpus}; pass --gpus if the "
                             "config is wrong")


IMPORTER = Importer(
    name="verl", help="Import a verl PPO/GRPO run.", load=load,
    log_help="console log (step:N - key:value - ...), metrics .jsonl, or W&B history .csv",
    flags=("config", "prompts", "group", "gpus", "device", "model_params", "model_config", "tp", "eval_metric",
           "drop_truncated"),
    flag_help={"config": ImportFlags.__dataclass_fields__["config"].metadata["help"] + " (Hydra's .hydra/config.yaml)",
               "prompts": "P: data.train_batch_size (prompts per step)",
               "group": "G: actor_rollout_ref.rollout.n (responses per prompt)",
               "gpus": "GPUs: trainer.n_gpus_per_node x trainer.nnodes"})
