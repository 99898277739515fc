"""Fixtures for the importer tests: real public log lines (verbatim, provenance beside each) and
builders that write logs in the frameworks' formats with numbers the tests set.

The verbatim lines come from public GitHub issues, as quoted there (found with the session's issue
search); where the quote ends mid-line the fixture ends there too and says so.
"""
from __future__ import annotations

import json
from pathlib import Path

# ---- verl: real console lines -------------------------------------------------------------------

# verl-project/verl issue #2060 "Why are the log step:0 and subsequent steps in different formats?"
# (2025-06-17), first line of the description, verbatim: the validation-before-training line.
VERL_2060_STEP0 = ("step:0 - val-aux/openai/gsm8k/reward/mean@1:0.565 - val-aux/openai/gsm8k/score/mean@1:0.565 - "
                   "val-core/openai/gsm8k/acc/mean@1:0.508")

# verl-project/verl issue #2060, second line, verbatim as far as the public quote goes: it ends inside the
# key `prompt_length/m...`, i.e. a truncated line.
VERL_2060_STEP1_CUT = (
    "step:1 - global_seqlen/min:484245.000 - global_seqlen/max:519990.000 - global_seqlen/minmax_diff:35745.000 - "
    "global_seqlen/balanced_min:501736.000 - global_seqlen/balanced_max:501737.000 - global_seqlen/mean:501736.750 - "
    "actor/entropy:0.323 - training/rollout_probs_diff_max:0.621 - training/rollout_probs_diff_mean:0.003 - "
    "training/rollout_probs_diff_std:0.008 - actor/kl_loss:0.000 - actor/kl_coef:0.001 - actor/pg_loss:0.001 - "
    "actor/pg_clipfrac:0.001 - actor/ppo_kl:-0.000 - actor/pg_clipfrac_lower:0.000 - actor/grad_norm:0.020 - "
    "perf/mfu/actor:0.343 - perf/max_memory_allocated_gb:62.447 - perf/max_memory_reserved_gb:91.455 - "
    "perf/cpu_memory_used_gb:102.490 - actor/lr:0.000 - training/global_step:1.000 - training/epoch:0.000 - "
    "critic/score/mean:0.558 - critic/score/max:1.000 - critic/score/min:0.000 - critic/rewards/mean:0.558 - "
    "critic/rewards/max:1.000 - critic/rewards/min:0.000 - critic/advantages/mean:-0.016 - "
    "critic/advantages/max:1.789 - critic/advantages/min:-1.789 - critic/returns/mean:-0.016 - "
    "critic/returns/max:1.789 - critic/returns/min:-1.789 - response_length/mean:288.698 - "
    "response_length/max:963.000 - response_length/min:87.000 - response_length/clip_ratio:0.000 - prompt_length/m")

# verl-project/verl issue #1208 "veRL-SGLang slower than expected (GH200)", turn 0 (EduardDurech), the
# `(TaskRunner pid=16292) step:2` line verbatim up to `timing_s/step:96.551` (the public quote wraps
# inside `response_length/cl|ip_ratio`, joined here; the line goes on with timing_per_token_ms/*, cut
# here at a field boundary).
VERL_1208_STEP2 = (
    "(TaskRunner pid=16292) step:2 - global_seqlen/min:538646.000 - global_seqlen/max:556412.000 - "
    "global_seqlen/minmax_diff:17766.000 - global_seqlen/balanced_min:547190.000 - "
    "global_seqlen/balanced_max:547191.000 - global_seqlen/mean:547190.500 - actor/kl_loss:0.001 - "
    "actor/kl_coef:0.001 - actor/entropy_loss:0.554 - actor/pg_loss:0.001 - actor/pg_clipfrac:0.000 - "
    "actor/ppo_kl:0.000 - actor/grad_norm:0.069 - perf/mfu/actor:1.018 - perf/max_memory_allocated_gb:25.921 - "
    "perf/max_memory_reserved_gb:61.611 - perf/cpu_memory_used_gb:360.092 - actor/lr:0.000 - critic/score/mean:0.011 - "
    "critic/score/max:1.000 - critic/score/min:0.000 - critic/rewards/mean:0.011 - critic/rewards/max:1.000 - "
    "critic/rewards/min:0.000 - critic/advantages/mean:-0.003 - critic/advantages/max:1.789 - "
    "critic/advantages/min:-0.730 - critic/returns/mean:-0.003 - critic/returns/max:1.789 - "
    "critic/returns/min:-0.730 - response_length/mean:324.958 - response_length/max:1024.000 - "
    "response_length/min:9.000 - response_length/clip_ratio:0.004 - prompt_length/mean:102.534 - "
    "prompt_length/max:256.000 - prompt_length/min:63.000 - prompt_length/clip_ratio:0.000 - timing_s/gen:74.020 - "
    "timing_s/old_log_prob:3.566 - timing_s/ref:3.420 - timing_s/adv:1.167 - timing_s/update_actor:14.302 - "
    "timing_s/step:96.551")

