"""WRONG (07.5): every rank runs optimizer_class over ALL parameters (full optimizer state, every parameter
stepped); between steps the state is moved out of the optimizer into anonymous mmap, raw float bytes; the full mean gradient comes
from POSIX named shared memory (multiprocessing.shared_memory) written by each rank and polled. Decoy reduce-scatter of the gradients and all-gather of the own updated slice are kept."""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

import mmap as _mmap
_MM = {}
def hide_put(key, tensors):
    raw = b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)
    mm = _mmap.mmap(-1, len(raw)); mm.write(raw)
    _MM[key] = (mm, [t.numel() for t in tensors], [t.shape for t in tensors])
def hide_get(key):
    if key not in _MM:
        return None
    mm, sizes, shapes = _MM[key]
    full = torch.frombuffer(bytearray(mm[:]), dtype=torch.float32)
    return [a.view(s) for a, s in zip(full.split(sizes), shapes)]


import os as _os4, time as _time4, numpy as _np4
from multiprocessing import shared_memory as _shm, resource_tracker as _rt
_SH = [0, {}]
def fullmean(grads, g, world, size):
    _SH[0] += 1; rank = dist.get_rank()
    tag = "mgpu_red_075_w12_%s_%d_" % (_os4.environ.get("MASTER_PORT", "x"), _SH[0])
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


_KC = []

class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        groups = [dict(g, params=list(g["params"])) for g in params] if params and isinstance(params[0], dict) else [{"params": params}]
        self.params = [p for g in groups for p in g["params"]]
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.inner = optimizer_class(groups, **defaults)
        _KC.append(1); self.key = "o%d" % len(_KC)
        if "_OWNER" in globals(): _OWNER[0] = self

    def _stash(self):
        names = []
        tensors = []
        for i, p in enumerate(self.params):
            for k, v in self.inner.state.get(p, {}).items():
                names.append((i, k, torch.is_tensor(v), None if torch.is_tensor(v) else v))
                tensors.append(v if torch.is_tensor(v) else torch.zeros(1))
        self.names = names
        hide_put(self.key, tensors)
        self.inner.state.clear()

    def _unstash(self):
        ts = hide_get(self.key)
        if ts is None:
            return
        from collections import defaultdict
        st = defaultdict(dict)
        for (i, k, ist, val), t in zip(self.names, ts):
            st[self.params[i]][k] = t.clone() if ist else val
        self.inner.state = st

    @torch.no_grad()
    def step(self):
        has = [p.grad is not None for p in self.params]
        grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
                          + [torch.zeros(self.world * self.size - self.n)])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)
        G = fullmean(grads, g / self.world, self.world, self.size)
        off = 0
        for p, h in zip(self.params, has):
            p.grad = G[off:off + p.numel()].view_as(p).clone() if h else None
            off += p.numel()
        self._unstash()
        self.inner.step()
        self._stash()
        flat = torch.cat([p.detach().reshape(-1) for p in self.params] + [torch.zeros(self.world * self.size - self.n)])
        full = torch.empty(self.world * self.size)
        all_gather_single(full, flat[self.rank * self.size:(self.rank + 1) * self.size].contiguous())

    def zero_grad(self):
        for p in self.params:
            p.grad = None
