"""`rlsim plan` scored offline on the recorded batch-size studies, by the regret of its final pick.

For every study (traces/study, traces/study_addmix, traces/study_addmix_lr1e-4) and every reference seed s:
1. `rlsim plan` from seed s's reference run alone (P = 32), its rho uncertainty the error curves of the *other*
   studies (leave-one-study-out);
2. each pilot it asks for is seed s's own recorded run at that size (a run to the target costs the responses it took
   to get there, or its whole budget where it never did; a prefix is the run cut after its length, and costs that;
   the reference again is the reference's configuration recorded with seed s + seeds, where the study has it, never
   part of a truth), and the plan is made again with it, until it decides or its budget (one reference run) is spent;
3. the pick is scored against the truth, the seed means of the *other* seeds: regret = T(pick) / T(best) - 1, with
   a bootstrap interval over those seeds (`rlsim.replay.evaluation.regret_interval`).
Baselines in the same terms: keep the reference, the largest batch, and rlsim's reference-alone pick (least
predicted T). Nothing is recorded; the error curves are measured here too (`--write-errors` stores them in
`rlsim/replay/rho_errors.py`, where `rlsim plan` reads them).

    python -m bench.studies.plan_eval --fresh --json docs/study/plan_eval.json --write-errors    # ~5 min on 2 cores

Also measured there (`prefix_table`, `--json` key `prefix_noise`): how well a prefix of a run (its first f x the
reference's samples-to-target responses, its learning curve set against the reference's at equal responses) predicts
rho. Any other recorded study is scored with the error curves rlsim plan ships: `--folder DIR --prefix grpo_x
--seeds 3 --ref-p 32 --sizes 8,16,32,64,128,256 [--target S]`. The rule's knobs (`--confidence`,
`--measured-confidence`, `--slack`) are chosen on the three studies, never on the fresh one; `--draw-seed K` scores
the same plans on other draws of their Monte Carlo (the scores move with them: docs/results.md section 17).
"""
from __future__ import annotations

import argparse
import json
import math
import pprint
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from bench.studies.recording import ROOT
from rlsim.replay.errors import RlsimError
from rlsim.replay.evaluation import SeedRuns, regret, regret_interval, resample_T, samples_to_target
from rlsim.replay.io import read_trace
from rlsim.replay.learning import fit_learning_curve, prefix_log_rho
from rlsim.replay.rho_errors import RhoErrors, measured_errors
from rlsim.replay.split_stats import split_stats
from rlsim.core.config import WhatIf
from rlsim.sweeps.plan import PlanConfig, plan
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

SIZES, REF_P, G = (8, 16, 32, 64, 128, 256), 32, 8
PREFIX_F = (0.25, 0.5, 0.75, 1.0)  # prefix lengths measured, as fractions of the reference's samples-to-target


@dataclass(frozen=True)
class StudySpec:
    """A recorded batch-size study: runs `{folder}/{prefix}_p{P}_s{seed}.parquet` for every P in `sizes` and seed."""

    name: str
    folder: str  # relative to the repository root, or absolute
    prefix: str
    seeds: int
    target: float  # nan: 90 % of the worst reference's best score (`target_of`)
    sizes: tuple[int, ...] = SIZES
    ref_p: int = REF_P
    group: int = G
    registered: str = ""  # the pre-registration that fixed a fresh study's target (docs/study/...; "": the name's)

    def path(self, P: int, seed: int) -> Path:
        return ROOT / self.folder / f"{self.prefix}_p{P}_s{seed}.parquet"


STUDIES = (StudySpec("add2", "traces/study", "grpo", 6, 0.566),
           StudySpec("addmix", "traces/study_addmix", "grpo_addmix", 6, 0.562),
           StudySpec("addmix lr 1e-4", "traces/study_addmix_lr1e-4", "grpo_addmix", 3, 0.647))
