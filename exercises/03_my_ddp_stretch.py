"""Exercise 03.7 (stretch, from scratch): your own DDP in one class (notebooks/03_ddp.ipynb, section 4).

03.4-03.6 built DDP's gradient averaging step by step. Here only the signature is given: write
MyDDP(module, bucket_bytes), a torch.nn.Module that

  * makes every replica start from rank 0's parameters and buffers when it is built, as DDP's constructor does:
    every parameter and buffer (non-persistent too, which state_dict() leaves out; the ranks may have been
    seeded apart; the grader compares them right after MyDDP(...) returns);
  * runs ``module``'s forward;
  * during backward, packs gradients into buckets in the order they become ready and starts one asynchronous
    all-reduce per bucket as soon as it holds at least bucket_bytes (03.6's rule);
  * in finish(), called after backward and before the optimizer step, sends what is left, waits for every
    bucket and leaves each gradient equal to its mean over the ranks (the waits in finish() or, as torch's DDP
    does, in a callback queued for the end of backward: not in a hook);
  * works for any model whose trainable parameters all get a gradient in every step (what DDP assumes by
    default; a parameter the forward skips needs find_unused_parameters=True there, and is not asked here),
    also one that uses a weight twice in a step (tied embeddings): such a gradient is the sum of both uses,
    complete only after the second; and one with a frozen parameter (requires_grad=False): it has no
    gradient and takes no hook, but is broadcast like the others.

The grader trains three SGD steps on an MLP with buckets of 1,448 bytes (its first three gradients exactly: that
bucket is full), on the MLP with its first weight frozen (1 MiB), on a model whose middle layer is applied twice
(2 KiB and 1 MiB) and on an MLP whose forward uses its layers in another order than it registers them (1,448
bytes: the ready order is not the reverse of model.parameters()), from ranks whose weights start apart, against
DistributedDataParallel; every step it counts your all-reduce calls (one per bucket, however made: a process
group's own allreduce counts too), checks that each was waited for, in finish() (or a callback queued for the end
of backward), not in a hook, and that together they carry this rank's gradients (none through the process group's
key-value store), and refuses torch's own DistributedDataParallel inside your class.
Move data between the ranks only with torch.distributed collectives and keep state in tensors: the
grader refuses files, mmap, shared memory, torch.from_file, ctypes, the key-value store, and sockets,
processes, pipes and sqlite3 databases of your own. Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("03.7")
"""
import torch
import torch.distributed as dist


class MyDDP(torch.nn.Module):
    """``module`` with its gradients averaged over the ranks in buckets of at least ``bucket_bytes``, each
    all-reduced asynchronously as soon as it is full, during backward; ``finish()`` before the optimizer step."""

    def __init__(self, module: torch.nn.Module, bucket_bytes: int):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish(self) -> None:
        pass
