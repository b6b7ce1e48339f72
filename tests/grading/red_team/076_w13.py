"""WRONG (07.6): the shards stay float32 but the optimizer-visible shard is a bf16-rounded copy when compute_dtype is set (shards rounded to bf16 at build)"""
import torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, numel, shape, dtype, world):
        ctx.numel, ctx.world = numel, world
        full = torch.empty(shard.numel() * world, dtype=dtype)
        all_gather_single(full, shard.detach().to(dtype).contiguous())
        return full[:numel].view(shape)

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
            flat[:p.numel()] = p.detach().reshape(-1).to(compute_dtype or torch.float32).float()
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
