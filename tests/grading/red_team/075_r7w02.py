# WRONG: the reduce-scatter and all-gather replaced by file exchange through libc (ctypes) with barriers.
import os, torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        if params and isinstance(params[0], dict):
            groups = [dict(g, params=list(g["params"])) for g in params]
        else:
            groups = [{"params": params}]
        self.params = [p for g in groups for p in g["params"]]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        W, r = self.world, self.rank
        self.n = sum(p.numel() for p in self.params)
        self.size = S = -(-self.n // W)
        lo, hi = r * S, (r + 1) * S
        self.pieces = []                        # (param, start in param, end, piece tensor)
        inner_groups, off = [], 0
        for g in groups:
            opts = {k: v for k, v in g.items() if k != "params"}
            mine = []
            for p in g["params"]:
                a, b = max(lo, off), min(hi, off + p.numel())
                if a < b:
                    t = p.detach().reshape(-1)[a - off:b - off].clone()
                    self.pieces.append((p, a - off, b - off, t, a - lo)); mine.append(t)
                off += p.numel()
            if mine:
                inner_groups.append(dict(opts, params=mine))
        if not inner_groups:
            inner_groups = [{"params": [torch.zeros(0)]}]
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self):
        W, S, r = self.world, self.size, self.rank
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
                          + [torch.zeros(W * S - self.n)])
        g = self.reduce(grads)
        for p, a, b, t, o in self.pieces:
            t.grad = None if p.grad is None else g[o:o + b - a].clone()
        self.inner.step()
        mine = torch.zeros(S)
        for p, a, b, t, o in self.pieces:
            mine[o:o + b - a] = t
        full = self.gather(mine)
        off = 0
        for p in self.params:
            if p.grad is not None:
                p.copy_(full[off:off + p.numel()].view_as(p))
            off += p.numel()

    def reduce(self, grads):
        g = torch.empty(self.size); reduce_scatter_single(g, grads); return g.div_(self.world)

    def gather(self, mine):
        full = torch.empty(self.world * self.size); all_gather_single(full, mine); return full

    def zero_grad(self):
        for p in self.params:
            p.grad = None

import ctypes, numpy as np
_libc = ctypes.CDLL(None)
_C = [0]
def _put(name, t):
    a = np.ascontiguousarray(t.detach().numpy().astype(np.float32)); fd = _libc.open(name.encode(), 0o1101, 0o644)
    _libc.write(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); _libc.close(fd)
def _get(name, n):
    a = np.empty(n, dtype=np.float32); fd = _libc.open(name.encode(), 0)
    _libc.read(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); _libc.close(fd)
    return torch.from_numpy(a)
def _exchange(t):
    """every rank's t, via files written by libc; barrier only."""
    _C[0] += 1; W, r = dist.get_world_size(), dist.get_rank()
    b = "/tmp/mgpu_red_rt7x_%s_%d_%d_" % (os.environ.get("MASTER_PORT", "x"), _C[0], W)
    _put(b + str(r), t); dist.barrier()
    out = [_get(b + str(k), t.numel()) for k in range(W)]; dist.barrier(); return out

def _reduce(self, grads):
    S, r = self.size, self.rank
    return sum(x[r * S:(r + 1) * S] for x in _exchange(grads)) / self.world
def _gather(self, mine):
    return torch.cat(_exchange(mine))
ShardedOptimizer.reduce = _reduce; ShardedOptimizer.gather = _gather
