"""The sigma interval carries the fits' held-out error: the leave-one-level-out RMS of the engine-step and training fits,
weighted by the candidate's generation and training time (the bootstrap over levels alone was too narrow)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlsim.config import WhatIf
from rlsim.replay.io import read_trace
from rlsim.whatif import _held_out_error, evaluate, prepare, timeline

TRACE = Path(__file__).resolve().parents[2] / "traces" / "grpo_p32.parquet"


def test_sigma_interval_is_widened_by_the_held_out_error():
    study = prepare([read_trace(TRACE)])
    v = study.models.validation
    cfg = WhatIf(prompts=128, updates=10)
    run = timeline(study, cfg)
    gen, train = float(np.sum(run.gen_time)), float(np.sum(run.train_time))
    expect = math.sqrt((gen * v.gen_cv ** 2 + train * (v.train_cv if math.isfinite(v.train_cv) else 0.0) ** 2) / (gen + train))
    assert _held_out_error(v, run) == pytest.approx(expect) and expect > 0
    o = evaluate(study, cfg)
    assert o.sigma_lo < o.sigma < o.sigma_hi and "held-out error" in o.interval
    # about +-1.645 x the held-out error in log terms, at least (the replicates add their own spread)
    assert math.log(o.sigma_hi / o.sigma_lo) >= 2 * 1.645 * expect * 0.8
    # the reference's own batch: its levels, whose errors cancel in sigma; half an octave away, half the error
    same = evaluate(study, WhatIf(prompts=32, updates=10))
    assert "held-out error" not in same.interval
    near = evaluate(study, WhatIf(prompts=45, updates=10))
    part = math.log2(45 / 32) * _held_out_error(v, timeline(study, WhatIf(prompts=45, updates=10)))
    assert f"({100 * part:.1f} % RMS)" in near.interval
