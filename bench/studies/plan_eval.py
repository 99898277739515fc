"""`rlsim plan` scored offline on the recorded batch-size studies, by the regret of its final pick.

For every study (traces/study, traces/study_addmix, traces/study_addmix_lr1e-4) and every reference seed s:
1. `rlsim plan` from seed s's reference run alone (P = 32), its rho uncertainty the error curves of the *other*
   studies (leave-one-study-out);
2. each pilot it asks for is seed s's own recorded run at that size (a pilot is a run to the target: its cost is
   the responses it took to get there, or its whole budget where it never did), and the plan is made again with it,
   until it decides or its budget (one reference run) is spent;
3. the pick is scored against the truth, the seed means of the *other* seeds: regret = T(pick) / T(best) - 1, with
   a bootstrap interval over those seeds (`rlsim.replay.evaluation.regret_interval`).
Baselines in the same terms: keep the reference, the largest batch, and rlsim's reference-alone pick (least
predicted T). Nothing is recorded; the error curves are measured here too (`--write-errors` stores them in
`rlsim/replay/rho_errors.py`, where `rlsim plan` reads them).

    python -m bench.studies.plan_eval --json docs/study/plan_eval.json --write-errors    # ~10 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.studies.recording import ROOT
from rlsim.replay.errors import RlsimError
from rlsim.replay.evaluation import SeedRuns, regret, regret_interval, resample_T, samples_to_target
from rlsim.replay.io import read_trace
from rlsim.replay.learning import fit_learning_curve
from rlsim.replay.rho_errors import RhoErrors
from rlsim.replay.split_stats import split_stats
from rlsim.core.config import WhatIf
from rlsim.sweeps.plan import PlanConfig, plan
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

SIZES, REF_P, G = (8, 16, 32, 64, 128, 256), 32, 8


@dataclass(frozen=True)
class StudySpec:
    name: str
    folder: str
    prefix: str
    seeds: int
    target: float


STUDIES = (StudySpec("add2", "traces/study", "grpo", 6, 0.566),
           StudySpec("addmix", "traces/study_addmix", "grpo_addmix", 6, 0.562),
           StudySpec("addmix lr 1e-4", "traces/study_addmix_lr1e-4", "grpo_addmix", 3, 0.647))
# Recorded after the plan's method was frozen (ff4f5ac) and its plans were committed
# (docs/study/add3_plan_preregistered.json): scored with the error curves rlsim plan ships (every study above), never
# used to make them.
FRESH = (StudySpec("add3", "traces/study_add3", "grpo_add3", 3, math.nan),)


def preregister(spec: StudySpec, path: Path) -> dict:
    """From the references alone (the other sizes not yet recorded): the target (90 % of the worst reference's best
    score, the studies' rule) and the plan `rlsim plan` makes from each reference, written to `path` (never over it)."""
    if path.exists():
        raise SystemExit(f"error: {path} exists; a pre-registration is written once")
    refs = [read_trace(ROOT / spec.folder / f"{spec.prefix}_p{REF_P}_s{s}.parquet") for s in range(spec.seeds)]
    target = round(0.9 * min(fit_learning_curve(t).best for t in refs), 3)
    plans = [plan(t, PlanConfig(prompts=SIZES, group=G), target=target).to_dict() for t in refs]
    out = dict(study=spec.name, target=target, sizes=SIZES, references=[t.name for t in refs], plans=plans,
               method="rlsim plan at commit ff4f5ac, error curves of rlsim.replay.rho_errors "
                      "(add2, addmix, addmix lr 1e-4)")
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    return out


def runs_of(spec: StudySpec) -> dict[int, list[dict]]:
    """Per size, per seed: the trace path, samples-to-target (censored: the budget) and steady responses/s."""
    out: dict[int, list[dict]] = {}
    for P in SIZES:
        for s in range(spec.seeds):
            path = ROOT / spec.folder / f"{spec.prefix}_p{P}_s{s}.parquet"
            t = read_trace(path)
            r = samples_to_target(fit_learning_curve(t), spec.target)
            out.setdefault(P, []).append(dict(path=path, n=r.n, censored=r.censored, rps=split_stats(t).responses_per_s,
                                              trained=float(np.sum(t.rows("update")["num_responses"]))))
    return out


def truth(runs: dict[int, list[dict]], seeds: list[int]) -> np.ndarray:
    """(sizes,) T of each size over the reference from the seed means of `seeds`."""
    mean = {P: (np.mean([runs[P][s]["n"] for s in seeds]), np.mean([runs[P][s]["rps"] for s in seeds])) for P in SIZES}
    n_ref, q_ref = mean[REF_P]
    return np.array([(mean[P][0] / n_ref) / (mean[P][1] / q_ref) for P in SIZES])


def seed_runs(runs: dict[int, list[dict]], seeds: list[int]) -> list[SeedRuns]:
    return [SeedRuns(np.array([runs[P][s]["n"] for s in seeds]), np.array([runs[P][s]["censored"] for s in seeds]),
                     np.array([runs[P][s]["rps"] for s in seeds])) for P in SIZES]


def error_curves(spec: StudySpec, runs: dict[int, list[dict]]) -> dict:
    """Per reference seed s: log(rho of the other seeds' means / rho predicted from s alone) per size (noise-scale and
    invariant), one pilot-noise sample per (seed, size), and the sigma errors."""
    curves: dict[str, list] = {"noise-scale": [], "invariant": []}
    pilot, sig = [], []
    for s in range(spec.seeds):
        others = [k for k in range(spec.seeds) if k != s]
        n_ref = np.mean([runs[REF_P][k]["n"] for k in others])
        rho_true = {P: np.mean([runs[P][k]["n"] for k in others]) / n_ref for P in SIZES}
        sig_true = {P: np.mean([runs[P][k]["rps"] for k in others]) / np.mean([runs[REF_P][k]["rps"] for k in others])
                    for P in SIZES}
        curves["invariant"].append([math.log(rho_true[P]) for P in SIZES])
        try:
            study = prepare([read_trace(runs[REF_P][s]["path"])], rho_model="noise-scale", target=spec.target)
        except RlsimError:  # no noise scale in this reference: rlsim plan would use the invariant model's curves
            continue
        preds = {P: evaluate(study, WhatIf(prompts=P, group=G, updates=40)) for P in SIZES if P != REF_P}
        curves["noise-scale"].append([0.0 if P == REF_P else math.log(rho_true[P] / preds[P].rho) for P in SIZES])
        for P in SIZES:
            if P != REF_P:
                pilot.append(math.log(runs[P][s]["n"] / runs[REF_P][s]["n"]) - math.log(rho_true[P]))
                sig.append(math.log(sig_true[P] / preds[P].sigma))
    return dict(curves=curves, pilot=pilot, sigma=sig)


def all_errors(per_study: dict[str, dict], model: str) -> RhoErrors:
    """The error curves of every study, with the noise levels pooled over them."""
    curves, sources = [], []
    for name, e in per_study.items():
        for k, c in enumerate(e["curves"][model]):
            curves.append(c)
            sources.append(f"{name} seed{k}")
    pilot = np.concatenate([e["pilot"] for e in per_study.values()])
    sigma = np.concatenate([e["sigma"] for e in per_study.values()])
    seed_sd = float(np.sqrt(np.mean(pilot ** 2)))
    n_seeds = np.mean([len(e["curves"][model]) for e in per_study.values()])
    return RhoErrors(np.log2(np.array(SIZES, float) / REF_P), np.array(curves), tuple(sources), seed_sd,
                     seed_sd / math.sqrt(max(n_seeds - 1, 1)), float(np.sqrt(np.mean(sigma ** 2))), model,
                     mirrored=model == "noise-scale")


def plan_seed(spec: StudySpec, runs: dict[int, list[dict]], s: int, errors: dict[str, RhoErrors]) -> dict:
    """Plan from seed s's reference, feed it s's own runs as the pilots it asks for, until it decides."""
    ref = read_trace(runs[REF_P][s]["path"])
    budget = runs[REF_P][s]["trained"]
    cfg = PlanConfig(prompts=SIZES, group=G, budget=budget)
    pilots, spent = [], 0.0
    first = p = plan(ref, cfg, errors=errors, target=spec.target, bounds_ok=True)
    while p.decision is None:
        nxt = next((x for x in p.pilots if x.prompts not in [int(t.config["prompts"]) for t in pilots]), None)
        run = runs[nxt.prompts][s] if nxt else None
        if run is None or spent + run["n"] > budget:
            break
        pilots.append(read_trace(run["path"]))
        spent += run["n"]
        p = plan(ref, PlanConfig(prompts=SIZES, group=G, budget=budget - spent), pilots=pilots, errors=errors,
                 target=spec.target, bounds_ok=True)
    chosen = p.decision or min(p.candidates, key=lambda c: c.expected_regret)
    ref_alone = min(first.candidates, key=lambda c: c.time_to_target_ratio)
    return dict(seed=s, pick=chosen.prompts, decided=p.decision is not None, p_within_5pct=chosen.p_within_5pct,
                expected_regret=chosen.expected_regret, pilots=[int(t.config["prompts"]) for t in pilots],
                pilot_cost=spent / budget, ref_alone_pick=ref_alone.prompts)


def one_pilot_bound(spec: StudySpec, runs: dict[int, list[dict]]) -> dict:
    """What one one-seed pilot can buy at best: pilot size j on seed s, keep it if its measured T beats the reference's
    (both seed s), score against the other seeds' means; the median regret per j, and the best j in hindsight."""
    per = {}
    for j in SIZES:
        if j == REF_P:
            continue
        regrets = []
        for s in range(spec.seeds):
            others = [k for k in range(spec.seeds) if k != s]
            T_obs = (runs[j][s]["n"] / runs[REF_P][s]["n"]) / (runs[j][s]["rps"] / runs[REF_P][s]["rps"])
            regrets.append(regret(truth(runs, others), SIZES.index(j if T_obs < 1 else REF_P)))
        per[j] = float(np.median(regrets))
    best = min(per, key=per.get)
    return dict(median_regret_by_pilot=per, best_pilot_in_hindsight=best, best_median_regret=per[best])


def evaluate_study(spec: StudySpec, runs: dict[int, list[dict]], errors: dict[str, RhoErrors],
                   rng: np.random.Generator) -> dict:
    rows = []
    for s in range(spec.seeds):
        r = plan_seed(spec, runs, s, errors)
        others = [k for k in range(spec.seeds) if k != s]
        T = truth(runs, others)
        draws = resample_T(seed_runs(runs, others)[SIZES.index(REF_P)], seed_runs(runs, others), rng, draws=500)
        i = SIZES.index(r["pick"])
        r.update(regret=regret(T, i), regret_interval=regret_interval(draws, i), best=SIZES[int(np.argmin(T))],
                 keep_reference_regret=regret(T, SIZES.index(REF_P)), largest_batch_regret=regret(T, len(SIZES) - 1),
                 ref_alone_regret=regret(T, SIZES.index(r["ref_alone_pick"])))
        rows.append(r)
    med = lambda k: float(np.median([r[k] for r in rows]))  # noqa: E731
    return dict(name=spec.name, seeds=spec.seeds, target=spec.target, median_regret=med("regret"),
                max_regret=float(max(r["regret"] for r in rows)), keep_reference_regret=med("keep_reference_regret"),
                largest_batch_regret=med("largest_batch_regret"), ref_alone_regret=med("ref_alone_regret"),
                pilot_cost=med("pilot_cost"), decided=int(sum(r["decided"] for r in rows)),
                confident=int(sum(r["p_within_5pct"] >= 0.8 for r in rows)), one_pilot=one_pilot_bound(spec, runs),
                per_seed=rows,
                error_curves=errors["noise-scale"].describe())


def _with_target(spec: StudySpec) -> StudySpec:
    """The fresh study with the target its pre-registration fixed."""
    pre = json.loads((ROOT / "docs" / "study" / f"{spec.name}_plan_preregistered.json").read_text())
    return StudySpec(spec.name, spec.folder, spec.prefix, spec.seeds, float(pre["target"]))


def write_errors(errors: dict[str, RhoErrors]) -> None:
    """Store the measured curves in rlsim/replay/rho_errors.py's DATA (the line after its marker)."""
    path = ROOT / "replay" / "rho_errors.py"
    text = path.read_text()
    def block(e: RhoErrors) -> str:  # one curve a line, rounded to what the studies resolve
        d = e.to_dict()
        rows = ",\n".join("        " + json.dumps([round(x, 4) for x in c]) for c in d.pop("curves"))
        # Python literals
        head = ", ".join(f"{k!r}: {round(v, 4) if isinstance(v, float) else v!r}" for k, v in d.items())
        return "{" + head + ',\n     "curves": [\n' + rows + "]}"

    data = "{\n" + ",\n".join(f"    {json.dumps(m)}: {block(e)}" for m, e in errors.items()) + "}"
    new = re.sub(r"DATA: dict\[str, dict\] = .*\Z", "DATA: dict[str, dict] = " + data + "\n", text, flags=re.S)
    path.write_text(new)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the evaluation here (docs/study/plan_eval.json)")
    ap.add_argument("--write-errors", action="store_true", help="store every study's error curves for rlsim plan")
    ap.add_argument("--studies", default=",".join(s.name for s in STUDIES), help="comma list of study names")
    ap.add_argument("--preregister", help="write the fresh study's target and plans from its references here, and stop")
    ap.add_argument("--fresh", action="store_true",
                    help="also score the fresh study (FRESH) with the shipped error curves")
    a = ap.parse_args(argv)
    if a.preregister:
        preregister(FRESH[0], Path(a.preregister))
        return 0
    want = a.studies.split(",")
    specs = [s for s in STUDIES if s.name in want]
    runs = {s.name: runs_of(s) for s in specs}
    per = {s.name: error_curves(s, runs[s.name]) for s in specs}
    errors = {m: all_errors(per, m) for m in ("noise-scale", "invariant")}
    rng = np.random.default_rng(0)
    out = {"studies": [evaluate_study(s, runs[s.name], {m: e.without(s.name) for m, e in errors.items()}, rng)
                       for s in specs],
           "fresh": ([evaluate_study(_with_target(f), runs_of(_with_target(f)), errors, rng) for f in FRESH]
                     if a.fresh else []),
           "method": __doc__.split("\n\n")[0]}
    print(f"{'study':16s} {'median regret':>14s} {'max':>6s} {'keep ref':>9s} {'largest':>8s} {'ref-alone':>9s} "
          f"{'pilot cost':>10s} {'confident':>9s} {'1 pilot, best in hindsight':>27s}")
    for r in out["studies"] + out["fresh"]:
        print(f"{r['name']:16s} {r['median_regret']:14.1%} {r['max_regret']:6.1%} {r['keep_reference_regret']:9.1%} "
              f"{r['largest_batch_regret']:8.1%} {r['ref_alone_regret']:9.1%} {r['pilot_cost']:10.2f} "
              f"{r['confident']:>6d}/{r['seeds']} {r['one_pilot']['best_median_regret']:>20.1%} "
              f"(P={r['one_pilot']['best_pilot_in_hindsight']})")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=float) + "\n")
    if a.write_errors:
        write_errors(errors)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
