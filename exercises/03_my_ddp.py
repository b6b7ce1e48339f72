"""Exercise 03.4: your own DDP, step 1: average the gradients after backward (notebooks/03_ddp.ipynb).

DistributedDataParallel does one thing to the gradients: after backward, every rank's .grad holds the
mean of all ranks' gradients, so every rank takes the same optimizer step. Write average_gradients(model)
so that the loop

    loss.backward()
    average_gradients(model)
    optimizer.step()

trains exactly as DDP does. The grader runs a few SGD steps on 2 and 3 ranks, each rank on its own shard of
the batch, and compares gradients and parameters with DistributedDataParallel's.

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("03.4")
"""
import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module) -> None:
    """After ``loss.backward()`` on every rank: each parameter's ``.grad`` becomes the mean over the ranks."""
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is None:
            continue
        pass  # TODO: all-reduce p.grad in place (a sum over the ranks), then make the sum a mean
