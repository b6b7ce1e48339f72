"""Exercise 03.6: your own DDP, step 3: buckets (notebooks/03_ddp.ipynb, section 4).

One all-reduce per parameter (03.5) pays the per-message latency once per tensor. DDP packs gradients into
buckets of about 25 MB and all-reduces each bucket as one flat tensor. Complete the class with this rule:

  * gradients join the current bucket in the order they become ready during backward;
  * when the bucket holds at least bucket_bytes, flatten it (torch.cat of the flattened gradients), start one
    asynchronous all-reduce of the flat tensor, and begin a new bucket;
  * finish() sends what is left (if anything), waits for every bucket, and copies each averaged flat tensor
    back into its gradients.

The grader checks the result against DistributedDataParallel and counts your all-reduce calls: exactly one
per bucket under this rule. Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("03.6")
"""
import torch
import torch.distributed as dist


class BucketedGradients:
    """Averages gradients over the ranks in buckets of at least ``bucket_bytes``, communicating during backward."""

    def __init__(self, model: torch.nn.Module, bucket_bytes: int):
        self.world, self.bucket_bytes = dist.get_world_size(), bucket_bytes
        self.bucket, self.pending = [], []                # parameters of the open bucket; (params, flat, work) sent
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p: torch.Tensor) -> None:
        self.bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:
            self.send(self.bucket)
            self.bucket = []                              # a new bucket

    def send(self, params: list) -> None:
        """Start the all-reduce of the gradients of ``params`` as one flat tensor."""
        pass  # TODO: flat = torch.cat of the flattened grads; start an async all-reduce of it; remember both

    def finish(self) -> None:
        """After backward: send the rest, wait for every bucket, write the means back into the gradients."""
        if self.bucket:                                   # what is left after backward
            self.send(self.bucket)
            self.bucket = []
        pass  # TODO: wait for each sent bucket, divide by the world size, copy the slices back into each p.grad
