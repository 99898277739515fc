"""The rlsim trace format, version 6: one Parquet file per run, one row per event.

Every row has `kind` in EVENT_KINDS and the common columns; the other columns are null where
they do not apply to the row's kind. Times are seconds from run start on one monotonic clock.
Run metadata is JSON under the Parquet key-value metadata key `rlsim` (see docs/trace-format.md).

Every version since 1 is additive, so older files read as they were, their missing columns null (COLUMN_SINCE
says which version added each) and missing placement fields of the run config defaulted (CONFIG_DEFAULTS,
`placement`):
- 2: step-level traces imported from other frameworks' logs (`phase`, `step_stats`; docs/importing.md) and the
  calibration profiles (`calib_gen`, `calib_train`, column `calib_level`; replay/calibration.py fits them);
- 3: split-mode recordings (`engine_id`, `rank`, `finish_version`; kinds `idle`, `train_rank`, `allreduce`);
  in a split trace the `update` row's `step_time` runs from the end of the previous weight sync to the end of
  this one's, and `sync` has one row per engine replica per update;
- 4: the drift probe (`drift_gen`, `drift_train`) and the column `threads` on calibration and drift rows;
- 5: the `update` row's memory peaks, `mem_gen_peak_bytes` and `mem_train_peak_bytes` (runner/peaks.py);
- 6: the column `load_threads` on calibration rows measured while the other side ran beside them (interference).
Each kind and column in full: docs/trace-format.md.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)  # the reader accepts these; an older file lacks the newer COLUMN_SINCE columns
META_KEY = b"rlsim"

GEN_STEP, RESPONSE, UPDATE, SYNC, EVAL = "gen_step", "response", "update", "sync", "eval"
# version 2: step-level traces (imported logs): one `phase` row per RL step and timed phase, one
# `step_stats` row per RL step (length and score statistics, every logged metric as JSON)
PHASE, STEP_STATS = "phase", "step_stats"
# version 2: calibration profiles recorded by `rlrun record` (before the first update) and `rlrun calibrate`:
# one `calib_gen` row per engine step at a ladder of concurrencies, one `calib_train` row per forward +
# backward pass at a ladder of token counts (no optimizer step). Their `t_start` is seconds from the start
# of the calibration, its own clock (it runs before the run's t = 0); `step` and `policy_version` are 0.
CALIB_GEN, CALIB_TRAIN = "calib_gen", "calib_train"
CALIB_KINDS = (CALIB_GEN, CALIB_TRAIN)
# version 3: split-mode recordings. `idle`: an interval a generation engine (engine_id set, rank null) or a
# trainer rank (rank set, engine_id null) waited with nothing to do (step = the policy version at its start);
# `train_rank`: one data-parallel rank's forward + backward of one update; `allreduce`: one rank's gradient
# all-reduce of one update. The fit ignores them (it fits colocated recordings only).
IDLE, TRAIN_RANK, ALLREDUCE = "idle", "train_rank", "allreduce"
SPLIT_KINDS = (IDLE, TRAIN_RANK, ALLREDUCE)
# version 4: the drift probe, rows like calib_gen / calib_train but on the run's clock (`step`: the update
# after which the probe ran; `calib_level`: the probe's fixed size), recorded every few updates.
DRIFT_GEN, DRIFT_TRAIN = "drift_gen", "drift_train"
DRIFT_KINDS = (DRIFT_GEN, DRIFT_TRAIN)
EVENT_KINDS = (GEN_STEP, RESPONSE, UPDATE, SYNC, EVAL, PHASE, STEP_STATS, CALIB_GEN, CALIB_TRAIN, IDLE, TRAIN_RANK,
               ALLREDUCE, DRIFT_GEN, DRIFT_TRAIN)

f64, i64 = pa.float64(), pa.int64()

# (name, type, kinds that fill it, help). `kind`, `t_start`, `duration`, `step`, `policy_version`
# are common to all kinds.
COLUMNS: tuple[tuple[str, pa.DataType, tuple[str, ...], str], ...] = (
    ("kind", pa.string(), EVENT_KINDS, "event kind"),
    ("t_start", f64, EVENT_KINDS, "start, seconds from run start (eval: when the score was taken)"),
    ("duration", f64, EVENT_KINDS, "seconds (response: queued to finished; eval: time the eval took)"),
    ("step", i64, EVENT_KINDS, "RL step (update index, 0-based) the event belongs to"),
    ("policy_version", i64, EVENT_KINDS, "weights version in use (number of updates applied to the engine's weights)"),
    # gen_step: one vLLM engine step
    ("num_running", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN), "sequences in the step's batch"),
    ("num_waiting", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN), "requests queued but not scheduled after the step"),
    ("prefill_tokens", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN), "prompt tokens computed in the step"),
    ("decode_tokens", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN),
     "new tokens sampled in the step (one per decoding sequence)"),
    ("context_tokens", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN),
     "KV tokens attended over by the step's batch (sum of context lengths)"),
    ("kv_usage", f64, (GEN_STEP, CALIB_GEN, DRIFT_GEN), "fraction of the KV cache in use after the step"),
    ("finished", i64, (GEN_STEP, CALIB_GEN, DRIFT_GEN), "sequences that finished in the step"),
    # response: one finished response
    ("prompt_id", i64, (RESPONSE,), "index of the prompt in the task's training stream"),
    ("group_index", i64, (RESPONSE,), "index of the response within its prompt's group (0..G-1)"),
    ("prompt_tokens", i64, (RESPONSE,), "prompt length in tokens"),
    ("response_tokens", i64, (RESPONSE,), "response length in tokens"),
    ("reward", f64, (RESPONSE, UPDATE), "response: its reward; update: mean reward of the batch"),
    ("consumed_step", i64, (RESPONSE,), "update that consumed the response"),
    ("t_queued", f64, (RESPONSE,), "time the request was added to the engine"),
    ("t_first_token", f64, (RESPONSE,), "time of its first generated token"),
    ("t_finished", f64, (RESPONSE,), "time it finished"),
    # update: one optimizer update (plus the timing of the whole RL step it closes)
    ("num_responses", i64, (UPDATE, CALIB_TRAIN, TRAIN_RANK, DRIFT_TRAIN),
     "responses in the update (B = P x G); calib_train: responses in the profiled batch; train_rank: the rank's share"),
    ("num_tokens", i64, (UPDATE, CALIB_TRAIN, TRAIN_RANK, DRIFT_TRAIN), "tokens trained on in the update: prompt + "
                                                                        "response per sample, or each group's prompt "
                                                                        "once + all response tokens when metadata "
                                                                        "trainer.share_prompts; train_rank: the rank's "
                                                                        "share"),
    ("response_tokens_total", i64, (UPDATE,), "response tokens in the update"),
    ("lr", f64, (UPDATE,), "learning rate of the update"),
    ("loss", f64, (UPDATE,), "policy loss"),
    ("t_forward", f64, (UPDATE, CALIB_TRAIN, TRAIN_RANK, DRIFT_TRAIN), "seconds in forward passes"),
    ("t_backward", f64, (UPDATE, CALIB_TRAIN, TRAIN_RANK, DRIFT_TRAIN), "seconds in backward passes"),
    ("t_optimizer", f64, (UPDATE,), "seconds in the optimizer step"),
    ("grad_norm", f64, (UPDATE,), "L2 norm of the full-batch policy gradient (before clipping)"),
    ("grad_norm_micro", f64, (UPDATE,), "root mean square of the micro-batch policy gradient norms"),
    ("micro_batch", i64, (UPDATE,), "responses per micro-batch for grad_norm_micro"),
    ("critic_loss", f64, (UPDATE,), "PPO value loss"),
    ("critic_grad_norm", f64, (UPDATE,), "full-batch value gradient norm"),
    ("critic_grad_norm_micro", f64, (UPDATE,), "RMS of micro-batch value gradient norms"),
    ("step_time", f64, (UPDATE,), "wall seconds of the whole RL step: generation to end of sync (split mode: end of "
                                  "the previous update's sync, or the run's start, to the end of this one's)"),
    ("gen_time", f64, (UPDATE,), "wall seconds of the step's generation phase (split mode: the trainer's wait for "
                                 "finished responses within step_time)"),
    ("reward_time", f64, (UPDATE,), "wall seconds computing rewards (and advantages) not overlapped with generation"),
    ("prep_time", f64, (UPDATE,), "wall seconds preparing the training batch (old log-probs, values)"),
    # sync: one weight sync into the engine
    ("bytes", i64, (SYNC, ALLREDUCE), "sync: bytes of weights sent; allreduce: gradient bytes reduced"),
    # eval: held-out evaluation
    ("cum_responses", i64, (EVAL,), "training responses consumed so far"),
    ("cum_tokens", i64, (EVAL,), "training tokens consumed so far"),
    ("score", f64, (EVAL,), "mean@k accuracy on held-out prompts"),
    ("eval_k", i64, (EVAL,), "samples per held-out prompt"),
    ("eval_prompts", i64, (EVAL,), "held-out prompts evaluated"),
    # phase (v2): one timed phase of one RL step, as the framework logged it (t_start: the phase's
    # start when the phases of a step are laid end to end in the framework's order; duration: seconds)
    ("phase", pa.string(), (PHASE,), "phase name as the framework logs it, e.g. gen, reward, old_log_prob, ref, "
                                     "values, adv, update_actor, update_critic, update_weights, testing (verl "
                                     "timing_s/<name>)"),
    ("phase_role", pa.string(), (PHASE,), "what the phase is to rlsim: gen | reward | prep | update | sync | eval | "
                                          "checkpoint | other | nested (inside another phase, not summed)"),
    # step_stats (v2): per-RL-step statistics that stand in for per-response rows
    ("response_len_mean", f64, (STEP_STATS,), "mean response length in tokens (verl response_length/mean)"),
    ("response_len_min", f64, (STEP_STATS,), "shortest response (verl response_length/min)"),
    ("response_len_max", f64, (STEP_STATS,), "longest response (verl response_length/max)"),
    ("response_clip_ratio", f64, (STEP_STATS,),
     "fraction of responses cut at the response cap (verl response_length/clip_ratio)"),
    ("prompt_len_mean", f64, (STEP_STATS,), "mean prompt length in tokens (verl prompt_length/mean)"),
    ("prompt_len_min", f64, (STEP_STATS,), "shortest prompt (verl prompt_length/min)"),
    ("prompt_len_max", f64, (STEP_STATS,), "longest prompt (verl prompt_length/max)"),
    ("prompt_clip_ratio", f64, (STEP_STATS,),
     "fraction of prompts cut at the prompt cap (verl prompt_length/clip_ratio)"),
    ("score_mean", f64, (STEP_STATS,), "mean training score of the step's responses (verl critic/score/mean)"),
    ("score_min", f64, (STEP_STATS,), "lowest training score (verl critic/score/min)"),
    ("score_max", f64, (STEP_STATS,), "highest training score (verl critic/score/max)"),
    ("metrics", pa.string(), (STEP_STATS,), "JSON object: every numeric metric the framework logged for the step, "
                                            "under its original name (unknown names kept)"),
    # calibration (v2): the profile level a calib_gen / calib_train row belongs to
    ("calib_level", i64, (CALIB_GEN, CALIB_TRAIN, DRIFT_GEN, DRIFT_TRAIN), "calib_gen / drift_gen: sequences submitted "
                                                                           "at this rung of the concurrency ladder "
                                                                           "(the probe's fixed rung); calib_train / "
                                                                           "drift_train: responses in the profiled "
                                                                           "batch"),
    # split mode (v3): which engine replica / trainer rank a row belongs to, and the version a response ended on
    ("engine_id", i64, (GEN_STEP, RESPONSE, SYNC, IDLE, EVAL),
     "generation engine replica (0-based); null (or 0) in colocated traces; idle: set for an engine's wait"),
    ("rank", i64, (TRAIN_RANK, ALLREDUCE, IDLE), "data-parallel training rank (0-based); idle: set for a rank's wait"),
    ("finish_version", i64, (RESPONSE,), "policy version its last token was generated under (policy_version: the one "
                                         "it started under); > policy_version: a partial rollout spanning a weight "
                                         "sync"),
    # v4: the CPU threads (devices' cores) a calibration or drift row was measured at
    ("threads", i64, (CALIB_GEN, CALIB_TRAIN, DRIFT_GEN, DRIFT_TRAIN), "CPU threads the row was measured at (the "
                                                                       "calibration also measures one core, a CPU's "
                                                                       "device unit); null: the run's"),
    # v5: measured memory peaks of the step's phases in the recording process (null: not measured)
    ("mem_gen_peak_bytes", i64, (UPDATE,),
     "peak memory during the step's generation, bytes: CPU, the recording process's resident-set high-water mark; "
     "CUDA, torch's max_memory_allocated (engine weights and KV pool included); null in split mode (the engines are "
     "other processes) or where not measurable"),
    ("mem_train_peak_bytes", i64, (UPDATE,),
     "peak memory during the step's update, bytes, measured as mem_gen_peak_bytes (split mode: the trainer process's, "
     "rank 0)"),
    # v6: interference: the calibration's one-device rows measured while the other side worked on another core
    ("load_threads", i64, (CALIB_GEN, CALIB_TRAIN), "CPU threads of the other side (training beside an engine row, "
                                                    "the engine beside a training row) that ran on another core "
                                                    "while the row was measured, as in a split; null: it ran alone"),
)

COLUMN_NAMES = tuple(c[0] for c in COLUMNS)

# The allowed values [low, high] of every integer column, by what it holds; the reader refuses a value outside
# (replay/validate.py). Every bound is at most 2**53, where float64, the reader's view of a nullable integer
# column (io.Trace.rows), is still exact.
DEVICE_IDS = (0, 2 ** 20)  # engine replicas, trainer ranks, CPU threads: more than any cluster's devices
STEPS_AND_SEQUENCES = (0, 2 ** 31 - 1)  # steps, policy versions; one row's sequences, or one sequence's tokens
TOTALS = (0, 2 ** 53)  # tokens, bytes and responses of a step, a batch or a run; prompt ids
INT_RANGES: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("engine_id", "rank", "threads", "load_threads"), DEVICE_IDS),
    **dict.fromkeys(("step", "policy_version", "consumed_step", "finish_version", "group_index", "num_running",
                     "num_waiting", "finished", "prompt_tokens", "response_tokens", "micro_batch", "eval_k",
                     "eval_prompts", "calib_level"), STEPS_AND_SEQUENCES),
    **dict.fromkeys(("prefill_tokens", "decode_tokens", "context_tokens", "prompt_id", "num_responses", "num_tokens",
                     "response_tokens_total", "bytes", "cum_responses", "cum_tokens", "mem_gen_peak_bytes",
                     "mem_train_peak_bytes"), TOTALS),
}
# Columns a kind must have non-null, checked by the reader.
REQUIRED = {
    GEN_STEP: ("num_running", "prefill_tokens", "decode_tokens", "context_tokens"),
    RESPONSE: ("prompt_id", "group_index", "prompt_tokens", "response_tokens", "reward"),
    UPDATE: ("num_responses", "num_tokens", "lr"),
    SYNC: ("bytes",),
    EVAL: ("cum_responses", "score"),
    PHASE: ("phase", "phase_role", "duration"),
    STEP_STATS: ("metrics",),
    CALIB_GEN: ("t_start", "duration", "num_running", "prefill_tokens", "decode_tokens", "context_tokens",
                "calib_level"),
    CALIB_TRAIN: ("t_start", "duration", "num_responses", "num_tokens", "t_forward", "t_backward", "calib_level"),
    IDLE: ("t_start", "duration"),  # and exactly one of engine_id / rank (replay/validate.py)
    TRAIN_RANK: ("t_start", "duration", "rank", "num_responses", "num_tokens"),
    ALLREDUCE: ("t_start", "duration", "bytes", "rank"),
    DRIFT_GEN: ("t_start", "duration", "num_running", "prefill_tokens", "decode_tokens", "context_tokens",
                "calib_level"),
    DRIFT_TRAIN: ("t_start", "duration", "num_responses", "num_tokens", "t_forward", "t_backward", "calib_level"),
}

# The first schema version that has a column / an event kind; absent: version 1. A file of version v
# must hold exactly the columns of `columns_for_version(v)`; kinds newer than v are unknown to it.
_V2_COLUMNS = ("phase", "phase_role", "response_len_mean", "response_len_min", "response_len_max",
               "response_clip_ratio",
               "prompt_len_mean", "prompt_len_min", "prompt_len_max", "prompt_clip_ratio", "score_mean", "score_min",
               "score_max", "metrics", "calib_level")
_V3_COLUMNS = ("engine_id", "rank", "finish_version")
_V4_COLUMNS = ("threads",)
_V5_COLUMNS = ("mem_gen_peak_bytes", "mem_train_peak_bytes")
_V6_COLUMNS = ("load_threads",)
COLUMN_SINCE: dict[str, int] = {c: v for v, cols in ((2, _V2_COLUMNS), (3, _V3_COLUMNS), (4, _V4_COLUMNS),
                                                     (5, _V5_COLUMNS), (6, _V6_COLUMNS)) for c in cols}
KIND_SINCE: dict[str, int] = {PHASE: 2, STEP_STATS: 2, CALIB_GEN: 2, CALIB_TRAIN: 2, IDLE: 3, TRAIN_RANK: 3,
                              ALLREDUCE: 3, DRIFT_GEN: 4, DRIFT_TRAIN: 4}

# The run config's placement fields (metadata `config`, schema version 3); a trace without them (older
# ones) was recorded colocated on one device: these defaults.
CONFIG_DEFAULTS: dict[str, object] = {"mode": "colocated", "gen_devices": 1, "train_devices": 1, "max_staleness": 0,
                                      "partial_rollout": False, "off_policy": "none", "tis_cap": 2.0, "threads": 0}
MODES = ("colocated", "split")


def placement(config: dict | None) -> dict[str, object]:
    """The placement fields of a run config (CONFIG_DEFAULTS where missing or null; `train_devices` falls back
    to an older config's `ranks`)."""
    config = config or {}
    out = {k: (config.get(k) if config.get(k) is not None else v) for k, v in CONFIG_DEFAULTS.items()}
    if config.get("train_devices") is None and config.get("ranks") is not None:
        out["train_devices"] = config["ranks"]
    return out


def columns_for_version(version: int) -> tuple[str, ...]:
    """The columns a trace file of schema `version` holds."""
    return tuple(c for c in COLUMN_NAMES if COLUMN_SINCE.get(c, 1) <= version)


def kinds_for_version(version: int) -> tuple[str, ...]:
    """The event kinds a trace file of schema `version` may hold."""
    return tuple(k for k in EVENT_KINDS if KIND_SINCE.get(k, 1) <= version)


def arrow_schema(meta_json: str | None = None) -> pa.Schema:
    schema = pa.schema([pa.field(n, t, nullable=(n != "kind")) for n, t, _, _ in COLUMNS])
    return schema.with_metadata({META_KEY: meta_json.encode()}) if meta_json is not None else schema
