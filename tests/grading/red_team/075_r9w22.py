"""Exercise 07.5 (stretch, from scratch): ZeRO-1 for any element-wise optimizer.

Solution, DDP-style: every gradient is all-reduced during the backward (an asynchronous all-reduce started
from each parameter's post-accumulate hook); step() waits, averages and runs optimizer_class on the whole
parameters of this rank. The parameters and the optimizer's tensors live in one flat buffer (one allocation).
"""
import torch
import torch.distributed as dist


def _groups(params):
    params = list(params)
    if params and isinstance(params[0], dict):
        groups = [dict(g) for g in params]
    else:
        groups = [{"params": params}]
    for g in groups:
        g["params"] = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
    return groups


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        groups = _groups(params)
        self.params = [p for g in groups for p in g["params"]]
        self.world = dist.get_world_size()
        self.n = sum(p.numel() for p in self.params)
        self.inner = optimizer_class(groups, **defaults)
        self._works = []
        for p in self.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        self._works.append(dist.all_reduce(p.grad, async_op=True))

    @torch.no_grad()
    def step(self):
        for w in self._works:
            w.wait()
        self._works = []
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.world)
        self.inner.step()
        self._pack()

    def _pack(self):
        keep, fresh = [], False
        ptr = getattr(self, "_ptr", None)
        for p in self.params:
            for k, v in self.inner.state.get(p, {}).items():
                if torch.is_tensor(v) and v.numel() == p.numel() and v.numel() > 1:
                    keep.append((p, k, v))
                    fresh = fresh or v.untyped_storage().data_ptr() != ptr
        if not fresh:
            return
        p0 = self.params[0]
        buf = torch.empty(self.n + sum(v.numel() for _, _, v in keep), dtype=p0.dtype, device=p0.device)
        off = 0
        for p in self.params:
            n = p.numel()
            buf[off:off + n].copy_(p.detach().reshape(-1))
            p.data = buf[off:off + n].view_as(p)
            off += n
        for p, k, v in keep:
            n = v.numel()
            buf[off:off + n].copy_(v.reshape(-1))
            self.inner.state[p][k] = buf[off:off + n].view_as(v)
            off += n
        self._ptr = buf.untyped_storage().data_ptr()

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
