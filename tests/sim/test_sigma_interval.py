"""The sigma interval carries the fits' held-out error: the leave-one-level-out RMS of the engine-step and training
fits, weighted by the candidate's generation and training time (the bootstrap over levels alone was too narrow)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlsim.core.config import WhatIf
from rlsim.modes.registry import simulate
from rlsim.replay.io import read_trace
from rlsim.replay.util import dumps
from rlsim.whatif import intervals
from rlsim.whatif.intervals import decider, held_out_error, split_side_spreads
from rlsim.whatif.predict import evaluate, timeline
from rlsim.whatif.study import fit_check, models_for, prepare, sim_config

TRACE = Path(__file__).resolve().parents[2] / "traces" / "grpo_p32.parquet"


def test_sigma_interval_is_widened_by_the_held_out_error():
    study = prepare([read_trace(TRACE)])
    v = study.models.validation
    cfg = WhatIf(prompts=128, updates=10)
    run = timeline(study, cfg)
    gen, train = float(np.sum(run.gen_time)), float(np.sum(run.train_time))
    train_cv = v.train_cv if math.isfinite(v.train_cv) else 0.0
    expect = math.sqrt((gen * v.gen_cv ** 2 + train * train_cv ** 2) / (gen + train))
    assert held_out_error(fit_check(study), run) == pytest.approx(expect) and expect > 0
    o = evaluate(study, cfg)
    assert o.sigma_lo < o.sigma < o.sigma_hi and "held-out error" in o.interval
    # about +-1.645 x the held-out error in log terms, at least (the replicates add their own spread)
    assert math.log(o.sigma_hi / o.sigma_lo) >= 2 * 1.645 * expect * 0.8
    # the reference's own batch: its levels, whose errors cancel in sigma; half an octave away, half the error
    same = evaluate(study, WhatIf(prompts=32, updates=10))
    assert "held-out error" not in same.interval
    near = evaluate(study, WhatIf(prompts=45, updates=10))
    part = math.log2(45 / 32) * held_out_error(fit_check(study), timeline(study, WhatIf(prompts=45, updates=10)))
    assert f"({100 * part:.1f} % RMS)" in near.interval


def test_an_undecided_throughput_names_a_paired_probe_where_one_measures_it():
    fits = SimpleNamespace(validation=None, recorded=SimpleNamespace(step=np.arange(64)), config={})
    study = SimpleNamespace(framework="rlrun", algo="grpo", reference=WhatIf(prompts=128, group=8), task="addmix",
                            models=fits)
    iv = {"rho_lo": 0.99, "rho_hi": 1.01, "sigma_lo": 0.7, "sigma_hi": 1.4}  # sigma the less sure
    probe = decider(iv, 32, 8, study, WhatIf(prompts=32))
    assert ("throughput decides it" in probe
            and "rlrun probe --algo grpo --prompts 32,128 --group 8 --task addmix" in probe)
    # another group, a split, other hardware or engine limits: not the recorded setup a probe varies P in
    for cfg, G in ((WhatIf(prompts=512, group=16), 16), (WhatIf(prompts=512, gen_gpus=1, train_gpus=1), 8),
                   (WhatIf(prompts=512, device="h200"), 8), (WhatIf(prompts=512, max_num_seqs=64), 8)):
        assert "rlrun record --algo grpo --prompts 512" in decider(iv, 512, G, study, cfg)
    # a split is recorded as asked (rlrun records AReaL's split); another split mode: what rlrun cannot record
    split = decider(iv, 512, 8, study, WhatIf(prompts=512, gen_gpus=1, train_gpus=1, staleness=1, partial_rollout=True))
    assert ("--prompts 512 --group 8 --task addmix --mode split --gen-gpus 1 --train-gpus 1 --staleness 1 "
            "--partial-rollout --steps 5" in split)
    fully = decider(iv, 512, 8, study, WhatIf(prompts=512, gen_gpus=1, train_gpus=1, mode="fully_async"))
    assert "rlrun records the colocated loop and --mode split, not fully_async" in fully
    half = decider(iv, 512, 8, study, WhatIf(prompts=512, gen_gpus=1, train_gpus=1, staleness=0.5))
    assert "--staleness" not in half and "rlrun records a whole number of versions of staleness, not 0.5" in half
    assert prepare([read_trace(TRACE)]).task == "add2"  # from the trace's config
    # rho the less sure: a recording to the target, added with --trace
    assert "sample cost decides it" in decider({**iv, "rho_lo": 0.5, "rho_hi": 3.0}, 512, 8, study, WhatIf(prompts=512))
    # fits that cannot be used: no probe or run at another size helps, the recording itself is redone
    noisy = SimpleNamespace(calibrated=True, gen_cv=1.5, gen_r2=0.1, gen_levels=(None,) * 20, train_cv=math.nan,
                            train_r2=math.nan, train_levels=(), train_form="", train_flat=math.nan)
    config = {"algo": "grpo", "prompts": 128, "group": 8}
    bad = SimpleNamespace(**{**vars(study), "models": SimpleNamespace(**{**vars(fits), "validation": noisy,
                                                                         "config": config})})
    redo = decider(iv, 32, 8, bad, WhatIf(prompts=32))
    assert "cost fits cannot be used" in redo and "quiet machine" in redo and "rlrun probe" not in redo
    assert "rlrun record --algo grpo --prompts 128 --group 8" in redo


def test_a_cpu_split_has_an_interval_from_its_sides_cost_errors():
    # a split's sides wait on each other, so nothing resamples its rate: both sides are simulated at the ends of their
    # one-device costs' error, which must hold the point and widen as the fits' held-out error does

    study = prepare([read_trace(TRACE)])
    assert study.device_models is not None
    sg, st = split_side_spreads(study)
    check = fit_check(study)
    assert sg == check.spread("engine-step") > 0 and st == check.spread("training") > 0
    o = evaluate(study, WhatIf(prompts=64, updates=10, gen_gpus=1, train_gpus=1, staleness=1))
    assert o.sigma_lo < o.sigma < o.sigma_hi and o.responses_per_s_lo < o.responses_per_s < o.responses_per_s_hi
    assert "one-device costs at the near end" in o.interval
    # at most both sides' full error each way (the slower side sets the rate)
    assert math.log(o.sigma_hi / o.sigma_lo) <= 2 * 1.645 * max(sg, st) * 1.05
    assert o.time_to_target_ratio_lo < o.time_to_target_ratio < o.time_to_target_ratio_hi


def test_a_splits_ends_are_read_over_end_updates_as_a_ratio_to_the_point():
    # an end longer than END_UPDATES is the point's rate times (end over point, each over the first END_UPDATES
    # updates of the run as long as the point's): the point's own study as its end gives the point back exactly,
    # whether its head is read off its run or simulated; another study's end is that ratio, computed by hand from
    # both studies' full runs

    E = intervals.END_UPDATES
    study = prepare([read_trace(TRACE)])
    cfg = WhatIf(prompts=64, updates=E + 5, gen_gpus=1, train_gpus=1, staleness=1)

    def full(s):  # every update simulated (64 x 15 responses: no steady stop)
        return simulate(models_for(s, cfg)[0], sim_config(s, cfg), rng=np.random.default_rng(cfg.seed))

    def head(run_):
        return run_.responses[:E].sum() / run_.step_time[:E].sum()

    run_ = full(study)
    assert run_.rounds_simulated == E + 5
    q = evaluate(study, cfg).responses_per_s
    assert q == pytest.approx(run_.responses_per_s, rel=1e-12)
    assert intervals._rate(study, cfg, False, study, q, run_)[0] == pytest.approx(q, rel=1e-12)
    assert intervals._rate(study, cfg, False, study, q)[0] == pytest.approx(q, rel=1e-12)
    alt = intervals._gain_study(study, 2.0)
    expect = q * head(full(alt)) / head(run_)
    assert intervals._rate(alt, cfg, False, study, q, run_)[0] == pytest.approx(expect, rel=1e-9)
    assert intervals._rate(alt, cfg, False, study, q)[0] == pytest.approx(expect, rel=1e-9)
    # at or under END_UPDATES (or with no point given) the end is simulated at its own length
    short = WhatIf(prompts=64, updates=E, gen_gpus=1, train_gpus=1, staleness=1)
    assert intervals._rate(alt, short, False, study, q)[0] == pytest.approx(evaluate(alt, short).responses_per_s)


def test_a_long_splits_ends_simulated_in_worker_processes_give_the_serial_outcome(monkeypatch):
    # the ends' short runs depend on nothing the point computes: forked workers run them beside it, and the outcome
    # is the serial one, the parent simulating none of them; the point's own head is read off its run, never simulated

    study = prepare([read_trace(TRACE)], split_gain=2.0)  # a device-sharing gain: its 1x end is simulated
    cfg = WhatIf(prompts=64, updates=intervals.END_UPDATES + 5, gen_gpus=1, train_gpus=1, staleness=1)
    calls, real = [], intervals._simulate_rate
    monkeypatch.setattr(intervals, "_simulate_rate", lambda s, c, head=None: calls.append(s) or real(s, c, head))
    serial = dumps(evaluate(study, cfg).to_dict())
    ahead = intervals._gain_study(study, 1.0)  # the gain end's short run
    assert ahead in calls and study not in calls and "device-sharing costs" in serial
    calls.clear()
    assert dumps(evaluate(study, cfg, workers=2).to_dict()) == serial
    assert ahead not in calls and not intervals._PRIMED and not intervals._JOBS


def test_a_worker_that_dies_leaves_its_end_to_the_parent(monkeypatch):
    study = prepare([read_trace(TRACE)], split_gain=2.0)
    cfg = WhatIf(prompts=64, updates=intervals.END_UPDATES + 5, gen_gpus=1, train_gpus=1, staleness=1)
    serial = dumps(evaluate(study, cfg).to_dict())
    monkeypatch.setattr(intervals, "_job_rate", lambda i: os._exit(9))  # as the OOM killer would
    assert dumps(evaluate(study, cfg, workers=2).to_dict()) == serial
