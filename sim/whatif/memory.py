"""Will it fit? The memory model (`rlsim.replay.memory`) applied to a what-if configuration.

Its inputs come from the reference trace's metadata (`trace_memory`, once per study: the model's shape, the
framework's config, the engine and the devices) and from the candidate (`candidate_memory`: P, G, the devices it
asks for). The answer is the `memory` object of an Outcome, a `warning:` when it does not fit (the term that
overflows and the smallest change that fits), a note when it cannot be known (what to pass), and the KV-cache
capacity the simulated engine gets on that device (`kv_capacity_tokens`). Pure arithmetic: no simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rlsim.core.config import WhatIf
from rlsim.replay.devices import get_profile, profile_for_hardware
from rlsim.replay.errors import RlsimError, name
from rlsim.replay.memory import (GenSetup, MemoryEstimate, ModelShape, TrainSetup, estimate_memory, model_shape,
                                 setups_from_verl)

# why a parameter count alone leaves the verdict open, and the fix
PARTIAL = ("the model's layer shapes are unknown, so its KV cache and activations are not counted: import the log "
           "with --model-config PATH/config.json")

# bytes per element of an engine dtype as a trace's `engine.dtype` names it
DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "fp32": 4.0, "bfloat16": 2.0, "float16": 2.0, "half": 2.0, "fp16": 2.0,
               "bf16": 2.0}


@dataclass(frozen=True)
class TraceMemory:
    """What the reference trace says about memory: the model, the framework's settings, the recorded devices."""

    shape: ModelShape | None = field(metadata={"help": "the model's shape (None: unknown, see `unknown`)"})
    unknown: str = field(default="", metadata={"help": "why the model's size is unknown, and what to pass"})
    framework: str = field(default="rlrun", metadata={"help": "rlrun, or the framework whose log was imported"})
    verl: dict = field(default_factory=dict, metadata={"help": "the verl config the import kept, nested ({} if none)"})
    gen: GenSetup = field(default_factory=GenSetup, metadata={"help": "engine settings as recorded (rlrun, generic)"})
    train: TrainSetup = field(default_factory=TrainSetup, metadata={"help": "trainer settings as recorded"})
    device_memory_gb: float | None = field(default=None, metadata={
        "help": "memory of one recorded device, GB (a CPU trace: its host's; None: the device is not named)"})
    cpu: bool = field(default=False, metadata={"help": "recorded on a CPU host (one memory for every core)"})
    assumed: str = field(default="", metadata={"help": "settings the trace does not record, assumed (a note)"})
    mean_seq_len: float = field(default=0.0, metadata={
        "help": "the largest per-update mean prompt + response tokens the log records (0: none; packed "
                "micro-batches are then sized at the padded bound)"})


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1} -> {'a': {'b': 1}}: the dotted keys an import keeps, as the Hydra config nests them."""
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *path, last = str(key).split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return out


def _shape(model: dict[str, Any]) -> tuple[ModelShape | None, str]:
    """The model's shape from the trace's `model` metadata: its recorded dimensions (rlrun records them), else its
    name in the registry, else its parameter count alone; None and what to pass when none is there."""
    dims = ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab")
    if model.get("parameters") and all(isinstance(model.get(k), int) and model[k] > 0 for k in dims):
        return ModelShape(str(model.get("name") or "model"), float(model["parameters"]),
                          *(int(model[k]) for k in dims), source="the trace's model metadata"), ""
    try:
        return model_shape(model.get("name"), params=model.get("parameters")), ""
    except RlsimError:
        return None, (f"memory unknown: the trace's model {model.get('name')!r} is not in rlsim's registry and the "
                      f"trace has no parameter count, so pass {name('model_params')} (its parameter count, e.g. "
                      "7e9) for its training state, or import the log again with --model-config PATH/config.json "
                      "for all of it")


def recorded_mean_seq_len(step_stats: dict[str, np.ndarray]) -> float:
    """The largest per-update mean prompt + response tokens in a trace's step_stats rows (verl's prompt_length/mean
    + response_length/mean); 0 when either is not recorded."""
    if not len(step_stats.get("prompt_len_mean", ())):
        return 0.0
    total = np.asarray(step_stats["prompt_len_mean"], float) + np.asarray(step_stats["response_len_mean"], float)
    return float(np.nanmax(total)) if np.isfinite(total).any() else 0.0


def trace_memory(meta: dict[str, Any], mean_seq_len: float = 0.0) -> TraceMemory:
    """The reference trace's memory inputs (its metadata: model, config, engine, trainer, hardware; `mean_seq_len`
    from recorded_mean_seq_len)."""
    cfg, eng, hw = meta.get("config") or {}, meta.get("engine") or {}, meta.get("hardware") or {}
    shape, unknown = _shape(meta.get("model") or {})
    framework = str((meta.get("source") or {}).get("framework") or "rlrun")
    cpu = str(hw.get("device") or "").lower() == "cpu"
    mem = hw.get("memory_gb") if cpu else None
    if not isinstance(mem, (int, float)) or mem <= 0:
        prof = profile_for_hardware(hw) if hw else None
        mem = prof.memory_gb if prof is not None and prof.key != "recorded" else None
    base = TraceMemory(shape, unknown, framework, device_memory_gb=mem, cpu=cpu, mean_seq_len=mean_seq_len)
    if framework == "verl":
        return replace(base, verl=_nested(cfg.get("framework_config") or {}))
    if framework != "rlrun":  # the log's framework settings are not in the trace: stated defaults
        return replace(base, gen=GenSetup(tp=int(cfg.get("tp") or 1)),
                       train=TrainSetup(critic=cfg.get("algo") == "ppo"),
                       assumed=f"memory: {framework}'s engine and trainer settings are not in the trace; assumed "
                               "vLLM's gpu_memory_utilization 0.9, full sharding (ZeRO-3 / FSDP), micro-batch 1 and "
                               "gradient checkpointing")
    width = DTYPE_BYTES.get(str(eng.get("dtype") or "bfloat16").lower(), 2.0)
    trainer = meta.get("trainer") or {}
    gen = GenSetup(tp=1, max_num_batched_tokens=int(eng.get("max_num_batched_tokens") or 8192),
                   max_num_seqs=int(eng.get("max_num_seqs") or 256), block_size=int(eng.get("block_size") or 16),
                   weight_bytes=width, kv_bytes=width, non_torch_gb=0.0 if cpu else GenSetup().non_torch_gb,
                   kv_cache_gb=float(cfg.get("kv_cache_gib") or 0.0), sleeps=False)  # rlrun's engine stays resident
    # rlrun trains replicas in the engine's dtype without sharding or checkpointing (ZeRO stage 0)
    train = TrainSetup(gpus=int(cfg.get("train_devices") or 1), zero_stage=0,
                       micro_batch=int(cfg.get("micro_batch") or 1),
                       seq_len=int(trainer.get("row_tokens") or cfg.get("max_model_len") or 2048),
                       gradient_checkpointing=False, critic=cfg.get("algo") == "ppo",
                       colocated=str(cfg.get("mode") or "colocated") == "colocated")
    return replace(base, gen=gen, train=train)


@dataclass(frozen=True)
class Load:
    """What a candidate puts on its devices."""

    responses_per_update: int = field(metadata={"help": "B = P x G responses trained per update"})
    gen_requests: int = field(metadata={"help": "responses generated per update (B_gen >= B)"})
    seq_len: int = field(metadata={"help": "the longest prompt + response, tokens"})
    recorded_devices: int = field(metadata={"help": "devices the reference ran on"})


def candidate_setups(tm: TraceMemory, cfg: WhatIf, load: Load) -> tuple[GenSetup, TrainSetup, int]:
    """(gen, train, engines) of `cfg` on its devices: colocated on --gpus (else as many as recorded), or split on
    --gen-gpus engines and --train-gpus trainer ranks; a CPU host is one memory whatever its cores."""
    split = cfg.split and not tm.cpu
    n = 1 if tm.cpu else int(cfg.gpus or load.recorded_devices)
    n_gen, n_train = (int(cfg.gen_gpus or cfg.train_gpus), int(cfg.train_gpus)) if split else (n, n)  # hybrid: the same
    if tm.verl:  # its engine and FSDP settings; the batch enters below, as each engine's concurrency
        gen, _ = setups_from_verl(tm.verl, gpus=n_gen)
        _, train = setups_from_verl(tm.verl, gpus=n_train, mean_len=tm.mean_seq_len)
    else:
        gen = replace(tm.gen, tp=min(tm.gen.tp, n_gen))
        train = replace(tm.train, gpus=n_train, seq_len=tm.train.seq_len if tm.train.seq_len else load.seq_len)
        if tm.framework == "rlrun":  # each rank trains at most its share of the batch per micro-batch
            share = load.responses_per_update // max(n_train, 1)
            train = replace(train, micro_batch=max(1, min(train.micro_batch, share)))
        else:
            train = replace(train, seq_len=load.seq_len)
    engines = max(1, n_gen // max(gen.tp, 1))
    per_engine = gen.max_num_seqs
    if cfg.max_num_seqs:  # the simulated engine's max_num_seqs spans every engine
        per_engine = max(1, cfg.max_num_seqs // engines)
    gen = replace(gen, max_num_seqs=per_engine, seq_len=gen.seq_len or load.seq_len,
                  concurrency=min(per_engine, math.ceil(load.gen_requests / engines)))
    return gen, replace(train, colocated=train.colocated and not split), engines


def candidate_memory(tm: TraceMemory, cfg: WhatIf, load: Load) -> tuple[MemoryEstimate | None, int, str]:
    """(the estimate, engines, why it is unknown) of `cfg`; the estimate is None when the model's size or the
    device's memory is unknown."""
    shape = tm.shape
    if shape is None and cfg.model_params:
        shape = model_shape(None, params=float(cfg.model_params))
    if shape is None:
        return None, 1, tm.unknown
    mem = get_profile(cfg.device).memory_gb if cfg.device else tm.device_memory_gb
    if not mem:
        return None, 1, ("memory unknown: the trace does not name its device; pass --device NAME (its memory) or "
                         "import the log with --device")
    gen, train, engines = candidate_setups(tm, cfg, load)
    return estimate_memory(shape, gen, train, mem), engines, ""