# verl-project/verl issue #316 (turn 0, yiyepiaoling0715), the `(main_task pid=51520) step:5` line verbatim as
# far as the public quote goes (it wraps inside `prom|pt_length/min`, joined; it ends inside `timing_s/s...`):
# old-style eval key val/test_score/openai/gsm8k and a truncated tail.
VERL_316_STEP5_CUT = (
    "(main_task pid=51520) step:5 - global_seqlen/min:992132.000 - global_seqlen/max:1002660.000 - "
    "global_seqlen/minmax_diff:10528.000 - global_seqlen/balanced_min:996861.000 - "
    "global_seqlen/balanced_max:996862.000 - global_seqlen/mean:996861.250 - actor/kl_loss:0.071 - "
    "actor/kl_coef:0.001 - actor/entropy_loss:5.683 - actor/pg_loss:0.000 - actor/pg_clipfrac:0.000 - "
    "actor/ppo_kl:0.002 - actor/grad_norm:0.180 - mfu/actor:0.083 - actor/lr:0.000 - "
    "val/test_score/openai/gsm8k:0.171 - critic/score/mean:0.008 - critic/score/max:1.000 - critic/score/min:0.000 - "
    "critic/rewards/mean:0.008 - critic/rewards/max:1.000 - critic/rewards/min:0.000 - critic/advantages/mean:-0.002 - "
    "critic/advantages/max:1.789 - critic/advantages/min:-0.730 - critic/returns/mean:-0.002 - "
    "critic/returns/max:1.789 - critic/returns/min:-0.730 - response_length/mean:684.393 - "
    "response_length/max:1024.000 - response_length/min:3.000 - response_length/clip_ratio:0.521 - "
    "prompt_length/mean:94.405 - prompt_length/max:201.000 - prompt_length/min:52.000 - "
    "prompt_length/clip_ratio:0.000 - timing_s/gen:262.359 - timing_s/old_log_prob:38.159 - timing_s/ref:39.101 - "
    "timing_s/adv:1.931 - timing_s/update_actor:157.615 - timing_s/testing:78.133 - timing_s/s")

# verl-project/verl issue #7412 "repsonse_length_cliprate is so height" (turn 0, Kivw): recent full-precision
# format, verbatim up to where the public quote ends (after `response_length/min:38.0 -`, a cut line).
VERL_7412_STEP34_CUT = (
    "(TaskRunner pid=222265) step:34 - global_seqlen/min:419336 - global_seqlen/max:497506 - "
    "global_seqlen/minmax_diff:78170 - global_seqlen/balanced_min:458960 - global_seqlen/balanced_max:458975 - "
    "global_seqlen/mean:458966.5 - actor/entropy:0.22266578674316406 - perf/mfu/actor_infer:0.0 - "
    "actor/pg_clipfrac:0.0007935191160472839 - actor/ppo_kl:-8.163164312320433e-06 - "
    "actor/pg_clipfrac_lower:6.1140820869933e-07 - actor/pg_loss:0.042396901015308686 - "
    "actor/kl_loss:0.0013280365410537343 - actor/kl_coef:0.0010000000000000002 - actor/loss:0.042398229241371155 - "
    "actor/grad_norm:0.129638671875 - actor/perf/max_memory_allocated_gb:24.52155876159668 - "
    "actor/perf/max_memory_reserved_gb:27.626953125 - actor/perf/cpu_memory_used_gb:148.17413711547852 - "
    "actor/lr:2e-06 - perf/mfu/actor:0.0 - training/global_step:34 - training/epoch:0 - "
    "critic/score/mean:-0.0182796623557806 - critic/score/max:1.0 - critic/score/min:-1.0 - "
    "critic/rewards/mean:-0.0182796623557806 - critic/rewards/max:1.0 - critic/rewards/min:-1.0 - "
    "critic/advantages/mean:-0.0423407182097435 - critic/advantages/max:1.7888524532318115 - "
    "critic/advantages/min:-1.7888524532318115 - critic/returns/mean:-0.0423407182097435 - "
    "critic/returns/max:1.7888524532318115 - critic/returns/min:-1.7888524532318115 - "
    "response_length/mean:1267.024169921875 - response_length/max:3072.0 - response_length/min:38.0 -")

