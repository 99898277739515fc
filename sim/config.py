"""Configurations of the simulator: one frozen dataclass per concern, help text on every field.

- `WhatIf`: what a user asks `rlsim run` (and, as lists, `rlsim sweep`) for: every option one field.
  None means "as in the reference trace".
- `EngineConfig`: the generation engine (continuous batching limits).
- `SimConfig`: one fully resolved simulation (what `sim.pipeline.simulate` takes).

Derived values (B = P x G, whether the KV cache can bind) are properties here and only here. No I/O
at construction; `validate()` raises `RlsimError` naming the fix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from rlsim.replay.errors import RlsimError
from rlsim.replay.util import ENGINE_DEFAULTS

LR_RULES = ("sqrt", "linear", "fixed")
LENGTHS = ("sampled", "recorded")


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


def help_text(cls) -> dict[str, str]:
    """Field name -> help text (for CLIs and docs)."""
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}


@dataclass(frozen=True)
class WhatIf:
    """One candidate configuration; None fields take the reference trace's value."""

    prompts: int | None = _f(None, "P: prompts per optimizer update (None: the trace's)")
    group: int | None = _f(None, "G: responses per prompt (None: the trace's; PPO uses 1)")
    lr_rule: str | None = _f(None, "learning-rate rule: sqrt | linear | fixed (None: the trace's)")
    updates: int = _f(100, "optimizer updates to simulate (steady-state throughput is their mean)")
    seed: int = _f(0, "seed of the numpy Generator that samples response lengths")
    max_num_seqs: int | None = _f(None, "engine max_num_seqs: sequences decoded concurrently (None: the trace's)")
    kv_cache_tokens: int | None = _f(None, "engine KV-cache capacity in tokens (None: the trace's)")
    device: str | None = _f(None, "named device profile to predict for, e.g. h200 (rlsim.replay.devices; None: the trace's "
                                   "own hardware); costs move by the roofline rule and the notes say which")
    gpus: int | None = _f(None, "devices of that profile (None: as many as recorded)")
    gen_batch: int | None = _f(None, "responses generated per update, B_gen >= B = P x G; the first G of each prompt to "
                                     "finish are trained on (None: the trace's over-generation ratio B_gen / B)")

    def validate(self) -> None:
        for name in ("prompts", "group", "max_num_seqs", "kv_cache_tokens", "gen_batch", "gpus"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                flag = {"prompts": "--batch"}.get(name, "--" + name.replace("_", "-"))
                raise RlsimError(f"{flag} must be a positive integer, got {v!r}")
        if self.lr_rule is not None and self.lr_rule not in LR_RULES:
            raise RlsimError(f"--lr-rule must be one of {', '.join(LR_RULES)}, got {self.lr_rule!r}")
        if not isinstance(self.updates, int) or self.updates <= 0:
            raise RlsimError(f"--updates must be a positive integer, got {self.updates!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise RlsimError(f"--seed must be a non-negative integer, got {self.seed!r}")


@dataclass(frozen=True)
class EngineConfig:
    """The generation engine's continuous-batching limits (vLLM-like)."""

    max_num_seqs: int = _f(ENGINE_DEFAULTS["max_num_seqs"], "sequences decoded concurrently at most")
    kv_cache_tokens: int = _f(ENGINE_DEFAULTS["kv_cache_tokens"], "KV-cache capacity in tokens")
    block_size: int = _f(ENGINE_DEFAULTS["block_size"], "KV-cache block size in tokens (allocation granularity)")
    max_model_len: int = _f(ENGINE_DEFAULTS["max_model_len"], "longest prompt + response the engine accepts")

    @property
    def kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    def kv_can_bind(self, max_context: int) -> bool:
        """Whether max_num_seqs sequences of `max_context` tokens could exceed the KV cache."""
        return self.max_num_seqs * math.ceil(max_context / self.block_size) > self.kv_blocks

    def validate(self) -> None:
        for f_ in fields(self):
            if getattr(self, f_.name) <= 0:
                raise RlsimError(f"engine {f_.name} must be positive, got {getattr(self, f_.name)}")


@dataclass(frozen=True)
class SimConfig:
    """One resolved simulation of the synchronous colocated RL loop.

    Each update: one generation round of B = P x G requests on the engine (continuous batching),
    then rewards, batch preparation, the optimizer update, the weight sync and the rest of the step.
    Split devices and staleness are later additions: a different driver in `sim.pipeline`.
    """

    prompts: int = _f(128, "P: prompts per update")
    group: int = _f(8, "G: responses per prompt")
    updates: int = _f(100, "updates to simulate")
    engine: EngineConfig = _f(EngineConfig(), "generation engine limits")
    gen_batch: int = _f(0, "requests generated per round (B_gen >= B; 0: = B); the first G responses of each prompt to finish are trained on")
    lengths: str = _f("sampled", "sampled: draw lengths from the fitted distribution; recorded: replay the trace's responses step by step")
    exact_engine: bool = _f(False, "always run the step-level engine loop (with KV accounting and preemption) instead of the exact fast path")

    @property
    def batch(self) -> int:
        """B = P x G responses per update."""
        return self.prompts * self.group

    @property
    def gen_requests(self) -> int:
        """B_gen: requests per generation round."""
        return max(self.gen_batch, self.batch)

    def validate(self) -> None:
        if self.gen_batch and self.gen_batch < self.batch:
            raise RlsimError(f"--gen-batch {self.gen_batch} is smaller than the train batch B = P x G = {self.batch}")
        if self.prompts <= 0 or self.group <= 0 or self.updates <= 0:
            raise RlsimError(f"prompts, group and updates must be positive, got {self.prompts}, {self.group}, {self.updates}")
        if self.lengths not in LENGTHS:
            raise RlsimError(f"lengths must be one of {', '.join(LENGTHS)}, got {self.lengths!r}")
        self.engine.validate()
