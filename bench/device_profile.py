"""Measure this machine's CPU profile for `rlsim.replay.devices`: memory bandwidth and matmul FLOP/s.

    flock /tmp/rlsim-heavy.lock .venv/bin/python -m bench.device_profile [--repeats 7] [--write]

- memory bandwidth: a large float64 array copy (`np.copyto`, 512 MiB source, far beyond any cache);
  bytes moved = read + write = 2 x the array size; the best of the repeats (contention only slows).
- fp32 matmul FLOP/s: `a @ b` of two 2048 x 2048 float32 matrices through numpy's BLAS, 2 n^3 FLOPs
  each; the best of the repeats. This is the CPU's counterpart of a GPU datasheet's dense FLOP/s (the
  tiny built-in model trains in fp32 on CPU).

It prints the numbers; `--write` stores them as the measured host `cpu-this-machine` in
`replay/measured_hosts.py` (kept apart from the GPU datasheets of `replay/device_data.py`).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import time
from pathlib import Path

import numpy as np


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
    print(f"memory bandwidth        {bw:.1f} GB/s   (np.copyto of 512 MiB float64, read + write, best of {args.repeats})")
    print(f"fp32 matmul             {fl:.1f} GFLOP/s (2048 x 2048 float32 @, best of {args.repeats})")
    print(f"memory                  {mem_gb:.1f} GB")
    if args.write:
        write_host(f"this machine's CPU ({cpu_name()}, {os.cpu_count()} cores; measured)", bw, fl / 1e3, mem_gb)


def write_host(name: str, bw: float, tflops: float, mem_gb: float) -> None:
    """Replace the `cpu-this-machine` entry of replay/measured_hosts.py."""
    path = Path(__file__).resolve().parents[1] / "replay" / "measured_hosts.py"
    entry = (f'    "cpu-this-machine": ({name!r}, {bw:.1f}, {tflops:.4f}, {mem_gb:.1f}, {bw:.1f}, "cpu",\n'
             f'                         ("cpu", "amd epyc"), "measured: python -m bench.device_profile"),\n')
    text = path.read_text()
    text = re.sub(r'    "cpu-this-machine": \(.*?\),\n(?=})', entry, text, flags=re.S)
    path.write_text(text)


if __name__ == "__main__":
    main()
