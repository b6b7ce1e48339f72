"""Solution of exercise 04.6 (for instructors): every rank calls the same collective, in the same order.

rank 0 called all_reduce while the others called broadcast: each collective waits for its partners in the
*same* call, so rank 0 waits in all_reduce for contributions the others never send, and they wait in
broadcast for data rank 0 never sends. One all_reduce on every rank does the job (sum, result everywhere).

Run:
    torchrun --standalone --nproc-per-node 4 exercises/solutions/04_fix_the_hang.py
"""
import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def main():
    with distributed() as ctx:
        t = torch.full((4,), float(ctx.rank + 1))
        dist.all_reduce(t)                           # every rank: the sum, on every rank
        emit_result({"world_size": ctx.world_size, "total": t.sum().item()})


if __name__ == "__main__":
    main()
