"""Why dist.all_reduce is slow for small messages on gloo: the time follows the number of messages,
not the bytes (notebooks/04_collectives.ipynb, section 3).

gloo's ring all-reduce (gloo/allreduce.cc) splits the buffer into at least 2n segments, two per rank,
so that one segment travels while the previous one is being added, and passes them around the ring:
4(n-1) messages per rank instead of the textbook 2(n-1). Segments past the end of a short buffer are
empty and are not sent, so a buffer of k < 2n elements sends fewer messages. This script times
dist.all_reduce of fp32 buffers of 1, 2, ..., 2n elements (message count growing) and of much larger
ones (message count fixed, bytes growing), and a ping-pong between ranks 0 and 1 (one message each
way) as the cost of a single message.

Each timing: a barrier, then one call; the median over --repeats calls of the slowest rank.
Rank 0 prints one JSON line (MGPU_RESULT): world_size, backend, per element count the median
seconds ("allreduce_s": {elements: seconds}), "pingpong_s" (round trip, seconds; None at world size 1).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/allreduce_latency.py
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def slowest_median(fn, repeats, device):
    """Median over repeats of the slowest rank's time for one fn() after a barrier, in seconds."""
    for _ in range(3):
        fn()                                      # warm-up: buffers, connections, caches
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description="dist.all_reduce time against the number of elements")
    p.add_argument("--repeats", type=int, default=31, help="timed calls per size (median reported)")
    p.add_argument("--large", default="1024,65536", help="larger element counts (4 KiB and 256 KiB in fp32)")
    args = p.parse_args()

    with distributed() as ctx:
        if not dist.is_initialized():
            raise SystemExit("needs a process group: run under torchrun (--nproc-per-node 2 or more)")
        n, rank, device = ctx.world_size, ctx.rank, ctx.device
        counts = list(range(1, 2 * n + 1)) + [int(v) for v in args.large.split(",") if v]
        allreduce = {}
        for k in counts:
            t = torch.ones(k, device=device)
            allreduce[k] = slowest_median(lambda: dist.all_reduce(t), args.repeats, device)
            t.fill_(1.0)
            dist.all_reduce(t)
            assert torch.all(t == n), "all_reduce of ones must give the world size everywhere"
        ball = torch.zeros(1, device=device)

        def pingpong():
            if rank == 0:
                dist.send(ball, 1)
                dist.recv(ball, 1)
            elif rank == 1:
                dist.recv(ball, 0)
                dist.send(ball, 0)

        rtt = slowest_median(pingpong, args.repeats, device) if n > 1 else None
        ctx.log(", ".join(f"{k} el {1e3 * s:.2f} ms" for k, s in allreduce.items()))
        emit_result({"world_size": n, "backend": ctx.backend, "allreduce_s": allreduce, "pingpong_s": rtt}, rank)


if __name__ == "__main__":
    main()
