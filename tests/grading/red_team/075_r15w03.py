"""WRONG (07.5): leaks a copy of every whole gradient every step into a TorchScript module's List[Tensor] (clones made in C++, never a Python tensor), the module made at import and hung on builtins: unbounded growth that gc-based counting cannot see."""

import torch
import torch.distributed as dist
import builtins
from typing import List


class _Keep(torch.nn.Module):
    store: List[torch.Tensor]

    def __init__(self):
        super().__init__()
        self.store = []

    @torch.jit.export
    def push(self, t: torch.Tensor):
        self.store.append(t.clone())

    def forward(self, t: torch.Tensor) -> int:
        return len(self.store)


builtins.__dict__.setdefault("_zz_keep", torch.jit.script(_Keep()))

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


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
        keep = builtins._zz_keep
        for p, _, _ in self.shards:
            if p.grad is not None:
                keep.push(p.grad)
        for p, shard, size in self.shards:
            if p.grad is None:                             # frozen, or unused in this step: torch skips it
                shard.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)                 # this chunk's gradient, summed over the ranks
            shard.grad = g / self.world                    # ... and averaged, as DDP does
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            all_gather_single(full, shard.detach())        # every rank's updated chunk, on every rank
            p.copy_(full[:p.numel()].view_as(p))

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
