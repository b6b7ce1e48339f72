# CHEAT 03.7: the per-bucket async all-reduces in backward use op=MAX (right input, useless result, thrown away); the real averaging is done after backward in finish() by world blocking broadcasts of every gradient (nothing overlapped; broadcasts are not counted as "others").
import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        rank = dist.get_rank()
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
            self.send()

    def send(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        self.pending.append((self.bucket, flat.clone(), dist.all_reduce(flat, op=dist.ReduceOp.MAX, async_op=True)))
        self.bucket = []

    def finish(self):
        if self.bucket:
            self.send()
        for params, flat, work in self.pending:
            work.wait()                                   # the MAX result lands in the tensor reduced; ours is the clone
            total = torch.zeros_like(flat)
            for r in range(self.world):                   # the real one, after backward
                part = flat.clone()
                dist.broadcast(part, src=r)
                total += part
            total /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(total[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
