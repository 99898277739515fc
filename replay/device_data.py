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
    # NVIDIA H20 (HGX H20, Hopper, SXM; sold in China only): NVIDIA has published no public datasheet. Figures are
    # NVIDIA's spec sheet as reprinted by third parties, NOT a vendor page: elecfans reprint (2023-12,
    # 1cnz.cn/d/2353773.html): 96 GB HBM3, 4.0 TB/s; FP16 148 TFLOPS, FP8 296 TFLOPS; NVLink 900 GB/s; SXM.
    # zangshuxian.com/new/674733024499207168 gives the 148 as the dense (non-sparse) FP16 figure. BF16 = FP16
    # (Hopper Tensor Cores run both at one rate: H100 datasheet), so 148 dense BF16 is inferred, not printed.
    "h20": ("NVIDIA H20 96GB", 4000.0, 148.0, 96.0, 900.0, "gpu",
            ("h20 96gb", "hgx h20"),
            "NVIDIA H20 spec sheet as reprinted by third parties (no public NVIDIA datasheet)"),
    # NVIDIA H800 Tensor Core GPU datasheet (2023; NVIDIA does not host it publicly: a reseller's copy is at
    # chaoqing-i.com/upload/20231128/NVIDIA%20H800%20GPU%20Datasheet.pdf, not read here). The H800 SXM is the H100
    # SXM die with NVLink cut to 400 GB/s (third-party reprints: philisun.com "NVIDIA H800 vs H100", year not
    # stated). Compute and memory from the H100 datasheet, H100 SXM column: 80 GB, 3.35 TB/s; BF16 Tensor Core
    # 1,979 TFLOPS* (*with sparsity -> halved: 989 dense). NVLink 400 GB/s from the third-party reprints.
    "h800": ("NVIDIA H800 SXM 80GB", 3350.0, 989.0, 80.0, 400.0, "gpu",
             ("h800-sxm", "h800 80gb", "h800 80gb hbm3"),
             "NVIDIA H100 datasheet (H100 SXM) + H800 NVLink 400 GB/s (third-party reprints of NVIDIA's H800 sheet)"),
    # NVIDIA A800 (Ampere, China-only A100 variant; no A800 SXM datasheet found). NVIDIA's statement (Reuters, 7 Nov
    # 2022; reprinted at tweakers.net/nieuws/203182): the A800 is the A100 with NVLink limited to 400 GB/s (A100:
    # 600 GB/s), performance figures unchanged, up to 80 GB HBM2e, 400 W SXM. Compute and memory from the NVIDIA A100
    # datasheet (2021, see a100-80gb), A100 80GB SXM column: HBM2e 2,039 GB/s; BF16 312 TFLOPS dense (624* sparse).
    # The A800 40GB has no datasheet here and no profile: without a bare "a800" alias it resolves to none (an error
    # asking for --device) rather than to these 80GB numbers.
    "a800-80gb": ("NVIDIA A800 80GB SXM", 2039.0, 312.0, 80.0, 400.0, "gpu",
                  ("a800-sxm4-80gb", "a800 80gb", "a800-80"),
                  "NVIDIA A100 datasheet (A100 80GB SXM) + NVLink 400 GB/s per NVIDIA's A800 statement "
                  "(Reuters, 2022)"),
    # NVIDIA L20 (Ada Lovelace AD102, PCIe; sold in China only): NO NVIDIA datasheet or spec page found. Third-party
    # spec listings only (technical.city/pl/video/L20, topcpu.net/en/gpu-c/a40-pcie-vs-l20): 48 GB GDDR6, 384-bit,
    # 864 GB/s; PCIe 4.0 x16 (64 GB/s bidirectional, as for the L40S), no NVLink; 275 W. BF16 119.5 TFLOPS dense
    # (239 with sparsity): UNVERIFIED, found only in third-party code tables, not in any NVIDIA document.
    "l20": ("NVIDIA L20 48GB", 864.0, 119.5, 48.0, 64.0, "gpu",
            ("l20 48gb",), "third-party L20 spec listings (no NVIDIA datasheet found; BF16 unverified)"),
    # NVIDIA Blackwell GPU specifications table (nvidia.com/en-us/data-center/hgx, "Individual Blackwell GPU
    # specifications", GB200 NVL72 column; as reprinted at zdszero.github.io/Computer/Artificial_Intelligence/
    # Hardware.html): 186 GB HBM3E, 8 TB/s; FP16/BF16 Tensor Core 5 PFLOPS (sparse -> halved: 2.5 PFLOPS dense);
    # 5th-generation NVLink 1.8 TB/s. Cross-checks: NVIDIA GB200 NVL72 page (nvidia.com/en-us/data-center/
    # gb200-nvl72) rack totals 13.4 TB HBM3e / 72 = 186 GB and 576 TB/s / 72 = 8 TB/s (as quoted by third parties);
    # NVIDIA Blackwell technical brief per-GPU table (reprinted at glennklockwood.com/garden/processors/B200):
    # GB200 BF16 2,500 dense / 5,000 sparse TFLOPS. One Blackwell GPU of a GB200 superchip / NVL72 rack.
    "gb200": ("NVIDIA GB200 NVL72 (per Blackwell GPU) 186GB", 8000.0, 2500.0, 186.0, 1800.0, "gpu",
              ("gb200-nvl72", "gb200 186gb"), "NVIDIA Blackwell specifications (GB200 NVL72, individual GPU)"),
}
