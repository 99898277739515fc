"""Will it fit? Memory per device for an RL run's generation (vLLM) and training (FSDP / ZeRO) phases.

One function per term, each with its source (docs/simulator.md, "Memory", has them as formulas):

- generation: vLLM's weights per tensor-parallel rank, its profiled activation peak, its non-torch memory and the
  KV-cache pool it sizes from `gpu_memory_utilization` (vllm/v1/worker/gpu_worker.py `determine_available_memory`,
  vllm/v1/worker/utils.py `request_memory`, vllm/utils/mem_utils.py `memory_profiling`, vllm/v1/core/kv_cache_utils.py
  `get_kv_cache_config_from_groups`): pool = ceil(total x utilization) - weights - activation peak - non-torch
  [- CUDA-graph estimate], split into blocks of `block_size` tokens of 2 x layers x KV heads x head dim x bytes;
- training: parameters, gradients and Adam state under ZeRO stages 0-3 with CPU offload, as DeepSpeed's estimators
  compute them (deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs`,
  deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs`); activations per micro-batch after
  Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sections 4 and 5); the
  reference model and the PPO critic;
- colocated (verl's hybrid engine): generation and training never peak together, so a device holds the larger of
  the two phases, each with what the other phase leaves resident; split devices hold one phase each.

Memory is in GiB (2^30 bytes), as CUDA, vLLM and DeepSpeed's estimators print it. Pure Python: no torch, no vLLM.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rlsim.replay.errors import RlsimError

GIB = 2 ** 30

# The share of a GPU's nominal memory its driver keeps: CUDA reports an 80 GB H100 or A100 as 79.1-79.3 GiB and a
# 40 GB A100 as 39.4-39.6 GiB (vLLM's "total_gpu_memory (79.14GiB)" profiling lines; PyTorch's "GPU 0 has a total
# capacity of ..." out-of-memory messages; vllm-project/vllm issue #16570 for the A100 40GB). Datasheet capacities
# of HBM parts are GiB of HBM, so the usable memory is memory_gb x (1 - this).
DRIVER_RESERVED = 0.011

# Memory vLLM's profiler counts outside PyTorch's allocator at one tensor-parallel rank: cuBLAS workspaces, NCCL
# and custom all-reduce buffers (vllm/utils/mem_utils.py `memory_profiling`, category 3). Its published profiling
# lines ("non_torch_memory takes ...GiB") range 0.1-0.45 GiB for dense models; this is their upper end.
NON_TORCH_GIB = 0.4


# ---------------------------------------------------------------------------------------------------------------
# Model shapes
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, as its Hugging Face config.json gives it. A shape known only by its
    parameter count (`layers` 0) sizes the training state but not the KV cache or activations."""

    name: str = field(metadata={"help": "the model's name (a Hugging Face id or the user's label)"})
    params: float = field(metadata={"help": "parameters, counted once when the embeddings are tied"})
    layers: int = field(default=0, metadata={"help": "num_hidden_layers (0: unknown)"})
    hidden: int = field(default=0, metadata={"help": "hidden_size"})
    heads: int = field(default=0, metadata={"help": "num_attention_heads"})
    kv_heads: int = field(default=0, metadata={"help": "num_key_value_heads (grouped-query attention)"})
    head_dim: int = field(default=0, metadata={"help": "head_dim (hidden_size / num_attention_heads when absent)"})
    intermediate: int = field(default=0, metadata={"help": "intermediate_size of the gated MLP"})
    vocab: int = field(default=0, metadata={"help": "vocab_size"})
    tied_embeddings: bool = field(default=False, metadata={"help": "tie_word_embeddings: one matrix in and out"})
    source: str = field(default="", metadata={"help": "where the numbers come from"})

    @property
    def full(self) -> bool:
        """Whether the layer dimensions are known (else only `params` is)."""
        return self.layers > 0 and self.hidden > 0 and self.kv_heads > 0 and self.head_dim > 0

    @property
    def largest_layer_params(self) -> float:
        """The largest single module's parameters (DeepSpeed's `largest_layer_params`, `model_to_params` in
        stage3.py): the embedding (vocab x hidden) or one MLP projection (hidden x intermediate)."""
        if not self.full:
            return 0.0
        return float(max(self.vocab * self.hidden, self.hidden * self.intermediate))


