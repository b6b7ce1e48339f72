"""Published specifications of common GPUs and links (lesson 01; also 06, 08, 09 and 10).

Numbers are from the vendors' datasheets and whitepapers named in ``source``; dense (not sparse)
tensor-core throughput; bandwidths in GB/s with GB = 1e9 bytes. Used for the tables in lesson 01,
as the ceilings of the roofline on GPUs, and by ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import re

#: Per-GPU specifications. Keys: ``sms``, ``memory_gb``, ``memory`` (type), ``hbm_gbps`` (device memory
#: bandwidth), ``fp32_tflops`` (non-tensor), ``bf16_tflops`` (dense tensor core; FP32 accumulate),
#: ``fp16_tflops`` (dense tensor core, FP32 accumulate: the peak for GPUs without BF16 units, T4 and V100),
#: ``l2_mb``, ``l1_smem_kb_per_sm`` (combined L1/shared memory per SM), ``regs_kb_per_sm``, ``source``.
#: One entry per product variant where the variants differ (A100 40GB and 80GB SXM/PCIe): :func:`match_gpu`
#: maps a CUDA device name to exactly one of them.
GPUS: dict[str, dict] = {
    "T4": dict(sms=40, memory_gb=16, memory="GDDR6", hbm_gbps=320, fp32_tflops=8.1, bf16_tflops=None, fp16_tflops=65,
               l2_mb=4, l1_smem_kb_per_sm=96, regs_kb_per_sm=256,
               source="NVIDIA T4 datasheet; Turing architecture whitepaper (no BF16: FP16 tensor 65 TFLOPS)"),
    "V100": dict(sms=80, memory_gb=32, memory="HBM2", hbm_gbps=900, fp32_tflops=15.7, bf16_tflops=None, fp16_tflops=125,
                 l2_mb=6, l1_smem_kb_per_sm=128, regs_kb_per_sm=256,
                 source="NVIDIA V100 (SXM2) datasheet; Volta whitepaper (no BF16: FP16 tensor 125 TFLOPS)"),
    "A100": dict(sms=108, memory_gb=80, memory="HBM2e", hbm_gbps=2039, fp32_tflops=19.5, bf16_tflops=312, fp16_tflops=312,
                 l2_mb=40, l1_smem_kb_per_sm=192, regs_kb_per_sm=256,
                 source="NVIDIA A100 80GB SXM datasheet; Ampere GA100 whitepaper"),
    "A100 40GB": dict(sms=108, memory_gb=40, memory="HBM2", hbm_gbps=1555, fp32_tflops=19.5, bf16_tflops=312,
                      fp16_tflops=312, l2_mb=40, l1_smem_kb_per_sm=192, regs_kb_per_sm=256,
                      source="NVIDIA A100 datasheet, 40GB SXM and PCIe: 1,555 GB/s"),
    "A100 80GB PCIe": dict(sms=108, memory_gb=80, memory="HBM2e", hbm_gbps=1935, fp32_tflops=19.5, bf16_tflops=312,
                           fp16_tflops=312, l2_mb=40, l1_smem_kb_per_sm=192, regs_kb_per_sm=256,
                           source="NVIDIA A100 datasheet, 80GB PCIe: 1,935 GB/s"),
    "L4": dict(sms=58, memory_gb=24, memory="GDDR6", hbm_gbps=300, fp32_tflops=30.3, bf16_tflops=121,
               fp16_tflops=121, l2_mb=48, l1_smem_kb_per_sm=128, regs_kb_per_sm=256,
               source="NVIDIA L4 datasheet (BF16/FP16 242 TFLOPS with sparsity: 121 dense)"),
    "H100": dict(sms=132, memory_gb=80, memory="HBM3", hbm_gbps=3350, fp32_tflops=67, bf16_tflops=989, fp16_tflops=989,
                 l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                 source="NVIDIA H100 SXM5 datasheet; Hopper whitepaper"),
    "H100 PCIe": dict(sms=114, memory_gb=80, memory="HBM2e", hbm_gbps=2000, fp32_tflops=51, bf16_tflops=756, fp16_tflops=756,
                      l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                      source="NVIDIA H100 PCIe datasheet"),
    "H200": dict(sms=132, memory_gb=141, memory="HBM3e", hbm_gbps=4800, fp32_tflops=67, bf16_tflops=989, fp16_tflops=989,
                 l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                 source="NVIDIA H200 SXM datasheet"),
    "RTX 4090": dict(sms=128, memory_gb=24, memory="GDDR6X", hbm_gbps=1008, fp32_tflops=82.6, bf16_tflops=165.2, fp16_tflops=165.2,
                     l2_mb=72, l1_smem_kb_per_sm=128, regs_kb_per_sm=256,
                     source="NVIDIA Ada Lovelace (AD102) architecture whitepaper"),
}

#: Interconnects: bandwidth per direction (GB/s) and typical latency (microseconds, order of magnitude).
LINKS: dict[str, dict] = {
    "PCIe 4.0 x16": dict(gbps=32, latency_us=1, source="PCI-SIG PCIe 4.0 (16 GT/s x 16 lanes)"),
    "PCIe 5.0 x16": dict(gbps=64, latency_us=1, source="PCI-SIG PCIe 5.0 (32 GT/s x 16 lanes)"),
    "NVLink 3 (A100, 12 links)": dict(gbps=300, latency_us=1, source="NVIDIA A100 datasheet: 600 GB/s bidirectional"),
    "NVLink 4 (H100, 18 links)": dict(gbps=450, latency_us=1, source="NVIDIA H100 datasheet: 900 GB/s bidirectional"),
    "NVSwitch (DGX H100, any-to-any)": dict(gbps=450, latency_us=1,
                                            source="DGX H100 user guide: every GPU at full NVLink rate"),
    "InfiniBand NDR (400 Gb/s)": dict(gbps=50, latency_us=2, source="NVIDIA ConnectX-7 datasheet"),
    "Ethernet 100 GbE": dict(gbps=12.5, latency_us=10, source="IEEE 802.3 (100 Gb/s); TCP latency typical"),
    "Ethernet 10 GbE": dict(gbps=1.25, latency_us=20, source="IEEE 802.3 (10 Gb/s); TCP latency typical"),
}


#: Board power (W) of the low-power parts among GPUS (their datasheets): their tensor-core peak assumes the boost
#: clock, which a dense matmul cannot hold under this cap, so benchmarks/gpu_check.py reports their matmul
#: fraction without judging it (the copy bandwidth is still judged).
LOW_POWER_W = {"T4": 70, "L4": 72}


#: (pattern on the upper-cased CUDA device name, key of GPUS), first match wins: the specific variants
#: come before the generic name ("A100-SXM4-40GB" is the 40GB part, "NVIDIA L40S" is not an L4).
_NAME_RULES = [
    (r"\bH[12]00\b.*\bNVL\b", None),      # NVL parts: other clocks, power and memory than SXM; no spec on file
    (r"\bH200\b", "H200"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    (r"\bH100\b", "H100"),
    (r"\bA100\b.*\b40\s?GB\b", "A100 40GB"),
    (r"\bA100\b(?=.*\b80\s?GB\b)(?=.*\bPCIE\b)", "A100 80GB PCIe"),
    (r"\bA100\b", "A100"),
    (r"\bV100\b", "V100"),
    (r"\bT4\b", "T4"),
    (r"\bL4\b", "L4"),
    (r"\bRTX 4090\b", "RTX 4090"),
]


def match_gpu(device_name: str) -> str | None:
    """The key of :data:`GPUS` for a CUDA device name (``torch.cuda.get_device_name``), matched on the
    exact product: "NVIDIA H200" -> "H200", "NVIDIA A100-SXM4-40GB" -> "A100 40GB",
    "NVIDIA A100-SXM4-80GB" -> "A100", "Tesla T4" -> "T4"; "NVIDIA L40S" -> None (not an L4).

    Returns None for a device with no spec on file (then there is nothing to compare with).
    """
    name = device_name.upper()
    for pattern, key in _NAME_RULES:
        if re.search(pattern, name):
            return key
    return None
