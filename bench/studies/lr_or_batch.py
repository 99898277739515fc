"""Does samples-to-target follow the learning rate or the batch? A crossed test on the batch-size study's task.

The batch-size study (bench/studies/batch_study.py) moves the batch and, by the square-root rule, the lr together: at
P = 8 the lr is half the reference's, at P = 128 twice. It cannot tell which of the two moves samples-to-target.
This bench records GRPO runs at batch/lr pairs that cross them (default: P = 8 and P = 128, each at the
reference lr and at the other's square-root-rule lr; fixed lr, G = 8, the study's budget and evals, seeds
0..SEEDS-1), and scores three hypotheses, each a prediction of rho = N*(run) / N*(reference P = 32, lr 3e-4):

- lr:    samples-to-target depends on the lr alone: rho = f(lr), where f is the study's measured sqrt-rule rho at the
         size whose lr that is (1 at the reference lr; a censored size gives a lower bound);
- sde:   noise-dominated Adam (the gradients are, in every metric the traces record: docs/results.md): the first-order
         gain of a step grows as lr sqrt(B), so rho = (lr_ref / lr) sqrt(B / B_ref) (Malladi et al. 2022's
         square-root rule is the lr at which this stays 1);
- steps: every update makes the same progress at a given lr (signal-dominated): rho = (lr_ref / lr) (B / B_ref);
- lr-aware: rlsim's `--rho lr-aware` model at the constants fitted on the study's seed 0 (`--lr-aware`, default
         B_bend 53.8, kappa 0.19: docs/results.md section 1c), given each run's lr over the reference's.

`--predict` writes the three predictions before any run (docs/study/lr_or_batch_preregistered.json, committed
before the recordings); the analysis scores the measured means against that file: per run configuration, the
hypothesis with the smallest |log(pred / measured)|, and whether each prediction lies inside the seeds' range.
Recording is serialised (`flock`) and resumable, like the study's.

    python -m bench.studies.lr_or_batch --predict --json docs/study/lr_or_batch_preregistered.json
    python -m bench.studies.lr_or_batch --record-only                  # ~45 min on 2 quiet cores
    python -m bench.studies.lr_or_batch --no-record --predictions docs/study/lr_or_batch_preregistered.json \\
        --json docs/study/lr_or_batch.json

(from the repository root; the scoring is `rlsim.replay.evaluation`).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from bench.studies.batch_study import G, LR, REF_P, SIZES, measure, rlrun_cmd, steps_for
from bench.studies.recording import ROOT, complete, run_locked
from rlsim.replay.evaluation import samples_to_target, within_spread
from rlsim.replay.io import read_trace
from rlsim.replay.learning import fit_learning_curve
from rlsim.replay.rho import lr_aware_rho

POINTS = ((8, 3e-4), (128, 3e-4), (128, 1.5e-4), (8, 6e-4))  # (P, lr): each size at the reference lr and the other's
SEEDS = 3
BUDGET = 16384
TASK, TARGET = "addmix", 0.562  # the study's task and target (docs/results.md section 1c)
HYPOTHESES = ("lr", "sde", "steps", "lr-aware")
# B_bend, kappa fitted on the addmix study's seed 0 (bench/studies/batch_study.py held-out check)
LR_AWARE = (53.8, 0.19)


def name(P: int, lr: float, seed: int, task: str) -> str:
    return f"grpo_{task}_p{P}_lr{lr:g}_s{seed}"


def record(out: Path, points, seeds: int, task: str, budget: int, log=print) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for seed in range(seeds):  # seed-major: a partial recording has every point
        for P, lr in points:
            steps = steps_for(P, budget)
            path = out / f"{name(P, lr, seed, task)}.parquet"
            if complete(path, steps):
                continue
            run_locked(rlrun_cmd(P, steps, lr, "fixed", seed, path, "--task", task, "--no-calibrate"), log)


def study_f(study: Path, seeds: int, task: str,
            target: float) -> tuple[float, dict[float, tuple[float, bool]], list[dict]]:
    """The reference's mean N*, f: lr -> (measured sqrt-rule rho at the size with that lr, censored), and every study
    configuration as a row (P, lr, rho, censored, seeds)."""
    runs_ = measure(study, SIZES, seeds, task)
    refs = runs_.get((REF_P, "sqrt"), [])
    if not refs:
        raise SystemExit(f"error: no reference runs (P = {REF_P}) in {study}; record the study first "
                         "(bench/studies/batch_study.py)")
    ref_n = [samples_to_target(r["curve"], target) for r in refs]
    if any(c for _, c in ref_n):
        raise SystemExit(f"error: a reference run in {study} never reaches the target {target:g}; lower --target")
    n_ref = float(np.mean([n for n, _ in ref_n]))
    f, rows = {}, []
    for (P, rule), rs in runs_.items():
        ns = [samples_to_target(r["curve"], target) for r in rs]
        rho, cens = float(np.mean([n for n, _ in ns])) / n_ref, any(c for _, c in ns)
        lr = LR * (math.sqrt(P / REF_P) if rule == "sqrt" else 1.0)
        rows.append(dict(P=P, lr=lr, rho=rho, censored=cens, seeds=len(rs)))
        if rule == "sqrt":
            f[round(lr, 12)] = (rho, cens)
    return n_ref, f, rows


def grid(rows: list[dict], log=print) -> None:
    """Seed-mean rho of every measured (P, lr), batch down and lr across ("rho/seeds"; ">=": some seed never reached
    the target, the mean counts it at its budget)."""
    lrs = sorted({round(r["lr"], 12) for r in rows})
    cell = {(r["P"], round(r["lr"], 12)): r for r in rows}

    def fmt(r):
        return "" if r is None else f"{'>=' if r['censored'] else ''}{r['rho']:.2f}/{r['seeds']}"

    log("rho by batch (P, down) and lr (across), all runs of the task:")
    log(f"{'P':>5} " + " ".join(f"{lr:>10.3g}" for lr in lrs))
    for P in sorted({r["P"] for r in rows}):
        log(f"{P:>5} " + " ".join(f"{fmt(cell.get((P, lr))):>10}" for lr in lrs))


def predict(points, f: dict[float, tuple[float, bool]], lr_aware: tuple[float, float] = LR_AWARE) -> dict[str, dict]:
    """The hypotheses' rho for each (P, lr); `lr` is None where the study has no size with that lr."""
    model = lr_aware_rho(REF_P * G, *lr_aware)
    out = {}
    for P, lr in points:
        b = (P * G) / (REF_P * G)
        x = lr / LR
        near = next((v for k, v in f.items() if math.isclose(k, lr, rel_tol=0.02)), None)
        out[f"{P}_{lr:g}"] = dict(P=P, lr=lr, lr_rho=None if near is None else near[0],
                                  lr_censored=None if near is None else near[1],
                                  sde_rho=math.sqrt(b) / x, steps_rho=b / x, **{"lr-aware_rho": model.rho(P * G, x=x)})
    return out


