"""What a phase-level log at one batch size cannot identify (the per-step vs per-token generation cost) becomes
an interval: the fit keeps the other end (`FittedModels.alternative`) and every prediction is made at both ends."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from rlsim.core.config import WhatIf
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace
from rlsim.replay.errors import RlsimError
from rlsim.whatif.intervals import SPLIT_GAIN_HI, other_device
from rlsim.whatif.predict import evaluate, reference_outcome
from rlsim.whatif.study import SPLIT_SHARING_GAIN, models_for, prepare, sharing_gain, split_gain_of
from tests.importers.fixtures import VERL_CONFIG, write_step_lines, write_verl_log

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
    # prior at one end, the longest response's cap at the other
    assert m.alternative is not None and m.alternative.gen.c_step > 2 * m.gen.c_step > 0
    assert any("cannot tell the per-step generation cost" in w for w in m.warnings)
    assert any(w.startswith("terms from the NVIDIA H100 SXM 80GB datasheet: the per-step generation cost (roofline), "
                            "the prefill cost per prompt token; from the log: generation's per-token cost, training")
               for w in m.warnings)
    assert m.alternative.update is m.update  # only generation is unidentified
    ref = reference_outcome(study, updates=4)
    assert ref.responses_per_s_lo < ref.responses_per_s_hi  # the reference's own throughput is uncertain once simulated
    for cfg in (WhatIf(gpus=32, updates=4), WhatIf(prompts=256, updates=4)):
        o = evaluate(study, cfg)
        assert o.responses_per_s_lo <= o.responses_per_s <= o.responses_per_s_hi
        assert o.responses_per_s_hi > 1.02 * o.responses_per_s_lo, cfg
        assert "both ends of what the trace cannot identify (the per-step generation cost" in o.interval
        assert o.time_to_target_ratio_lo <= o.time_to_target_ratio <= o.time_to_target_ratio_hi


def test_more_gpus_gain_less_at_the_per_step_end(tmp_path):
    # all of the longest response's engine steps: more engines cannot shorten it, so 4x the GPUs gains less there
    study = _study(tmp_path, [ROW] * 8)
    o = evaluate(study, WhatIf(gpus=32, updates=4))
    ref = reference_outcome(study, updates=4)
    assert o.responses_per_s > ref.responses_per_s and o.responses_per_s_lo < 0.98 * o.responses_per_s
    # a change of hardware, not of batch: sigma leaves it out, the responses/s interval carries it
    assert o.sigma == 1.0


def _whole_step_study(tmp_path):
    write_step_lines(tmp_path / "w.log",
                     "timing_s/step:100.0 - response_length/mean:500.0 - response_length/max:1024 - "
                     "response_length/min:20 - response_length/clip_ratio:0.01 - prompt_length/mean:100.0 - "
                     "actor/lr:1e-06",
                     steps=range(1, 9), tag="(TaskRunner pid=1) ")
    (tmp_path / "config.yaml").write_text(VERL_CONFIG)
    out = import_log("verl", tmp_path / "w.log", out=tmp_path / "w.parquet", config=str(tmp_path / "config.yaml"),
                     device="h100", gpus=8, overwrite=True)
    return prepare([read_trace(out)])


def test_a_log_of_whole_steps_spans_generations_share(tmp_path):
    study = _whole_step_study(tmp_path)
    m, alt = study.models, study.models.alternative
    assert alt is not None and alt.update.slope < m.update.slope  # more generation, less training: both fit the step
    assert any("the decode cost per token; from the log: training" in w for w in m.warnings)
    ref, ref_alt = reference_outcome(study, updates=4), reference_outcome(replace(study, models=alt), updates=4)
    assert abs(ref.step_time_s - 100.0) < 5 and abs(ref_alt.step_time_s - 100.0) < 5
    assert ref_alt.gen_s > 0.6 * ref_alt.step_time_s > ref.gen_s
    o = evaluate(study, WhatIf(gen_gpus=4, train_gpus=4, staleness=1, updates=4))
    assert o.responses_per_s_lo < o.responses_per_s_hi and "generation's share of the logged step" in o.interval


def test_another_gpu_spans_its_datasheet_gain_and_none(tmp_path):
    study = _study(tmp_path, [ROW] * 8)
    o = evaluate(study, WhatIf(device="b200", updates=4))
    same = evaluate(study, WhatIf(gpus=8, updates=4))
    assert o.responses_per_s_lo <= same.responses_per_s * 1.0001 and o.responses_per_s_hi >= o.responses_per_s
    assert "datasheet gain at one end" in o.interval
    assert "datasheet gain" not in evaluate(study, WhatIf(gpus=16, updates=4)).interval
    cpu = SimpleNamespace(hardware={"device": "cpu", "torch_threads": 2}, models=SimpleNamespace(config={}))
    assert not other_device(cpu, "h100")  # a CPU trace's own speed is no end of a GPU's range


def test_a_split_from_a_colocated_gpu_run_takes_the_sharing_gain_and_spans_none_to_the_far_end(tmp_path):
    study = _study(tmp_path, [ROW] * 8)
    g = SPLIT_SHARING_GAIN
    assert study.split_gain == g > 1
    cfg = WhatIf(gen_gpus=4, train_gpus=4, staleness=1, updates=6)
    o = evaluate(study, cfg)
    none, far = (replace(study, split_gain=x) for x in (1.0, SPLIT_GAIN_HI))
    assert models_for(study, cfg)[0].gen.c_seq == pytest.approx(models_for(none, cfg)[0].gen.c_seq / g)
    assert models_for(study, cfg)[0].update.slope == pytest.approx(models_for(none, cfg)[0].update.slope / g)
    q_none, q_far = evaluate(none, cfg).responses_per_s, evaluate(far, cfg).responses_per_s
    assert q_none < o.responses_per_s <= q_far  # the package's gain may sit at the far end
    assert o.responses_per_s_lo <= q_none * 1.0001 and o.responses_per_s_hi >= q_far * 0.9999  # 1x and 2x at the ends
    mid = replace(study, split_gain=1.5)
    m = evaluate(mid, cfg)
    assert q_none < m.responses_per_s < q_far and m.responses_per_s_lo <= q_none * 1.0001
    assert m.responses_per_s_hi >= q_far * 0.9999
    assert "device-sharing costs" in o.interval and "device-sharing" not in evaluate(none, cfg).interval
    assert any(f"each split side {g:g}x the colocated log's speed per device" in n for n in o.notes)
    # on the recorded 8 devices: no hardware change to compare, and the one-device rescale is no --gpus the user asked
    assert any(n.startswith("one device of a split side: 1 x the recorded device") for n in o.notes)
    assert not any("without --device" in n or "compared with the reference configuration" in n for n in o.notes)
    moved = evaluate(study, replace(cfg, gen_gpus=8))  # 12 devices: the reference colocated on 12 is a change
    assert any(n.startswith("compared with the reference configuration") for n in moved.notes)
    assert "device-sharing" not in evaluate(study, WhatIf(gpus=16, updates=4)).interval  # colocated: no such end
    with pytest.raises(RlsimError, match="split_gain must be a positive number"):
        prepare([read_trace(tmp_path / "t.parquet")], split_gain=0)


def test_no_sharing_gain_for_a_split_recording_or_a_cpu_trace():
    gpu = {"hardware": {"device": "cuda", "device_name": "NVIDIA H100 SXM 80GB", "device_count": 16}}
    assert sharing_gain(SimpleNamespace(config={}, meta=gpu)) == SPLIT_SHARING_GAIN
    assert sharing_gain(SimpleNamespace(config={"execution_mode": "colocate_async"}, meta=gpu)) == SPLIT_SHARING_GAIN
    assert sharing_gain(SimpleNamespace(config={"execution_mode": "fully_async"}, meta=gpu)) == 1.0
    assert sharing_gain(SimpleNamespace(config={}, meta={"hardware": {"device": "cpu", "torch_threads": 2}})) == 1.0


def test_a_hybrid_mode_shares_the_devices_as_the_colocated_run_did_and_takes_no_gain(tmp_path):
    study = _study(tmp_path, [ROW] * 8)
    cfg = WhatIf(mode="colocate_async", train_gpus=8, updates=4)
    assert split_gain_of(study, cfg) == 1.0 and split_gain_of(study, WhatIf(gen_gpus=4, train_gpus=4)) > 1
    none = replace(study, split_gain=1.0)
    assert models_for(study, cfg)[0].gen.c_seq == models_for(none, cfg)[0].gen.c_seq
    assert "device-sharing" not in evaluate(study, cfg).interval
