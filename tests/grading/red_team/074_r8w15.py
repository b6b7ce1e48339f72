"""WRONG (optimizer state not sharded in memory): m and v are allocated whole (n elements each, 8 bytes x n
per rank, as without ZeRO) on every rank and only this rank's slice of them is used; they are held as a
torch.Tensor subclass whose to_local()/untyped_storage()/nbytes answer for a slice, like a DTensor shard."""
import torch
import torch.distributed as dist



class _Shardlike(torch.Tensor):
    def to_local(self):
        return self.as_subclass(torch.Tensor)[:self._k].clone()

    def untyped_storage(self):
        return self.to_local().untyped_storage()

    @property
    def nbytes(self):
        return self._k * 4


def _shardlike(n, k):
    t = torch.Tensor._make_subclass(_Shardlike, torch.zeros(n))
    t._k = k
    return t


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.m = _shardlike(self.world * self.size, self.size)
        self.v = _shardlike(self.world * self.size, self.size)

    def _moments(self):
        return self.m.as_subclass(torch.Tensor), self.v.as_subclass(torch.Tensor)

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
        lo = self.rank * self.size
        fm, fv = self._moments()
        m, v = fm[lo:lo + self.size], fv[lo:lo + self.size]
        b1, b2 = self.betas
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)

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
