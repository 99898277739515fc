"""How fast `rlsim run` is: the main command's stages (import, read + validate, fit, simulate) beside its end-to-end
time, and (`--scale`) end to end at larger batches and one config alone.

    python -m bench.run_speed [--runs N] [--trace TRACE] [--batch P] [--compile-every-run] [--scale] [--imported]

Timed runs hold /tmp/rlsim-heavy.lock (the lock `flock /tmp/rlsim-heavy.lock CMD` takes; the bench takes it
itself, so run it without that wrapper) and so never overlap other timings that take it; run it on a quiet
machine. Every number is the median over N fresh processes (default 7), after one untimed warm-up: each stage
timed in its own process in the order the CLI runs it (a stage's first call, so the lazy imports it triggers
count in it), and the installed `rlsim` script end to end. Target (issue 38): end to end <= 0.8 s for
`rlsim run --trace traces/grpo_p128.parquet --batch 2048`.

`--imported` (issue 36): `rlsim run` end to end on a verl fully_async, a NeMo RL async and an AReaL split row of
bench/published, each its group's reference log imported in process (as `rlsim import verl` does) and asked with
the row's mode and split as CLI flags, < 3 s each.

`--scale`: end to end at P=2048, G=8, 100 updates < 5 s; at P=65536 (B = 524288 responses per update) < 3 s and
< 1 GB peak resident memory; P=10,000,000 refused in one line (exit 2) in < 3 s; one config (P=1024, G=8,
100 updates) <= 0.5 s on one core. Those end-to-end rows run in a child process whose peak RSS is read with
getrusage(RUSAGE_CHILDREN) by a fresh wrapper process per run. P=128 is the floor (import, load, fit, reference
simulation). TRACE defaults to traces/grpo_p128.parquet, else a synthetic P=128, G=8 trace.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = "/tmp/rlsim-heavy.lock"
TARGET_S = 0.8  # issue 38: the main command end to end

# One fresh process: the CLI's stages in its order, each timed (wall and CPU seconds), printed as JSON.
STAGES = """
import json, sys, time
t = [(time.perf_counter(), time.process_time())]
import rlsim.cli
t.append((time.perf_counter(), time.process_time()))
import rlsim.cli.run
t.append((time.perf_counter(), time.process_time()))
from rlsim.core.config import WhatIf
from rlsim.replay.io import read_trace
from rlsim.replay.probe import refuse_probe
from rlsim.whatif.predict import evaluate, reference_outcome
from rlsim.whatif.study import prepare
cfg = WhatIf(prompts=int(sys.argv[2]))
t.append((time.perf_counter(), time.process_time()))
traces = [refuse_probe(read_trace(sys.argv[1]))]
t.append((time.perf_counter(), time.process_time()))
study = prepare(traces)
t.append((time.perf_counter(), time.process_time()))
evaluate(study, cfg), reference_outcome(study, cfg.updates, cfg.seed, like=cfg)
t.append((time.perf_counter(), time.process_time()))
print(json.dumps([[b[0] - a[0], b[1] - a[1]] for a, b in zip(t, t[1:])]))
"""
STAGE_NAMES = ("import rlsim.cli", "import the run command (rlsim.cli.run)", None, "read + validate the trace",
               "fit (prepare: cost models, calibration, CV, bootstrap)", "simulate candidate + reference, intervals")


def trace_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    default = ROOT / "traces" / "grpo_p128.parquet"
    if default.exists():
        return default
    from rlsim.replay.synthetic import SynthSpec, synthetic_trace

    out = Path(tempfile.mkdtemp()) / "synthetic_p128.parquet"
    return synthetic_trace(out, SynthSpec(prompts=128, group=8, steps=4, max_num_seqs=256, max_tokens=48, min_tokens=8))


@contextlib.contextmanager
def heavy_lock():
    """Hold the lock other timings take, waiting for it (and saying so) when another timing holds it."""
    with open(LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK}: another timing holds it (this bench takes it itself: do not wrap it in "
                  f"`flock {LOCK}`, which would wait forever)", file=sys.stderr)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def child_env(compile_every_run: bool) -> tuple[dict[str, str], str]:
    """The timed processes' environment and what it does with bytecode. By default as an installed rlsim runs:
    bytecode cached (where PYTHONDONTWRITEBYTECODE is set, the children cache it under a temporary
    PYTHONPYCACHEPREFIX instead of beside the sources; a warm-up run fills it)."""
    env = dict(os.environ)
    if compile_every_run:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env, "sources compiled on every run (PYTHONDONTWRITEBYTECODE=1)"
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="rlsim-pyc-")
    return env, "bytecode cached"


def _timed(argv: list[str], env: dict[str, str], **kw) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and its children, stdout) of one run of argv."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, cwd=ROOT, **kw).stdout
    t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, out


def stage_rows(trace: Path, batch: int, runs: int, env: dict[str, str]) -> list[tuple[str, list, float | None]]:
    """(what, [(wall s, CPU s) of each run], target) for each stage, the interpreter's start and the CLI end to end."""
    rlsim = Path(sys.executable).with_name("rlsim")
    cli = [str(rlsim), "run", "--trace", str(trace), "--batch", str(batch)]
    stages_argv = [sys.executable, "-c", STAGES, str(trace), str(batch)]
    _timed(stages_argv, env), _timed(cli, env)  # warm-up: bytecode and the file cache
    start, stages, total = [], [], []
    for _ in range(runs):  # interleaved, so that a slow spell of the machine touches every row alike
        start.append(_timed([sys.executable, "-c", "pass"], env)[:2])
        stages.append(json.loads(_timed(stages_argv, env)[2]))
        total.append(_timed(cli, env)[:2])
    rows = [("python start (python -c pass)", start, None)]
    rows += [(name, [s[i] for s in stages], None) for i, name in enumerate(STAGE_NAMES) if name]
    rows.append((f"rlsim run --trace {trace.name} --batch {batch}: end to end", total, TARGET_S))
    return rows


