"""WRONG (07.5): every rank keeps and steps the WHOLE optimizer; its full state is pickled bytes in a str->bytes dict on the optimizer (untracked by gc, so the Python-object count never looks inside it, and held_bytes counts tensors only); gradients reduce-scattered honestly, then each owner's summed slice is spread with the process group's own broadcast method (not read as gathers) so every rank has the whole gradient and nothing is all-gathered."""
import pickle

import torch
import torch.distributed as dist

from mgpu_utils.compat import reduce_scatter_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        self.params = [list(g["params"]) for g in groups]
        self.optimizer_class, self.defaults = optimizer_class, dict(defaults)
        self.vault = {}                                   # only str keys and bytes: gc never tracks it

    @torch.no_grad()
    def step(self):
        pg = dist.distributed_c10d._get_default_group()
        for ps in self.params:
            for p in ps:
                if p.grad is None:
                    continue
                size = -(-p.numel() // self.world)
                flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
                g = torch.empty(size)
                reduce_scatter_single(g, flat)
                full = torch.empty(size * self.world)
                full[self.rank * size:(self.rank + 1) * size] = g / self.world
                for r in range(self.world):               # each owner's slice, through the group's own method
                    piece = full[r * size:(r + 1) * size].clone()
                    opts = dist.BroadcastOptions()
                    opts.rootRank = r
                    pg.broadcast([piece], opts).wait()
                    full[r * size:(r + 1) * size] = piece
                p.grad = full[:p.numel()].view_as(p).clone()
        opt = self.optimizer_class([{**o, "params": ps} for o, ps in zip(self.groups, self.params)], **self.defaults)
        if "state" in self.vault:
            opt.load_state_dict(pickle.loads(self.vault["state"]))
        opt.step()
        self.vault = {"state": pickle.dumps(opt.state_dict())}   # the whole state, as bytes

    def zero_grad(self):
        for ps in self.params:
            for p in ps:
                p.grad = None
