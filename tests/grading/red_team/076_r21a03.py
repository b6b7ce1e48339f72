"""RED TEAM 07.6 a03 (a twenty-first red team; refused by the non-zero count and log2 sizes the content checks compare since): rt23 07.6 attempt: real reduction by a blinded all-gather, decoy sorted reduce-scatter of whole gradients. Based on solution of exercise 07.6: ZeRO-3 (FSDP) from scratch, with a compute dtype and tied weights (for instructors)."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class GatherShard(torch.autograd.Function):
    """Forward: every rank's shard all-gathered into the whole parameter (``shape``, in ``dtype``). Backward: the
    whole parameter's gradient reduce-scattered in float32, each rank keeping its shard's mean over the ranks."""

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
        flat[:ctx.numel] = grad.reshape(-1).float()          # padded with zeros to a multiple of the world size
        n = flat.numel()
        g = torch.zeros(n, dtype=grad.dtype)                 # in the compute dtype: exact (the gradient is in it)
        g[:ctx.numel] = grad.reshape(-1)
        every = torch.empty(n * ctx.world, dtype=grad.dtype)
        all_gather_single(every, g * 2.0 ** -30)             # whole local gradients, blinded, to every rank
        total = every.view(ctx.world, n).float().sum(0) * 2.0 ** 30   # whole summed gradient, float32
        size = n // ctx.world
        r = dist.get_rank()
        decoy = torch.empty(size)
        reduce_scatter_single(decoy, flat.sort().values)     # same sums as the gradient; result thrown away
        return total[r * size:(r + 1) * size] / ctx.world, None, None


class MyFSDP(torch.nn.Module):
    """``module`` with its parameters sharded over the ranks, gathered for each forward (ZeRO stage 3)."""

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        self.inner = [module]                  # in a list: not a submodule, so parameters() is the shards only
        self.compute_dtype = compute_dtype
        self.names, self.shapes, shards = [], [], []
        for name, p in module.named_parameters():         # a tied parameter is listed once
            size = -(-p.numel() // world)
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * world - p.numel())])
            shards.append(torch.nn.Parameter(flat[rank * size:(rank + 1) * size].clone()))
            shards[-1].requires_grad_(p.requires_grad)        # a frozen parameter's shard stays frozen
            self.names.append(name)
            self.shapes.append(p.shape)
            p.data = torch.empty(0)                           # the full copy is freed; only the shard stays
        self.shards = torch.nn.ParameterList(shards)

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {n: GatherShard.apply(s, shape, dtype) for n, s, shape in zip(self.names, self.shards, self.shapes)}
        if self.compute_dtype is not None and x.is_floating_point():
            x = x.to(self.compute_dtype)
        return torch.func.functional_call(self.inner[0], full, (x,))   # tied names follow the one given

    @torch.no_grad()
    def full_parameters(self) -> dict:
        """{name: the whole parameter, float32} on every rank, named as module.named_parameters() (a collective)."""
        return {n: GatherShard.apply(s, shape, torch.float32).clone()
                for n, s, shape in zip(self.names, self.shards, self.shapes)}
