"""A split what-if's interval ends simulated over the first END_UPDATES updates (read as a ratio to the point's own
first as many) against ends simulated at full length: how far the ends move, and what each costs.

    python -m bench.split_ends [--imported]     # CPU splits of the shipped traces; --imported: bench/published logs
    python -m bench.split_ends --steady         # the point simulation stopped early, against every update
    python -m bench.split_ends --segments       # replicas planning segments against one stretch per event

`--steady`: a split's point simulation stops early (`rlsim.modes.split.STEADY_REQUESTS`) and repeats its updates
past the fill. Per case (the CPU splits at large batches, the imported logs) and seeds 0-4: responses/s as shipped
and with 10 updates simulated, against every update simulated; the largest error, which STEADY_ERROR bounds.

`--segments`: per case (the CPU splits of --steady, the imported logs), 10 updates simulated with the replicas
planning stretches ahead in segments (`rlsim.modes.replica.SEGMENT_FINISHES`, as shipped) and one stretch per
SimPy event (SEGMENT_FINISHES = 1), alternating in a random order in one process: wall seconds (median) and the
largest relative difference of the per-update times, which should be rounding.

Per case, in one process, the two ways alternate (the order drawn at random per repeat) so the machine's drift
cancels; every end's sigma and responses/s are compared, the largest relative difference printed. Both ways use
fresh Study objects, so no cached simulation serves the other. Timings are wall seconds of `evaluate` (the point
simulation and every end); run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.published import import_reference
from bench.run_speed import imported_whatifs
from rlsim.core.config import WhatIf
from rlsim.replay.io import read_trace
from rlsim.whatif import intervals
from rlsim.whatif.predict import evaluate
from rlsim.modes import replica
from rlsim.modes.registry import simulate
from rlsim.whatif.study import models_for, prepare, sim_config

ROOT = Path(__file__).resolve().parents[1]
CPU = (("grpo_p128.parquet", WhatIf(prompts=128, gen_gpus=1, train_gpus=1, staleness=0)),
       ("grpo_p128.parquet", WhatIf(prompts=256, gen_gpus=1, train_gpus=1, staleness=1)),
       ("grpo_p128.parquet", WhatIf(prompts=512, gen_gpus=1, train_gpus=1, staleness=2)),
       ("grpo_p128.parquet", WhatIf(prompts=256, gen_gpus=1, train_gpus=1, staleness=1, partial_rollout=True)))
# splits of more than STEADY_REQUESTS responses in all (100 updates), where the point simulation stops early
STEADY_CPU = (("grpo_p128.parquet", WhatIf(prompts=2048, gen_gpus=1, train_gpus=1, staleness=1)),
              ("grpo_p128.parquet", WhatIf(prompts=4096, gen_gpus=1, train_gpus=1, staleness=2, partial_rollout=True)),
              ("grpo_p128.parquet", WhatIf(prompts=2048, mode="fully_async", gen_gpus=1, train_gpus=1,
                                           staleness_threshold=0.5, trigger_parameter_sync_step=4)),
              # small batches in verl V1's and NeMo RL's modes: the noisiest updates, so the budget binds there
              ("grpo_p128.parquet", WhatIf(prompts=256, mode="separate_async", gen_gpus=2, train_gpus=2)),
              ("grpo_p128.parquet", WhatIf(prompts=256, mode="nemo_async", gen_gpus=2, train_gpus=2,
                                           max_trajectory_age_steps=1, in_flight_weight_updates=True)))
SHORT = intervals.END_UPDATES  # the shipped length, restored for the short way
KEYS = ("sigma_lo", "sigma_hi", "responses_per_s_lo", "responses_per_s_hi")


def one(trace: Path, cfg: WhatIf, short: bool) -> tuple[dict, float]:
    """(the interval's fields, wall seconds of evaluate) with the ends short or at full length."""
    study = prepare([read_trace(trace)])
    intervals.END_UPDATES = SHORT if short else 10 ** 9
    t = time.perf_counter()
    out = evaluate(study, cfg)
    return {k: getattr(out, k) for k in KEYS}, time.perf_counter() - t


def compare(cases, repeats: int) -> list[tuple]:
    rows, rng = [], random.Random(0)
    for trace, cfg in cases:
        times = {True: [], False: []}
        fields = {}
        for _ in range(repeats):
            for short in rng.sample([True, False], 2):
                fields[short], t = one(trace, cfg, short)
                times[short].append(t)
        diff = max(abs(fields[True][k] / fields[False][k] - 1) for k in KEYS)
        rows.append((f"{trace.stem} P {cfg.prompts or 'as logged'}, {cfg.gen_gpus}+{cfg.train_gpus}"
                     f"{'' if cfg.staleness is None else f', staleness {cfg.staleness}'}"
                     f"{', partial' if cfg.partial_rollout else ''}{', ' + cfg.mode if cfg.mode else ''}"
                     f", {cfg.updates} updates",
                     fields[False], fields[True], diff, statistics.median(times[False]),
                     statistics.median(times[True])))
    intervals.END_UPDATES = SHORT
    return rows


def steady(cases, seeds=(0, 1, 2, 3, 4), short: int = 10) -> list[float]:
    """Per case and seed: responses/s of the split's point simulation as shipped (`rlsim.modes.split`: the first
    updates simulated, the rest repeating them) and with `short` updates simulated, each against every update
    simulated; the shipped way's relative errors."""
    print(f"| case | seed | updates simulated | first update s | responses/s, every update | shipped, error | "
          f"{short} updates, error | s every / shipped |")
    print("|---|---|---|---|---|---|---|---|")
    errs = []
    for trace, cfg in cases:
        study = prepare([read_trace(trace)])
        for seed in seeds:
            c = replace(cfg, seed=seed)
            m, sc = models_for(study, c)[0], sim_config(study, c)
            runs, secs = {}, {}
            for k in (None, 10 ** 9, short):
                t = time.perf_counter()
                runs[k] = simulate(m, sc, rng=np.random.default_rng(seed), max_rounds=k)
                secs[k] = time.perf_counter() - t
            full = runs[10 ** 9].responses_per_s
            e, e_short = (runs[k].responses_per_s / full - 1 for k in (None, short))
            errs.append(e)
            what = f"{trace.stem} P {sc.prompts}{', ' + cfg.mode if cfg.mode else ''}"
            print(f"| {what} | {seed} | {runs[None].rounds_simulated} of {sc.updates} | "
                  f"{runs[10 ** 9].step_time[0]:.4g} | {full:.5g} | {100 * e:+.2f} % | {100 * e_short:+.2f} % | "
                  f"{secs[10 ** 9]:.1f} / {secs[None]:.1f} |")
    print(f"shipped: largest |error| {100 * max(map(abs, errs)):.2f} % over {len(errs)} runs")
    return errs


def segments(cases, repeats: int) -> None:
    """Per case: 10 updates simulated with segments and stretch by stretch, alternating (module doc), and the
    stretches a segment holds on average as shipped."""
    print("| case | s, stretch by stretch | s, segments | speed-up | stretches per segment | "
          "largest difference of update times |")
    print("|---|---|---|---|---|---|")
    rng, plan, sizes = random.Random(0), replica.Replica.plan, []

    def counted(self, *a):
        seg = plan(self, *a)
        sizes.append(len(seg.rows))
        return seg

    for trace, cfg in cases:
        study = prepare([read_trace(trace)])
        m, sc = models_for(study, cfg)[0], sim_config(study, cfg)
        secs, runs = {1: [], replica.SEGMENT_FINISHES: []}, {}
        for _ in range(repeats):
            for k in rng.sample(list(secs), 2):
                replica.SEGMENT_FINISHES, shipped = k, replica.SEGMENT_FINISHES
                t = time.perf_counter()
                runs[k] = simulate(m, sc, rng=np.random.default_rng(cfg.seed), max_rounds=10)
                secs[k].append(time.perf_counter() - t)
                replica.SEGMENT_FINISHES = shipped
        sizes.clear()
        replica.Replica.plan = counted  # one more run, untimed, to count the segments' stretches
        simulate(m, sc, rng=np.random.default_rng(cfg.seed), max_rounds=10)
        replica.Replica.plan = plan
        one, seg = (statistics.median(secs[k]) for k in secs)
        a, b = (runs[k].step_time for k in secs)
        what = f"{trace.stem} P {sc.prompts}{', ' + cfg.mode if cfg.mode else ''}"
        print(f"| {what} | {one:.2f} | {seg:.2f} | {one / seg:.1f}x | {statistics.mean(sizes):.1f} | "
              f"{float(np.max(np.abs(b / a - 1))):.1e} |")


def imported_cases(work: Path) -> list[tuple[Path, WhatIf]]:
    # at the update count `rlsim run` simulates by default (bench.published asks for fewer)
    return [(import_reference(g, work), replace(w, updates=WhatIf().updates)) for g, w in imported_whatifs()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--imported", action="store_true", help="the imported published logs of bench.run_speed too")
    ap.add_argument("--steady", action="store_true",
                    help="the point simulation stopped early (as shipped) against every update simulated")
    ap.add_argument("--segments", action="store_true",
                    help="replicas planning segments (as shipped) against one stretch per SimPy event")
    ap.add_argument("--repeats", type=int, default=3, help="alternations per case (the median time is printed)")
    ap.add_argument("--end-updates", type=int, default=None,
                    help="updates the short ends simulate (default: intervals.END_UPDATES, as shipped)")
    a = ap.parse_args()
    if a.repeats < 1:
        raise SystemExit(f"error: --repeats must be 1 or more, got {a.repeats}")
    if a.end_updates is not None:
        if a.end_updates < 2:
            raise SystemExit(f"error: --end-updates must be 2 or more, got {a.end_updates}")
        global SHORT
        SHORT = a.end_updates
    if a.segments:
        with tempfile.TemporaryDirectory() as tmp:
            segments([(ROOT / "traces" / t, w) for t, w in STEADY_CPU] + imported_cases(Path(tmp)), a.repeats)
        return
    if a.steady:
        with tempfile.TemporaryDirectory() as tmp:
            steady([(ROOT / "traces" / t, w) for t, w in STEADY_CPU] + imported_cases(Path(tmp)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(ROOT / "traces" / t, w) for t, w in CPU] + (imported_cases(Path(tmp)) if a.imported else [])
        rows = compare(cases, a.repeats)
    print(f"| case | sigma ends, full | sigma ends, {SHORT} updates | largest end difference | s full | "
          "s short |")
    print("|---|---|---|---|---|---|")
    for what, full, short, diff, t_full, t_short in rows:
        print(f"| {what} | {full['sigma_lo']:.3f}..{full['sigma_hi']:.3f} | {short['sigma_lo']:.3f}.."
              f"{short['sigma_hi']:.3f} | {100 * diff:.2f} % | {t_full:.2f} | {t_short:.2f} |")


if __name__ == "__main__":
    main()