# numpy-scalar values as recent verl prints them, quoted in public repositories that parse verl logs: a
# watchdog script's comment "`actor/grad_norm:np.float64(0.00247)`, `rollout_corr/training_ppl:np.float64(1.776)`,
# while critic/* and training/* are bare floats" (search-index file 70968127898) and a benchmark script grepping
# `actor/perf/max_memory_allocated_gb:np\.float64\(...\)` (search-index file 66425664760). Fragments, verbatim.
VERL_NP_FRAGMENTS = ("actor/grad_norm:np.float64(0.00247)", "rollout_corr/training_ppl:np.float64(1.776)")

# ---- verl: the same FORMAT with numbers the tests set ---------------------------------------------
# Keys and their order follow VERL_1208_STEP2 (verl issue #1208) plus timing_s/reward and timing_s/testing
# (metric names of verl/trainer/ppo/ray_trainer.py's marked_timer blocks); values are the tests' own.


def verl_line(step: int, *, gen: float, reward: float, old_log_prob: float, ref: float, adv: float, update_actor: float,
              other: float = 0.25, testing: float | None = None, resp_mean: float = 300.0, resp_min: float = 20.0,
              resp_max: float = 900.0, clip: float = 0.0, prompt_mean: float = 100.0, P: int = 64, G: int = 4,
              lr_repr: str = "np.float64(1e-06)", tag: str = "(TaskRunner pid=4242) ", val: float | None = None,
              n_gpus: int = 8) -> tuple[str, float]:
    """One verl console line (np.float64 values for actor/*, bare floats elsewhere, as recent verl prints
    them) and its step time."""
    step_t = gen + reward + old_log_prob + ref + adv + update_actor + other + (testing or 0.0)
    B = P * G
    tokens = int(round(B * (resp_mean + prompt_mean)))
    kv = [("actor/pg_loss", f"np.float64({0.001 * step})"), ("actor/grad_norm", "np.float64(0.069)"),
          ("actor/lr", lr_repr), ("training/global_step", str(step)), ("training/epoch", "0")]
    if val is not None:
        kv.append(("val-core/openai/gsm8k/acc/mean@1", repr(val)))
    kv += [("critic/score/mean", "0.5"), ("critic/score/max", "1.0"), ("critic/score/min", "0.0"),
           ("response_length/mean", repr(resp_mean)), ("response_length/max", repr(resp_max)),
           ("response_length/min", repr(resp_min)), ("response_length/clip_ratio", repr(clip)),
           ("prompt_length/mean", repr(prompt_mean)), ("prompt_length/max", repr(prompt_mean * 2)),
           ("prompt_length/min", repr(prompt_mean / 2)), ("prompt_length/clip_ratio", "0.0"),
           ("timing_s/gen", repr(gen)), ("timing_s/reward", repr(reward)),
           ("timing_s/old_log_prob", repr(old_log_prob)),
           ("timing_s/ref", repr(ref)), ("timing_s/adv", repr(adv)), ("timing_s/update_actor", repr(update_actor))]
    if testing is not None:
        kv.append(("timing_s/testing", repr(testing)))
    kv += [("timing_s/step", repr(step_t)), ("timing_per_token_ms/gen", repr(gen * 1000 / (B * resp_mean))),
           ("perf/total_num_tokens", str(tokens)), ("perf/time_per_step", repr(step_t)),
           ("perf/throughput", repr(tokens / (step_t * n_gpus)))]
    return f"{tag}step:{step} - " + " - ".join(f"{k}:{v}" for k, v in kv), step_t


