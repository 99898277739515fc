"""The resolved configuration of one recorded run.

`RunConfig` is frozen and does no I/O at construction; `validate()` checks arithmetic and inputs and
raises `RlsimError` with one line saying the fix. Derived values (B = P x G, the learning rate from
the rule, the micro-batch used for gradient diagnostics) are properties computed here and only here.
`dataclasses.asdict(cfg)` plus `derived()` is what goes into the trace metadata under `config`.
Each field states its default and help once: `rlrun record`, `rlrun calibrate` and `rlrun probe` make
their options from them (`rlsim.cli.opts`, as `rlsim` does from its WhatIf). `ProbeConfig` is `rlrun probe`'s:
its sizes and rounds, and a RunConfig for the options its RL steps share.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rlsim.replay.errors import RlsimError
from rlsim.replay.util import default_group

ALGOS = ("grpo", "ppo")
LR_RULES = ("sqrt", "linear", "fixed")


# The rlrun commands that take a field as an option (rlsim.cli.opts makes the option from the field); cli=():
# none (the optimizer's constants are the library's). `probe` takes what shapes its RL steps, not what only a
# recording has (its steps, evals, calibration, split mode) nor what differs per size (P, --gen-batch).
RECORD, BOTH = ("record",), ("record", "calibrate")
RUN, ALL, PROBE = ("record", "probe"), ("record", "calibrate", "probe"), ("probe",)


def _f(default, help: str, cli: tuple[str, ...] = RECORD, **kw):
    """A field with its help text; `cli`: the rlrun commands taking it as an option (--field-name, or `flags`;
    `required`: the command asks for it even though the library has a default)."""
    return field(default=default, metadata={"help": help, "cli": cli, **kw})


def _flag(name: str) -> str:
    """The option that sets RunConfig field `name`, as rlrun spells it (its first flag)."""
    f = RunConfig.__dataclass_fields__[name]
    return (f.metadata.get("flags") or ["--" + name.replace("_", "-")])[0]


@dataclass(frozen=True)
class RunConfig:
    algo: str = _f("grpo", "RL algorithm: grpo (group-relative advantages) or ppo (value model + GAE)", cli=ALL)
    prompts: int = _f(32, "P: prompts per optimizer update (verl data.train_batch_size)", cli=BOTH,
                      flags=["--prompts", "--batch", "-P", "-b"])
    group: int | None = _f(None, "G: responses per prompt, 1 for PPO (None: 8 for GRPO)", cli=ALL,
                           flags=["--group", "-G", "-g"])
    steps: int = _f(50, "optimizer updates (RL steps) to run")
    lr: float = _f(3e-4, "reference learning rate (Adam), at batch --lr-ref-batch responses", cli=RUN)
    lr_rule: str = _f("sqrt", "how lr scales with B: sqrt (lr*sqrt(B/B_ref)), linear (lr*B/B_ref) or fixed", cli=RUN)
    lr_ref_batch: int = _f(1024, "B_ref: batch (responses) at which --lr applies", cli=RUN)
    critic_lr: float = _f(1e-3, "PPO value-model learning rate (fixed, not scaled)", cli=RUN)
    adam_beta2: float = _f(0.99, "Adam beta2", cli=())
    weight_decay: float = _f(0.0, "Adam weight decay", cli=())
    clip_grad: float = _f(1.0, "clip the full-batch gradient norm to this (0: no clipping)", cli=())
    max_tokens: int = _f(48, "maximum new tokens per response", cli=ALL)
    temperature: float = _f(1.0, "sampling temperature for training rollouts and evals", cli=ALL)
    eval_every: int = _f(5, "evaluate on held-out prompts every N updates (0: only before and after)")
    eval_prompts: int = _f(128, "held-out prompts per evaluation")
    eval_k: int = _f(4, "samples per held-out prompt (score is mean@k accuracy)")
    task: str = _f("add2", "built-in task: add2, add3, add4, addmix, sum3 or sub3 (ignored with --dataset)", cli=ALL)
    dataset: str | None = _f(None, "JSONL or Parquet file with prompt/answer columns instead of a built-in task",
                             cli=ALL)
    reward: str = _f("exact", "dataset reward: exact (whole response) or numeric (last number)", cli=ALL)
    model: str | None = _f(None, "local HF causal-LM folder (None: the built-in tiny Llama, built and cached)", cli=ALL)
    seed: int = _f(0, "random seed for prompts, sampling and torch", cli=ALL)
    # algorithm variants (GRPO as in nanochat chat_rl.py / DeepSeekMath, deviations as flags)
    std_scale: bool = _f(True, "GRPO: divide advantages by the group's reward std (Dr. GRPO: off)", cli=RUN)
    loss_agg: str = _f("token", "policy-loss aggregation: token (mean over all response tokens of the batch) or seq "
                                "(mean of per-sequence means)", cli=RUN)
    clip_eps: float = _f(0.2, "PPO-clip epsilon on the ratio (inactive with one update per batch: the ratio is 1)",
                         cli=())
    gamma: float = _f(1.0, "PPO discount", cli=RUN)
    lam: float = _f(0.95, "PPO GAE lambda", cli=RUN)
    minibatches: int = _f(1, "optimizer updates per rollout batch per epoch (1: the article's clean protocol)", cli=RUN)
    epochs: int = _f(1, "passes over each rollout batch (1: no rollout reuse)", cli=RUN)
    micro_batch: int = _f(0, "responses per micro-batch (gradient accumulation and micro-batch grad norms); 0: auto",
                          cli=ALL)
    train_devices: int = _f(1, "data-parallel training ranks, one device each (CPU: one core each, gloo; GPU: one GPU "
                               "each, NCCL), started by rlrun; gradients all-reduced; must divide the batch", cli=RUN,
                               flags=["--train-gpus"], aliases=["--train-devices"])
    compile: bool = _f(False, "torch.compile the policy (and critic) decoder for training, dynamic shapes; compiled "
                              "before recording starts (tens of seconds on CPU, recorded as trainer.warmup_s; needs a "
                              "C++ compiler on CPU)", cli=ALL)
    # placement and asynchronous rollout (split mode)
    mode: str = _f("colocated", "colocated: generate, then train, on the same devices (the synchronous reference); "
                                "split: vLLM engine replicas in their own processes on their own devices, generating "
                                "while the trainer trains")
    gen_devices: int = _f(1, "split mode: generation devices (CPU: cores; GPU: GPUs), one vLLM engine replica each",
                          flags=["--gen-gpus"], aliases=["--gen-devices"])
    max_staleness: int = _f(0, "split mode: AReaL's eta; a prompt starts only while the samples started stay within "
                               "eta policy versions of the current one (in-flight ones count); 0 = synchronous",
                            flags=["--staleness"], aliases=["--max-staleness"])
    partial_rollout: bool = _f(False, "split mode: in-flight responses continue across a weight sync (KV kept) and "
                                      "record the versions they span; off: they finish on the old weights before the "
                                      "engine loads the new ones")
    off_policy: str = _f("none", "off-policy correction: none, or tis (truncated importance sampling: each token's "
                                 "loss weighted by min(pi_train / pi_behaviour, --tis-cap), behaviour log-probs "
                                 "recorded by the engine)", cli=RUN)
    tis_cap: float = _f(2.0, "cap C of the truncated importance ratio (--off-policy tis)", cli=RUN)
    threads: int = _f(0, "CPU threads per process side (engine, each trainer rank); 0: colocated all cores, split the "
                         "side's devices; calibrate with --threads to profile at a split's per-side thread count",
                      cli=ALL)
    # engine
    max_num_seqs: int = _f(1024, "vLLM max_num_seqs: sequences decoded concurrently (1024 holds a P=128, G=8 batch in "
                                 "one wave: on CPU an engine step costs mostly per-step and per-request overhead, so "
                                 "fewer, fuller steps are faster)", cli=ALL)
    gen_batch: int = _f(0, "responses submitted to the engine per RL step (0: = train batch B; must be >= B)", cli=BOTH)
    kv_cache_gib: float = _f(1.0, "KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE on CPU; on GPU, "
                                  "converted to a memory fraction)", cli=ALL)
    max_model_len: int = _f(256, "vLLM max_model_len", cli=ALL)
    dtype: str = _f("auto", "weights dtype: auto (bf16 on CUDA where supported, else float32), float32, bfloat16",
                    cli=ALL)
    # recording
    record_steps: bool = _f(True, "record one gen_step row per engine step (off: measure the tracing overhead)",
                            cli=RUN)
    calibrate: bool = _f(True, "before the first update, profile engine steps at 1..16x the batch's concurrency and "
                               "forward+backward at 1/8..8x its tokens (calib_gen / calib_train rows; weights and "
                               "optimizer untouched), so predictions at other batch sizes "
                               "interpolate instead of extrapolating")
    drift_every: int = _f(4, "every N updates, repeat a small fixed probe (an engine visit and a training pass, "
                             "drift_gen / drift_train rows) so the fit can state and remove the "
                             "machine's speed drift (0: off)")
    progress: bool = _f(True, "show a progress bar")
    out: str = _f("traces/run.parquet", "output trace path", cli=ALL, flags=["--out", "-o"], required=True)
    overwrite: bool = _f(False, "replace an existing trace at --out", cli=ALL, flags=["--overwrite"])

    # ---- derived values: the one place they are computed -------------------------------------
    @property
    def G(self) -> int:
        if self.group is not None:
            return self.group
        return default_group(self.algo)

    @property
    def responses_per_update(self) -> int:
        """B = P x G responses trained per update (the trace metadata's `batch`)."""
        return self.prompts * self.G

    @property
    def lr_effective(self) -> float:
        ratio = self.responses_per_update / self.lr_ref_batch
        if self.lr_rule == "sqrt":
            return self.lr * math.sqrt(ratio)
        if self.lr_rule == "linear":
            return self.lr * ratio
        return self.lr

    @property
    def micro(self) -> int:
        """Responses per micro-batch (per rank): explicit, or the (mini)batch split in 4 (at least 4 responses).

        Four micro-batches give the small-batch gradient norms for the noise-scale estimate at little cost
        (docs/results.md section 10)."""
        per_update = self.responses_per_update // (self.minibatches * self.train_devices)
        if self.micro_batch:
            return min(self.micro_batch, per_update)
        return max(min(per_update, 4), per_update // 4)

    @property
    def gen_responses(self) -> int:
        return self.gen_batch or self.responses_per_update

    def derived(self) -> dict[str, Any]:
        # the trace metadata names B `batch` (docs/trace-format.md), as the shipped traces have it
        return {"G": self.G, "batch": self.responses_per_update, "lr_effective": self.lr_effective,
                "micro_batch": self.micro, "gen_responses": self.gen_responses}

    def to_meta(self) -> dict[str, Any]:
        d = asdict(self)
        d["group"] = self.G
        d.update(self.derived())
        return d

    # ---- validation -----------------------------------------------------------------------------
    def validate(self, check_files: bool = True) -> "RunConfig":
        """Raise RlsimError (one line, with the fix) for impossible arithmetic or bad inputs."""
        def bad(msg: str):
            raise RlsimError(msg)

        if self.algo not in ALGOS:
            bad(f"unknown --algo {self.algo!r}; choose grpo or ppo")
        if self.lr_rule not in LR_RULES:
            bad(f"unknown --lr-rule {self.lr_rule!r}; choose sqrt, linear or fixed")
        if self.loss_agg not in ("token", "seq"):
            bad(f"unknown --loss-agg {self.loss_agg!r}; choose token or seq")
        if self.reward not in ("exact", "numeric"):
            bad(f"unknown --reward {self.reward!r}; choose exact or numeric")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            bad(f"unknown --dtype {self.dtype!r}; choose auto, float32, bfloat16 or float16")
        for name in ("steps", "max_tokens", "eval_prompts", "eval_k", "minibatches", "epochs", "train_devices",
                     "gen_devices",
                     "max_num_seqs", "lr_ref_batch", "max_model_len"):
            v = getattr(self, name)
            if v < 1:
                bad(f"{_flag(name)} is {v}; it must be at least 1")
        for name in ("eval_every", "micro_batch", "gen_batch", "seed", "max_staleness", "threads", "drift_every"):
            v = getattr(self, name)
            if v < 0:
                bad(f"{_flag(name)} is {v}; it must be 0 or more")
        if self.prompts < 1:
            bad(f"--prompts (P) is {self.prompts}; it must be at least 1 prompt per update")
        if self.group is not None and self.group < 1:
            bad(f"--group (G) is {self.group}; it must be at least 1 (GRPO needs at least 2)")
        if self.algo == "grpo" and self.G < 2:
            bad(f"GRPO needs --group (G) of at least 2 responses per prompt to compare within a group; got {self.G}")
        if self.algo == "ppo" and self.G != 1:
            bad(f"PPO uses one response per prompt (G = 1); drop --group {self.G} or use --algo grpo")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            bad(f"--lr is {self.lr}; it must be a positive number")
        if self.critic_lr <= 0:
            bad(f"--critic-lr is {self.critic_lr}; it must be positive")
        if self.temperature < 0:
            bad(f"--temperature is {self.temperature}; it must be 0 or more")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            bad("--gamma and --lam must lie in [0, 1]")
        B = self.responses_per_update
        if self.gen_batch and self.gen_batch < B:
            bad(f"--gen-batch {self.gen_batch} is smaller than the train batch B = P x G = {B}; generate at least B "
                "responses per step")
        if self.mode not in ("colocated", "split"):
            bad(f"unknown --mode {self.mode!r}; choose colocated or split")
        if self.off_policy not in ("none", "tis"):
            bad(f"unknown --off-policy {self.off_policy!r}; choose none or tis")
        if not (self.tis_cap >= 1 and math.isfinite(self.tis_cap)):
            bad(f"--tis-cap is {self.tis_cap}; it must be at least 1")
        if self.mode == "colocated":
            for name, v, default in (("max_staleness", self.max_staleness, 0),
                                     ("partial_rollout", self.partial_rollout, False),
                                     ("gen_devices", self.gen_devices, 1)):
                if v != default:
                    bad(f"{_flag(name)} needs --mode split (asynchronous rollout on separate generation devices)")
        if B % self.train_devices:
            bad(f"batch B = P x G = {B} is not divisible by --train-gpus {self.train_devices}; choose P so "
                f"that P x G is a multiple of {self.train_devices}")
        if self.train_devices > 1 and self.prompts % self.train_devices:
            bad(f"--prompts {self.prompts} is not divisible by --train-gpus {self.train_devices}: each rank trains "
                f"whole groups; choose P as a multiple of {self.train_devices}")
        per_rank = self.responses_per_update // self.train_devices
        if per_rank % self.minibatches:
            bad(f"batch per rank {per_rank} is not divisible by --minibatches {self.minibatches}; choose P or "
                "--minibatches so it divides")
        if self.micro_batch and (per_rank // self.minibatches) % self.micro:
            bad(f"minibatch of {per_rank // self.minibatches} responses is not divisible by --micro-batch "
                f"{self.micro_batch}")
        if self.max_tokens >= self.max_model_len:
            bad(f"--max-tokens {self.max_tokens} must be below --max-model-len {self.max_model_len}")
        if self.dataset is None:
            from rlsim.runner.tasks import BUILTIN_TASKS

            if self.task not in BUILTIN_TASKS:
                bad(f"unknown --task {self.task!r}; choose one of {', '.join(BUILTIN_TASKS)} or pass --dataset FILE")
        if check_files:
            from rlsim.runner.placement import place

            # devices exist, do not overlap
            place(self.mode, self.gen_devices, self.train_devices, threads=self.threads)
            if self.model is not None:
                from rlsim.runner.model import check_model_dir

                check_model_dir(self.model)
            if self.dataset is not None:
                from rlsim.runner.tasks import load_dataset

                load_dataset(self.dataset)
            if self.dataset is not None and self.model is None:
                bad("--dataset needs --model DIR: the built-in tiny model only knows the arithmetic character set")
            out = Path(self.out)
            if out.suffix != ".parquet":
                bad(f"--out {self.out} should end in .parquet")
            if not self.overwrite and (out.exists() or Path(f"{out}.partial.arrow").exists()):
                bad(f"{self.out} already exists; pass --overwrite to replace it or choose another --out")
        return self

    def with_(self, **kw) -> "RunConfig":
        return replace(self, **kw)


def field_help() -> dict[str, str]:
    return {f.name: f.metadata.get("help", "") for f in fields(RunConfig)}


@dataclass(frozen=True)
class ProbeConfig:
    """`rlrun probe`: full RL steps at several sizes in one process, each round running every size once in a
    shuffled order, so that each size's throughput is paired with the smallest's under the same conditions."""
    prompts: tuple[int, ...] = _f((), "P of each size to probe, two or more, as a comma list (e.g. 16,64,256); sigma "
                                      "is each size's responses/s over the smallest's", cli=PROBE,
                                  flags=["--prompts", "--batch", "-P", "-b"], required=True)
    rounds: int = _f(3, "rounds: each runs every size once, in an order shuffled by --seed, and pairs each size with "
                        "the smallest; 2 or more give sigma a 90 % interval", cli=PROBE)
    visit_steps: int = _f(2, "RL steps at a size each time a round visits it: the first settles the switch from the "
                             "previous size (its memory and caches) and is recorded but not counted in sigma",
                          cli=PROBE)
    run: RunConfig = _f(RunConfig(), "the options every step shares (its prompts, steps, evals and calibration are the "
                                     "probe's: see `at`)", cli=())

    @property
    def smallest(self) -> int:
        return min(self.prompts)

    @property
    def steps(self) -> int:
        """Recorded RL steps: every size visited once per round for `visit_steps` steps (the warm-up step at each size
        is not recorded)."""
        return self.rounds * len(self.prompts) * self.visit_steps

    def at(self, prompts: int) -> RunConfig:
        """The run options of the steps at size P = `prompts`: no evals, no calibration, no drift probe (the pairing
        within a round is the probe's drift control), lr by the run's rule at that size's B."""
        return self.run.with_(prompts=prompts, steps=self.steps, eval_every=0, calibrate=False, drift_every=0)

    @property
    def reference(self) -> RunConfig:
        """The options at the smallest size, the reference of sigma: the trace metadata's `config`."""
        return self.at(self.smallest)

    def to_meta(self) -> dict[str, Any]:
        G = self.run.G
        return {"sizes": list(self.prompts), "group": G, "batch": [p * G for p in self.prompts], "rounds": self.rounds,
                "visit_steps": self.visit_steps,
                "lr_effective": [self.at(p).lr_effective for p in self.prompts]}

    def validate(self, check_files: bool = True) -> "ProbeConfig":
        """Raise RlsimError (one line, with the fix) for bad sizes or rounds, or options that fail RunConfig's
        validation at any size."""
        ps = list(self.prompts)
        if any(isinstance(p, bool) or not isinstance(p, int) for p in ps):
            raise RlsimError(f"--prompts sizes must be whole numbers of prompts, got {ps}")
        if len(ps) < 2:
            raise RlsimError("give at least two sizes to compare, e.g. --prompts 16,64,256 (sigma is each size's "
                             "responses/s over the smallest's)")
        twice = [p for i, p in enumerate(ps) if p in ps[:i]]
        if twice:
            raise RlsimError(f"--prompts lists {twice[0]} more than once "
                             f"({','.join(map(str, ps))}); give each size once")
        if self.rounds < 1:
            raise RlsimError(f"--rounds is {self.rounds}; it must be at least 1 (2 or more give sigma a 90 % interval)")
        if self.visit_steps < 1:
            raise RlsimError(f"--visit-steps is {self.visit_steps}; it must be at least 1 (2, the default, settles "
                             "each switch of size before the step that counts)")
        if self.run.mode != "colocated":
            raise RlsimError("rlrun probe runs colocated (generate, then train, on the same devices); "
                             "drop --mode split")
        if self.run.gen_batch:
            raise RlsimError("rlrun probe generates B = P x G responses at each size; drop --gen-batch")
        self._validate_sizes()
        if self.run.train_devices > 1:
            self._check_micro()
        self.reference.validate(check_files)  # the files and the output, once
        return self

    def _validate_sizes(self) -> None:
        """RunConfig's checks at every size. A failure every size shares is a bad option and is reported as it is;
        one that only some sizes hit names the first such size."""
        errors = {}
        for p in sorted(self.prompts):
            try:
                self.at(p).validate(check_files=False)
            except RlsimError as e:
                errors[p] = str(e)
        if not errors:
            return
        first = next(iter(errors))
        msg = errors[first]
        if ((len(errors) == len(self.prompts) and len(set(errors.values())) == 1)
                or re.search(rf"--prompts (\(P\) is )?{first}\b", msg)):
            raise RlsimError(msg)
        raise RlsimError(f"at --prompts {first}: {msg}")

    def _check_micro(self) -> None:
        """The helper ranks of data-parallel training keep the micro-batch size they started with (RunConfig.micro
        at the smallest size): only a --micro-batch every size uses keeps the ranks alike."""
        ref = self.reference
        per_update = ref.responses_per_update // (ref.minibatches * ref.train_devices)
        if not ref.micro_batch or ref.micro_batch > per_update:
            raise RlsimError(f"rlrun probe with --train-gpus {ref.train_devices} needs --micro-batch N with N at most "
                             f"{per_update} (the smallest size's responses per rank and minibatch), so that every size "
                             "trains in micro-batches of N on every rank")
