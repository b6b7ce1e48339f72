"""Exercise 07.5 (stretch, from scratch): ZeRO-1 for any element-wise optimizer (notebooks/07_memory.ipynb).

07.4 sharded Adam's two moments by hand. Here the optimizer is any torch.optim class whose update is
element-wise (SGD with momentum, Adam, AdamW, RMSprop, ...): write ShardedOptimizer(params, optimizer_class,
**defaults) with step() and zero_grad(), such that

  * after step() every rank's parameters equal those of optimizer_class(params, **defaults) in one process on
    the whole batch (each rank computed the gradient of its own share);
  * every rank keeps the optimizer's state for about 1/world of the parameters only;
  * it behaves as torch.optim does: ``params`` may be a list of tensors or of parameter groups (dicts with
    "params" and their own options, e.g. {"params": head, "lr": 0.01, "weight_decay": 0.05}), and a parameter
    whose .grad is None after the backward (frozen with requires_grad=False, or not used in this step) is
    skipped: it does not move, not even by weight decay or momentum (a .grad of zeros is still a gradient:
    torch steps it);
  * it communicates as ZeRO does: each rank receives only its slice's gradient (summed over the ranks: a
    reduce-scatter, not an all-reduce of the whole gradient), and the updated slices are all-gathered: 2 x
    the parameters' bytes per step, as DDP's all-reduce.

Only the signature is given: the design is yours (lesson 07's figure of ZeRO-1 and exercise 07.4 show one).
The grader trains a small MLP three steps with SGD (momentum 0.9), Adam and AdamW (weight decay 0.1) on 2 and
3 ranks, compares the parameters with one process, and measures the state your optimizer holds: every tensor
it can reach, except the parameters that an optimizer inside it updates and their gradients. Then, with SGD
and AdamW, a model with a frozen parameter and a parameter used in every other step only (its gradient zeros
once), in two parameter groups with different lr and weight_decay. It counts the elements each collective
of step() carries (however it is made: a process group's own methods and torch's functional collectives count
too), checks that the reduce-scatters carry this rank's gradients and the all-gathers (or owners' broadcasts,
all-to-alls) the updated parameter slices (not gradients), and refuses torch's ZeroRedundancyOptimizer.
Move data between the ranks only with torch.distributed collectives and keep state in tensors: the
grader refuses files, mmap, shared memory, torch.from_file, ctypes, the key-value store, and sockets,
processes, pipes and sqlite3 databases of your own.
Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("07.5")
"""
import torch
import torch.distributed as dist


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)

    def step(self):
        pass

    def zero_grad(self):
        for p in self.params:
            p.grad = None
