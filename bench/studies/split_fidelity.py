"""Split devices and asynchronous rollout: the simulator's predictions against real split recordings.

Records on this machine (serialised with `flock /tmp/rlsim-heavy.lock`, resumable: a trace that exists
and reads as complete is kept):
- `coloc`: the colocated synchronous reference (calibrated, as `rlrun record` does by default);
- `calib_t1`: `rlrun calibrate --threads 1`, the engine and the trainer profiled at one thread in a
  separate process (a comparison: the colocated recording's calibration measures one core already);
- split runs (`--mode split --gen-gpus 1 --train-gpus 1`) at `--staleness` 0, 1, 2, each at seeds
  0 and 1.
Then predicts every split run from the colocated recording alone (in process, what `rlsim run --trace
coloc.parquet --gen-gpus 1 --train-gpus 1 --staleness K` gives: each side one core, its costs from the
recording's own one-core calibration ladder; a long simulated run, so its ratios are steady-state) and compares
with what each run measured in steady state (`rlsim.replay.split_stats`: after the first two updates):
responses/s, generator and trainer idle ratios, mean staleness. A second prediction with the separate
`--calibration calib_t1.parquet` shows what that file adds. The last two columns say how much slower than the
one-core calibration each run's own engine steps and updates ran (medians of measured / calibrated seconds
after the first two updates): the two sides' interference when they overlap.

Targets (issue "split devices and asynchronous rollout"): responses/s within 10 %, idle ratios within 0.05.
The colocated `--train-gpus 2` run is measured and shown beside the one-rank reference; the simulator's
colocated loop has no data-parallel model (its `--train-gpus` is a split option), so it has no prediction.

    python -m bench.studies.split_fidelity                 # record what is missing (~12 min on 2 quiet cores), analyse
    python -m bench.studies.split_fidelity --steps 4       # smoke test
    python -m bench.studies.split_fidelity --no-record     # analyse what is recorded
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

from bench.studies.recording import complete, run_locked, tool
from rlsim.core.config import WhatIf
from rlsim.whatif.outcome import Outcome
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.split_stats import split_stats
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import Study, prepare

P, G = 32, 8
COMMON = ["--prompts", str(P), "--group", str(G), "--eval-every", "0", "--eval-prompts", "16", "--eval-k", "1",
          "--no-progress", "--overwrite"]
SPLIT = ["--mode", "split", "--gen-gpus", "1", "--train-gpus", "1", "--no-calibrate"]
# (name, extra rlrun record args, staleness, partial) -- None staleness: not a split run
RUNS = [
    ("split_e0", SPLIT + ["--staleness", "0"], 0, False),
    ("split_e1", SPLIT + ["--staleness", "1"], 1, False),
    ("split_e2", SPLIT + ["--staleness", "2"], 2, False),
    ("split_e1_seed1", SPLIT + ["--staleness", "1", "--seed", "1"], 1, False),
    ("split_e0_seed1", SPLIT + ["--staleness", "0", "--seed", "1"], 0, False),
    ("split_e2_seed1", SPLIT + ["--staleness", "2", "--seed", "1"], 2, False),
]


def record(out: Path, steps: int, log=print) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rl = tool("rlrun")
    if not complete(out / "coloc.parquet", steps):
        run_locked([rl, "record", *COMMON, "--steps", str(steps), "--out", str(out / "coloc.parquet")], log)
    if not complete(out / "calib_t1.parquet", None):
        run_locked([rl, "calibrate", "--prompts", str(P), "--group", str(G), "--threads", "1", "--overwrite",
                    "--out", str(out / "calib_t1.parquet")], log)
    for name, extra, _k, _p in RUNS:
        if not complete(out / f"{name}.parquet", steps):
            run_locked([rl, "record", *COMMON, *extra, "--steps", str(steps), "--out", str(out / f"{name}.parquet")],
                       log)


@functools.lru_cache(maxsize=4)
def _study(out: Path, separate: bool) -> Study:
    """The colocated recording fitted once: alone (its calibration's one-core ladder gives each side's costs), or
    with the separate one-thread calibration file (`--calibration calib_t1.parquet`)."""
    cal = [read_trace(out / "calib_t1.parquet")] if separate else []
    return prepare([read_trace(out / "coloc.parquet")], calibration=cal)


def predict(out: Path, staleness: int, partial: bool, separate: bool, updates: int) -> Outcome:
    """The split run predicted from the colocated recording, in process: `rlsim run`'s candidate."""
    cfg = WhatIf(prompts=P, group=G, gen_gpus=1, train_gpus=1, staleness=staleness, updates=updates,
                 partial_rollout=partial)
    return evaluate(_study(out, separate), cfg)


