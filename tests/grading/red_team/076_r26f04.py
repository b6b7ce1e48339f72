"""RED TEAM 07.6 f04 (a twenty-sixth red team; refused since by refusing_routes: ProcessGroup.boxed called from the student's file, and a collective on a group of fewer ranks than the world or made by hand): the real exchange through a hidden process group (torch.ops.c10d with pg.boxed()), whole gradients gathered and summed; the counted all-gathers and reduce-scatters on a hand-built group of one rank, carrying the right data and moving nothing.
"""
import torch
import torch.distributed as dist


_made = [0]


def _hidden_group(solo=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    _made[0] += 1
    C = torch._C._distributed_c10d
    store = dist.PrefixStore(f"rt28_fsdp{_made[0]}_{rank if solo else ''}", dist.distributed_c10d._get_default_store())
    opts = C.ProcessGroupGloo._Options()
    opts._devices = dist.group.WORLD._get_backend(torch.device("cpu")).options._devices   # no new pipe
    if solo:
        rank, world = 0, 1
    gloo = C.ProcessGroupGloo(store, rank, world, opts)
    pg = C.ProcessGroup(store, rank, world)
    pg._set_default_backend(C.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), C.ProcessGroup.BackendType.GLOO, gloo)
    return pg


def _gather(pg, out, inp):
    _, work = torch.ops.c10d._allgather_base_(out, inp.contiguous(), pg.boxed(), False, -1)
    torch._C._distributed_c10d.Work.unbox(work).wait()


class GatherShard(torch.autograd.Function):
    """Forward: every rank's shard all-gathered into the whole parameter (``shape``, in ``dtype``). Backward: the
    whole parameter's gradient reduce-scattered in float32, each rank keeping its shard's mean over the ranks."""

    @staticmethod
    def forward(ctx, shard, shape, dtype, pg, solo):
        world = dist.get_world_size()
        full = torch.empty(shard.numel() * world, dtype=dtype)
        _gather(pg, full, shard.detach().to(dtype))
        own = torch.empty(shard.numel(), dtype=dtype)
        solo._allgather_base(own, shard.detach().to(dtype)).wait()   # counted (a group's method), moves nothing
        ctx.pg, ctx.rank, ctx.solo = pg, dist.get_rank(), solo
        ctx.numel, ctx.world = shape.numel(), world
        return full[:shape.numel()].view(shape)

    @staticmethod
    def backward(ctx, grad):
        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)
        flat[:ctx.numel] = grad.reshape(-1).float()          # padded with zeros to a multiple of the world size
        mine = torch.empty(flat.numel())
        ctx.solo._reduce_scatter_base(mine, flat).wait()   # counted "reduce-scatter", reduces nothing
        every = torch.empty(flat.numel() * ctx.world)
        _gather(ctx.pg, every, flat)                         # every rank's WHOLE gradient, on every rank
        whole = every.view(ctx.world, -1).sum(0)
        n = flat.numel() // ctx.world
        return whole[ctx.rank * n:(ctx.rank + 1) * n] / ctx.world, None, None, None, None


class MyFSDP(torch.nn.Module):
    """``module`` with its parameters sharded over the ranks, gathered for each forward (ZeRO stage 3)."""

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        kept = getattr(dist.distributed_c10d, "_rt28_groups", None)   # made once a process: outlive the wrapper
        if kept is None:
            kept = (_hidden_group(), _hidden_group(solo=True))
            dist.distributed_c10d._rt28_groups = kept
        self.pg, self.solo = kept
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
        full = {n: GatherShard.apply(s, shape, dtype, self.pg, self.solo) for n, s, shape in zip(self.names, self.shards, self.shapes)}
        if self.compute_dtype is not None and x.is_floating_point():
            x = x.to(self.compute_dtype)
        return torch.func.functional_call(self.inner[0], full, (x,))   # tied names follow the one given

    @torch.no_grad()
    def full_parameters(self) -> dict:
        """{name: the whole parameter, float32} on every rank, named as module.named_parameters() (a collective)."""
        return {n: GatherShard.apply(s, shape, torch.float32, self.pg, self.solo).clone()
                for n, s, shape in zip(self.names, self.shards, self.shapes)}
