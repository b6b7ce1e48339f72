# WRONG: as r01, but every rank also keeps a full copy of every gathered parameter between steps in libc-malloc'd memory (invisible to Python/tensor accounting).
import os, torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


def _ag(shard):
    out = shard.new_empty(dist.get_world_size() * shard.numel()); all_gather_single(out, shard.contiguous()); return out


def _rs(flat):
    out = flat.new_empty(flat.numel() // dist.get_world_size()); reduce_scatter_single(out, flat.contiguous()); return out


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, shape, numel, owner):
        ctx.numel, ctx.owner = numel, owner
        return owner.gather(owner.cast(shard))[:numel].view(shape)

    @staticmethod
    def backward(ctx, grad):
        W = dist.get_world_size(); c = -(-ctx.numel // W)
        flat = torch.cat([grad.reshape(-1).float(), grad.new_zeros(W * c - ctx.numel, dtype=torch.float32)])
        return ctx.owner.scatter(flat) / W, None, None, None


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self._mod = [module]                                   # not registered: its params are not ours
        self.compute_dtype = compute_dtype
        W, r = dist.get_world_size(), dist.get_rank()
        self.names, self.shapes, self.numels = [], [], []
        self.shards = torch.nn.ParameterList()
        for name, p in module.named_parameters():
            c = -(-p.numel() // W)
            flat = torch.cat([p.detach().reshape(-1).float(), p.new_zeros(W * c - p.numel(), dtype=torch.float32)])
            self.shards.append(torch.nn.Parameter(flat[r * c:(r + 1) * c].clone(), requires_grad=p.requires_grad))
            self.names.append(name); self.shapes.append(p.shape); self.numels.append(p.numel())
            p.data = torch.empty(0)

    def gather(self, shard):
        return _ag(shard)

    def scatter(self, flat):
        return _rs(flat)

    def cast(self, s):
        return s.to(self.compute_dtype) if self.compute_dtype is not None else s

    def forward(self, x):
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        full = {n: _Gather.apply(s, shp, k, self)
                for n, s, shp, k in zip(self.names, self.shards, self.shapes, self.numels)}
        return functional_call(self._mod[0], full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        return {n: _ag(s.detach().float())[:k].view(shp).clone()
                for n, s, shp, k in zip(self.names, self.shards, self.shapes, self.numels)}

import ctypes
_libc = ctypes.CDLL(None); _libc.malloc.restype = ctypes.c_void_p
_HID = {}
def _g(self, shard):
    out = _ag(shard)
    key = (id(self), shard.numel())
    nb = out.numel() * out.element_size()
    _HID.setdefault(key, [])
    addr = _libc.malloc(ctypes.c_size_t(nb)); ctypes.memmove(addr, out.data_ptr(), nb)
    for a in _HID[key]: _libc.free(ctypes.c_void_p(a))
    _HID[key] = [addr]
    return out
MyFSDP.gather = _g
