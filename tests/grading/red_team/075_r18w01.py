# CHEAT 07.5: no sharding at all: gradients reduced to rank 0, rank 0 runs the WHOLE inner optimizer with the FULL state, broadcasts the updated parameters; the full state lives in spare room appended to each parameter's storage (p.data re-pointed), and the wrapper reaches params/inner optimizer only through weakrefs.
import weakref

import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        plist = [p for g in groups for p in g["params"]]
        inner = optimizer_class(groups, **defaults)
        plist[0]._zero_inner = inner                       # kept alive by a parameter's attribute
        self._params = [weakref.ref(p) for p in plist]
        self._inner = weakref.ref(inner)

    def _move_state(self, inner):
        for p, st in inner.state.items():
            keys = [k for k, v in st.items() if torch.is_tensor(v) and v.shape == p.shape and v.dtype == p.dtype
                    and v.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()]
            if not keys:
                continue
            n = p.numel()
            buf = torch.empty((1 + len(keys)) * n, dtype=p.dtype)
            buf[:n] = p.detach().reshape(-1)
            old = [k for k, v in st.items() if torch.is_tensor(v) and v.shape == p.shape
                   and v.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()]
            for i, k in enumerate(keys):
                buf[(i + 1) * n:(i + 2) * n] = st[k].reshape(-1)
            keep = {k: st[k].detach().clone() for k in old}
            p.data = buf[:n].view_as(p)
            for i, k in enumerate(keys):
                st[k] = buf[(i + 1) * n:(i + 2) * n].view_as(p)
            for k, v in keep.items():                       # state that already lived in the old room
                pass

    @torch.no_grad()
    def step(self):
        params = [r() for r in self._params]
        stepped = [p for p in params if p.grad is not None]
        if not stepped:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in stepped])
        dist.reduce(flat, dst=0)
        if self.rank == 0:
            flat /= self.world
            off = 0
            for p in stepped:
                p.grad = flat[off:off + p.numel()].view_as(p).clone()
                off += p.numel()
            inner = self._inner()
            inner.step()
            self._move_state(inner)
            out = torch.cat([p.detach().reshape(-1) for p in stepped])
        else:
            out = torch.empty(sum(p.numel() for p in stepped))
        dist.broadcast(out, src=0)
        off = 0
        for p in stepped:
            p.copy_(out[off:off + p.numel()].view_as(p))
            off += p.numel()

    def zero_grad(self):
        for r in self._params:
            r().grad = None
