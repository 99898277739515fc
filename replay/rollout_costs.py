"""Costs that decide a split (asynchronous) layout at GPU scale: the rollout replica as a tensor-parallel group of
devices, and the weight sync from the trainer to the replicas by model size and path. Pure rules, no simulator.

Rollout replica (`group_models`): an engine at tensor parallel tp spans tp devices, so N generation GPUs hold N / tp
replicas. One replica's costs are the recorded ones rescaled to tp devices (`rlsim.replay.devices.rescale`); its
per-engine-step weight read moves tp_ref / tp where its tensor parallel differs from the recorded one.

Weight sync (`weight_sync_seconds`): fixed + model bytes (all parameters, every expert) / the path's GB/s.
checkpoint-engine: the least squares over MoonshotAI/checkpoint-engine README @ 415c3205 "Benchmark" (six MoE
models, 212 GB-1.03 TB, 8-256 H800/H20, broadcast update + GatherMetas): 0.09 s + bytes / 62 GB/s, within 1.25 s of
each; their figures include the reshard to the engines' layout, so `moe_reshard` is the same rule. Per-tensor NCCL:
2.5x, verl docs/advance/fully_async.md @ 1dda039b ("reduces synchronization time overhead by more than 60%"). NeMo RL's
non-colocated refit (`nemo_nccl`: training rank 0 broadcasts packed full tensors to every engine rank, the path at v0.4-
v0.6 and at 7ea279ab): bytes / 94 GB/s, its own DeepSeek-V3 figure (docs/guides/checkpoint-engine-refit.md @ 7ea279ab,
"NCCL", dedicated async refit timer: 14.21 s for 671e9 bf16 parameters, Megatron PP16 EP16 -> vLLM TP32). Assumed:
the trainer's gather of its shards is inside these figures. docs/simulator.md has the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels
from rlsim.replay.robust import AffineModel, PiecewiseLinear

CKPT_FIXED_S = 0.09         # seconds: intercept of the least squares over checkpoint-engine's six benchmark rows
CKPT_GBS = 62.0             # GB/s of model bytes: its slope
PER_TENSOR_FACTOR = 2.5     # verl: checkpoint-engine saves "more than 60 %" of the per-tensor NCCL sync
NEMO_NCCL_S = 14.21         # seconds: NeMo RL's NCCL refit of DeepSeek-V3 (module doc), one figure: no fixed term
NEMO_NCCL_BYTES = 671e9 * 2  # its bytes: every DeepSeek-V3 parameter in bf16


@dataclass(frozen=True)
class SyncPath:
    """One way weights reach the rollout engines."""

    name: str = field(metadata={"help": "the path's name (--weight-sync)"})
    fixed_s: float = field(metadata={"help": "seconds per sync besides the bytes (metadata, buckets, barriers)"})
    gbs: float = field(metadata={"help": "effective GB/s of model bytes"})
    source: str = field(metadata={"help": "where the figures come from"})


SYNC_PATHS = {p.name: p for p in (
    SyncPath("checkpoint_engine", CKPT_FIXED_S, CKPT_GBS,
             "MoonshotAI/checkpoint-engine README @ 415c3205 Benchmark (six models 106e9-1e12 params, 8-256 GPUs), "
             "least squares"),
    SyncPath("moe_reshard", CKPT_FIXED_S, CKPT_GBS,
             "as checkpoint_engine: its benchmark models are all mixtures of experts resharded to the engines' layout"),
    SyncPath("nccl", CKPT_FIXED_S * PER_TENSOR_FACTOR, CKPT_GBS / PER_TENSOR_FACTOR,
             "per-tensor NCCL broadcast: 2.5x checkpoint-engine (verl docs/advance/fully_async.md: checkpoint-engine "
             "saves more than 60 %)"),
    SyncPath("nemo_nccl", 0.0, NEMO_NCCL_BYTES / NEMO_NCCL_S / 1e9,
             "NeMo RL's non-colocated refit (packed NCCL broadcast from training rank 0): its DeepSeek-V3 figure, "
             "14.21 s for 1.34 TB (NVIDIA-NeMo/RL docs/guides/checkpoint-engine-refit.md @ 7ea279ab)"),
)}


def sync_path(name: str) -> SyncPath:
    """The named path; RlsimError listing the known ones otherwise."""
    try:
        return SYNC_PATHS[name]
    except KeyError:
        raise RlsimError(f"weight sync path must be one of {' | '.join(SYNC_PATHS)}, got {name!r}") from None


def weight_sync_seconds(model_bytes: float, path: str) -> float:
    """Seconds of one trainer-to-rollout weight sync of `model_bytes` (all parameters, at the engines' bytes)."""
    p = sync_path(path)
    return p.fixed_s + float(model_bytes) / (p.gbs * 1e9) if model_bytes > 0 else 0.0


def replicas(gen_gpus: int, tp: int) -> int:
    """Rollout replicas of `gen_gpus` devices at tensor parallel `tp`; RlsimError when tp does not divide them."""
    if tp < 1 or gen_gpus % tp:
        raise RlsimError(f"{gen_gpus} generation GPUs do not split into replicas of tensor parallel {tp}; pick a "
                         f"multiple of {tp} (each rollout replica spans tp devices)")
    return gen_gpus // tp


def group_models(one_device: FittedModels, group: FittedModels, tp_ref: int, tp: int) -> tuple[FittedModels, str]:
    """(one trainer device's models with one rollout replica's generation, the note): `group` are the recorded
    models rescaled to `tp` devices (`rescale`); their per-engine-step cost moves tp_ref / tp (module doc)."""
    gen = replace(group.gen, c_step=group.gen.c_step * tp_ref / tp)
    moved = f", the per-step weight read x {tp_ref}/{tp} from the recorded tensor parallel" if tp != tp_ref else ""
    note = (f"each rollout replica is a tensor-parallel group of {tp} devices (its slots and KV cache those of {tp} "
            f"devices, per-sequence costs over {tp} devices{moved}); each trainer rank one device")
    return replace(one_device, gen=gen, gen_overhead=group.gen_overhead, engine=dict(group.engine)), note


def old_log_prob_share(phases: dict[str, float]) -> float:
    """The share of the batch preparation (prep role) that recomputes old log-probs, from logged seconds per phase name:
    verl's `old_log_prob` of old_log_prob + ref + values; 1 when the log names no such phase (an rlrun trace's prep is
    the old log-prob pass)."""
    prep = sum(v for k, v in phases.items() if k in ("old_log_prob", "ref", "values"))
    return phases.get("old_log_prob", 0.0) / prep if prep > 0 and "old_log_prob" in phases else 1.0


def without_share(m: AffineModel | PiecewiseLinear, share: float) -> AffineModel | PiecewiseLinear:
    """The cost model `m` with `share` of it removed (a pass the trainer no longer runs)."""
    k = max(1.0 - share, 0.0)
    if isinstance(m, PiecewiseLinear):
        return replace(m, values=tuple(v * k for v in m.values), offset=m.offset * k)
    return replace(m, intercept=m.intercept * k, slope=m.slope * k)
