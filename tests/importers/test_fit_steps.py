"""fit_steps: the length stand-in, round features by hand, coefficient recovery, the roofline-prior
fallback and its warnings, and `rlsim run` on an imported trace (the shipped verl example)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlsim.whatif.fidelity import replay_trace
from rlsim.core.config import WhatIf
from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels
from rlsim.replay.fit import fit_trace
from rlsim.replay.fit_steps import fit_steps, is_step_level, lognormal_lengths, round_features
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace
from rlsim.whatif.predict import run
from tests.importers.fixtures import verl_line

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "verl"


def test_lognormal_stand_in_matches_the_logged_statistics():
    x = lognormal_lengths(1280, 285.0, 39.0, 800.0, 0.0, 1024)
    assert x.mean() == pytest.approx(285.0, rel=1e-12) and x.max() == 800.0 and x.min() >= 39.0
    assert np.all(np.diff(x) >= 0)
    # verl issue #316's step 5: half the responses clipped
    y = lognormal_lengths(1280, 684.393, 3.0, 1024.0, 0.521, 1024)
    assert y.mean() == pytest.approx(684.393, rel=1e-12) and np.mean(y >= 1024) == pytest.approx(0.521, abs=1 / 1280)
    z = lognormal_lengths(100, 50.0, cap=200)  # only the mean
    assert z.mean() == pytest.approx(50.0) and z.max() <= 200
    assert np.all(lognormal_lengths(8, 30.0, 30.0, 30.0, 0.0, 100) == 30.0)
    with pytest.raises(RlsimError, match="length mean"):
        lognormal_lengths(8, math.nan)


def test_round_features_by_hand():
    rng = np.random.default_rng(0)
    L, p = np.array([3.0, 1.0, 2.0]), np.array([10.0, 10.0, 10.0])
    K, S1, S2, S3 = round_features(L, p, 8, 0.5, rng)
    # all admitted at once: K = longest; S2 = sum of L p + L (L - 1) / 2 = (30 + 3) + (10 + 0) + (20 + 1)
    assert (K, S1, S2, S3) == (3.0, 6.0, 64.0, 15.0)
    K1, *_ = round_features(L, p, 1, 1.0, rng)  # one slot: requests one after another
    assert K1 == 6.0
    K2, *_ = round_features(np.array([4.0, 1.0, 1.0, 1.0]), np.ones(4), 2, 1.0, np.random.default_rng(1))
    assert K2 == 4.0  # the three short ones share the other slot


def _log(path: Path, steps: list[tuple[float, float, float]], *, P: int, G: int, c_step: float, c_tok: float,
         start: int = 1) -> None:
    """A verl log whose generation time is c_step x K + c_tok x S1 exactly, K and S1 from the stand-in."""
    lines = []
    for i, (mean, lo, hi) in enumerate(steps, start):
        r = lognormal_lengths(P * G, mean, lo, hi, 0.0, 2048)
        K, S1, _, _ = round_features(r, np.full(P * G, 100.0), 1 << 20, 1.0 / G, np.random.default_rng(i))
        gen = c_step * K + c_tok * S1
        line, _ = verl_line(i, gen=gen, reward=0.5, old_log_prob=1.0, ref=1.0, adv=0.05,
                            update_actor=2e-5 * P * G * (mean + 100),
                            resp_mean=mean, resp_min=lo, resp_max=hi, P=P, G=G)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def test_known_coefficients_recovered_across_batch_sizes(tmp_path):
    rng = np.random.default_rng(3)
    traces = []
    for P in (32, 128):
        steps = [(float(rng.uniform(200, 300)), 20.0, float(rng.uniform(600, 1000))) for _ in range(8)]
        _log(tmp_path / f"p{P}.log", steps, P=P, G=4, c_step=0.012, c_tok=2e-5)
        traces.append(read_trace(import_log("verl", tmp_path / f"p{P}.log", prompts=P, group=4, gpus=8,
                                            out=tmp_path / f"p{P}.parquet")))
    m = fit_trace(traces)
    assert isinstance(m, FittedModels) and m.gen.quality.method.startswith("nnls over 2")
    assert m.gen.c_step == pytest.approx(0.012, rel=0.02) and m.gen.c_seq == pytest.approx(2e-5, rel=0.02)
    assert m.update.slope == pytest.approx(2e-5, rel=0.02)


def test_one_batch_size_uses_the_roofline_prior_and_says_so(tmp_path):
    # every step the same longest response: the engine steps do not vary, c_step cannot be fitted
    steps = [(float(m), 20.0, 900.0) for m in np.linspace(220, 300, 10)]
    _log(tmp_path / "a.log", steps, P=64, G=4, c_step=0.012, c_tok=2e-5)
    t = read_trace(import_log("verl", tmp_path / "a.log", prompts=64, group=4, gpus=8, device="h100",
                              model_params="7B", out=tmp_path / "a.parquet"))
    m = fit_trace(t)
    prior = 14e9 / (3350e9)  # bf16 bytes / (tp 1 x H100 bandwidth)
    assert m.gen.prior and m.gen.c_step == pytest.approx(prior, rel=1e-9)
    assert any("roofline prior" in w and "H100" in w for w in m.warnings)
    assert any("only per-step phase times were logged" in w for w in m.warnings)
    assert m.gen.c_prefill == pytest.approx(2 * 7e9 / (8 * 989e12))
    t2 = read_trace(import_log("verl", tmp_path / "a.log", prompts=64, group=4, gpus=8, out=tmp_path / "b.parquet"))
    m2 = fit_trace(t2)
    assert m2.gen.c_step == 0.0 and any("no roofline prior is available" in w for w in m2.warnings)


def test_fit_dispatch_and_step_level_detection(tmp_path):
    t = read_trace(ROOT / "traces" / "grpo_p128.parquet")
    assert not is_step_level(t)
    _log(tmp_path / "a.log", [(250.0, 20.0, 800.0)] * 4, P=16, G=4, c_step=0.01, c_tok=1e-5)
    s = read_trace(import_log("verl", tmp_path / "a.log", prompts=16, group=4, out=tmp_path / "a.parquet"))
    assert is_step_level(s)
    with pytest.raises(RlsimError, match="fit them separately"):
        fit_steps([s, t])


@pytest.fixture(scope="module")
def example_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("ex") / "verl_run.parquet"
    import_log("verl", EXAMPLE / "verl_gsm8k_qwen.log", config=EXAMPLE / "config.yaml", device="h100", out=out)
    return read_trace(out)


def test_shipped_example_fits_its_own_steps(example_trace):
    m = fit_trace(example_trace)
    rec = m.recorded
    assert len(rec.step) == 40 and set(rec.num_responses) == {1280.0}
    assert m.gen.quality.median_rel_err < 0.06  # generation on the stand-in features vs the logged gen times
    assert m.update.quality.median_rel_err < 0.05
    assert m.engine["max_num_seqs"] == 4 * 1024 and m.config["hardware"]["profile"] == "h100-sxm"


def test_rlsim_run_on_an_imported_trace(example_trace):
    """What `rlsim run --trace verl_run.parquet --batch 512` computes (the library call under the CLI)."""
    res = run([example_trace], WhatIf(prompts=512))
    ref, cand = res.reference, res.candidate
    assert (cand.prompts, cand.group, cand.responses_per_update) == (512, 5, 2560)
    assert ref.step_time_s == pytest.approx(res.recorded_step_time_s, rel=0.05)  # the reference replays the log
    assert cand.sigma > 1.0 and cand.step_time_s > ref.step_time_s
    assert any("step-level trace imported from verl" in w for w in res.warnings)
    assert math.isfinite(res.n_star_ref)  # eval rows give a learning curve


def test_rlsim_replay_on_an_imported_trace(example_trace):
    r = replay_trace(example_trace)
    e = r.errors()["step_time"]
    assert e["median"] < 0.08 and e["mean_error"] < 0.03
