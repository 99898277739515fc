"""Every answer compares like with like and says how sure it is (issue: what a new user runs into).

- a what-if on other hardware (--device, --gpus, a split) compares the candidate with the reference configuration
  on that same hardware, and states the hardware change on its own;
- rescaled fixed per-update costs stop at the device profile's floor;
- rho outside the measured curves, or never measured (imported logs), carries bounds and can be undecided;
- a pooled fit still reproduces the reference's own recording.
Answers are checked against hand-computed same-hardware ones: T / T_ref = T(candidate) / T(reference), both there."""
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli import app
from rlsim.core.config import WhatIf
from rlsim.replay.devices import PROFILES, host_name, rescale
from rlsim.replay.io import read_trace
from rlsim.whatif.predict import evaluate, reference_outcome, run
from rlsim.whatif.study import prepare, reference_config

ROOT = Path(__file__).resolve().parents[2]
P128, P64, P32 = (ROOT / "traces" / f"grpo_p{p}.parquet" for p in (128, 64, 32))
EXAMPLE = ROOT / "docs" / "examples" / "verl"
runner = CliRunner()


@pytest.fixture(scope="module")
def study():
    return prepare([read_trace(P128)])


def test_device_what_if_compares_on_the_same_hardware(study):
    h200 = dict(device="h200", gpus=8, updates=10)
    cand = evaluate(study, WhatIf(prompts=1024, **h200))
    ref_there = evaluate(study, WhatIf(prompts=128, **h200))  # the reference configuration, asked for as a candidate
    # hand-computed: time to target of each on the H200s, and their ratio
    assert cand.time_to_target_ratio == pytest.approx(cand.time_to_target_s / ref_there.time_to_target_s, rel=1e-9)
    assert cand.sigma == pytest.approx(cand.responses_per_s / ref_there.responses_per_s, rel=1e-9)
    # the larger batch is slower on the H200s (the point; its interval may span 1 with the trace's noise scale)
    assert cand.time_to_target_ratio > 1 and cand.regime in ("time rises", "undecided")
    # the hardware change on its own line: the reference there over the reference as recorded
    rec = reference_outcome(study, 10, 0)
    assert cand.hardware_gain == pytest.approx(ref_there.responses_per_s / rec.responses_per_s, rel=1e-9)
    assert cand.time_to_target_vs_recorded == pytest.approx(cand.time_to_target_s / rec.time_to_target_s, rel=1e-9)
    assert cand.hardware == "8 x h200" and rec.hardware == "as recorded"
    # and `rlsim run` shows the reference on the same hardware
    res = run([read_trace(P128)], WhatIf(prompts=1024, **h200))
    assert res.reference.responses_per_s == pytest.approx(ref_there.responses_per_s, rel=1e-9)


def test_split_and_gpus_compare_with_the_reference_on_as_many_devices(study):
    split = WhatIf(prompts=256, gen_gpus=3, train_gpus=1, staleness=1, updates=5)
    ref_cfg = reference_config(study, split)
    assert (ref_cfg.prompts, ref_cfg.gpus, ref_cfg.gen_gpus, ref_cfg.staleness) == (128, 4, None, None)
    cand = evaluate(study, split)
    colocated_4 = evaluate(study, WhatIf(prompts=128, gpus=4, updates=5))
    assert cand.sigma == pytest.approx(cand.responses_per_s / colocated_4.responses_per_s, rel=1e-9)
    # --gpus alone is more of the recorded device, and says what it assumed
    g = evaluate(study, WhatIf(prompts=512, gpus=8, updates=5))
    host = host_name(read_trace(P128).meta["hardware"].get("cpu_name"))  # the recording's own processor
    assert host and any("--gpus 8 without --device" in n and host in n for n in g.notes)
    same_gpus = evaluate(study, WhatIf(prompts=128, gpus=8, updates=5))
    assert g.sigma == pytest.approx(g.responses_per_s / same_gpus.responses_per_s)


def test_rescale_stops_fixed_update_cost_at_the_profile_floor(study):
    floor = PROFILES["h200"].update_floor_s
    assert floor > 0
    models, notes = rescale(study.models, "h200", 8, source_profile=study.hardware)
    fixed = study.models.update.offset  # the calibrated update: fixed cost + forward and backward interpolated
    roofline = fixed * (21.3 / 4800) * (1 / 8)
    assert roofline < floor  # the roofline rule alone would give a fraction of a millisecond
    assert models.update.offset == pytest.approx(min(fixed, floor))
    assert any("floor" in n for n in notes)
    # forward + backward is compute: its values at the token levels move by the FLOP/s ratio, the levels stay
    fl = study.hardware and models.update.values[0] / study.models.update.values[0]
    assert models.update.knots == study.models.update.knots and models.update.values == pytest.approx(
        tuple(v * fl for v in study.models.update.values))
    # a cost already under the floor is not raised
    tiny = replace(study.models, update=replace(study.models.update, offset=floor / 10))
    assert rescale(tiny, "h200", 8, source_profile=study.hardware)[0].update.offset == pytest.approx(floor / 10)


def test_curves_beyond_the_data_are_bounded_not_clamped():
    traces = [read_trace(p) for p in (P128, P64, P32)]
    res = run(traces, WhatIf(prompts=512, updates=10), rho_model="curves")
    c = res.candidate
    # B = 4096 is 4x the largest traced batch (1024 = the reference): rho lies in [1, 4] with nothing else known
    assert (c.rho_lo, c.rho_hi) == pytest.approx((1.0, 4.0))
    assert c.time_to_target_ratio_lo <= 1.0 / c.sigma_hi + 1e-9 and c.time_to_target_ratio_hi >= 4.0 / c.sigma_lo - 1e-9
    assert not any("clamped" in w for w in c.warnings)
    # the bounds straddle 1: only the sample cost can decide, and the warning says how
    if c.time_to_target_ratio_lo < 1.0:
        assert (c.regime == "undecided"
                and any("sample cost decides it" in w and "--prompts 512" in w for w in c.warnings))
    else:  # slower even at rho = 1
        assert c.regime == "time rises"
    # inside the curves rho is measured: no bounds
    inside = run(traces, WhatIf(prompts=64, updates=10), rho_model="curves").candidate
    assert inside.rho_lo == inside.rho_hi == pytest.approx(inside.rho)


