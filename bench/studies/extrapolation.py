"""Sigma against a paired truth: fit an ordinary recording at one size, predict sigma at others, and compare
with `rlrun probe`'s measurement of the same sizes in one process.

Two recordings made minutes apart differ by the machine's drift (5-10 % between processes here), as much as
the error being measured; `rlrun probe` runs full RL steps at every size in shuffled rounds in one process, so
each round's ratio of responses/s to the smallest size is free of the drift between rounds
(`rlsim.replay.probe.probe_sigma`). Per configuration (algorithm, task, G, sizes up to 16x apart):

- an ordinary calibrated recording at the smallest size (`rlrun record`, STEPS updates), the reference;
- a probe of all the sizes (`rlrun probe --rounds ROUNDS`), the truth;
- prediction: `rlsim run --trace reference --batch P` for each larger size, in process (`evaluate`): sigma and
  its 90 % interval (`rlsim.replay.evaluation.SigmaCase`, `sigma_summary`).

The split: `bench.studies.split_fidelity` predicts split runs (1 + 1 cores) from a colocated recording alone.

Targets (issue "sigma you can trust"): |error| median <= 3 %, max <= 8 %; the interval holds the paired value
in >= 80 % of cases. Recordings are serialised with `flock /tmp/rlsim-heavy.lock` and resumable (a complete
trace is kept).

    python -m bench.studies.extrapolation                  # record what is missing (~15 min on 2 quiet cores), analyse
    python -m bench.studies.extrapolation --only 1 --steps 4 --rounds 1   # smoke test
    python -m bench.studies.extrapolation --no-record      # analyse what is recorded
    python -m bench.studies.extrapolation --no-record --write docs/study/sigma_paired.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.studies.recording import ROOT, complete, run_locked, tool
from rlsim.core.config import WhatIf
from rlsim.replay.evaluation import SigmaCase, sigma_summary
from rlsim.replay.io import read_trace
from rlsim.replay.probe import probe_sigma
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

# (name, algo, task, G, sizes P): ratios up to 16x, G 4 to 16, GRPO and PPO, one addmix
CONFIGS = [
    ("grpo_add2_g8", "grpo", "add2", 8, (16, 64, 256)),
    ("grpo_add2_g4", "grpo", "add2", 4, (32, 128, 512)),
    ("grpo_add2_g16", "grpo", "add2", 16, (8, 32, 128)),
    ("ppo_add2", "ppo", "add2", 1, (64, 256, 1024)),
    ("grpo_addmix_g8", "grpo", "addmix", 8, (16, 64, 256)),
]
STEPS, ROUNDS = 16, 4
TARGETS = {"median_abs_error": 0.03, "max_abs_error": 0.08, "coverage": 0.80}


def _common(algo: str, task: str, G: int) -> list[str]:
    return ["--algo", algo, "--task", task] + (["--group", str(G)] if algo == "grpo" else [])


def paths(out: Path, name: str, steps: int, rounds: int) -> tuple[Path, Path]:
    return out / f"{name}_ref_s{steps}.parquet", out / f"{name}_probe_r{rounds}v2.parquet"


def record(out: Path, configs, steps: int, rounds: int) -> None:
    """The reference recording and the probe of each configuration, what is not recorded already."""
    out.mkdir(parents=True, exist_ok=True)
    for name, algo, task, G, sizes in configs:
        ref, probe = paths(out, name, steps, rounds)
        if not complete(ref, steps):
            run_locked([tool("rlrun"), "record", *_common(algo, task, G), "--prompts", str(sizes[0]),
                        "--steps", str(steps), "--eval-every", "0", "--eval-prompts", "16", "--eval-k", "1",
                        "--no-progress", "--overwrite", "--out", str(ref)])
        if not _probe_complete(probe):
            run_locked([tool("rlrun"), "probe", *_common(algo, task, G), "--prompts", ",".join(map(str, sizes)),
                        "--rounds", str(rounds), "--overwrite", "--out", str(probe)])


def _probe_complete(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        return read_trace(path).meta.get("status") == "complete"
    except Exception:  # noqa: BLE001 - an unreadable partial file is recorded again
        return False


def cases(out: Path, configs, steps: int, rounds: int) -> list[SigmaCase]:
    """Every larger size of every configuration: sigma predicted from the reference recording against the probe's."""
    found = []
    for name, *_ in configs:
        ref, probe = paths(out, name, steps, rounds)
        if not (ref.exists() and probe.exists()):
            print(f"{name}: not recorded, left out")
            continue
        study = prepare([read_trace(ref)])
        truth = probe_sigma(probe)
        b_ref = min(r.responses for r in truth.rows)
        for row in truth.rows:
            if row.responses == b_ref:
                continue
            o = evaluate(study, WhatIf(prompts=row.prompts))
            found.append(SigmaCase(name, b_ref, row.responses, o.sigma, o.sigma_lo, o.sigma_hi, row.sigma,
                                   row.sigma_lo, row.sigma_hi))
    return found


def table(found: list[SigmaCase]) -> str:
    lines = ["| configuration | B_ref -> B | sigma predicted (90 %) | sigma measured, paired (90 % over rounds) | "
             "error | interval holds it |",
             "|---|---|---|---|---|---|"]
    for c in found:
        lines.append(f"| {c.name} | {c.b_ref} -> {c.b} ({c.b / c.b_ref:.0f}x) | {c.predicted:.3f} "
                     f"({c.lo:.3f}..{c.hi:.3f}) | {c.measured:.3f} ({c.measured_lo:.3f}..{c.measured_hi:.3f}) | "
                     f"{100 * c.error:+.1f} % | {'yes' if c.covered else 'no'} |")
    s = sigma_summary(found)
    lines.append("")
    lines.append(f"{s['cases']} cases: |error| median {100 * s['median_abs_error']:.1f} % (target <= 3 %), max "
                 f"{100 * s['max_abs_error']:.1f} % (target <= 8 %); the interval holds the paired value in "
                 f"{100 * s['coverage']:.0f} % (target >= 80 %)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "traces" / "sigma_paired"), help="folder of the recordings")
    ap.add_argument("--steps", type=int, default=STEPS, help="updates of each reference recording")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of each probe")
    ap.add_argument("--only", type=int, default=0, help="the first N configurations only (0: all)")
    ap.add_argument("--no-record", action="store_true", help="analyse what is recorded")
    ap.add_argument("--write", default=None, help="write the cases and the summary as JSON here")
    a = ap.parse_args()
    configs = CONFIGS[: a.only] if a.only else CONFIGS
    out = Path(a.out)
    if not a.no_record:
        record(out, configs, a.steps, a.rounds)
    found = cases(out, configs, a.steps, a.rounds)
    print(table(found))
    if a.write:
        Path(a.write).write_text(json.dumps({"summary": sigma_summary(found), "targets": TARGETS, "cases": [
            {**vars(c), "error": c.error, "covered": c.covered} for c in found]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
