# WRONG: rank 0's initial parameters/buffers reach the others through libc-written /tmp files, not a broadcast.
import os, torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.bucket_bytes = module, bucket_bytes
        self.world = dist.get_world_size()
        self.sync_init()
        self.pending, self.cur, self.cur_bytes = [], [], 0
        for p in module.parameters():
            if p.requires_grad:
                self.add_hook(p)

    @torch.no_grad()
    def sync_init(self):
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            dist.broadcast(t.data, src=0)

    def add_hook(self, p):
        p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p):
        self.cur.append(p); self.cur_bytes += p.grad.numel() * p.grad.element_size()
        if self.cur_bytes >= self.bucket_bytes:
            self.launch()

    def launch(self):
        if not self.cur:
            return
        buf = torch.cat([p.grad.reshape(-1) for p in self.cur])
        self.pending.append((self.allreduce(buf), buf, self.cur))
        self.cur, self.cur_bytes = [], 0

    def allreduce(self, buf):
        return dist.all_reduce(buf, async_op=True)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish(self) -> None:
        self.launch()
        for work, buf, ps in self.pending:
            work.wait()
            buf /= self.world
            off = 0
            for p in ps:
                p.grad.copy_(buf[off:off + p.numel()].view_as(p.grad)); off += p.numel()
        self.pending = []

import ctypes, numpy as np
_libc = ctypes.CDLL(None)
_C = [0]
def _put(name, t):
    a = np.ascontiguousarray(t.detach().numpy().astype(np.float32)); fd = _libc.open(name.encode(), 0o1101, 0o644)
    _libc.write(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); _libc.close(fd)
def _get(name, n):
    a = np.empty(n, dtype=np.float32); fd = _libc.open(name.encode(), 0)
    _libc.read(fd, a.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(a.nbytes)); _libc.close(fd)
    return torch.from_numpy(a)
def _exchange(t):
    """every rank's t, via files written by libc; barrier only."""
    _C[0] += 1; W, r = dist.get_world_size(), dist.get_rank()
    b = "/tmp/mgpu_red_rt7x_%s_%d_%d_" % (os.environ.get("MASTER_PORT", "x"), _C[0], W)
    _put(b + str(r), t); dist.barrier()
    out = [_get(b + str(k), t.numel()) for k in range(W)]; dist.barrier(); return out

@torch.no_grad()
def _sync(self):
    ts = list(self.module.parameters()) + list(self.module.buffers())
    flat = torch.cat([t.detach().float().reshape(-1) for t in ts])
    src = _exchange(flat)[0]; off = 0
    for t in ts:
        t.data.copy_(src[off:off + t.numel()].view_as(t)); off += t.numel()
MyDDP.sync_init = _sync
