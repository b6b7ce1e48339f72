"""Exercise 04.6: fix the hang (notebooks/04_collectives.ipynb).

Every rank starts with 4 numbers of its own (``start_values``: the grader draws new ones for every run)
and should end with t = their element-wise sum over all ranks, on every rank; the last line reports
every rank's t. As written, the job hangs: find out why from what each rank is doing, and fix it
with as few changes as possible (the grader runs this file on 2 and 3 ranks with a 5-second collective
timeout, so a hang is reported, not waited for).

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("04.6")

Run:
    torchrun --standalone --nproc-per-node 4 exercises/04_fix_the_hang.py
"""
import torch.distributed as dist

from mgpu_utils.dist import distributed
from mgpu_utils.grading.coding.collectives import emit_every_rank, start_values


def main():
    with distributed() as ctx:
        t = start_values(ctx.rank)                   # 4 numbers of this rank's own
        if ctx.rank == 0:
            dist.all_reduce(t)                       # rank 0 adds up everybody's t ...
        else:
            dist.broadcast(t, src=0)                 # ... and the others wait to receive the total
        emit_every_rank(ctx, t)                      # (keep this line: the grader reads every rank's t)


if __name__ == "__main__":
    main()
