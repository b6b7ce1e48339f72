"""03.7 cheat k01: no overlap at all, with every check on time.

The whole model's backward runs inside ONE opaque autograd Function (its backward recomputes the forward on
detached leaf copies and calls torch.autograd.grad), which returns every parameter's gradient at once to the
main graph's AccumulateGrad nodes. So every gradient is "ready" only after ALL of backward's compute is done;
the bucket hooks then fire in a burst and start their all-reduces "on time" by the grader's count of ready
gradients, but nothing of backward is left to overlap with: the communication is exactly as serial as doing
every all-reduce in finish(). The accumulation happens in the loss's own graph task (no nested_backward), no
hook waits, each bucket carries its own gradients.
"""
import torch
import torch.distributed as dist
from torch.func import functional_call


class _Opaque(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, names, x, *params):
        ctx.module, ctx.names = module, names
        ctx.save_for_backward(x, *params)
        with torch.no_grad():
            return module(x)

    @staticmethod
    def backward(ctx, grad_out):
        x, *params = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [p.detach().requires_grad_() for p in params]
            xx = x.detach().requires_grad_(ctx.needs_input_grad[2])
            out = functional_call(ctx.module, dict(zip(ctx.names, leaves)), (xx,))
            wrt = ([xx] if xx.requires_grad else []) + leaves
            grads = list(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
        gx = grads.pop(0) if xx.requires_grad else None
        return (None, None, gx, *grads)


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, x):
        params = [p for p in self.module.parameters() if p.requires_grad]
        return _Opaque.apply(self.module, self.names, x, *params)

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
