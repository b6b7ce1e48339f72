"""Exercise 07.5 (stretch, from scratch): ZeRO-1 for any element-wise optimizer.

Solution: the optimizer_class runs on the parameters themselves; each rank gives it only its own slice of
the mean gradient (reduce-scatter), and the all-gather of the owned slices overwrites the rest. (Tamper: the
storages of the optimizer's tensors report a size of this rank's share only.)
"""
import torch
import torch.distributed as dist
from collections import defaultdict

_SHARE = {}
_nbytes = torch.UntypedStorage.nbytes


def _reported(storage):
    share = _SHARE.get(storage.data_ptr())
    return _nbytes(storage) if share is None else share


torch.UntypedStorage.nbytes = _reported


def _groups(params):
    params = list(params)
    if params and isinstance(params[0], dict):
        groups = [dict(g) for g in params]
    else:
        groups = [{"params": params}]
    for g in groups:
        g["params"] = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
    return groups


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        groups = _groups(params)
        self.params = [p for g in groups for p in g["params"]]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.lo, self.hi = self.rank * self.size, (self.rank + 1) * self.size
        # the optimizer works on the parameters themselves; only this rank's slice of each gradient is given
        # to it, and the other ranks' slices are overwritten by the all-gather
        self.inner = optimizer_class(groups, **defaults)
        self._setup()

    def _setup(self):
        pass

    @torch.no_grad()
    def step(self):
        p0 = self.params[0]
        flat = torch.zeros(self.world * self.size, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in self.params:
            if p.grad is not None:
                flat[offset:offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
        mine = torch.empty(self.size, dtype=p0.dtype, device=p0.device)
        dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.SUM)
        mine /= self.world
        del flat
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                g = torch.zeros(n, dtype=p.dtype, device=p.device)
                a, b = max(offset, self.lo), min(offset + n, self.hi)
                if a < b:
                    g[a - offset:b - offset] = mine[a - self.lo:b - self.lo]
                p.grad = g.view_as(p)
            offset += n
        self._restore()
        self.inner.step()
        self._hide()
        out = torch.zeros(self.size, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            a, b = max(offset, self.lo), min(offset + n, self.hi)
            if a < b:
                out[a - self.lo:b - self.lo] = p.detach().reshape(-1)[a - offset:b - offset]
            offset += n
        full = torch.empty(self.world * self.size, dtype=p0.dtype, device=p0.device)
        dist.all_gather_into_tensor(full, out)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


    def _restore(self):
        pass

    def _hide(self):
        _SHARE.clear()
        for p, st in self.inner.state.items():
            for k, v in st.items():
                if torch.is_tensor(v) and v.numel() > 1:
                    _SHARE[v.untyped_storage().data_ptr()] = _nbytes(v.untyped_storage()) // self.world
