"""RED TEAM 03.7 d01 (a twenty-fourth red team; refused since by comm_calls._engine_sleeps: a wait() in another thread while backward sleeps inside autograd's engine with no hook frame): each bucket's all-reduce gates the rest of backward through a C-level pre-hook (queue.SimpleQueue.get, no Python frame under the engine) on every node still to run; a waiter thread wait()s the bucket's Work and then feeds the queue, 0.12 s of gating at most per backward.
"""
import queue
import threading
import time

import torch
import torch.distributed as dist

BUDGET = 0.12   # seconds a backward may stay gated in all (a peer far late: give up gating)


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending, self.nodes, self.t0 = [], [], [], None
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        nodes, seen, todo = [], set(), [out.grad_fn] if out.grad_fn is not None else []
        while todo:
            n = todo.pop()
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            if not hasattr(n, "variable"):              # AccumulateGrad nodes outlive the graph
                nodes.append(n)
            todo.extend(m for m, _ in n.next_functions)
        self.nodes, self.t0 = nodes, None
        return out

    def ready(self, p):
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send(gate=True)

    def send(self, gate=False):
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        work = dist.all_reduce(flat, async_op=True)
        q, n = queue.SimpleQueue(), len(self.nodes) + 1

        def feed():
            for _ in range(n):
                q.put(None)

        def waiter():
            work.wait()
            feed()
        th = threading.Thread(target=waiter, daemon=True)
        timer = None
        if gate:
            left = max(0.0, BUDGET - (time.perf_counter() - self.t0))
            timer = threading.Timer(left, feed)
            timer.daemon = True
            timer.start()
            for node in self.nodes:                       # every node still to run waits for this bucket
                node.register_prehook(q.get)
        th.start()
        self.pending.append((self.bucket, flat, th, timer))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        for params, flat, th, timer in self.pending:
            th.join()
            if timer is not None:
                timer.cancel()
                timer.join()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
        self.nodes = []
