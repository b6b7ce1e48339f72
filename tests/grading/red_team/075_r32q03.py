"""07.5 q03 (red team): the WHOLE optimizer (torch's own, on the whole parameters, full-size state) on every
rank, its state between steps kept as bare memoryviews of numpy buffers.

How it hides: after each step every state tensor of a parameter's shape is copied into a numpy buffer and
removed from the inner optimizer's state; the wrapper keeps only memoryview(buffer). held_bytes(python=False)
neither counts a memoryview nor walks into it (no __dict__, no slots), and the C-memory count after deleting
the optimizer subtracts what held_bytes(python=True) reaches, where the memoryview counts its nbytes. (q02 kept
bare numpy arrays: counted as Python objects.) Here the buffer is a torch tensor B = [this rank's slice of each
state tensor | the whole state tensors], reached as memoryview(B.numpy()); the decoy slice is
torch.frombuffer(view, count=slice) at offset 0, so its storage has B's data pointer and reports the slice's
bytes only, and B's own storage (same pointer) passes as that known one. Before each inner step the state tensors are rebuilt as torch.frombuffer views
of the same memory (no copy). A decoy (copies of this rank's slice of the state, what a right ZeRO-1 holds)
passes the "holds under half a slice" check. Collectives: reduce-scatter of the gradients, all-gather of the
updated slices, with the right data.
"""
import torch
import torch.distributed as dist
from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params = [p for g in groups for p in g["params"]]
        self.inner = optimizer_class(groups, **defaults)
        self.views = {}                       # id(p) -> {key: memoryview}
        self.kept = []

    def _restore(self):
        for p in self.params:
            entry = self.views.get(id(p))
            if entry is None:
                continue
            view, keys, head = entry
            for j, k in enumerate(keys):
                self.inner.state[p][k] = torch.frombuffer(view, dtype=p.dtype, count=p.numel(),
                                                          offset=(head + j * p.numel()) * 4).view(p.shape)

    def _hide(self):
        w, r = self.world, self.rank
        kept = []
        for p in self.params:
            state = self.inner.state.get(p)
            if not state:
                continue
            keys = [k for k, v in state.items() if torch.is_tensor(v) and v.shape == p.shape and p.dim() > 0]
            if not keys:
                continue
            n, size = p.numel(), -(-p.numel() // w)
            head = len(keys) * size
            if id(p) not in self.views:
                big = torch.zeros(head + len(keys) * n)
                self.views[id(p)] = (memoryview(big.numpy()), keys, head)
            view = self.views[id(p)][0]
            decoy = torch.frombuffer(view, dtype=p.dtype, count=head)
            for j, k in enumerate(keys):
                v = state[k]
                dst = torch.frombuffer(view, dtype=p.dtype, count=n, offset=(head + j * n) * 4)
                if dst.data_ptr() != v.data_ptr():
                    dst.copy_(v.reshape(-1))
                flat = torch.cat([v.reshape(-1), v.new_zeros(size * w - n)])
                decoy[j * size:(j + 1) * size] = flat[r * size:(r + 1) * size]
                del state[k]
            kept.append(decoy)
        self.kept = kept

    @torch.no_grad()
    def step(self):
        w, r = self.world, self.rank
        for p in self.params:
            if p.grad is None:
                continue
            n = p.numel()
            size = -(-n // w)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * w - n)])
            g = torch.empty(size)
            reduce_scatter_single(g, flat)
            full = torch.zeros(size * w)
            full[r * size:(r + 1) * size] = g / w
            p.grad = full[:n].view(p.shape).clone()
        self._restore()
        self.inner.step()                     # the whole optimizer, every element, on every rank
        self._hide()
        for p in self.params:
            if p.grad is None:
                continue
            n = p.numel()
            size = -(-n // w)
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * w - n)])
            out = torch.empty(size * w)
            all_gather_single(out, flat[r * size:(r + 1) * size].clone())
            p.copy_(out[:n].view(p.shape))

    def zero_grad(self):
        for p in self.params:
            p.grad = None
