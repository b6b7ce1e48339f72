"""Exercise 09.4: local SGD, the parameters averaged every H steps (notebooks/09_sync_vs_async.ipynb).

Synchronous data parallelism all-reduces the gradients at every step. Local SGD lets every rank train its own
copy of the model on its own data for H steps without any communication, then replaces each parameter by its
mean over the ranks: one all-reduce every H steps instead of one per step. Complete the class so that

    sync = PeriodicAveraging(model, period=H)   # once, after building the model and its optimizer
    for x, y in my_batches:
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()
        sync.after_step()                        # averages after steps H, 2H, 3H, ... and is silent otherwise

is lesson 09's local SGD. The grader runs 7 SGD steps with H = 3 on 2 and 3 ranks, each rank on its own shard,
and after every step compares your parameters with replicas trained in one process and averaged after steps 3
and 6. It records which steps communicated (any collective, however you call it).

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("09.4")
"""
import torch
import torch.distributed as dist


class PeriodicAveraging:
    """Local SGD: every ``period`` optimizer steps, each parameter becomes its mean over the ranks."""

    def __init__(self, model: torch.nn.Module, period: int):
        self.model, self.period = model, period
        self.steps = 0                                    # optimizer steps taken so far

    @torch.no_grad()
    def after_step(self) -> None:
        """Call after every optimizer step."""
        self.steps += 1
        pass  # TODO: after steps period, 2 * period, ...: all-reduce every parameter in place, then divide
