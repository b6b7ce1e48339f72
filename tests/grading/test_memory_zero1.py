"""Exercise 07.4's grader (mgpu_utils.grading.coding.memory, check_sharded_adam), round 2 of issue 55: what
each collective of a step carries (a whole-gradient all-reduce or all-gather is DDP's traffic, not ZeRO-1's),
state kept outside the graded object, and a gradient summed where the mean is asked for (Adam all but hides
it). Right variants pass; wrong ones get the hint that names them. Each list is graded in one launch at 3
ranks."""
import re

from helpers import red_team, remove_red_team_shm, wrong
from mgpu_utils.grading.runner import grade_many

RS = "        reduce_scatter_single(g, grads)\n        g /= self.world\n"
AG = "        all_gather_single(full, mine)\n"
WRITE = ("        offset = 0\n        for p in self.params:                              # write the vector back into "
         "the parameters\n            p.copy_(full[offset:offset + p.numel()].view_as(p))\n"
         "            offset += p.numel()\n")

REGISTRY = '''import torch
import torch.distributed as dist

_MOMENTS = {}                                             # kept by the module, not by the optimizer


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        _MOMENTS[id(self)] = [(torch.zeros_like(p), torch.zeros_like(p)) for p in self.params]

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        w, r = dist.get_world_size(), dist.get_rank()
        for p, (m, v) in zip(self.params, _MOMENTS[id(self)]):
            flat = p.grad.reshape(-1)
            size = -(-flat.numel() // w)
            padded = torch.cat([flat, flat.new_zeros(size * w - flat.numel())])
            mine = torch.empty(size)
            dist.reduce_scatter_tensor(mine, padded)
            full = torch.empty(size * w)
            dist.all_gather_into_tensor(full, mine)
            g = full[:flat.numel()].view_as(p) / w
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p -= self.lr * (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

#: Every rank gets the whole mean gradient (its slice reduce-scattered, then the mean slices all-gathered) and runs
#: Adam on every parameter, its whole moments kept as numpy arrays, where no tensor is.
GATHERED_GRADIENTS = '''import numpy as np
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

_MOMENTS = {}


