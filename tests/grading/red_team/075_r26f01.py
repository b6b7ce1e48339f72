"""RED TEAM 07.5 f01 (a twenty-sixth red team; refused since by refusing_routes: ProcessGroup.boxed called from the student's file, and a collective on a group of fewer ranks than the world or made by hand): every collective through a hidden process group (a ProcessGroupGloo never registered, called through torch.ops.c10d with pg.boxed()): every rank's whole gradient gathered and summed on every rank, no reduce-scatter.
"""
import torch
import torch.distributed as dist

_C = torch._C._distributed_c10d


_made = [0]


def _hidden_group():
    rank, world = dist.get_rank(), dist.get_world_size()
    _made[0] += 1
    store = dist.PrefixStore(f"rt28_hidden{_made[0]}", dist.distributed_c10d._get_default_store())
    opts = _C.ProcessGroupGloo._Options()
    opts._devices = [_C.ProcessGroupGloo.create_default_device()]
    gloo = _C.ProcessGroupGloo(store, rank, world, opts)
    pg = _C.ProcessGroup(store, rank, world)
    pg._set_default_backend(_C.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), _C.ProcessGroup.BackendType.GLOO, gloo)
    return pg


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.pg = _hidden_group()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.shards, inner_groups = [], []
        for group in groups:
            mine = []
            for p in group["params"]:
                size = -(-p.numel() // self.world)
                flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])
                shard = flat[self.rank * size:(self.rank + 1) * size].clone().requires_grad_(p.requires_grad)
                self.shards.append((p, shard, size))
                mine.append(shard)
            inner_groups.append({**group, "params": mine})
        self.inner = optimizer_class(inner_groups, **defaults)

    @torch.no_grad()
    def step(self):
        ops = torch.ops.c10d
        for p, shard, size in self.shards:
            if p.grad is None:
                shard.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            every = torch.empty(self.world * flat.numel())
            _, work = ops._allgather_base_(every, flat, self.pg.boxed(), False, -1)
            torch._C._distributed_c10d.Work.unbox(work).wait()
            whole = every.view(self.world, -1).sum(0)       # the whole summed gradient, on every rank
            shard.grad = whole[self.rank * size:(self.rank + 1) * size] / self.world
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            _, work = ops._allgather_base_(full, shard.detach().clone(), self.pg.boxed(), False, -1)
            torch._C._distributed_c10d.Work.unbox(work).wait()
            p.copy_(full[:p.numel()].view_as(p))

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
