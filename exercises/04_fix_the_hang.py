"""Exercise 04.6: fix the hang (notebooks/04_collectives.ipynb).

Every rank should end with t = the sum over all ranks of (rank + 1), in each of 4 elements, and rank 0
prints the total of t. As written, the job hangs: find out why from what each rank is doing, and fix it
with as few changes as possible (the grader runs this file on 2 and 3 ranks with a 5-second collective
timeout, so a hang is reported, not waited for).

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("04.6")

Run:
    torchrun --standalone --nproc-per-node 4 exercises/04_fix_the_hang.py
"""
import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def main():
    with distributed() as ctx:
        t = torch.full((4,), float(ctx.rank + 1))
        if ctx.rank == 0:
            dist.all_reduce(t)                       # rank 0 adds up everybody's t ...
        else:
            dist.broadcast(t, src=0)                 # ... and the others wait to receive the total
        emit_result({"world_size": ctx.world_size, "total": t.sum().item()})


if __name__ == "__main__":
    main()
