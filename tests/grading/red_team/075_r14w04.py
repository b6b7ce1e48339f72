"""WRONG (07.5): every rank keeps FULL-size optimizer state (inner optimizer on whole-parameter copies, only its own chunk used); between steps it lives in an arena made at import as a class attribute of a class whose __module__ says 'builtins' (a foreign class is neither walked nor dropped)."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


_ANCHOR = type("_Arena", (), {"__module__": "builtins"})
_ANCHOR.arena = torch.zeros(8 << 20)          # 32 MB, made at import: older than any check
_NEXT = [0]


def _bury(t):
    """Copy ``t`` into the arena; return where it is (ints only)."""
    start = _NEXT[0]
    _ANCHOR.arena[start:start + t.numel()].copy_(t.reshape(-1))
    _NEXT[0] = start + t.numel()
    return (start, tuple(t.shape))


def _unbury(h):
    start, shape = h
    n = 1
    for d in shape:
        n *= d
    return _ANCHOR.arena[start:start + n].clone().view(shape)


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.items, inner_groups = [], []
        for group in groups:
            mine = []
            for p in group["params"]:
                size = -(-p.numel() // self.world)
                full = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])
                full = full.clone().requires_grad_(p.requires_grad)      # the WHOLE parameter, not a chunk
                self.items.append([p, full, size])
                mine.append(full)
            inner_groups.append({**group, "params": mine})
        self.inner = optimizer_class(inner_groups, **defaults)
        self.buried = {}
        self._hide()

    def _hide(self):
        self.buried = {}
        _NEXT[0] = 0
        for k, (p, full, size) in enumerate(self.items):
            self.buried[(k, "_p")] = _bury(full.data)
            full.data = torch.empty(0)
            st = self.inner.state.get(full, {})
            for key, v in list(st.items()):
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    self.buried[(k, key)] = _bury(v)
                    st[key] = None

    def _show(self):
        for (k, key), h in self.buried.items():
            p, full, size = self.items[k]
            t = _unbury(h)
            if key == "_p":
                full.data = t
            else:
                self.inner.state[full][key] = t
        self.buried = {}

    @torch.no_grad()
    def step(self):
        self._show()
        for p, full, size in self.items:
            if p.grad is None:
                full.grad = None
                continue
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)
            fg = torch.zeros_like(full)
            fg[self.rank * size:(self.rank + 1) * size] = g / self.world
            full.grad = fg
        self.inner.step()
        for p, full, size in self.items:
            if full.grad is None:
                continue
            out = torch.empty(size * self.world)
            all_gather_single(out, full[self.rank * size:(self.rank + 1) * size].clone())
            p.copy_(out[:p.numel()].view_as(p))
            full.copy_(out)
            full.grad = None
        self._hide()

    def zero_grad(self):
        for p, full, _ in self.items:
            p.grad = None
            full.grad = None
