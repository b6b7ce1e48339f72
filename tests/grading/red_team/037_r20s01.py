"""03.7 r20s01 (a sleep loop until a flag set by the future's callback, 0.03 s at most; otherwise a twentieth red team's z03 (z01 with a 0.04 s cap and a threading.Event set by a then() callback, waited with a timeout in the hook): NO OVERLAP. Each bucket's hook starts its async all-reduce and then blocks inside the hook
until that all-reduce has finished (polling the Future from get_future().done(), which the grader's handle
does not instrument: only wait() and is_completed() are), so backward stops at every full bucket while the
bucket travels - communication is serialized with the backward, not overlapped. The block gives up after 0.04 s
(only ever reached when a peer is late), which keeps the gradient-ready span under the grader's timing probe
(0.6 x 0.4 s)."""
import threading
import time

import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def ready(self, p):
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send(block=True)

    def send(self, block=False):
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        work = dist.all_reduce(flat, async_op=True)
        fut = work.get_future()
        if block:                                          # hold backward here until the bucket has travelled
            flag = []
            fut.then(lambda f: flag.append(1))
            until = time.perf_counter() + 0.03
            while not flag and time.perf_counter() < until:
                time.sleep(1e-4)
        self.pending.append((self.bucket, flat, work, fut))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        for params, flat, work, fut in self.pending:
            fut.wait()
            out = fut.value()[0] if isinstance(fut.value(), (list, tuple)) else flat
            out = out / self.world
            offset = 0
            for p in params:
                p.grad.copy_(out[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
