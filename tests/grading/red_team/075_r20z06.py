"""RED TEAM 07.5 z06 (= z04, blob on torch.optim.lr_scheduler instead of builtins): NOT ZeRO-1. Every rank runs the WHOLE optimizer_class on ALL parameters (full, replicated
optimizer state, full update compute on every rank; nothing is sharded and no updated slice is all-gathered).
Communication: a legit reduce-scatter of this rank's gradients (so the "reduce-scatters carry this rank's
gradients" check passes), then `world` dist.gather calls (rank q is dst of call q) that deliver every rank's
summed gradient slice to every rank: an all-gather made of gathers. dist.gather is in MOVES, which the grader
only inspects when the reducing collectives alone do NOT carry the gradients, and _gathered_updated never looks
at gathers (it returns None when no all-gather/broadcast/all-to-all ran), so no all-gather at all is needed.
Traffic: 2P + P/w, under the 2P(1+1/w) + P/4 bound. The whole optimizer state is kept between steps as one
bytes object set as an attribute of the builtins module (bytes are not gc-tracked, builtins is not reachable from
the student's module, and the blob is not freed when the optimizer and the module's globals are dropped, so
neither held_bytes, OutsideState nor the malloc delta see it); the inner optimizer's state dict is emptied after
every step and refilled from the blob before the next."""
import builtins
import math

import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_TINY = 2.0 ** -60


def _f32(x):
    return torch.tensor(float(x), dtype=torch.float32).item()


def _solve_off(a, rt):
    """off >= 0 with (sum(off+a))^2 / sum((off+a)^2) == rt (bisection)."""
    def ratio(off):
        b = a + off
        return (b.sum() ** 2 / (b * b).sum()).item() if (b * b).sum() > 0 else float(len(a))
    if len(a) == 0:
        return 0.0
    if a.abs().sum() == 0:
        return 1.0
    if ratio(0.0) >= rt:
        return 0.0
    lo, hi = 0.0, max(a.max().item(), 1e-30)
    while ratio(hi) < rt and hi < 1e30:
        hi *= 4
    for _ in range(80):
        mid = (lo + hi) / 2
        if ratio(mid) < rt:
            lo = mid
        else:
            hi = mid
    return hi


def _steer(a, neg, A_t, T_t, Q_t):
    """Magnitudes b = off + a (+ gap for negative g), scale c, free signs: sum|h| = A_t, sum h ~ T_t,
    sum h^2 ~ Q_t (off found by bisection)."""
    gap = _f32(max(a.max().item(), 1e-30) * 1.5)
    def qh(off):
        b = a + off + gap * neg
        return (A_t / b.sum()).item() ** 2 * (b * b).sum().item()
    if qh(0.0) <= Q_t:
        off = 0.0
    else:
        lo, hi = 0.0, gap
        while qh(hi) > Q_t and hi < 1e30 * gap:
            hi *= 4
        for _ in range(100):
            mid = (lo + hi) / 2
            if qh(mid) > Q_t:
                lo = mid
            else:
                hi = mid
        off = hi
    off = _f32(off)
    b = a + off + gap * neg
    c = _f32(A_t / b.sum().item())
    flips = torch.cumsum(2 * c * b, 0)
    k = int(torch.searchsorted(flips, torch.tensor([A_t - T_t], dtype=flips.dtype)).item())
    sign = torch.ones_like(b)
    sign[:k] = -1
    return (sign * c * b).float(), c, off, gap


def _corrections(A, Q, T, r):
    """r float64 values with sum|e| = A, sum e^2 = Q, sum e = T."""
    out = torch.zeros(r, dtype=torch.float64)
    if A <= 0:
        return out
    flip = T < 0
    T = abs(T)
    T = min(T, A)
    neg_total = (A - T) / 2                                 # carried by k negative small elements
    k = max(1, min(r - 2, int(round((r - 1) * neg_total / A))))
    rp = r - 1 - k                                          # positive small elements
    def q(M):
        pos = (A + T) / 2 - M
        return M * M + pos * pos / rp + neg_total * neg_total / k
    lo, hi = ((A + T) / 2) / (rp + 1), (A + T) / 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if q(mid) < Q:
            lo = mid
        else:
            hi = mid
    M = (lo + hi) / 2
    out[0] = M
    out[1:1 + rp] = ((A + T) / 2 - M) / rp
    out[1 + rp:1 + rp + k] = -neg_total / k
    return -out if flip else out


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.inner = optimizer_class(params, **defaults)
        self.params = [p for g in self.inner.param_groups for p in g["params"]]
        self.key = "_rt_state_%x" % id(self)
        self.meta = None

    def _restore(self):
        blob = getattr(torch.optim.lr_scheduler, self.key, None)
        if blob is None or self.meta is None:
            return
        buf = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        pos = 0
        for i, k, shape, dtype, nbytes, other in self.meta:
            p = self.params[i]
            if nbytes is None:
                self.inner.state[p][k] = other
                continue
            t = buf[pos:pos + nbytes].clone().view(dtype).reshape(shape)
            pos += nbytes
            self.inner.state[p][k] = t

    def _hide(self):
        meta, chunks = [], []
        for i, p in enumerate(self.params):
            if p not in self.inner.state:
                continue
            for k, v in sorted(self.inner.state[p].items()):
                if isinstance(v, torch.Tensor):
                    b = v.detach().contiguous().reshape(-1).view(torch.uint8)
                    meta.append((i, k, tuple(v.shape), v.dtype, b.numel(), None))
                    chunks.append(b)
                else:
                    meta.append((i, k, None, None, None, v))
        self.meta = meta
        setattr(torch.optim.lr_scheduler, self.key, torch.cat(chunks).numpy().tobytes() if chunks else b"")
        self.inner.state.clear()

    @torch.no_grad()
    def step(self):
        w, r = dist.get_world_size(), dist.get_rank()
        live = [p for p in self.params if p.grad is not None and p.requires_grad]
        if not live:
            return
        L = sum(p.numel() for p in live)
        n = -(-L // w)
        flat = torch.zeros(n * w)
        flat[:L] = torch.cat([p.grad.reshape(-1) for p in live])
        mine = torch.empty(n)
        reduce_scatter_single(mine, flat)                   # legit-looking reduce-scatter of this rank's grads
        parts = [torch.empty(n) for _ in range(w)] 
        for q in range(w):                                  # w gathers: every rank's summed slice to rank q
            dist.gather(mine, parts if q == r else None, dst=q)
        G = torch.cat(parts).double()                       # the whole summed gradient, on every rank
        o = 0
        for p in live:                                      # the whole mean gradient, on every rank
            p.grad = (G[o:o + p.numel()] / w).float().view_as(p).clone()
            o += p.numel()
        self._restore()
        self.inner.step()                                   # the whole, unsharded optimizer
        self._hide()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
