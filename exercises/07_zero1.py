"""Exercise 07.4: ZeRO stage 1 from scratch (notebooks/07_memory.ipynb, section 5).

Adam keeps two moments per parameter: 8 bytes per fp32 parameter on every rank under DDP. ZeRO-1 shards
them: rank r keeps the moments of its slice of the (flattened) parameters only, updates that slice, and
the ranks then exchange the updated slices so that every rank has all parameters again. Complete step():

  1. every rank needs the *mean* gradient of its slice (each rank computed the gradient of its own data);
  2. Adam on this rank's slice only (written for you);
  3. every rank gets every updated slice, and writes the full vector back into the parameters.

The grader trains a small MLP three steps on 2 and 3 ranks and compares the parameters with torch.optim.Adam
in one process on the whole batch; it also measures the bytes your optimizer holds (they must be about
8 bytes x parameters / world size).
Move data between the ranks only with torch.distributed collectives and keep state in tensors: the
grader refuses files, mmap, shared memory, torch.from_file, ctypes, the key-value store, and sockets,
processes, pipes and sqlite3 databases of your own.
Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("07.4")
"""
import torch
import torch.distributed as dist


class ShardedAdam:
    """Adam whose moments are sharded over the ranks (ZeRO stage 1). ``params``: the model's parameters."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)              # elements per slice; the last one is padded with zeros
        self.m = torch.zeros(self.size)                    # this rank's slice of the moments, not the whole model's
        self.v = torch.zeros(self.size)

    def flat(self, tensors) -> torch.Tensor:
        """The tensors as one vector, padded to world * size elements."""
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    @torch.no_grad()
    def step(self):
        self.t += 1
        grads = self.flat([p.grad for p in self.params])
        # 1. TODO: g = the mean over the ranks of grads[rank * size : (rank + 1) * size]
        #          (dist.reduce_scatter_single does it in one call: each rank receives the sum of its slice)
        g = grads[self.rank * self.size:(self.rank + 1) * self.size]
        # 2. Adam on this rank's slice (given)
        b1, b2 = self.betas
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (self.m / (1 - b1 ** self.t)) / ((self.v / (1 - b2 ** self.t)).sqrt() + self.eps)
        mine = self.flat([p for p in self.params])[self.rank * self.size:(self.rank + 1) * self.size] - self.lr * update
        # 3. TODO: every rank gathers all updated slices into one vector (dist.all_gather_single)
        full = self.flat([p for p in self.params])
        full[self.rank * self.size:(self.rank + 1) * self.size] = mine
        offset = 0
        for p in self.params:                              # write the vector back into the parameters
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
