"""03.7 red-team attempt p01: every bucket's real all-reduce deferred to the end of backward.

Cheat: each bucket is handed to ``dist.all_reduce(..., async_op=True)`` from the gradient hook, on time and with
the right contents, so the grader records a correct, asynchronous, in-backward call per bucket. But the bucket is a
tensor subclass (``Deferred``) with ``__torch_dispatch__``: when torch's all_reduce reaches the C++ operator
``c10d.allreduce_`` the subclass intercepts it, parks the tensor, and issues the operator on a 1-element zero tensor
instead (so a genuine Work comes back). Nothing of the gradients moves during backward. The final bucket's call
(in finish(), or the hook of the last gradient) flushes: one synchronous all-reduce of every parked bucket,
written into the parked tensors, which the grader then delivers at wait(). That flush happens inside the grader's
own counted call (nested, so not counted) -> communication never overlaps backward.
"""
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

_PY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


class Deferred(torch.Tensor):
    @staticmethod
    def __new__(cls, elem, box):
        t = torch.Tensor._make_subclass(cls, elem)
        t.box = box
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        boxes = []

        def find(x):
            if isinstance(x, Deferred):
                boxes.append(x.box)
            return x
        tree_map(find, (args, kwargs))
        box = boxes[0] if boxes else None
        if "allreduce_" in str(func):
            tensors = args[0]
            with torch._C._ExcludeDispatchKeyGuard(_PY):
                box["pending"].append(tensors[0])
                dummy = torch.zeros(1, dtype=tensors[0].dtype)
                if box["flush"]:
                    pend = box["pending"]
                    flat = torch.cat([t.reshape(-1) for t in pend])
                    dist.all_reduce(flat)            # the real exchange, nested inside the counted call
                    off = 0
                    for t in pend:
                        n = t.numel()
                        t.copy_(flat[off:off + n].view_as(t))
                        off += n
                    box["pending"] = []
                    box["flush"] = False
                _, work = func([dummy], *args[1:], **kwargs)
            return (tensors, work)
        with torch._C._ExcludeDispatchKeyGuard(_PY):
            out = func(*args, **kwargs)
        if box is None:
            return out
        return tree_map(lambda o: Deferred(o, box) if isinstance(o, torch.Tensor) and not isinstance(o, Deferred)
                        and o.is_floating_point() else o, out)


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        self.box = {"pending": [], "flush": False}
        self.trainable = sum(1 for p in module.parameters() if p.requires_grad)
        self.seen = 0
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
        self.seen += 1
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send(last=self.seen == self.trainable)

    def send(self, last=False):
        flat = Deferred(torch.cat([p.grad.reshape(-1) for p in self.bucket]), self.box)
        self.box["flush"] = last
        self.pending.append((self.bucket, flat, dist.all_reduce(flat, async_op=True)))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send(last=True)
        for params, flat, work in self.pending:
            work.wait()
            with torch._C._ExcludeDispatchKeyGuard(_PY):
                flat /= self.world
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        self.pending.clear()
        self.seen = 0