class ShardedAdam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)
        _MOMENTS[id(self)] = (np.zeros(self.n, dtype=np.float32), np.zeros(self.n, dtype=np.float32))

    @torch.no_grad()
    def step(self):
        self.t += 1
        grads = torch.cat([p.grad.reshape(-1) for p in self.params])
        grads = torch.cat([grads, grads.new_zeros(self.world * self.size - self.n)])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)
        whole = torch.empty(self.world * self.size)
        all_gather_single(whole, g / self.world)          # every rank's mean slice: the whole mean gradient
        g = whole[:self.n]
        b1, b2 = self.betas
        m, v = (torch.from_numpy(a) for a in _MOMENTS[id(self)])
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)
        offset = 0
        for p in self.params:
            p -= self.lr * update[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

RIGHT = {   # name: (text of the solution, replaced by)
    "an all-gather into a list of slices": (AG, "        dist.all_gather(list(full.chunk(self.world)), mine)\n"),
    "a reduce to each slice's owner instead of a reduce-scatter": (
        RS, "        for r, part in enumerate(grads.chunk(self.world)):\n            part = part.clone()\n"
            "            dist.reduce(part, dst=r)\n            if r == self.rank:\n"
            "                g = part / self.world\n"),
    "divided first, then a reduce-scatter into a list": (
        RS, "        grads /= self.world\n        dist.reduce_scatter(g, list(grads.chunk(self.world)))\n"),
    "an all-to-all and a local sum": (
        RS, "        parts = torch.empty_like(grads)\n        dist.all_to_all_single(parts, grads)\n"
            "        g = parts.view(self.world, self.size).sum(0) / self.world\n"),
    "each slice broadcast by its owner, written back with vector_to_parameters": (
        [AG, WRITE],
        ["        for r in range(self.world):\n            part = full[r * self.size:(r + 1) * self.size]\n"
         "            if r == self.rank:\n                part.copy_(mine)\n            dist.broadcast(part, src=r)\n",
         "        torch.nn.utils.vector_to_parameters(full[:self.n], self.params)\n"]),
}

GROUP = "dist.distributed_c10d._get_default_group()"
IMPORT = "import torch.distributed as dist\n"
#: Every rank's gradients sent to every other rank and summed in rank order: an all-reduce out of send and recv.
P2P = '''

def p2p_sum(t):
    """The sum over the ranks of t, by point-to-point."""
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [t if r == rank else torch.empty_like(t) for r in range(world)]
    works = [dist.isend(t.contiguous(), dst=r) for r in range(world) if r != rank]
    for r in range(world):
        if r != rank:
            dist.recv(parts[r], src=r)
    for w in works:
        w.wait()
    return sum(parts)
'''
ZERO_ADAM = '''import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedAdam:
    """torch's ZeRO-1 shards Adam's moments; the gradients averaged first."""

    def __init__(self, params, lr=1e-3):
        self.params = list(params)
        self.inner = ZeroRedundancyOptimizer(self.params, torch.optim.Adam, lr=lr, foreach=False)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.inner.step()

    def zero_grad(self):
        self.inner.zero_grad(set_to_none=True)
'''

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "every rank all-reduces the whole gradient": (
        RS, "        dist.all_reduce(grads)\n"
            "        g = grads[self.rank * self.size:(self.rank + 1) * self.size] / self.world\n",
        r"the result is right, but step 1 all-reduced 1,812 elements, and the model has 1,810: every rank received "
        r"every gradient, as in DDP"),
    "every rank gathers every rank's whole gradient": (
        RS, "        parts = [torch.empty_like(grads) for _ in range(self.world)]\n"
            "        dist.all_gather(parts, grads)\n"
            "        g = sum(parts)[self.rank * self.size:(self.rank + 1) * self.size] / self.world\n",
        r"the result is right, but step 1 gathered or broadcast 7,248 elements, and the model has 1,810: every rank "
        r"received every rank's whole gradient"),
    "the gradients summed, not averaged": (
        RS, "        reduce_scatter_single(g, grads)\n",
        r"the parameters are those of Adam on the sum of the ranks' gradients, 3 times their "
        r"mean: divide"),
    "every rank all-reduces the whole gradient by the process group object": (
        RS, f"        {GROUP}.allreduce([grads]).wait()\n"
            "        g = grads[self.rank * self.size:(self.rank + 1) * self.size] / self.world\n",
        r"the result is right, but step 1 all-reduced 1,812 elements, and the model has 1,810"),
    "torch's ZeroRedundancyOptimizer inside": (
        None, ZERO_ADAM, r"your optimizer built torch's ZeroRedundancyOptimizer \(world size 3\)"),
    "the gradients summed by send and recv, zeros reduce-scattered": (
        [IMPORT, RS], [IMPORT + P2P, "        reduce_scatter_single(g, torch.zeros_like(grads))\n"
                                     "        g = p2p_sum(grads)[self.rank * self.size:(self.rank + 1) * self.size]"
                                     " / self.world\n"],
        r"the result is right, but in step 1 your reduce-scatters \(1 call\(s\), 1,812 elements\) carried zeros, not "
        r"rank \d's gradients"),
    "the mean gradient's slices all-gathered, whole Adam on every rank, its moments as numpy arrays": (
        None, GATHERED_GRADIENTS, r"the result is right, but in step 1 your all-gathers \(1 call\(s\), 1,812 "
        r"elements\) carried the mean gradient's slices, not the updated parameters"),
    "whole moments kept in a module-level dict": (
        None, REGISTRY, r"14,480 bytes of tensors appeared in this process outside your "
        r"optimizer \(in a module-level dict"),
    "whole Adam on every rank, moments in an anonymous mmap, gradients through the c10d store (a red team's 074_w06)": (
        None, red_team("074_w06"), r"rank \d: your code used (an anonymous mmap|the process group's key-value store "
        r"\(store\.set\)) \(line \d+ of your file\).*only with torch\.distributed"),     # both are its routes
    "whole Adam on every rank, moments in a file in /dev/shm, gradients by all_gather_object (a red team's "
    "074_w12)": (
        None, red_team("074_w12"), r"rank \d: the result is right, but step 1's communication moved [\d,]+ elements "
        r"in and out of this rank \(.*all_gather_object.*a whole gradient reached every rank"),
    "whole Adam on every rank, moments as numpy arrays, gradients by all_gather_object (a red team's 074_w04)": (
        None, red_team("074_w04"), r"rank \d: the result is right, but step 1's communication moved [\d,]+ elements in and out of this rank \(.*all_gather_object.*a whole gradient reached every rank"),
    "whole Adam on every rank, numpy moments, gradients sent round a ring of isend/irecv (a red team's 074_w09)": (
        None, red_team("074_w09"), r"rank \d: the result is right, but step 1's communication moved [\d,]+ elements in and out of this rank \(.*recv [\d,]+.*send.*a whole gradient reached every rank"),
    "whole Adam on every rank, numpy moments, gradients through files polled in /dev/shm (a red team's 074_w10)": (
        None, red_team("074_w10"), r"rank \d: your code used a file in shared memory \(/dev/shm/\S+\).*only with torch\.distributed"),
    "whole Adam on every rank, moments as torch.save bytes in a closure, gradients by all_gather_object (red team, 074_w14)": (
        None, red_team("074_w14"), r"rank \d: the result is right, but step 1's communication moved [\d,]+ elements in and out of this rank \(.*all_gather_object.*a whole gradient reached every rank"),
    "slices exchanged through /tmp files written and read with libc through ctypes (a seventh red team's 074_r7w12)": (
        None, red_team("074_r7w12"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "a shared buffer: a file made with libc, mapped by torch.from_file(shared=True) (a seventh red team's 074_r7w14)": (
        None, red_team("074_r7w14"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "whole moments in a Tensor subclass whose untyped_storage() answers for a slice (an eighth red team's 074_r8w15)": (
        None, red_team("074_r8w15"), r"rank \d: your optimizer holds [\d,]+ bytes of tensors .* full Adam's moments are "
                                     r"[\d,]+: keep only this rank's slice of m and v"),
    "this rank's slice of the moments kept in array('f'), not tensors (an eighth red team's 074_r8w20)": (
        None, red_team("074_r8w20"), r"rank \d \(MLP of 1024 hidden units\): the 3 ranks together hold [\d,]+ bytes of "
                                     r"tensors besides the parameters, less than Adam's moments take .* keep this rank's "
                                     r"slice of m and v in tensors"),
    "a shared buffer: a file made and mapped by torch.from_file(shared=True) alone, no ctypes": (
        None, red_team("074_own_from_file"), r"rank \d: your code used torch\.from_file \(a file mapped into memory\) \(line \d+ of your file\)"),
    "the moments kept whole as numpy arrays in a module-level dict, this rank's slice a view of them": (
        [IMPORT, "        self.m = torch.zeros(self.size)                    # this rank's slice of the moments, not the "
                 "whole model's\n        self.v = torch.zeros(self.size)\n"],
        [IMPORT + "import numpy as np\n\n_WHOLE = {}\n",
         "        lo = self.rank * self.size\n"
         "        _WHOLE[id(self)] = [np.zeros(self.world * self.size, np.float32) for _ in range(2)]\n"
         "        self.m, self.v = (torch.from_numpy(a[lo:lo + self.size]) for a in _WHOLE[id(self)])\n"],
        r"rank \d \(MLP of 1024 hidden units\): [\d,]+ bytes appeared in this process outside the tensors your "
        r"optimizer holds .* [\d,]+ in Python objects \(numpy arrays"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / str(k)
        folder.mkdir()
        if old is None:
            path = folder / "07_zero1.py"
            path.write_text(new)
            out.append(("07.4", path))
        else:
            out.append(("07.4", wrong(folder, "07.4", old, new)))
    return out


def test_right_variants_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_variants_get_their_hints(tmp_path, starts_processes):
    try:
        hints = grade_many(_cases(tmp_path, WRONG), 3)
    finally:
        remove_red_team_shm()
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"07.4": (len(RIGHT), len(WRONG))}
