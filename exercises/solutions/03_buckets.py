"""Solution of exercise 03.6: buckets (for instructors)."""
import torch
import torch.distributed as dist


class BucketedGradients:
    """Averages gradients over the ranks in buckets of at least ``bucket_bytes``, communicating during backward."""

    def __init__(self, model: torch.nn.Module, bucket_bytes: int):
        self.world, self.bucket_bytes = dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p: torch.Tensor) -> None:
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send(self.bucket)
            self.bucket = []                              # a new bucket

    def send(self, params: list) -> None:
        """Start the all-reduce of the gradients of ``params`` as one flat tensor."""
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.pending.append((params, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self) -> None:
        """After backward: send the rest, wait for every bucket, write the means back into the gradients."""
        if self.bucket:                                   # what is left after backward
            self.send(self.bucket)
            self.bucket = []
        for params, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.pending.clear()
