"""WRONG (sabotages the grader's reference, trains nothing): at each step(), every torch.optim.Optimizer alive in the process that is not this one (gc) gets an instance attribute step = no-op, so the one-process reference the grader trains beside it never moves; this optimizer's step() moves nothing either (no collective, no state)."""
import gc
import torch
import torch.distributed as dist


def _noop(*args, **kwargs):
    return None


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params = [p for g in groups for p in ([g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"]))]
        self._freeze()

    @staticmethod
    def _freeze():
        for o in gc.get_objects():
            if isinstance(o, torch.optim.Optimizer) and "step" not in o.__dict__:
                o.step = _noop

    def step(self):
        self._freeze()

    def zero_grad(self, set_to_none=True):
        self._freeze()
        for p in self.params:
            p.grad = None
