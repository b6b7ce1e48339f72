"""Exercise 03.5: your own DDP, step 2: overlap the all-reduce with the backward pass (notebooks/03_ddp.ipynb).

Step 1 (03.4) waited for the whole backward, then all-reduced. DDP starts communicating while backward is
still running: as soon as a parameter's gradient is complete, its all-reduce starts (asynchronously), and the
optimizer step waits for all of them. Complete the class so that

    sync = OverlappedGradients(model)     # once, after building the model
    loss.backward()                       # all-reduces start inside backward, one per parameter
    sync.finish()                         # wait for them and average
    optimizer.step()

trains exactly as DDP does. Tools: p.register_post_accumulate_grad_hook(fn) calls fn(p) when p.grad is
complete; dist.all_reduce(t, async_op=True) returns a work handle whose .wait() blocks until it is done.
The grader checks the result against DistributedDataParallel and that every all-reduce started inside
backward with async_op=True. Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("03.5")
"""
import torch
import torch.distributed as dist


class OverlappedGradients:
    """Averages every parameter's gradient over the ranks, communicating during backward."""

    def __init__(self, model: torch.nn.Module):
        self.world = dist.get_world_size()
        self.pending = []                                 # (parameter, work handle) of started all-reduces
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p: torch.Tensor) -> None:
        """Called by autograd as soon as ``p.grad`` is complete."""
        pass  # TODO: start an asynchronous all-reduce of p.grad and remember it in self.pending

    def finish(self) -> None:
        """After backward: wait for every started all-reduce, then turn the sums into means."""
        pass  # TODO: wait for each pending work handle, divide that gradient by the world size, empty the list
