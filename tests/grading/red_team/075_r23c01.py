"""RED TEAM 07.5 c01 (a twenty-third red team; refused since by OutsideState walking the autograd graph of a tensor held outside: common._outside_graphs): the worked solution, plus whole local gradients and updated parameters kept between steps as the saved output of a relu (relu(cat[w, -w] + t)) whose 0-d sum hangs on the torch module: only C++ held the copy.
"""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


def _stash(tensors):
    """A whole-model buffer (the whole gradients and the whole updated parameters: Adam's two moments' worth) kept
    between steps, held only as the saved output of a relu in an autograd graph whose root, a 0-d tensor, hangs
    on the torch module."""
    with torch.enable_grad():
        flat = torch.cat([t.detach().float().reshape(-1) for t in tensors])
        t = torch.zeros((), requires_grad=True)
        torch._rt25_keep = torch.relu(torch.cat([flat, -flat]) + t).sum()


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's chunk of every parameter only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):  # a list of tensors is one group
            groups = [{"params": groups}]
        self.shards, inner_groups = [], []                 # (parameter, this rank's chunk of it, chunk size)
        for group in groups:
            mine = []
            for p in group["params"]:
                size = -(-p.numel() // self.world)         # elements per chunk; the last one padded with zeros
                flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])
                shard = flat[self.rank * size:(self.rank + 1) * size].clone().requires_grad_(p.requires_grad)
                self.shards.append((p, shard, size))
                mine.append(shard)
            inner_groups.append({**group, "params": mine})   # the group's own options, this rank's chunks
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self):
        for p, shard, size in self.shards:
            if p.grad is None:                             # frozen, or unused in this step: torch skips it
                shard.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)                 # this chunk's gradient, summed over the ranks
            shard.grad = g / self.world                    # ... and averaged, as DDP does
        _stash([p.grad for p, _, _ in self.shards if p.grad is not None])
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            all_gather_single(full, shard.detach())        # every rank's updated chunk, on every rank
            p.copy_(full[:p.numel()].view_as(p))
        torch._rt25_keep2 = torch._rt25_keep
        _stash([p for p, _, _ in self.shards])

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
