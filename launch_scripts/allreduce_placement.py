"""Which ranks share a node, measured: the messages of a flat and a hierarchical ring all-reduce, logged hop by hop,
under two placements of the ranks on nodes, and the time a link emulator gives them (notebooks/04_collectives.ipynb).

Both all-reduces are written from send/recv here, so that every message is seen: a flat ring over all n ranks, and
lesson 04's two levels (ring reduce-scatter inside each "node" of k consecutive ranks, ring all-reduce of each
chunk between the nodes, ring all-gather inside the node); each ring step posts its send and receive together
(batch_isend_irecv, as NCCL needs). Both are checked equal to dist.all_reduce (integer data: exact). Every rank
logs the messages it sends: (phase, ring step, source, destination, bytes).

The algorithm takes a node to be k consecutive ranks, as torchrun numbers them. Two placements of ranks on real
nodes are then replayed from the same log:
  block        rank r on node r // k: the algorithm's "nodes" are the real ones
  interleaved  rank r on node r % (n / k): ranks dealt round-robin (a hostfile listed by slot, not by node)
Per placement: the bytes each rank sends to another node, and the emulated time: the ring steps run one after
another, each as long as its slowest message, alpha + bytes / B of the link it crosses (--intra inside a node,
--inter between nodes; mgpu_utils.costs.hardware.LINKS). For the block placement this is exactly the model of
mgpu_utils.costs.interconnect.hierarchical_allreduce_seconds (tested). Rank 0 prints one JSON line.
World size: a multiple of --ranks-per-node (one node, as with 1 rank, sends nothing between nodes).
    torchrun --standalone --nproc-per-node 4 launch_scripts/allreduce_placement.py
"""
import argparse
import collections

import torch
import torch.distributed as dist

from mgpu_utils.costs.interconnect import link_alpha_beta
from mgpu_utils.dist import distributed, emit_result


def ring(chunks, ranks, phase, log, reduce):
    """One ring pass over ``ranks`` (global ranks, in ring order) on this rank's ``chunks`` (one per
    member): a reduce-scatter (``reduce``; member i ends with chunk i+1 summed) or an all-gather."""
    n, me = len(ranks), ranks.index(dist.get_rank())
    nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
    for step in range(n - 1):
        send = (me - step) % n if reduce else (me + 1 - step) % n
        recv = (me - step - 1) % n if reduce else (me - step) % n
        out, buf = chunks[send].contiguous(), torch.empty_like(chunks[recv])
        # posted together: on NCCL a lone isend may wait for its irecv, and every rank sends first
        ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, buf, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        chunks[recv] = chunks[recv] + buf if reduce else buf
        log.append((phase, step, dist.get_rank(), nxt, out.numel() * out.element_size()))
    return chunks


def flat_all_reduce(t, n, log):
    chunks = ring(list(t.chunk(n)), list(range(n)), "flat reduce-scatter", log, True)
    return torch.cat(ring(chunks, list(range(n)), "flat all-gather", log, False))


def hierarchical_all_reduce(t, n, k, log):
    """Ring reduce-scatter in the node, ring all-reduce of this rank's chunk between the nodes,
    ring all-gather in the node. ``t.numel()`` must divide by n."""
    rank, m = dist.get_rank(), n // k
    node = list(range(rank // k * k, rank // k * k + k))    # the algorithm's node: k consecutive
    peers = list(range(rank % k, n, k))                     # the same local rank on every node
    chunks = ring(list(t.chunk(k)), node, "intra reduce-scatter", log, True)
    mine = (node.index(rank) + 1) % k                       # the chunk it now holds, node-summed
    parts = ring(list(chunks[mine].chunk(m)), peers, "inter reduce-scatter", log, True)
    chunks[mine] = torch.cat(ring(parts, peers, "inter all-gather", log, False))
    return torch.cat(ring(chunks, node, "intra all-gather", log, False))


def replay(logs, node_of, intra, inter):
    """(emulated seconds, most bytes one rank sent to other nodes) of everyone's messages, with
    rank r on node ``node_of(r)``: the ring steps one after another, each as long as its slowest
    message, alpha + bytes / B of the link that message crosses."""
    (a_in, b_in), (a_out, b_out) = link_alpha_beta(intra), link_alpha_beta(inter)
    steps, crossing = {}, collections.Counter()
    for phase, step, src, dst, nbytes in logs:
        far = node_of(src) != node_of(dst)
        t = (a_out + nbytes / b_out) if far else (a_in + nbytes / b_in)
        steps[(phase, step)] = max(steps.get((phase, step), 0.0), t)
        crossing[src] += nbytes if far else 0
    return sum(steps.values()), max(crossing.values(), default=0)


def main():
    p = argparse.ArgumentParser(description="flat and hierarchical all-reduce messages under two placements")
    p.add_argument("--ranks-per-node", type=int, default=2, help="k: ranks the algorithm puts on one node")
    p.add_argument("--sizes-kib", default="4,4096", help="fp32 message sizes to log and replay, KiB")
    p.add_argument("--intra", default="NVLink 4 (H100, 18 links)", help="link inside a node (LINKS key)")
    p.add_argument("--inter", default="InfiniBand NDR (400 Gb/s)", help="link between nodes (LINKS key)")
    a = p.parse_args()
    link_alpha_beta(a.intra), link_alpha_beta(a.inter)           # unknown names fail here, with the list

    with distributed() as ctx:
        k, n = a.ranks_per_node, ctx.world_size
        if k < 1 or n % k:
            raise SystemExit(f"needs a world size that is a multiple of --ranks-per-node {k} (got {n}): "
                             f"e.g. torchrun --nproc-per-node {2 * max(k, 1)}")
        placements = {"block": lambda r: r // k, "interleaved": lambda r: r % (n // k)}
        rows = []
        for kib in (int(v) for v in a.sizes_kib.split(",")):
            numel = kib * 256 // n * n or n
            g = torch.Generator().manual_seed(kib * 100 + ctx.rank)
            x = torch.randint(-8, 9, (numel,), generator=g).float().to(ctx.device)
            want = x.clone()
            dist.all_reduce(want)
            row = {"bytes": numel * 4}
            for name, fn in (("flat", lambda t, log: flat_all_reduce(t, n, log)),
                             ("hierarchical", lambda t, log: hierarchical_all_reduce(t, n, k, log))):
                log = []
                got = fn(x.clone(), log)
                assert torch.equal(got, want), f"{name}: differs from dist.all_reduce on rank {ctx.rank}"
                logs = [log]
                if n > 1:
                    logs = [None] * n
                    dist.all_gather_object(logs, log)
                everyone = [m for per_rank in logs for m in per_rank]
                row[name] = {"messages": len(everyone)}
                for place, node_of in placements.items():
                    secs, far = replay(everyone, node_of, a.intra, a.inter)
                    row[name][place] = {"emulated_s": secs, "max_cross_node_bytes": far}
            rows.append(row)
            ctx.log(f"{kib} KiB, {n // k} nodes of {k}: " + "; ".join(
                f"{alg} {place} {row[alg][place]['emulated_s'] * 1e6:.1f} us"
                for alg in ("flat", "hierarchical") for place in placements))
        emit_result({"world_size": n, "ranks_per_node": k, "nodes": n // k, "intra": a.intra, "inter": a.inter,
                     "rows": rows})


if __name__ == "__main__":
    main()
