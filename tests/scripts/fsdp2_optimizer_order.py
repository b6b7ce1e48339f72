"""Test helper: an optimizer built before fully_shard (lesson 07), against one built after.

Every rank trains a make_mlp(32, 2), sharded per Linear then at the root (as zero_fsdp.py does), for 3 Adam steps
on the same batch, and compares it with one process's model (mgpu_utils.checks.shard_max_diff):

* wrong order: the optimizer holds the unsharded tensors. torch raises nothing and the parameters do not move;
  mgpu_utils.checks.check_optimizer_matches refuses it (its message is reported);
* right order: the check passes and the model equals one process's.

    torchrun --standalone --nproc-per-node 2 tests/scripts/fsdp2_optimizer_order.py
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from mgpu_utils.checks import check_optimizer_matches, shard_max_diff
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.models import make_mlp


def shard(model, mesh):
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(model, opt, x, y, steps=3):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def main():
    with distributed() as ctx:
        mesh = device_mesh(ctx.device.type, (ctx.world_size,))
        torch.manual_seed(0)
        base = make_mlp(32, 2).to(ctx.device)
        x, y = torch.randn(16, 64, device=ctx.device), torch.randint(0, 10, (16,), device=ctx.device)
        ref = copy.deepcopy(base)
        train(ref, torch.optim.Adam(ref.parameters(), lr=1e-2), x, y)

        wrong = copy.deepcopy(base)
        opt = torch.optim.Adam(wrong.parameters(), lr=1e-2)      # the mistake: before fully_shard
        shard(wrong, mesh)
        train(wrong, opt, x, y)                                   # torch raises nothing
        try:
            check_optimizer_matches(wrong, opt)
            error = None
        except ValueError as e:
            error = str(e)

        right = shard(copy.deepcopy(base), mesh)
        opt = torch.optim.Adam(right.parameters(), lr=1e-2)      # after fully_shard
        check_optimizer_matches(right, opt)
        train(right, opt, x, y)
        emit_result({"world_size": ctx.world_size,
                     "wrong": {"error": error, "moved": shard_max_diff(wrong, base),
                               "max_diff_vs_one_process": shard_max_diff(wrong, ref)},
                     "right": {"max_diff_vs_one_process": shard_max_diff(right, ref)}})


if __name__ == "__main__":
    main()