def memory_object(est: MemoryEstimate | None, why: str = "") -> dict[str, Any]:
    """The answer's `memory` object: {generation_gb, training_gb, per_device_gb, limit_gb, fits, ...}; unknown: those
    five None and `unknown` saying what to pass."""
    if est is None:
        return {"generation_gb": None, "training_gb": None, "per_device_gb": None, "limit_gb": None, "fits": None,
                "unknown": why}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in est.to_dict().items()}


def memory_warning(est: MemoryEstimate | None) -> str:
    """The warning of a configuration that does not fit: the overflowing term and the smallest changes that fit."""
    if est is None or est.fits is not False:
        return ""
    fix = (f"; the smallest change that fits: {est.fixes[0]}"
           + (f" (or: {'; '.join(est.fixes[1:3])})" if len(est.fixes) > 1 else "")
           if est.fixes else "; no single change tried fits (micro-batch, checkpointing, TP, sharding, offload, "
                             "up to 16x the GPUs)")
    return f"does not fit in memory: {est.overflow}{fix}"


def memory_line(m: dict[str, Any] | None) -> str:
    """`rlsim run`'s memory line (after `memory:`) of an Outcome's `memory` object."""
    if not m:
        return "unknown"
    if m.get("unknown"):
        return f"unknown ({m['unknown'].removeprefix('memory unknown: ')})"

    def gb(v: float | None) -> str:
        return "?" if v is None else f"{v:.1f}"
    verdict = {True: "fits", False: "does not fit",
               None: f"undecided ({PARTIAL})"}[m["fits"]]
    split = "" if m.get("colocated", True) else " (split: each device holds one phase)"
    kv = ""
    cap, demand = m.get("kv_capacity_tokens"), m.get("kv_demand_tokens")
    if cap is not None and demand is not None and demand > cap:
        kv = f"; KV cache {cap} tokens per engine of the {demand} its concurrency needs: vLLM queues the rest"
    return (f"per device, generation {gb(m['generation_gb'])} GiB, training {gb(m['training_gb'])} GiB of "
            f"{gb(m['limit_gb'])} GiB{split}: {verdict}{kv}")
