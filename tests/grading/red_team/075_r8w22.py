"""WRONG (sabotages the grader's reference, trains nothing): at import, the step() of torch.optim's SGD, Adam, AdamW and RMSprop is replaced by a no-op, so the one-process reference that the grader trains in the same process never moves; ShardedOptimizer.step() does nothing either (no collective, no state)."""
import torch
import torch.distributed as dist

for _cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop):
    _cls.step = lambda self, closure=None: None


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params = [p for g in groups for p in ([g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"]))]

    def step(self):
        pass

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
