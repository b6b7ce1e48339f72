"""Why dist.all_reduce is slow for small messages on gloo: the time follows the number of messages,
not the bytes (notebooks/04_collectives.ipynb, section 3).

gloo's ring all-reduce (gloo/allreduce.cc) splits the buffer into at least 2n segments, two per rank,
so that one segment travels while the previous one is being added, and passes them around the ring:
4(n-1) messages per rank instead of the textbook 2(n-1). Segments past the end of a short buffer are
empty and are not sent, so a buffer of k < 2n elements sends fewer messages. This script times
dist.all_reduce of fp32 buffers of 1, 2, ..., 2n elements (message count growing) and of much larger
ones (message count fixed, bytes growing), and a ping-pong between ranks 0 and 1 (one message each
way) as the cost of a single message.

Each timing: a barrier, then one call, the slowest rank's time. The sizes are timed in interleaved
rounds (every size once per round, --repeats rounds), so a noisy stretch on a shared machine lands
on all sizes alike instead of on one size's block of calls. Each size reports the median and the best
(minimum): with more ranks than cores most calls also wait for a descheduled rank, which spreads the
median over milliseconds from run to run, while the best call is the cost of the messages alone.
Rank 0 prints one JSON line (MGPU_RESULT): world_size, backend, per element count the median and the
best seconds ("allreduce_s", "allreduce_best_s": {elements: seconds}), and the ping-pong round trip
("pingpong_s", "pingpong_best_s": seconds; None at world size 1).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/allreduce_latency.py
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def slowest_time(fn, device):
    """The slowest rank's time for one fn() after a barrier, in seconds (the same on every rank)."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def interleaved_times(fns, repeats, device):
    """{name: (median, best) seconds} over `repeats` rounds; a round times every fn once, in order.

    Interleaving puts the same machine noise on every size; three untimed rounds warm up buffers,
    connections and caches first.
    """
    for _ in range(3):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(slowest_time(fn, device))
    return {name: (statistics.median(ts), min(ts)) for name, ts in times.items()}


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
        buffers = {k: torch.ones(k, device=device) for k in counts}
        ball = torch.zeros(1, device=device)

        def pingpong():
            if rank == 0:
                dist.send(ball, 1)
                dist.recv(ball, 1)
            elif rank == 1:
                dist.recv(ball, 0)
                dist.send(ball, 0)

        fns = {k: (lambda t=t: dist.all_reduce(t)) for k, t in buffers.items()}
        if n > 1:
            fns["pingpong"] = pingpong
        stats = interleaved_times(fns, args.repeats, device)
        allreduce = {k: stats[k][0] for k in counts}
        best = {k: stats[k][1] for k in counts}
        rtt, rtt_best = stats.get("pingpong", (None, None))
        for t in buffers.values():
            t.fill_(1.0)
            dist.all_reduce(t)
            assert torch.all(t == n), "all_reduce of ones must give the world size everywhere"
        ctx.log(", ".join(f"{k} el {1e3 * s:.2f} ms (best {1e3 * best[k]:.2f})" for k, s in allreduce.items()))
        emit_result({"world_size": n, "backend": ctx.backend, "allreduce_s": allreduce, "allreduce_best_s": best,
                     "pingpong_s": rtt, "pingpong_best_s": rtt_best}, rank)


if __name__ == "__main__":
    main()
