"""Save what the `rlsim` CLI prints on the shipped traces, to compare later versions against.

The traces are copies of traces/*.parquet as shipped then (tests/golden/traces/), so re-recording the
shipped traces does not move the comparison. Run with the `rlsim` on PATH (any version: only the CLI is used, so the
same script served the code before the consolidation and after it):

    python tests/golden/make_golden.py tests/golden/outputs.json

`tests/test_golden.py` runs the same commands with the current code and compares the numbers.
"""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T = "tests/golden/traces/"  # the shipped traces as they were when the outputs were saved (traces/ moves on)

# (name, argv after `rlsim`) of the commands that print JSON
RUNS = [
    ("run_p128_b2048", ["run", "-t", T + "grpo_p128.parquet", "--batch", "2048", "--updates", "20", "--json"]),
    ("run_p128_g16_fixed", ["run", "-t", T + "grpo_p128.parquet", "--batch", "512", "--group", "16", "--lr-rule",
                            "fixed", "--updates", "20", "--json"]),
    ("run_curves", ["run", "-t", T + "grpo_p128.parquet", "-t", T + "grpo_p64.parquet", "-t", T + "grpo_p32.parquet",
                    "--batch", "256", "--rho", "curves", "--updates", "20", "--json"]),
    ("run_ppo", ["run", "-t", T + "ppo_b256.parquet", "--batch", "1024", "--updates", "20", "--json"]),
    ("run_addmix_kv", ["run", "-t", T + "grpo_addmix_p64.parquet", "--batch", "128", "--kv-cache-tokens", "20000",
                       "--updates", "10", "--json"]),
    ("run_p32_genbatch", ["run", "-t", T + "grpo_p32.parquet", "--batch", "64", "--gen-batch", "768", "--updates", "10",
                          "--seed", "3", "--json"]),
] + [(f"replay_{n}", ["replay", T + f"{n}.parquet", "--json"])
     for n in ("grpo_p128", "grpo_p64", "grpo_p32", "grpo_addmix_p64", "ppo_b256")]

SWEEP = ["sweep", "-t", T + "grpo_p64.parquet", "--batch", "32,128,512", "--group", "4,8", "--lr-rule", "sqrt,fixed",
         "--updates", "10", "--workers", "1", "--no-charts"]
EXPORTS = [
    ("perfetto_recorded", ["export", "perfetto", T + "grpo_p32.parquet"]),
    ("perfetto_simulated", ["export", "perfetto", "--simulate", "-t", T + "grpo_p64.parquet", "--batch", "128",
                            "--updates", "3"]),
]


def rlsim(argv: list[str], exe: str = "rlsim") -> str:
    p = subprocess.run([exe, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise SystemExit(f"rlsim {' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def perfetto_digest(path: Path) -> dict:
    """Per (process, thread, event name): count, total duration and first start (microseconds)."""
    obj = json.loads(path.read_text())
    pname, tname = {}, {}
    for e in obj["traceEvents"]:
        if e.get("ph") == "M" and e["name"] == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_name":
            tname[(e["pid"], e["tid"])] = re.sub(r" \d+$", "", e["args"]["name"])  # slot tracks folded
    agg: dict = defaultdict(lambda: [0, 0.0, float("inf")])
    for e in obj["traceEvents"]:
        if e.get("ph") == "X":
            name = re.sub(r"^p\d+/g\d+$", "p*/g*", e["name"])  # one response slice per sample, folded
            a = agg[f"{pname[e['pid']]}|{tname[(e['pid'], e['tid'])]}|{name}"]
            a[0] += 1
            a[1] += e["dur"]
            a[2] = min(a[2], e["ts"])
        elif e.get("ph") == "C":
            for k, v in e["args"].items():
                a = agg[f"{pname[e['pid']]}|counter|{e['name']}.{k}"]
                a[0] += 1
                a[1] += v
                a[2] = min(a[2], e["ts"])
    return {k: [v[0], round(v[1], 3), v[2]] for k, v in sorted(agg.items())}


def collect(exe: str = "rlsim") -> dict:
    out: dict = {}
    for name, argv in RUNS:
        out[name] = json.loads(rlsim(argv, exe))
    with tempfile.TemporaryDirectory() as d:
        rlsim(SWEEP + ["--out", f"{d}/sweep"], exe)
        with open(f"{d}/sweep/results.csv") as f:
            out["sweep"] = list(csv.DictReader(f))
        for name, argv in EXPORTS:
            rlsim(argv + ["-o", f"{d}/{name}.json"], exe)
            out[name] = perfetto_digest(Path(f"{d}/{name}.json"))
    return out


if __name__ == "__main__":
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/golden/outputs.json")
    dest.write_text(json.dumps(collect(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {dest}")