# Recorded after the plan's method was frozen (ff4f5ac) and its plans were committed
# (docs/study/add3_plan_preregistered.json): scored with the error curves rlsim plan ships (every study above), never
# used to make them.
# sub3 (three-digit subtraction) likewise, after the rule of results section 13 was chosen
# (docs/study/sub3_plan_preregistered.json); add4 (four-digit addition) likewise, after the prefix-moves ablation of
# results section 23 (docs/study/add4_plan_preregistered.json); sum3 (three two-digit operands) likewise, after the
# rule of results section 26, with its references' second runs (docs/study/sum3_plan_preregistered.json). sum3 again
# with its P 8 and P 16 runs as the reference (two sizes its P 32 runs beat), scored after sum3 with the rule unchanged
# (results section 29): whether the rule moves where it should, on runs no rule was chosen on.
FRESH = (StudySpec("add3", "traces/study_add3", "grpo_add3", 3, math.nan),
         StudySpec("sub3", "traces/study_sub3", "grpo_sub3", 3, math.nan),
         StudySpec("add4", "traces/study_add4", "grpo_add4", 3, math.nan),
         StudySpec("sum3", "traces/study_sum3", "grpo_sum3", 3, math.nan),
         StudySpec("sum3 ref P 8", "traces/study_sum3", "grpo_sum3", 3, math.nan, ref_p=8, registered="sum3"),
         StudySpec("sum3 ref P 16", "traces/study_sum3", "grpo_sum3", 3, math.nan, ref_p=16, registered="sum3"))


