"""Check the roofline numbers of lesson 01 on real hardware: a tensor-core matmul and HBM copy vs the spec.

Measures, on cuda:0, the dense bf16 throughput (fp16 on GPUs without BF16 units: T4, V100) of an N x N x N matmul (2 N^3 FLOP per call, best of
--repeats after warm-up, timed with CUDA events) and the bandwidth of a device-to-device copy of
--copy-gib GiB (a copy reads and writes every byte: 2 x size / time, the convention of the HBM spec).
Prints both as fractions of the device's published peak (mgpu_utils.costs.hardware), and one JSON line.
Exit status 0 when both reach --target (default 0.70), 1 when not, 3 when there is no CUDA GPU, 4 when
the GPU has no spec on file (measured, not judged: add its datasheet to mgpu_utils.costs.hardware). On the
low-power parts (T4 at 70 W, L4 at 72 W) only the copy is judged; the matmul fraction is reported.

Run:
    python benchmarks/gpu_check.py --n 8192
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mgpu_utils.costs.hardware import GPUS, LOW_POWER_W, match_gpu  # noqa: E402


def cuda_time(fn, iters):
    """Best time of fn() over iters calls, seconds, with CUDA events."""
    best = float("inf")
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192, help="matmul size N (N x N x N)")
    p.add_argument("--copy-gib", type=float, default=2.0, help="bytes copied per call (GiB)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls (the best is reported)")
    p.add_argument("--target", type=float, default=0.70, help="required fraction of the spec")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: needs a CUDA GPU, found 0 (this check verifies lesson 01's roofline on GPUs)")
        sys.exit(3)
    name = torch.cuda.get_device_name(0)
    key = match_gpu(name)
    spec = GPUS.get(key)
    dtype = "fp16" if spec and spec["bf16_tflops"] is None else "bf16"     # T4, V100: no BF16 tensor cores
    a = torch.randn(args.n, args.n, device="cuda", dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype]))
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    sec = cuda_time(lambda: a @ b, args.repeats)
    tflops = 2 * args.n ** 3 / sec / 1e12
    del a, b
    src = torch.empty(int(args.copy_gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    sec = cuda_time(lambda: dst.copy_(src), args.repeats)
    gbps = 2 * src.numel() / sec / 1e9
    result = {"device": name, "spec": key, "dtype": dtype, "matmul_tflops": tflops, "copy_gbps": gbps}
    if spec:
        peak = spec[f"{dtype}_tflops"]
        result.update(matmul_fraction=tflops / peak, copy_fraction=gbps / spec["hbm_gbps"])
        print(f"{name} ({key}): {dtype} matmul {args.n}^3 {tflops:.0f} TFLOPS = {result['matmul_fraction']:.0%} of "
              f"{peak} (dense spec); copy {gbps:.0f} GB/s = {result['copy_fraction']:.0%} of "
              f"{spec['hbm_gbps']} GB/s HBM")
    else:
        print(f"{name}: {dtype} matmul {tflops:.0f} TFLOPS, copy {gbps:.0f} GB/s (no spec on file for this GPU)")
    print("MGPU_RESULT " + json.dumps(result))
    code, why = verdict(result, key, args.target)
    print(why)
    sys.exit(code)


def verdict(result: dict, key: str | None, target: float) -> tuple[int, str]:
    """(exit status, one line): 4 with no spec on file (nothing to compare with: not a failure of the GPU);
    else 0 when the judged fractions reach ``target``, 1 when not. A low-power part (LOW_POWER_W) has its
    matmul fraction reported, not judged: its peak assumes a boost clock it cannot hold under its power cap."""
    if key is None:
        return 4, "no datasheet on file for this GPU: measured, not judged"
    judged = ["copy_fraction"] + ([] if key in LOW_POWER_W else ["matmul_fraction"])
    low = [k for k in judged if result[k] < target]
    note = (f"; the matmul is not judged: a {LOW_POWER_W[key]} W part cannot hold the boost clock its peak "
            f"assumes" if key in LOW_POWER_W else "")
    if low:
        return 1, f"FAILED: {', '.join(low)} below {target:.0%} of the datasheet{note}"
    return 0, f"ok: {' and '.join(judged)} at least {target:.0%} of the datasheet{note}"


if __name__ == "__main__":
    main()
