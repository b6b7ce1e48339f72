"""RED TEAM 03.7 g01 (a twenty-seventh red team; refused since by refusing_routes: Work.boxed and Work.unbox called from the student's file): every parameter through one identity autograd.Function (Gate), the model run with functional_call on its outputs; the buckets start in hooks on Gate's outputs once the model's whole backward is done, each waited for with Work.unbox(h.boxed()).wait() in the next hook or in Gate.backward (a bare Work whose wait() no check saw), before any gradient is accumulated.
"""
import torch
import torch.distributed as dist
from torch.func import functional_call

Work = torch._C._distributed_c10d.Work


class Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, *ps):
        ctx.owner = owner
        return tuple(p.view_as(p) for p in ps)

    @staticmethod
    def backward(ctx, *gs):
        ctx.owner._block()                                # the last buckets: waited for before any .grad is set
        return (None, *gs)


def _ready_order(n):
    """The order autograd's engine runs the AccumulateGrad nodes of Gate's n inputs (the same for any model)."""
    leaves = [torch.zeros(1, requires_grad=True) for _ in range(n)]
    order = []
    for i, q in enumerate(leaves):
        q.register_post_accumulate_grad_hook(lambda _q, i=i: order.append(i))

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *ps):
            return tuple(p.view_as(p) for p in ps)

        @staticmethod
        def backward(ctx, *gs):
            return gs
    sum(v.sum() for v in Plain.apply(*leaves)).backward()
    return order


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.names = {}
        for n, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                self.names.setdefault(id(p), []).append(n)
        self.order = _ready_order(len(self.params))      # positions in Gate's inputs, in AccumulateGrad order
        self.pending, self.open = [], []

    def forward(self, x):
        views = Gate.apply(self, *self.params)
        self.got, self.next = {}, 0
        for i, v in enumerate(views):
            v.register_hook(lambda g, i=i: self._hook(i, g))
        sub = {n: v for p, v in zip(self.params, views) for n in self.names[id(p)]}
        return functional_call(self.module, sub, (x,), strict=False)

    def _block(self):
        for h, _, _ in self.pending:
            if not getattr(h, "_rt_done", False):
                Work.unbox(h.boxed()).wait()               # backward waits here for the bucket to arrive
                h._rt_done = True

    def _hook(self, i, g):
        self._block()                                     # the buckets started in earlier hooks: wait for them
        self.got[i] = g
        while self.next < len(self.order) and self.order[self.next] in self.got:
            k = self.order[self.next]
            self.next += 1
            self.open.append((k, self.got[k]))
            if sum(t.numel() * t.element_size() for _, t in self.open) >= self.bucket_bytes:
                self._send()
        return g

    def _send(self):
        flat = torch.cat([t.reshape(-1) for _, t in self.open])
        self.pending.append((dist.all_reduce(flat, async_op=True), flat, [k for k, _ in self.open]))
        self.open = []

    def finish(self):
        if self.open:
            self._send()
        for h, flat, ks in self.pending:
            h.wait()
            flat /= self.world
            off = 0
            for k in ks:
                p = self.params[k]
                p.grad.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()
        self.pending = []
