"""Measure this machine's CPU profile for `rlsim.replay.devices`: memory bandwidth and matmul FLOP/s.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.device_profile [--repeats 7] [--write]

- memory bandwidth: a large float64 array copy (`np.copyto`, 512 MiB source, far beyond any cache);
  bytes moved = read + write = 2 x the array size; the best of the repeats (contention only slows).
- fp32 matmul FLOP/s: `a @ b` of two 2048 x 2048 float32 matrices through numpy's BLAS, 2 n^3 FLOPs
  each; the best of the repeats. This is the CPU's counterpart of a GPU datasheet's dense FLOP/s (the
  tiny built-in model trains in fp32 on CPU).

It prints the numbers; `--write` stores them in `replay/measured_hosts.py` (kept apart from the GPU datasheets of
`replay/device_data.py`) under this processor's identity (`rlsim.replay.devices.host_identity` of its cpuinfo model
name, as `rlrun record` writes it to a trace's `hardware.cpu_name`), replacing an earlier entry for the same processor:
traces recorded on it then rescale by its own figures, and name it as measured.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

from rlsim.replay.devices import host_identity, host_name

HOSTS_FILE = Path(__file__).resolve().parents[1] / "replay" / "measured_hosts.py"

def mem_bandwidth_gbs(repeats: int, mib: int = 512) -> float:
    n = mib * 2**20 // 8
    src = np.ones(n, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page once
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def matmul_gflops(repeats: int, n: int = 2048) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm up the BLAS threads
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--write", action="store_true", help="store the profile in replay/measured_hosts.py")
    args = ap.parse_args()
    bw = mem_bandwidth_gbs(args.repeats)
    fl = matmul_gflops(args.repeats)
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    print(f"cpu                     {cpu_name()} ({os.cpu_count()} cores), numpy {np.__version__}")
    print(f"memory bandwidth        {bw:.1f} GB/s   "
          f"(np.copyto of 512 MiB float64, read + write, best of {args.repeats})")
    print(f"fp32 matmul             {fl:.1f} GFLOP/s (2048 x 2048 float32 @, best of {args.repeats})")
    print(f"memory                  {mem_gb:.1f} GB")
    if args.write:
        write_host(cpu_name(), os.cpu_count() or 1, bw, fl / 1e3, mem_gb)


def write_host(processor: str, cores: int, bw: float, tflops: float, mem_gb: float, path: Path = HOSTS_FILE) -> str:
    """Store a measured host in `path` (replay/measured_hosts.py) under its processor's identity, replacing that
    processor's earlier entry or adding one; returns the identity."""
    ident = host_identity(processor)
    if not ident:
        raise SystemExit("this machine does not name its processor (/proc/cpuinfo model name): nothing to key it by")
    source = f"measured: python -m bench.device_profile, {time.strftime('%Y-%m-%d')}"
    key = json.dumps(ident)
    figures = f"{cores}, {bw:.1f}, {tflops:.4f}, {mem_gb:.1f}"
    entry = f"    {key}: ({json.dumps(host_name(processor))}, {figures}, {json.dumps(source)}),\n"
    text = path.read_text()
    line = re.compile(rf"^    {re.escape(key)}: \(.*\),\n", re.M)
    table_end = r"(HOSTS: dict\[str, tuple\] = \{\n(?:    .*\n)*?)(\})"  # a new entry goes last
    text = line.sub(lambda _: entry, text) if line.search(text) else re.sub(
        table_end, lambda m: m.group(1) + entry + m.group(2), text, count=1)
    path.write_text(text)
    return ident


if __name__ == "__main__":
    main()
