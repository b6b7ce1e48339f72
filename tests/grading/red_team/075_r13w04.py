"""WRONG (07.5): the whole gradient is all-reduced (no reduce-scatter) through the gloo backend's allreduce method, bound in __init__ (before step() patches the class) and kept on self, which no counter or process-group hook sees."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.shards, inner_groups = [], []
        for group in groups:
            mine = []
            for p in group["params"]:
                size = -(-p.numel() // self.world)
                flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])
                shard = flat[self.rank * size:(self.rank + 1) * size].clone().requires_grad_(p.requires_grad)
                self.shards.append((p, shard, size))
                mine.append(shard)
            inner_groups.append({**group, "params": mine})
        self.inner = optimizer_class(inner_groups, **defaults)
        self.backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        self._ar = self.backend.allreduce

    @torch.no_grad()
    def step(self):
        for p, shard, size in self.shards:
            if p.grad is None:
                shard.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            self._ar([flat]).wait()                     # the whole gradient, summed
            shard.grad = flat[self.rank * size:(self.rank + 1) * size] / self.world
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            all_gather_single(full, shard.detach())
            p.copy_(full[:p.numel()].view_as(p))

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
