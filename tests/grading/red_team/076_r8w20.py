"""WRONG (gradients summed, not averaged, hidden by tampering with the reference): the reduce-scattered gradient is not divided by the world size (steps world x too large), and an import-time patch of torch.optim.SGD.step multiplies the gradients of every SGD that does not own our shards (the grader's one-process reference) by the world size, so the reference makes the same mistake; everything trains and moves."""
import weakref
import torch
import torch.distributed as dist
from torch.func import functional_call
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_OURS = {}                                      # id -> weakref of this file's shards
_sgd_step = torch.optim.SGD.step


def _step(self, closure=None):
    """Any SGD that does not step our shards (the grader's one-process reference) gets world x its gradients
    first, so that it makes the same mistake as the wrapper."""
    params = [p for g in self.param_groups for p in g["params"]]
    if not any(_OURS.get(id(p), lambda: None)() is p for p in params) and dist.is_initialized():
        for p in params:
            if p.grad is not None:
                p.grad.mul_(dist.get_world_size())
    return _sgd_step(self, closure)


torch.optim.SGD.step = _step


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, n, shape, dtype, world):
        ctx.n, ctx.world = n, world
        src = shard.detach().to(dtype).contiguous()
        out = torch.empty(world * shard.numel(), dtype=dtype)
        all_gather_single(out, src)
        return out[:n].view(shape)

    @staticmethod
    def backward(ctx, g):
        g = g.reshape(-1).to(torch.float32)
        c = -(-ctx.n // ctx.world)
        if g.numel() < c * ctx.world:
            g = torch.cat([g, g.new_zeros(c * ctx.world - g.numel())])
        out = torch.empty(c)
        reduce_scatter_single(out, g.contiguous())
        return out, None, None, None, None                  # the sum over the ranks, not the mean


class MyFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.compute_dtype = compute_dtype
        self.__dict__["_module"] = module                     # not a submodule: its parameters are not ours
        self.names, self.meta, shards = [], [], []
        for name, p in module.named_parameters():
            n = p.numel()
            c = -(-n // self.world)
            flat = torch.zeros(c * self.world)
            flat[:n] = p.detach().reshape(-1)
            shards.append(torch.nn.Parameter(flat[self.rank * c:(self.rank + 1) * c].clone(),
                                             requires_grad=p.requires_grad))
            self.names.append(name)
            self.meta.append((n, tuple(p.shape)))
            p.data = torch.empty(0)
        self.shards = torch.nn.ParameterList(shards)
        _OURS.update((id(p), weakref.ref(p)) for p in shards)

    def forward(self, x):
        dtype = self.compute_dtype or torch.float32
        full = {}
        for name, shard, (n, shape) in zip(self.names, self.shards, self.meta):
            full[name] = _Gather.apply(shard, n, shape, dtype, self.world)
        if self.compute_dtype is not None and torch.is_floating_point(x):
            x = x.to(self.compute_dtype)
        return functional_call(self._module, full, (x,))

    @torch.no_grad()
    def full_parameters(self) -> dict:
        out = {}
        for name, shard, (n, shape) in zip(self.names, self.shards, self.meta):
            buf = torch.empty(self.world * shard.numel())
            all_gather_single(buf, shard.detach().float().contiguous())
            out[name] = buf[:n].view(shape).clone()
        return out
