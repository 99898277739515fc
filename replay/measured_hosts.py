"""Measured host profiles: CPUs that recorded traces, as `python -m bench.device_profile` measured them (bench
output, not datasheets: `rlsim.replay.device_data` holds those). Same fields as a device profile.

`cpu-this-machine`: the 2-core AMD EPYC VM that recorded traces/*.parquet; two runs gave memory bandwidth 20.5 /
21.3 GB/s (np.copyto of 512 MiB float64, read + write, best of 7) and fp32 matmul 145.6 / 144.2 GFLOP/s (2048 x 2048
float32, best of 7), 25.3 GB of memory; the second run's figures are stored. Interconnect: an rlrun trace's weight
sync is an in-process copy, bounded by the same memory bandwidth. A trace recorded on another CPU names its own
host; rescaling it with this profile is an approximation that `rlsim run` states.
"""
from __future__ import annotations

# key: (name, mem_bandwidth_gbs, flops_tflops, memory_gb, interconnect_gbs, kind, aliases, source)
# Written by `python -m bench.device_profile --write`; do not edit by hand.
HOSTS: dict[str, tuple] = {
    "cpu-this-machine": ("this machine's CPU (AMD EPYC, 2 cores; measured)", 21.3, 0.1442, 25.3, 21.3, "cpu",
                         ("cpu", "amd epyc"), "measured: python -m bench.device_profile"),
}
