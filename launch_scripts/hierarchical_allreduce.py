"""A two-level (hierarchical) all-reduce built from subgroups, proven equal to dist.all_reduce
(notebooks/04_collectives.ipynb).

The ranks are grouped into "nodes" of --ranks-per-node consecutive ranks (k; torchrun numbers a node's ranks
consecutively, so on a real cluster these are the GPUs that share NVLink). Two kinds of subgroup:
  intra: the k ranks of one node;   inter: the ranks with the same local rank on every node.
The all-reduce of a tensor of S bytes is then
  1. reduce-scatter inside the node: local rank j ends with chunk j (S/k bytes) summed over its node;
  2. all-reduce of that chunk between the nodes, over the inter group: every node's sum;
  3. all-gather inside the node: every rank has every chunk.
Per rank: (k-1)/k S bytes in each of steps 1 and 3 inside the node, and 2(N-1)/N x S/k between the N nodes:
a flat ring would send 2(n-1)/n S over the slow link. Checked against dist.all_reduce for several lengths
(integer-valued data: every summation order gives the same result), then both timed on this machine.
Rank 0 prints one JSON line. World size: a multiple of --ranks-per-node.
    torchrun --standalone --nproc-per-node 4 launch_scripts/hierarchical_allreduce.py --ranks-per-node 2
"""
import argparse
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.compat import all_gather_single, reduce_scatter_single
from mgpu_utils.dist import distributed, emit_result, new_group
from mgpu_utils.timing import synced_clock


def node_groups(k):
    """(this rank's intra-node group, its inter-node group); every rank creates every group, in
    the same order (new_group, dist.new_group with the course's collective timeout, is itself a
    collective over the default group)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    intra = [new_group(list(range(g * k, (g + 1) * k))) for g in range(n // k)]
    inter = [new_group(list(range(j, n, k))) for j in range(k)]
    return intra[rank // k], inter[rank % k]


def hierarchical_all_reduce(t, intra, inter, k):
    """Sum of ``t`` (1-D) over all ranks, in three steps: reduce-scatter in the node, all-reduce of
    this rank's chunk between the nodes, all-gather in the node. Returns a new tensor; any length
    (padded to a multiple of k)."""
    padded = F.pad(t, (0, -t.numel() % k))
    chunk = torch.empty(padded.numel() // k, dtype=t.dtype, device=t.device)
    reduce_scatter_single(chunk, padded, group=intra)             # 1. my chunk, summed over my node
    dist.all_reduce(chunk, group=inter)                           # 2. ... and over every node
    out = torch.empty_like(padded)
    all_gather_single(out, chunk, group=intra)                    # 3. every chunk, on every rank of the node
    return out[:t.numel()]


def main():
    p = argparse.ArgumentParser(description="hierarchical all-reduce from subgroups against dist.all_reduce")
    p.add_argument("--ranks-per-node", type=int, default=2, help="k: ranks that share a node")
    p.add_argument("--check-lengths", default="1,3,7,64,1001", help="tensor lengths for the equality check")
    p.add_argument("--sizes-kib", default="64,4096", help="fp32 message sizes to time, KiB")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per size (median)")
    a = p.parse_args()

    with distributed() as ctx:
        k, n = a.ranks_per_node, ctx.world_size
        if not dist.is_initialized() or n % k:
            raise SystemExit(f"needs a world size that is a multiple of --ranks-per-node {k} under torchrun "
                             f"(got {n}): e.g. torchrun --nproc-per-node {2 * k}")
        intra, inter = node_groups(k)
        cases = 0
        for length in (int(v) for v in a.check_lengths.split(",")):
            g = torch.Generator().manual_seed(length * 100 + ctx.rank)
            x = torch.randint(-8, 9, (length,), generator=g).float().to(ctx.device)
            want = x.clone()
            dist.all_reduce(want)
            got = hierarchical_all_reduce(x, intra, inter, k)
            assert torch.equal(got, want), f"length {length}: differs from dist.all_reduce on rank {ctx.rank}"
            cases += 1
        ctx.log(f"{n} ranks as {n // k} nodes of {k}: equal to dist.all_reduce for {cases} lengths")
        timings = []
        for kib in (int(v) for v in a.sizes_kib.split(",") if v):
            t = torch.randn(kib * 256, device=ctx.device)
            row = {"bytes": t.numel() * 4}
            for name, fn in (("flat", lambda x: dist.all_reduce(x)),
                             ("hierarchical", lambda x: hierarchical_all_reduce(x, intra, inter, k))):
                times = []
                for _ in range(a.repeats + 1):
                    x = t.clone()
                    dist.barrier()                      # on gloo (the CPU side): the device is synced next
                    t0 = synced_clock(ctx.device)
                    fn(x)
                    times.append(synced_clock(ctx.device) - t0)     # on NCCL fn returns once queued
                row[name + "_s"] = statistics.median(times[1:])
            timings.append(row)
            ctx.log(f"{kib} KiB: flat {row['flat_s'] * 1e3:.2f} ms, "
                    f"hierarchical {row['hierarchical_s'] * 1e3:.2f} ms")
        emit_result({"world_size": n, "ranks_per_node": k, "nodes": n // k, "checks_passed": cases,
                     "timings": timings})


if __name__ == "__main__":
    main()
