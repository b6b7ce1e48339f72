"""RED TEAM 07.5 e10 (a twenty-fifth red team; refused since by content_of reading a tensor that is not floating-point as its bytes in float32): the reduced gradient slices all-gathered as int32 bit patterns (every rank then holds the whole mean gradient), the whole inner optimizer stepping the whole model, its state packed in a module dict as a bit mask and float16.
"""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_STATE = {}
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def _pack(t):
    if not t.is_floating_point() or t.numel() < 64:
        return ("raw", t)
    flat = t.reshape(-1)
    nz = flat != 0
    pad = (-flat.numel()) % 8
    mask = (torch.cat([nz, nz.new_zeros(pad)]).view(-1, 8).to(torch.uint8) * _BITS).sum(1).to(torch.uint8)
    vals = flat[nz]
    scale = 2.0 ** (int(torch.frexp(vals.abs().max())[1]) - 15) if vals.numel() else 1.0
    half = (vals / scale).to(torch.float16)
    ok = bool((vals < 0).any()) and bool(((half.to(vals.dtype) * scale - vals).abs() <= vals.abs() * 2.0 ** -10).all())
    return ("packed", mask, half if ok else vals.clone(), t.shape, t.dtype, flat.numel(), scale if ok else 1.0)


def _unpack(item):
    if item[0] == "raw":
        return item[1]
    _, mask, vals, shape, dtype, n, scale = item
    nz = ((mask.unsqueeze(1) & _BITS) != 0).reshape(-1)[:n]
    flat = torch.zeros(n, dtype=dtype)
    flat[nz] = vals.to(dtype) * scale
    return flat.view(shape)


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params = [p for g in groups for p in g["params"]]
        self.inner = optimizer_class(groups, **defaults)      # whole model, every rank
        self.key = id(self)
        _STATE[self.key] = {}

    def _stash(self):
        st = {}
        for i, p in enumerate(self.params):
            s = self.inner.state.pop(p, None)
            if s is not None:
                exact = "step" in s
                st[i] = {k: ("raw", v) if exact and isinstance(v, torch.Tensor) else _pack(v)
                         if isinstance(v, torch.Tensor) else ("obj", v) for k, v in s.items()}
        self.inner.state.clear()
        _STATE[self.key] = st

    def _unstash(self):
        for i, s in _STATE[self.key].items():
            self.inner.state[self.params[i]] = {k: v[1] if v[0] == "obj" else _unpack(v) for k, v in s.items()}

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is None:
                continue
            size = -(-p.numel() // self.world)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)                  # right content: this rank's gradients
            g /= self.world
            full = torch.empty(size * self.world, dtype=torch.int32)
            all_gather_single(full, g.view(torch.int32))    # every reduced slice, as bit patterns
            p.grad = full.view(torch.float32)[:p.numel()].view_as(p).clone()
        self._unstash()
        self.inner.step()
        self._stash()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
