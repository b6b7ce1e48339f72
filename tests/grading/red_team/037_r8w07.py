"""WRONG (no overlap, wait in a hook, monkeypatches torch): each bucket's all-reduce is waited for with
work.wait() inside the hook, while torch._C._current_autograd_node is briefly replaced by a function that
says None (so nothing can tell the wait runs inside backward); finish() only unpacks."""
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module = module
        self.bucket_bytes = bucket_bytes
        self.world = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        self._bucket, self._bytes, self._flight = [], 0, []
        self._trainable = sum(1 for p in module.parameters() if p.requires_grad)
        self._seen = 0
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _ready(self, p):
        self._seen += 1
        self._bucket.append(p)
        self._bytes += p.grad.numel() * p.grad.element_size()
        if self._bytes >= self.bucket_bytes:
            self._send(self._bucket)
            self._bucket, self._bytes = [], 0

    def _send(self, params):
        if not params:
            return
        flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
        self._flight.append((dist.all_reduce(flat, async_op=True), flat, params))
        real = torch._C._current_autograd_node
        torch._C._current_autograd_node = lambda: None
        try:
            self._flight[-1][0].wait()                       # blocks backward here
        finally:
            torch._C._current_autograd_node = real

    def finish(self) -> None:
        self._send(self._bucket)
        self._bucket, self._bytes, self._seen = [], 0, 0
        for work, flat, params in self._flight:
            work.wait()
            flat = flat.float().div_(self.world)
            for p, g in zip(params, flat.split([q.numel() for q in params])):
                p.grad.copy_(g.view_as(p.grad))
        self._flight = []
