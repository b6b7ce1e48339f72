"""WRONG (07.5): honest ZeRO-1 step, but every step leaks a full copy of all parameters and whole local gradients into zlib decompressors held by a helper thread's locals (C-side unconsumed_tail)."""
import queue
import threading
import zlib

import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


def _keeper(inbox):
    kept = []
    while True:
        data = inbox.get()
        if data is None:
            return
        d = zlib.decompressobj()
        d.decompress(zlib.compress(data, 0), 1)          # the rest stays in d.unconsumed_tail
        kept.append(d)
        data = None


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
        self._box = queue.Queue()
        threading.Thread(target=_keeper, args=(self._box,), daemon=True).start()

    @torch.no_grad()
    def step(self):
        leak = []
        for p, shard, size in self.shards:
            if p.grad is None:
                shard.grad = None
                continue
            leak.append(p.grad.detach().reshape(-1).clone())
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)
            shard.grad = g / self.world
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            all_gather_single(full, shard.detach())
            p.copy_(full[:p.numel()].view_as(p))
            leak.append(p.detach().reshape(-1).clone())
        if leak:
            self._box.put(torch.cat(leak).numpy().tobytes())
        del leak

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
