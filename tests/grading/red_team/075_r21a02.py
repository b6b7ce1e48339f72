"""RED TEAM 07.5 a02 (a twenty-first red team; refused by the non-zero count and log2 sizes the content checks compare since): 07.5 attempt: weights sharded honestly; 1-D trainable params (biases) kept by a whole, replicated optimizer.
Their mean gradient slices are all-gathered (not updated slices), and a compensation tail appended to the weights'
all-gather makes the summed aggregates equal the updated parameters."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


def _fit(T, Q, A, init):
    c = init.clone().to(torch.float64).requires_grad_(True)
    opt = torch.optim.LBFGS([c], lr=1, max_iter=500, tolerance_grad=1e-20, tolerance_change=1e-30,
                            line_search_fn="strong_wolfe")
    sa, sq = max(A, 1e-12), max(Q, 1e-12)

    def closure():
        opt.zero_grad()
        loss = ((c.sum() - T) / sa) ** 2 + ((c.pow(2).sum() - Q) / sq) ** 2 + ((c.abs().sum() - A) / sa) ** 2
        loss.backward()
        return loss
    for _ in range(5):
        opt.step(closure)
    import os
    if os.environ.get("RT_DEBUG"):
        print("fit", T, Q, A, c.sum().item(), c.pow(2).sum().item(), c.abs().sum().item(), flush=True)
    return c.detach().float()


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.shards, inner_groups, full_groups, self.small = [], [], [], []
        for group in groups:
            mine, whole = [], []
            for p in group["params"]:
                if p.dim() == 1 and p.requires_grad:
                    whole.append(p)
                    self.small.append(p)
                    continue
                size = -(-p.numel() // self.world)
                flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])
                shard = flat[self.rank * size:(self.rank + 1) * size].clone().requires_grad_(p.requires_grad)
                self.shards.append((p, shard, size))
                mine.append(shard)
            inner_groups.append({**group, "params": mine})
            full_groups.append({**group, "params": whole})
        self.inner = optimizer_class(inner_groups, **defaults)
        self.full = optimizer_class(full_groups, **defaults)

    @torch.no_grad()
    def step(self):
        w = self.world
        for p, shard, size in self.shards:
            if p.grad is None:
                shard.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * w - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)
            shard.grad = g / w
        # biases: reduce-scatter, then all-gather the MEAN GRADIENT slices (not updated slices)
        comp = []                                       # (my grad slice, p, size)
        for p in self.small:
            if p.grad is None:
                continue
            size = -(-p.numel() // w)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * w - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)
            g /= w
            full = torch.empty(size * w)
            all_gather_single(full, g * 2.0 ** -20)     # exact power-of-two scaling: hides the gradient's sums
            p.grad = (full * 2.0 ** 20)[:p.numel()].clone()
            comp.append((g, p, size))
        self.full.step()                                # whole replicated optimizer on every rank
        self.inner.step()
        # compensation: my slice of each updated bias minus the gradient slice I gathered
        T = Q = A = 0.0
        news = []
        for g, p, size in comp:
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * w - p.numel())])
            new = flat[self.rank * size:(self.rank + 1) * size].double()
            gd = g.double() * 2.0 ** -20
            T += new.sum().item() - gd.sum().item()
            Q += new.pow(2).sum().item() - gd.pow(2).sum().item()
            A += new.abs().sum().item() - gd.abs().sum().item()
            news.append(new)
        k = max(1, sum(n.numel() for n in news))
        k = -(-k // 1)
        init = torch.cat(news) if news else torch.zeros(1, dtype=torch.float64)
        tail = _fit(T, Q, A, init) if news else torch.zeros(1)
        ks = torch.tensor([tail.numel()])
        # every rank must append the same count: fixed by the same bias sizes on every rank
        first = True
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            src = torch.cat([shard.detach(), tail]) if first else shard.detach()
            full = torch.empty(src.numel() * w)
            all_gather_single(full, src)
            n = src.numel()
            parts = full.view(w, n)[:, :size].reshape(-1)
            p.copy_(parts[:p.numel()].view_as(p))
            first = False

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
        for p in self.small:
            p.grad = None
