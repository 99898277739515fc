"""Fidelity: simulate exactly what a trace recorded and compare, update by update (`rlsim replay`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlsim.core.pipeline import simulate
from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import fit_trace, warmup_excluded
from rlsim.replay.io import Trace
from rlsim.whatif.simconfig import config_for


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """Recorded vs simulated per-update times of one trace."""

    trace: str = field(metadata={"help": "trace name"})
    step: np.ndarray = field(metadata={"help": "RL step of each compared update"})
    recorded: dict = field(metadata={
        "help": "metric -> recorded per-update array (step_time, gen_time, responses_per_s), as measured: "
                "rlsim.replay.steps' step time, which rlsim.steps shows"})
    simulated: dict = field(metadata={"help": "metric -> simulated per-update array"})
    skipped_warmup: bool = field(metadata={"help": "step 0 (engine warm-up) left out of the errors"})
    lengths: str = field(metadata={"help": "recorded (the trace's responses per step) or sampled"})
    warnings: tuple[str, ...] = field(default=(), metadata={"help": "fit warnings"})

    def errors(self) -> dict[str, dict[str, float]]:
        """metric -> {median, max} relative error |sim - rec| / rec over compared updates."""
        out = {}
        for k in self.recorded:
            rec, sim = np.asarray(self.recorded[k], float), np.asarray(self.simulated[k], float)
            e = np.abs(sim - rec) / np.maximum(np.abs(rec), 1e-12)
            out[k] = {"median": float(np.median(e)), "max": float(np.max(e)),
                      "recorded_mean": float(rec.mean()), "simulated_mean": float(sim.mean()),
                      "mean_error": float(abs(sim.mean() - rec.mean()) / max(abs(rec.mean()), 1e-12))}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "updates": int(len(self.step)), "skipped_warmup": self.skipped_warmup,
                "lengths": self.lengths, "errors": self.errors(), "warnings": list(self.warnings),
                "per_update": [{"step": int(s), **{f"recorded_{k}": float(self.recorded[k][i]) for k in self.recorded},
                                **{f"simulated_{k}": float(self.simulated[k][i]) for k in self.simulated}}
                               for i, s in enumerate(self.step)]}


def replay_trace(trace: Trace, *, seed: int = 0, lengths: str = "recorded") -> ReplayResult:
    """Fit the trace, simulate its own configuration for its recorded updates, compare per update."""
    models = fit_trace(trace)
    rec = models.recorded
    U = len(rec.step)
    if U == 0:
        raise RlsimError(f"{trace.path} has no update rows to replay")
    sim_run = simulate(models, config_for(models, updates=U, lengths=lengths), rng=np.random.default_rng(seed))
    skip = U > 1 and not warmup_excluded(trace)
    keep = rec.step != 0 if skip else np.ones(U, bool)
    resp = rec.num_responses
    recorded = {"step_time": rec.step_time[keep], "gen_time": rec.gen_time[keep],
                "responses_per_s": (resp / rec.step_time)[keep]}
    sim_resp = sim_run.responses
    simulated = {"step_time": sim_run.step_time[keep], "gen_time": sim_run.gen_time[keep],
                 "responses_per_s": (sim_resp / sim_run.step_time)[keep]}
    return ReplayResult(trace=trace.name, step=rec.step[keep], recorded=recorded, simulated=simulated,
                        skipped_warmup=bool(skip), lengths=lengths,
                        warnings=models.warnings
                        + ((f"{trace.name} was recovered from a partial recording",) if trace.recovered else ()))


def noise_floor(x) -> float:
    """The smallest median relative error any constant prediction reaches on these recorded times: what
    run-to-run noise alone costs a predictor that does not know the machine's load from one update to the next."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x) & (x > 0)]
    if not len(x):
        return float("nan")
    cs = np.linspace(x.min(), x.max(), 2001)
    return float(min(np.median(np.abs(c - x) / x) for c in cs))