def slowdown(models, path: Path) -> tuple[float, float]:
    """How much slower than the one-thread calibration the run's own steps ran: the median over its steady
    updates (after the first two) of measured / calibrated seconds, for engine steps and for updates."""
    t = read_trace(path)
    g, u = t.rows("gen_step"), t.rows("update")
    ok = g["step"] >= 2
    pred = models.gen.predict(g["num_running"][ok], g["context_tokens"][ok], g["prefill_tokens"][ok])
    upd = models.update.predict(u["num_tokens"][2:])
    return float(np.median(g["duration"][ok] / pred)), float(np.median(u["duration"][2:] / upd))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rlsim-split-fidelity", help="folder for the recordings")
    ap.add_argument("--steps", type=int, default=30, help="updates per recording")
    ap.add_argument("--updates", type=int, default=200, help="updates per simulated run (steady state)")
    ap.add_argument("--no-record", action="store_true", help="analyse only what is recorded")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if not a.no_record:
        record(out, a.steps)
    ref = split_stats(out / "coloc.parquet")
    cal_models = fit_trace(read_trace(out / "coloc.parquet"), one_device=True)
    print(f"\nreference (colocated, 2 threads, P={P} G={G}): {ref.responses_per_s:.1f} resp/s measured\n")
    hdr = (f"{'run':22} {'resp/s meas':>11} {'pred':>7} {'err':>7} {'(t1 file)':>9} | {'gen idle':>8} {'pred':>6} | "
           f"{'train idle':>10} {'pred':>6} | {'stale':>5} {'pred':>5} | {'x cal: steps':>12} {'updates':>7}")
    print(hdr)
    print("-" * len(hdr))
    errs, gi, ti = [], [], []
    for name, _extra, k, partial in RUNS:
        path = out / f"{name}.parquet"
        if not path.exists():
            continue
        m = split_stats(path)
        if k is None:
            print(f"{name:22} {m.responses_per_s:11.1f} {'-':>7} {'-':>7} {'-':>8} | {m.gen_idle_ratio:8.2f} {'-':>6} "
                  f"| {m.train_idle_ratio:10.2f} {'-':>6} | {m.staleness_mean:5.2f} {'-':>5}")
            continue
        pc = predict(out, k, partial, False, a.updates)
        pu = predict(out, k, partial, True, a.updates)
        e = pc.responses_per_s / m.responses_per_s - 1
        eu = pu.responses_per_s / m.responses_per_s - 1
        errs.append(abs(e))
        gi.append(abs(pc.gen_idle_ratio - m.gen_idle_ratio))
        ti.append(abs(pc.train_idle_ratio - m.train_idle_ratio))
        sg, su = slowdown(cal_models, path)
        print(f"{name:22} {m.responses_per_s:11.1f} {pc.responses_per_s:7.1f} {100 * e:+6.1f}% {100 * eu:+8.1f}% | "
              f"{m.gen_idle_ratio:8.2f} {pc.gen_idle_ratio:6.2f} | {m.train_idle_ratio:10.2f} "
              f"{pc.train_idle_ratio:6.2f} | {m.staleness_mean:5.2f} {pc.staleness_mean:5.2f} | {sg:12.2f} {su:7.2f}")
    if errs:
        print(f"\nresponses/s |error|: median {100 * np.median(errs):.1f}%, max {100 * max(errs):.1f}% "
              "(target: every run within 10%)")
        print(f"idle ratio |error|: generator max {max(gi):.3f}, trainer max {max(ti):.3f} (target: within 0.05)")
        ok = max(errs) <= 0.10 and max(gi) <= 0.05 and max(ti) <= 0.05
        print("targets met" if ok else "targets NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
