"""Configurations of the simulator: one frozen dataclass per concern, help text on every field.

- `WhatIf`: what a user asks `rlsim run` (and, as lists, `rlsim sweep`) for: every option one field.
  None means "as in the reference trace".
- `StudyOptions`: which traces are fitted and how (--trace, --rho, ...; `rlsim.fit`'s keywords).
- `EngineConfig`: the generation engine (continuous batching limits).
- `SimConfig`: one fully resolved simulation (what `rlsim.modes.registry.simulate` takes).
- `SplitConfig`: generation and training on separate devices, asynchronous within a staleness limit
  (`SimConfig.split`; `rlsim.modes.split`). WhatIf's `gen_gpus`/`train_gpus`/`staleness`/`partial_rollout` ask for it.

Derived values (B = P x G, whether the KV cache can bind) are properties here and only here. No I/O
at construction; `validate()` raises `RlsimError` naming the fix, and the fields as the caller spells them
(`rlsim.replay.errors.name`: the CLI's options, or the notebook API's keywords inside `keyword_names()`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from rlsim.replay.errors import RlsimError, name, setting
from rlsim.replay.util import ENGINE_DEFAULTS

LR_RULES = ("sqrt", "linear", "fixed")
LENGTHS = ("sampled", "recorded")
OFF_POLICY_STRATEGIES = ("drop", "wait")  # verl V1 trainer.v1.sampler.max_off_policy_strategy
MAX_SPLIT_DEVICES = 65536  # a split simulates one SimPy process per device: beyond any cluster, and bounded memory


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


def help_text(cls) -> dict[str, str]:
    """Field name -> help text (for CLIs and docs)."""
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}


@dataclass(frozen=True)
class WhatIf:
    """One candidate configuration; None fields take the reference trace's value."""

    prompts: int | None = _f(None, "P: prompts per optimizer update (None: the trace's)")
    group: int | None = _f(None, "G: responses per prompt, 1 for PPO (None: the trace's)")
    lr_rule: str | None = _f(None, "learning-rate rule: sqrt | linear | fixed (None: the trace's)")
    updates: int = _f(100, "optimizer updates to simulate (steady-state throughput is their mean)")
    seed: int = _f(0, "seed of the numpy Generator that samples response lengths")
    max_num_seqs: int | None = _f(None, "engine max_num_seqs: sequences decoded concurrently (None: the trace's)")
    kv_cache_tokens: int | None = _f(None, "engine KV-cache capacity in tokens (None: the trace's)")
    device: str | None = _f(None, "named device profile to predict for, e.g. h200 (rlsim.replay.devices); costs move "
                                   "by the roofline rule and the notes say which (None: the trace's own hardware)")
    gpus: int | None = _f(None, "devices of that profile (None: as many as recorded)")
    gen_batch: int | None = _f(None, "responses generated per update, B_gen >= B = P x G; the first G of each prompt "
                                     "to finish are trained on (None: the trace's over-generation ratio B_gen / B)")
    gen_gpus: int | None = _f(None, "generation devices of a split (generation and training on separate devices): one "
                                    "engine replica each, each the recorded engine (its fitted step cost, max_num_seqs "
                                    "and KV cache), pulling requests from one shared queue (None: colocated, as "
                                    "recorded)")
    train_gpus: int | None = _f(None, "data-parallel training devices of a split: each trains B / train_gpus "
                                      "responses, then a ring all-reduce of the gradients (None: colocated, as "
                                      "recorded)")
    staleness: float | None = _f(None, "staleness limit eta (AReaL's): a prompt starts only while prompts started stay "
                                       "under (eta + version + 1) x P, in-flight ones counted, so a trained sample "
                                       "lags at most ceil(eta) policy versions; a fraction admits that share of a "
                                       "batch ahead (verl's staleness_threshold); 0 = synchronous (None: 0)")
    partial_rollout: bool = _f(False, "with a split: responses in flight at a weight update continue on the new "
                                      "weights (KV recomputed) instead of finishing on the old ones while the sync "
                                      "waits for them")
    model_params: float | None = _f(None, "the model's parameter count, e.g. 7e9, for its memory when the trace "
                                          "names a model rlsim cannot size (None: the trace's model)")
    mode: str | None = _f(
        None, "execution mode, as the frameworks name them (rlsim.modes.registry lists them; None: the mode the "
           "reference trace records, with its settings and devices (an imported framework log), else split when "
           "--gen-gpus/--train-gpus are given, else colocated)")
    staleness_threshold: float | None = _f(
        None, "fully_async (verl async_training.staleness_threshold): samples generated ahead per weight sync, "
           "as a fraction of a step's batch; 0 = on-policy (None: 0)")
    trigger_parameter_sync_step: int | None = _f(
        None, "fully_async (verl async_training.trigger_parameter_sync_step): local updates of require_batches "
           "PPO mini-batches per weight sync; P = trigger_parameter_sync_step x require_batches x mini-batch"
           " (None: 1)")
    require_batches: int | None = _f(
        None, "fully_async (verl async_training.require_batches): PPO mini-batches the trainer fetches at once "
           "(None: 1)")
    concurrent_samples_per_replica: int | None = _f(
        None, "fully_async (verl async_training.concurrent_samples_per_replica): prompts the rollouter keeps in "
              "flight per rollout replica, each until its last response finishes (None: 16, verl's default)")
    num_warmup_batches: float | None = _f(
        None, "colocate_async, separate_async (verl trainer.v1.*.num_warmup_batches): batches of prompts "
           "dispatched ahead of training; one prompt is refilled per prompt trained or dropped, a fraction "
           "dispatches that share of a batch (None: 1)")
    parameter_sync_step: int | None = _f(
        None, "separate_async (verl trainer.v1.separate_async.parameter_sync_step): PPO mini-batches per weight"
           " sync, each trained as soon as it is ready; P = parameter_sync_step x mini-batch (None: 1)")
    max_off_policy_threshold: int | None = _f(
        None, "colocate_async, separate_async (verl trainer.v1.sampler.max_off_policy_threshold): policy "
           "versions from a prompt's first generation to its training before max_off_policy_strategy acts; 0"
           " = off (verl's null) (None: 8)")
    max_off_policy_strategy: str | None = _f(
        None, "colocate_async, separate_async (verl trainer.v1.sampler.max_off_policy_strategy): drop (evict a "
           "stale group, dispatch a new prompt in its place) | wait (block training until a group in flight "
           "at the threshold finishes) (None: drop)")
    switch_threshold_ratio: float | None = _f(
        None, "separate_async_switch (verl trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio): while "
              "fewer than this share of P groups wait to be trained, the training devices' hybrid replicas join "
              "rollout, and switch back once it is reached; in (0, 1] (None: 0.4)")
    max_head_offpolicyness: int | None = _f(
        None, "areal (AReaL rollout.max_head_offpolicyness, its eta): a prompt starts only while prompts "
           "started stay under (eta + version + 1) x P (None: 0)")
    max_concurrent_rollouts: int | None = _f(
        None, "areal (AReaL rollout.max_concurrent_rollouts): prompts in flight at most over all rollout replicas, "
              "each until its last response finishes; each replica holds its share (None: P, AReaL's consumer batch)")
    max_trajectory_age_steps: int | None = _f(
        None, "nemo_async (NeMo RL grpo.async_grpo.max_trajectory_age_steps): a batch generated under version v"
           " is trained by step v + this at the latest (None: 1)")
    in_flight_weight_updates: bool = _f(
        False, "nemo_async (NeMo RL grpo.async_grpo.in_flight_weight_updates): load new weights into the engines"
           " mid-generation instead of waiting for the longest response")
    recompute_kv_cache_after_weight_updates: bool = _f(
        False, "nemo_async (NeMo RL grpo.async_grpo.recompute_kv_cache_after_weight_updates): with in-flight "
           "weight updates, prefill the KV cache of responses in flight again on the new weights")
    gen_tp: int | None = _f(None, "with a split: devices per rollout replica, its tensor parallel size; the split's "
                                  "--gen-gpus hold gen_gpus / gen_tp replicas (None: the trace's tensor parallel)")
    weight_sync: str | None = _f(None, "with a split: how weights reach the rollout replicas, priced by model bytes "
                                       "(rlsim.replay.rollout_costs): checkpoint_engine | moe_reshard | nccl | "
                                       "nemo_nccl (None: the trace's timed sync; none when its log times none)")
    rollout_log_probs: bool = _f(False, "with a split: the trainer takes the old log-probs from the rollout engines "
                                        "(verl fully_async's use_rollout_log_probs) and runs no old-log-prob pass; a "
                                        "reference or value pass still runs")

    def validate(self) -> None:
        for f in ("prompts", "group", "max_num_seqs", "kv_cache_tokens", "gen_batch", "gpus"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise RlsimError(f"{name(f)} must be a positive integer, got {v!r}")
        m = self.model_params
        if m is not None and (not isinstance(m, (int, float)) or isinstance(m, bool) or not 0 < m < math.inf):
            raise RlsimError(f"{name('model_params')} must be a positive parameter count (e.g. 7e9), got {m!r}")
        if self.lr_rule is not None and self.lr_rule not in LR_RULES:
            raise RlsimError(f"{name('lr_rule')} must be one of {', '.join(LR_RULES)}, got {self.lr_rule!r}")
        if not isinstance(self.updates, int) or self.updates <= 0:
            raise RlsimError(f"{name('updates')} must be a positive integer, got {self.updates!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise RlsimError(f"{name('seed')} must be a non-negative integer, got {self.seed!r}")
        self._validate_split()
        self._validate_mode_settings()

    @property
    def split(self) -> bool:
        """The devices of a mode that places generation and training itself (--gen-gpus and/or --train-gpus given):
        one engine replica per generation device, one data-parallel rank per training device."""
        return self.gen_gpus is not None or self.train_gpus is not None

    @property
    def split_devices(self) -> int:
        """Devices of the split's placement: generation plus training devices (hybrid replicas sit on the latter)."""
        return int(self.gen_gpus or 0) + int(self.train_gpus or 0)

    def _validate_mode_settings(self) -> None:
        """Each mode setting's type and range, with its fix; which settings a mode takes is
        `rlsim.modes.registry.check`'s."""
        if self.mode is not None and (not isinstance(self.mode, str) or not self.mode):
            raise RlsimError(f"{name('mode')} must be a mode's name (rlsim.modes.registry), got {self.mode!r}")
        for f in ("trigger_parameter_sync_step", "require_batches", "parameter_sync_step", "max_trajectory_age_steps",
                  "concurrent_samples_per_replica", "max_concurrent_rollouts"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise RlsimError(f"{name(f)} must be a positive integer, got {v!r}; e.g. {setting(**{f: 1})}")
        for f in ("max_off_policy_threshold", "max_head_offpolicyness"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise RlsimError(f"{name(f)} must be a non-negative integer (policy versions), got {v!r}; e.g. "
                                 f"{setting(**{f: 1})}")
        for f in ("staleness_threshold", "num_warmup_batches"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf):
                raise RlsimError(f"{name(f)} must be a non-negative number (batches), got {v!r}; e.g. "
                                 f"{setting(**{f: 0.5})}")
        r = self.switch_threshold_ratio
        if r is not None and (not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 1):
            raise RlsimError(f"{name('switch_threshold_ratio')} must be in (0, 1] (a share of P), got {r!r}; e.g. "
                             f"{setting(switch_threshold_ratio=0.4)}")
        s = self.max_off_policy_strategy
        if s is not None and s not in OFF_POLICY_STRATEGIES:
            raise RlsimError(f"{name('max_off_policy_strategy')} must be one of {' | '.join(OFF_POLICY_STRATEGIES)}, "
                             f"got {s!r}")
        for f in ("in_flight_weight_updates", "recompute_kv_cache_after_weight_updates"):
            if not isinstance(getattr(self, f), bool):
                raise RlsimError(f"{name(f)} must be true or false, got {getattr(self, f)!r}")

    def _validate_split(self) -> None:
        for f in ("gen_gpus", "train_gpus"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise RlsimError(f"{name(f)} must be a positive integer (devices), got {v!r}")
            if v is not None and v > MAX_SPLIT_DEVICES:
                raise RlsimError(f"{name(f)} {v} is more devices than rlsim simulates (each one an engine replica or a "
                                 f"data-parallel rank); give at most {MAX_SPLIT_DEVICES}")
        s = self.staleness
        if s is not None and (not isinstance(s, (int, float)) or isinstance(s, bool) or not 0 <= s < math.inf):
            raise RlsimError(f"{name('staleness')} must be a non-negative number (policy versions a sample may lag, a "
                             f"fraction admitting that share of a batch ahead; 0 = synchronous), got {s!r}")
        if not isinstance(self.partial_rollout, bool):
            raise RlsimError(f"{name('partial_rollout')} must be true or false, got {self.partial_rollout!r}")
        tp = self.gen_tp
        if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
            raise RlsimError(f"{name('gen_tp')} must be a positive integer, got {self.gen_tp!r}")
        add_split = f"add {setting(gen_gpus='N', train_gpus='M')}"
        named = self.mode is not None  # a named mode states its own devices (rlsim.modes.registry.check)
        if not named and self.split and (self.gen_gpus is None or self.train_gpus is None):
            given, missing = ("gen_gpus", "train_gpus") if self.train_gpus is None else ("train_gpus", "gen_gpus")
            raise RlsimError(f"{name(given)} needs {name(missing)} too: a split is generation devices plus training "
                             f"devices (e.g. {setting(gen_gpus=6, train_gpus=2)})")
        if not self.split:
            if named:
                return
            if self.partial_rollout:
                raise RlsimError(f"{name('partial_rollout')} needs split devices: {add_split} "
                                 "(colocated generation stops for every update, nothing is in flight)")
            if s:
                raise RlsimError(f"{setting(staleness=s)} needs split devices: {add_split} "
                                 "(colocated generation and training cannot overlap)")
        elif self.gpus is not None:
            raise RlsimError(f"{name('gpus')} sets the colocated device count; with a split give {name('gen_gpus')} "
                             f"and {name('train_gpus')} instead")
        elif self.gen_batch is not None:
            raise RlsimError(f"{name('gen_batch')} does not apply with a split: asynchronous generation keeps its "
                             f"replicas full from one queue (B_gen = B); drop {name('gen_batch')} or the split")


@dataclass(frozen=True)
class StudyOptions:
    """Which traces are fitted and how: the options of every command that fits (`rlsim.cli.options`) and the keywords
    of `rlsim.fit` and `rlsim.sweep`, so a field here is both. Each field is named as its option (`--rho` is `rho`)."""

    trace: tuple[Path, ...] = field(default=(), metadata={
        "help": "Recorded trace (first = reference); repeat for learning curves at other batch sizes.",
        "flags": ["--trace", "-t"]})
    rho: str | None = field(default=None, metadata={
        "help": "Sample-cost model: invariant | noise-scale | curves | lr-aware | auto "
                "(None: auto; `report`: the sweep's)",
        "flags": ["--rho", "--rho-model"]})
    bend_batch: float | None = field(default=None, metadata={
        "help": "lr-aware rho: the batch (responses) where rho bends upward, B_bend (with --kappa; without both, they "
                "are fitted on the other --trace runs).", "flags": ["--bend-batch"]})
    kappa: float | None = field(default=None, metadata={
        "help": "lr-aware rho: share of the reference update's gain that curvature takes back, in [0, 1) (with "
                "--bend-batch).",
        "flags": ["--kappa"]})
    target: float | None = field(default=None, metadata={
        "help": "Eval score that defines time-to-target (None: the best the reference reached; with several "
                "traces, the best all reached)", "flags": ["--target"]})
    calibration: tuple[Path, ...] = field(default=(), metadata={
        "help": "Calibration trace from `rlrun calibrate` (same model and device) for a trace recorded without one; "
                "its engine-step and training profiles refit the step costs over the calibrated range. Repeatable.",
        "flags": ["--calibration"]})
    drop_invalid: bool = field(default=False, metadata={
        "help": "Drop trace rows with invalid values (NaN, negative durations...) with a warning instead of refusing "
                "the trace.", "flags": ["--drop-invalid"]})

    @property
    def rho_model(self) -> str:
        """The rho model the fit takes, with the lr-aware parameters when given ('lr-aware:B_BEND,KAPPA', parsed by
        `rlsim.replay.rho.parse_rho`)."""
        if self.bend_batch is None and self.kappa is None:
            return self.rho or "auto"
        if (self.rho or "auto") != "lr-aware":
            raise RlsimError(f"{name('bend_batch')} and {name('kappa')} set the lr-aware rho model: add "
                             f"{setting(rho='lr-aware')}")
        if self.bend_batch is None or self.kappa is None:
            raise RlsimError(f"give both {name('bend_batch')} and {name('kappa')} (or neither, to fit them on the "
                             f"other traces' runs)")
        return f"lr-aware:{self.bend_batch:g},{self.kappa:g}"


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

    def kv_can_bind(self, max_context: int, sequences: int | None = None) -> bool:
        """Whether max_num_seqs sequences of `max_context` tokens could exceed the KV cache (no more than
        `sequences` of them where a round holds fewer requests: they cannot all run at once otherwise)."""
        n = self.max_num_seqs if sequences is None else min(self.max_num_seqs, sequences)
        return n * math.ceil(max_context / self.block_size) > self.kv_blocks

    def validate(self) -> None:
        for f_ in fields(self):
            if getattr(self, f_.name) <= 0:
                raise RlsimError(f"engine {f_.name} must be positive, got {getattr(self, f_.name)}")


@dataclass(frozen=True)
class SplitConfig:
    """Generation and training on separate devices, asynchronous within a staleness limit (`rlsim.modes.split`)."""

    gen_gpus: int = _f(1, "generation devices (gen_gpus / gen_tp engine replicas)")
    train_gpus: int = _f(1, "data-parallel training ranks")
    staleness: float = _f(0.0, "staleness limit eta (AReaL's; a fraction as verl's staleness_threshold): a consumed "
                               "sample lags at most ceil(eta) policy versions; 0 = synchronous")
    partial_rollout: bool = _f(False, "in-flight responses continue across a weight sync (KV recomputed) instead of "
                                      "finishing first")
    allreduce_gbs: float = _f(0.0, "bandwidth of the ring all-reduce of the gradients, GB/s (0: unknown; needed when "
                                   "train_gpus > 1)")
    bandwidth_source: str = _f("", "where allreduce_gbs comes from (trace metadata or a named device profile)")
    allreduce_fitted: bool = _f(False, "the fitted update already holds the gradient collective (the reference trained "
                                       "data-parallel on several GPUs), so no all-reduce is added")
    mode: str = _f(
        "split", "the execution mode's registered name (rlsim.modes.registry), for the outputs")
    hybrid: bool = _f(
        False, "the replicas sit on the training devices (gen_gpus = train_gpus): they stop at their next engine"
           " step when the trainer takes a batch and resume after the weight sync")
    refill: bool = _f(
        False, "admission counts prompts consumed, not policy versions: (staleness + 1) x P started ahead, one "
           "prompt dispatched per prompt trained or dropped (verl V1's replay buffer)")
    chunks: int = _f(
        1, "trainer fetches per weight sync, P / chunks prompts each, each trained as soon as it is ready "
           "(verl's PPO mini-batch streaming)")
    fifo: bool = _f(
        False, "the trainer takes finished groups in completion order (a message queue); else AReaL's rule, "
           "oldest started first within the staleness deadline")
    oldest: bool = _f(
        False, "with fifo, the trainer takes the finished groups started first (AReaL's wait_results sorts the "
               "finished by creation time), not the first finished")
    off_policy: int = _f(
        0, "verl V1 max_off_policy_threshold: versions a group may age before the strategy acts (0: off)")
    off_policy_wait: bool = _f(
        False, "at the threshold, wait for the group in flight (verl's wait) instead of dropping it and "
           "dispatching a new prompt (drop)")
    switch_ratio: float = _f(
        0.0, "verl V1 hybrid_rollout.switch_threshold_ratio with enable_switch: while fewer than this share of P "
             "groups wait to be trained, one hybrid replica per training device joins rollout, then switches back "
             "(0: no switch)")
    recompute: bool = _f(
        True, "with partial rollout, the in-flight responses' KV is prefilled again on the new weights (else "
           "they continue on their old KV)")
    inflight: int = _f(
        0, "prompts a replica holds in flight at most, each until its last response finishes (verl fully_async's "
           "rollouter); 0: only the engine's slots bound them")
    reward_in_rollout: bool = _f(
        False, "rewards scored by the rollout side as each response finishes (verl fully_async's reward loop, "
               "NeMo RL's trajectory collector, AReaL's workflow), off the trainer's path")
    gen_tp: int = _f(1, "devices per rollout replica (tensor parallel): gen_gpus / gen_tp replicas")
    sync_s: float | None = _f(None, "seconds of one weight sync by its path (rlsim.replay.rollout_costs); None: the "
                                    "fitted sync")

    @property
    def replicas(self) -> int:
        """Rollout engine replicas: one per gen_tp devices."""
        return self.gen_gpus // self.gen_tp

    def validate(self, responses_per_update: int, prompts: int | None = None) -> None:
        if self.gen_gpus < 1 or self.train_gpus < 1:
            raise RlsimError(f"{name('gen_gpus')} and {name('train_gpus')} must be at least 1, got {self.gen_gpus} and "
                             f"{self.train_gpus}")
        if self.staleness < 0:
            raise RlsimError(f"{name('staleness')} must be a non-negative number, got {self.staleness}")
        if self.inflight < 0:
            raise RlsimError(f"the cap on prompts in flight per replica must be 0 (none) or more, got {self.inflight}; "
                             f"give {name('concurrent_samples_per_replica')} or {name('max_concurrent_rollouts')} "
                             "as a positive integer")
        if self.gen_tp < 1 or self.gen_gpus % self.gen_tp:
            raise RlsimError(f"{setting(gen_gpus=self.gen_gpus)} do not split into rollout replicas of "
                             f"{setting(gen_tp=self.gen_tp)} devices; pick a multiple of {self.gen_tp}")
        if responses_per_update % self.train_gpus:
            divs = [d for d in range(2, min(responses_per_update, 64) + 1) if responses_per_update % d == 0][:4]
            raise RlsimError(f"{setting(train_gpus=self.train_gpus)} does not divide the training batch B = P x G = "
                             f"{responses_per_update} responses (each data-parallel rank trains B / train_gpus); "
                             "pick a divisor of B"
                             f"{' (e.g. ' + ', '.join(map(str, divs)) + ')' if divs else ''} or change "
                             f"{name('prompts')}")
        if prompts is not None and (self.chunks < 1 or prompts % self.chunks):
            raise RlsimError(f"{self.mode}: P = {prompts} prompts per step do not split into {self.chunks} equal "
                             f"trainer fetches (PPO mini-batches); pick {name('prompts')} a multiple of {self.chunks}")
        if self.chunks > 1 and (responses_per_update // self.chunks) % self.train_gpus:
            raise RlsimError(f"{setting(train_gpus=self.train_gpus)} does not divide one trainer fetch of "
                             f"{responses_per_update // self.chunks} responses ({self.chunks} per step); "
                             "pick a divisor of it")
        if self.train_gpus > 1 and not self.allreduce_fitted and not self.allreduce_gbs > 0:
            raise RlsimError(f"{name('train_gpus')} > 1 needs the interconnect bandwidth for the gradient all-reduce: "
                             f"the trace's hardware matches no device profile; pass {setting(device='NAME')} "
                             "(rlsim.replay.devices)")


@dataclass(frozen=True)
class SimConfig:
    """One resolved simulation of the synchronous colocated RL loop.

    Each update: one generation round of B = P x G requests on the engine (continuous batching),
    then rewards, batch preparation, the optimizer update, the weight sync and the rest of the step.
    With `split`, generation and training run on separate devices, asynchronously within a staleness
    limit: the driver of `rlsim.modes.split` instead.
    """

    prompts: int = _f(128, "P: prompts per update")
    group: int = _f(8, "G: responses per prompt")
    updates: int = _f(100, "updates to simulate")
    engine: EngineConfig = _f(EngineConfig(), "generation engine limits")
    gen_batch: int = _f(0, "requests generated per round (B_gen >= B; 0: = B); the first G responses of each prompt to "
                           "finish are trained on")
    lengths: str = _f("sampled", "sampled: draw lengths from the fitted distribution; recorded: replay the trace's "
                                 "responses step by step")
    exact_engine: bool = _f(False, "always run the step-level engine loop (with KV accounting and preemption) instead "
                                   "of the exact fast path")
    split: SplitConfig | None = _f(None, "split devices and asynchronous rollout (rlsim.modes.split); None: the "
                                         "synchronous colocated loop")

    @property
    def responses_per_update(self) -> int:
        """B = P x G responses trained per update (B_gen >= B are generated)."""
        return self.prompts * self.group

    @property
    def gen_requests(self) -> int:
        """B_gen: requests per generation round."""
        return max(self.gen_batch, self.responses_per_update)

    def validate(self) -> None:
        if self.gen_batch and self.gen_batch < self.responses_per_update:
            raise RlsimError(f"{setting(gen_batch=self.gen_batch)} is smaller than the train batch B = P x G = "
                             f"{self.responses_per_update}")
        if self.prompts <= 0 or self.group <= 0 or self.updates <= 0:
            raise RlsimError(f"prompts, group and updates must be positive, got {self.prompts}, {self.group}, "
                             f"{self.updates}")
        if self.lengths not in LENGTHS:
            raise RlsimError(f"lengths must be one of {', '.join(LENGTHS)}, got {self.lengths!r}")
        self.engine.validate()
        if self.split is not None:
            self.split.validate(self.responses_per_update, self.prompts)