def _commit() -> str:
    """The checkout's commit (a pre-registration names the code that made it)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def preregister(spec: StudySpec, path: Path) -> dict:
    """From the references alone (the other sizes not yet recorded): the target (90 % of the worst reference's best
    score, the studies' rule) and the plan `rlsim plan` makes from each reference, written to `path` (never over it)."""
    if path.exists():
        raise SystemExit(f"error: {path} exists; a pre-registration is written once")
    refs = [read_trace(spec.path(spec.ref_p, s)) for s in range(spec.seeds)]
    target = target_of(refs)
    plans = [plan(t, PlanConfig(prompts=spec.sizes, group=spec.group), target=target).to_dict() for t in refs]
    out = dict(study=spec.name, target=target, sizes=spec.sizes, references=[t.name for t in refs], plans=plans,
               method=f"rlsim plan at commit {_commit()} (PlanConfig defaults), error curves of "
                      "rlsim.replay.rho_errors (add2, addmix, addmix lr 1e-4)")
    path.write_text(json.dumps(out, indent=1, default=float) + "\n")
    return out


def target_of(refs) -> float:
    """The studies' target rule: 90 % of the worst reference's best (smoothed) score."""
    return round(0.9 * min(fit_learning_curve(t).best for t in refs), 3)


def runs_of(spec: StudySpec) -> dict[int, list[dict]]:
    """Per size, per seed: the trace path, samples-to-target (censored: the budget) and steady responses/s."""
    missing = [spec.path(P, s) for P in spec.sizes for s in range(spec.seeds) if not spec.path(P, s).exists()]
    if missing:
        raise RlsimError(f"study {spec.name}: {len(missing)} run(s) missing, e.g. {missing[0]}; give the folder, file "
                         "prefix, seeds and sizes it was recorded with")
    if not math.isfinite(spec.target):
        spec = replace(spec, target=target_of([read_trace(spec.path(spec.ref_p, s)) for s in range(spec.seeds)]))
    return {P: [_run(spec.path(P, s), spec.target) for s in range(spec.seeds)] for P in spec.sizes}


def _run(path: Path, target: float) -> dict:
    """One run: its path, samples-to-target (censored: the budget), steady responses/s, responses trained, evals."""
    t = read_trace(path)
    curve = fit_learning_curve(t)
    r = samples_to_target(curve, target)
    return dict(path=path, n=r.n, censored=r.censored, rps=split_stats(t).responses_per_s,
                trained=float(np.sum(t.rows("update")["num_responses"])), target=target, evals=curve.cum_responses)


def rerun_of(spec: StudySpec, s: int, target: float) -> dict | None:
    """Seed s's second reference run, the pilot `rlsim plan` may ask for: the reference's configuration recorded with
    seed s + spec.seeds (never part of any truth); None where the study has none, or has one from another build of
    the model (its warm-up ended elsewhere: `rlsim plan` refuses it)."""
    path = spec.path(spec.ref_p, s + spec.seeds)
    if not path.exists():
        return None
    return _run(path, target) if _build(path) == _build(spec.path(spec.ref_p, s)) else None


def _build(path: Path) -> dict:
    """The recipe of the built-in model a run trained, less the warm-up's wall time (which differs between builds of
    one model): equal for two runs of the same weights."""
    recipe = (read_trace(path).meta.get("model") or {}).get("recipe") or {}
    return {k: v for k, v in recipe.items() if k != "sft_seconds"}


def second_runs(spec: StudySpec) -> list[dict]:
    """Per seed s: samples-to-target of its reference and of its second run (seed s + seeds, in the study's folder or
    in `rebuilt_model/` beside it), and each one's warm-up loss (`--second-runs`; docs/results.md section 25)."""
    out = []
    for s in range(spec.seeds):
        first = spec.path(spec.ref_p, s)
        name = spec.path(spec.ref_p, s + spec.seeds).name
        again = next((p for p in (first.parent / name, first.parent / "rebuilt_model" / name) if p.exists()), None)
        if again is None:
            continue
        n = [_run(p, spec.target)["n"] for p in (first, again)]
        loss = [_build(p).get("sft_final_loss") for p in (first, again)]
        out.append(dict(seed=s, first=n[0], second=n[1], log_ratio=math.log(n[1] / n[0]), first_loss=loss[0],
                        second_loss=loss[1], same_model=_build(first) == _build(again)))
    return out


def truth(runs: dict[int, list[dict]], seeds: list[int], ref_p: int = REF_P) -> np.ndarray:
    """(sizes,) T of each size (the keys of `runs`, in order) over the reference from the seed means of `seeds`."""
    mean = {P: (np.mean([r[s]["n"] for s in seeds]), np.mean([r[s]["rps"] for s in seeds])) for P, r in runs.items()}
    n_ref, q_ref = mean[ref_p]
    return np.array([(n / n_ref) / (q / q_ref) for n, q in mean.values()])


def seed_runs(runs: dict[int, list[dict]], seeds: list[int]) -> list[SeedRuns]:
    return [SeedRuns(np.array([r[s]["n"] for s in seeds]), np.array([r[s]["censored"] for s in seeds]),
                     np.array([r[s]["rps"] for s in seeds])) for r in runs.values()]


def error_curves(spec: StudySpec, runs: dict[int, list[dict]]) -> dict:
    """Per reference seed s: log(rho of the other seeds' means / rho predicted from s alone) per size (noise-scale and
    invariant); per (seed, size) one pilot-noise sample of log rho and of log sigma (seed s's run over seed s's
    reference, against the other seeds' means), one prefix sample per prefix length (`prefix_samples`), the
    sigma errors, and per seed the pilots' errors in log T (`pilot_T`, for the part they share: `shared_var`)."""
    curves: dict[str, list] = {"noise-scale": [], "invariant": []}
    pilot, pilot_sig, sig, pilot_T, prefix = [], [], [], [], {f: [] for f in PREFIX_F}
    prefix_at: dict[tuple[int, float], list] = {}  # (P, f) -> the prefix samples of that size
    by_seed: dict[tuple[int, int, float], float] = {}  # (seed, P, f) -> that prefix's error
    cross: dict[float, list] = {f: [] for f in PREFIX_F}  # a prefix's error x another size's run-to-target error
    R = spec.ref_p
    lc = {P: [fit_learning_curve(read_trace(r[s]["path"])) for s in range(spec.seeds)] for P, r in runs.items()}
    for s in range(spec.seeds):
        others = [k for k in range(spec.seeds) if k != s]
        n_ref = np.mean([runs[R][k]["n"] for k in others])
        rho_true = {P: np.mean([runs[P][k]["n"] for k in others]) / n_ref for P in spec.sizes}
        sig_true = {P: np.mean([runs[P][k]["rps"] for k in others]) / np.mean([runs[R][k]["rps"] for k in others])
                    for P in spec.sizes}
        curves["invariant"].append([math.log(rho_true[P]) for P in spec.sizes])
        pilot_T.append([math.log(runs[P][s]["n"] / runs[R][s]["n"] / rho_true[P])
                        - math.log(runs[P][s]["rps"] / runs[R][s]["rps"] / sig_true[P]) for P in spec.sizes if P != R])
        full = {P: math.log(runs[P][s]["n"] / runs[R][s]["n"] / rho_true[P]) for P in spec.sizes if P != R}
        for P in spec.sizes:
            if P != R:
                pilot_sig.append(math.log(runs[P][s]["rps"] / runs[R][s]["rps"] / sig_true[P]))
                for f in PREFIX_F:
                    e = prefix_log_rho(lc[R][s], lc[P][s], f * runs[R][s]["n"]) - math.log(rho_true[P])
                    if math.isfinite(e):
                        prefix[f].append(e)
                        prefix_at.setdefault((P, f), []).append(e)
                        by_seed[(s, P, f)] = e
                        cross[f] += [e * full[Q] for Q in full if Q != P]
        try:
            study = prepare([read_trace(runs[R][s]["path"])], rho_model="noise-scale", target=spec.target)
        except RlsimError:  # no noise scale in this reference: rlsim plan would use the invariant model's curves
            continue
        preds = {P: evaluate(study, WhatIf(prompts=P, group=spec.group, updates=40)) for P in spec.sizes if P != R}
        curves["noise-scale"].append([0.0 if P == R else math.log(rho_true[P] / preds[P].rho) for P in spec.sizes])
        for P in spec.sizes:
            if P != R:
                pilot.append(math.log(runs[P][s]["n"] / runs[R][s]["n"]) - math.log(rho_true[P]))
                sig.append(math.log(sig_true[P] / preds[P].sigma))
    return dict(curves=curves, pilot=pilot, pilot_sigma=pilot_sig, sigma=sig, prefix=prefix, pilot_T=pilot_T,
                prefix_at=prefix_at, ref_p=R, cross=cross, prefix_by_seed=by_seed)


def prefix_tables(per_study: dict[str, dict], least: int = 4) -> dict:
    """RhoErrors' prefix fields from the studies: bias and sd of a prefix's log rho per batch ratio d (rows, the
    sizes measured) and length f (columns); a cell with fewer than `least` samples takes the value pooled over every
    ratio at its length."""
    pooled = {f: np.concatenate([e["prefix"][f] for e in per_study.values()]) for f in PREFIX_F}
    cells: dict[float, dict[float, list]] = {}
    for e in per_study.values():
        for (P, f), xs in e["prefix_at"].items():
            cells.setdefault(math.log2(P / e["ref_p"]), {}).setdefault(f, []).extend(xs)
    ds = sorted(cells)
    stat = lambda d, f, fn: float(fn(cells[d][f] if len(cells[d].get(f, ())) >= least else pooled[f]))  # noqa: E731
    return dict(prefix_f=PREFIX_F, prefix_d=tuple(ds),
                prefix_bias=tuple(tuple(stat(d, f, np.mean) for f in PREFIX_F) for d in ds),
                prefix_sd=tuple(tuple(stat(d, f, np.std) for f in PREFIX_F) for d in ds))


def shared_var(per_study: dict[str, dict]) -> float:
    """The variance in log T that one seed's pilots share (each read against that seed's reference run): over every
    seed of every study, the mean product of two different pilots' errors (`pilot_T`), at least 0."""
    prods = [np.mean([a * b for i, a in enumerate(e) for j, b in enumerate(e) if i != j])
             for st in per_study.values() for e in st["pilot_T"] if len(e) > 1]
    return max(float(np.mean(prods)), 0.0) if prods else 0.0


def shared_table(per_study: dict[str, dict]) -> dict:
    """What the pilots of one reference share, per study (JSON key `shared_noise`): the within-seed covariance of the
    runs to the target's errors in log T (`shared_var`, unclamped), their variance, and per prefix length the mean
    product of a prefix's error and another size's run-to-target error (log rho; near 0: a prefix shares none)."""
    def row(st: dict) -> dict:
        cov = float(np.mean([np.mean([a * b for i, a in enumerate(e) for j, b in enumerate(e) if i != j])
                             for e in st["pilot_T"] if len(e) > 1]))
        return dict(shared_cov=cov, variance=float(np.mean([x * x for e in st["pilot_T"] for x in e])),
                    prefix_x_full={str(f): float(np.mean(v)) if v else math.nan for f, v in st["cross"].items()},
                    prefix_x_prefix=prefix_shared(st["prefix_by_seed"]))
    return {name: row(st) for name, st in per_study.items()}


def prefix_shared(by_seed: dict[tuple[int, int, float], float]) -> dict:
    """What the prefixes of one seed share (read against its one reference run's curve): per length f, the mean
    product of two prefixes' errors at other sizes, each less the mean error of its size and length (its bias), the
    mean variance of those, and the pairs (JSON key `shared_noise`, `prefix_x_prefix`)."""
    mean: dict[tuple[int, float], list] = {}
    for (_, P, f), e in by_seed.items():
        mean.setdefault((P, f), []).append(e)
    d = {k: e - float(np.mean(mean[k[1:]])) for k, e in by_seed.items()}
    out = {}
    for f in sorted({k[2] for k in d}):
        prods, var = [], []
        for s in sorted({k[0] for k in d}):
            xs = [e for (s_, _, f_), e in sorted(d.items()) if s_ == s and f_ == f]
            prods += [a * b for i, a in enumerate(xs) for b in xs[i + 1:]]
            var += [a * a for a in xs]
        out[str(f)] = dict(shared_cov=float(np.mean(prods)) if prods else math.nan, variance=float(np.mean(var)),
                           pairs=len(prods))
    return out


def all_errors(per_study: dict[str, dict], model: str) -> RhoErrors:
    """The error curves of every study, with the noise levels pooled over them."""
    curves, sources = [], []
    for name, e in per_study.items():
        for k, c in enumerate(e["curves"][model]):
            curves.append(c)
            sources.append(f"{name} seed{k}")
    pool = lambda key: np.concatenate([e[key] for e in per_study.values()])  # noqa: E731
    pilot, sigma, pilot_sig = pool("pilot"), pool("sigma"), pool("pilot_sigma")
    seed_sd = float(np.sqrt(np.mean(pilot ** 2)))
    n_seeds = np.mean([len(e["curves"][model]) for e in per_study.values()])
    return RhoErrors(np.log2(np.array(SIZES, float) / REF_P), np.array(curves), tuple(sources), seed_sd,
                     seed_sd / math.sqrt(max(n_seeds - 1, 1)), float(np.sqrt(np.mean(sigma ** 2))), model,
                     mirrored=model == "noise-scale", pilot_sigma_sd=float(np.sqrt(np.mean(pilot_sig ** 2))),
                     shared_sd=math.sqrt(shared_var(per_study)), **prefix_tables(per_study))


def prefix_table(per_study: dict[str, dict]) -> dict:
    """How well a prefix predicts rho, per study and pooled: at each prefix length f (a fraction of the reference's
    samples-to-target), the mean and sd of log(rho from the prefix / rho of the other seeds' means) over (seed, size),
    the number of pairs it could be read on, and a run to the target's sd for comparison (`pilot`)."""
    def row(es: dict, full) -> dict:
        out = {str(f): dict(bias=float(np.mean(es[f])), sd=float(np.std(es[f])), n=len(es[f])) for f in PREFIX_F}
        out["to the target"] = dict(bias=float(np.mean(full)), sd=float(np.std(full)), n=len(full))
        return out

    table = {name: row(e["prefix"], e["pilot"]) for name, e in per_study.items()}
    table["pooled"] = row({f: np.concatenate([e["prefix"][f] for e in per_study.values()]) for f in PREFIX_F},
                          np.concatenate([e["pilot"] for e in per_study.values()]))
    return table


def cut(path: Path, responses: float):
    """The trace at `path` as if stopped after `responses` training responses: a prefix pilot (rows of later steps
    dropped; rows with no step, the calibration's, kept)."""
    t = read_trace(path)
    u = t.rows("update")
    last = int(np.searchsorted(np.cumsum(u["num_responses"]), responses, side="right"))  # updates within it
    step, is_eval = t.table["step"], pc.equal(t.table["kind"], "eval")
    keep = pc.if_else(is_eval, pc.less_equal(t.table["cum_responses"], responses),
                      pc.or_(pc.is_null(step), pc.less(step, last)))
    return replace(t, table=t.table.filter(keep))


def plan_seed(spec: StudySpec, runs: dict[int, list[dict]], s: int, errors: dict[str, RhoErrors],
              rule: dict | None = None) -> dict:
    """Plan from seed s's reference, feed it s's own runs as the pilots it asks for (a run to the target costs the
    responses it took to get there, or its budget where it never did; a prefix costs its length), until it decides."""
    ref = read_trace(runs[spec.ref_p][s]["path"])
    budget = runs[spec.ref_p][s]["trained"]
    again = rerun_of(spec, s, runs[spec.ref_p][s]["target"])
    given: dict[int, tuple] = {}  # P -> (trace, prefix?); the reference's P: its second run
    spent = 0.0

    def plan_again(left: float):
        least = min(spec.sizes) * spec.group  # the budget spent: no pilot costs this little, and it is valid
        cfg = PlanConfig(prompts=spec.sizes, group=spec.group, budget=max(left, least), **(rule or {}))
        return plan(ref, cfg, pilots=[t for t, _ in given.values()], errors=errors, target=spec.target, bounds_ok=True)

    first = p = plan_again(budget)
    while p.decision is None:
        nxt = next((x for x in p.pilots if (again is not None or not x.again)
                    and (x.prompts not in given or (given[x.prompts][1] and not x.prefix))), None)
        if nxt is None:
            break
        run = again if nxt.again else runs[nxt.prompts][s]
        length = max(nxt.responses, run["evals"][min(2, len(run["evals"]) - 1)])  # its recording's evals: two past 0
        cost = min(length, run["trained"]) if nxt.prefix else run["n"]
        if spent + cost > budget:
            break
        given[nxt.prompts] = (cut(run["path"], length) if nxt.prefix else read_trace(run["path"]), nxt.prefix)
        spent += cost
        p = plan_again(budget - spent)
    if p.decision is None:  # a pilot it asked for costs more than is left: plan once more with none affordable
        p = plan_again(0.0)
    chosen = p.decision or next(c for c in p.candidates if c.prompts == spec.ref_p)  # no move: the reference runs on
    ref_alone = min(first.candidates, key=lambda c: c.time_to_target_ratio)
    return dict(seed=s, pick=chosen.prompts, decided=p.decision is not None, p_within_5pct=chosen.p_within_5pct,
                expected_regret=chosen.expected_regret, why=p.why,
                pilots=[f"{P}{' prefix' if pre else ' again' if P == spec.ref_p else ''}"
                        for P, (_, pre) in given.items()],
                pilot_cost=spent / budget, ref_alone_pick=ref_alone.prompts)


def one_pilot_bound(spec: StudySpec, runs: dict[int, list[dict]]) -> dict:
    """What one one-seed pilot can buy at best: pilot size j on seed s, keep it if its measured T beats the reference's
    (both seed s), score against the other seeds' means; the median regret per j, and the best j in hindsight."""
    per, R, sizes = {}, spec.ref_p, list(spec.sizes)
    for j in sizes:
        if j == R:
            continue
        regrets = []
        for s in range(spec.seeds):
            others = [k for k in range(spec.seeds) if k != s]
            T_obs = (runs[j][s]["n"] / runs[R][s]["n"]) / (runs[j][s]["rps"] / runs[R][s]["rps"])
            regrets.append(regret(truth(runs, others, R), sizes.index(j if T_obs < 1 else R)))
        per[j] = float(np.median(regrets))
    best = min(per, key=per.get)
    return dict(median_regret_by_pilot=per, best_pilot_in_hindsight=best, best_median_regret=per[best])


def evaluate_study(spec: StudySpec, runs: dict[int, list[dict]], errors: dict[str, RhoErrors], rng: np.random.Generator,
                   rule: dict | None = None) -> dict:
    """Every seed's plan scored against the other seeds' means (module doc), with the baselines; `rule`: PlanConfig
    fields of the decision rule (confidence, slack), default theirs."""
    if not math.isfinite(spec.target):
        spec = replace(spec, target=runs[spec.ref_p][0]["target"])
    rows, sizes, R = [], list(spec.sizes), spec.ref_p
    for s in range(spec.seeds):
        r = plan_seed(spec, runs, s, errors, rule)
        others = [k for k in range(spec.seeds) if k != s]
        T = truth(runs, others, R)
        draws = resample_T(seed_runs(runs, others)[sizes.index(R)], seed_runs(runs, others), rng, draws=500)
        i = sizes.index(r["pick"])
        r.update(regret=regret(T, i), regret_interval=regret_interval(draws, i), best=sizes[int(np.argmin(T))],
                 keep_reference_regret=regret(T, sizes.index(R)), largest_batch_regret=regret(T, len(sizes) - 1),
                 ref_alone_regret=regret(T, sizes.index(r["ref_alone_pick"])))
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
    reg = spec.registered or spec.name
    pre = json.loads((ROOT / "docs" / "study" / f"{reg}_plan_preregistered.json").read_text())
    return replace(spec, target=float(pre["target"]))


def _rounded(v):
    """Floats (in lists, to any depth) to 4 decimals: what the studies resolve."""
    return round(v, 4) if isinstance(v, float) else [_rounded(x) for x in v] if isinstance(v, list) else v


def write_errors(errors: dict[str, RhoErrors]) -> None:
    """Store the measured curves in rlsim/replay/rho_errors.py's DATA (the line after its marker)."""
    path = ROOT / "replay" / "rho_errors.py"
    text = path.read_text()
    def block(e: RhoErrors) -> str:  # one curve a line, rounded to what the studies resolve, within 120 columns
        d = {k: _rounded(v) for k, v in e.to_dict().items()}
        rows = ",\n".join("        " + json.dumps(c) for c in d.pop("curves"))
        head = pprint.pformat(d, width=112, sort_dicts=False).replace("\n", "\n    ")[1:-1]  # Python literals
        return "{" + head + ',\n     "curves": [\n' + rows + "]}"

    data = "{\n" + ",\n".join(f"    {json.dumps(m)}: {block(e)}" for m, e in errors.items()) + "}"
    new = re.sub(r"DATA: dict\[str, dict\] = .*\Z", "DATA: dict[str, dict] = " + data + "\n", text, flags=re.S)
    path.write_text(new)


def folder_spec(a: argparse.Namespace) -> StudySpec:
    """The study a command line names (--folder, --prefix, --seeds, --ref-p, --sizes, --group, --target)."""
    sizes = tuple(int(x) for x in a.sizes.split(","))
    if a.ref_p not in sizes:
        raise SystemExit(f"error: --ref-p {a.ref_p} is not one of --sizes {a.sizes}")
    return StudySpec(a.name or Path(a.folder).name, a.folder, a.prefix, a.seeds, a.target, sizes, a.ref_p, a.group)


def _args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the evaluation here (docs/study/plan_eval.json)")
    ap.add_argument("--write-errors", action="store_true", help="store every study's error curves for rlsim plan")
    ap.add_argument("--studies", default=",".join(s.name for s in STUDIES), help="comma list of study names")
    ap.add_argument("--preregister", help="write a fresh study's target and plans from its references here, and stop "
                    "(the study --folder names, else the newest study in FRESH)")
    ap.add_argument("--fresh", action="store_true",
                    help="also score the fresh study (FRESH) with the shipped error curves")
    ap.add_argument("--confidence", type=float, default=PlanConfig.confidence,
                    help="PlanConfig.confidence: the guard on moves made on predictions alone")
    ap.add_argument("--measured-confidence", type=float, default=PlanConfig.measured_confidence,
                    help="PlanConfig.measured_confidence: the guard on moves to a measured candidate")
    ap.add_argument("--slack", type=float, default=PlanConfig.slack,
                    help="PlanConfig.slack: how far a truth may lie off the recorded error curves (sd, log T)")
    ap.add_argument("--prefix-moves", action=argparse.BooleanOptionalAction, default=PlanConfig.prefix_moves,
                    help="PlanConfig.prefix_moves: whether a candidate read by a prefix alone may be picked (off: a "
                         "move needs a run to the target, prefixes only steer)")
    ap.add_argument("--second-runs", action="store_true",
                    help="print each study's references against their second runs (samples-to-target, warm-up loss), "
                         "and stop")
    ap.add_argument("--no-again", dest="again", action="store_false",
                    help="PlanConfig.again False: no second run of the reference among the pilots, an ablation")
    ap.add_argument("--draw-seed", type=int, default=PlanConfig.seed,
                    help="PlanConfig.seed: the seed of every plan's draws (the scores' Monte Carlo noise: run several)")
    ap.add_argument("--shared-sd", type=float, default=None,
                    help="RhoErrors.shared_sd for every plan (default: measured on the studies; 0: pilots' noise taken "
                         "as independent), an ablation")
    g = ap.add_argument_group("any recorded study (scored with the shipped error curves, as the fresh one)")
    g.add_argument("--folder", help="the study's folder (its runs: PREFIX_p{P}_s{seed}.parquet)")
    g.add_argument("--prefix", default="grpo", help="file prefix of its runs")
    g.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    g.add_argument("--ref-p", type=int, default=REF_P, help="the reference's P")
    g.add_argument("--sizes", default=",".join(map(str, SIZES)), help="the sizes recorded, comma list")
    g.add_argument("--group", type=int, default=G, help="G of every run")
    g.add_argument("--target", type=float, default=math.nan, help="target score (default: 90 %% of the worst "
                                                                  "reference's best)")
    g.add_argument("--name", help="the study's name in the output (default: the folder's)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = _args(argv)
    if a.second_runs:
        for spec in (*STUDIES, *map(_with_target, FRESH)):
            for r in second_runs(spec):
                print(f"{spec.name:16s} seed {r['seed']}: {r['first']:8.0f} -> {r['second']:8.0f} responses, log ratio "
                      f"{r['log_ratio']:+.2f}; warm-up loss {r['first_loss']:.6g} / {r['second_loss']:.6g}"
                      f"{'' if r['same_model'] else ' (another build of the model: left out)'}")
        return 0
    if a.preregister:
        try:
            preregister(folder_spec(a) if a.folder else [f for f in FRESH if not f.registered][-1], Path(a.preregister))
        except RlsimError as e:
            raise SystemExit(f"error: {e}")
        return 0
    rng, rule = np.random.default_rng(0), dict(confidence=a.confidence, slack=a.slack,
                                                  measured_confidence=a.measured_confidence, seed=a.draw_seed,
                                                  prefix_moves=a.prefix_moves, again=a.again)
    if a.shared_sd is not None and not a.shared_sd >= 0:
        raise SystemExit(f"error: --shared-sd must be 0 or more (an sd in log T), got {a.shared_sd}")
    force = (lambda es: es) if a.shared_sd is None else (  # noqa: E731
        lambda es: {m: replace(e, shared_sd=a.shared_sd) for m, e in es.items()})
    if a.folder:  # one study from the command line, scored with the error curves rlsim plan ships
        spec = folder_spec(a)
        try:
            runs = runs_of(spec)
        except RlsimError as e:
            raise SystemExit(f"error: {e}")
        shipped = force({m: measured_errors(m) for m in ("noise-scale", "invariant")})
        out = {"studies": [], "fresh": [evaluate_study(spec, runs, shipped, rng, rule)]}
    else:
        specs = [s for s in STUDIES if s.name in a.studies.split(",")]
        runs = {s.name: runs_of(s) for s in specs}
        per = {s.name: error_curves(s, runs[s.name]) for s in specs}
        errors = {m: all_errors(per, m) for m in ("noise-scale", "invariant")}
        out = {"studies": [evaluate_study(s, runs[s.name], force(_without(errors, per, s.name)), rng, rule)
                           for s in specs],
               "fresh": [evaluate_study(_with_target(f), runs_of(_with_target(f)), force(errors), rng, rule)
                         for f in FRESH] if a.fresh else [], "prefix_noise": prefix_table(per),
               "prefix_by_ratio": _json_tables(prefix_tables(per)), "shared_noise": shared_table(per)}
        if a.fresh:  # measured on the fresh studies too, for the record: nothing the plan uses comes from them
            fresh = {f.name: error_curves(f, runs_of(f)) for f in map(_with_target, FRESH)}
            out["shared_noise_fresh"] = shared_table(fresh)
    out.update(method=__doc__.split("\n\n")[0], rule=rule)
    _table(out["studies"] + out["fresh"])
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=float) + "\n")
    if a.write_errors and not a.folder:
        write_errors(errors)
    return 0


