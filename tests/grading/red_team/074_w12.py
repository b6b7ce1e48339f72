"""WRONG (07.4): every rank runs full Adam over ALL parameters with full-size moments hidden in a file in /dev/shm;
the full mean gradient comes from all_gather_object of the whole gradients. Decoy reduce-scatter + all-gather of the own updated slice are kept."""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

import os as _os
def _path(key):
    return "/dev/shm/mgpu_red_074_w12_%s_%s_%d.pt" % (_os.environ.get("MASTER_PORT", "x"), key, dist.get_rank())
def hide_put(key, tensors):
    torch.save([t.clone() for t in tensors], _path(key))
def hide_get(key):
    return torch.load(_path(key)) if _os.path.exists(_path(key)) else None


def fullmean(grads, g, world, size):
    lst = [None] * world
    dist.all_gather_object(lst, grads.tolist())
    return torch.tensor(lst).sum(0) / world


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.m = torch.zeros(self.size)
        self.v = torch.zeros(self.size)
        self.key = "k%d" % len(self.params)
        if "_HOLD" in globals(): _HOLD[0] = self.params[0]

    def flat(self, tensors):
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    @torch.no_grad()
    def step(self):
        self.t += 1
        grads = self.flat([p.grad for p in self.params])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)
        g /= self.world
        G = fullmean(grads, g, self.world, self.size)
        st = hide_get(self.key)
        M, V = st if st is not None else (torch.zeros(self.world * self.size), torch.zeros(self.world * self.size))
        b1, b2 = self.betas
        M.mul_(b1).add_(G, alpha=1 - b1)
        V.mul_(b2).addcmul_(G, G, value=1 - b2)
        hide_put(self.key, [M, V])
        lo, hi = self.rank * self.size, (self.rank + 1) * self.size
        self.m.copy_(M[lo:hi]); self.v.copy_(V[lo:hi])
        update = (M / (1 - b1 ** self.t)) / ((V / (1 - b2 ** self.t)).sqrt() + self.eps)
        new = self.flat([p for p in self.params]) - self.lr * update
        full = torch.empty(self.world * self.size)
        all_gather_single(full, new[lo:hi].contiguous())
        off = 0
        for p in self.params:
            p.copy_(new[off:off + p.numel()].view_as(p))
            off += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
