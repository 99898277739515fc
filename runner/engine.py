"""A vLLM engine driven one `step()` at a time, so every engine step is timed with its batch composition.

- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), built with `enforce_eager=True`
  and `disable_log_stats=True` (request timing is taken here; vLLM's own stats cost a share of the
  generation: docs/results.md section 10).
- A GRPO group is one request with `n = G` (vLLM parallel sampling): the prompt goes through input
  processing once and the G children are scheduled and decoded as independent sequences (each computes
  its prompt's KV unless the prefix cache holds it). On CPU an engine step is dominated by per-request
  Python work, so this and a `max_num_seqs` that holds the whole batch shorten generation (the A/B:
  docs/results.md section 10).
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

from rlsim.runner.placement import set_threads

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
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs, one per token (sampling.logprobs set)
    start_version: int = 0  # policy version of the weights its first token was sampled with
    finish_version: int = 0  # ... and its last


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
        set_threads(threads)  # the CPU backend re-binds OpenMP threads; keep the count the process had
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
        self._live: dict[tuple[str, int], Completion] = {}  # (request id, child index) -> its sample
        self._reqs: dict[Any, list[str]] = {}  # tag -> request ids (to abort a prompt's requests)
        self._params: dict[int, tuple[Any, Any]] = {}  # n -> (the caller's SamplingParams, its clone with n)
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

    def sampling(self, max_tokens: int, temperature: float, ignore_eos: bool = False, logprobs: bool = False):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=1.0,
                              output_kind=RequestOutputKind.DELTA, detokenize=False, ignore_eos=ignore_eos,
                              logprobs=0 if logprobs else None)  # 0: only the sampled token's log-prob

    def add(self, tag: Any, ids: list[int], n: int, sampling, *, version: int = 0,
            continuing: list[Completion] | None = None) -> list[Completion]:
        """Queue one prompt for `n` samples (one request with n = G, or n requests when greedy); returns
        their Completions, filled in by `step()`. `continuing`: resume these partial samples (partial rollout
        across a weight sync): one request each with the prompt + the tokens generated so far, for the
        remaining max_tokens, so the engine recomputes their KV on the new weights."""
        t = self.clock()
        if continuing:
            out = []
            for c in continuing:
                rid = f"r{self._next_id}"
                self._next_id += 1
                p = sampling.clone()
                p.n, p.max_tokens = 1, sampling.max_tokens - len(c.token_ids)
                self._live[(rid, 0)] = c
                self._reqs.setdefault(c.tag, []).append(rid)
                self.engine.add_request(rid, {"prompt_token_ids": list(c.prompt_ids) + list(c.token_ids)}, p)
                out.append(c)
            return out
        k = 1 if not sampling.temperature else n  # vLLM refuses n > 1 with greedy sampling: n requests then
        out = []
        for first in range(0, n, max(k, 1)):
            rid = f"r{self._next_id}"
            self._next_id += 1
            if k not in self._params or self._params[k][0] is not sampling:
                p = sampling.clone()
                p.n = k
                self._params[k] = (sampling, p)
            for i in range(k):
                c = Completion(tag=tag, prompt_ids=list(ids), index=first + i, t_queued=t, start_version=version)
                self._live[(rid, i)] = c
                out.append(c)
            self._reqs.setdefault(tag, []).append(rid)
            self.engine.add_request(rid, {"prompt_token_ids": list(ids)}, self._params[k][1])
        return out

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self, version: int = 0) -> tuple[StepStats, list[Completion]]:
        """One engine step: its stats and the samples that finished in it."""
        clock = self.clock
        t0 = clock()
        outs = self.engine.step()
        t1 = clock()
        done: list[Completion] = []
        for o in outs:
            for seq in o.outputs:  # DELTA: the children that advanced in this step
                c = self._live.get((o.request_id, seq.index))
                if c is None:
                    continue
                if seq.token_ids:
                    if c.t_first_token is None:
                        c.t_first_token = t1
                    c.token_ids.extend(seq.token_ids)
                    if seq.logprobs is not None:  # one {token: Logprob} per new token; the sampled one is there
                        c.logprobs.extend(lp[tid].logprob for tid, lp in zip(seq.token_ids, seq.logprobs))
                if seq.finish_reason is not None:
                    c.t_finished, c.finish_reason, c.finish_version = t1, seq.finish_reason, version
                    done.append(self._live.pop((o.request_id, seq.index)))
        n, pre, dec, ctx = self._last
        self._last = (0, 0, 0, 0)
        st = StepStats(t_start=t0, duration=t1 - t0, num_running=n, num_waiting=len(self.scheduler.waiting),
                       prefill_tokens=pre, decode_tokens=dec, context_tokens=ctx,
                       kv_usage=float(self.scheduler.kv_cache_manager.usage), finished=len(done))
        return st, done

    def abort(self, tag: Any) -> list[Completion]:
        """Abort every request of `tag`; returns its unfinished samples (tokens so far kept)."""
        rids = self._reqs.pop(tag, [])
        self.engine.abort_request(rids)
        left = [k for k in self._live if k[0] in set(rids)]
        return [self._live.pop(k) for k in left]

    def in_flight(self) -> list[Any]:
        """Tags with unfinished samples."""
        return sorted({c.tag for c in self._live.values()}, key=str)

    def generate(self, prompts: list[tuple[Any, list[int], int]], sampling,
                 on_step: Callable[[StepStats], None] | None = None) -> list[Completion]:
        """Run all prompts `(tag, token ids, n)` to completion, n samples each; call `on_step` after
        every engine step. Returns one Completion per sample (tag, index 0..n-1), in finishing order."""
        for tag, ids, n in prompts:
            self.add(tag, ids, n, sampling)
        done: list[Completion] = []
        while self.engine.has_unfinished_requests():
            st, fin = self.step()
            done.extend(fin)
            if on_step is not None:
                on_step(st)
        self._reqs.clear()
        if self._live:  # pragma: no cover - the engine reported no output for these
            raise RuntimeError(f"{len(self._live)} samples never finished in the engine")
        return done

    def sync(self, state_dict: dict[str, Any]) -> int:
        """Load new weights into the engine; returns bytes sent."""
        items = list(state_dict.items())
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        self.engine.reset_prefix_cache()
        return nbytes
