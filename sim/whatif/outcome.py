"""What a what-if returns: one configuration's `Outcome` (throughput, sample cost, time-to-target, with
intervals and warnings) and `rlsim run`'s `RunResult` (reference and candidate)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsim.replay.models import Validation


# the memory object's keys an Outcome's flat dict carries (as memory_<key>; `fits` is a field of its own)
MEMORY_COLUMNS = ("generation_gb", "training_gb", "per_device_gb", "limit_gb", "overflow", "fix", "kv_capacity_tokens",
                  "kv_demand_tokens")


@dataclass(frozen=True, eq=False)
class Outcome:
    """One configuration's predicted throughput, sample cost and time-to-target."""

    prompts: int = field(metadata={"help": "P"})
    group: int = field(metadata={"help": "G"})
    responses_per_update: int = field(metadata={"help": "B = P x G responses trained per update"})
    lr_rule: str = field(metadata={"help": "learning-rate rule"})
    responses_per_s: float = field(metadata={"help": "simulated end-to-end responses per second (q)"})
    step_time_s: float = field(metadata={"help": "mean seconds per RL step"})
    gen_s: float = field(metadata={"help": "mean generation seconds per step"})
    train_s: float = field(metadata={"help": "mean training seconds per step (batch preparation + update)"})
    sync_s: float = field(metadata={"help": "mean weight-sync seconds per step"})
    other_s: float = field(metadata={"help": "mean seconds of rewards and the rest of the step"})
    idle_s: float = field(metadata={"help": "mean seconds the device neither generates, trains nor syncs (colocated: = "
                                            "other_s)"})
    sigma: float = field(metadata={"help": "throughput gain q / q_ref"})
    rho: float = field(metadata={"help": "sample cost N* / N*_ref"})
    rho_model: str = field(metadata={"help": "rho model used: invariant | noise-scale | curves | lr-aware"})
    time_to_target_ratio: float = field(metadata={"help": "T / T_ref = rho / sigma"})
    time_to_target_s: float = field(metadata={"help": "predicted training seconds to the target (nan without evals "
                                                      "reaching it)"})
    regime: str = field(metadata={"help": "time falls | flat | time rises (vs the reference, 5% band) | undecided "
                                             "(its T interval spans 1) | reference (the reference config itself)"})
    updates: int = field(metadata={"help": "updates simulated"})
    gen_steps: float = field(metadata={"help": "mean engine steps per generation round"})
    peak_running: int = field(metadata={"help": "most concurrent sequences in the simulation"})
    preemptions: float = field(metadata={"help": "mean requests preempted per round (KV cache full)"})
    seed: int = field(metadata={"help": "seed of the length sampling"})
    warnings: tuple[str, ...] = field(default=(),
                                      metadata={"help": "what may be wrong: extrapolation, unmeasured terms"})
    notes: tuple[str, ...] = field(default=(),
                                   metadata={"help": "how the answer was made: rescaled terms, model assumptions"})
    hardware: str = field(default="as recorded",
                          metadata={"help": "the devices this configuration and its reference run on"})
    hardware_gain: float = field(default=1.0, metadata={"help": "responses/s of the reference configuration on this "
                                                                "hardware over "
                                                                 "the recorded hardware (1: as recorded)"})
    time_to_target_vs_recorded: float = field(default=math.nan, metadata={
        "help": "T / T of the reference as recorded: the batch change and the hardware change together"})
    responses_per_s_lo: float = field(default=math.nan,
                                      metadata={"help": "lower end of the responses/s interval (see interval)"})
    responses_per_s_hi: float = field(default=math.nan, metadata={"help": "upper end of the responses/s interval"})
    sigma_lo: float = field(default=math.nan, metadata={"help": "lower end of the sigma interval"})
    sigma_hi: float = field(default=math.nan, metadata={"help": "upper end of the sigma interval"})
    rho_lo: float = field(default=math.nan, metadata={"help": "lower end of the rho interval"})
    rho_hi: float = field(default=math.nan, metadata={"help": "upper end of the rho interval"})
    time_to_target_ratio_lo: float = field(default=math.nan, metadata={"help": "lower end of the T / T_ref interval"})
    time_to_target_ratio_hi: float = field(default=math.nan, metadata={"help": "upper end of the T / T_ref interval"})
    interval: str = field(default="", metadata={"help": "how the intervals were made (empty: none)"})
    mode: str = field(default="colocated", metadata={"help": "colocated, or the split: generation : training devices, "
                                                             "staleness limit, partial rollout"})
    execution_mode: str = field(default="colocated", metadata={
        "help": "the execution mode's registered name (rlsim.modes.registry); `mode` describes its devices and limits"})
    gen_idle_ratio: float = field(default=math.nan, metadata={"help": "fraction of wall time the generation side waits "
                                                                      "(split: mean over replicas; colocated: while "
                                                                      "training)"})
    train_idle_ratio: float = field(default=math.nan, metadata={"help": "fraction of wall time the training side waits "
                                                                        "for generation (split: mean over ranks)"})
    staleness_mean: float = field(default=0.0, metadata={"help": "mean policy versions a consumed sample lagged"})
    staleness_max: int = field(default=0, metadata={"help": "most policy versions a consumed sample lagged"})
    rho_staleness: float = field(default=1.0, metadata={
        "help": "factor of rho for the staleness limit (in rho; rlsim.replay.rho.staleness_rho)"})
    allreduce_s: float = field(default=0.0,
                               metadata={"help": "gradient all-reduce seconds per update (split with train_gpus > 1)"})
    fits: bool | None = field(default=None, metadata={
        "help": "the memory model says it fits its devices (None: unknown; rlsim.whatif.memory)"})
    memory: dict | None = field(default=None, metadata={
        "help": "memory per device: generation_gb, training_gb, per_device_gb, limit_gb, fits, overflow, fixes, ... "
                "(the JSON `memory` object; flat `memory_*` columns in to_dict)"})

    def to_dict(self) -> dict[str, Any]:
        """Flat: one value per key (sweep rows, DataFrames); the memory object as `memory_*` columns."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("warnings", "notes", "memory")}
        d.update({f"memory_{k}": (self.memory or {}).get(k) for k in MEMORY_COLUMNS})
        d["warnings"] = "; ".join(self.warnings)
        d["notes"] = "; ".join(self.notes)
        return {k: (float(v) if isinstance(v, (np.floating,)) else int(v) if isinstance(v, np.integer) else v)
                for k, v in d.items()}


@dataclass(frozen=True, eq=False)
class RunResult:
    """`rlsim run`: the reference and the candidate."""

    reference: Outcome = field(metadata={"help": "the trace's own configuration, simulated"})
    candidate: Outcome = field(metadata={"help": "the configuration asked for"})
    rho_model: str = field(metadata={"help": "rho model used for the candidate"})
    target: float = field(metadata={"help": "eval score defining time-to-target"})
    n_star_ref: float = field(metadata={"help": "reference responses to reach the target (nan if never)"})
    b_crit: float = field(metadata={"help": "gradient noise scale of the reference (actor), responses"})
    recorded_time_to_target_s: float = field(metadata={"help": "wall seconds at which the reference's evals reached "
                                                               "the target"})
    warnings: tuple[str, ...] = field(metadata={"help": "fit and learning-model warnings"})
    notes: tuple[str, ...] = field(default=(),
                                   metadata={"help": "how the study was made (models chosen, constants fitted)"})
    b_crit_critic: float = field(default=math.nan, metadata={"help": "gradient noise scale of the PPO value model"})
    recorded_responses_per_s: float = field(default=math.nan,
                                            metadata={"help": "median responses/s over the trace's updates"})
    recorded_step_time_s: float = field(default=math.nan, metadata={
        "help": "median step time over the trace's updates, as recorded (rlsim.replay.steps: the one definition)"})
    validation: Validation | None = field(default=None, metadata={"help": "fit validation (replay.models.Validation): "
                                                                          "form, R2, CV error"})
    mode_line: str = field(default="", metadata={
        "help": "the line saying the candidate asks about the execution mode the trace records ('' where the config "
                "names its mode or the trace records none; rlsim.modes.registry.as_recorded)"})

    def to_dict(self) -> dict[str, Any]:
        d = self.candidate.to_dict()
        d.update(rho_model=self.rho_model, target=self.target, n_star_ref=self.n_star_ref, b_crit=self.b_crit,
                 b_crit_critic=self.b_crit_critic, recorded_responses_per_s=self.recorded_responses_per_s,
                 recorded_step_time_s=self.recorded_step_time_s,
                 recorded_time_to_target_s=self.recorded_time_to_target_s,
                 warnings=list(self.warnings) + list(self.candidate.warnings),
                 notes=list(self.notes) + list(self.candidate.notes),
                 reference={**self.reference.to_dict(), "memory": self.reference.memory},
                 memory=self.candidate.memory)
        if self.validation is not None:
            d["fit_validation"] = self.validation.to_dict()
        if self.mode_line:
            d["mode_from_trace"] = self.mode_line
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
