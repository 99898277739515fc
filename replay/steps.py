"""The one per-RL-step table of a recorded trace: what each update's step cost, phase by phase.

Everything that looks at recorded steps (the fits, `rlrun inspect`, the report, the notebook API)
takes it from here. One row per `update` row, in the trace's order; seconds unless named otherwise.
A trace written without `gen_time` or `step_time` gets them rebuilt from the parts it has: generation
as the sum of its engine steps, the step as generation + rewards + update + sync.
"""
from __future__ import annotations

import numpy as np

from rlsim.replay.schema import GEN_STEP, SYNC, UPDATE

COLUMNS = {
    "step": "RL step (update index)",
    "step_time": "wall seconds of the RL step",
    "gen_time": "generation phase",
    "reward_time": "rewards and advantages not overlapped with generation (0 when not recorded)",
    "prep_time": "batch preparation: old log-probs, values (0 when not recorded)",
    "update_time": "the update row's duration (may include prep_time: see rlsim.replay.fit)",
    "sync_time": "weight syncs of the step",
    "num_responses": "responses trained on",
    "num_tokens": "tokens trained on",
    "gen_steps": "engine steps of the step's generation",
    "gen_step_time": "summed engine-step durations (gen_time minus round overhead)",
    "t_forward": "forward passes", "t_backward": "backward passes", "t_optimizer": "optimizer step",
}


def by_step(values: np.ndarray, steps: np.ndarray, index: np.ndarray, how: str = "sum") -> np.ndarray:
    """Sum (or count) `values` per step of `index`; steps not in `index` are ignored."""
    out = np.zeros(len(index))
    if len(values) == 0:
        return out
    pos = {int(s): i for i, s in enumerate(index)}
    idx = np.array([pos.get(int(s), -1) for s in steps])
    ok = idx >= 0
    np.add.at(out, idx[ok], values[ok] if how == "sum" else 1.0)
    return out


def step_table(trace) -> dict[str, np.ndarray]:
    """Column -> array over the trace's updates (COLUMNS says what each is)."""
    u, g, s = trace.rows(UPDATE), trace.rows(GEN_STEP), trace.rows(SYNC)
    f = lambda rows, c: np.asarray(rows[c], float)  # noqa: E731
    step = f(u, "step")
    g_dur = f(g, "duration")
    gen_steps = by_step(np.ones_like(g_dur), f(g, "step"), step, "count")
    gen_step_time = by_step(g_dur, f(g, "step"), step)
    sync_time = by_step(f(s, "duration"), f(s, "step"), step)
    reward, prep, upd = np.nan_to_num(f(u, "reward_time")), np.nan_to_num(f(u, "prep_time")), f(u, "duration")
    gen_time = np.where(np.isfinite(f(u, "gen_time")), f(u, "gen_time"), gen_step_time)
    step_time = np.where(np.isfinite(f(u, "step_time")), f(u, "step_time"), gen_time + reward + upd + sync_time)
    return {"step": step, "step_time": step_time, "gen_time": gen_time, "reward_time": reward, "prep_time": prep,
            "update_time": upd, "sync_time": sync_time, "num_responses": f(u, "num_responses"),
            "num_tokens": f(u, "num_tokens"), "gen_steps": gen_steps, "gen_step_time": gen_step_time,
            "t_forward": f(u, "t_forward"), "t_backward": f(u, "t_backward"), "t_optimizer": f(u, "t_optimizer")}
