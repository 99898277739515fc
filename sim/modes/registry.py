"""Execution modes in one registry, and `simulate`: one simulation of a resolved `SimConfig` in the mode it asks for.

A mode is a function (models, cfg, rng=, record_timeline=, **options) -> SimRun registered under its name with
`register_mode`; `mode_of(cfg)` names the mode a config asks for. Registered here: `colocated`, the synchronous
loop on shared devices (`rlsim.core.pipeline.simulate`), and `split`, separate generation and training devices,
asynchronous within a staleness limit (`rlsim.modes.split.simulate_split`). The what-if layer and the tools that
simulate any configuration call `simulate`; `rlsim.core.pipeline` knows nothing of the modes above it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from rlsim.core import pipeline
from rlsim.core.config import SimConfig
from rlsim.core.pipeline import SimRun
from rlsim.modes.split import simulate_split
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels

Mode = Callable[..., SimRun]
MODES: dict[str, Mode] = {}


def register_mode(name: str) -> Callable[[Mode], Mode]:
    """Decorator: register a simulation function as execution mode `name`."""
    def deco(fn: Mode) -> Mode:
        if name in MODES:
            raise ValueError(f"execution mode {name!r} is registered twice")
        MODES[name] = fn
        return fn
    return deco


@register_mode("colocated")
def _colocated(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
               round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    return pipeline.simulate(models, cfg, rng=rng, record_timeline=record_timeline, round_by_round=round_by_round,
                             max_rounds=max_rounds)


@register_mode("split")
def _split(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
           **_colocated_only) -> SimRun:
    return simulate_split(models, cfg, rng=rng, record_timeline=record_timeline)


def mode_of(cfg: SimConfig) -> str:
    """The execution mode `cfg` asks for."""
    return "split" if cfg.split is not None else "colocated"


def simulate(models: FittedModels, cfg: SimConfig, *, rng: np.random.Generator, record_timeline: bool = False,
             round_by_round: bool | None = None, max_rounds: int | None = None) -> SimRun:
    """Simulate `cfg.updates` RL steps with the fitted models in the config's mode; deterministic given the rng
    state. round_by_round and max_rounds apply to the colocated loop only (`rlsim.core.pipeline.simulate`)."""
    name = mode_of(cfg)
    if name not in MODES:  # pragma: no cover - every mode_of name is registered above
        raise RlsimError(f"no execution mode {name!r}; registered: {', '.join(MODES)}")
    return MODES[name](models, cfg, rng=rng, record_timeline=record_timeline, round_by_round=round_by_round,
                       max_rounds=max_rounds)