def print_stages(rows: list[tuple[str, list, float | None]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=title, caption="CPU: user + system seconds of the process (less sensitive than wall time to "
                                     "other work on the machine); the target is on the median wall time")
    for c in ("what", "median s", "min s", "max s", "median CPU s", "target s", "ok"):
        tab.add_column(c, justify="left" if c == "what" else "right")
    for what, ts, target in rows:
        wall = [w for w, _ in ts]
        med = statistics.median(wall)
        cpu = statistics.median(c for _, c in ts)
        tab.add_row(what, f"{med:.3f}", f"{min(wall):.3f}", f"{max(wall):.3f}", f"{cpu:.3f}",
                    "-" if target is None else f"<= {target:g}",
                    "-" if target is None else ("yes" if med <= target else "NO"))
    Console(width=150).print(tab)


def scale_rows(trace: Path) -> list[tuple]:
    """End to end at growing batches (peak RSS), and the simulation of one config alone on one core."""
    rlsim = Path(sys.executable).with_name("rlsim")
    rows = []
    # (prompts, runs, target seconds, target peak RSS MB, expected exit code)
    for P, runs, target, rss_target, rc in ((128, 3, None, None, 0), (2048, 3, 5.0, None, 0), (8192, 3, None, None, 0),
                                            (65536, 3, 3.0, 1024, 0), (10_000_000, 1, 3.0, None, 2)):
        ts, rss = [], []
        for _ in range(runs):
            t, m = _child([str(rlsim), "run", "--trace", str(trace), "--batch", str(P), "--group", "8", "--json"], rc)
            ts.append(t)
            rss.append(m)
        what = f"rlsim run end to end, P={P} G=8, 100 updates" + (" (refused, exit 2)" if rc else "")
        rows.append((what, min(ts), statistics.median(ts), target, max(rss), rss_target))

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from rlsim.core.config import WhatIf
    from rlsim.replay.io import read_trace
    from rlsim.whatif.predict import evaluate
    from rlsim.whatif.study import prepare

    t0 = time.perf_counter()
    study = prepare([read_trace(trace)])
    t_prep = time.perf_counter() - t0
    rows.append(("load + fit + reference simulation (one core)", t_prep, t_prep, None, None, None))
    for P in (1024, 2048, 4096, 8192, 65536):  # the simulation alone (P=8192, 65536: round by round)
        ts = []
        for seed in range(5):
            t0 = time.perf_counter()
            evaluate(study, WhatIf(prompts=P, group=8, updates=100, seed=seed))
            ts.append(time.perf_counter() - t0)
        rows.append((f"one config P={P} G=8, 100 updates (one core)", min(ts), statistics.median(ts),
                     0.5 if P == 1024 else None, None, None))
    return rows


# issue 36: `rlsim run` on a log imported from a published GPU run, asked with a mode and split, in < 3 s. Each case
# is a bench/published row (group id, row label): its group's reference log imported, the row's what-if as CLI flags.
IMPORTED = (("verl-7b-h20-gpus", "fully async 16:16"),
            ("nemo-rl-v05-qwen3-30b-a3b-grpo-h100", "1-step Off, 32 GPUs"),
            ("areal-v02-r1-distill-qwen-7b-ppo-h800", "4 nodes, 32 GPUs (sglang.d16p1m1+d8p2m1)"))
IMPORTED_TARGET_S = 3.0


def whatif_flags(w) -> list[str]:
    """`rlsim run`'s flags for the WhatIf `w` (the command's own spelling, `rlsim.cli.options.whatif_specs`): each
    field that differs from its default, except the update count (the command's default is what a user gets)."""
    from rlsim.cli.options import whatif_specs
    from rlsim.core.config import WhatIf

    out, default = [], WhatIf()
    for spec in whatif_specs():
        v = getattr(w, spec.field)
        if spec.field == "updates" or v == getattr(default, spec.field):
            continue
        flag = spec.flags[0]
        out += [flag if v else "--no-" + flag[2:]] if isinstance(v, bool) else [flag, str(v)]
    return out


def imported_whatifs() -> list[tuple[Any, Any]]:
    """(bench.published Group, WhatIf) per IMPORTED case: the row's what-if on its group's reference log
    (`bench.published.what_if`; the reference row itself asked as a split of its own devices, AReaL v0.2's
    synchronous split)."""
    from bench.published import load_groups, what_if
    from rlsim.core.config import WhatIf

    groups = {g.id: g for g in load_groups()}
    out = []
    for gid, label in IMPORTED:
        g = groups[gid]
        r = next(r for r in g.rows if r.label == label)
        out.append((g, WhatIf(staleness=0, gen_gpus=r.gen_gpus, train_gpus=r.train_gpus) if r is g.rows[0]
                    else what_if(g, g.rows[0], r)))
    return out


def imported_cases(work: Path) -> list[tuple[str, Path, list[str]]]:
    """(what, trace, flags) per IMPORTED case, its group's reference log imported under `work`."""
    from bench.published import import_reference

    return [(f"{g.id}: {label}", import_reference(g, work), whatif_flags(w))
            for (g, w), (_, label) in zip(imported_whatifs(), IMPORTED)]


def imported_rows(runs: int, env: dict[str, str]) -> list[tuple[str, list, float | None]]:
    """(what, [(wall s, CPU s) of each run], target) of `rlsim run` end to end on each imported case."""
    rlsim = Path(sys.executable).with_name("rlsim")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for what, trace, flags in imported_cases(Path(tmp)):
            argv = [str(rlsim), "run", "--trace", str(trace), *flags, "--json"]
            ts = [_timed(argv, env)[:2] for _ in range(runs)]
            rows.append((f"{what}\n  rlsim run --trace {trace.name} {' '.join(flags)}", ts, IMPORTED_TARGET_S))
    return rows


def print_scale(rows: list[tuple], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=title)
    for c in ("what", "best s", "median s", "target s", "peak RSS MB", "target MB", "ok"):
        tab.add_column(c, justify="left" if c == "what" else "right")
    for what, best, med, target, rss, rss_target in rows:
        ok = [med <= target] if target is not None else []
        ok += [rss <= rss_target] if rss_target is not None else []
        tab.add_row(what, f"{best:.3f}", f"{med:.3f}", "-" if target is None else f"< {target:g}",
                    "-" if rss is None else f"{rss:.0f}", "-" if rss_target is None else f"< {rss_target:g}",
                    "-" if not ok else ("yes" if all(ok) else "NO"))
    Console(width=140).print(tab)


def _child(argv: list[str], rc: int) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one run of argv, in a fresh wrapper so RUSAGE_CHILDREN is its own."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "p = subprocess.run(sys.argv[2:], capture_output=True, text=True)\n"
            "t = time.perf_counter() - t\n"
            "if p.returncode != int(sys.argv[1]) or (p.returncode and len(p.stderr.strip().splitlines()) != 1):\n"
            "    sys.exit(f'exit {p.returncode}: {p.stderr.strip()[-500:]}')\n"
            "print(t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(rc), *argv], check=True, capture_output=True,
                         text=True).stdout
    t, rss = out.split()
    return float(t), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per stage row (the median is the number)")
    ap.add_argument("--trace", help="trace to run on (default traces/grpo_p128.parquet)")
    ap.add_argument("--batch", type=int, default=2048, help="--batch of the timed command")
    ap.add_argument("--compile-every-run", action="store_true",
                    help="time with no bytecode cache (every run compiles rlsim's sources) instead of as installed")
    ap.add_argument("--scale", action="store_true", help="also the end-to-end rows at larger batches and one config")
    ap.add_argument("--imported", action="store_true",
                    help="also `rlsim run` end to end on published GPU runs' imported logs with a mode and split")
    args = ap.parse_args()
    trace = trace_path(args.trace)
    env, bytecode = child_env(args.compile_every_run)
    with heavy_lock():
        rows = stage_rows(trace, args.batch, args.runs, env)
        scale = scale_rows(trace) if args.scale else None
        imported = imported_rows(args.runs, env) if args.imported else None
    print_stages(rows, f"rlsim run stages, median of {args.runs} fresh processes ({trace.name}, --batch {args.batch}; "
                       f"{bytecode})")
    if scale is not None:
        print_scale(scale, f"rlsim run speed at scale ({trace.name})")
    if imported is not None:
        print_stages(imported, f"rlsim run on imported published GPU logs with a mode and split, median of {args.runs} "
                               f"fresh processes (bench/published rows; {bytecode})")


if __name__ == "__main__":
    main()
