"""Test helper: a rank that fails on the first attempt only, and a long result line (tests/repo/test_slurm.py, issue 57).

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 2 --max-restarts 1 \
        tests/scripts/fail_once.py --rank 1 --result-chars 3000

On attempt 0 (TORCHELASTIC_RESTART_COUNT) rank --rank raises after joining the group, while the others wait in an
all-reduce; on the retry every rank all-reduces and rank 0 prints a result line of at least --result-chars
characters: the attempt, the sum, and each rank's TORCHELASTIC_USE_AGENT_STORE ("False" when the workers make
their own store, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), padded with a list of numbers.
"""
import argparse
import os

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result

p = argparse.ArgumentParser()
p.add_argument("--rank", type=int, default=1, help="the rank that fails on the first attempt")
p.add_argument("--result-chars", type=int, default=0, help="the result line's least length")
a = p.parse_args()

with distributed(quiet=True) as ctx:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 and ctx.rank == a.rank:
        raise RuntimeError(f"rank {ctx.rank} fails on attempt 0, as a flaky node would")
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    stores = [None] * ctx.world_size
    dist.all_gather_object(stores, os.environ.get("TORCHELASTIC_USE_AGENT_STORE"))
    emit_result({"attempt": attempt, "world_size": ctx.world_size, "sum_of_ranks": t.item(),
                 "agent_store": stores, "padding": list(range(a.result_chars // 5))})
