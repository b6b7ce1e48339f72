"""WRONG (numerics): a right MyFSDP whose reduce-scattered float32 sum, divided by the world, is rounded back to the
compute dtype (bfloat16) before it becomes the shard's .grad: the statement asks for float32's sum."""
import math

import torch
import torch.distributed as dist
from torch.func import functional_call

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class _Gather(torch.autograd.Function):
    """forward: all-gather one parameter from its shards (in the compute dtype); backward: reduce-scatter its
    gradient in float32 and divide by the world size."""

    @staticmethod
    def forward(ctx, shard, meta, dtype):
        numel, shape, world = meta
        send = shard.detach().to(dtype)
        out = torch.empty(send.numel() * world, dtype=dtype)
        all_gather_single(out, send)
        ctx.meta = meta
        return out[:numel].view(shape)

    @staticmethod
    def backward(ctx, grad):
        numel, shape, world = ctx.meta
        chunk = math.ceil(numel / world)
        flat = torch.zeros(chunk * world, dtype=torch.float32)
        flat[:numel] = grad.reshape(-1).to(torch.float32)
        out = torch.empty(chunk, dtype=torch.float32)
        reduce_scatter_single(out, flat)
        out /= world
        if grad.dtype != torch.float32:                    # back in the compute dtype's precision
            out = out.to(grad.dtype).to(torch.float32)
        return out, None, None


class MyFSDP(torch.nn.Module):
    """``module`` with its parameters sharded over the ranks, gathered for each forward (ZeRO stage 3)."""

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self._holder = [module]                  # not a submodule: its (freed) parameters are not ours
        self.compute_dtype = compute_dtype
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.names, self.metas = [], []
        shards = []
        for name, p in module.named_parameters():
            numel, chunk = p.numel(), math.ceil(p.numel() / self.world)
            flat = torch.zeros(chunk * self.world, dtype=torch.float32)
            flat[:numel] = p.detach().reshape(-1).float()
            shard = torch.nn.Parameter(flat[self.rank * chunk:(self.rank + 1) * chunk].clone(),
                                       requires_grad=p.requires_grad)
            shards.append(shard)
            self.names.append(name)
            self.metas.append((numel, tuple(p.shape), self.world))
            p.data = torch.empty(0)
        self.shards = torch.nn.ParameterList(shards)

    @property
    def module(self):
        return self._holder[0]

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {name: _Gather.apply(shard, meta, dtype)
                for name, shard, meta in zip(self.names, self.shards, self.metas)}
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        return functional_call(self.module, full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        """{name: the whole parameter, float32} on every rank, named as module.named_parameters() names them."""
        out = {}
        for name, shard, (numel, shape, world) in zip(self.names, self.shards, self.metas):
            buf = torch.empty(shard.numel() * world, dtype=torch.float32)
            all_gather_single(buf, shard.detach())
            out[name] = buf[:numel].view(shape).clone()
        return out
