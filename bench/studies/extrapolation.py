"""Extrapolation accuracy: fit on one recorded run, predict another at a different batch size.

Records (serialised with `flock /tmp/rlsim-heavy.lock`, resumable: a run whose trace exists and reads as
complete is not recorded again) short runs at several P and G, each calibrated (`rlrun record` calibrates
by default), then for every ordered pair (A, B) of one algorithm whose batches are within 16x of each
other: fits A, replays B's recorded workload (its own response lengths, so the length distribution does
not confound the cost models) through A's cost models, and compares with what B measured, in steady state
(medians over B's updates after the first two): responses/s, generation and training seconds per update.
The same table is made a second time from A's run rows only (its calibration rows removed), the fit
without calibration.

Regime: short runs do not measure samples-to-target, so the T ratio here is the throughput part,
T_B / T_A = q_A / q_B (rho = 1); measured from the two runs' steady medians, predicted as q_A simulated
with its own fit over q_B predicted (as `rlsim run` compares simulated with simulated), with the
interval from the fit's bootstrap replicates ("undecided" when it spans 1). Agreement is counted over
the pairs whose measured T ratio is outside 0.95-1.05.

Targets (issue "trustworthy extrapolation"): median |error| of responses/s <= 5 %, max <= 10 %.

The machine's own floor (`--repeats 2`): every run is recorded again, same config and seed, after the whole
first pass. Fitting one recording and predicting the repeat of the same configuration is an extrapolation
of ratio 1: its error is what the machine's drift between recordings alone costs, the least any pair can
reach. Printed too: how much of the pairs' error one speed factor per recording explains (least squares on
log errors; the residual is the part a speed drift does not explain, an optimistic estimate of the models' own error).

    python -m bench.studies.extrapolation                      # record what is missing (~6-10 min on 2 quiet cores), analyse
    python -m bench.studies.extrapolation --steps 3 --only 2   # smoke test: two tiny runs
    python -m bench.studies.extrapolation --no-record          # analyse the traces already recorded
    python -m bench.studies.extrapolation --repeats 2          # and a second recording of every run: the drift floor
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import subprocess
import time
from pathlib import Path

import numpy as np

from bench.studies.recording import LOCK, ROOT, tool
from rlsim.pipeline import simulate
from rlsim.replay.models import interval
from rlsim.replay.errors import RlsimError
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.rho import regime
from rlsim.replay.schema import CALIB_KINDS
from rlsim.simconfig import config_for
from rlsim.whatif import replicate_rates

# (name, algo, task, P, G): G in {4, 6, 8, 16}, two PPO runs (so PPO has a pair), one addmix; cheapest first
RUNS = [
    ("grpo_p16_g8", "grpo", "add2", 16, 8),
    ("grpo_p32_g4", "grpo", "add2", 32, 4),
    ("grpo_p32_g6", "grpo", "add2", 32, 6),
    ("ppo_p64", "ppo", "add2", 64, 1),
    ("grpo_p16_g16", "grpo", "add2", 16, 16),
    ("grpo_addmix_p32_g8", "grpo", "addmix", 32, 8),
    ("ppo_p256", "ppo", "add2", 256, 1),
    ("grpo_p64_g8", "grpo", "add2", 64, 8),
    ("grpo_p128_g8", "grpo", "add2", 128, 8),
]
MAX_RATIO = 16.0
SKIP_UPDATES = 2


def trace_path(out_dir: Path, name: str, steps: int, rep: int = 0) -> Path:
    return out_dir / (f"{name}_s{steps}.parquet" if rep == 0 else f"{name}_s{steps}_r{rep}.parquet")


def record(out_dir: Path, runs, steps: int, log=print, rep: int = 0) -> list[Path]:
    paths = []
    for name, algo, task, P, G in runs:
        out = trace_path(out_dir, name, steps, rep)
        paths.append(out)
        if out.exists():
            try:
                t = read_trace(out)
                if t.meta.get("status") == "complete" and t.count("update") == steps and t.count("calib_gen"):
                    log(f"{out.name}: recorded already, kept")
                    continue
            except RlsimError:
                pass
        cmd = ["flock", LOCK, tool("rlrun"), "record", "--algo", algo, "--task", task, "--prompts", str(P),
               "--steps", str(steps), "--eval-every", "0", "--eval-prompts", "16", "--eval-k", "1", "--no-progress",
               "--overwrite", "--out", str(out)]
        if algo == "grpo":
            cmd += ["--group", str(G)]
        log(" ".join(cmd))
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{name} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        cal = next((ln for ln in p.stderr.splitlines() if ln.startswith("calibration:")), "")
        log(f"  {time.perf_counter() - t0:.0f} s wall; {cal}")
    return paths


def strip_calibration(trace):
    """The trace without its calibration rows (the fit from the run's own rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keep = pc.invert(pc.is_in(trace.table["kind"], value_set=pa.array(list(CALIB_KINDS))))
    return dataclasses.replace(trace, table=trace.table.filter(keep), _cache={})


def steady(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    return float(np.median(x[SKIP_UPDATES:] if len(x) > SKIP_UPDATES else x))


def predict(models_a, trace_b, models_b):
    """B's recorded workload through A's cost models: (per-update simulated arrays, replicate rates, run)."""
    hybrid = dataclasses.replace(models_b, gen=models_a.gen, gen_overhead=models_a.gen_overhead, update=models_a.update,
                                 prep=models_a.prep, reward=models_a.reward, other=models_a.other, sync=models_a.sync,
                                 sync_bytes=models_a.sync_bytes, replicates=models_a.replicates)
    cfg = config_for(models_b, updates=len(models_b.recorded.step), lengths="recorded")  # B as recorded, on its engine
    run = simulate(hybrid, cfg, rng=np.random.default_rng(0))
    return run, replicate_rates(hybrid, run)


def analyse(paths: list[Path], calibrated: bool) -> dict:
    traces = [read_trace(p) for p in paths]
    fits_b = {t.name: fit_trace(t) for t in traces}  # B's workload and engine (its cost models are not used)
    fits_a = {t.name: (fits_b[t.name] if calibrated else fit_trace(strip_calibration(t))) for t in traces}
    measured = {}
    for t in traces:
        rec = fits_b[t.name].recorded
        measured[t.name] = {"rps": steady(rec.num_responses / rec.step_time), "gen": steady(rec.gen_time),
                            "train": steady(rec.train_time)}
    own = {}  # q_A simulated with its own fit (the reference of a what-if)
    for t in traces:
        run, reps = predict(fits_a[t.name], t, fits_b[t.name])
        own[t.name] = (steady(run.responses / run.step_time), reps, run)
    rows = []
    for a in traces:
        for b in traces:
            if a is b or a.config.get("algo") != b.config.get("algo"):
                continue
            ba, bb = fits_b[a.name].prompts * fits_b[a.name].group, fits_b[b.name].prompts * fits_b[b.name].group
            if max(ba, bb) / min(ba, bb) > MAX_RATIO:
                continue
            run, reps = predict(fits_a[a.name], b, fits_b[b.name])
            q = steady(run.responses / run.step_time)
            m = measured[b.name]
            lo, hi = interval(run.responses_per_s, reps) if reps is not None else (math.nan, math.nan)
            scale = q / run.responses_per_s
            q_lo, q_hi = lo * scale, hi * scale
            t_meas = measured[a.name]["rps"] / m["rps"]
            t_pred = own[a.name][0] / q
            t_lo = t_hi = math.nan
            if reps is not None and own[a.name][1] is not None:
                n = min(len(reps), len(own[a.name][1]))
                t_lo, t_hi = interval(t_pred, own[a.name][1][:n] / reps[:n])
            pred_regime = regime(t_pred)
            if t_lo < 1 < t_hi and not (t_lo >= 0.95 and t_hi <= 1.05):
                pred_regime = "undecided"
            rows.append({"fit": a.name, "predict": b.name, "batch_ratio": bb / ba,
                         "rps_measured": m["rps"], "rps_predicted": q, "rps_err": q / m["rps"] - 1,
                         "rps_lo": q_lo, "rps_hi": q_hi, "in_interval": bool(q_lo <= m["rps"] <= q_hi),
                         "gen_err": steady(run.gen_time) / m["gen"] - 1, "train_err": steady(run.train_time) / m["train"] - 1,
                         "t_measured": t_meas, "t_predicted": t_pred, "regime_measured": regime(t_meas),
                         "regime_predicted": pred_regime, "form": fits_a[a.name].gen.form})
    return {"calibrated": calibrated, "rows": rows, "summary": summarize(rows)}


def floor(first: list[Path], second: list[Path]) -> dict:
    """Fit one recording, predict the repeat of the same configuration (both ways): the drift floor."""
    rows = []
    for pa, pb in zip(first, second):
        if not (pa.exists() and pb.exists()):
            continue
        ta, tb = read_trace(pa), read_trace(pb)
        fa, fb = fit_trace(ta), fit_trace(tb)
        for (x, fx), (y, fy) in (((ta, fa), (tb, fb)), ((tb, fb), (ta, fa))):
            run, _ = predict(fx, y, fy)
            rec = fy.recorded
            rows.append({"fit": x.name, "predict": y.name,
                         "rps_err": steady(run.responses / run.step_time) / steady(rec.num_responses / rec.step_time) - 1,
                         "gen_err": steady(run.gen_time) / steady(rec.gen_time) - 1,
                         "train_err": steady(run.train_time) / steady(rec.train_time) - 1})
    if not rows:
        return {}
    out = {"pairs": len(rows), "rows": rows}
    for k in ("rps", "gen", "train"):
        e = np.abs([r[f"{k}_err"] for r in rows])
        out[f"{k}_median_abs_err"], out[f"{k}_max_abs_err"] = float(np.median(e)), float(np.max(e))
    return out


def speed_factors(rows: list[dict], key: str = "rps_err") -> dict:
    """log(1 + err) = log s_fit - log s_predict + residual, least squares: one speed factor per recording."""
    names = sorted({r["fit"] for r in rows} | {r["predict"] for r in rows})
    if len(names) < 3:
        return {}
    idx = {n: i for i, n in enumerate(names)}
    A = np.zeros((len(rows), len(names)))
    for i, r in enumerate(rows):
        A[i, idx[r["fit"]]] += 1
        A[i, idx[r["predict"]]] -= 1
    y = np.log1p([r[key] for r in rows])
    s, *_ = np.linalg.lstsq(A[:, 1:], y, rcond=None)  # the first recording fixes the scale (factors are relative)
    res = np.expm1(y - A[:, 1:] @ s)
    f = np.exp(np.r_[0.0, s] - np.mean(np.r_[0.0, s]))
    return {"factors": dict(zip(names, map(float, f))), "residual_median_abs": float(np.median(np.abs(res))),
            "residual_max_abs": float(np.max(np.abs(res)))}


def summarize(rows: list[dict]) -> dict:
    if not rows:
        return {}
    e = np.abs([r["rps_err"] for r in rows])
    decisive = [r for r in rows if not 0.95 <= r["t_measured"] <= 1.05]
    return {"pairs": len(rows), "rps_median_abs_err": float(np.median(e)), "rps_max_abs_err": float(np.max(e)),
            "gen_median_abs_err": float(np.median(np.abs([r["gen_err"] for r in rows]))),
            "train_median_abs_err": float(np.median(np.abs([r["train_err"] for r in rows]))),
            "interval_coverage": float(np.mean([r["in_interval"] for r in rows])),
            "decisive_pairs": len(decisive),
            "regime_agree": sum(r["regime_predicted"] == r["regime_measured"] for r in decisive),
            "regime_undecided": sum(r["regime_predicted"] == "undecided" for r in decisive),
            "targets_met": bool(np.median(e) <= 0.05 and np.max(e) <= 0.10), "speed_factors": speed_factors(rows)}


def print_table(res: dict) -> None:
    title = "fitted WITH calibration" if res["calibrated"] else "fitted on the run's own rows only (calibration removed)"
    print(f"\n== {title}")
    print(f"{'fit on':>20} {'predict':>20} {'B ratio':>7} {'form':>6} {'meas r/s':>9} {'pred r/s':>9} {'err':>7} "
          f"{'90% interval':>17} {'gen err':>8} {'train err':>9} {'T meas':>7} {'T pred':>7} regime (meas / pred)")
    for r in res["rows"]:
        print(f"{r['fit']:>20} {r['predict']:>20} {r['batch_ratio']:7.3g} {r['form']:>6} {r['rps_measured']:9.1f} "
              f"{r['rps_predicted']:9.1f} {100 * r['rps_err']:+6.1f}% {r['rps_lo']:8.1f}..{r['rps_hi']:<8.1f} "
              f"{100 * r['gen_err']:+7.1f}% {100 * r['train_err']:+8.1f}% {r['t_measured']:7.3f} {r['t_predicted']:7.3f} "
              f"{r['regime_measured']} / {r['regime_predicted']}")
    s = res["summary"]
    if s:
        print(f"summary: {s['pairs']} pairs; responses/s |error| median {100 * s['rps_median_abs_err']:.1f}%, max "
              f"{100 * s['rps_max_abs_err']:.1f}% (targets 5% / 10%: {'met' if s['targets_met'] else 'NOT met'}); "
              f"generation median {100 * s['gen_median_abs_err']:.1f}%, training median {100 * s['train_median_abs_err']:.1f}%; "
              f"measured inside the interval {100 * s['interval_coverage']:.0f}%; regime (measured T outside 0.95-1.05, "
              f"{s['decisive_pairs']} pairs): {s['regime_agree']} agree, {s['regime_undecided']} undecided")
        sf = s.get("speed_factors")
        if sf:
            fs = sf["factors"].values()
            print(f"one speed factor per recording ({min(fs):.2f}..{max(fs):.2f}) explains all but: responses/s |residual| "
                  f"median {100 * sf['residual_median_abs']:.1f}%, max {100 * sf['residual_max_abs']:.1f}%")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="RL steps per recorded run (default 12)")
    ap.add_argument("--only", type=int, default=0, help="use only the first N runs of the list (smoke tests)")
    ap.add_argument("--out-dir", type=Path, default=Path("/tmp/rlsim-extrapolation"), help="where the traces go")
    ap.add_argument("--no-record", action="store_true", help="analyse the traces already in --out-dir")
    ap.add_argument("--json", type=Path, default=None, help="also write both tables as JSON here")
    ap.add_argument("--repeats", type=int, default=1, help="record every run this many times (2: the drift floor)")
    args = ap.parse_args(argv)
    runs = RUNS[: args.only] if args.only else RUNS
    args.out_dir.mkdir(parents=True, exist_ok=True)
    reps = []
    for rep in range(args.repeats):  # a whole pass before the next: the repeats are minutes apart
        if args.no_record:
            reps.append([trace_path(args.out_dir, r[0], args.steps, rep) for r in runs])
        else:
            reps.append(record(args.out_dir, runs, args.steps, rep=rep))
    paths = [p for p in reps[0] if p.exists()]
    if len(paths) < 2:
        raise SystemExit("need at least two traces")
    out = [analyse(paths, calibrated=True), analyse(paths, calibrated=False)]
    for res in out:
        print_table(res)
    if args.repeats > 1:
        fl = floor(reps[0], reps[1])
        out.append({"floor": fl})
        if fl:
            print(f"\n== drift floor: fit one recording, predict the repeat of the same configuration ({fl['pairs']} pairs)\n"
                  f"responses/s |error| median {100 * fl['rps_median_abs_err']:.1f}%, max {100 * fl['rps_max_abs_err']:.1f}%; "
                  f"generation median {100 * fl['gen_median_abs_err']:.1f}%, max {100 * fl['gen_max_abs_err']:.1f}%; "
                  f"training median {100 * fl['train_median_abs_err']:.1f}%, max {100 * fl['train_max_abs_err']:.1f}%")
    if args.json:
        from rlsim.replay.util import dumps

        args.json.write_text(dumps(out, indent=2))


if __name__ == "__main__":
    main()
