"""WRONG (plain DDP, no ZeRO at all): the whole gradient is all-reduced through the gloo backend's uncounted allreduce_sparse and a full optimizer_class steps the whole model on every rank (full state, kept between steps only as saved results of autograd nodes); the reduce-scatter and the all-gather still run but only for show (and for a sliced decoy optimizer that the meter sees)."""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_TINY = torch.zeros((), requires_grad=True)


def _stash(t):
    """Keep t only as the saved results of two autograd nodes (relu of +t and -t): no Python tensor stays."""
    with torch.enable_grad():
        z = t.detach() + _TINY * 0
        return ("__kept__", torch.relu(z).grad_fn, torch.relu(-z).grad_fn)


def _unstash(h):
    return (h[1]._saved_result.detach() - h[2]._saved_result.detach()).clone()



class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params, self.entries, inner, full = [], [], [], []
        for g in groups:
            opts = {k: v for k, v in g.items() if k != "params"}
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            shards = []
            for p in ps:
                n = p.numel()
                c = -(-n // self.world)
                lo, hi = min(self.rank * c, n), min((self.rank + 1) * c, n)
                with torch.no_grad():
                    shard = p.detach().reshape(-1)[lo:hi].clone()
                self.entries.append((p, shard, n, c, hi - lo, lo))
                self.params.append(p)
                shards.append(shard)
            inner.append({"params": shards, **opts})
            full.append({"params": list(ps), **opts})
        self.inner = optimizer_class(inner, **defaults)          # decoy: the sliced state the grader sees
        self._put(optimizer_class(full, **defaults))              # the real one: full-size state, hidden

    def _put(self, o):
        self._full = o
        self._kept = {}

    def _get(self):
        o = self._full
        for p, st in self._kept.items():
            o.state[p] = {k: (_unstash(v) if isinstance(v, tuple) and v and v[0] == "__kept__" else v)
                          for k, v in st.items()}
        self._kept = {}
        return o

    def _after(self):
        o = self._full
        for p, st in list(o.state.items()):
            self._kept[p] = {k: (_stash(v) if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
        o.state.clear()

    @torch.no_grad()
    def step(self):
        active = [e for e in self.entries if e[0].grad is not None]
        if not active:
            return
        W = self.world
        cols = []
        for p, shard, n, c, m, lo in active:
            g = p.grad.detach().reshape(-1).float()
            if g.numel() < W * c:
                g = torch.cat([g, g.new_zeros(W * c - g.numel())])
            cols.append(g.view(W, c))
        send = torch.cat(cols, dim=1).reshape(-1).contiguous()
        total = send.numel() // W
        mine = torch.empty(total)
        reduce_scatter_single(mine, send)                       # for show (and the decoy)
        mine.div_(W)
        be = dist.group.WORLD._get_backend(torch.device('cpu'))
        whole = torch.cat([p.grad.detach().reshape(-1).float() for p, *_ in active])
        be.allreduce_sparse([whole]).wait()                     # the real gradient exchange: uncounted all-reduce
        whole.div_(W)
        off, saved, o2 = 0, [], 0
        for p, shard, n, c, m, lo in active:
            shard.grad = mine[off:off + m].clone()
            saved.append(p.grad)
            p.grad = whole[o2:o2 + n].view_as(p).clone()
            off += c
            o2 += n
        self.inner.step()                                       # decoy keeps genuine sliced state
        self._get().step()                                      # the full optimizer on every rank
        self._after()
        out = torch.zeros(total)
        off = 0
        for (p, shard, n, c, m, lo), g in zip(active, saved):
            out[off:off + m] = p.detach().reshape(-1)[lo:lo + m]
            p.grad = g
            shard.grad = None
            off += c
        full = torch.empty(W * total)
        all_gather_single(full, out)
        full = full.view(W, total)
        off = 0
        for p, shard, n, c, m, lo in active:
            p.copy_(full[:, off:off + c].reshape(-1)[:n].view_as(p))
            shard.copy_(p.reshape(-1)[lo:lo + m])
            off += c

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
