"""The fit-quality rule (rlsim.replay.fit_quality): its bounds, its fix, and that the shipped recordings pass it."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlsim.replay.fit import fit_trace
from rlsim.replay.fit_quality import HELD_OUT_MAX, R2_MIN, check_fits, flat_span
from rlsim.replay.io import read_trace
from rlsim.replay.synthetic import SynthSpec, synthetic_trace

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"algo": "grpo", "prompts": 16, "group": 4, "task": "add2", "steps": 6}


def _validation(gen_cv=0.1, gen_r2=0.9, train_cv=0.1, train_r2=0.9, levels=6, calibrated=True, flat=1.0):
    """A stand-in for replay.models.Validation with the fields the rule reads."""
    return SimpleNamespace(calibrated=calibrated, gen_cv=gen_cv, gen_r2=gen_r2, gen_levels=(None,) * 20,
                           train_cv=train_cv, train_r2=train_r2, train_levels=(None,) * levels,
                           train_form="interp" if math.isfinite(train_cv) else "", train_flat=flat)


def test_a_fit_within_the_bounds_is_usable_and_widens_by_its_own_held_out_error():
    c = check_fits(_validation(gen_cv=0.3, train_cv=0.6), 64)
    assert c.usable and c.warning("t", CONFIG) == ""
    assert c.spread("engine-step") == pytest.approx(0.3) and c.spread("training") == pytest.approx(0.6)


def test_the_issues_recording_is_unusable_with_both_fixes():
    # a 6-step recording on a loaded machine: engine R2 0.016 (held-out 128 %), training R2 -0.044 (1,024 %)
    c = check_fits(_validation(gen_cv=1.28, gen_r2=0.016, train_cv=10.24, train_r2=-0.044), 6)
    assert not c.usable and [p.usable for p in c.parts] == [False, False]
    w = c.warning("short", CONFIG)
    assert w.startswith("short: its cost fits cannot be used (engine-step fit: held-out error 128 % RMS")
    assert "R2 0.016" in w and "1024 % RMS" in w and "R2 -0.044" in w
    assert "quiet machine" in w and "more steps" in w
    # the recording again, with 4x its steps
    assert w.endswith("rlrun record --algo grpo --prompts 16 --group 4 --task add2 --steps 24 --out run.parquet")
    # the intervals widen by the measured error, never less than the bound
    assert c.spread("engine-step") == pytest.approx(1.28) and c.spread("training") == pytest.approx(10.24)


@pytest.mark.parametrize("kw,bad", [
    ({"gen_cv": HELD_OUT_MAX * 1.01}, "held-out error"),
    ({"gen_r2": R2_MIN - 0.01}, "R2"),
    ({"train_cv": HELD_OUT_MAX * 1.01}, "held-out error"),
    ({"train_r2": R2_MIN - 0.01}, "R2"),
    ({"flat": 2.0}, "flat over 2x"),
])
def test_each_bound_alone_makes_a_fit_unusable(kw, bad):
    c = check_fits(_validation(**kw), 64)
    assert not c.usable and bad in c.warning("t")
    part = next(p for p in c.parts if not p.usable)
    assert c.spread(part.part) >= HELD_OUT_MAX  # at least the bound: the answer is not known
    ok = {k: (HELD_OUT_MAX * 0.99 if "cv" in k else R2_MIN + 0.01 if "r2" in k else 1.9) for k in kw}
    assert check_fits(_validation(**ok), 64).usable


def test_the_fix_names_what_applies():
    # rows that agree with their fit, levels missed, enough of both: the machine moved between levels
    many = check_fits(_validation(gen_cv=1.5), 64)
    assert "quiet machine" in many.fix() and "more steps" not in many.fix()
    # the same from a run of few updates: more steps (the calibration's budget grows with the recording)
    few = check_fits(_validation(gen_cv=1.5), 6)
    assert "more steps" in few.fix() and "quiet machine" not in few.fix()
    # rows that scatter about their own fit: a quiet machine, whatever the length
    assert "quiet machine" in check_fits(_validation(gen_r2=0.1), 6).fix()
    assert "--steps" not in check_fits(_validation(gen_r2=0.1), 64).fix(CONFIG).split("rlrun record")[0]


def test_fits_without_calibration_are_judged_on_r2_only():
    # a run-only engine fit holds out the tail of its rounds (the no-calibration warning covers it), and a run-only
    # training fit sees one batch size, where R2 measures nothing
    c = check_fits(_validation(gen_cv=1.5, train_cv=math.nan, train_r2=0.0, calibrated=False), 64)
    assert c.usable and [p.part for p in c.parts] == ["engine-step"] and c.spread("engine-step") == 0.0
    assert not check_fits(_validation(gen_r2=0.1, train_cv=math.nan, calibrated=False), 64).usable
    assert check_fits(None, 5).usable  # nothing to judge (an imported log)


def test_flat_span():
    assert flat_span((1, 2, 4, 8), (1.0, 2.0, 3.0, 4.0)) == 1.0
    assert flat_span((1, 2, 4, 8), (1.0, 2.0, 2.0, 2.0)) == 4.0  # pooled flat from 2 to 8
    assert flat_span((1, 2, 4, 8), (1.0, 1.0, 3.0, 3.0)) == 2.0
    assert math.isnan(flat_span((0, 2), (1.0, 1.0)))


def test_a_loaded_synthetic_recording_gets_the_warning_and_a_quiet_one_not(tmp_path):
    quiet = fit_trace(read_trace(synthetic_trace(tmp_path / "q.parquet",
                                                 SynthSpec(calibrate=True, steps=6, noise=0.02))))
    loaded = fit_trace(read_trace(synthetic_trace(tmp_path / "l.parquet",
                                                  SynthSpec(calibrate=True, steps=6, load=1.0))))
    assert not [w for w in quiet.warnings if "cannot be used" in w]
    assert check_fits(quiet.validation, 6).usable
    w = [w for w in loaded.warnings if "cannot be used" in w]
    assert len(w) == 1 and w[0].startswith("l: its cost fits cannot be used") and "rlrun record --algo grpo" in w[0]
    config = read_trace(tmp_path / "l.parquet").config
    assert w[0] == check_fits(loaded.validation, len(loaded.recorded.step)).warning("l", config)


@pytest.mark.parametrize("name", ["grpo_p128", "grpo_p64", "grpo_p32", "grpo_addmix_p64", "ppo_b256",
                                  "study/grpo_p32_s0", "study_add3/grpo_add3_p32_s0"])
def test_the_shipped_recordings_pass(name):
    m = fit_trace(read_trace(ROOT / "traces" / f"{name}.parquet"))
    assert check_fits(m.validation, len(m.recorded.step)).usable
    assert not [w for w in m.warnings if "cannot be used" in w]
