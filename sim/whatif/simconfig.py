"""The SimConfig of fitted models: the one place a simulation's configuration is built from what a trace
recorded (its engine limits, P, G and over-generation) and what a caller changes (`rlsim.whatif.study.sim_config`
for a candidate; `rlsim.whatif.fidelity` and bench/extrapolation.py for the recorded configuration itself)."""
from __future__ import annotations

from rlsim.core.config import EngineConfig, SimConfig, SplitConfig
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels
from rlsim.replay.util import ENGINE_DEFAULTS


def engine_of(models: FittedModels) -> EngineConfig:
    """The engine limits the models were fitted under (as rescaled, for rescaled models)."""
    e = models.engine
    return EngineConfig(max_num_seqs=int(e["max_num_seqs"]), kv_cache_tokens=int(e["kv_cache_tokens"]),
                        block_size=int(e.get("block_size") or ENGINE_DEFAULTS["block_size"]),
                        max_model_len=int(e.get("max_model_len") or ENGINE_DEFAULTS["max_model_len"]))


def gen_ratio(models: FittedModels) -> float:
    """B_gen / B of the recorded run (over-generation; 1.0 when none)."""
    c = models.config
    b = (c.get("prompts") or 0) * models.group
    gen = c.get("gen_responses") or c.get("gen_batch") or b
    return float(gen) / b if b else 1.0


def config_for(models: FittedModels, *, updates: int, prompts: int | None = None, group: int | None = None,
               engine: EngineConfig | None = None, lengths: str = "sampled", gen_batch: int | None = None,
               split: SplitConfig | None = None) -> SimConfig:
    """The simulation of `updates` updates of P = `prompts` x G = `group` (None: the recorded ones) on `engine`
    (None: the recorded limits). `gen_batch`: responses generated per update (None: the recorded
    over-generation ratio times B; a split generates B)."""
    P = models.prompts if prompts is None else prompts
    G = models.group if group is None else group
    if split is not None:  # separate generation and training devices (rlsim.modes.split): no over-generation
        gen_batch = P * G
    elif gen_batch is None:
        gen_batch = max(int(round(P * G * gen_ratio(models))), P * G)
    elif gen_batch < P * G:
        raise RlsimError(f"--gen-batch {gen_batch} is smaller than the train batch B = P x G = {P * G}; generate at "
                         "least B responses per update")
    return SimConfig(prompts=P, group=G, updates=updates, engine=engine or engine_of(models), lengths=lengths,
                     gen_batch=gen_batch if gen_batch > P * G else 0, split=split)