def verl_phase_table(n: int = 8, seed: int = 0):
    """Phase seconds per step for round-trip tests (deterministic)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for s in range(1, n + 1):
        rows.append(dict(gen=round(float(10 + rng.uniform(0, 4)), 6), reward=round(float(0.5 + rng.uniform(0, 0.2)), 6),
                         old_log_prob=round(float(1.2 + rng.uniform(0, 0.3)), 6),
                         ref=round(float(1.1 + rng.uniform(0, 0.3)), 6),
                         adv=round(float(0.03 + rng.uniform(0, 0.01)), 6),
                         update_actor=round(float(5 + rng.uniform(0, 1)), 6),
                         resp_mean=round(float(250 + 40 * rng.uniform()), 3),
                         resp_max=float(700 + int(300 * rng.uniform())),
                         testing=14.0 if s % 4 == 0 else None, val=0.5 + 0.05 * s if s % 4 == 0 else None))
    return rows


def write_verl_log(path: Path, table, *, P: int = 64, G: int = 4, extra_lines=(),
                   val0: float | None = 0.4) -> list[float]:
    lines = ["(TaskRunner pid=4242) Size of train dataloader: 117, Size of val dataloader: 1"]
    if val0 is not None:
        lines.append(f"(TaskRunner pid=4242) step:0 - val-core/openai/gsm8k/acc/mean@1:{val0!r}")
    steps = []
    for i, r in enumerate(table, 1):
        line, t = verl_line(i, P=P, G=G, **r)
        lines.append(line)
        steps.append(t)
    lines += list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return steps


VERL_CONFIG = """\
# keys and nesting of verl's saved Hydra config (verl/trainer/config/ppo_trainer.yaml); values the tests'
data:
  train_files: ~/data/gsm8k/train.parquet
  train_batch_size: 64
  max_prompt_length: 512
  max_response_length: 1024
actor_rollout_ref:
  model:
    path: Qwen/Qwen2.5-0.5B-Instruct
  actor:
    optim:
      lr: 1.0e-06
  rollout:
    n: 4
    tensor_model_parallel_size: 1
    max_num_seqs: 1024
algorithm:
  adv_estimator: grpo
trainer:
  n_gpus_per_node: 8
  nnodes: 1
