"""WRONG (03.7): (handoff waited for) bucketed async DDP that leaks every step's averaged gradients (all of them, forever) into zlib decompressors held by a helper thread's locals."""
import queue
import threading
import zlib
import torch
import torch.distributed as dist


def _keeper(inbox):
    kept = []
    while True:
        data = inbox.get()
        if data is None:
            return
        d = zlib.decompressobj()
        d.decompress(zlib.compress(data, 0), 1)          # the rest stays in d.unconsumed_tail
        kept.append(d)
        data = None
        inbox.task_done()


class MyDDP(torch.nn.Module):
    """``module`` with its gradients averaged over the ranks in buckets of at least ``bucket_bytes``, each
    all-reduced asynchronously as soon as it is full, during backward; ``finish()`` before the optimizer step."""

    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module, self.world, self.bucket_bytes = module, dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=0)                  # every replica starts from rank 0's weights
        self._box = queue.Queue()
        threading.Thread(target=_keeper, args=(self._box,), daemon=True).start()
        for p in module.parameters():                     # each parameter once, however often the model uses it
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def ready(self, p: torch.Tensor) -> None:
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send()

    def send(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.bucket])
        self.pending.append((self.bucket, flat, dist.all_reduce(flat, async_op=True)))
        self.bucket = []

    def finish(self) -> None:
        """After backward, before the optimizer step: send the open bucket, wait for all, write the means back."""
        if self.bucket:
            self.send()
        for params, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            self._box.put(flat.numpy().tobytes())
            self._box.join()
        self.pending.clear()
