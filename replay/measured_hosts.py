"""Measured CPU hosts: processors that recorded traces, as `python -m bench.device_profile --write` measured them
on that processor (bench output, not datasheets: `rlsim.replay.device_data` holds those).

Keyed by the processor's identity (`rlsim.replay.devices.host_identity` of its `/proc/cpuinfo` model name, which
`rlrun record` writes to a trace's `hardware.cpu_name`: vendor and model, without trademarks, clock or core count),
so a trace finds the figures of its own processor and no other's; a processor not listed is an unmeasured host
(`rlsim.replay.devices.host_profile` says so wherever its figures are used).

Figures: memory bandwidth (np.copyto of 512 MiB float64, read + write, best of 7), fp32 matmul (2048 x 2048
float32, best of 7) on all the host's cores, its memory. Interconnect: an rlrun trace's weight sync is an
in-process copy, bounded by the same memory bandwidth.

`amd epyc`: the 2-core AMD EPYC VM (its cpuinfo names no model number) that recorded the traces of 2026-12-01/02
(docs/results.md); two runs gave memory bandwidth 20.5 / 21.3 GB/s and fp32 matmul 145.6 / 144.2 GFLOP/s,
25.3 GB of memory; the second run's figures are stored.
"""
from __future__ import annotations

# identity: (processor as the host names it, cores, mem_bandwidth_gbs, flops_tflops, memory_gb, source)
# Written by `python -m bench.device_profile --write`; do not edit by hand.
HOSTS: dict[str, tuple] = {
    "amd epyc": ("AMD EPYC", 2, 21.3, 0.1442, 25.3, "measured: python -m bench.device_profile"),
}
