"""Whether a trace's cost fits can be used: one rule, read wherever fits are judged (the fits' warnings in
replay/calibration.py, the what-if's intervals in rlsim.whatif.predict, `rlsim plan`).

Each cost fit, the engine step and the training pass, is judged on what it did not see and on its own rows:

- **held-out error**: the leave-one-level-out RMS relative error (each calibration level predicted by a fit made
  without it). Above `HELD_OUT_MAX` the fit predicts a level it did not see no better than a guess of zero would;
  judged where a calibration ladder gave the levels (a fit of the run's own rows holds out the tail of its rounds,
  whose error says how far it extrapolates, which the no-calibration warning already says).
- **R2** of the fit on its rows: below `R2_MIN` its cost terms explain less than a quarter of what the rows vary by,
  so the rest (other processes on the machine) decides what the fit says. The training fit of a run without
  calibration sees one batch size, where R2 measures nothing: it is not judged.
- **a flat training curve**: forward + backward seconds are made non-decreasing in tokens (calibration.py), so
  levels measured out of order by noise are pooled into one flat run. Flat over `FLAT_SPAN` x the tokens or more,
  the fit says that training twice the tokens costs nothing: the slope sigma rests on is not measured.

A fit beyond any bound is *unusable*: `FitCheck.warning` says so with its fix (a quiet machine where the timings
scatter, more steps where the levels or updates are few), `FitCheck.spread` widens the intervals it affects by at
least `HELD_OUT_MAX` (the answer is not known), and `rlsim plan` makes no move. Pure: numbers in, verdicts out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

# An RMS relative error of 100 % on held-out levels: predicting zero seconds would miss each level by as much. The
# intervals widen sigma by the held-out error as a log-normal spread, which describes a fit that errs by a fraction of
# what it predicts, not by multiples of it.
HELD_OUT_MAX = 1.0
# A fit whose terms explain less than a quarter of the variance of its own rows: noise, not cost, shapes it.
R2_MIN = 0.25
# Training flat over a doubling of tokens: twice the work for no extra time is noise pooled flat, not a cost.
FLAT_SPAN = 2.0
# Fewer updates or levels than these: the bootstrap over updates and the held-out error over levels rest on too few,
# and a longer recording buys both (rlrun record's calibration budget grows with the recording).
MIN_UPDATES = 10
MIN_LEVELS = 4


@dataclass(frozen=True)
class PartCheck:
    """One cost fit (engine step or training) against the rule."""

    part: str = field(metadata={"help": "engine-step | training"})
    held_out: float = field(metadata={"help": "leave-one-level-out RMS relative error (nan: not measured)"})
    r2: float = field(metadata={"help": "R2 on the fit's rows (nan: not judged)"})
    levels: int = field(metadata={"help": "levels held out in turn (0: none)"})
    problems: tuple[str, ...] = field(default=(), metadata={
        "help": "each bound it is beyond, in words (empty: usable)"})

    @property
    def usable(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class FitCheck:
    """The rule's verdict on a trace's engine-step and training fits."""

    parts: tuple[PartCheck, ...] = field(metadata={"help": "the fits judged (none: nothing to judge)"})
    updates: int = field(metadata={"help": "updates the run recorded"})
    calibrated: bool = field(default=False, metadata={"help": "a calibration ladder gave the levels"})

    @property
    def usable(self) -> bool:
        return all(p.usable for p in self.parts)

    @property
    def few(self) -> bool:
        """Too few updates (0: not known) or held-out levels behind an unusable fit: more steps would help."""
        return 0 < self.updates < MIN_UPDATES or any(0 < p.levels < MIN_LEVELS for p in self.parts if not p.usable)

    def spread(self, part: str) -> float:
        """The relative error the intervals widen by for `part`: its held-out error where it is usable and
        calibrated (0 where not measured), at least HELD_OUT_MAX where it is unusable."""
        p = next((x for x in self.parts if x.part == part), None)
        if p is None:
            return 0.0
        measured = p.held_out if math.isfinite(p.held_out) and self.calibrated else 0.0
        return measured if p.usable else max(measured, HELD_OUT_MAX)

    def fix(self, config: Mapping[str, Any] | None = None) -> str:
        """The recording that would make the fits usable: on a quiet machine where the timings scatter, with more steps
        where the updates or levels are few; with `config` (the trace's), its rlrun record command."""
        # rows that scatter about their own fit (R2) or levels pooled flat are the machine's noise; held-out levels
        # missed by a fit whose rows agree with it are too few levels, unless there are enough of them
        scatter = any(s.startswith(("R2", "flat")) for p in self.parts for s in p.problems)
        noisy = scatter or not self.few
        steps = max(4 * self.updates, 2 * MIN_UPDATES) if self.few else None
        more = (f"with more steps ({steps} or more: rlrun record's calibration budget grows with the recording, and "
                "buys more levels)")
        how = " ".join(w for w, on in (("on a quiet machine (nothing else running)", noisy), (more, steps)) if on)
        cmd = rerecord_command(config, steps) if config else ""
        return f"re-record it {how}" + (f": {cmd}" if cmd else "")

    def warning(self, name: str, config: Mapping[str, Any] | None = None) -> str:
        """The warning of an unusable check ('' when usable)."""
        if self.usable:
            return ""
        bad = "; ".join(f"{p.part} fit: {', '.join(p.problems)}" for p in self.parts if not p.usable)
        return (f"{name}: its cost fits cannot be used ({bad}), so sigma and responses/s are not known from it: their "
                f"intervals carry at least a {100 * HELD_OUT_MAX:.0f} % error and rlsim plan makes no move on it; "
                f"{self.fix(config)}")


def flat_span(knots: Sequence[float], values: Sequence[float]) -> float:
    """The largest ratio x_hi / x_lo over which a non-decreasing curve through (knots, values) does not rise (1 when
    it rises between every pair of knots; nan without two positive knots)."""
    k, v = np.asarray(knots, float), np.asarray(values, float)
    if len(k) < 2 or not np.all(k > 0):
        return math.nan
    best, start = 1.0, 0
    for j in range(1, len(k)):
        if v[j] > v[start] * (1 + 1e-9):
            start = j
        best = max(best, k[j] / k[start])
    return float(best)


def check_fits(validation: Any, updates: int = 0) -> FitCheck:
    """The rule on a `rlsim.replay.models.Validation` (None: nothing to judge) of a run with `updates` updates (0: not
    known)."""
    v = validation
    if v is None:
        return FitCheck((), int(updates))
    cal = bool(v.calibrated)
    gen = _part("engine-step", v.gen_cv if cal else math.nan, v.gen_r2, len(v.gen_levels) if cal else 0)
    parts = [gen]
    if math.isfinite(v.train_cv) or getattr(v, "train_form", "") == "interp":  # a calibrated curve: judged
        parts.append(_part("training", v.train_cv, v.train_r2, len(v.train_levels), getattr(v, "train_flat", math.nan)))
    return FitCheck(tuple(parts), int(updates), cal)


def _part(name: str, held_out: float, r2: float, levels: int, flat: float = math.nan) -> PartCheck:
    problems = []
    if math.isfinite(held_out) and held_out > HELD_OUT_MAX:
        problems.append(f"held-out error {100 * held_out:.0f} % RMS (bound {100 * HELD_OUT_MAX:.0f} %)")
    if math.isfinite(r2) and r2 < R2_MIN:
        problems.append(f"R2 {r2:.3f} (bound {R2_MIN:g})")
    if math.isfinite(flat) and flat >= FLAT_SPAN:
        problems.append(f"flat over {flat:.3g}x the tokens (the same time for more work: noise, not a cost)")
    return PartCheck(name, float(held_out), float(r2), int(levels), tuple(problems))


def rerecord_command(config: Mapping[str, Any], steps: int | None) -> str:
    """The rlrun record command that records the trace's configuration again (`steps`: more of them; None: as
    before)."""
    algo = str(config.get("algo") or "grpo")
    parts = ["rlrun record", f"--algo {algo}", f"--prompts {config.get('prompts')}"]
    if algo != "ppo" and config.get("group"):
        parts.append(f"--group {config['group']}")
    if config.get("task"):
        parts.append(f"--task {config['task']}")
    n = steps or config.get("steps")
    if n:
        parts.append(f"--steps {n}")
    return " ".join(parts) + " --out run.parquet"
