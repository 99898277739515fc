"""What the calibration cost each recording: its budget, its seconds, its share of the recording, its setup, what it
measured, and how well the fits made from it predict a level they did not see (leave-one-level-out RMS and max, as
`rlsim run` prints them). No recording: it reads traces (default: the shipped ones). docs/results.md section 6 and
the README's rows quote it; share = calibration / (calibration + the run's end, its last update or eval).

    python -m bench.calibration_cost [TRACE ...]
"""
from __future__ import annotations

import argparse
import glob

import numpy as np

from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace


def calibration_cost(path: str) -> dict:
    t = read_trace(path)
    c = (t.meta.get("calibration") or {})
    ends = [float(np.max(np.asarray(r["t_start"], float) + np.asarray(r["duration"], float)))
            for r in (t.rows(k) for k in ("update", "eval")) if len(r["kind"])]
    run = max(ends, default=0.0)
    cal = float(c.get("duration_s") or 0.0)
    levels = c.get("train_levels") or []
    return {"trace": path, "budget_s": c.get("budget_s"), "calibration_s": cal, "run_s": run,
            "share": cal / (cal + run) if cal + run > 0 else float("nan"),
            "setup_s": sum((c.get("setup") or {}).values()) if isinstance(c.get("setup"), dict) else None,
            "rungs": len(c.get("gen_rungs") or []),
            "top_rung": max((g["level"] for g in c.get("gen_rungs") or []), default=None),
            "train_levels": [(lv.get("responses"), lv.get("n")) for lv in levels]}


def lolo(path: str) -> dict:
    """The calibrated fits' leave-one-level-out errors: engine form, RMS and max; training RMS and max, levels."""
    v = fit_trace(read_trace(path)).validation
    return {"gen_form": v.gen_form, "gen_cv": v.gen_cv, "gen_cv_max": v.gen_cv_max, "train_cv": v.train_cv,
            "train_cv_max": v.train_cv_max, "train_levels": len(v.train_levels)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="trace files (default: traces/*.parquet)")
    paths = ap.parse_args().traces or sorted(glob.glob("traces/*.parquet"))
    print(f"{'trace':40} {'budget s':>8} {'calib s':>8} {'run s':>7} {'share':>7} {'setup s':>7} {'rungs (top)':>12} "
          f"{'engine LOLO % (max)':>22} {'training LOLO % (max)':>22}  training levels (n)")
    for p in paths:
        r, v = calibration_cost(p), lolo(p)
        setup = "-" if r["setup_s"] is None else f"{r['setup_s']:.1f}"
        print(f"{p:40} {r['budget_s'] or 0:>8.1f} {r['calibration_s']:>8.1f} {r['run_s']:>7.1f} "
              f"{100 * r['share']:>6.1f}% {setup:>7} {r['rungs']:>5} ({r['top_rung']}) {v['gen_form']:>7} "
              f"{100 * v['gen_cv']:5.1f} ({100 * v['gen_cv_max']:4.1f}) {100 * v['train_cv']:14.1f} "
              f"({100 * v['train_cv_max']:4.1f})  {', '.join(f'{a} ({b})' for a, b in r['train_levels'])}")


if __name__ == "__main__":
    main()
