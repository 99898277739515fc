"""`simulate`: one simulation of a resolved `SimConfig`, by the loop it asks for.

Without a split, the synchronous colocated loop (`rlsim.core.pipeline.simulate`); with `SimConfig.split`, split
generation and training devices, asynchronous within a staleness limit (`rlsim.modes.split.simulate_split`).
The what-if layer and the tools that simulate any configuration call this; `rlsim.core.pipeline` does not know
about the split simulator, which sits above it.
"""
from __future__ import annotations

import numpy as np

from rlsim.core import pipeline
from rlsim.modes.split import simulate_split
from rlsim.core.config import SimConfig
from rlsim.core.pipeline import SimRun
from rlsim.replay.models import FittedModels


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
             round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    """Simulate `cfg.updates` RL steps with the fitted models; deterministic given the rng state.
    round_by_round and max_rounds apply to the colocated loop only (`rlsim.core.pipeline.simulate`)."""
    if cfg.split is not None:
        return simulate_split(models, cfg, rng=rng, record_timeline=record_timeline)
    return pipeline.simulate(models, cfg, rng=rng, record_timeline=record_timeline, round_by_round=round_by_round,
                             max_rounds=max_rounds)
