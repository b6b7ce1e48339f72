# CHEAT 07.5: whole gradient reduce()d to rank 0, rank 0 keeps the WHOLE optimizer state in an array.array arena (made at import, hung on a nested class) and does the whole update, then broadcasts the parameters.
import array
import torch
import torch.distributed as dist


class ShardedOptimizer:
    class _Box:
        arena = array.array("B", bytes(32 << 20))

    def __init__(self, params, optimizer_class, **defaults):
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.groups = [{**g, "params": list(g["params"])} for g in groups]
        self.params = [p for g in self.groups for p in g["params"]]
        self.cls, self.defaults = optimizer_class, defaults
        self.meta = []          # (param index, key, offset, shape, dtype) or (index, key, None, value, None)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _view(self):
        return torch.frombuffer(self._Box.arena, dtype=torch.uint8)

    @torch.no_grad()
    def step(self):
        live = [p for p in self.params if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in live])
        dist.reduce(flat, dst=0)
        if self.rank == 0:
            flat /= self.world
            off = 0
            for p in live:
                p.grad = flat[off:off + p.numel()].view_as(p).clone()
                off += p.numel()
            inner = self.cls([{**g, "params": g["params"]} for g in self.groups], **self.defaults)
            buf = self._view()
            for i, key, o, shape, dt in self.meta:
                p = self.params[i]
                if o is None:
                    inner.state[p][key] = shape
                else:
                    n = torch.Size(shape).numel() * torch.empty(0, dtype=dt).element_size()
                    inner.state[p][key] = buf[o:o + n].view(dt).view(shape).clone()
            inner.step()
            self.meta, o = [], 0
            for i, p in enumerate(self.params):
                for key, v in inner.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        b = v.detach().reshape(-1).view(torch.uint8) if v.dim() else v.detach().reshape(1).view(torch.uint8)
                        buf[o:o + b.numel()].copy_(b)
                        self.meta.append((i, key, o, tuple(v.shape), v.dtype))
                        o += (b.numel() + 7) // 8 * 8
                    else:
                        self.meta.append((i, key, None, v, None))
            del inner, buf
            out = torch.cat([p.detach().reshape(-1) for p in live])
        else:
            out = torch.empty(flat.numel())
        dist.broadcast(out, src=0)
        if self.rank != 0:
            off = 0
            for p in live:
                p.copy_(out[off:off + p.numel()].view_as(p))
                off += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
