"""Collective bandwidth, measured like NVIDIA's nccl-tests (notebooks/04_collectives.ipynb).

For all_reduce, all_gather, reduce_scatter, broadcast and all_to_all over message sizes from 1 KiB
up to --max-mib (x4 steps): --warmup untimed runs, then --repeats timed runs (CUDA events on GPUs;
barrier + perf_counter on CPU), each run's time being the slowest rank's. Reports the median time,
algbw = size / time and busbw = algbw x the nccl-tests factor (mgpu_utils.costs.bandwidth), in GB/s
(1e9 bytes/s). Rank 0 also measures the memory bandwidth of a copy of one large buffer (dst.copy_(src)),
counted as lesson 01 and the HBM datasheets count it: a copy reads and writes every byte, 2 x size / time.
On the CPU tier gloo moves every byte through memory (read once, written once), so half of it, the bytes
copied per second, is the ceiling on busbw.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/collectives_bench.py --max-mib 64 --csv bench.csv
"""
import argparse
import csv
import statistics
import time

import torch
import torch.distributed as dist

from mgpu_utils.costs.bandwidth import algbw_gbps, busbw_gbps
from mgpu_utils.compat import all_gather_single, reduce_scatter_single
from mgpu_utils.dist import distributed, emit_result

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]


def make_op(op, size_bytes, n, device):
    """(callable, size in nccl-tests' sense) for one fp32 message; sizes rounded to n elements."""
    count = max(n, size_bytes // 4 // n * n)        # elements in the "size" buffer, a multiple of n
    big = torch.ones(count, device=device)
    small = torch.ones(count // n, device=device)
    calls = {"all_reduce": lambda: dist.all_reduce(big),
             "all_gather": lambda: all_gather_single(big, small),        # size = output
             "reduce_scatter": lambda: reduce_scatter_single(small, big),  # size = input
             "broadcast": lambda: dist.broadcast(big, src=0),
             "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(big), big)}
    return calls[op], count * 4


def time_once(fn, device):
    """Seconds for one call, the slowest rank's."""
    dist.barrier()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        sec = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        fn()
        sec = time.perf_counter() - t0
    t = torch.tensor([sec], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def copy_bandwidth(device, mib=None, iters=5):
    """Memory bandwidth of dst.copy_(src) for a mib-MiB buffer (best of iters), GB/s, reads + writes:
    2 x size / time, the convention of lesson 01 and of the HBM datasheets. On CUDA: 1 GiB (default), timed
    with CUDA events (a 64 MiB copy is about 30 us on an H200, as short as a synchronize's own cost);
    on the CPU: 64 MiB, the host clock."""
    cuda = device.type == "cuda"
    src = torch.ones((mib or (1024 if cuda else 64)) * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def main():
    p = argparse.ArgumentParser(description="nccl-tests-style bandwidth sweep")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-kib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per size (median reported)")
    p.add_argument("--csv", default="", help="rank 0 also writes the rows here")
    args = p.parse_args()

    with distributed() as ctx:
        if not dist.is_initialized():
            raise SystemExit("a collective benchmark needs a process group: run it under torchrun")
        n, dev = ctx.world_size, ctx.device
        sizes, s = [], args.min_kib * 1024
        while s <= args.max_mib * 2**20:
            sizes.append(s)
            s *= 4
        rows = []
        for op in args.ops.split(","):
            for size in sizes:
                fn, real = make_op(op, size, n, dev)
                for _ in range(args.warmup):
                    fn()
                sec = statistics.median(time_once(fn, dev) for _ in range(args.repeats))
                rows.append({"op": op, "bytes": real, "seconds": sec, "algbw_GBps": algbw_gbps(real, sec),
                             "busbw_GBps": busbw_gbps(op, real, sec, n)})
            best = max(r["busbw_GBps"] for r in rows if r["op"] == op)
            ctx.log(f"{op:>15}: {len(sizes)} sizes, best busbw {best:.2f} GB/s")
        dist.barrier()
        copy = copy_bandwidth(dev) if ctx.is_main else 0.0   # alone, while the others wait
        dist.barrier()
        if args.csv and ctx.is_main:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        ctx.log(f"memory bandwidth of a {dev.type} buffer copy: {copy:.1f} GB/s (reads + writes; "
                f"{copy / 2:.1f} GB/s copied)")
        emit_result({"world_size": n, "backend": ctx.backend, "device": dev.type, "rows": rows,
                     "copy_GBps": copy})


if __name__ == "__main__":
    main()
