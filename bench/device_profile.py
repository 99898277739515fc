"""Measure this machine's CPU profile for `rlsim.replay.devices`: memory bandwidth and matmul FLOP/s.

    flock /tmp/rlsim-heavy.lock .venv/bin/python bench/device_profile.py [--repeats 7] [--threads N]

- memory bandwidth: a large float64 array copy (`np.copyto`, 512 MiB source, far beyond any cache);
  bytes moved = read + write = 2 x the array size; the best of the repeats (contention only slows).
- fp32 matmul FLOP/s: `a @ b` of two 2048 x 2048 float32 matrices through numpy's BLAS, 2 n^3 FLOPs
  each; the best of the repeats. This is the CPU's counterpart of a GPU datasheet's dense FLOP/s (the
  tiny built-in model trains in fp32 on CPU).

It prints the numbers and the line to paste into `replay/device_data.py` (profile `cpu-this-machine`).
No GPU is needed; the GPU profiles come from vendor datasheets, cited beside each entry.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

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
    args = ap.parse_args()
    bw = mem_bandwidth_gbs(args.repeats)
    fl = matmul_gflops(args.repeats)
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    print(f"cpu                     {cpu_name()} ({os.cpu_count()} cores), numpy {np.__version__}")
    print(f"memory bandwidth        {bw:.1f} GB/s   (np.copyto of 512 MiB float64, read + write, best of {args.repeats})")
    print(f"fp32 matmul             {fl:.1f} GFLOP/s (2048 x 2048 float32 @, best of {args.repeats})")
    print(f"memory                  {mem_gb:.1f} GB")
    print()
    print("profile line for replay/device_data.py:")
    print(f'    mem_bandwidth_gbs={bw:.1f}, flops_tflops={fl / 1e3:.4f}, memory_gb={mem_gb:.1f}, '
          f'interconnect_gbs={bw:.1f}')


if __name__ == "__main__":
    main()
