"""The proof: a real batch-size study on this machine, and how well rlsim predicted it.

Records GRPO runs of the built-in task with `rlrun record` at P in {8, 16, 32, 64, 128, 256}, G = 8, the
square-root lr rule from the reference P = 32 (lr 3e-4 at B = 256), plus P = 64 at the reference's fixed
lr (the article's Finding 4), SEEDS seeds each; every run gets the same sample budget (at least MIN_UPDATES
updates) and an eval every ~EVAL_SAMPLES samples. Serialised (`flock /tmp/rlsim-heavy.lock`) and
resumable (a complete trace is not recorded again). The reference runs (P = 32) are calibrated.

Then, measured from the runs: samples-to-target N*(P) (where the isotonic-smoothed eval curve first reaches
the target, linearly interpolated between evals; the target is 90 % of the worst reference seed's best
score; a run that never reaches it is censored: its N* is at least its budget, shown as ">=" and used as
that lower bound in means and rankings), its spread over seeds,
rho(P) = N*(P) / N*(32), sigma(P) (steady-state responses/s over the reference's), T(P) = rho / sigma,
the critical generation batch (where sigma stops growing: the smallest P whose sigma is within 10 % of the
largest) and the critical training batch (the largest P whose rho stays within 1.2 of 1).

Predicted, from what a user would have before the study:
  1. the reference trace alone: `rlsim run --trace ref.parquet --batch P` (noise-scale rho, fitted throughput);
  2. curves, leaving P out: `rlsim run --trace ref ... --trace <the other sizes' runs> --batch P --rho curves`.
Compared: sigma, rho and the T ratio with errors, and the Kendall tau between predicted and measured
rankings of time-to-target, with a bootstrap interval over seeds.

Then the improved model (`--rho lr-aware`, replay/rho.py): its two constants (B_bend, kappa) fitted on seed 0
alone (the reference P = 32 and the other sizes of seed 0), then checked on the other seeds, each
predicted from its own reference trace with those constants, against the noise-scale model on the same seeds.
Also printed: the lr-aware form at kappa = 0 with the bend at each reference's own noise scale (reference alone, no
fitted constant), and the study's own resolution (`ranking_resolution`): how well one seed's ranking agrees with
another's, and what a perfect predictor would score against the 3-seed means.

    python -m bench.studies.batch_study                  # record what is missing (~80 min on 2 quiet cores), analyse
    python -m bench.studies.batch_study --no-record --target 0.566 --fresh-from 3   # analyse as docs/results.md does
    python -m bench.studies.batch_study --seeds 1 --sizes 8,32 --budget 2048   # smoke test

(from the repository root). rlsim's predictions are made in process (`rlsim.whatif.study.prepare` and `evaluate`, what
`rlsim run --json` prints); the scoring is `rlsim.replay.evaluation`.

`--lr` moves the reference lr (the sqrt rule scales it to every size); `--predict FILE` writes the reference-alone
predictions from the recorded references only, to commit before the other sizes are recorded, and `--predictions
FILE` later scores every model in it against the measured means.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
from pathlib import Path

import numpy as np

from bench.studies.recording import ROOT, complete, run_locked, tool
from rlsim.core.config import WhatIf
from rlsim.whatif.outcome import Outcome
from rlsim.replay.errors import RlsimError
from rlsim.replay.evaluation import (SeedRuns, b_crit_allowed, censored_log_error, critical_batches, error_summary,
                                     kendall_tau, measured_ratios, noise_split, resample_T, samples_to_target,
                                     score_ranking, tau_interval, within_spread)
from rlsim.replay.io import Trace, read_trace
from rlsim.replay.learning import fit_learning_curve, noise_scale
from rlsim.replay.rho import curves_rho, fit_lr_aware, lr_aware_rho, noise_scale_rho
from rlsim.replay.split_stats import split_stats
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import Study, prepare

SIZES = (8, 16, 32, 64, 128, 256)
REF_P, G, LR = 32, 8, 3e-4
SEEDS = 6
BUDGET = 16384          # responses per run (every size gets the same number of samples) ...
MIN_UPDATES = 12        # ... but at least this many updates
EVAL_SAMPLES = 512      # an eval about every this many responses
EVAL_PROMPTS, EVAL_K = 128, 2


TASK = "add2"


def runs(sizes, seeds, task: str = TASK, fixed: bool = True, first: int = 0) -> list[tuple[str, int, str, int]]:
    """(name, P, lr rule, seed), seed-major so that a partial study has every size; `fixed`: also P = 64 at fixed lr;
    seeds `first`..`first + seeds - 1`."""
    pre = "grpo" if task == TASK else f"grpo_{task}"
    out = []
    for s in range(first, first + seeds):
        for P in sizes:
            out.append((f"{pre}_p{P}_s{s}", P, "sqrt", s))
        if fixed and 64 in sizes:
            out.append((f"{pre}_p64_fixed_s{s}", 64, "fixed", s))
    return out


def steps_for(P: int, budget: int) -> int:
    return max(MIN_UPDATES, math.ceil(budget / (P * G)))


def rlrun_cmd(P: int, steps: int, lr: float, rule: str, seed: int, path: Path, *extra: str) -> list[str]:
    """The `rlrun record` command line of one study run: G = 8, an eval every ~EVAL_SAMPLES responses."""
    return [tool("rlrun"), "record", "--prompts", str(P), "--group", str(G), "--steps", str(steps), "--lr", f"{lr:g}",
            "--lr-rule", rule, "--eval-every", str(max(1, EVAL_SAMPLES // (P * G))),
            "--eval-prompts", str(EVAL_PROMPTS), "--eval-k", str(EVAL_K), "--seed", str(seed), "--no-progress",
            "--overwrite", "--out", str(path), *extra]


def record(out: Path, sizes, seeds: int, budget: int, task: str = TASK, log=print, lr: float = LR,
           fixed: bool = True, first: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, P, rule, seed in runs(sizes, seeds, task, fixed, first):
        steps = steps_for(P, budget)
        path = out / f"{name}.parquet"
        if complete(path, steps):
            continue
        extra = ["--lr-ref-batch", str(REF_P * G)] + (["--task", task] if task != TASK else [])
        if not (P == REF_P and rule == "sqrt"):
            extra.append("--no-calibrate")  # only the reference runs carry a calibration (what a user would record)
        run_locked(rlrun_cmd(P, steps, lr, rule, seed, path, *extra), log)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "traces" / "study"), help="folder of the study's traces")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="prompts per update to record")
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--first-seed", type=int, default=0, help="record seeds from this one on (a second run of the "
                                                              "references: --sizes 32 --first-seed 3 --record-only)")
    ap.add_argument("--budget", type=int, default=BUDGET, help="responses per run")
    ap.add_argument("--task", default=TASK, help="built-in task")
    ap.add_argument("--lr", type=float, default=LR, help="lr of the reference P = %d (the sqrt rule scales it)" % REF_P)
    ap.add_argument("--no-fixed", action="store_true", help="skip the P = 64 fixed-lr runs")
    ap.add_argument("--predict", help="write the reference-alone predictions for every size here, from the recorded "
                                      "references only (before the other sizes are recorded: --sizes 32 first), and "
                                      "stop")
    ap.add_argument("--lr-aware", help="B_BEND,KAPPA: also predict with the lr-aware model at these constants (e.g. "
                                       "another task's fit, to see whether it transfers)")
    ap.add_argument("--target", type=float, help="validation score to reach (default: 90 %% of the worst "
                                                  "reference seed's best; fix it when adding seeds, so that the "
                                                  "target stays put)")
    ap.add_argument("--fresh-from", type=int, help="also check the models on the seeds from this one on alone (seeds "
                                                   "recorded after the models were chosen)")
    ap.add_argument("--predictions", help="a JSON of predictions written before the runs "
                                          "(docs/study/addmix_preregistered.json): score its noise-scale T ranking and "
                                          "rho against the measured seed means")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--record-only", action="store_true")
    ap.add_argument("--json", help="write the tables as JSON here")
    ap.add_argument("--chart", help="folder for a PNG + HTML chart of measured vs predicted time-to-target")
    a = ap.parse_args(argv)
    try:
        sizes = tuple(int(x) for x in a.sizes.split(","))
        lr_aware = tuple(float(x) for x in a.lr_aware.split(",")) if a.lr_aware else None
        if lr_aware is not None and len(lr_aware) != 2:
            raise ValueError
    except ValueError:
        raise SystemExit("--sizes takes integers (8,16,32) and --lr-aware two numbers B_BEND,KAPPA "
                         "(2896,0.64)") from None
    if a.first_seed < 0:
        raise SystemExit(f"error: --first-seed must be 0 or more, got {a.first_seed}")
    if not a.lr > 0:
        raise SystemExit(f"--lr must be positive, got {a.lr:g}")
    if a.predict:  # written once, before the runs it predicts: never over a file that already holds predictions
        dest = Path(a.predict)
        if dest.exists() or not dest.parent.is_dir():
            raise SystemExit(f"error: --predict {dest}: "
                             + ("exists; predictions are written once, before the runs they predict: choose a new file"
                                if dest.exists() else "its folder does not exist"))
    out = Path(a.out)
    if not a.no_record:
        record(out, sizes, a.seeds, a.budget, a.task, lr=a.lr, fixed=not a.no_fixed, first=a.first_seed)
    if a.record_only:
        return 0
    try:
        if a.predict:
            dest.write_text(json.dumps(predict(out, a.seeds, a.task, sizes, target=a.target, argv=argv,
                                               lr_aware=lr_aware), indent=1))
            return 0
        res = analyse(out, sizes, a.seeds, a.budget, target=a.target, task=a.task, lr_aware=lr_aware,
                      fresh_from=a.fresh_from)
    except RlsimError as e:  # e.g. a --target the reference never reaches: one line, no traceback
        raise SystemExit(f"error: {e}") from None
    if a.predictions:
        res["predictions_scored"] = score_predictions(res["rows"], Path(a.predictions))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=float))
    if a.chart:
        chart(res, Path(a.chart))
    return 0



# ------------------------------------------------------------------------------------------------ analysis
@functools.lru_cache(maxsize=None)
def _trace(path: Path) -> Trace:
    return read_trace(path)


@functools.lru_cache(maxsize=64)
def _study(paths: tuple[Path, ...], rho: str, target: float) -> Study:
    return prepare([_trace(p) for p in paths], rho_model=rho, target=target)


def predicted(paths, P: int, rule: str, target: float, rho: str) -> Outcome:
    """rlsim's prediction at (P, G, rule) from `paths` (the first the reference), in process: what `rlsim run --trace
    ... --batch P --group G --lr-rule rule --target T --rho rho --json` prints as its candidate."""
    return evaluate(_study(tuple(paths), rho, target), WhatIf(prompts=P, group=G, lr_rule=rule))


def lr_aware_spec(b_bend: float, kappa: float) -> str:
    """The --rho value of the lr-aware model at these constants, to 6 significant digits as the CLI's options give
    them."""
    return f"lr-aware:{b_bend:g},{kappa:g}"


def ref_alone(paths, b_noise, P: int, rule: str, target: float, lr_aware: tuple[float, float] | None = None) -> dict:
    """rlsim's prediction at (P, rule) from each reference trace alone, per model: `noise_scale`, `kappa0` (lr-aware at
    kappa = 0, the bend at that reference's B_noise in `b_noise`) and, given constants fitted elsewhere, `lr_aware`;
    each the mean over the references of sigma, rho and T, plus T per reference (`T_seeds`)."""
    specs = {"noise_scale": lambda b: "noise-scale", "kappa0": lambda b: lr_aware_spec(b, 0.0)}
    if lr_aware:
        specs["lr_aware"] = lambda b: lr_aware_spec(*lr_aware)
    out = {}
    for m, spec in specs.items():
        ps = [predicted([p], P, rule, target, spec(b)) for p, b in zip(paths, b_noise)]
        out[m] = dict(sigma=float(np.mean([x.sigma for x in ps])), rho=float(np.mean([x.rho for x in ps])),
                      T=float(np.mean([x.time_to_target_ratio for x in ps])),
                      T_seeds=[float(x.time_to_target_ratio) for x in ps])
    return out


def predict(out: Path, seeds: int, task: str = TASK, sizes=SIZES, target: float | None = None, argv=None,
            lr_aware: tuple[float, float] | None = None) -> dict:
    """Reference-alone predictions for every size (mean over the recorded references of `rlsim run --rho noise-scale`,
    of the kappa = 0 form and, given constants fitted elsewhere, of lr-aware), for committing before the other sizes are
    recorded; `score_predictions` reads them."""
    refs = measure(out, (REF_P,), seeds, task).get((REF_P, "sqrt"), [])
    if not refs:
        raise SystemExit(f"error: no complete reference run (P = {REF_P}) in {out}; record it first (--sizes {REF_P})")
    if target is None:  # the analysis' default, fixed now from the references alone
        target = round(0.9 * min(r["best"] for r in refs), 3)
    paths = [r["path"] for r in sorted(refs, key=lambda r: r["seed"])]
    b_noise = [noise_scale(_trace(p)).b_crit for p in paths]
    pred = {}
    for P, rule in [(P, "sqrt") for P in sizes] + ([(64, "fixed")] if 64 in sizes else []):
        models = ref_alone(paths, b_noise, P, rule, target, lr_aware)
        pred[f"{P}_{rule}"] = dict(P=P, rule=rule, **{m: {k: v for k, v in x.items() if k != "T_seeds"}
                                                      for m, x in models.items()})
    return dict(written=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                command="python -m bench.studies.batch_study " + " ".join(argv if argv is not None else sys.argv[1:]),
                references=[str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths],
                target=target, b_noise=b_noise, predictions=pred)


def measure(out: Path, sizes, seeds: int, task: str = TASK) -> dict:
    """Per run: samples-to-target curve, steady responses/s, wall time; grouped by (P, rule)."""
    res: dict = {}
    for name, P, rule, seed in runs(sizes, seeds, task):
        path = out / f"{name}.parquet"
        if not path.exists():
            continue
        t = _trace(path)
        if t.meta.get("status") != "complete":
            continue
        c = fit_learning_curve(t)
        res.setdefault((P, rule), []).append(dict(name=name, seed=seed, path=path, curve=c,
                                                  rps=split_stats(t).responses_per_s,
                                                  first=float(c.score[0]), best=c.best))
    return res


def seed_runs(rs: list[dict]) -> SeedRuns:
    """The runs of one configuration (dicts of `measure` with n_star and censored filled in), in their order."""
    return SeedRuns(n_star=np.array([r["n_star"] for r in rs], float),
                    censored=np.array([r["censored"] for r in rs], bool), rps=np.array([r["rps"] for r in rs], float))


def analyse(out: Path, sizes, seeds: int, budget: int, target: float | None = None, log=print, task: str = TASK,
            lr_aware: tuple[float, float] | None = None, fresh_from: int | None = None) -> dict:
    runs_ = measure(out, sizes, seeds, task)
    refs = runs_.get((REF_P, "sqrt"), [])
    if not refs:
        raise SystemExit(f"no complete reference run (P = {REF_P}) in {out}")
    if target is None:  # a score every reference seed reaches, well above the start: 90 % of the worst seed's best
        target = round(0.9 * min(r["best"] for r in refs), 3)
    for rs in runs_.values():
        for r in rs:
            # a run that never reached the target is censored: its N* is at least the responses it trained on
            r["n_star"], r["censored"] = samples_to_target(r["curve"], target)
    missed = [r["seed"] for r in refs if r["censored"]]
    if missed:  # rho is N* over the reference's: a censored reference makes every ratio meaningless
        raise SystemExit(f"error: reference seed(s) {', '.join(map(str, sorted(missed)))} never reach the target "
                         f"{target:g}; lower --target (the default is 90 % of the worst reference's best score)")
    ref_runs = seed_runs(refs)
    n_ref, rps_ref = float(np.mean(ref_runs.n_star)), float(np.mean(ref_runs.rps))
    log(f"\ntarget score {target} (mean@{EVAL_K}, {EVAL_PROMPTS} held-out prompts); reference P={REF_P}: "
        f"N* = {n_ref:.0f} responses, {rps_ref:.1f} responses/s (mean of {len(refs)} seeds)\n")
    rows = []
    for (P, rule), rs in sorted(runs_.items()):  # censored runs at their budget: lower bounds
        rows.append(dict(P=P, rule=rule, **measured_ratios(seed_runs(rs), n_ref, rps_ref)))
    # predictions
    ref_paths = [r["path"] for r in sorted(refs, key=lambda r: r["seed"])]
    noise = [noise_scale(_trace(p)) for p in ref_paths]
    b_noise = [ns.b_crit for ns in noise]
    for row in rows:
        P, rule = row["P"], row["rule"]
        # from the references alone: noise scale; kappa 0 (the lr-aware form with the bend at each reference's own
        # two-batch noise scale: Adam under the sqrt rule keeps samples-to-target flat while B << B_noise); and the
        # lr-aware model at given constants (--lr-aware M,K: e.g. the add2 study's fit, to see how it transfers)
        pr = ref_alone(ref_paths, b_noise, P, rule, target, lr_aware)
        ns, k0 = pr["noise_scale"], pr["kappa0"]
        row.update(pred_sigma=ns["sigma"], pred_rho=ns["rho"], pred_T=ns["T"], pred_T_seeds=ns["T_seeds"],
                   sde_rho=k0["rho"], sde_T=k0["T"], lrd_rho=pr["lr_aware"]["rho"] if lr_aware else math.nan,
                   lrd_T=pr["lr_aware"]["T"] if lr_aware else math.nan)
        others = [r["path"] for (P2, rule2), rs in runs_.items() if (P2 != P and rule2 == "sqrt") for r in rs
                  if r["path"] not in ref_paths]
        if P == REF_P and rule == "sqrt":
            row["curves_rho"] = row["curves_T"] = 1.0
        else:
            try:
                p2 = predicted([ref_paths[0], *others], P, rule, target, "curves")
                row["curves_rho"], row["curves_T"] = float(p2.rho), float(p2.time_to_target_ratio)
            except RlsimError as e:  # as `rlsim run` says it
                row["curves_rho"] = row["curves_T"] = math.nan
                row["curves_error"] = f"error: {e}".splitlines()[-1][:200]
    _print(rows, log)
    # ranking of time-to-target over the sqrt-rule sizes, with a bootstrap over seeds
    sq = [r for r in rows if r["rule"] == "sqrt"]
    meas_T = [r["T"] for r in sq]
    tau = kendall_tau([r["pred_T"] for r in sq], meas_T)
    tau_c = kendall_tau([r["curves_T"] for r in sq], meas_T)
    tau_d = kendall_tau([r["lrd_T"] for r in sq], meas_T) if lr_aware else math.nan
    draws = resample_T(ref_runs, [seed_runs(runs_[(r["P"], "sqrt")]) for r in sq], np.random.default_rng(0))
    lo, hi = tau_interval([r["pred_T"] for r in sq], draws)
    sig_sorted = sorted(sq, key=lambda r: r["P"])
    crit_gen, crit_train = critical_batches(sig_sorted)
    within = [r for r in sq if r["P"] != REF_P and REF_P / 4 <= r["P"] <= REF_P * 4]
    ok_rho = [within_spread(r["pred_rho"], r["rho_min"], r["rho_max"]) for r in within]
    log("\nKendall tau, predicted (reference alone) vs measured T ranking over P = "
        f"{', '.join(str(r['P']) for r in sq)}: {tau:.2f} (90 % bootstrap over seeds {lo:.2f}..{hi:.2f}; target >= "
        f"0.8); from curves (P left out): {tau_c:.2f}"
        + (f"; lr-aware at --lr-aware {lr_aware[0]:g},{lr_aware[1]:g}: {tau_d:.2f}" if lr_aware else ""))
    log(f"rho predicted (noise scale) within the measured seed spread for P within 4x of {REF_P}: "
        f"{sum(ok_rho)} of {len(ok_rho)} "
        f"({', '.join(str(r['P']) for r, ok in zip(within, ok_rho) if not ok) or 'none'} outside)")
    tau_s = kendall_tau([r["sde_T"] for r in sq], [r["T"] for r in sq])
    ok_sde = [within_spread(r["sde_rho"], r["rho_min"], r["rho_max"]) for r in within]
    log(f"reference alone, lr-aware at kappa = 0 and B_bend = each reference's B_noise: Kendall tau {tau_s:.2f}; rho "
        f"within the seed spread {sum(ok_sde)} of {len(ok_sde)}; "
        "rho " + ", ".join(f"P {r['P']}: {r['sde_rho']:.2f}" for r in sq))
    log(f"critical generation batch (sigma within 10 % of its largest): P = {crit_gen}; critical training batch "
        f"(samples-to-target within 1.2x of P = {sig_sorted[0]['P']}): P = {crit_train}")
    # which B_crit could the noise-scale form (1 + B/B_crit) / (1 + B_ref/B_crit) fit, given the measured rho?
    lo_b, hi_b = b_crit_allowed([dict(r, B=r["P"] * G) for r in sq], REF_P * G)
    b_ema, b_rom = b_noise, [ns.ratio_of_means for ns in noise]  # each reference's, sorted by seed like ref_paths
    log(f"B_crit of the reference seeds (responses): {', '.join(f'{b:.0f}' for b in b_ema)} (rlsim: last value of the "
        f"EMA ratio); {', '.join(f'{b:.0f}' for b in b_rom)} (ratio of the run's means)")
    log(f"B_crit the measured rho allows: >= {lo_b:.0f} (sizes that every seed finished, within their spread) and "
        f"<= {hi_b:.0f} (censored sizes): {'none fits both' if lo_b > hi_b else 'consistent'}")
    held = held_out_all(runs_, rows, target, log, fresh_from)
    reso = resolution(runs_, log)
    return dict(resolution=reso, target=target, n_star_ref=n_ref, rps_ref=rps_ref,
                rows=[{k: v for k, v in r.items() if k != "pred_T_seeds"} for r in rows],
                kendall_tau=tau, kendall_tau_interval=[float(lo), float(hi)], kendall_tau_curves=tau_c,
                kendall_tau_lr_aware_given=tau_d, kendall_tau_sde=tau_s, sde_rho_within_spread=[int(x) for x in ok_sde],
                rho_within_spread=[int(x) for x in ok_rho], critical_gen_batch=crit_gen,
                critical_train_batch=crit_train,
                b_crit_ref_ema=b_ema, b_crit_ref_ratio_of_means=b_rom, b_crit_allowed=[lo_b, hi_b], held_out=held)


FIT_SEED = 0


def held_out(runs_: dict, rows: list[dict], target: float, log=print, seeds: list[int] | None = None) -> dict:
    """The lr-aware model fitted on seed FIT_SEED, checked on other seeds (default: all of them), each predicted from
    its own reference, against noise-scale and the kappa = 0 form (both from that reference alone) on the same seeds."""
    fit_runs = [r for rs in runs_.values() for r in rs if r["seed"] == FIT_SEED]
    ref0 = next((r for r in runs_.get((REF_P, "sqrt"), []) if r["seed"] == FIT_SEED), None)
    have = {r["seed"] for r in runs_.get((REF_P, "sqrt"), [])} - {FIT_SEED}
    seeds = sorted(have if seeds is None else have & set(seeds))
    if ref0 is None or not seeds:
        log("\nheld-out check skipped: it needs seed 0 and at least one other seed with a reference run")
        return {}
    fit = fit_lr_aware(ref0["curve"], [r["curve"] for r in fit_runs], target)
    log(f"\nlr-aware rho fitted on seed {FIT_SEED} ({fit.runs} runs besides its reference): B_bend = {fit.b_bend:.4g}, "
        f"kappa = {fit.kappa:.3g} (squared log error {fit.loss:.3g}); checked on seeds {', '.join(map(str, seeds))}, "
        f"each predicted from its own P = {REF_P} trace")
    refs = {r["seed"]: r for r in runs_[(REF_P, "sqrt")] if r["seed"] in seeds}
    n_ref = float(np.mean([refs[s]["n_star"] for s in seeds]))
    rps_ref = float(np.mean([refs[s]["rps"] for s in seeds]))
    b_noise = {s: noise_scale(_trace(refs[s]["path"])).b_crit for s in seeds}  # each reference's own
    models = {"noise-scale": lambda s: "noise-scale", "lr-aware": lambda s: lr_aware_spec(fit.b_bend, fit.kappa),
              "kappa0": lambda s: lr_aware_spec(b_noise[s], 0.0)}
    out = []
    for row in rows:
        P, rule = row["P"], row["rule"]
        rs = [r for r in runs_[(P, rule)] if r["seed"] in seeds]
        if not rs:
            continue
        all_rs = runs_[(P, rule)]  # the spread is over every seed recorded
        r = dict(P=P, rule=rule, censored=any(x["censored"] for x in rs),
                 rho=float(np.mean([x["n_star"] for x in rs])) / n_ref,
                 sigma=float(np.mean([x["rps"] for x in rs])) / rps_ref, rho_min=row["rho_min"], rho_max=row["rho_max"],
                 seeds_all=len(all_rs))
        r["T"] = r["rho"] / r["sigma"]
        for name, spec in models.items():
            pr = [predicted([refs[s]["path"]], P, rule, target, spec(s)) for s in seeds]
            r[f"{name}_rho"] = float(np.mean([p.rho for p in pr]))
            r[f"{name}_T"] = float(np.mean([p.time_to_target_ratio for p in pr]))
        out.append(r)
    log(f"{'P':>4} {'lr':>5} | {'rho meas':>8} {'(all-seed spread)':>17} {'noise-scale':>11} {'lr-aware':>8} "
        f"{'kappa0':>6} | {'T meas':>6} {'noise-scale':>11} {'lr-aware':>8} {'kappa0':>6}")
    for r in out:
        ge = ">=" if r["censored"] else "  "
        log(f"{r['P']:4d} {r['rule']:>5} | {ge}{r['rho']:6.2f} ({r['rho_min']:5.2f}..{r['rho_max']:5.2f})   "
            + " ".join(f"{r[m + '_rho']:{w}.2f}" for m, w in (("noise-scale", 11), ("lr-aware", 8), ("kappa0", 6)))
            + f" | {ge}{r['T']:4.2f} " + " ".join(f"{r[m + '_T']:{w}.2f}"
                                                  for m, w in (("noise-scale", 11), ("lr-aware", 8), ("kappa0", 6))))
    sq = [r for r in out if r["rule"] == "sqrt"]
    res = dict(fit_seed=FIT_SEED, seeds=seeds, b_bend=fit.b_bend, kappa=fit.kappa, fit_loss=fit.loss, rows=out)
    rng = np.random.default_rng(0)
    held_ref = seed_runs([refs[s] for s in seeds])
    held_sizes = [seed_runs([x for x in runs_[(r0["P"], "sqrt")] if x["seed"] in seeds]) for r0 in sq]
    for name in models:
        pred = [r[f"{name}_T"] for r in sq]
        tau = kendall_tau(pred, [r["T"] for r in sq])
        # resample the held-out seeds of every size (and of the reference); the draws go on from the last model's
        lo, hi = tau_interval(pred, resample_T(held_ref, held_sizes, rng))
        within = [r for r in sq if r["P"] != REF_P and REF_P / 4 <= r["P"] <= REF_P * 4]
        ok = [within_spread(r[f"{name}_rho"], r["rho_min"], r["rho_max"], r["censored"]) for r in within]
        err = [abs(math.log(r[f"{name}_rho"] / r["rho"])) for r in out if not r["censored"] and r["P"] != REF_P]
        res[name] = dict(kendall_tau=tau, kendall_tau_interval=[float(lo), float(hi)],
                         rho_within_spread=[int(x) for x in ok],
                         median_abs_log_rho_error=float(np.median(err)) if err else math.nan)
        log(f"{name:>11} on seeds {','.join(map(str, seeds))}: Kendall tau {tau:.2f} (90 % bootstrap "
            f"{lo:.2f}..{hi:.2f}; target >= 0.8); rho within the spread of all seeds for P within 4x of {REF_P}: "
            f"{sum(ok)} of {len(ok)} (a censored size counts when the prediction is at or above its lowest bound); "
            "median |log(pred/meas)| of rho over the sizes every one of these seeds finished: "
            f"{res[name]['median_abs_log_rho_error']:.3f}")
    return res


def held_out_all(runs_: dict, rows: list[dict], target: float, log=print, fresh_from: int | None = None) -> dict:
    """`held_out` on every seed but the fit seed, then (with fresh_from) on the seeds recorded from that one on only:
    seeds recorded after the models were chosen, so a check that nothing in them was tuned to."""
    res = held_out(runs_, rows, target, log)
    if res and fresh_from is not None:
        log(f"\nseeds >= {fresh_from} only (recorded after every model above was chosen):")
        seeds = sorted({r["seed"] for rs in runs_.values() for r in rs if r["seed"] >= fresh_from})
        res["fresh"] = held_out(runs_, rows, target, log, seeds=seeds)
    if res:
        res["seed_cv"] = seed_cv(runs_, target, log)
        res["leave_one_size_out"] = leave_one_size_out(runs_, target, log)
    return res


def score_predictions(rows: list[dict], path: Path, log=print) -> dict:
    """Score predictions written before the runs (keys "P_rule", each with noise_scale rho and T, optionally kappa0
    and lr_aware) against the measured rows: per model, Kendall tau of the T ranking over the sqrt-rule sizes and rho
    inside the seed spread for P within 4x (a censored size: at or above its lower bound)."""
    sq = [r for r in rows if r["rule"] == "sqrt"]
    try:
        pred = json.loads(path.read_text())["predictions"]
        models = {m: ([float(pred[f"{r['P']}_sqrt"][m]["T"]) for r in sq],
                      {r["P"]: float(pred[f"{r['P']}_sqrt"][m]["rho"]) for r in sq})
                  for m in ("noise_scale", "kappa0", "lr_aware") if m == "noise_scale" or m in pred[f"{REF_P}_sqrt"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: cannot read predictions from {path} ({type(e).__name__}: {e}); it needs "
                         '{"predictions": {"<P>_sqrt": {"noise_scale": {"rho": .., "T": ..}}}} for every measured '
                         "size") from None
    within = [r for r in sq if r["P"] != REF_P and REF_P / 4 <= r["P"] <= REF_P * 4]
    spread = [(r["rho_min"], r["rho_max"], r["censored"]) for r in within]
    out = {}
    for m, (p_t, p_rho) in models.items():
        out[m] = score_ranking(p_t, [r["T"] for r in sq], [p_rho[r["P"]] for r in within], spread)
        ok = out[m]["rho_within_spread"]
        log(f"predictions written beforehand ({path.name}), {m.replace('_', ' ')}, against the measured seed means: "
            f"Kendall tau {out[m]['kendall_tau']:.2f}; rho within the seed spread {sum(ok)} of {len(ok)} "
            f"({', '.join(str(r['P']) for r, o in zip(within, ok) if not o) or 'none'} outside)")
    return dict(out["noise_scale"], models=out)


def resolution(runs_: dict, log=print) -> dict:
    """`ranking_resolution` of the measured sqrt-rule sizes, each seed over its own reference (censored runs at their
    bound), and the chance that a perfect rho lands inside the seed spread at every size within 4x."""
    by_seed: dict[int, dict[int, float]] = {}
    for (P, rule), rs in runs_.items():
        if rule == "sqrt":
            for r in rs:
                by_seed.setdefault(r["seed"], {})[P] = (r["n_star"], r["rps"])
    sizes = sorted(set.intersection(*(set(v) for v in by_seed.values()))) if by_seed else []
    if REF_P not in sizes or len(by_seed) < 2:
        return {}
    # (seeds, sizes) log rho and log sigma of each seed over its own reference; log T = log rho - log sigma, and which
    # half its seed noise comes from: samples-to-target (learning) or responses/s (the machine)
    log_rho, log_sig = (np.log([[v[P][i] / v[REF_P][i] for P in sizes] for v in by_seed.values()]) for i in (0, 1))
    within = sum(1 for P in sizes if P != REF_P and REF_P / 4 <= P <= REF_P * 4)
    res = noise_split(log_rho, log_sig, sizes.index(REF_P), within)
    log(f"resolution of the study ({len(by_seed)} seeds, P = {', '.join(map(str, sizes))}): one seed's measured T "
        f"ranking against another's, Kendall tau {', '.join(f'{t:.2f}' for t in res['seed_pair_tau'])} (mean "
        f"{res['seed_pair_tau_mean']:.2f}); seed sd of log T {res['sd_log_t']:.3f} (of log rho "
        f"{res['sd_log_rho']:.3f}, of log sigma {res['sd_log_sigma']:.3f}), so a perfect predictor reaches tau "
        f"{res['perfect_tau_mean']:.2f} on average against the {len(by_seed)}-seed means, >= 0.8 in "
        f"{100 * res['perfect_tau_p08']:.0f} % of draws "
        f"({', '.join(f'{m} seeds {100 * q:.0f} %' for m, q in res['perfect_tau_p08_by_seeds'].items())}; >= 80 % from "
        f"{res['seeds_for_p08'] or 'more than ' + str(max(res['perfect_tau_p08_by_seeds']))} seeds); the true rho lies "
        f"inside {len(by_seed)} seeds' min..max with chance {res['spread_cover_one']:.2f} per size, "
        f"{res['spread_cover_all']:.2f} at all {within} sizes within 4x")
    return res


def leave_one_size_out(runs_: dict, target: float, log=print) -> dict:
    """Per seed, each sqrt-rule size left out: lr-aware fitted on that seed's other sizes, or `curves` through them,
    predicts its rho (over the seed's own reference); |log error|, censored sizes counted only when predicted low."""
    errs: dict[str, list[float]] = {"curves": [], "lr-aware": []}
    for ref in runs_.get((REF_P, "sqrt"), []):
        mine = {P: r for (P, rule), rs in runs_.items() if rule == "sqrt" and P != REF_P
                for r in rs if r["seed"] == ref["seed"]}
        for P, r in mine.items():
            others = [ref["curve"]] + [x["curve"] for Q, x in mine.items() if Q != P]
            meas = r["n_star"] / ref["n_star"]
            try:
                pc = curves_rho(ref["curve"].responses_per_update, others, target).rho(P * G)
            except RlsimError:
                pc = math.nan
            f = fit_lr_aware(ref["curve"], others, target)
            pl = lr_aware_rho(ref["curve"].responses_per_update, f.b_bend, f.kappa).rho(
                P * G, x=r["curve"].lr / ref["curve"].lr)
            for name, p in (("curves", pc), ("lr-aware", pl)):
                errs[name].append(censored_log_error(p, meas, r["censored"]))
    return _summary(errs, "leave one size out, per seed (the other sizes as the pilot)", log)


def _summary(errs: dict[str, list[float]], what: str, log) -> dict:
    out = error_summary(errs)
    if out:
        log(f"{what}: |log(pred/meas)| of rho "
            + "; ".join(f"{k} mean {v['mean']:.3f}, median {v['median']:.3f} (n = {v['n']})" for k, v in out.items()))
    return out


def seed_cv(runs_: dict, target: float, log=print) -> dict:
    """Every seed in turn as the fit seed: lr-aware fitted on its runs, noise-scale from each other seed's reference;
    both predict every other seed's rho (its own N* over its own reference's), |log error| (censored: only when low)."""
    seeds = sorted({r["seed"] for rs in runs_.values() for r in rs})
    by = {(P, rule, r["seed"]): r for (P, rule), rs in runs_.items() for r in rs}
    errs: dict[str, list[float]] = {"noise-scale": [], "lr-aware": []}
    for f in seeds:
        if (REF_P, "sqrt", f) not in by:
            continue
        ref = by[(REF_P, "sqrt", f)]["curve"]
        fit = fit_lr_aware(ref, [r["curve"] for k, r in by.items() if k[2] == f], target)
        for s in seeds:
            if s == f or (REF_P, "sqrt", s) not in by:
                continue
            rs = by[(REF_P, "sqrt", s)]
            lr_model = lr_aware_rho(ref.responses_per_update, fit.b_bend, fit.kappa)
            ns = noise_scale(_trace(rs["path"])).b_crit
            for (P, rule, s2), r in by.items():
                if s2 != s or (P == REF_P and rule == "sqrt"):
                    continue
                meas = r["n_star"] / rs["n_star"]
                for name, p in (("noise-scale", noise_scale_rho(ref.responses_per_update, ns).rho(P * G)),
                                ("lr-aware", lr_model.rho(P * G, x=r["curve"].lr / rs["curve"].lr))):
                    errs[name].append(censored_log_error(p, meas, r["censored"]))
    return _summary(errs, "seed cross-validation (each seed fits lr-aware in turn; every other seed's rho predicted)",
                    log)


def chart(res: dict, out_dir: Path) -> None:
    """Measured T ratio (seed spread as a band) against the two predictions, over P (log axis)."""
    import altair as alt

    from rlsim.present.charts import save_chart

    pts = []
    for r in res["rows"]:
        if r["rule"] != "sqrt":
            continue
        lo, hi = r["rho_min"] / r["sigma_max"], r["rho_max"] / r["sigma_min"]
        for what, v in (("measured (mean of seeds)", r["T"]), ("predicted: reference alone", r["pred_T"]),
                        ("predicted: curves, P left out", r["curves_T"])):
            pts.append({"P": r["P"], "T ratio": v if math.isfinite(v) else None, "series": what, "lo": lo, "hi": hi})
    held = res.get("held_out") or {}
    for r in held.get("rows", []):  # the lr-aware model fitted on seed 0, predicting the held-out seeds' references
        if r["rule"] == "sqrt":
            pts.append({"P": r["P"], "T ratio": r["lr-aware_T"],
                        "series": f"lr-aware (fit on seed {held['fit_seed']}), held-out seeds", "lo": None, "hi": None})
    base = alt.Chart(alt.Data(values=pts)).encode(x=alt.X("P:Q", scale=alt.Scale(type="log", base=2),
                                                          title="prompts per update P (G = 8)"))
    band = base.transform_filter(alt.datum.series == "measured (mean of seeds)").mark_errorbar().encode(
        y=alt.Y("lo:Q", title="time-to-target ratio T / T(P=32)"), y2="hi:Q")
    lines = base.mark_line(point=True).encode(y="T ratio:Q", color=alt.Color("series:N", title=None))
    save_chart((band + lines).properties(width=520, height=300, title="Batch-size study: measured vs predicted"),
               out_dir, "batch_study_T")


def _print(rows, log) -> None:
    hdr = (f"{'P':>4} {'lr':>5} {'seeds':>5} {'N* (mean)':>10} | {'rho meas (spread)':>20} {'pred':>6} {'curves':>6} "
           f"{'lr-aw':>6} | {'sigma meas (spread)':>20} {'pred':>6} | {'T meas':>6} {'pred':>6} "
           f"{'curves':>6} {'lr-aw':>6}")
    log("pred: noise-scale from the reference alone; curves: the other sizes' runs, P left out; "
        "lr-aw: lr-aware at --lr-aware")
    log(hdr)
    log("-" * len(hdr))
    for r in rows:
        ge = ">=" if r["censored"] else "  "  # some seed never reached the target: a lower bound
        log(f"{r['P']:4d} {r['rule']:>5} {r['reached']:>2}/{r['seeds']:<2} {ge}{r['n_star']:8.0f} | "
            f"{ge}{r['rho']:4.2f} ({r['rho_min']:.2f}..{r['rho_max']:.2f}) {r['pred_rho']:6.2f} {r['curves_rho']:6.2f} "
            f"{r['lrd_rho']:6.2f} | {r['sigma']:6.2f} ({r['sigma_min']:.2f}..{r['sigma_max']:.2f}) "
            f"{r['pred_sigma']:6.2f} | {ge}{r['T']:4.2f} {r['pred_T']:6.2f} {r['curves_T']:6.2f} {r['lrd_T']:6.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
