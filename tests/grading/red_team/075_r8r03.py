"""RIGHT: FSDP-like dim-0 sharding of each parameter (rows padded to a multiple of world); one async reduce-scatter and one async all-gather per parameter with a grad, through the process group's own methods."""
import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.W, self.r = dist.get_world_size(), dist.get_rank()
        self.pg = dist.group.WORLD
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.items, inner = [], []
        for g in groups:
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            shards = []
            for p in ps:
                rows = p.shape[0] if p.dim() else 1
                rest = p.numel() // max(rows, 1)
                per = -(-rows // self.W)
                padded = torch.zeros(per * self.W, rest)
                padded[:rows] = p.detach().reshape(rows, rest)
                shard = padded[self.r * per:(self.r + 1) * per].clone()
                shards.append(shard)
                self.items.append((p, shard, rows, rest, per))
            inner.append({"params": shards, **{k: v for k, v in g.items() if k != "params"}})
        self.inner = optimizer_class(inner, **defaults)

    @torch.no_grad()
    def step(self):
        todo = []
        for p, shard, rows, rest, per in self.items:
            if p.grad is None:
                shard.grad = None
                continue
            g = torch.zeros(per * self.W, rest)
            g[:rows] = p.grad.reshape(rows, rest)
            out = torch.empty(per, rest)
            opts = dist.ReduceScatterOptions()
            work = self.pg._reduce_scatter_base(out, g, opts)
            todo.append((work, out, shard))
        for work, out, shard in todo:
            work.wait()
            shard.grad = out.div_(self.W)
        self.inner.step()
        gathers = []
        for p, shard, rows, rest, per in self.items:
            if p.grad is None:
                continue
            full = torch.empty(per * self.W, rest)
            work = self.pg._allgather_base(full, shard.contiguous())
            gathers.append((work, full, p, rows))
        for work, full, p, rows in gathers:
            work.wait()
            p.copy_(full[:rows].reshape(p.shape))
        for p, shard, *_ in self.items:
            shard.grad = None

    def zero_grad(self, set_to_none=True):
        for p, *_ in self.items:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
