"""The calibration's plan without an engine: half-octave rungs, the cap and the wave rung, the standard error
that decides when a level is measured enough."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np

from rlsim.runner.calibrate import SE_TARGET, Ladder, _Calibration, gen_ladder, half_octaves, median_se
from rlsim.runner.summary import DEVICE_RATIO_RANGE, LADDER_MIN_SHARE, calibration_lines, calibration_warnings


def test_half_octaves_are_distinct_and_end_at_top():
    h = half_octaves(100)
    assert h == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 100]
    assert all(b / a <= 2.0 for a, b in zip(h, h[1:])) and half_octaves(1) == [1]


def test_ladder_capped_by_max_num_seqs_adds_a_wave_rung():
    rungs, wave = gen_ladder(batch=64, max_num_seqs=256, kv_tokens=10**6, block=16, ctx=80)
    assert rungs[-1] == 256 and wave == 384  # 16 x 64 = 1024 wanted, 256 fit at once: 1.5 x 256 in two waves
    rungs, wave = gen_ladder(batch=4, max_num_seqs=256, kv_tokens=10**6, block=16, ctx=80)
    assert rungs[-1] == 64 and wave is None  # 16 x 4 fits


def test_ladder_capped_by_the_kv_cache():
    rungs, wave = gen_ladder(batch=64, max_num_seqs=1024, kv_tokens=96 * 100, block=16, ctx=90)  # 96 tokens a sequence
    assert rungs[-1] == 100 and wave == 150


def test_median_standard_error_and_open_levels():
    rng = np.random.default_rng(0)
    x = 1.0 + 0.05 * rng.standard_normal(400)
    assert abs(median_se(x) - 1.2533 * 0.05 / 20) < 0.002
    assert math.isnan(median_se([1.0, 2.0]))
    lad = Ladder()
    lad.add(1, [1.0, 1.01, 0.99, 1.0, 1.0, 1.02])   # tight: done
    lad.add(2, [1.0, 1.5, 0.6, 1.3, 0.8, 1.2])      # noisy: measure again
    lad.add(4, [1.0, 1.0])                          # too few values
    assert median_se(lad.values[1]) <= SE_TARGET
    assert lad.open([1, 2, 4, 8], min_n=3) == [2, 4, 8]
    assert [s["n"] for s in lad.summary("level")] == [6, 6, 2]


def test_inspect_shows_the_paired_one_device_phase():
    cal = {"duration_s": 9.0, "budget_s": 8.0, "gen_s": 3.0, "train_s": 4.0, "gen_rungs": [], "train_levels": [],
           "device": {"threads": 1, "t0": 7.0, "gen_level": 256, "gen_ratios": [1.63, 1.24], "train_level": 64,
                      "train_ratios": [1.73, 1.79, 1.75], "duration_s": 2.7}}
    line = calibration_lines(cal)[1]
    assert "engine steps x1.44 (2 pairs: 1.63, 1.24) at 256 sequences" in line
    assert "training x1.75 (3 pairs: 1.73, 1.79, 1.75) at one micro-batch of 64 responses" in line


def test_training_ladder_buys_levels_before_range():
    # a fake trainer whose pass costs 1 ms per response on a fake clock: the budget affords the five smallest levels
    # (a visit is two passes), where the largest-first order would have bought 256 and left little else
    now = [0.0]

    def profile(samples, micro=None):
        d = 1e-3 * len(samples)
        now[0] += d
        return SimpleNamespace(t_forward=d / 3, t_backward=2 * d / 3, num_tokens=10 * len(samples))

    cal = _Calibration(None, SimpleNamespace(profile=profile), SimpleNamespace(G=8, seed=0), [], [], None,
                       random.Random(0))
    cal.clock = lambda: now[0]
    sample = SimpleNamespace(prompt_ids=[1] * 4, response_ids=[2] * 6)
    batches = {R: [sample] * R for R in (8, 16, 32, 64, 128, 256, 512)}
    lad = cal.train_ladder(batches, 1e-4, budget_end=0.6)
    first = [f["calib_level"] for _, f in cal.rows][:5]
    assert first == [8, 16, 32, 64, 128] and set(lad.values) == {8, 16, 32, 64, 128}
    assert {"train 256", "train 512"} <= set(lad.skipped)


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _fake_run(monkeypatch, budget_s: float | None, device: bool, log=lambda m: None, one_core: float = 2.0,
              shared: float | None = None):
    """run_calibration over a fake engine and trainer on a fake clock: an engine step costs 1 ms + 10 us a sequence,
    a training pass 1 ms a response (x `one_core` inside a one-device block, x `shared` more while two are open:
    the other side works beside it; `shared` None: no interference pairs). Only the measuring thread's work moves
    the clock (the other side's runs beside it)."""
    import threading
    from contextlib import contextmanager

    import rlsim.runner.calibrate as calib

    clock, blocks = _FakeClock(), [0]

    def factor() -> float:
        return 1.0 if not blocks[0] else one_core * ((shared or 1.0) if blocks[0] > 1 else 1.0)

    def tick(d: float) -> None:
        if threading.current_thread() is threading.main_thread():
            clock.now += d

    class Engine:
        max_model_len, max_num_seqs, kv_cache_tokens, block_size = 64, 256, 10**6, 16
        engine = SimpleNamespace(reset_prefix_cache=lambda: None)
        clock = None

        def sampling(self, n, temperature, ignore_eos=False):
            return n

        def generate(self, reqs, n_tokens, on_step=None):
            running = sum(k for _, _, k in reqs)
            for _ in range(n_tokens):
                d = factor() * (1e-3 + 1e-5 * min(running, self.max_num_seqs))
                t = clock.now
                tick(d)
                if on_step:
                    on_step(SimpleNamespace(t_start=t, duration=d, num_running=min(running, self.max_num_seqs),
                                            num_waiting=0, prefill_tokens=0, decode_tokens=running, context_tokens=0,
                                            kv_usage=0.0, finished=0))

    def profile(samples, micro=None):
        d = factor() * 1e-3 * len(samples)
        tick(d)
        return SimpleNamespace(t_forward=d / 3, t_backward=2 * d / 3, num_tokens=10 * len(samples))

    @contextmanager
    def one_device(k=0):
        blocks[0] += 1
        try:
            yield
        finally:
            blocks[0] -= 1

    trainer = SimpleNamespace(profile=profile, micro_for=lambda R: max(1, R // 4), pad_id=0)
    cfg = SimpleNamespace(G=8, seed=0, gen_responses=64, responses_per_update=64, temperature=1.0, max_tokens=8,
                          steps=10, eval_every=0, eval_prompts=16, eval_k=1)
    monkeypatch.setattr(calib.time, "perf_counter", clock)
    return calib.run_calibration(Engine(), trainer, cfg, [[1] * 8] * 16, [[2] * 6] * 16, budget_s=budget_s,
                                 threads=2 if device else None, device_threads=one_device if device else None, log=log,
                                 interference=shared is not None)


def _mark(cal: dict, level: str = "gen") -> dict:
    """A calibration's metadata: 20 planned engine levels and 5 training levels, the run at 256 sequences and 64
    responses; `level` ('gen', 'train') keeps all its levels and the other only its lowest ('both': all of both)."""
    gen = [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024]
    train = [8, 16, 32, 64, 128]
    keep_g, keep_t = (gen if level != "train" else gen[:1]), (train if level != "gen" else train[:1])
    return {"duration_s": 9.0, "budget_s": 8.0, "gen_s": 3.0, "train_s": 4.0, "run_levels": {"gen": 256, "train": 64},
            "gen_rungs": [{"level": lv, "n": 6, "median_s": 1e-3, "se": 0.02} for lv in keep_g],
            "train_levels": [{"responses": r, "n": 3, "median_s": 0.1, "se": 0.01} for r in keep_t],
            "skipped": ([f"gen {lv}" for lv in gen if lv not in keep_g]
                        + [f"train {r}" for r in train if r not in keep_t]),
            **cal}


def test_a_budget_at_its_floor_says_what_the_fraction_would_have_been(monkeypatch):
    import rlsim.runner.calibrate as calib

    lines: list[str] = []
    _, info = _fake_run(monkeypatch, None, False, lines.append)  # a recording of a few fake milliseconds
    assert info["budget_s"] == calib.BUDGET_MIN_S
    line = lines[0]
    assert f"before the run (budget {calib.BUDGET_MIN_S:.0f} s): setup" in line
    assert "; the budget is its floor: 10 % of this recording would be " in line
    assert float(line.split("would be ")[1].split(" s")[0]) < 1.0
    assert lines == calibration_lines(info)  # `rlrun inspect` prints the same
    lines.clear()
    _fake_run(monkeypatch, 1.5, False, lines.append)  # a budget given (rlrun calibrate): no estimate to compare
    assert "(budget 2 s): setup" in lines[0] and "floor" not in lines[0]


def test_the_ladders_and_pairs_keep_to_the_budget_and_the_setup_is_recorded_apart(monkeypatch):
    # a one-device pair that would end past the budget is not started (beyond the minimum of two)
    for budget in (1.5, 3.0):
        for device in (False, True):
            rows, info = _fake_run(monkeypatch, budget, device)
            setup = sum(info["setup"].values())
            assert setup > 0.1 and info["duration_s"] <= setup + budget + 0.01, info
            assert info["gen_s"] > 0 and info["train_s"] > 0 and (("device" in info) == device)
            if device:
                assert len(info["device"]["gen_ratios"]) >= 2 and len(info["device"]["train_ratios"]) >= 2
            train = [f for k, f in rows if k == "calib_train"]
            # the warm-up's settled 1x pass is the 1x level's first value, recorded before the ladders
            assert train[0]["calib_level"] == 64 and train[0]["t_start"] < setup
            assert any(lv["responses"] == 64 and lv["n"] >= 1 for lv in info["train_levels"])


def test_inspect_shows_the_setup_and_skips_a_corrupt_one():
    cal = {"duration_s": 10.4, "budget_s": 8.0, "gen_s": 2.2, "train_s": 3.9, "gen_rungs": [], "train_levels": [],
           "setup": {"warm_s": 0.9, "timing_s": 0.65, "held_s": 0.95}}
    assert "(budget 8 s): setup 2.5 s; engine 2.2 s" in calibration_lines(cal)[0]
    for bad in ("soon", {"warm_s": "x"}, {}):
        assert "setup" not in calibration_lines({**cal, "setup": bad})[0]


def test_the_console_prints_what_inspect_prints_and_counts_the_levels_measured(monkeypatch):
    # a budget that buys the engine ladder only part of its rungs: the console's count and range are the measured ones
    lines: list[str] = []
    _, info = _fake_run(monkeypatch, 0.3, True, lines.append)
    assert lines == calibration_lines(info) == calibration_lines({**info, "threads": 2})  # as in the trace's metadata
    got = sorted(r["level"] for r in info["gen_rungs"])
    n = len(got)
    assert f"at {n} level{'' if n == 1 else 's'} {got[0]}..{got[-1]} sequences" in lines[0]
    assert any(s.startswith("gen ") for s in info["skipped"]) and "not measured: gen " in lines[0]


def test_a_ladder_left_short_is_warned_about_once(monkeypatch):

    w = calibration_warnings(_mark({}, level="train"))  # one engine level of 20, below the run's 256
    assert len(w) == 1 and "measured only 1 of 20 engine levels, up to 1 (below the run's own 256)" in w[0]
    assert "training" not in w[0] and "--calibration" in w[0] and "record more steps" in w[0]
    assert "warning    " + w[0] in calibration_lines(_mark({}, level="train"))
    w = calibration_warnings(_mark({}, level="gen"))  # one training level of 5, below the run's 64
    assert len(w) == 1 and "1 of 5 training levels, up to 8 (below the run's own 64)" in w[0]
    # the top rungs skipped (as a routine recording's wave rung and 4x..8x passes are), the run's levels measured
    full = _mark({}, level="gen")
    full["train_levels"] = [{"responses": r, "n": 3, "median_s": 0.1, "se": 0.01} for r in (8, 16, 32, 64)]
    full["skipped"] = ["gen 1536", "train 128"]
    assert calibration_warnings(full) == []
    # a trace from before `run_levels`: the share alone decides
    old = {k: v for k, v in _mark({}, level="train").items() if k != "run_levels"}
    assert "1 of 20 engine levels, up to 1:" in calibration_warnings(old)[0]
    assert 0 < LADDER_MIN_SHARE < 1
    # and a real calibration that skipped most rungs warns on the console
    lines: list[str] = []
    _fake_run(monkeypatch, 0.05, False, lines.append)
    assert any(s.startswith("warning    the calibration measured only") for s in lines), lines


def test_an_implausible_one_core_ratio_is_warned_about_with_its_range(monkeypatch):

    lines: list[str] = []
    _fake_run(monkeypatch, 3.0, True, lines.append, one_core=0.03)  # one core 30x faster than two: no CPU does
    w = [s for s in lines if s.startswith("warning    one device's measured speed is implausible")]
    lo, hi = DEVICE_RATIO_RANGE[0], DEVICE_RATIO_RANGE[1] * 2
    assert len(w) == 1 and "engine x0.03" in w[0] and "training x0.03" in w[0]
    assert f"plausible {lo:g}..{hi:g}" in w[0]
    lines.clear()
    _fake_run(monkeypatch, 3.0, True, lines.append, one_core=2.0)  # perfectly parallel on 2 threads: plausible
    assert not any("implausible" in s for s in lines)
    dev = {"threads": 1, "run_threads": 4, "gen_ratios": [3.9], "train_ratios": [5.5], "gen_level": 8, "train_level": 8}
    assert calibration_warnings(_mark({"device": dev}, "both")) == []  # 4 threads: up to 6 is plausible
    w = calibration_warnings(_mark({"device": {**dev, "run_threads": None}, "threads": 2}, "both"))
    assert len(w) == 1 and "engine x3.9 and training x5.5 (" in w[0]
    assert f"plausible {lo:g}..{hi:g}:" in w[0]  # the run's 2 threads


def test_each_side_is_measured_again_beside_the_other_within_the_budget(monkeypatch):
    # a side at one thread runs 1.3x slower while the other works on another device: the pairs' loaded / alone ratios
    for budget in (1.5, 3.0):
        rows, info = _fake_run(monkeypatch, budget, True, one_core=2.0, shared=1.3)
        dev = info["device"]
        assert info["duration_s"] <= sum(info["setup"].values()) + budget + 0.01
        assert dev["load_threads"] == 1 and len(dev["gen_shared_ratios"]) >= 2 and len(dev["train_shared_ratios"]) >= 2
        assert np.allclose(dev["gen_shared_ratios"], 1.3) and np.allclose(dev["train_shared_ratios"], 1.3)
        assert np.allclose(dev["gen_ratios"], 2.0) and np.allclose(dev["train_ratios"], 2.0)  # alone: unchanged
        for kind in ("calib_gen", "calib_train"):
            loaded = [f for k, f in rows if k == kind and f.get("load_threads") == 1]
            assert loaded and all(f["threads"] == 1 and f["t_start"] >= dev["t0"] for f in loaded)
        assert not any("load_threads" in f for k, f in rows if k == "calib_gen" and f["t_start"] < dev["t0"])
        assert "interfere  one core beside the other side" in calibration_lines(info)[2]
    _, info = _fake_run(monkeypatch, 3.0, True)  # no interference asked: the pairs as before
    assert "gen_shared_ratios" not in info["device"] and len(calibration_lines(info)) == 2
