# WRONG: file created with libc via ctypes (no Python open), then torch.from_file(shared=True) mmap of a /tmp file as a shared buffer between ranks; barriers only.
import os, torch, pickle
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        self.m = torch.zeros(self.size)
        self.v = torch.zeros(self.size)
        self.calls = 0

    def flat(self, tensors):
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    def adam(self, g, m, v, p):
        b1, b2 = self.betas
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        return p - self.lr * (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)

    def write(self, full):
        off = 0
        for p in self.params:
            p.copy_(full[off:off + p.numel()].view_as(p)); off += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1; globals()['_GC'] = globals().get('_GC', 0) + 1; self.calls = globals()['_GC']; self.calls = f'{self.calls}_{self.world}_{self.n}'
        S, r, W = self.size, self.rank, self.world
        grads = self.flat([p.grad for p in self.params])
        params = self.flat([p for p in self.params])

        path = "/tmp/mgpu_red_rt7_ff_%s_%s" % (os.environ.get("MASTER_PORT", "x"), self.calls)
        if r == 0:
            import ctypes; libc = ctypes.CDLL(None); fd = libc.open(path.encode(), 0o1102, 0o644)
            libc.ftruncate(fd, ctypes.c_long(4 * 2 * W * W * S)); libc.close(fd)
        dist.barrier()
        buf = torch.from_file(path, shared=True, size=2 * W * W * S, dtype=torch.float32)
        gb = buf[:W * W * S].view(W, W * S); pb = buf[W * W * S:W * W * S + W * S].view(W, S)
        gb[r] = grads; dist.barrier()
        mine = self.adam(gb.sum(0)[r*S:(r+1)*S] / W, self.m, self.v, params[r*S:(r+1)*S])
        pb[r] = mine; dist.barrier()
        self.write(pb.reshape(-1).clone()); dist.barrier()
