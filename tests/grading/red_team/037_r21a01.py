"""RED TEAM 03.7 a01 (a twenty-first red team; refused by the non-zero count and log2 sizes the content checks compare since): 03.7 attempt: the hooks of full buckets start async all-reduces of a decoy with the bucket's exact aggregates
(the bucket sorted); every real gradient travels in the last call, scaled by 2**-30 so the per-call content check
(three sums, rtol 1e-4) sees only the last bucket. No overlap: all reduction happens at the end."""
import torch
import torch.distributed as dist

S = 2.0 ** -30


class MyDDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending, self.deferred, self.seen = [], [], [], 0
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)
        self.n = 0
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)
                self.n += 1

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def ready(self, p):
        self.bucket.append(p)
        self.seen += 1
        if self.seen == self.n:                 # the last gradient: everything goes now
            self.send_all()
        elif sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            flat = torch.cat([q.grad.reshape(-1) for q in self.bucket])
            decoy = flat.sort().values          # same sum, squares and |x| as the bucket: useless to sum
            self.pending.append(dist.all_reduce(decoy, async_op=True))
            self.deferred.extend(self.bucket)
            self.bucket = []

    def send_all(self):
        flat = torch.cat([q.grad.reshape(-1) for q in self.bucket] +
                         [q.grad.reshape(-1) * S for q in self.deferred])
        self.last = (self.bucket, self.deferred, flat, dist.all_reduce(flat, async_op=True))
        self.bucket, self.deferred = [], []

    def finish(self):
        if self.bucket or self.deferred:
            self.send_all()
        self.seen = 0
        for w in self.pending:
            w.wait()
        self.pending.clear()
        bucket, deferred, flat, work = self.last
        work.wait()
        flat /= self.world
        off = 0
        for q in bucket:
            q.grad.copy_(flat[off:off + q.numel()].view_as(q))
            off += q.numel()
        for q in deferred:
            q.grad.copy_((flat[off:off + q.numel()] / S).view_as(q))
            off += q.numel()
        self.last = None
