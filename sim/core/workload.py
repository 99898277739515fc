"""What a simulation generates: the prompt and response lengths of each round's requests, in queue order.

One sampler for every simulator: the colocated loop draws all its rounds at once or one round at a time
(`rlsim.core.pipeline`), the split loop draws blocks of P prompts (`rlsim.modes.split`). A round is P x G
requests, prompt-major (the G responses of a prompt are adjacent and share its prompt length), then the
over-generated extras (B_gen - B), cycling over the round's prompts. Lengths are either the trace's own
(round u replays recorded update u mod the updates recorded; the extras' lengths are not recorded and are
drawn) or drawn from the fitted distribution with the Generator passed in. Responses are cut so that
prompt + response fits the engine's max_model_len.

Draws: `draw(rng, count)` takes, in this order, the prompt lengths of all `count` rounds, their response
lengths, then their extras; so drawing U rounds at once and drawing them one at a time give different
(equally valid) workloads, and each simulator keeps one way for its numbers to stay put.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlsim.core.config import SimConfig
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels, LengthModel


@dataclass(frozen=True, eq=False)
class Workload:
    """The requests of a simulation's generation rounds (module doc)."""

    prompts: int = field(metadata={"help": "P: prompts per round"})
    group: int = field(metadata={"help": "G: responses per prompt"})
    extra: int = field(metadata={"help": "over-generated requests per round (B_gen - B), lengths drawn"})
    lengths: LengthModel = field(metadata={"help": "the fitted length distribution"})
    recorded: tuple[tuple[np.ndarray, np.ndarray], ...] | None = field(metadata={
        "help": "(prompt, response lengths) of each recorded update, in queue order; None: sampled lengths"})
    max_model_len: int = field(metadata={"help": "longest prompt + response the engine accepts"})

    @classmethod
    def of(cls, models: FittedModels, cfg: SimConfig, *, over_generate: bool = True) -> Workload:
        """The workload `cfg` asks of `models` (`over_generate` False: no extras, B_gen = B)."""
        recorded = None
        if cfg.lengths == "recorded":
            recorded = models.recorded.workload
            if not recorded or any(len(w[1]) == 0 for w in recorded):
                raise RlsimError("the trace's response rows do not cover its updates; replay with sampled lengths")
        extra = max(cfg.gen_requests - cfg.responses_per_update, 0) if over_generate else 0
        return cls(cfg.prompts, cfg.group, extra, models.lengths, recorded, cfg.engine.max_model_len)

    def context_bound(self) -> int:
        """The longest prompt + response any round can hold (before the cut at max_model_len)."""
        lm = self.lengths
        if self.recorded is None:
            return int(lm.prompt_tokens.max()) + int(lm.response_tokens.max())
        bound = max(int((w[0].astype(np.int64) + w[1]).max()) for w in self.recorded)
        if self.extra:
            bound = max(bound, max(int(w[0].max()) for w in self.recorded) + int(lm.response_tokens.max()))
        return bound

    def draw(self, rng: np.random.Generator, count: int, first: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Rounds first .. first + count - 1: per round, (B_gen,) int64 prompt and response lengths in queue order."""
        P, G = self.prompts, self.group
        if self.recorded is not None:
            wl = self.recorded
            ps = [wl[u % len(wl)][0].astype(np.int64) for u in range(first, first + count)]
            ls = [wl[u % len(wl)][1].astype(np.int64) for u in range(first, first + count)]
        else:
            p, L = self.lengths.sample(rng, P, G, rounds=count)  # (count, P x G) each
            ps, ls = list(p), list(L)
        if self.extra:
            ex = rng.choice(self.lengths.response_tokens, size=(count, self.extra)).astype(np.int64)
            for i in range(count):
                n_prompts = max(len(ls[i]) // G, 1)
                ps[i] = np.concatenate([ps[i], ps[i][(np.arange(self.extra) % n_prompts) * G]])
                ls[i] = np.concatenate([ls[i], ex[i]])
        return ps, [self._cut(p, L) for p, L in zip(ps, ls)]

    def _cut(self, p: np.ndarray, L: np.ndarray) -> np.ndarray:
        mml = self.max_model_len
        if len(L) and int((p + L).max()) > mml:
            return np.minimum(L, np.maximum(mml - p, 1))
        return L
