"""03.7 cheat n01: every gradient but the output layer's held back until the whole backward compute is over.

In forward, every trainable parameter EXCEPT those of the last registered leaf module (the output layer in every
graded model) is swapped for a native view ``p.view_as(p)`` made before any layer op. Those view nodes have the
lowest sequence numbers, so CPU autograd's ready queue runs them (and so their AccumulateGrads, hooks and bucket
all-reduces) only after every layer's backward. The output layer's own weight and bias are left untouched: their
AccumulateGrad (top priority) runs right after the last layer's node, so the grader's ``progress()`` is non-zero
before any other layer's node runs, and ``_held_back`` sees one early layer of 3-5. All buckets but the first
(which holds only the output layer's gradients) start after the whole backward compute: nothing to overlap.
"""
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
        leaves = [m for m in module.modules()
                  if not list(m.children()) and any(p.requires_grad for p in m.parameters(recurse=False))]
        keep = {id(p) for p in leaves[-1].parameters(recurse=False)} if leaves else set()
        self.slots = [(m, n) for m in module.modules() for n, p in m._parameters.items()
                      if p is not None and p.requires_grad and id(p) not in keep]
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        saved = [m._parameters[n] for m, n in self.slots]
        views = {}
        for (m, n), p in zip(self.slots, saved):
            if id(p) not in views:                        # a tied weight: one view, used twice
                views[id(p)] = p.view_as(p)
            m._parameters[n] = views[id(p)]
        try:
            return self.module(*args, **kwargs)
        finally:
            for (m, n), p in zip(self.slots, saved):
                m._parameters[n] = p

    def ready(self, p):
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send()

    def send(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        self.pending.append((self.bucket, flat, dist.all_reduce(flat, async_op=True)))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        for params, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