def test_pooled_fit_reproduces_the_reference_recording():
    traces = [read_trace(p) for p in (P128, P64, P32)]
    res = run(traces, WhatIf(prompts=512, updates=20), rho_model="curves")
    ref, recorded = res.reference, res.recorded_responses_per_s
    # the other traces lend the training fit its slope range, not their machine speed: the reference stays anchored
    # to its own updates (the pooled anchor put it at 244 responses/s against 225 recorded, outside its interval)
    assert ref.responses_per_s == pytest.approx(recorded, rel=0.03)
    assert ref.responses_per_s_lo <= recorded <= ref.responses_per_s_hi


def test_imported_log_says_rho_is_assumed_and_is_undecided(tmp_path):
    out = tmp_path / "verl.parquet"
    r = runner.invoke(app, ["import", "verl", str(EXAMPLE / "verl_gsm8k_qwen.log"), "--config",
                            str(EXAMPLE / "config.yaml"), "--device", "h100", "-o", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["run", "--trace", str(out), "--batch", "512", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    b_ratio = d["responses_per_update"] / d["reference"]["responses_per_update"]
    assert d["rho"] == 1.0 and (d["rho_lo"], d["rho_hi"]) == pytest.approx((1.0, b_ratio))
    assert any("rho = 1 is assumed" in w for w in d["warnings"])
    # hand-computed: T / T_ref spans 1 / sigma .. (B / B_ref) / sigma, which holds 1 here
    assert d["time_to_target_ratio_hi"] == pytest.approx(b_ratio / d["sigma"], rel=1e-9)
    assert d["regime"] == "undecided"
    # the measurement that decides it, in the user's framework
    assert any("rlsim import verl" in w for w in d["warnings"])
    # asked for explicitly, rho = 1 is the user's assumption: no bounds
    e = json.loads(runner.invoke(app, ["run", "--trace", str(out), "--batch", "512", "--rho", "invariant",
                                       "--json"]).output)
    assert e["rho_lo"] in (None, 1.0) and e["regime"] != "undecided"


def test_cli_prints_the_verdict_and_separates_notes(tmp_path):
    r = runner.invoke(app, ["run", "--trace", str(P128), "--batch", "1024", "--device", "h200", "--gpus", "8",
                            "--updates", "10"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    out = r.output
    d = json.loads(runner.invoke(app, ["run", "--trace", str(P128), "--batch", "1024", "--device", "h200", "--gpus",
                                       "8", "--updates", "10", "--json"]).output)
    assert "reference (same hardware)" in out and f"verdict: {d['regime']}" in out
    assert "hardware: 8 x h200" in out
    # a split on the recorded cores: the same hardware, no hardware line to read
    split = runner.invoke(app, ["run", "--trace", str(P128), "--batch", "256", "--gen-gpus", "1", "--train-gpus", "1",
                                "--staleness", "1", "--updates", "10"], env={"COLUMNS": "200"})
    assert split.exit_code == 0 and "both on 2 x" in split.output and "\nhardware: " not in split.output
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    notes = [ln for ln in out.splitlines() if ln.startswith("note:")]
    assert len(notes) >= 8 and len(warnings) <= 3  # the per-term rescale factors are notes, not warnings
    assert not any("x0.0" in w for w in warnings)
    assert math.isfinite(d["hardware_gain"])


def test_rescale_moves_the_knee_slopes_with_the_sequence_slope(study):
    # the interpolated fit: above each knee the per-sequence slope changes by its hinge's slope change; all are
    # per-token compute like c_seq, and the knees (measured concurrencies) stay
    gen = study.models.gen
    assert (gen.form in ("linear", "knee", "interp")
            and len(gen.hinges) == {"linear": 0, "knee": 1}.get(gen.form, len(gen.hinges)))
    moved, _ = rescale(study.models, "h200", 8, source_profile=study.hardware)
    slopes, moved_slopes = (gen.c_seq, *gen.dslopes), (moved.gen.c_seq, *moved.gen.dslopes)
    a, b = next((a, b) for a, b in zip(slopes, moved_slopes) if a != 0)  # a fitted slope may be 0
    assert moved.gen.knees == gen.knees and moved_slopes == pytest.approx(tuple(d * b / a for d in slopes))


def test_prompts_is_the_same_option_as_batch():
    a = json.loads(runner.invoke(app, ["run", str(P128), "--prompts", "256", "--updates", "5", "--json"]).output)
    b = json.loads(runner.invoke(app, ["run", "--trace", str(P128), "--batch", "256", "--updates", "5",
                                       "--json"]).output)
    assert a["prompts"] == b["prompts"] == 256 and a["responses_per_s"] == b["responses_per_s"]


def test_gpus_alone_scales_a_device_without_a_profile(study):
    # an Ascend 910B has no datasheet profile: more of the same device needs only the count
    npu = replace(study, hardware={"device": "npu", "device_name": "Ascend 910B", "device_count": 8})
    out = evaluate(npu, WhatIf(prompts=256, gpus=16, updates=5))
    assert any("--gpus 16 without --device" in n and "Ascend 910B" in n for n in out.notes)
    assert out.hardware == "16 x Ascend 910B" and out.hardware_gain > 1
