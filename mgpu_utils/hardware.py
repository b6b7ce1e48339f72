"""Published specifications of common GPUs and links (notebooks/01_gpu_architecture.ipynb).

Numbers are from the vendors' datasheets and whitepapers named in ``source``; dense (not sparse)
tensor-core throughput; bandwidths in GB/s with GB = 1e9 bytes. Used for the tables in lesson 01,
as the ceilings of the roofline on GPUs, and by ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

#: Per-GPU specifications. Keys: ``sms``, ``memory_gb``, ``memory`` (type), ``hbm_gbps`` (device memory
#: bandwidth), ``fp32_tflops`` (non-tensor), ``bf16_tflops`` (dense tensor core; FP32 accumulate),
#: ``l2_mb``, ``l1_smem_kb_per_sm`` (combined L1/shared memory per SM), ``regs_kb_per_sm``, ``source``.
GPUS: dict[str, dict] = {
    "T4": dict(sms=40, memory_gb=16, memory="GDDR6", hbm_gbps=320, fp32_tflops=8.1, bf16_tflops=None,
               l2_mb=4, l1_smem_kb_per_sm=96, regs_kb_per_sm=256,
               source="NVIDIA T4 datasheet; Turing architecture whitepaper (no BF16: FP16 tensor 65 TFLOPS)"),
    "V100": dict(sms=80, memory_gb=32, memory="HBM2", hbm_gbps=900, fp32_tflops=15.7, bf16_tflops=None,
                 l2_mb=6, l1_smem_kb_per_sm=128, regs_kb_per_sm=256,
                 source="NVIDIA V100 (SXM2) datasheet; Volta whitepaper (no BF16: FP16 tensor 125 TFLOPS)"),
    "A100": dict(sms=108, memory_gb=80, memory="HBM2e", hbm_gbps=2039, fp32_tflops=19.5, bf16_tflops=312,
                 l2_mb=40, l1_smem_kb_per_sm=192, regs_kb_per_sm=256,
                 source="NVIDIA A100 80GB SXM datasheet; Ampere GA100 whitepaper"),
    "H100": dict(sms=132, memory_gb=80, memory="HBM3", hbm_gbps=3350, fp32_tflops=67, bf16_tflops=989,
                 l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                 source="NVIDIA H100 SXM5 datasheet; Hopper whitepaper"),
    "H100 PCIe": dict(sms=114, memory_gb=80, memory="HBM2e", hbm_gbps=2000, fp32_tflops=51, bf16_tflops=756,
                      l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                      source="NVIDIA H100 PCIe datasheet"),
    "H200": dict(sms=132, memory_gb=141, memory="HBM3e", hbm_gbps=4800, fp32_tflops=67, bf16_tflops=989,
                 l2_mb=50, l1_smem_kb_per_sm=256, regs_kb_per_sm=256,
                 source="NVIDIA H200 SXM datasheet"),
    "RTX 4090": dict(sms=128, memory_gb=24, memory="GDDR6X", hbm_gbps=1008, fp32_tflops=82.6, bf16_tflops=165.2,
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
                                            source="NVIDIA DGX H100 user guide: every GPU at full NVLink rate"),
    "InfiniBand NDR (400 Gb/s)": dict(gbps=50, latency_us=2, source="NVIDIA ConnectX-7 datasheet"),
    "Ethernet 100 GbE": dict(gbps=12.5, latency_us=10, source="IEEE 802.3 (100 Gb/s); TCP latency typical"),
    "Ethernet 10 GbE": dict(gbps=1.25, latency_us=20, source="IEEE 802.3 (10 Gb/s); TCP latency typical"),
}


def match_gpu(device_name: str) -> str | None:
    """The key of :data:`GPUS` that a CUDA device name refers to, e.g. "NVIDIA H200" -> "H200".

    Returns None for an unknown device (then there is no spec to compare with).
    """
    name = device_name.upper().replace("GEFORCE ", "")
    for key in sorted(GPUS, key=len, reverse=True):
        if key.upper() in name:
            return key
    return None
