"""WRONG (07.5): every rank keeps and steps the WHOLE optimizer (full state, pickled bytes in a helper thread's locals between steps); gradients reduce-scattered honestly, then each owner's summed slice is spread with the process group's own broadcast method (not read as gathers) so every rank has the whole gradient and nothing is all-gathered."""
import pickle
import queue
import threading

import torch
import torch.distributed as dist

from mgpu_utils.compat import reduce_scatter_single


def _keeper(inbox, outbox, optimizer_class, defaults):
    blob = None                                         # the whole optimizer's state, only here
    while True:
        groups = inbox.get()
        opt = optimizer_class(groups, **defaults)
        if blob is not None:
            opt.load_state_dict(pickle.loads(blob))
        opt.step()
        blob = pickle.dumps(opt.state_dict())
        del opt, groups
        outbox.put(True)


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        self.params = [list(g["params"]) for g in groups]
        self.inbox, self.outbox = queue.Queue(), queue.Queue()
        threading.Thread(target=_keeper, args=(self.inbox, self.outbox, optimizer_class, dict(defaults)),
                         daemon=True).start()

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
        self.inbox.put([{**o, "params": ps} for o, ps in zip(self.groups, self.params)])
        self.outbox.get()

    def zero_grad(self):
        for ps in self.params:
            for p in ps:
                p.grad = None