def _json_tables(t: dict) -> dict:
    """prefix_tables' output keyed for JSON: {d: {f: [bias, sd]}}."""
    return {f"{d:g}": {str(f): [b, s] for f, b, s in zip(t["prefix_f"], bias, sd)}
            for d, bias, sd in zip(t["prefix_d"], t["prefix_bias"], t["prefix_sd"])}


def _without(errors: dict[str, RhoErrors], per: dict[str, dict], study: str) -> dict[str, RhoErrors]:
    """The error curves, shared pilot noise and prefix noise of every study but `study` (leave-one-study-out)."""
    others = {k: v for k, v in per.items() if k != study}
    return {m: replace(e.without(study), shared_sd=math.sqrt(shared_var(others)), **prefix_tables(others))
            for m, e in errors.items()}


def _table(rows: list[dict]) -> None:
    print(f"{'study':16s} {'median regret':>14s} {'max':>6s} {'keep ref':>9s} {'largest':>8s} {'ref-alone':>9s} "
          f"{'pilot cost':>10s} {'confident':>9s} {'1 pilot, best in hindsight':>27s}")
    for r in rows:
        one = r["one_pilot"]
        print(f"{r['name']:16s} {r['median_regret']:14.1%} {r['max_regret']:6.1%} {r['keep_reference_regret']:9.1%} "
              f"{r['largest_batch_regret']:8.1%} {r['ref_alone_regret']:9.1%} {r['pilot_cost']:10.2f} "
              f"{r['confident']:>6d}/{r['seeds']} {one['best_median_regret']:>20.1%} "
              f"(P={one['best_pilot_in_hindsight']})")


if __name__ == "__main__":
    raise SystemExit(main())