def analyse(out: Path, points, seeds: int, task: str, target: float, n_ref: float, pred: dict, budget: int = BUDGET,
            log=print) -> dict:
    rows = []
    for P, lr in points:
        ns = []
        for seed in range(seeds):
            path = out / f"{name(P, lr, seed, task)}.parquet"
            if complete(path, steps_for(P, budget)):
                ns.append(samples_to_target(fit_learning_curve(read_trace(path)), target))
        if not ns:
            continue
        p = pred[f"{P}_{lr:g}"]
        rho_s = [n / n_ref for n, _ in ns]
        row = dict(P=P, lr=lr, seeds=len(ns), censored=any(c for _, c in ns), rho=float(np.mean(rho_s)),
                   rho_min=min(rho_s), rho_max=max(rho_s))
        for h in HYPOTHESES:
            v = p.get(f"{h}_rho")
            row[f"{h}_rho"] = v
            row[f"{h}_err"] = abs(math.log(v / row["rho"])) if v else math.nan
            # a censored mean is a lower bound: a prediction at or above it is not contradicted there
            row[f"{h}_in_range"] = v is not None and within_spread(v, row["rho_min"], row["rho_max"], row["censored"])
        errs = {h: row[f"{h}_err"] for h in HYPOTHESES if math.isfinite(row[f"{h}_err"])}
        row["nearest"] = min(errs, key=errs.get) if errs else None
        rows.append(row)
    log(f"target {target:g}; reference P = {REF_P} at lr {LR:g}: N* = {n_ref:.0f} responses "
        "(mean of the study's seeds)")
    log(f"{'P':>4} {'lr':>7} {'seeds':>5} | {'rho measured (range)':>22} | {'lr':>10} {'sde':>6} {'steps':>6} "
        f"{'lr-aware':>8} | nearest")
    for r in rows:
        ge = ">=" if r["censored"] else "  "
        censored = r["lr_rho"] is not None and pred[f"{r['P']}_{r['lr']:g}"]["lr_censored"]
        lr_pred = "n/a" if r["lr_rho"] is None else (">=" if censored else "") + f"{r['lr_rho']:.2f}"
        log(f"{r['P']:4d} {r['lr']:7.2g} {r['seeds']:5d} | {ge}{r['rho']:5.2f} "
            f"({r['rho_min']:5.2f}..{r['rho_max']:5.2f})     | {lr_pred:>10} {r['sde_rho']:6.2f} {r['steps_rho']:6.2f} "
            f"{r['lr-aware_rho']:8.2f} | {r['nearest']}")
    for h in HYPOTHESES:
        won = sum(r["nearest"] == h for r in rows)
        inside = sum(r[f"{h}_in_range"] for r in rows)
        log(f"{h:>6}: nearest at {won} of {len(rows)} points; inside the seeds' range at {inside} of {len(rows)}")
    return dict(target=target, n_ref=n_ref, rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default=str(ROOT / "traces" / "study_addmix"),
                    help="the batch-size study's traces (reference, f)")
    ap.add_argument("--study-seeds", type=int, default=6, help="seeds of the study to read")
    ap.add_argument("--out", default=str(ROOT / "traces" / "lr_or_batch"), help="folder of this bench's traces")
    ap.add_argument("--points", default=",".join(f"{P}:{lr:g}" for P, lr in POINTS), help="P:LR pairs to record")
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--budget", type=int, default=BUDGET, help="responses per run")
    ap.add_argument("--task", default=TASK)
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--lr-aware", default=",".join(f"{v:g}" for v in LR_AWARE),
                    help="B_BEND,KAPPA of the lr-aware hypothesis (default: the addmix study's seed-0 fit)")
    ap.add_argument("--predict", action="store_true", help="write the hypotheses' predictions (--json) and stop")
    ap.add_argument("--predictions",
                    help="score against this predictions file (written beforehand) instead of recomputing")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--record-only", action="store_true")
    ap.add_argument("--json", help="write the predictions or the results here")
    a = ap.parse_args(argv)
    try:
        points = tuple((int(p), float(lr)) for p, lr in (x.split(":") for x in a.points.split(",")))
        lr_aware = tuple(float(v) for v in a.lr_aware.split(","))
        if any(P <= 0 or lr <= 0 for P, lr in points) or len(lr_aware) != 2:
            raise ValueError
    except ValueError:
        raise SystemExit("--points takes P:LR pairs with positive numbers (8:3e-4,128:1.5e-4) and --lr-aware two "
                         f"numbers B_BEND,KAPPA; got {a.points!r}, {a.lr_aware!r}") from None
    if a.seeds < 1 or a.study_seeds < 1 or a.budget < 1:
        raise SystemExit(f"--seeds, --study-seeds and --budget must be at least 1; got {a.seeds}, "
                         f"{a.study_seeds}, {a.budget}")
    if a.predict and a.json and Path(a.json).exists():  # predictions are written once, before the runs they predict
        raise SystemExit(f"error: --predict --json {a.json}: exists; predictions are written once, before the runs "
                         "they predict: choose a new file")
    n_ref, f, study_rows = study_f(Path(a.study), a.study_seeds, a.task, a.target)
    if a.predict:
        res = dict(task=a.task, target=a.target, reference=dict(P=REF_P, lr=LR, n_star=n_ref), seeds=a.seeds,
                   rule="per point, the hypothesis with the smallest |log(pred/measured)| of the seed-mean rho is "
                        "nearest; a hypothesis holds if it is nearest at 3 or more of the 4 points and inside the "
                        "seeds' range at 3 or more",
                   lr_aware=dict(b_bend=lr_aware[0], kappa=lr_aware[1]), predictions=predict(points, f, lr_aware))
        print(json.dumps(res, indent=1))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
        return 0
    if not a.no_record:
        record(Path(a.out), points, a.seeds, a.task, a.budget)
    if a.record_only:
        return 0
    if a.predictions:
        try:
            pre = json.loads(Path(a.predictions).read_text())
            pred, n_ref = pre["predictions"], float(pre["reference"]["n_star"])
            missing = [f"{P}_{lr:g}" for P, lr in points if f"{P}_{lr:g}" not in pred]
            if missing:
                raise KeyError(", ".join(missing))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"error: cannot read predictions from {a.predictions} ({type(e).__name__}: "
                             f"{e}); write it with --predict") from None
    else:
        pred = predict(points, f, lr_aware)
    res = analyse(Path(a.out), points, a.seeds, a.task, a.target, n_ref, pred, a.budget)
    grid(study_rows + [{k: r[k] for k in ("P", "lr", "rho", "censored", "seeds")} for r in res["rows"]])
    res["study_rows"] = study_rows
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
