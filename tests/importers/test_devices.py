"""Device profiles and the roofline rescale on a hand-made model: every factor computed by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlsim.replay.devices import PROFILES, get_profile, profile_for_hardware, rescale
from rlsim.replay.errors import RlsimError
from rlsim.replay.robust import AffineModel, FitQuality
from rlsim.replay.models import FittedModels, GenOverheadModel, GenStepModel, LengthModel, Recorded
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace

ROOT = Path(__file__).resolve().parents[2]
Q = FitQuality(10, 0.9, 0.01, 0.01, 0.02)


def hand_model(hardware=None) -> FittedModels:
    return FittedModels(
        gen=GenStepModel(c_step=0.010, c_seq=2e-5, c_ctx=1e-8, c_prefill=1e-6, quality=Q, concurrency_range=(64, 256)),
        gen_overhead=GenOverheadModel(base=0.3, per_response=1e-4, per_step=1e-5, quality=Q),
        lengths=LengthModel(prompt_tokens=np.array([100], np.int32), response_tokens=np.array([200, 300], np.int32),
                            max_tokens=1024, prefill_ratio=1.0),
        update=AffineModel("update", "tokens", 0.5, 1e-5, Q), prep=AffineModel("prep", "tokens", 0.1, 4e-6, Q),
        reward=AffineModel("reward", "responses", 0.2, 1e-3, Q), other=AffineModel("other", "responses", 0.25, 0.0, Q),
        sync=AffineModel("sync", "bytes", 0.2, 1e-10, Q), sync_bytes=6e9,
        engine={"max_num_seqs": 1024, "kv_cache_tokens": 1_000_000, "block_size": 16, "max_model_len": 2048},
        config={"algo": "grpo", "prompts": 64, "group": 4, "tp": 2,
                **({"hardware": hardware} if hardware is not None else {})},
        recorded=Recorded(step=np.arange(2), step_time=np.array([20.0, 21.0]), gen_time=np.array([10.0, 11.0]),
                          train_time=np.array([5.0, 5.0]), sync_time=np.zeros(2),
                          num_responses=np.array([256.0, 256.0]), gen_steps=np.array([900.0, 950.0])))


def test_profiles_have_datasheet_numbers_and_a_measured_cpu():
    need = {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x", "l40s", "cpu-amd-epyc"}
    assert need <= set(PROFILES)
    h100 = get_profile("H100")
    assert (h100.mem_bandwidth_gbs, h100.flops_tflops, h100.memory_gb,
            h100.interconnect_gbs) == (3350.0, 989.0, 80.0, 900.0)
    assert get_profile("a100 40GB").mem_bandwidth_gbs == 1555.0 and get_profile("MI300X").flops_tflops == 1307.4
    # the measured CPU is a bench output kept apart from the datasheets, and says which bench measured it
    assert "bench.device_profile" in PROFILES["cpu-amd-epyc"].source
    from rlsim.replay.device_data import DEVICES
    from rlsim.replay.measured_hosts import HOSTS
    assert "amd epyc" in HOSTS and not any(v[5] == "cpu" for v in DEVICES.values())
    assert all(p.source for p in PROFILES.values())
    assert profile_for_hardware({"device_name": "NVIDIA A100-SXM4-40GB"}).key == "a100-40gb"
    assert profile_for_hardware({"device": "cpu", "device_name": "AMD EPYC"}).key == "cpu-amd-epyc"
    assert profile_for_hardware({"device_name": "Tesla T4", "device": "cuda"}) is None


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(RlsimError, match=r"unknown device 'tpu-v5'; known devices: a100-40gb, a100-80gb, h100-sxm, "
                                         r"h200, b200, mi300x, l40s, h20, h800, a800-80gb, l20, gb200, cpu-amd-epyc"):
        rescale(hand_model({"profile": "h100-sxm", "device_count": 8}), "tpu-v5", 8)


def test_rescale_h100x8_to_b200x16_by_hand():
    m = hand_model({"profile": "h100-sxm", "device_count": 8})
    out, notes = rescale(m, "b200", 16)
    bw, fl, ic, g = 3350 / 7700, 989 / 2250, 900 / 1800, 8 / 16
    assert out.gen.c_step == pytest.approx(0.010 * bw, rel=1e-12)
    assert out.gen.c_seq == pytest.approx(2e-5 * fl * g, rel=1e-12)
    assert out.gen.c_ctx == pytest.approx(1e-8 * bw * g, rel=1e-12)
    assert out.gen.c_prefill == pytest.approx(1e-6 * fl * g, rel=1e-12)
    assert (out.update.intercept, out.update.slope) == pytest.approx((0.5 * bw * g, 1e-5 * fl * g), rel=1e-12)
    assert (out.prep.intercept, out.prep.slope) == pytest.approx((0.1 * bw * g, 4e-6 * fl * g), rel=1e-12)
    assert (out.sync.intercept, out.sync.slope) == pytest.approx((0.2 * ic, 1e-10 * ic), rel=1e-12)
    assert out.engine["max_num_seqs"] == 2048 and out.engine["kv_cache_tokens"] == round(1_000_000 * (180 / 80) / g)
    # host side and what was recorded: unchanged
    assert out.gen_overhead == m.gen_overhead and out.reward == m.reward and out.other == m.other
    assert out.recorded is m.recorded and out.lengths is m.lengths
    assert out.config["hardware"]["profile"] == "b200" and out.config["rescaled_from"]["profile"] == "h100-sxm"
    assert out.warnings[-1].startswith("costs rescaled from 8 x h100-sxm to 16 x b200")
    text = "\n".join(notes)
    assert f"x{bw:.4g}" in text and f"x{fl * g:.4g}" in text and f"x{ic:.4g}" in text
    # the input is untouched
    assert m.gen.c_step == 0.010 and m.engine["max_num_seqs"] == 1024


def test_rescale_same_hardware_is_the_identity():
    m = hand_model({"profile": "h200", "device_count": 8})
    out, _ = rescale(m, "h200", 8)
    for a, b in ((out.gen.c_step, 0.010), (out.gen.c_seq, 2e-5), (out.update.slope, 1e-5), (out.sync.intercept, 0.2)):
        assert a == pytest.approx(b, rel=1e-12)
    assert out.engine == m.engine


def test_rescale_source_from_arguments():
    m = hand_model()  # no hardware in the config
    with pytest.raises(RlsimError, match="does not say which hardware recorded it"):
        rescale(m, "h200", 8)
    a, _ = rescale(m, "h200", 8, source_profile="a100-80gb", source_gpus=4)
    assert a.gen.c_seq == pytest.approx(2e-5 * (312 / 989) * (4 / 8), rel=1e-12)
    b, _ = rescale(m, "h200", 8, source_profile={"device_name": "NVIDIA A100-SXM4-80GB", "device_count": 4})
    assert b.gen.c_seq == a.gen.c_seq
    with pytest.raises(RlsimError, match="--gpus must be a positive integer"):
        rescale(m, "h200", 0, source_profile="a100-80gb")
    with pytest.raises(RlsimError, match="no device profile matches"):
        rescale(m, "h200", 8, source_profile={"device_name": "Tesla T4"})


def test_rescale_an_rlrun_cpu_trace_to_h200():
    t = read_trace(ROOT / "traces" / "grpo_p128.parquet")
    m = fit_trace(t)
    out, notes = rescale(m, "h200", 8, source_profile=t.meta["hardware"])
    assert out.gen.c_seq == pytest.approx(m.gen.c_seq * (0.1442 / 989) * (1 / 8), rel=1e-12)
    # from a CPU source only the weight-read part of an engine step moves: model bytes / bandwidth
    w = min(m.gen.c_step, m.sync_bytes / 21.3e9)
    assert out.gen.c_step == pytest.approx(w * 21.3 / 4800 + (m.gen.c_step - w), rel=1e-12)
    assert "host overhead and stays" in notes[1]
    assert out.engine["max_num_seqs"] == 8 * m.engine["max_num_seqs"]
    assert notes[0].startswith(f"rescaled from 1 x {profile_for_hardware(t.meta['hardware']).name} to 8 x")
