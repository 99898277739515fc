"""What a phase-level log at one batch size cannot identify (the per-step vs per-token generation cost) becomes
an interval: the fit keeps the other end (`gen_alt`) and every prediction is made at both ends."""
from __future__ import annotations

from rlsim.config import WhatIf
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace
from rlsim.whatif import evaluate, prepare, reference_outcome
from tests.importers.fixtures import VERL_CONFIG, write_verl_log

ROW = dict(gen=30.0, reward=1.0, old_log_prob=5.0, ref=5.0, adv=0.5, update_actor=12.0)


def _study(tmp_path, table):
    log = tmp_path / "train.log"
    write_verl_log(log, table)
    (tmp_path / "config.yaml").write_text(VERL_CONFIG)
    out = import_log("verl", log, out=tmp_path / "t.parquet", config=str(tmp_path / "config.yaml"), device="h100",
                     gpus=8, overwrite=True)
    return prepare([read_trace(out)])


def test_one_batch_size_keeps_both_ends_and_predictions_span_them(tmp_path):
    study = _study(tmp_path, [ROW] * 8)
    m = study.models
    assert m.gen_alt is not None and m.gen_alt.c_step > 2 * m.gen.c_step > 0  # prior at one end, the longest response's cap at the other
    assert any("cannot tell the per-step generation cost" in w for w in m.warnings)
    ref = reference_outcome(study, updates=4)
    assert ref.responses_per_s_lo < ref.responses_per_s_hi  # the reference's own throughput is uncertain once simulated
    for cfg in (WhatIf(gpus=32, updates=4), WhatIf(prompts=256, updates=4)):
        o = evaluate(study, cfg)
        assert o.responses_per_s_lo <= o.responses_per_s <= o.responses_per_s_hi
        assert o.responses_per_s_hi > 1.02 * o.responses_per_s_lo, cfg
        assert "per-step generation cost at both ends" in o.interval
        assert o.time_to_target_ratio_lo <= o.time_to_target_ratio <= o.time_to_target_ratio_hi


def test_more_gpus_gain_less_at_the_per_step_end(tmp_path):
    # all of the longest response's engine steps: more engines cannot shorten it, so 4x the GPUs gains less there
    study = _study(tmp_path, [ROW] * 8)
    o = evaluate(study, WhatIf(gpus=32, updates=4))
    ref = reference_outcome(study, updates=4)
    assert o.responses_per_s > ref.responses_per_s and o.responses_per_s_lo < 0.98 * o.responses_per_s
    assert o.sigma == 1.0  # a change of hardware, not of batch: sigma leaves it out, the responses/s interval carries it
