# WRONG: rank 0's initial state sent through the default group's key-value store (pickled), not a broadcast.
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

import pickle
_K = [0]
@torch.no_grad()
def _sync(self):
    _K[0] += 1
    st = dist.distributed_c10d._get_default_store()
    ts = list(self.module.parameters()) + list(self.module.buffers())
    key = "rt7init%d_%d" % (_K[0], self.world)
    if dist.get_rank() == 0:
        st.set(key, pickle.dumps([t.detach().clone() for t in ts]))
    src = pickle.loads(st.get(key))
    for t, s in zip(ts, src): t.data.copy_(s)
MyDDP.sync_init = _sync
