"""The one per-RL-step table of a recorded trace: what each update's step cost, phase by phase.

Everything that looks at recorded steps (the fits' recorded timings, `rlsim replay`, `rlsim run`'s
`recorded` line, `rlrun inspect`, the report, the timeline, the split statistics, the notebook API) takes
it from here. One row per `update` row, in the trace's order; seconds unless named otherwise; counts as
integers.

The step time is one definition (`step_times`; docs/trace-format.md, "Step time"): the update row's
`step_time`, the wall seconds from the step's start (the end of the previous step's weight sync) to the end
of its own weight sync, evals and checkpoints left out. In a verl log that is `timing_s/step` less
`timing_s/testing` and `timing_s/save_checkpoint` (the importer writes it so), i.e. verl's own step time on
every step without a validation or a checkpoint. It is what the run measured: never normalised for the
machine's speed (the fit does that to its cost models only, replay/drift.py). A trace written without
`step_time` gets it rebuilt as the sum of the step's phases; without `gen_time`, generation is the sum of
its engine steps.
"""
from __future__ import annotations

import numpy as np

from rlsim.replay.schema import GEN_STEP, SYNC, UPDATE

COLUMNS = {
    "step": "RL step (update index)",
    "step_time": "wall seconds of the RL step (step_times: the module doc)",
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
COUNTS = ("step", "num_responses", "num_tokens", "gen_steps")  # integer columns (int64)


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


def step_times(recorded: np.ndarray, gen: np.ndarray, reward: np.ndarray, prep: np.ndarray, update: np.ndarray,
               sync: np.ndarray, prep_inside: np.ndarray | bool = False) -> np.ndarray:
    """The recorded wall seconds of each RL step (every array (updates,)): the update rows' `step_time`
    (`recorded`, NaN where the trace has none) or else the sum of the step's phases: generation, rewards,
    batch preparation (unless `prep_inside`: the update row's duration already holds it), update and sync."""
    parts = gen + reward + np.where(prep_inside, 0.0, prep) + update + sync
    return np.where(np.isfinite(recorded), recorded, parts)


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
    # an rlrun update row times old log-probs inside itself when its duration exceeds its passes by them
    slack = upd - (f(u, "t_forward") + f(u, "t_backward") + np.nan_to_num(f(u, "t_optimizer")))
    with np.errstate(invalid="ignore"):
        prep_inside = np.isfinite(slack) & (prep > 0) & (slack >= 0.5 * prep)
    step_time = step_times(f(u, "step_time"), gen_time, reward, prep, upd, sync_time, prep_inside)
    out = {"step": step, "step_time": step_time,
           "gen_time": gen_time, "reward_time": reward, "prep_time": prep, "update_time": upd, "sync_time": sync_time,
           "num_responses": f(u, "num_responses"), "num_tokens": f(u, "num_tokens"), "gen_steps": gen_steps,
           "gen_step_time": gen_step_time, "t_forward": f(u, "t_forward"), "t_backward": f(u, "t_backward"),
           "t_optimizer": f(u, "t_optimizer")}
    for c in COUNTS:  # required non-null in update rows (replay/validate.py), so integral
        out[c] = out[c].astype(np.int64)
    return out
