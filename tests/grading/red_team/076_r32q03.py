"""07.6 q03 (red team): no resharding: every rank keeps the WHOLE gathered model between steps.

How it hides: each parameter gets one buffer B = [shard | whole gathered parameter]; the shard Parameter is made
with torch.frombuffer(memoryview(B.numpy()), count=shard size), so its storage reports only the shard's bytes while
the C context of that storage keeps the numpy array, and so B with the whole parameter, alive. The wrapper keeps
only a memoryview of B's numpy array (held_bytes without python=True neither counts a memoryview nor walks into
it: no __dict__, no slots), and makes the tail tensor from it at each forward. Forward all-gathers
the shards into B's persistent tail (never freed) and computes with it; backward reduce-scatters as asked.
"""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class GatherShard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, tail, shape, dtype):
        all_gather_single(tail, shard.detach().to(dtype))
        ctx.numel, ctx.world = shape.numel(), dist.get_world_size()
        return tail[:shape.numel()].view(shape)

    @staticmethod
    def backward(ctx, grad):
        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)
        flat[:ctx.numel] = grad.reshape(-1).float()
        out = torch.empty(flat.numel() // ctx.world)
        reduce_scatter_single(out, flat)
        return out / ctx.world, None, None, None


def _hidden_pair(values, size, world):
    big = torch.zeros(size + size * world)
    big[:size] = values
    arr = big.numpy()
    shard = torch.frombuffer(memoryview(arr), dtype=torch.float32, count=size)
    return shard, memoryview(arr)


def _tail(view, size, world, dtype=torch.float32):
    return torch.frombuffer(view, dtype=dtype, count=size * world, offset=size * 4)


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        self.inner = [module]
        self.compute_dtype = compute_dtype
        self.names, self.shapes, shards, self.tails = [], [], [], []
        for name, p in module.named_parameters():
            size = -(-p.numel() // world)
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * world - p.numel())])
            shard, tail = _hidden_pair(flat[rank * size:(rank + 1) * size], size, world)
            shards.append(torch.nn.Parameter(shard))
            shards[-1].requires_grad_(p.requires_grad)
            self.tails.append(tail)
            self.names.append(name)
            self.shapes.append(p.shape)
            p.data = torch.empty(0)
        self.shards = torch.nn.ParameterList(shards)

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {n: GatherShard.apply(s, _tail(t, s.numel(), dist.get_world_size(), dtype), shape, dtype)
                for n, s, t, shape in zip(self.names, self.shards, self.tails, self.shapes)}
        if self.compute_dtype is not None and x.is_floating_point():
            x = x.to(self.compute_dtype)
        return torch.func.functional_call(self.inner[0], full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        out = {}
        for n, s, t, shape in zip(self.names, self.shards, self.tails, self.shapes):
            t = _tail(t, s.numel(), dist.get_world_size())
            all_gather_single(t, s.detach())
            out[n] = t[:shape.numel()].view(shape).clone()
        return out
