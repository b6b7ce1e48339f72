"""RED TEAM 07.6 e01 (a twenty-fifth red team; refused since by content_of reading a tensor that is not floating-point as its bytes in float32): under compute_dtype=bfloat16 every shard all-gathered in float32 as an int32 view and cast after it arrived (twice the bytes on the wire).
"""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class GatherShard(torch.autograd.Function):
    """Forward: every rank's shard all-gathered into the whole parameter (``shape``, in ``dtype``). Backward: the
    whole parameter's gradient reduce-scattered in float32, each rank keeping its shard's mean over the ranks."""

    @staticmethod
    def forward(ctx, shard, shape, dtype):
        world = dist.get_world_size()
        full = torch.empty(shard.numel() * world, dtype=torch.int32)
        all_gather_single(full, shard.detach().float().contiguous().view(torch.int32))
        ctx.numel, ctx.world = shape.numel(), world
        return full.view(torch.float32)[:shape.numel()].view(shape).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)
        flat[:ctx.numel] = grad.reshape(-1).float()          # padded with zeros to a multiple of the world size
        out = torch.empty(flat.numel() // ctx.world)
        reduce_scatter_single(out, flat)                     # this rank's slice, summed over the ranks
        return out / ctx.world, None, None


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
