"""All-reduce built from point-to-point messages, checked and timed (notebooks/04_collectives.ipynb).

Three algorithms, each using only send/recv (isend/irecv):
  naive - every rank sends its tensor to rank 0, which adds and sends the sum back:
          rank 0 sends (n-1)S bytes and receives (n-1)S, in 2(n-1) messages; the others send S.
  tree  - binomial-tree reduce to rank 0, then a binomial-tree broadcast: 2*ceil(log2 n) steps of S.
  ring  - reduce-scatter (n-1 steps) then all-gather (n-1 steps) around a ring; each step every rank
          sends one chunk of S/n to its right neighbour: 2(n-1)/n * S bytes per rank, for any n.
Each result is checked against dist.all_reduce (fp32 and bf16; lengths shorter than n, divisible and not
divisible by n; integer-valued data so every summation order gives exactly the same answer), then all
four are timed, interleaved (barrier before each call, slowest rank's time; nccl-tests instead averages back-to-back
calls, which reads lower for small messages).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/ring_allreduce.py
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def naive_all_reduce(t):
    """Reduce to rank 0, then broadcast from it, with blocking send/recv. In place; t is 1-D."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, n):
            dist.recv(buf, src)
            t += buf
        for dst in range(1, n):
            dist.send(t, dst)
    else:
        dist.send(t, 0)
        dist.recv(t, 0)
    return t


def tree_all_reduce(t):
    """Binomial-tree reduce to rank 0 (ceil(log2 n) steps), then binomial-tree broadcast. In place."""
    rank, n = dist.get_rank(), dist.get_world_size()
    buf, mask = torch.empty_like(t), 1
    while mask < n:                       # reduce: at level k, ranks with bit k set hand over
        if rank & mask:
            dist.send(t, rank - mask)
            break
        if rank + mask < n:
            dist.recv(buf, rank + mask)
            t += buf
        mask <<= 1
    mask = 1 << max(0, (n - 1).bit_length() - 1)
    while mask >= 1:                      # broadcast: the same tree, top level first
        if rank % (2 * mask) == 0 and rank + mask < n:
            dist.send(t, rank + mask)
        elif rank % (2 * mask) == mask:
            dist.recv(t, rank - mask)
        mask >>= 1
    return t


def _exchange(send, recv, right, left):
    """Send to the right neighbour and receive from the left one at the same time.

    batch_isend_irecv posts both together: with NCCL, a lone isend can wait for its matching irecv,
    and every rank sending first around a ring would then wait forever (gloo does not mind either way).
    """
    ops = ([dist.P2POp(dist.isend, send, right)] if send.numel() else []) + \
          ([dist.P2POp(dist.irecv, recv, left)] if recv.numel() else [])
    for r in dist.batch_isend_irecv(ops) if ops else []:
        r.wait()


def ring_all_reduce(t):
    """Ring all-reduce of a 1-D contiguous tensor, in place: 2(n-1) steps of one chunk each.

    Chunk c is t.tensor_split(n)[c] (sizes differ by at most one element, so any length works).
    Reduce-scatter: at step s rank r sends chunk (r - s) mod n and adds the received chunk
    (r - s - 1) mod n; afterwards rank r holds the complete sum of chunk (r + 1) mod n. All-gather:
    at step s rank r sends chunk (r + 1 - s) mod n and stores the received chunk (r - s) mod n.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(t.tensor_split(n))      # views into t: writing a chunk writes t
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):                # phase 1: reduce-scatter
        recv_c = (rank - s - 1) % n
        buf = torch.empty_like(chunks[recv_c])
        _exchange(chunks[(rank - s) % n], buf, right, left)
        chunks[recv_c] += buf
    for s in range(n - 1):                # phase 2: all-gather
        recv_c = (rank - s) % n
        buf = torch.empty_like(chunks[recv_c])
        _exchange(chunks[(rank + 1 - s) % n], buf, right, left)
        chunks[recv_c].copy_(buf)
    return t


def library_all_reduce(t):
    dist.all_reduce(t)
    return t


ALGORITHMS = {"dist.all_reduce": library_all_reduce, "ring": ring_all_reduce, "tree": tree_all_reduce,
              "naive": naive_all_reduce}


def check(rank, world, device, lengths):
    """Every algorithm against dist.all_reduce; returns the number of (algorithm, dtype, length) cases."""
    cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        for length in lengths:
            g = torch.Generator().manual_seed(1000 * rank + length)
            x = torch.randint(-8, 9, (length,), generator=g).to(dtype).to(device)  # exact in bf16 too
            expected = x.clone()
            dist.all_reduce(expected)
            for name, fn in ALGORITHMS.items():
                if fn is library_all_reduce:
                    continue
                got = fn(x.clone())
                if not torch.equal(got, expected):
                    raise AssertionError(f"{name} differs from dist.all_reduce for {dtype}, length {length} "
                                         f"on rank {rank}: max diff {(got - expected).abs().max().item()}")
                cases += 1
    return cases


def timed(fns, t, repeats, device):
    """Median over repeats of the slowest rank's time for each fn(t), in seconds (after one warm-up each).

    The algorithms are interleaved: each repeat times every one once, in an order rotated by one per
    repeat, so a slow spell of a shared machine falls on all of them alike and their ratios stay stable.
    """
    for fn in fns.values():
        fn(t.clone())
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            x = t.clone()
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fns[name](x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)   # the slowest rank decides
            times[name].append(dt.item())
    return {name: statistics.median(v) for name, v in times.items()}


def main():
    p = argparse.ArgumentParser(description="ring, tree and naive all-reduce vs dist.all_reduce")
    p.add_argument("--sizes-kib", default="4,64,1024,4096,16384", help="fp32 message sizes to time, KiB")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per size (median reported)")
    p.add_argument("--check-lengths", default="1,3,7,64,1001", help="tensor lengths for the equality check")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), help="which ones to time")
    args = p.parse_args()

    with distributed() as ctx:
        if not dist.is_initialized():
            raise SystemExit("these algorithms need a process group: run under torchrun (--nproc-per-node 1 works)")
        world = ctx.world_size
        cases = check(ctx.rank, world, ctx.device, [int(v) for v in args.check_lengths.split(",")])
        ctx.log(f"all {cases} checks equal to dist.all_reduce (fp32, bf16)")
        rows = []
        for kib in (int(v) for v in args.sizes_kib.split(",") if v):
            t = torch.randn(kib * 1024 // 4, device=ctx.device)
            secs = timed({name: ALGORITHMS[name] for name in args.algorithms.split(",")}, t, args.repeats,
                         ctx.device)
            rows += [{"algorithm": name, "bytes": t.numel() * 4, "seconds": sec} for name, sec in secs.items()]
            ctx.log(f"{kib:>6} KiB: " + "  ".join(f"{r['algorithm']} {1e3 * r['seconds']:.2f} ms"
                                                   for r in rows[-len(args.algorithms.split(',')):]))
        emit_result({"world_size": world, "backend": ctx.backend, "checks_passed": cases, "timings": rows})


if __name__ == "__main__":
    main()
