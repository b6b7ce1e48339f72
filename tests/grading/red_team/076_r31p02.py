"""07.6 red-team attempt p02: the reduce-scatter is a decoy with the right contents; the gradient really travels
as a whole all-reduce that no count sees.

Cheat: the backward's ``reduce_scatter_single(out, flat)`` is called as the grader expects (right input: this rank's
whole gradient), but ``flat`` is a tensor subclass with ``__torch_dispatch__``: when torch reaches the C++
reduce-scatter operator, the subclass runs a synchronous all-reduce of the WHOLE gradient instead (nested inside the
grader's counted call, so not counted: every rank receives every whole gradient, (1 + 1/world) x the traffic
counted, past any bound on the step's traffic), cuts this rank's slice out of it, and issues the operator on a
world-sized zero tensor only to hand back a genuine Work. The asked collective does no work.
"""
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_PY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


class Whole(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_subclass(cls, elem)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "reduce_scatter" in str(func):
            out, inp = args[0], args[1]
            with torch._C._ExcludeDispatchKeyGuard(_PY):
                whole = inp.clone()
                dist.all_reduce(whole)                       # the real exchange: every whole gradient, uncounted
                n, r = out.numel(), dist.get_rank()
                out.copy_(whole[r * n:(r + 1) * n].view_as(out))
                world = dist.get_world_size()
                res = func(torch.zeros(1, dtype=out.dtype), torch.zeros(world, dtype=inp.dtype), *args[2:], **kwargs)
                res[1].wait()
            return (out, res[1])
        with torch._C._ExcludeDispatchKeyGuard(_PY):
            return func(*args, **kwargs)


class GatherShard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, shape, dtype):
        world = dist.get_world_size()
        full = torch.empty(shard.numel() * world, dtype=dtype)
        all_gather_single(full, shard.detach().to(dtype))
        ctx.numel, ctx.world = shape.numel(), world
        return full[:shape.numel()].view(shape)

    @staticmethod
    def backward(ctx, grad):
        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)
        flat[:ctx.numel] = grad.reshape(-1).float()
        out = torch.empty(flat.numel() // ctx.world)
        reduce_scatter_single(out, Whole(flat))
        return out / ctx.world, None, None


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        self.inner = [module]
        self.compute_dtype = compute_dtype
        self.names, self.shapes, shards = [], [], []
        for name, p in module.named_parameters():
            size = -(-p.numel() // world)
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * world - p.numel())])
            shards.append(torch.nn.Parameter(flat[rank * size:(rank + 1) * size].clone()))
            shards[-1].requires_grad_(p.requires_grad)
            self.names.append(name)
            self.shapes.append(p.shape)
            p.data = torch.empty(0)
        self.shards = torch.nn.ParameterList(shards)

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {n: GatherShard.apply(s, shape, dtype) for n, s, shape in zip(self.names, self.shards, self.shapes)}
        if self.compute_dtype is not None and x.is_floating_point():
            x = x.to(self.compute_dtype)
        return torch.func.functional_call(self.inner[0], full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        return {n: GatherShard.apply(s, shape, torch.float32).clone()
                for n, s, shape in zip(self.names, self.shards, self.shapes)}
