"""Device profiles: the numbers `rlsim.replay.devices` rescales fitted models by.

Per device (one GPU, or one CPU host): peak memory bandwidth (GB/s), dense bf16 tensor FLOP/s (TFLOP/s,
without 2:4 sparsity: datasheets print the sparse figure, twice the dense one, with an asterisk),
memory (GB) and interconnect bandwidth (GB/s: the device's total NVLink / Infinity Fabric / PCIe
bandwidth as the datasheet states it). Each entry cites its source beside it. Peak figures: real
kernels reach a fraction of them, which is why rlsim only ever uses their *ratios* (docs/importing.md).

Datasheets only: the CPU host that recorded the shipped traces is a measurement, kept apart in
`rlsim.replay.measured_hosts` (written by `python -m bench.device_profile --write`).
"""
from __future__ import annotations

# The least an optimizer update's fixed cost falls to when rescaled, by device kind (seconds). Not a datasheet
# figure: an order-of-magnitude floor. A training step launches on the order of 1,000 CUDA kernels (forward and
# backward of each layer, a fused optimizer step, gradient collectives) at ~5-10 us of launch and dispatch
# latency each, which bandwidth does not shorten; so an update takes ~10 ms however small the model. A CPU
# trace's costs are measured on its own device, not rescaled: no floor.
UPDATE_FLOOR_S: dict[str, float] = {"gpu": 0.01, "cpu": 0.0}

# key: (name, mem_bandwidth_gbs, flops_tflops, memory_gb, interconnect_gbs, kind, aliases, source)
DEVICES: dict[str, tuple] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021, nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
    # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), A100 40GB SXM column: HBM2 1,555 GB/s; BFLOAT16
    # Tensor Core 312 TFLOPS (624* with sparsity); NVLink 600 GB/s.
    "a100-40gb": ("NVIDIA A100 40GB SXM", 1555.0, 312.0, 40.0, 600.0, "gpu",
                  ("a100-sxm4-40gb", "a100 40gb", "a100-40"), "NVIDIA A100 datasheet (A100 40GB SXM)"),
    # Same datasheet, A100 80GB SXM column: HBM2e 2,039 GB/s; BF16 312 TFLOPS dense; NVLink 600 GB/s.
    "a100-80gb": ("NVIDIA A100 80GB SXM", 2039.0, 312.0, 80.0, 600.0, "gpu",
                  ("a100", "a100-sxm4-80gb", "a100 80gb", "a100-80"), "NVIDIA A100 datasheet (A100 80GB SXM)"),
    # NVIDIA H100 Tensor Core GPU datasheet (2023, resources.nvidia.com "H100 datasheet"), H100 SXM column:
    # 80 GB, 3.35 TB/s; BF16 Tensor Core 1,979 TFLOPS* (*with sparsity -> 989 dense); NVLink 900 GB/s.
    "h100-sxm": ("NVIDIA H100 SXM 80GB", 3350.0, 989.0, 80.0, 900.0, "gpu",
                 ("h100", "h100 80gb hbm3", "h100-80gb"), "NVIDIA H100 datasheet (H100 SXM)"),
    # NVIDIA H200 Tensor Core GPU datasheet (2024, nvidia.com/en-us/data-center/h200), H200 SXM column:
    # 141 GB HBM3e, 4.8 TB/s; BF16 Tensor Core 1,979 TFLOPS* (sparse -> 989 dense); NVLink 900 GB/s.
    "h200": ("NVIDIA H200 SXM 141GB", 4800.0, 989.0, 141.0, 900.0, "gpu",
             ("h200-sxm", "h200 141gb"), "NVIDIA H200 datasheet (H200 SXM)"),
    # NVIDIA Blackwell datasheet / HGX B200 specifications (nvidia.com/en-us/data-center/hgx, "Individual
    # Blackwell GPU specifications", HGX B200 column): 180 GB HBM3E, 7.7 TB/s (earlier revisions: 8 TB/s);
    # FP16/BF16 Tensor Core 4.5 PFLOPS* (sparse -> 2.25 PFLOPS dense); 5th-generation NVLink 1.8 TB/s.
    "b200": ("NVIDIA B200 (HGX) 180GB", 7700.0, 2250.0, 180.0, 1800.0, "gpu",
             ("hgx-b200", "b200 180gb", "dgx-b200"), "NVIDIA HGX B200 specifications (individual GPU)"),
    # AMD Instinct MI300X accelerator data sheet (amd.com/.../instinct-mi300x-data-sheet.pdf): 192 GB HBM3,
    # 5.3 TB/s peak memory bandwidth; peak BF16 1,307.4 TFLOPS (2,614.9 with sparsity); AMD Infinity Fabric
    # 7 links x 128 GB/s = 896 GB/s peak aggregate peer-to-peer.
    "mi300x": ("AMD Instinct MI300X 192GB", 5300.0, 1307.4, 192.0, 896.0, "gpu",
               ("mi300", "instinct mi300x"), "AMD Instinct MI300X data sheet"),
    # NVIDIA L40S datasheet (2023, nvidia.com/en-us/data-center/l40s): 48 GB GDDR6, 864 GB/s; BFLOAT16
    # Tensor Core 362.05 TFLOPS (733* with sparsity); PCIe Gen4 x16 64 GB/s bidirectional, no NVLink.
    "l40s": ("NVIDIA L40S 48GB", 864.0, 362.05, 48.0, 64.0, "gpu",
             ("l40s 48gb", "l40"), "NVIDIA L40S datasheet"),
}
