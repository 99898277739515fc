"""A vLLM engine driven one `step()` at a time, so every engine step is timed with its batch composition.

- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), built with `enforce_eager=True`
  and `disable_log_stats=True` (request timing is taken here; under cProfile vLLM's own stats took ~5%
  of a 1024-sequence generation on CPU).
- A GRPO group is one request with `n = G` (vLLM parallel sampling): the prompt goes through input
  processing once and the G children are scheduled and decoded as independent sequences (each computes
  its prompt's KV unless the prefix cache holds it). On CPU an engine step is dominated by per-request
  Python work, so this and a `max_num_seqs` that holds the whole batch shorten generation (in-process
  A/B, P=128, G=8: max_num_seqs 1024 vs 256 2.0 vs 2.4 s; n=G vs G requests 5-20 % less; noisy machine;
  end to end: `bench/runner_vs_trl.py --rlrun-args '--max-num-seqs 256'`).
- Prompts are given as token ids made by the trainer's tokenizer, so the policy gradient is computed on
  exactly the contexts the engine saw.
- Batch composition per step comes from the scheduler's own output (wrapped `Scheduler.schedule`):
  sequences scheduled, prompt tokens computed (prefill), generated tokens fed (decode), and the KV
  length attended (context). Nothing here is CPU-specific: on CUDA the same calls apply.
- Weight sync: `collective_rpc("reload_weights", weights_iterator=...)`, then the prefix cache is reset
  (cached prompt KV was computed by the old weights).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

GiB = 1 << 30


@dataclass
class StepStats:
    t_start: float
    duration: float
    num_running: int
    num_waiting: int
    prefill_tokens: int
    decode_tokens: int
    context_tokens: int
    kv_usage: float
    finished: int


@dataclass
class Completion:
    tag: Any
    prompt_ids: list[int]
    index: int = 0  # sample index within its prompt's request (0..n-1)
    token_ids: list[int] = field(default_factory=list)
    t_queued: float = 0.0
    t_first_token: float | None = None
    t_finished: float | None = None
    finish_reason: str | None = None


def resolve_dtype(dtype: str) -> str:
    import torch

    if dtype != "auto":
        return dtype
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


class Engine:
    """Owns one `vllm.LLM`; `generate()` runs requests to completion step by step."""

    def __init__(self, model_dir: str, *, max_num_seqs: int, max_model_len: int, kv_cache_gib: float,
                 dtype: str = "auto", seed: int = 0, clock: Callable[[], float] = time.perf_counter):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler must live in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        import vllm

        threads = torch.get_num_threads()
        self.dtype = resolve_dtype(dtype)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(
            model=str(model_dir), dtype=self.dtype, max_model_len=max_model_len, enforce_eager=True,
            max_num_seqs=max_num_seqs, seed=seed, disable_log_stats=True,
            kv_cache_memory_bytes=int(kv_cache_gib * GiB), enable_prefix_caching=True,
        )
        self.start_time_s = time.perf_counter() - t0
        torch.set_num_threads(threads)  # the CPU backend may re-pin OpenMP threads; keep the trainer's
        self.clock = clock
        self.engine = self.llm.llm_engine
        self.core = self.engine.engine_core.engine_core  # in-process EngineCore
        self.scheduler = self.core.scheduler
        self._last: tuple[int, int, int, int] = (0, 0, 0, 0)
        orig = self.scheduler.schedule

        def schedule(*a, **k):
            out = orig(*a, **k)
            pre = dec = ctx = 0
            reqs = self.scheduler.requests
            for rid, n in out.num_scheduled_tokens.items():
                req = reqs.get(rid)
                if req is None:
                    continue
                after = req.num_computed_tokens  # already advanced by this schedule
                before = after - n
                p = max(0, min(req.num_prompt_tokens, after) - before)
                pre += p
                dec += n - p
                ctx += after
            self._last = (len(out.num_scheduled_tokens), pre, dec, ctx)
            return out

        self.scheduler.schedule = schedule
        self._next_id = 0
        cc = self.engine.vllm_config.cache_config
        self.block_size = int(cc.block_size)
        self.kv_cache_tokens = int((cc.num_gpu_blocks or 0) * cc.block_size)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = int(self.engine.vllm_config.scheduler_config.max_num_batched_tokens)
        self.version = vllm.__version__

    def facts(self) -> dict[str, Any]:
        return {"name": "vllm", "version": self.version, "max_num_seqs": self.max_num_seqs,
                "kv_cache_tokens": self.kv_cache_tokens, "block_size": self.block_size,
                "max_model_len": self.max_model_len, "dtype": self.dtype, "start_time_s": self.start_time_s,
                "max_num_batched_tokens": self.max_num_batched_tokens, "prefix_caching": True,
                "enforce_eager": True}

    def sampling(self, max_tokens: int, temperature: float, ignore_eos: bool = False):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=1.0,
                              output_kind=RequestOutputKind.DELTA, detokenize=False, ignore_eos=ignore_eos)

    def generate(self, prompts: list[tuple[Any, list[int], int]], sampling,
                 on_step: Callable[[StepStats], None] | None = None) -> list[Completion]:
        """Run all prompts `(tag, token ids, n)` to completion, n samples each; call `on_step` after
        every engine step. Returns one Completion per sample (tag, index 0..n-1), in finishing order."""
        eng, clock = self.engine, self.clock
        params: dict[int, Any] = {}
        live: dict[tuple[str, int], Completion] = {}
        done: list[Completion] = []
        greedy = not sampling.temperature  # vLLM refuses n > 1 with greedy sampling: n requests then
        for tag, ids, n in prompts:
            t, k = clock(), (1 if greedy else n)  # samples per request
            for first in range(0, n, max(k, 1)):
                rid = f"r{self._next_id}"
                self._next_id += 1
                if k not in params:
                    params[k] = sampling.clone()
                    params[k].n = k
                for i in range(k):
                    live[(rid, i)] = Completion(tag=tag, prompt_ids=list(ids), index=first + i, t_queued=t)
                eng.add_request(rid, {"prompt_token_ids": list(ids)}, params[k])
        while eng.has_unfinished_requests():
            t0 = clock()
            outs = eng.step()
            t1 = clock()
            finished = 0
            for o in outs:
                for seq in o.outputs:  # DELTA: the children that advanced in this step
                    c = live.get((o.request_id, seq.index))
                    if c is None:
                        continue
                    if seq.token_ids:
                        if c.t_first_token is None:
                            c.t_first_token = t1
                        c.token_ids.extend(seq.token_ids)
                    if seq.finish_reason is not None:
                        c.t_finished, c.finish_reason = t1, seq.finish_reason
                        done.append(live.pop((o.request_id, seq.index)))
                        finished += 1
            if on_step is not None:
                n, pre, dec, ctx = self._last
                on_step(StepStats(t_start=t0, duration=t1 - t0, num_running=n,
                                  num_waiting=len(self.scheduler.waiting), prefill_tokens=pre,
                                  decode_tokens=dec, context_tokens=ctx,
                                  kv_usage=float(self.scheduler.kv_cache_manager.usage), finished=finished))
            self._last = (0, 0, 0, 0)
        if live:  # pragma: no cover - the engine reported no output for these
            raise RuntimeError(f"{len(live)} samples never finished in the engine")
        return done

    def sync(self, state_dict: dict[str, Any]) -> int:
        """Load new weights into the engine; returns bytes sent."""
        items = list(state_dict.items())
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        self.engine.reset_prefix_cache()
        return nbytes
