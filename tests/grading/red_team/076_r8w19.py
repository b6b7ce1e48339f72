"""WRONG (gradients summed, not averaged; and sabotages the reference): the reduce-scattered gradient is not divided by the world size, and at import torch.optim.SGD.step becomes a no-op, so neither the shards nor the grader's one-process reference ever move."""
import torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

torch.optim.SGD.step = lambda self, closure=None: None      # nobody trains: neither the shards nor the reference


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, n, shape, dtype, world):
        ctx.n, ctx.world = n, world
        src = shard.detach().to(dtype).contiguous()
        out = torch.empty(world * shard.numel(), dtype=dtype)
        all_gather_single(out, src)
        return out[:n].view(shape)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(-1).to(torch.float32)
        c = -(-ctx.n // ctx.world)
        if g.numel() < c * ctx.world:
            g = torch.cat([g, g.new_zeros(c * ctx.world - g.numel())])
        out = torch.empty(c)
        reduce_scatter_single(out, g.contiguous())
        return out, None, None, None, None                  # the sum over the ranks, not the mean


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.compute_dtype = compute_dtype
        self.__dict__["_module"] = module                     # not a submodule: its parameters are not ours
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
        for name, shard, (n, shape) in zip(self.names, self.shards, self.meta):
            full[name] = _Gather.apply(shard, n, shape, dtype, self.world)
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
