"""Solution of exercise 04.6 (for instructors): every rank calls the same collective, in the same order.

rank 0 called all_reduce while the others called broadcast: each collective waits for its partners in the
*same* call, so rank 0 waits in all_reduce for contributions the others never send, and they wait in
broadcast for data rank 0 never sends. One all_reduce on every rank does the job (sum, result everywhere).

Run:
    torchrun --standalone --nproc-per-node 4 exercises/solutions/04_fix_the_hang.py
"""
import torch.distributed as dist

from mgpu_utils.dist import distributed
from mgpu_utils.grading.coding.collectives import emit_every_rank, start_values


def main():
    with distributed() as ctx:
        t = start_values(ctx.rank)                   # 4 numbers of this rank's own
        dist.all_reduce(t)                           # every rank: the sum, on every rank
        emit_every_rank(ctx, t)                      # (keep this line: the grader reads every rank's t)


if __name__ == "__main__":
    main()
