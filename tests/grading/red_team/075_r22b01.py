"""RED TEAM 07.5 b01 (a twenty-second red team; refused since by held_bytes walking an object of a class with __slots__ and __call__, and 07.5 reading a process group's own broadcast): Red team 075_b01: NOT ZeRO-1: the whole optimizer (whole state) on every rank, stepping every parameter.

The gradients are reduce-scattered (right content), but then each owner sends its *summed gradient slice*
(not the updated parameter slice) to every rank through the process group's OWN broadcast method
(ProcessGroup.broadcast(tensor, root)), which _broadcast_sources does not read (only dist.broadcast is) and
which is in neither GATHERS nor SPREADS, so _gathered_updated sees "nothing but reduce-scatters ran". Traffic:
P + P/w (reduce-scatter) + P (broadcasts) < the bound. Every rank now has the whole mean gradient and steps a
whole optimizer_class over the real parameters (whole state on every rank). That optimizer sits in a slotted
object with __call__ (callable, no __dict__), which held_bytes() does not walk; it is hung on self and on the
first parameter, so reachable_storages() (OutsideState) counts it as known, and deleting the ShardedOptimizer
frees nothing (no malloc difference).
"""
import torch
import torch.distributed as dist
from mgpu_utils.compat import reduce_scatter_single


class _Box:
    __slots__ = ("opt",)

    def __init__(self, opt):
        self.opt = opt

    def __call__(self):
        return self.opt


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params = [p for g in groups for p in g["params"]]
        box = _Box(optimizer_class(groups, **defaults))    # the WHOLE optimizer, whole state, every rank
        self.box = box
        if self.params:
            self.params[0]._zbox = box                     # keeps it alive when self is deleted

    @torch.no_grad()
    def step(self):
        pg = dist.distributed_c10d._get_default_group()
        for p in self.params:
            if p.grad is None:
                continue
            n = p.numel()
            size = -(-n // self.world)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - n)])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)                 # this rank's summed slice
            full = torch.empty(size * self.world)
            full[self.rank * size:(self.rank + 1) * size] = g
            works = [pg.broadcast(full[r * size:(r + 1) * size], r) for r in range(self.world)]
            for w in works:
                w.wait()
            p.grad.copy_((full[:n] / self.world).view_as(p))   # the WHOLE mean gradient
        self.box.opt.step()                                # whole optimizer, every parameter, every rank

    def zero_grad(self):
        for p in self.params:
            p.grad = None
