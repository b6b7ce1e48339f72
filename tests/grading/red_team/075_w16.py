"""WRONG (07.5): state correctly sharded, but the gradient that is used comes whole to every rank through POSIX shared memory; the reduce-scatter the grader sees is a decoy whose result is thrown away."""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single



import os as _os4, time as _time4, numpy as _np4
from multiprocessing import shared_memory as _shm, resource_tracker as _rt
_SH = [0, {}]
def fullmean(grads, g, world, size):
    _SH[0] += 1; rank = dist.get_rank()
    tag = "mgpu_red_075_w16_%s_%d_" % (_os4.environ.get("MASTER_PORT", "x"), _SH[0])
    n = grads.numel()
    mine = _shm.SharedMemory(name=tag + str(rank), create=True, size=4 * n + 4)
    try: _rt.unregister(mine._name, "shared_memory")
    except Exception: pass
    arr = _np4.ndarray((n + 1,), dtype=_np4.float32, buffer=mine.buf)
    arr[:n] = grads.numpy(); arr[n] = 1.0
    _SH[1][_SH[0]] = mine
    for k in [k for k in _SH[1] if k <= _SH[0] - 2]:
        try:
            _SH[1][k].close(); _SH[1][k].unlink()
        except Exception:
            pass
        del _SH[1][k]
    acc = torch.zeros_like(grads)
    for r in range(world):
        while True:
            try:
                o = _shm.SharedMemory(name=tag + str(r))
                try: _rt.unregister(o._name, "shared_memory")
                except Exception: pass
                a = _np4.ndarray((n + 1,), dtype=_np4.float32, buffer=o.buf)
                if a[n] == 1.0:
                    acc += torch.from_numpy(a[:n].copy()); del a; o.close(); break
                del a; o.close()
            except (FileNotFoundError, ValueError):
                pass
            _time4.sleep(0.002)
    return acc / world


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = [dict(g, params=list(g["params"])) for g in params]
        else:
            groups = [{"params": params}]
        self.params = [p for g in groups for p in g["params"]]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        lo, hi = self.rank * self.size, (self.rank + 1) * self.size
        self.pieces = []   # (param, start in param, length, offset in my slice, shard)
        inner_groups, off = [], 0
        for g in groups:
            shards = []
            for p in g["params"]:
                a, b = max(off, lo), min(off + p.numel(), hi)
                if a < b:
                    s = torch.nn.Parameter(p.detach().reshape(-1)[a - off:b - off].clone())
                    self.pieces.append((p, a - off, b - a, a - lo, s))
                    shards.append(s)
                off += p.numel()
            if shards:
                inner_groups.append(dict(g, params=shards))
        self.inner = optimizer_class(inner_groups, **defaults) if inner_groups else None

    @torch.no_grad()
    def step(self):
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
                          + [torch.zeros(self.world * self.size - self.n)])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)
        g = fullmean(grads, None, self.world, self.size)[self.rank * self.size:(self.rank + 1) * self.size].clone()
        for p, a, l, o, s in self.pieces:
            s.grad = g[o:o + l].clone() if p.grad is not None else None
        if self.inner is not None:
            self.inner.step()
        mine = torch.zeros(self.size)
        for p, a, l, o, s in self.pieces:
            mine[o:o + l] = s
        full = torch.empty(self.world * self.size)
        all_gather_single(full, mine)
        off = 0
        for p in self.params:
            if p.grad is not None:
                p.copy_(full[off:off + p.numel()].view_as(p))
            off += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