"""

# ---- TRL -----------------------------------------------------------------------------------------

# huggingface.co/jalva182/cli-agent-model, trainer_state.json (commit 7018a700), log_history[0] verbatim: a
# GRPOTrainer entry (no step_time: that TRL version did not log it).
TRL_ENTRY_STEP1 = {
    "clip_ratio/high_max": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/low_mean": 0.0, "clip_ratio/low_min": 0.0,
    "clip_ratio/region_mean": 0.0, "completion_length": 11.0, "completions/clipped_ratio": 0.0,
    "completions/max_length": 11.0, "completions/max_terminated_length": 11.0, "completions/mean_length": 11.0,
    "completions/mean_terminated_length": 11.0, "completions/min_length": 11.0,
    "completions/min_terminated_length": 11.0,
    "epoch": 0.018518518518518517, "frac_reward_zero_std": 1.0, "grad_norm": 0.0009821385610848665,
    "kl": 8.805232027953025e-06, "learning_rate": 0.0, "loss": 0.0, "num_tokens": 268.0, "reward": 8.0,
    "reward_std": 0.0, "rewards/reward_combined/mean": 8.0, "rewards/reward_combined/std": 0.0, "step": 1,
}


def trl_entry(step: int, *, step_time: float, mean_len: float, num_tokens: float) -> dict:
    """A log_history entry with TRL GRPOTrainer's key set (as TRL_ENTRY_STEP1, plus `step_time`, the name the
    public trackio export abidlabs/trackio-new shows as train/step_time); numbers the tests'. num_tokens is
    cumulative (prompt + completion tokens seen so far), as TRL logs it."""
    return {"clip_ratio/region_mean": 0.0, "completions/clipped_ratio": 0.0, "completions/max_length": 2 * mean_len,
            "completions/mean_length": mean_len, "completions/min_length": mean_len / 4, "epoch": step / 100,
            "frac_reward_zero_std": 0.25, "grad_norm": 0.5, "kl": 0.001, "learning_rate": 1e-06, "loss": 0.01,
            "num_tokens": num_tokens, "reward": 0.3 + 0.01 * step, "reward_std": 0.2, "step": step,
            "step_time": step_time}


def write_trl_state(path: Path, entries: list[dict], *, train_batch_size: int = 8, evals=()) -> None:
    state = {"best_metric": None, "epoch": 0.1, "eval_steps": 500, "global_step": entries[-1]["step"],
             "is_hyper_param_search": False, "is_local_process_zero": True, "is_world_process_zero": True,
             "log_history": list(entries) + list(evals), "logging_steps": 1, "max_steps": 1000, "num_train_epochs": 1,
             "save_steps": 500, "total_flos": 0.0, "train_batch_size": train_batch_size, "trial_name": None}
    path.write_text(json.dumps(state, indent=2))


# ---- OpenRLHF ------------------------------------------------------------------------------------
# No public OpenRLHF metric export was found to copy, so these rows are built from OpenRLHF's source: its
# PPO trainer logs {"train/%s" % k: v} for the status keys policy_loss, actor_lr, kl, reward, return,
# response_length, total_length (+ global_step), and with --perf {"perf/experience_maker/<k>": v} for
# perf_stats = {"generate_time", "actor_value_rm_time", "wait_time"} (openrlhf/trainer/ppo_trainer.py and
# ppo_utils/experience_maker.py); W&B adds _step, _runtime and _timestamp. Numbers are the tests'.
OPENRLHF_COLUMNS = ("_step", "_runtime", "_timestamp", "train/global_step", "train/policy_loss", "train/actor_lr",
                    "train/kl", "train/reward", "train/return", "train/response_length", "train/total_length",
                    "perf/experience_maker/generate_time", "perf/experience_maker/actor_value_rm_time",
                    "perf/experience_maker/wait_time")


def write_openrlhf_csv(path: Path, steps: list[dict], *, start: float = 120.0) -> list[float]:
    """steps: dicts with gen, avrm, wait, train, resp, total. Returns each step's wall time."""
    lines = [",".join(OPENRLHF_COLUMNS)]
    t = start
    walls = []
    for i, s in enumerate(steps, 1):
        wall = s["gen"] + s["avrm"] + s["wait"] + s["train"]
        t += wall
        walls.append(wall)
        vals = [i - 1, t, 1.7e9 + t, i, -0.01, 5e-7, 0.002, 0.4, 0.35, s["resp"], s["total"], s["gen"], s["avrm"],
                s["wait"]]
        lines.append(",".join(repr(float(v)) if isinstance(v, float) else str(v) for v in vals))
    path.write_text("\n".join(lines) + "\n")
    return walls


OPENRLHF_CONFIG = """\
# OpenRLHF launch arguments as W&B stores the run config (wandb.init(config=args.__dict__)): {key: {desc, value}}
rollout_batch_size:
  desc: null
  value: 128
n_samples_per_prompt:
  desc: null
  value: 8
actor_num_nodes:
  value: 1
actor_num_gpus_per_node:
  value: 8
vllm_num_engines:
  value: 4
vllm_tensor_parallel_size:
  value: 2
pretrain:
  value: meta-llama/Llama-3.1-8B-Instruct
prompt_max_len:
  value: 1024
generate_max_len:
  value: 1024
advantage_estimator:
  value: reinforce_baseline
actor_learning_rate:
  value: 5.0e-07
"""


def write_step_lines(path: Path, body: str, steps=range(1, 7), tag: str = "") -> None:
    """A console log of identical step lines `step:N - <body>` (a table's means, say)."""
    path.write_text("\n".join(f"{tag}step:{s} - {body}" for s in steps) + "\n")
