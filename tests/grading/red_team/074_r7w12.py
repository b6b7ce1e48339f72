# WRONG: slices exchanged through /tmp files written/read with libc via ctypes (bypassing Python's open/torch.save); barriers only.
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
        self.t += 1; self.calls += 1
        S, r, W = self.size, self.rank, self.world
        grads = self.flat([p.grad for p in self.params])
        params = self.flat([p for p in self.params])

        import ctypes, numpy as np
        libc = ctypes.CDLL(None)
        globals()['_GC'] = globals().get('_GC', 0) + 1; c = globals()['_GC']
        def put(name, t):
            a = np.ascontiguousarray(t.numpy()); fd = libc.open(name.encode(), 0o1101, 0o644)
            libc.write(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); libc.close(fd)
        def get(name, n):
            a = np.empty(n, dtype=np.float32); fd = libc.open(name.encode(), 0)
            libc.read(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); libc.close(fd)
            return torch.from_numpy(a)
        base = "/tmp/mgpu_red_rt7c_%s_%d_%d_" % (os.environ.get("MASTER_PORT", "x"), c, W)
        put(base + "g%d" % r, grads); dist.barrier()
        tot = sum(get(base + "g%d" % k, W * S) for k in range(W)) / W
        mine = self.adam(tot[r*S:(r+1)*S], self.m, self.v, params[r*S:(r+1)*S])
        put(base + "p%d" % r, mine); dist.barrier()
        self.write(torch.cat([get(base + "p%d" % k, S) for k in range(W)]))
