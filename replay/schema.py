"""The rlsim trace format, version 1: one Parquet file per run, one row per event.

Every row has `kind` in EVENT_KINDS and the common columns; the other columns are null where
they do not apply to the row's kind. Times are seconds from run start on one monotonic clock.
Run metadata is JSON under the Parquet key-value metadata key `rlsim` (see docs/trace-format.md).
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
META_KEY = b"rlsim"

GEN_STEP, RESPONSE, UPDATE, SYNC, EVAL = "gen_step", "response", "update", "sync", "eval"
EVENT_KINDS = (GEN_STEP, RESPONSE, UPDATE, SYNC, EVAL)

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
    ("num_running", i64, (GEN_STEP,), "sequences in the step's batch"),
    ("num_waiting", i64, (GEN_STEP,), "requests queued but not scheduled after the step"),
    ("prefill_tokens", i64, (GEN_STEP,), "prompt tokens computed in the step"),
    ("decode_tokens", i64, (GEN_STEP,), "new tokens sampled in the step (one per decoding sequence)"),
    ("context_tokens", i64, (GEN_STEP,), "KV tokens attended over by the step's batch (sum of context lengths)"),
    ("kv_usage", f64, (GEN_STEP,), "fraction of the KV cache in use after the step"),
    ("finished", i64, (GEN_STEP,), "sequences that finished in the step"),
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
    ("num_responses", i64, (UPDATE,), "responses in the update (B = P x G)"),
    ("num_tokens", i64, (UPDATE,), "tokens trained on in the update: prompt + response per sample, or each group's prompt once + all response tokens when metadata trainer.share_prompts"),
    ("response_tokens_total", i64, (UPDATE,), "response tokens in the update"),
    ("lr", f64, (UPDATE,), "learning rate of the update"),
    ("loss", f64, (UPDATE,), "policy loss"),
    ("t_forward", f64, (UPDATE,), "seconds in forward passes"),
    ("t_backward", f64, (UPDATE,), "seconds in backward passes"),
    ("t_optimizer", f64, (UPDATE,), "seconds in the optimizer step"),
    ("grad_norm", f64, (UPDATE,), "L2 norm of the full-batch policy gradient (before clipping)"),
    ("grad_norm_micro", f64, (UPDATE,), "root mean square of the micro-batch policy gradient norms"),
    ("micro_batch", i64, (UPDATE,), "responses per micro-batch for grad_norm_micro"),
    ("critic_loss", f64, (UPDATE,), "PPO value loss"),
    ("critic_grad_norm", f64, (UPDATE,), "full-batch value gradient norm"),
    ("critic_grad_norm_micro", f64, (UPDATE,), "RMS of micro-batch value gradient norms"),
    ("step_time", f64, (UPDATE,), "wall seconds of the whole RL step: generation to end of sync"),
    ("gen_time", f64, (UPDATE,), "wall seconds of the step's generation phase"),
    ("reward_time", f64, (UPDATE,), "wall seconds computing rewards (and advantages) not overlapped with generation"),
    ("prep_time", f64, (UPDATE,), "wall seconds preparing the training batch (old log-probs, values)"),
    # sync: one weight sync into the engine
    ("bytes", i64, (SYNC,), "bytes of weights sent"),
    # eval: held-out evaluation
    ("cum_responses", i64, (EVAL,), "training responses consumed so far"),
    ("cum_tokens", i64, (EVAL,), "training tokens consumed so far"),
    ("score", f64, (EVAL,), "mean@k accuracy on held-out prompts"),
    ("eval_k", i64, (EVAL,), "samples per held-out prompt"),
    ("eval_prompts", i64, (EVAL,), "held-out prompts evaluated"),
)

COLUMN_NAMES = tuple(c[0] for c in COLUMNS)
# Columns a kind must have non-null, checked by the reader.
REQUIRED = {
    GEN_STEP: ("num_running", "prefill_tokens", "decode_tokens", "context_tokens"),
    RESPONSE: ("prompt_id", "group_index", "prompt_tokens", "response_tokens", "reward"),
    UPDATE: ("num_responses", "num_tokens", "lr"),
    SYNC: ("bytes",),
    EVAL: ("cum_responses", "score"),
}


def arrow_schema(meta_json: str | None = None) -> pa.Schema:
    schema = pa.schema([pa.field(n, t, nullable=(n != "kind")) for n, t, _, _ in COLUMNS])
    return schema.with_metadata({META_KEY: meta_json.encode()}) if meta_json is not None else schema
