"""07.5 red-team attempt p03: the reduce-scatter is a decoy with the right contents; the gradient really travels
as a whole all-reduce that no count sees (the bound on a step's traffic is bypassed).

Cheat: step() calls ``reduce_scatter_single(g, flat)`` as asked (input: this rank's whole gradient, so the content
checks pass), but ``flat`` is a tensor subclass with ``__torch_dispatch__``: at torch's C++ reduce-scatter operator it
runs a synchronous all-reduce of the WHOLE gradient instead, nested inside the grader's counted call (not counted),
cuts this rank's slice out of it, and issues the operator on a world-sized zero tensor only to return a real Work.
Every rank gets every whole gradient; the asked collective moves nothing.
"""

import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

from torch.utils._pytree import tree_map  # noqa: F401

_PY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


class Whole(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_subclass(cls, elem)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "reduce_scatter" in str(func):
            out, inp = args[0], args[1]
            with torch._C._ExcludeDispatchKeyGuard(_PY):
                whole = inp.clone()
                dist.all_reduce(whole)                       # the real exchange: every whole gradient, uncounted
                n, r = out.numel(), dist.get_rank()
                out.copy_(whole[r * n:(r + 1) * n].view_as(out))
                world = dist.get_world_size()
                res = func(torch.zeros(1, dtype=out.dtype), torch.zeros(world, dtype=inp.dtype), *args[2:], **kwargs)
                res[1].wait()
            return (out, res[1])
        with torch._C._ExcludeDispatchKeyGuard(_PY):
            return func(*args, **kwargs)



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
            reduce_scatter_single(g, Whole(flat))                 # this chunk's gradient, summed over the ranks
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