def count_params(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int,
                 tied: bool, qkv_bias: bool = False, qk_norm: bool = False) -> int:
    """Parameters of a Llama/Qwen-style decoder: per layer Q, K, V, O projections (+ Q/K/V biases in Qwen2, + Q/K
    RMSNorm weights in Qwen3), a gated MLP (gate, up, down) and two RMSNorms; embeddings (twice when untied) and a
    final norm."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden
    attn += ((q + 2 * kv) if qkv_bias else 0) + (2 * head_dim if qk_norm else 0)
    per_layer = attn + 3 * hidden * intermediate + 2 * hidden
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


def shape_from_config(config: dict[str, Any], name: str = "") -> ModelShape:
    """A shape from a Hugging Face config.json dict (Llama, Qwen2, Qwen3, Mistral and alike)."""
    try:
        layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise RlsimError(f"the model config lacks {e} (need num_hidden_layers, hidden_size, num_attention_heads, "
                         "intermediate_size, vocab_size): pass the model's config.json") from None
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    kind = str(config.get("model_type", "")).lower()
    tied = bool(config.get("tie_word_embeddings", False))
    params = count_params(layers, hidden, heads, kv, head_dim, inter, vocab, tied,
                          qkv_bias=kind == "qwen2" or bool(config.get("attention_bias", False)),
                          qk_norm=kind == "qwen3")
    return ModelShape(name or str(config.get("_name_or_path", "model")), float(params), layers, hidden, heads, kv,
                      head_dim, inter, vocab, tied, source="the model's config.json")


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json"


# name: (model_type, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tie_word_embeddings), from each
# model's config.json on Hugging Face (the source line names it); parameters are counted from them (count_params).
_CONFIGS: dict[str, tuple] = {
    "Qwen/Qwen2.5-0.5B": ("qwen2", 24, 896, 14, 2, 64, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B": ("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, True),
    "Qwen/Qwen2.5-3B": ("qwen2", 36, 2048, 16, 2, 128, 11008, 151936, True),
    "Qwen/Qwen2.5-7B": ("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False),
    "Qwen/Qwen2.5-14B": ("qwen2", 48, 5120, 40, 8, 128, 13824, 152064, False),
    "Qwen/Qwen2.5-32B": ("qwen2", 64, 5120, 40, 8, 128, 27648, 152064, False),
    "Qwen/Qwen2.5-72B": ("qwen2", 80, 8192, 64, 8, 128, 29568, 152064, False),
    "Qwen/Qwen3-0.6B": ("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, True),
    "Qwen/Qwen3-1.7B": ("qwen3", 28, 2048, 16, 8, 128, 6144, 151936, True),
    "Qwen/Qwen3-4B": ("qwen3", 36, 2560, 32, 8, 128, 9728, 151936, True),
    "Qwen/Qwen3-8B": ("qwen3", 36, 4096, 32, 8, 128, 12288, 151936, False),
    "Qwen/Qwen3-14B": ("qwen3", 40, 5120, 40, 8, 128, 17408, 151936, False),
    "Qwen/Qwen3-32B": ("qwen3", 64, 5120, 64, 8, 128, 25600, 151936, False),
    "meta-llama/Llama-3.1-8B": ("llama", 32, 4096, 32, 8, 128, 14336, 128256, False),
    "meta-llama/Llama-3.1-70B": ("llama", 80, 8192, 64, 8, 128, 28672, 128256, False),
    "meta-llama/Llama-2-7b-hf": ("llama", 32, 4096, 32, 32, 128, 11008, 32000, False),
}


def _registry() -> dict[str, ModelShape]:
    out = {}
    for repo, (kind, layers, hidden, heads, kv, hd, inter, vocab, tied) in _CONFIGS.items():
        cfg = {"model_type": kind, "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
               "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": inter, "vocab_size": vocab,
               "tie_word_embeddings": tied}
        out[repo] = replace(shape_from_config(cfg, repo), source=_hf(repo))
    return out


MODELS: dict[str, ModelShape] = _registry()


def _key(name: str) -> str:
    """A model name without its organisation and its post-training suffix: Qwen/Qwen2.5-3B-Instruct -> qwen2.5-3b."""
    base = str(name).strip().rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[-_](instruct|chat|base|it|hf)$", "", base)


def model_shape(name: str | None, params: float | None = None, config: dict[str, Any] | None = None) -> ModelShape:
    """The shape of `name`: from its config.json dict when given, else from the registry (organisation, case and an
    -Instruct/-Chat suffix ignored), else a parameters-only shape from `params` (--model-params). Raises RlsimError
    when none of the three is there: memory is then unknown, never guessed."""
    if config:
        return shape_from_config(config, name or "")
    want = _key(name or "")
    for repo, shape in MODELS.items():
        if want and want == _key(repo):
            return replace(shape, name=str(name))
    if params:
        return ModelShape(str(name or "model"), float(params), source="--model-params (layer shapes unknown)")
    known = ", ".join(r.rsplit("/", 1)[-1] for r in MODELS)
    raise RlsimError(f"memory unknown: model {name!r} is not in rlsim's registry ({known}); pass --model-params "
                     "(e.g. 7B) for its training state, or the model's config.json for the full estimate")


# ---------------------------------------------------------------------------------------------------------------
# Generation (vLLM)
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GenSetup:
    """How vLLM generates: its engine arguments and the load the RL step puts on one engine."""

    tp: int = field(default=1, metadata={"help": "tensor_parallel_size: GPUs one engine spans"})
    gpu_memory_utilization: float = field(default=0.9, metadata={
        "help": "the share of a GPU's memory vLLM may take for weights, activations and its KV-cache pool"})
    max_num_batched_tokens: int = field(default=8192, metadata={
        "help": "tokens per engine step; vLLM's profiling forward runs this many, which sets its activation peak"})
    max_num_seqs: int = field(default=256, metadata={"help": "sequences one engine step may hold"})
    concurrency: int = field(default=0, metadata={
        "help": "sequences in flight on one engine at the step's peak (0: max_num_seqs)"})
    seq_len: int = field(default=0, metadata={
        "help": "prompt + response tokens of one sequence at most (max_model_len); 0: no KV demand is checked"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block (vLLM's default 16)"})
    weight_bytes: float = field(default=2.0, metadata={"help": "bytes per weight (bf16: 2)"})
    kv_bytes: float = field(default=2.0, metadata={"help": "bytes per KV-cache element (bf16: 2, fp8: 1)"})
    non_torch_gb: float = field(default=NON_TORCH_GIB, metadata={
        "help": "memory vLLM's profiler counts outside PyTorch per rank (NCCL, cuBLAS), GiB"})
    cuda_graph_gb: float = field(default=0.0, metadata={
        "help": "CUDA-graph memory vLLM subtracts from the pool, GiB (its profiled estimate; 0 where not applied)"})
    kv_cache_gb: float = field(default=0.0, metadata={
        "help": "a KV-cache pool of fixed size, GiB (vLLM's kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE on CPU), in "
                "place of the gpu_memory_utilization rule (0: the rule)"})
    sleeps: bool = field(default=True, metadata={
        "help": "colocated: the engine frees its weights and KV pool while the trainer runs (verl's hybrid engine, "
                "sleep mode); False: they stay resident in training too (an engine without sleep mode, rlrun's)"})


def kv_bytes_per_token(model: ModelShape, tp: int = 1, kv_bytes: float = 2.0) -> float:
    """KV-cache bytes one token takes on one tensor-parallel rank: 2 (K and V) x layers x KV heads per rank x head
    dim x bytes. vLLM splits the KV heads over the TP ranks and replicates them when TP exceeds them."""
    kv_per_rank = max(1, math.ceil(model.kv_heads / max(tp, 1)))
    return 2.0 * model.layers * kv_per_rank * model.head_dim * kv_bytes


def kv_cache_bytes(model: ModelShape, sequences: int, seq_len: int, tp: int = 1, block_size: int = 16,
                   kv_bytes: float = 2.0) -> float:
    """KV-cache bytes `sequences` sequences of `seq_len` tokens hold on one rank, each rounded up to whole blocks
    (vLLM's paged allocation)."""
    blocks = math.ceil(seq_len / block_size)
    return sequences * blocks * block_size * kv_bytes_per_token(model, tp, kv_bytes)


def vllm_weight_bytes(model: ModelShape, tp: int = 1, weight_bytes: float = 2.0) -> float:
    """Weights on one tensor-parallel rank: parameters x bytes / TP (vLLM shards every linear layer and the
    vocabulary embedding over the ranks)."""
    return model.params * weight_bytes / max(tp, 1)


def vllm_activation_bytes(model: ModelShape, gen: GenSetup) -> float:
    """vLLM's profiled activation peak on one rank (the `PyTorch activation peak memory` of its profiling line).
    The profiling forward runs max_num_batched_tokens tokens; its peak is inside the MLP, where the gate/up output
    (2 x intermediate / TP), the activated product (intermediate / TP) and three hidden-size buffers (residual,
    hidden state, normed input) are alive at once, bf16. The sampler's dummy run then holds fp32 logits for
    max_num_seqs sequences (vllm/v1/worker/gpu_model_runner.py `_dummy_sampler_run`); the peak is the larger."""
    tp = max(gen.tp, 1)
    forward = gen.max_num_batched_tokens * (3 * model.intermediate / tp + 3 * model.hidden) * 2.0
    sampler = gen.max_num_seqs * model.vocab * 4.0
    return max(forward, sampler)


def vllm_kv_pool_bytes(model: ModelShape, gen: GenSetup, total_gib: float) -> float:
    """The KV-cache pool vLLM allocates on one rank (`determine_available_memory` in vllm/v1/worker/gpu_worker.py):
    requested = ceil(total x gpu_memory_utilization) (`request_memory`, vllm/v1/worker/utils.py), minus what
    profiling counts as non-KV (weights + activation peak + non-torch memory, `memory_profiling` in
    vllm/utils/mem_utils.py), minus the CUDA-graph estimate where applied. Negative: no room for a KV cache. A pool
    of fixed size (`kv_cache_gb`, vLLM's kv_cache_memory_bytes) is taken as given, as vLLM takes it."""
    if gen.kv_cache_gb > 0:
        return gen.kv_cache_gb * GIB
    requested = math.ceil(total_gib * GIB * gen.gpu_memory_utilization)
    non_kv = (vllm_weight_bytes(model, gen.tp, gen.weight_bytes) + vllm_activation_bytes(model, gen)
              + gen.non_torch_gb * GIB)
    return requested - non_kv - gen.cuda_graph_gb * GIB


def vllm_kv_capacity_tokens(model: ModelShape, gen: GenSetup, total_gib: float) -> int:
    """The `GPU KV cache size: N tokens` vLLM logs: the pool divided into whole blocks (`num_blocks = available //
    bytes_per_block`, vllm/v1/core/kv_cache_utils.py), times the block size."""
    pool = vllm_kv_pool_bytes(model, gen, total_gib)
    per_block = kv_bytes_per_token(model, gen.tp, gen.kv_bytes) * gen.block_size
    return max(0, int(pool // per_block)) * gen.block_size


def kv_tokens_from_bytes(model: ModelShape, pool_gib: float, tp: int = 1, block_size: int = 16,
                         kv_bytes: float = 2.0) -> int:
    """Tokens a pool of `pool_gib` holds (vLLM's `Available KV cache memory` to its `GPU KV cache size`)."""
    per_block = kv_bytes_per_token(model, tp, kv_bytes) * block_size
    return int(pool_gib * GIB // per_block) * block_size


# ---------------------------------------------------------------------------------------------------------------
# Training (FSDP / ZeRO)
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainSetup:
    """How the trainer holds its models: sharding, offload, micro-batch, and which models the algorithm has."""

    gpus: int = field(default=1, metadata={"help": "devices the trainer shards its model states over (data parallel)"})
    gpus_per_node: int = field(default=8, metadata={"help": "devices per machine (host memory is per machine)"})
    zero_stage: int = field(default=3, metadata={
        "help": "0: replicated (DDP); 1: optimizer sharded; 2: + gradients (FSDP SHARD_GRAD_OP); 3: + parameters "
                "(FSDP FULL_SHARD, verl's default)"})
    offload_optimizer: bool = field(default=False, metadata={
        "help": "optimizer state (fp32 master, moments) lives in CPU memory and steps there (ZeRO-Offload)"})
    offload_params: bool = field(default=False, metadata={
        "help": "parameters live in CPU memory and are fetched per layer (ZeRO-3 offload_param; stage 3 only)"})
    idle_offload: bool = field(default=False, metadata={
        "help": "the trainer's states leave the GPU while vLLM generates (verl's fsdp_config param_offload and "
                "optimizer_offload): colocated only"})
    micro_batch: int = field(default=1, metadata={"help": "sequences per device in one forward/backward"})
    log_prob_micro_batch: int = field(default=0, metadata={
        "help": "sequences per device in one forward of the log-prob passes before the update (verl's old and "
                "reference log-probs, log_prob_micro_batch_size_per_gpu), without gradients; 0: none larger than "
                "the update's"})
    seq_len: int = field(default=2048, metadata={"help": "prompt + response tokens of one sequence at most"})
    remove_padding: bool = field(default=False, metadata={
        "help": "a micro-batch packs only its sequences' real tokens (verl's use_remove_padding); False: each "
                "sequence is padded to seq_len"})
    mean_seq_len: float = field(default=0.0, metadata={
        "help": "mean prompt + response tokens of a sequence, where the trace or log records them (packed "
                "micro-batches are sized from it); 0: unknown, every sequence counts seq_len (an upper bound)"})
    token_budget: int = field(default=0, metadata={
        "help": "the update's tokens per micro-batch per device with dynamic batching (verl's use_dynamic_bsz, "
                "ppo_max_token_len_per_gpu); 0: micro_batch sequences"})
    log_prob_token_budget: int = field(default=0, metadata={
        "help": "the log-prob passes' tokens per micro-batch per device with dynamic batching (verl's "
                "log_prob_use_dynamic_bsz, log_prob_max_token_len_per_gpu); 0: log_prob_micro_batch sequences"})
    gradient_checkpointing: bool = field(default=True, metadata={
        "help": "recompute each layer in the backward pass (keeps only each layer's input)"})
    reference: bool = field(default=False, metadata={"help": "a frozen reference model for a KL term (GRPO, PPO)"})
    reference_offload: bool = field(default=False, metadata={"help": "the reference model's parameters live on CPU"})
    critic: bool = field(default=False, metadata={"help": "a trained critic of the same shape (PPO with GAE)"})
    colocated: bool = field(default=True, metadata={
        "help": "generation and training share the devices (verl's hybrid engine); False: separate devices"})


def zero_model_states_bytes(params: float, largest_layer_params: float, stage: int, gpus: int,
                            offload_optimizer: bool = False, offload_params: bool = False) -> float:
    """GPU bytes of parameters, gradients and Adam state per device (DeepSpeed's accounting: fp16/bf16 params 2,
    fp16 grads 2, fp32 params 4 + fp32 grads 4 + momentum 4 + variance 4 per parameter).

    stage 3 (deepspeed/runtime/zero/stage3.py `estimate_zero3_model_states_mem_needs`): 4 x largest layer (its
    gathered 16-bit params and grads) + 18 x params / gpus; offload_optimizer: + 2 x params / gpus only; offload
    both: the largest layer only. stage 2 (stage_1_and_2.py `estimate_zero2_model_states_mem_needs`, as DeepSpeed
    PR #5099 set it: the 16-bit gradients partitioned): 2 x params + 18 x params / gpus; offload_optimizer: 2 x
    params. stage 1 (optimizer state sharded, 16-bit grads whole, as in
    Rajbhandari et al. 2020, "ZeRO", P_os): 4 x params + 16 x params / gpus. stage 0 (replicated): 20 x params."""
    n = max(gpus, 1)
    if stage >= 3:
        layer = 4 * largest_layer_params
        if offload_optimizer and offload_params:
            return layer
        return layer + int((2 if offload_optimizer else 18) * params / n)
    if offload_optimizer:
        return 2 * params
    if stage == 2:
        return 2 * params + int(18 * params / n)
    if stage == 1:
        return 4 * params + int(16 * params / n)
    return 20 * params


def zero_host_bytes(params: float, largest_layer_params: float, stage: int, gpus_per_node: int, nodes: int,
                    offload_optimizer: bool = False, offload_params: bool = False,
                    buffer_factor: float = 1.5) -> float:
    """CPU bytes per machine, as DeepSpeed's estimators give them (zero_init on, additional_buffer_factor 1.5):
    stage 3 offload both 18 x params / nodes, offload optimizer 16 x params / nodes, none 4 x largest layer x
    gpus per node; stages 1-2 offload max(4 x gpus, 16) x params, none 4 x params x gpus per node (the fp32 model
    each process builds before sharding). Times the buffer factor."""
    if stage >= 3:
        if offload_optimizer:
            return params * (18 if offload_params else 16) / max(nodes, 1) * buffer_factor
        return largest_layer_params * 4 * gpus_per_node * buffer_factor
    if offload_optimizer:
        return params * max(4 * gpus_per_node * max(nodes, 1), 16) * buffer_factor
    return params * 4 * gpus_per_node * buffer_factor


def activation_bytes_per_token_layer(model: ModelShape) -> float:
    """bf16 activation bytes one token keeps per layer for the backward pass (Korthikanti et al. 2022, section 4.1,
    34 x hidden without parallelism, rederived for these models): attention input, Q, K and V (GQA: K and V have
    KV heads x head dim), attention output (2 x 2h + 2 x 2 kv_dim + 2h: FlashAttention keeps no s x s matrix); the
    gated MLP's input, gate and up outputs and activated product (2h + 3 x 2 x intermediate); two RMSNorm inputs
    (2 x 2h); no dropout masks (these models train with dropout 0). Llama-3.1-8B: exactly 34 x hidden."""
    kv_dim = model.kv_heads * model.head_dim
    return 12.0 * model.hidden + 4.0 * kv_dim + 6.0 * model.intermediate


def micro_batch_tokens(train: TrainSetup, sequences: int, budget: int = 0) -> float:
    """Tokens one micro-batch of `sequences` sequences (or, with dynamic batching, of `budget` tokens) puts through
    the model on one device, as verl's dp_actor `_forward_micro_batch` builds it (docs/simulator.md, "Memory").
    Padded: sequences x seq_len (every sequence padded to the longest prompt + response). Packed (use_remove_padding:
    `unpad_input` keeps the real tokens): a worst micro-batch of one full-length sequence and the others at the mean,
    (sequences - 1) x mean + seq_len, at most the padded count; without a recorded mean the padded count, an upper
    bound. Dynamic batching packed: the budget (verl's `rearrange_micro_batches` splits the real tokens into
    ceil(total / budget) balanced micro-batches); padded: budget / mean sequences (budget / seq_len without a mean)
    of seq_len each."""
    s, mean = train.seq_len, min(train.mean_seq_len, train.seq_len)
    if budget and train.remove_padding:
        return float(budget)
    if budget:
        return max(1, budget // max(mean or s, 1)) * float(s)
    if train.remove_padding and mean > 0:
        return min(sequences * float(s), (sequences - 1) * mean + s)
    return sequences * float(s)


def update_tokens(train: TrainSetup) -> float:
    """Tokens of one micro-batch of the update (forward and backward)."""
    return micro_batch_tokens(train, train.micro_batch, train.token_budget)


def log_prob_tokens(train: TrainSetup) -> float:
    """Tokens of one micro-batch of the log-prob passes (no-grad forward)."""
    return micro_batch_tokens(train, train.log_prob_micro_batch, train.log_prob_token_budget)


def training_activation_bytes(model: ModelShape, train: TrainSetup) -> float:
    """Activations of one micro-batch on one device, tokens = update_tokens. Without checkpointing every layer's
    (activation_bytes_per_token_layer x layers); with full recomputation each layer keeps only its bf16 input
    (2 x hidden) and one layer is recomputed at a time (Korthikanti et al. 2022, section 5)."""
    tokens = update_tokens(train)
    per_layer = activation_bytes_per_token_layer(model)
    if train.gradient_checkpointing:
        return tokens * (2.0 * model.hidden * model.layers + per_layer)
    return tokens * per_layer * model.layers


def logits_bytes(model: ModelShape, train: TrainSetup) -> float:
    """The output layer's logits for the loss: 4 x tokens x vocab (Korthikanti et al. 2022, section 4.3, 4sbv; in
    verl the lm_head's bf16 logits and the bf16 softmax its entropy takes of them, 2 + 2 bytes, docs/simulator.md
    "Memory"). For RL the log-probabilities of every response token need them."""
    return 4.0 * update_tokens(train) * model.vocab


def log_prob_pass_bytes(model: ModelShape, train: TrainSetup) -> float:
    """The peak of one micro-batch of a log-prob pass, tokens = log_prob_tokens (verl's `compute_log_prob` and
    `compute_ref_log_prob`, verl/workers/fsdp_workers.py, run the actor's and the reference's forward under no_grad
    in micro-batches of rollout.log_prob_micro_batch_size_per_gpu and ref.log_prob_micro_batch_size_per_gpu, or of
    log_prob_max_token_len_per_gpu tokens). Without a backward no layer keeps its activations: one layer's working
    set is alive at a time, at most what it keeps for a backward (activation_bytes_per_token_layer), plus the
    logits the log-probabilities are taken from (4 x tokens x vocab, as logits_bytes)."""
    return log_prob_tokens(train) * (activation_bytes_per_token_layer(model) + 4.0 * model.vocab)


def log_prob_excess_bytes(model: ModelShape, train: TrainSetup) -> float:
    """What the log-prob pass needs beyond the update's activations and logits (the passes run one after the other
    on the same resident states, so the training phase peaks at the larger): max(0, pass - update)."""
    return max(0.0, log_prob_pass_bytes(model, train) - training_activation_bytes(model, train)
               - logits_bytes(model, train))


def reference_bytes(model: ModelShape, train: TrainSetup) -> float:
    """The frozen reference model's bf16 parameters on one device: sharded like the actor's (2 x params / gpus at
    stage 3, plus its gathered largest layer; whole below stage 3); none when offloaded to CPU."""
    if not train.reference or train.reference_offload:
        return 0.0
    if train.zero_stage >= 3:
        return 2 * model.params / max(train.gpus, 1) + 2 * model.largest_layer_params
    return 2 * model.params


# ---------------------------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryTerm:
    """One term of a phase's memory on one device."""

    name: str = field(metadata={"help": "what holds the memory"})
    phase: str = field(metadata={"help": "generation | training: the phase whose peak it counts in"})
    gb: float | None = field(metadata={"help": "GiB on one device (None: unknown, the model's layer shapes are not)"})
    source: str = field(default="", metadata={"help": "the formula's source (docs/simulator.md, Memory)"})


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory per device for a configuration, and whether it fits."""

    generation_gb: float | None = field(metadata={
        "help": "GiB on a device while vLLM generates: its weights, activation peak and KV pool, plus what the "
                "trainer leaves resident when colocated (None: unknown)"})
    training_gb: float | None = field(metadata={
        "help": "GiB on a device while the trainer updates: model states, activations, logits, reference and critic"})
    per_device_gb: float | None = field(metadata={
        "help": "the larger of the two phases: colocated they share a device and never peak together; split, each "
                "device holds one phase and the larger one decides"})
    limit_gb: float = field(metadata={"help": "the device's memory as CUDA reports it, GiB"})
    fits: bool | None = field(metadata={
        "help": "every phase fits its device (None: unknown terms leave it undecided; False is certain whenever the "
                "known terms alone overflow)"})
    overflow: str = field(default="", metadata={"help": "the phase and its largest term when it does not fit"})
    fixes: tuple[str, ...] = field(default=(), metadata={
        "help": "single changes that make it fit, the least disruptive first (micro-batch, checkpointing, TP, "
                "sharding, offload, more GPUs)"})
    kv_capacity_tokens: int | None = field(default=None, metadata={
        "help": "tokens vLLM's KV pool holds per engine (its 'GPU KV cache size')"})
    kv_demand_tokens: int | None = field(default=None, metadata={
        "help": "KV tokens the step's concurrency needs per engine at the longest sequences; above the capacity vLLM "
                "queues (preempts) sequences rather than failing"})
    terms: tuple[MemoryTerm, ...] = field(default=(), metadata={"help": "every term, by phase"})
    colocated: bool = field(default=True, metadata={"help": "generation and training share the devices"})

    @property
    def fix(self) -> str:
        """The least disruptive single change that fits ('' when it fits or none does)."""
        return self.fixes[0] if self.fixes else ""

    def to_dict(self) -> dict[str, Any]:
        """The `memory` JSON object: the five keys of the answer, then the details."""
        def r(x):
            return None if x is None else round(float(x), 2)
        return {"generation_gb": r(self.generation_gb), "training_gb": r(self.training_gb),
                "per_device_gb": r(self.per_device_gb), "limit_gb": r(self.limit_gb), "fits": self.fits,
                "overflow": self.overflow or None, "fix": self.fix or None, "fixes": list(self.fixes),
                "kv_capacity_tokens": self.kv_capacity_tokens, "kv_demand_tokens": self.kv_demand_tokens,
                "colocated": self.colocated,
                "terms": [{"name": t.name, "phase": t.phase, "gb": r(t.gb)} for t in self.terms]}


def usable_memory_gb(device_memory_gb: float) -> float:
    """What CUDA reports of a device's nominal memory (a profile's `memory_gb`), GiB: the driver keeps the rest."""
    return device_memory_gb * (1.0 - DRIVER_RESERVED)


def _gib(x: float | None) -> float | None:
    return None if x is None else x / GIB


def _states(model: ModelShape, train: TrainSetup) -> float:
    return zero_model_states_bytes(model.params, model.largest_layer_params, train.zero_stage, train.gpus,
                                   train.offload_optimizer, train.offload_params and train.zero_stage >= 3)


def _generation_terms(model: ModelShape, gen: GenSetup, train: TrainSetup, limit: float) -> list[MemoryTerm]:
    full = model.full
    pool = vllm_kv_pool_bytes(model, gen, limit) if full or gen.kv_cache_gb > 0 else None
    g = "generation"
    terms = [MemoryTerm("vLLM weights", g, _gib(vllm_weight_bytes(model, gen.tp, gen.weight_bytes)),
                        "params x bytes / TP"),
             MemoryTerm("vLLM activation peak", g, _gib(vllm_activation_bytes(model, gen)) if full else None,
                        "max_num_batched_tokens x (3 I / TP + 3 H) x 2"),
             MemoryTerm("vLLM non-torch", g, gen.non_torch_gb, "NCCL, cuBLAS"),
             MemoryTerm("vLLM CUDA graphs", g, gen.cuda_graph_gb, "vLLM's estimate"),
             MemoryTerm("KV-cache pool", g, None if pool is None else max(pool, 0.0) / GIB,
                        "ceil(total x utilization) - the above")]
    if train.colocated:  # what the trainer leaves on the device while vLLM runs
        resident = 0.0 if train.idle_offload else _states(model, train) * (2 if train.critic else 1)
        terms += [MemoryTerm("trainer states (resident)", g, _gib(resident), "ZeRO model states, unless offloaded"),
                  MemoryTerm("reference (resident)", g, _gib(reference_bytes(model, train)), "2 x params / gpus")]
    return [t for t in terms if t.gb != 0.0]


def _training_terms(model: ModelShape, train: TrainSetup) -> list[MemoryTerm]:
    full, t = model.full, "training"
    stage = f"ZeRO-{train.zero_stage}" + (" + offload" if train.offload_optimizer else "")
    terms = [MemoryTerm(f"actor params, grads, Adam ({stage})", t, _gib(_states(model, train)), "DeepSpeed estimator"),
             MemoryTerm("actor activations", t, _gib(training_activation_bytes(model, train)) if full else None,
                        "Korthikanti et al. 2022"),
             MemoryTerm("logits (fp32)", t, _gib(logits_bytes(model, train)) if full else None, "4 x tokens x vocab"),
             MemoryTerm("log-prob pass beyond the update (no grad)", t,
                        (_gib(log_prob_excess_bytes(model, train)) if full else None)
                        if log_prob_tokens(train) > update_tokens(train) else 0.0,
                        "max(0, log-prob tokens x (per-layer + 4 V) - the update's activations and logits)"),
             MemoryTerm("reference params", t, _gib(reference_bytes(model, train)), "2 x params / gpus")]
    if train.critic:
        terms.append(MemoryTerm(f"critic params, grads, Adam ({stage})", t, _gib(_states(model, train)),
                                "DeepSpeed estimator"))
    return [x for x in terms if x.gb != 0.0]


def _total(terms: list[MemoryTerm]) -> tuple[float, bool]:
    """The known terms' sum and whether every term is known."""
    return sum(t.gb for t in terms if t.gb is not None), all(t.gb is not None for t in terms)


def _core(model: ModelShape, gen: GenSetup, train: TrainSetup, limit: float) -> MemoryEstimate:
    """The estimate without its fixes."""
    gen_terms, train_terms = _generation_terms(model, gen, train, limit), _training_terms(model, train)
    if train.colocated and not gen.sleeps:  # the engine's weights and pool stay on the device while it trains
        kept = [x for x in gen_terms if x.name in ("vLLM weights", "KV-cache pool")]
        train_terms += [MemoryTerm(f"{x.name} (resident)", "training", x.gb, "the engine does not sleep") for x in kept]
    (g, g_known), (t, t_known) = _total(gen_terms), _total(train_terms)
    cap = vllm_kv_capacity_tokens(model, gen, limit) if model.full else None
    demand = None
    if gen.seq_len > 0 and model.full:
        demand = (gen.concurrency or gen.max_num_seqs) * math.ceil(gen.seq_len / gen.block_size) * gen.block_size
    overflow = ""
    if g > limit or t > limit:
        phase, terms, total = ("generation", gen_terms, g) if g - limit >= t - limit else ("training", train_terms, t)
        big = max((x for x in terms if x.gb is not None), key=lambda x: x.gb)
        known = g_known if phase == "generation" else t_known
        overflow = (f"{phase} needs {'' if known else 'at least '}{total:.1f} of {limit:.1f} GiB; its largest term: "
                    f"{big.name} {big.gb:.1f} GiB")
    elif model.full and vllm_kv_pool_bytes(model, gen, limit) <= 0:
        overflow = ("generation: vLLM's weights and activation peak exceed gpu_memory_utilization x memory "
                    f"({gen.gpu_memory_utilization:g} x {limit:.1f} GiB): no room for a KV cache")
    elif cap is not None and gen.seq_len > cap:
        overflow = (f"generation: vLLM's KV pool holds {cap} tokens, fewer than one {gen.seq_len}-token sequence "
                    "(vLLM refuses to start)")
    fits = False if overflow else (True if g_known and t_known else None)
    per_device = max(g, t) if g_known and t_known else None
    return MemoryEstimate(g if g_known else None, t if t_known else None, per_device, limit, fits, overflow, (),
                          cap, demand, tuple(gen_terms + train_terms), train.colocated)


def _candidates(model: ModelShape, gen: GenSetup, train: TrainSetup) -> list[tuple[str, GenSetup, TrainSetup]]:
    """Single changes to try, the least disruptive first: a smaller micro-batch (the update's, the log-prob passes'),
    checkpointing, more tensor parallelism for vLLM, full sharding, idle offload, a smaller vLLM share, optimizer
    then parameter offload, more GPUs."""
    out = []
    m = train.micro_batch // 2
    while m >= 1:
        out.append((f"micro-batch {m} per device (from {train.micro_batch})", gen, replace(train, micro_batch=m)))
        m //= 2
    m = train.log_prob_micro_batch // 2
    while m >= max(train.micro_batch, 1):  # at the update's micro-batch the pass needs nothing beyond it
        out.append((f"log-prob micro-batch {m} per device (from {train.log_prob_micro_batch})", gen,
                    replace(train, log_prob_micro_batch=m)))
        m //= 2
    for key, label in (("token_budget", "ppo_max_token_len_per_gpu"),
                       ("log_prob_token_budget", "log_prob_max_token_len_per_gpu")):
        budget = getattr(train, key)
        b = budget // 2
        while b >= train.seq_len:  # verl requires a budget of at least the longest sequence
            out.append((f"{label} {b} (from {budget})", gen, replace(train, **{key: b})))
            b //= 2
    if not train.gradient_checkpointing:
        out.append(("gradient checkpointing on", gen, replace(train, gradient_checkpointing=True)))
    tp = gen.tp * 2
    while tp <= min(8, train.gpus if train.colocated else 8) and model.heads and model.heads % tp == 0:
        out.append((f"vLLM tensor parallel {tp} (from {gen.tp})", replace(gen, tp=tp), train))
        tp *= 2
    if train.zero_stage < 3:
        out.append((f"full sharding (FSDP FULL_SHARD / ZeRO-3, from stage {train.zero_stage})", gen,
                    replace(train, zero_stage=3)))
    if train.colocated and not train.idle_offload:
        out.append(("offload the trainer's states while vLLM generates (verl param_offload + optimizer_offload)",
                    gen, replace(train, idle_offload=True)))
    for u in (0.8, 0.7, 0.6, 0.5, 0.4, 0.3):
        if u < gen.gpu_memory_utilization and train.colocated:
            out.append((f"gpu_memory_utilization {u:g} (from {gen.gpu_memory_utilization:g})",
                        replace(gen, gpu_memory_utilization=u), train))
    if not train.offload_optimizer:
        out.append(("offload the optimizer state to CPU", gen, replace(train, offload_optimizer=True)))
    if train.zero_stage >= 3 and not train.offload_params:
        out.append(("offload optimizer and parameters to CPU (ZeRO-3)", gen,
                    replace(train, offload_optimizer=True, offload_params=True)))
    if train.zero_stage >= 1:
        out += [(f"{train.gpus * k} GPUs (from {train.gpus})", gen, replace(train, gpus=train.gpus * k))
                for k in (2, 4, 8, 16)]
    return out


def estimate_memory(model: ModelShape, gen: GenSetup, train: TrainSetup, device_memory_gb: float) -> MemoryEstimate:
    """Memory per device for `model` generated by vLLM as `gen` and trained as `train` on devices of
    `device_memory_gb` nominal memory (a device profile's memory_gb); when it does not fit, the single changes
    that would, the least disruptive first."""
    if device_memory_gb <= 0:
        raise RlsimError(f"device memory must be positive, got {device_memory_gb!r} GB")
    if not 0 < gen.gpu_memory_utilization <= 1:
        raise RlsimError(f"gpu_memory_utilization must be in (0, 1], got {gen.gpu_memory_utilization!r}")
    for obj in (gen, train):
        for f in fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise RlsimError(f"{f.name} must not be negative, got {v}")
    limit = usable_memory_gb(device_memory_gb)
    est = _core(model, gen, train, limit)
    if est.fits is not False:
        return est
    fixes = tuple(label for label, g, t in _candidates(model, gen, train) if _core(model, g, t, limit).fits)
    return replace(est, fixes=_first_per_kind(fixes))


def _first_per_kind(fixes: tuple[str, ...]) -> tuple[str, ...]:
    """One fix per kind of change: the largest micro-batch, the fewest GPUs, the largest vLLM share that fit."""
    seen, out = set(), []
    for f in fixes:
        kind = re.sub(r"[\d.]+", "#", f.split(" (from")[0])
        if kind not in seen:
            seen.add(kind)
            out.append(f)
    return tuple(out)


def _dig(cfg: dict[str, Any], dotted: str, default: Any = None, _seen: tuple[str, ...] = ()) -> Any:
    """The value at a dotted path; a Hydra interpolation `${a.b}` (a saved .hydra/config.yaml keeps them
    unresolved) is read at the path it names."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return default
        node = node[part]
    ref = re.fullmatch(r"\$\{([\w.]+)\}", node) if isinstance(node, str) else None
    if ref and ref.group(1) not in _seen:
        return _dig(cfg, ref.group(1), default, _seen + (dotted,))
    return node


def _verl_micro(cfg: dict[str, Any], section: str, key: str, dynamic: tuple[str, str], dp: int, seq: int) -> int:
    """Sequences per device in one micro-batch of a verl pass: `key`_per_gpu, else verl 0.1's global `key` divided
    over the data-parallel ranks (devices / Ulysses sequence parallel size, as verl's workers normalize it), else
    with dynamic batching the token budget over the longest sequence; 0 when none is set."""
    budget = _verl_budget(cfg, section, dynamic)
    if budget:
        return max(1, budget // max(seq, 1))
    per_gpu = _dig(cfg, f"{section}.{key}_per_gpu")
    if per_gpu is not None:
        return int(per_gpu)
    whole = _dig(cfg, f"{section}.{key}")
    return max(1, int(whole) // max(dp, 1)) if whole is not None else 0


def _verl_budget(cfg: dict[str, Any], section: str, dynamic: tuple[str, str]) -> int:
    """Tokens per micro-batch per device of a verl pass with dynamic batching (its max_token_len_per_gpu; verl
    scales it by the Ulysses size and splits each sequence over those ranks, so per device it stays; unset or an
    unresolved `${oc.select:...}`: verl's default 16384, verl/trainer/config/actor/actor.yaml); 0 without."""
    if not _dig(cfg, f"{section}.{dynamic[0]}", False):
        return 0
    value = _dig(cfg, f"{section}.{dynamic[1]}", 16384)
    return int(value) if str(value).isdigit() else 16384


def setups_from_verl(cfg: dict[str, Any], gpus: int | None = None,
                     mean_len: float = 0.0) -> tuple[GenSetup, TrainSetup]:
    """The setups a verl run's saved Hydra config (.hydra/config.yaml, as a dict) describes: its rollout engine
    arguments (actor_rollout_ref.rollout.*), the batch one engine holds (data.train_batch_size x rollout.n over the
    gpus / TP engines), the FSDP actor (strategy, fsdp_config offload, ppo_micro_batch_size_per_gpu or verl 0.1's
    global ppo_micro_batch_size, gradient checkpointing), the log-prob passes' micro-batch (rollout's and, with a
    reference, ref's log_prob_micro_batch_size[_per_gpu]: the larger), the reference model (use_kl_loss or
    use_kl_in_reward), the critic (adv_estimator gae), and how micro-batches are sized (model.use_remove_padding;
    use_dynamic_bsz and the token budgets; `mean_len`, the recorded mean prompt + response tokens, 0 if none)."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    n = gpus or int(_dig(cfg, "trainer.n_gpus_per_node", 1)) * int(_dig(cfg, "trainer.nnodes", 1))
    tp = min(int(_dig(cfg, f"{r}.tensor_model_parallel_size", 1)), n)  # an engine spans at most the devices there are
    seq = (int(_dig(cfg, f"{r}.prompt_length", _dig(cfg, "data.max_prompt_length", 0)))
           + int(_dig(cfg, f"{r}.response_length", _dig(cfg, "data.max_response_length", 0))))
    max_seqs = int(_dig(cfg, f"{r}.max_num_seqs", 256))
    batch = int(_dig(cfg, "data.train_batch_size", 0)) * int(_dig(cfg, f"{r}.n", 1))
    engines = max(1, n // max(tp, 1))
    gen = GenSetup(tp=tp, gpu_memory_utilization=float(_dig(cfg, f"{r}.gpu_memory_utilization", 0.5)),
                   max_num_batched_tokens=int(_dig(cfg, f"{r}.max_num_batched_tokens", 8192)), max_num_seqs=max_seqs,
                   concurrency=min(max_seqs, math.ceil(batch / engines)) if batch else 0, seq_len=seq)
    dp = max(1, n // int(_dig(cfg, f"{a}.ulysses_sequence_parallel_size", 1)))
    micro = _verl_micro(cfg, a, "ppo_micro_batch_size", ("use_dynamic_bsz", "ppo_max_token_len_per_gpu"), dp, seq)
    if not micro:  # neither set: the token budget's default over the longest sequence
        micro = max(1, int(_dig(cfg, f"{a}.ppo_max_token_len_per_gpu", seq or 1)) // max(seq, 1))
    reference = bool(_dig(cfg, f"{a}.use_kl_loss", False) or _dig(cfg, "algorithm.use_kl_in_reward", False))
    lp = ("log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu")
    roles = (r, "actor_rollout_ref.ref")[:2 if reference else 1]
    log_prob = max(_verl_micro(cfg, s, "log_prob_micro_batch_size", lp, dp, seq) for s in roles)
    log_prob_budget = max(_verl_budget(cfg, s, lp) for s in roles)
    off = f"{a}.fsdp_config"
    train = TrainSetup(
        gpus=n, gpus_per_node=int(_dig(cfg, "trainer.n_gpus_per_node", n)),
        zero_stage=1 if str(_dig(cfg, f"{a}.strategy", "fsdp")).startswith("megatron") else 3,
        idle_offload=bool(_dig(cfg, f"{off}.param_offload", False) and _dig(cfg, f"{off}.optimizer_offload", False)),
        micro_batch=int(micro), log_prob_micro_batch=log_prob, seq_len=seq or 2048,
        remove_padding=bool(_dig(cfg, "actor_rollout_ref.model.use_remove_padding", False)), mean_seq_len=mean_len,
        token_budget=_verl_budget(cfg, a, ("use_dynamic_bsz", "ppo_max_token_len_per_gpu")),
        log_prob_token_budget=log_prob_budget,
        gradient_checkpointing=bool(_dig(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", False)),
        reference=reference,
        reference_offload=bool(_dig(cfg, "actor_rollout_ref.ref.fsdp_config.param_offload", False)),
        critic=str(_dig(cfg, "algorithm.adv_estimator", "")) == "gae",
        colocated=bool(_dig(cfg, "actor_rollout_ref.hybrid_engine", True)))
    return gen, train
