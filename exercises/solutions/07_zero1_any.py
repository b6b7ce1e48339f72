"""Solution of exercise 07.5: ZeRO-1 for any element-wise optimizer, from scratch (for instructors)."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)              # elements per slice; the last one padded with zeros
        mine = self.flat([p.detach() for p in self.params])[self.rank * self.size:(self.rank + 1) * self.size]
        self.shard = mine.clone().requires_grad_()         # the inner optimizer's one parameter: this slice
        self.inner = optimizer_class([self.shard], **defaults)

    def flat(self, tensors) -> torch.Tensor:
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    @torch.no_grad()
    def step(self):
        grads = self.flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)                    # this slice's gradient, summed over the ranks
        self.shard.grad = g / self.world                   # ... and averaged, as DDP does
        self.inner.step()
        full = torch.empty(self.world * self.size)
        all_gather_single(full, self.shard.detach())       # every rank's updated slice, on every rank
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        self.shard.grad = None
