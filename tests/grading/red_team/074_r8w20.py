"""WRONG (state not in tensors): this rank's slice of m and v is kept as Python float lists (array.array of
doubles), turned into tensors only inside step(); the statement asks to keep state in tensors (and the
optimizer then holds no tensor bytes at all)."""
from array import array

import torch
import torch.distributed as dist


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.m = array("f", bytes(4 * self.size))
        self.v = array("f", bytes(4 * self.size))

    def flat(self, tensors):
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    @torch.no_grad()
    def step(self):
        self.t += 1
        grads = self.flat([p.grad for p in self.params])
        g = torch.empty(self.size)
        dist.reduce_scatter_tensor(g, grads)
        g /= self.world
        m = torch.frombuffer(self.m, dtype=torch.float32)
        v = torch.frombuffer(self.v, dtype=torch.float32)
        b1, b2 = self.betas
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)
        del m, v
        lo = self.rank * self.size
        mine = self.flat(self.params)[lo:lo + self.size] - self.lr * update
        full = torch.empty(self.world * self.size)
        dist.all_gather_into_tensor(full, mine)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
