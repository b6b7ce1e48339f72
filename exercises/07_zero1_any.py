"""Exercise 07.5 (stretch, from scratch): ZeRO-1 for any element-wise optimizer (notebooks/07_memory.ipynb).

07.4 sharded Adam's two moments by hand. Here the optimizer is any torch.optim class whose update is
element-wise (SGD with momentum, Adam, AdamW, RMSprop, ...): write ShardedOptimizer(params, optimizer_class,
**defaults) with step() and zero_grad(), such that

  * after step() every rank's parameters equal those of optimizer_class(params, **defaults) in one process on
    the whole batch (each rank computed the gradient of its own share);
  * every rank keeps the optimizer's state for about 1/world of the parameters only.

Only the signature is given: the design is yours (lesson 07's figure of ZeRO-1 and exercise 07.4 show one).
The grader trains a small MLP three steps with SGD (momentum 0.9), Adam and AdamW (weight decay 0.1) on 2 and
3 ranks, compares the parameters with one process, and measures the state your optimizer holds: every tensor
it can reach, except the parameters that an optimizer inside it updates and their gradients.
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
