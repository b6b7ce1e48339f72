"""Timing that is correct on CPU and GPU (introduced in notebooks/01_gpu_architecture.ipynb).

CUDA kernels run asynchronously: ``time.perf_counter()`` around ``a @ b`` on a GPU measures only the
launch. :func:`time_fn` synchronises (CUDA events on GPU) and reports the best and median of repeats.
"""

from __future__ import annotations

import statistics
import time


def time_fn(fn, device="cpu", iters: int = 5, warmup: int = 1) -> dict:
    """Time ``fn()`` on ``device``.

    Args:
        fn: a callable with no arguments.
        device: "cpu", "cuda", or a torch.device; on CUDA the time is measured with CUDA events.
        iters: timed calls (>= 1); warmup: untimed calls first (allocations, kernel selection, caches).

    Returns:
        ``{"best_s", "median_s", "all_s"}`` in seconds.

    Raises:
        ValueError: iters < 1.
    """
    import torch

    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return {"best_s": min(times), "median_s": statistics.median(times), "all_s": times}


def matmul_flops(n: int) -> int:
    """FLOP of an (n x n) @ (n x n) matmul: n^2 outputs x n multiply-adds x 2 = 2 n^3."""
    return 2 * n ** 3


def matmul_intensity(n: int, bytes_per_element: int) -> float:
    """Arithmetic intensity (FLOP per byte of memory traffic) of an n x n x n matmul, counting the
    minimum traffic: read A and B, write C, 3 n^2 elements. = 2n^3 / (3 n^2 b) = 2n / (3b)."""
    return matmul_flops(n) / (3 * n * n * bytes_per_element)


def synced_clock(device=None) -> float:
    """``time.perf_counter()`` (seconds) read after the device has finished its queued work.

    CUDA kernels, and NCCL collectives, run asynchronously: a host clock read right after
    ``dist.all_reduce`` or ``loss.backward()`` returns when the work is *queued*, not done, and
    undercounts it (on NCCL even ``work.wait()`` does not block the host). On a CUDA ``device`` this
    calls ``torch.cuda.synchronize(device)`` first; on the CPU (gloo) it is just the clock. Every
    host-timed interval in the launch scripts starts and ends with it.

    Args:
        device: a ``torch.device`` or string ("cpu", "cuda", "cuda:1"); None means the CPU.
    """
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
