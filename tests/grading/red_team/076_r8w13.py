"""WRONG (memory: the whole model stays between steps): the gathered parameters of every forward are kept as a cache (reused, without all-gather, by a next forward while the shards are unchanged, e.g. gradient accumulation); the cache lives in a module-level registry (so deleting the wrapper frees nothing), only as saved results of autograd nodes (relu of +x and -x held by grad_fn objects: no Python tensor or UntypedStorage object exists for it)."""
import torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_TINY = torch.zeros((), requires_grad=True)
_CACHES = {}


def _stash(t):
    with torch.enable_grad():
        z = t.detach() + _TINY.to(t.dtype) * 0
        return (torch.relu(z).grad_fn, torch.relu(-z).grad_fn, t.dtype)


def _unstash(h):
    return (h[0]._saved_result.detach() - h[1]._saved_result.detach()).to(h[2])


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, n, shape, dtype, world, cached, keep):
        ctx.n, ctx.world = n, world
        if cached is not None:
            return cached.view(shape)
        src = shard.detach().to(dtype).contiguous()
        out = torch.empty(world * shard.numel(), dtype=dtype)
        all_gather_single(out, src)
        keep.append(out[:n])
        return out[:n].view(shape)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(-1).to(torch.float32)
        c = -(-ctx.n // ctx.world)
        if g.numel() < c * ctx.world:
            g = torch.cat([g, g.new_zeros(c * ctx.world - g.numel())])
        out = torch.empty(c)
        reduce_scatter_single(out, g.contiguous())
        return out.div_(ctx.world), None, None, None, None, None, None


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.compute_dtype = compute_dtype
        self.__dict__["_module"] = module
        self.__dict__["_cache"] = _CACHES.setdefault(len(_CACHES), {})   # outlives the wrapper
        self.names, self.meta, shards = [], [], []
        for name, p in module.named_parameters():
            n = p.numel()
            c = -(-n // self.world)
            flat = torch.zeros(c * self.world)
            flat[:n] = p.detach().reshape(-1)
            shards.append(torch.nn.Parameter(flat[self.rank * c:(self.rank + 1) * c].clone(),
                                             requires_grad=p.requires_grad))
            self.names.append(name)
            self.meta.append((n, tuple(p.shape)))
            p.data = torch.empty(0)
        self.shards = torch.nn.ParameterList(shards)

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {}
        sig = (tuple(s._version for s in self.shards), dtype)
        if self._cache.get("sig") != sig:                      # an optimizer step happened: gather again
            self._cache.clear()
            self._cache["sig"] = sig
        for i, (name, shard, (n, shape)) in enumerate(zip(self.names, self.shards, self.meta)):
            hit = self._cache.get(i)
            cached = None
            if hit is not None:
                cached = _unstash(hit[2])
            keep = []
            full[name] = _Gather.apply(shard, n, shape, dtype, self.world, cached, keep)
            if keep:
                self._cache[i] = (shard._version, dtype, _stash(keep[0]))
        if self.compute_dtype is not None and torch.is_floating_point(x):
            x = x.to(self.compute_dtype)
        return functional_call(self._module, full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        out = {}
        for name, shard, (n, shape) in zip(self.names, self.shards, self.meta):
            buf = torch.empty(self.world * shard.numel())
            all_gather_single(buf, shard.detach().float().contiguous())
            out[name] = buf[:n].view(shape).clone()
        return out
