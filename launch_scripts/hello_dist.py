"""Hello, distributed world: every rank reports in, then the ranks add up their rank ids.

The first launch script of the course (notebooks/00_setup.ipynb). Each rank prints who it is;
an all-reduce sums the rank ids (expected: 0 + 1 + ... + (n-1) = n(n-1)/2) and an all-gather
collects every rank's process id, so you can see that the ranks really are separate processes.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/hello_dist.py
"""
import argparse
import os

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="this rank raises ValueError('boom') (to see how failures are reported)")
    args = parser.parse_args()

    with distributed() as ctx:
        node = int(os.environ.get("GROUP_RANK", "0"))   # torchrun's node index (0 with --standalone)
        ctx.log(f"pid {os.getpid()}, node {node}, local rank {ctx.local_rank}, device {ctx.device}", all_ranks=True)
        if ctx.rank == args.fail_rank:
            raise ValueError("boom")
        # region hello
        t = torch.tensor([float(ctx.rank)], device=ctx.device)
        pids, nodes = [os.getpid()] * ctx.world_size, [node] * ctx.world_size
        if dist.is_initialized():
            dist.all_reduce(t)                      # sum over ranks, result on every rank
            dist.all_gather_object(pids, os.getpid())
            dist.all_gather_object(nodes, node)
        # endregion
        emit_result({"world_size": ctx.world_size, "backend": ctx.backend, "reason": ctx.reason,
                     "sum_of_ranks": int(t.item()), "pids": pids, "node_of_rank": nodes})


if __name__ == "__main__":
    main()
