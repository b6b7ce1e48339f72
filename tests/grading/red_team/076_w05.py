"""WRONG (07.6): forward gathers the parameters through POSIX shared memory (ranks publish shards); the all-gather the grader sees is a decoy whose output is thrown away"""
import torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single



import os as _os4, time as _time4, numpy as _np4
from multiprocessing import shared_memory as _shm, resource_tracker as _rt
_SH = [0, {}]
def shm_sum(t):
    _SH[0] += 1; rank = dist.get_rank(); world = dist.get_world_size()
    tag = "mgpu_red_076_w05_%s_%d_" % (_os4.environ.get("MASTER_PORT", "x"), _SH[0])
    n = t.numel()
    mine = _shm.SharedMemory(name=tag + str(rank), create=True, size=4 * n + 4)
    try: _rt.unregister(mine._name, "shared_memory")
    except Exception: pass
    arr = _np4.ndarray((n + 1,), dtype=_np4.float32, buffer=mine.buf)
    arr[:n] = t.detach().float().reshape(-1).numpy(); arr[n] = 1.0
    _SH[1][_SH[0]] = mine
    for k in [k for k in _SH[1] if k <= _SH[0] - 2]:
        try:
            _SH[1][k].close(); _SH[1][k].unlink()
        except Exception:
            pass
        del _SH[1][k]
    acc = torch.zeros(n)
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
    return acc


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, numel, shape, dtype, world):
        ctx.numel, ctx.world = numel, world
        full = torch.empty(shard.numel() * world, dtype=dtype)
        all_gather_single(full, shard.detach().to(dtype).contiguous())
        r = dist.get_rank()
        z = torch.zeros(shard.numel() * world)
        z.view(world, -1)[r] = shard.detach().to(dtype).float()
        real = shm_sum(z).to(dtype)
        return real[:numel].view(shape)

    @staticmethod
    def backward(ctx, grad):
        g = torch.zeros(ctx.world * (-(-ctx.numel // ctx.world)), dtype=torch.float32)
        g[:ctx.numel] = grad.reshape(-1).float()
        out = torch.empty(g.numel() // ctx.world)
        reduce_scatter_single(out, g)
        return out / ctx.world, None, None, None, None


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        object.__setattr__(self, "_module", module)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.dtype = compute_dtype
        self.names, self.meta = [], []
        self.shards = torch.nn.ParameterList()
        for name, p in module.named_parameters():
            size = -(-p.numel() // self.world)
            flat = torch.zeros(size * self.world)
            flat[:p.numel()] = p.detach().reshape(-1)
            self.shards.append(torch.nn.Parameter(flat[self.rank * size:(self.rank + 1) * size].clone(),
                                                  requires_grad=p.requires_grad))
            self.names.append(name)
            self.meta.append((p.numel(), p.shape))
            p.data = torch.empty(0)

    def forward(self, x):
        dt = self.dtype or torch.float32
        full = {n: _Gather.apply(s, numel, shape, dt, self.world)
                for n, s, (numel, shape) in zip(self.names, self.shards, self.meta)}
        if self.dtype is not None:
            x = x.to(self.dtype)
        return functional_call(self._module, full, (x,))

    @torch.no_grad()
    def full_parameters(self):
        out = {}
        for n, s, (numel, shape) in zip(self.names, self.shards, self.meta):
            full = torch.empty(s.numel() * self.world)
            all_gather_single(full, s.detach().contiguous())
            out[n] = full[:numel].view(shape).clone()
        return out
