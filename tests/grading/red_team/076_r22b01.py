"""RED TEAM 07.6 b01 (a twenty-second red team; refused since by held_bytes walking an object of a class with __slots__ and __call__, and 07.5 reading a process group's own broadcast): Red team 076_b01: whole (gathered) parameters KEPT between steps, in float32, on every rank.

The worked solution, plus: every forward stores detached float32 copies of the whole gathered parameters in a
slotted object that defines __call__ (callable, no __dict__), hung on the wrapper. held_bytes() returns at
``callable(o) and not hasattr(o, "__dict__")`` without walking it, while reachable_storages() walks its slots
(so OutsideState counts its tensors as "known", not outside). The object refers to itself (a cycle), so when the
grader deletes the wrapper and reads malloc with collect=False (the wrapper itself was freed by refcount), the
kept copies are not freed and the malloc difference shows nothing.
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
        full = torch.empty(shard.numel() * world, dtype=dtype)
        all_gather_single(full, shard.detach().to(dtype))
        ctx.numel, ctx.world = shape.numel(), world
        return full[:shape.numel()].view(shape)

    @staticmethod
    def backward(ctx, grad):
        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)
        flat[:ctx.numel] = grad.reshape(-1).float()          # padded with zeros to a multiple of the world size
        out = torch.empty(flat.numel() // ctx.world)
        reduce_scatter_single(out, flat)                     # this rank's slice, summed over the ranks
        return out / ctx.world, None, None


class _Keep:
    __slots__ = ("full", "me")

    def __init__(self):
        self.full, self.me = [], self

    def __call__(self):
        return self.full


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
        self.keep = _Keep()

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {n: GatherShard.apply(s, shape, dtype) for n, s, shape in zip(self.names, self.shards, self.shapes)}
        self.keep.full = [t.detach().float().clone() for t in full.values()]   # whole parameters, kept
        if self.compute_dtype is not None and x.is_floating_point():
            x = x.to(self.compute_dtype)
        return torch.func.functional_call(self.inner[0], full, (x,))   # tied names follow the one given

    @torch.no_grad()
    def full_parameters(self) -> dict:
        """{name: the whole parameter, float32} on every rank, named as module.named_parameters() (a collective)."""
        return {n: GatherShard.apply(s, shape, torch.float32).clone()
                for n, s, shape in zip(self.names, self.shards, self.shapes)}
