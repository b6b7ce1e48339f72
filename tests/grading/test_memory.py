"""Exercises 07.5 and 07.6's graders (mgpu_utils.grading.coding.memory), round 2 of issue 55: parameter groups,
frozen and unused parameters as torch.optim treats them, what each collective carries, state kept outside the
graded object (tensors, storages, Python objects such as bytes, BytesIO or numpy arrays, files, a buffer made at
import), and what a right solution may keep there (a temporary whole gradient, a registry of its own slices).
Right variants pass; wrong ones get the hint that names them. Each list is graded in one launch at 3 ranks."""
import re

import pytest

from helpers import red_team, remove_red_team_shm, solution, wrong
from mgpu_utils.grading.catalog import EXERCISES
from mgpu_utils.grading.runner import grade_many

SKIP_NONE = ("            if p.grad is None:                             # frozen, or unused in this step: torch "
             "skips it\n                shard.grad = None\n                continue\n")
RS = "            reduce_scatter_single(g, flat)                 # this chunk's gradient, summed over the ranks\n"
AG = "            all_gather_single(full, shard.detach())        # every rank's updated chunk, on every rank\n"

REGISTRY = '''import torch
import torch.distributed as dist

_KEPT = {}


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        self.params = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        _KEPT[id(self)] = optimizer_class(params, **defaults)      # out of sight, not out of memory

    def step(self):
        w = dist.get_world_size()
        for p in self.params:
            if p.grad is not None:                                # every rank's gradient: all-gathered, summed
                parts = [torch.empty_like(p.grad) for _ in range(w)]
                dist.all_gather(parts, p.grad)
                p.grad = sum(parts) / w
        _KEPT[id(self)].step()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

FLOOR = '''import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        groups = list(params)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.shards, inner = [], []
        for group in groups:
            mine = []
            for p in group["params"]:
                size = p.numel() // self.world                  # floor: the remainder is in no slice
                shard = p.detach().reshape(-1)[self.rank * size:(self.rank + 1) * size].clone()
                shard.requires_grad_(p.requires_grad)
                self.shards.append((p, shard, size))
                mine.append(shard)
            inner.append({**group, "params": mine})
        self.inner = optimizer_class(inner, **defaults)

    @torch.no_grad()
    def step(self):
        for p, shard, size in self.shards:
            if p.grad is None:
                shard.grad = None
                continue
            g = torch.empty(size)
            dist.reduce_scatter_tensor(g, p.grad.reshape(-1)[:size * self.world].contiguous())
            shard.grad = g / self.world
        self.inner.step()
        for p, shard, size in self.shards:
            if shard.grad is None:
                continue
            full = torch.empty(size * self.world)
            dist.all_gather_into_tensor(full, shard.detach())
            p.view(-1)[:size * self.world] = full

    def zero_grad(self):
        for p, shard, _ in self.shards:
            p.grad = None
            shard.grad = None
'''

#: The worked solution of 07.5 before issue 55's round 2: one flat shard of every parameter (no parameter
#: groups; a missing .grad treated as zeros).
OLD_FLAT = '''"""Solution of exercise 07.5: ZeRO-1 for any element-wise optimizer, from scratch (for instructors)."""
import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    """``optimizer_class(**defaults)`` on this rank's slice of the flattened parameters only (ZeRO stage 1)."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = list(params)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.n = sum(p.numel() for p in self.params)
        self.size = -(-self.n // self.world)              # elements per slice; the last one padded with zeros
        mine = self.flat([p.detach() for p in self.params])[self.rank * self.size:(self.rank + 1) * self.size]
        self.shard = mine.clone().requires_grad_()         # the inner optimizer's one parameter: this slice
        self.inner = optimizer_class([self.shard], **defaults)

    def flat(self, tensors) -> torch.Tensor:
        out = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([out, out.new_zeros(self.world * self.size - self.n)])

    @torch.no_grad()
    def step(self):
        grads = self.flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        g = torch.empty(self.size)
        reduce_scatter_single(g, grads)                    # this slice's gradient, summed over the ranks
        self.shard.grad = g / self.world                   # ... and averaged, as DDP does
        self.inner.step()
        full = torch.empty(self.world * self.size)
        all_gather_single(full, self.shard.detach())       # every rank's updated slice, on every rank
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        self.shard.grad = None
'''

GROUP = "dist.distributed_c10d._get_default_group()"
IMPORT = "import torch.distributed as dist\n"
#: Every rank's tensor sent to every other rank, summed in rank order (sum) or concatenated (cat): an all-reduce or
#: all-gather out of send and recv, which no count of collectives sees.
P2P = '''

def p2p_parts(t):
    """Every rank's t, by point-to-point, in rank order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [t if r == rank else torch.empty_like(t) for r in range(world)]
    works = [dist.isend(t.contiguous(), dst=r) for r in range(world) if r != rank]
    for r in range(world):
        if r != rank:
            dist.recv(parts[r], src=r)
    for w in works:
        w.wait()
    return parts
'''
ZERO_OPTIMIZER = '''import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedOptimizer:
    """torch's ZeRO-1 does the sharding; the gradients averaged first."""

    def __init__(self, params, optimizer_class, **defaults):
        self.inner = ZeroRedundancyOptimizer(params, optimizer_class, **defaults)
        self.params = [p for group in self.inner.param_groups for p in group["params"]]

    def step(self):
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        self.inner.step()

    def zero_grad(self):
        self.inner.zero_grad(set_to_none=True)
'''
#: A whole optimizer, rebuilt in every step from state that ``save(self, state_dict)`` keeps and ``load(self)``
#: gives back (each trick below defines them): right results, nothing in a tensor between steps.
WHOLE = '''import io
import os
import pickle

import numpy as np
import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        groups = list(params)
        self.groups = groups if groups and isinstance(groups[0], dict) else [{"params": groups}]
        self.params = [p for g in self.groups for p in g["params"]]
        self.make = lambda: optimizer_class(self.groups, **defaults)
        save(self, self.make().state_dict())

    def step(self):
        w = dist.get_world_size()
        for p in self.params:
            if p.grad is not None:                                # every rank's gradient: all-gathered, summed
                parts = [torch.empty_like(p.grad) for _ in range(w)]
                dist.all_gather(parts, p.grad)
                p.grad = sum(parts) / w
        opt = self.make()
        opt.load_state_dict(load(self))
        opt.step()
        save(self, opt.state_dict())

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def tensors(state, fn):
    return {"param_groups": state["param_groups"],
            "state": {k: {n: fn(v) for n, v in s.items()} for k, s in state["state"].items()}}
'''
#: Where each trick keeps the whole state between steps: (save, load) in the module.
KEPT = {
    "torch.save bytes in a module-level dict": (
        "_KEPT = {}\n\n\ndef save(self, state):\n    buf = io.BytesIO()\n    torch.save(state, buf)\n"
        "    _KEPT[id(self)] = buf.getvalue()\n",
        "def load(self):\n    return torch.load(io.BytesIO(_KEPT[id(self)]), weights_only=False)\n"),
    "a module-level io.BytesIO": (
        "_BUF = io.BytesIO()\n\n\ndef save(self, state):\n    _BUF.seek(0)\n    _BUF.truncate()\n"
        "    torch.save(state, _BUF)\n",
        "def load(self):\n    _BUF.seek(0)\n    return torch.load(_BUF, weights_only=False)\n"),
    "numpy arrays": (
        "_KEPT = {}\n\n\ndef save(self, state):\n    _KEPT[id(self)] = tensors(state, lambda v: v.numpy().copy())\n",
        "def load(self):\n    return tensors(_KEPT[id(self)], lambda a: torch.from_numpy(a.copy()))\n"),
    "torch.save to a file, torch.load back": (
        "def path(self):\n    return os.path.join(os.path.dirname(__file__), f'state_{dist.get_rank()}_{id(self)}.pt')"
        "\n\n\ndef save(self, state):\n    torch.save(state, path(self))\n",
        "def load(self):\n    return torch.load(path(self), weights_only=False)\n"),
    "a pickle written by Python's open": (
        "def path(self):\n"
        "    return os.path.join(os.path.dirname(__file__), f'zero1_state_{os.getpid()}_{id(self)}.pkl')"
        "\n\n\ndef save(self, state):\n    with open(path(self), 'wb') as f:\n"
        "        pickle.dump(tensors(state, lambda v: v.numpy()), f)\n",
        "def load(self):\n    with open(path(self), 'rb') as f:\n        state = pickle.load(f)\n"
        "    return tensors(state, torch.from_numpy)\n"),
    "torch.UntypedStorage objects, no tensor": (
        "_KEPT = {}\n\n\ndef save(self, state):\n"
        "    _KEPT[id(self)] = tensors(state, lambda v: (v.untyped_storage(), v.dtype, v.shape))\n",
        "def load(self):\n    return tensors(_KEPT[id(self)], lambda k: torch.empty(0, dtype=k[1]).set_(k[0], 0, k[2])"
        ".clone())\n"),
    "a buffer made at import, written in every step": (
        "_BUF = torch.empty(10**6)\n_WHERE = {}\n\n\ndef save(self, state):\n    at = [0]\n\n    def put(v):\n"
        "        _BUF[at[0]:at[0] + v.numel()] = v.reshape(-1)\n        at[0] += v.numel()\n"
        "        return at[0] - v.numel(), v.shape, v.dtype\n    _WHERE[id(self)] = tensors(state, put)\n",
        "def load(self):\n    return tensors(_WHERE[id(self)], lambda k: _BUF[k[0]:k[0] + k[1].numel()].view(k[1])"
        ".to(k[2]).clone())\n"),
}
#: A whole optimizer, its gradients reduce-scattered and all-gathered whole, its state hidden as the parameters of
#: an optimizer that never steps.
IDLE = '''import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        self.world = dist.get_world_size()
        self.inner = optimizer_class(list(params), **defaults)
        self.params = [p for g in self.inner.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is None:
                continue
            size = -(-p.numel() // self.world)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            g, whole = torch.empty(size), torch.empty(size * self.world)
            reduce_scatter_single(g, flat)
            all_gather_single(whole, g)
            p.grad = whole[:p.numel()].view_as(p) / self.world
        self.inner.step()
        kept = [t for s in self.inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
        self.ledger = torch.optim.SGD(kept, lr=0.0)              # never steps

    def zero_grad(self):
        self.inner.zero_grad(set_to_none=True)
'''
#: A whole optimizer again (the mean gradient rebuilt on every rank by all-gathering the reduced chunks), made anew
#: each step; between steps its state tensors are parked, as raw bytes, in an anonymous mmap that no tensor or
#: Python object holds: only what the all-gathers carry tells it.
PARKED = '''import mmap

import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single


class ShardedOptimizer:
    def __init__(self, params, optimizer_class, **defaults):
        params = list(params)
        self.groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        self.params = [p for g in self.groups for p in g["params"]]
        self.make = lambda: optimizer_class(self.groups, **defaults)
        self.world, self.layout, self.scalars, self.parked = dist.get_world_size(), [], {}, None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            if p.grad is None:
                continue
            size = -(-p.numel() // self.world)
            flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros(size * self.world - p.numel())])
            mine, whole = torch.empty(size), torch.empty(size * self.world)
            reduce_scatter_single(mine, flat)
            all_gather_single(whole, mine / self.world)           # the mean chunks, to every rank
            p.grad = whole[:p.numel()].view_as(p).clone()
        opt, at = self.make(), 0
        for i, key, shape in self.layout:                          # the state back from the mmap
            n = shape.numel()
            opt.state[self.params[i]][key] = torch.frombuffer(self.parked, dtype=torch.float32, count=n,
                                                              offset=4 * at).view(shape).clone()
            at += n
        for (i, key), v in self.scalars.items():
            opt.state[self.params[i]][key] = v
        opt.step()
        self.layout, self.scalars, kept = [], {}, []
        for i, p in enumerate(self.params):
            for key, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v) and v.dim():
                    self.layout.append((i, key, v.shape))
                    kept.append(v.reshape(-1))
                else:
                    self.scalars[(i, key)] = v
        flat = torch.cat(kept) if kept else torch.zeros(1)
        self.parked = mmap.mmap(-1, 4 * flat.numel())
        torch.frombuffer(self.parked, dtype=torch.float32).copy_(flat)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''
TRAFFIC = r"with SGD with momentum, step 1's collectives moved [\d,]+ elements in and out of this rank "
OUT = r"with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds \(0\): "

RIGHT_075 = {   # name: (text of the solution, replaced by)
    "an all-gather into a list of chunks": (
        AG, "            dist.all_gather(list(full.chunk(self.world)), shard.detach())\n"),
    "a reduce to each chunk's owner instead of a reduce-scatter": (
        RS, "            for r, chunk in enumerate(flat.chunk(self.world)):\n"
            "                chunk = chunk.clone()\n                dist.reduce(chunk, dst=r)\n"
            "                if r == self.rank:\n                    g = chunk\n"),
    "each chunk's gradients gathered to its owner, each updated chunk broadcast back": (
        [RS, AG], ["            for r, chunk in enumerate(flat.chunk(self.world)):\n"
                   "                got = [torch.empty(size) for _ in range(self.world)] if r == self.rank else None\n"
                   "                dist.gather(chunk.contiguous(), got, dst=r)\n"
                   "                if r == self.rank:\n                    g = torch.stack(got).sum(0)\n",
                   "            for r in range(self.world):\n                part = full[r * size:(r + 1) * size]\n"
                   "                if r == self.rank:\n                    part.copy_(shard.detach())\n"
                   "                dist.broadcast(part, src=r)\n"]),
    "an all-to-all and a local sum instead of a reduce-scatter": (
        RS, "            parts = torch.empty_like(flat)\n            dist.all_to_all_single(parts, flat)\n"
            "            g = parts.view(self.world, size).sum(0)\n"),
    "frozen parameters left out of the inner optimizer": (
        "                mine.append(shard)\n", "                if p.requires_grad:\n                    "
                                             "mine.append(shard)\n"),
    "a reduce-scatter through the process group object (_reduce_scatter_base)": (
        RS, f"            {GROUP}._reduce_scatter_base(g, flat).wait()\n"),
    "a whole flat gradient kept while the step runs, dropped at its end": (
        ["    def step(self):\n", "            p.copy_(full[:p.numel()].view_as(p))\n"],
        ["    def step(self):\n        self.flat = torch.cat([p.grad.reshape(-1) for p, _, _ in self.shards "
         "if p.grad is not None])\n",
         "            p.copy_(full[:p.numel()].view_as(p))\n        self.flat = None\n"]),
    "the inner optimizer in a module-level registry, every one ever made": (
        ["class ShardedOptimizer:", "        self.inner = optimizer_class(inner_groups, **defaults)\n",
         "        self.inner.step()\n"],
        ["_INNER = {}\n\n\nclass ShardedOptimizer:",
         "        _INNER[id(self)] = optimizer_class(inner_groups, **defaults)   # its state: this rank's chunks\n",
         "        _INNER[id(self)].step()\n"]),
    "each parameter's rows padded to a multiple of the world, as FSDP2 lays them out (an eighth red team's 075_r8r03)": (
        None, red_team("075_r8r03")),
}

WRONG_075 = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    # first: a later entry's patched step() would stay for the rest of this launch
    "a child process forked to hold a copy of the whole optimizer": (
        "        self.inner = optimizer_class(inner_groups, **defaults)\n",
        "        self.inner = optimizer_class(inner_groups, **defaults)\n        import os\n"
        "        self.keeper = os.fork()                        # the child holds a copy of everything\n"
        "        if self.keeper == 0:\n            os._exit(0)\n",
        r"rank \d: your code used a process of your own \(os\.fork: a child holds a copy no check sees\) \(line \d+ "
        r"of your file\).*only with torch\.distributed collectives"),
    "this rank's slice of the state moved into a module-level dict after each step, put back before the next": (
        ["class ShardedOptimizer:\n",
         "        self.inner.step()\n        for p, shard, size in self.shards:\n"],
        ["_KEPT = {}\n\n\nclass ShardedOptimizer:\n",
         "        for shard, state in _KEPT.pop(id(self), {}).items():\n            self.inner.state[shard] = state\n"
         "        self.inner.step()\n        _KEPT[id(self)] = dict(self.inner.state)\n        self.inner.state.clear()\n"
         "        for p, shard, size in self.shards:\n"],
        r"rank \d: with SGD with momentum, the result is right, but your optimizer holds [\d,]+ bytes of state, where "
        r"this rank's slice of the state is [\d,]+ bytes"),
    "the optimizer's state written into a pipe, kept in the kernel's buffer": (
        "        self.inner.step()\n",
        "        self.inner.step()\n        import os\n        if not hasattr(self, 'spill'):\n"
        "            self.spill = os.pipe()\n        os.write(self.spill[1], bytes(64))\n",
        r"rank \d: your code used a pipe left open \(file descriptor \d+: bytes kept in the kernel"),
    "a copy of the whole model kept in an ssl.MemoryBIO (C memory) in a module-level list": (
        ["import torch.distributed as dist\n", "        self.inner.step()\n"],
        ["import torch.distributed as dist\n\n_KEPT = []\n",
         "        self.inner.step()\n        import ssl\n        bio = ssl.MemoryBIO()\n"
         "        bio.write(torch.cat([p.detach().reshape(-1) for p, _, _ in self.shards]).numpy().tobytes())\n"
         "        _KEPT[:] = [bio]                                  # the whole model, where no tensor shows it\n"],
        r"rank \d: with SGD with momentum, deleting your optimizer and letting go of what your module keeps \(its "
        r"globals, its classes' attributes\) gave back [\d,]+ bytes of C memory"),
    "every whole gradient leaked into a scripted module's List[Tensor] hung on builtins (a fifteenth red team's 075_r15w03)": (
        None, red_team("075_r15w03"), r"rank \d: your code used TorchScript \(torch\.jit"),
    "the whole optimizer's state pickled in a helper thread's locals, slices spread by the group's own broadcast (a sixteenth red team's 075_r16w01)": (
        None, red_team("075_r16w01"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "the whole optimizer's state pickled into a dict of str to bytes on the optimizer (untracked by the garbage collector; 075_r16w03)": (
        None, red_team("075_r16w03"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "whole gradients and parameters in zlib decompressors kept by a helper thread (a seventeenth red team's 075_r17w01)": (
        None, red_team("075_r17w01"), r"rank \d: your code used a thread of your own still running at the end"),
    "no sharding: reduce to rank 0 and broadcast, the whole state in room after the parameters, reached by weakrefs (an eighteenth red team's 075_r18w01)": (
        None, red_team("075_r18w01"), r"rank \d: with [\w ]+, your optimizer holds [\d,]+ bytes of state"),
    "the whole state in an array.array made at import on a class inside the optimizer's, rank 0 updating everything (a nineteenth red team's 075_r19w01)": (
        None, red_team("075_r19w01"), r"rank \d: with [\w ]+, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "no sharding: every rank's summed gradient slice gathered to every rank (world gathers), the whole state as bytes on torch.optim.lr_scheduler (a twentieth red team's 075_r20z06)": (
        None, red_team("075_r20z06"), r"rank \d: with [\w ]+, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "no sharding: the summed gradient slices gathered to every rank, the state as bytes two levels down in a library's dict (075_r20g01)": (
        None, red_team("075_r20g01"), r"rank \d: with [\w ]+, the result is right, but in step \d your gathers \(\d+ call\(s\), [\d,]+ elements\) carried the reduced gradient slices"),
    "no sharding: each owner scatters its summed gradient slice to every rank (075_r20g02)": (
        None, red_team("075_r20g02"), r"rank \d: with [\w ]+, step \d's collectives moved [\d,]+ elements in and out of this rank \(reduce_scatter_single [\d,]+, scatter [\d,]+\)"),
    "the biases' whole optimizer everywhere: their gradient slices all-gathered scaled by 2**-20, a fitted tail for the sums (a twenty-first red team's 075_r21a02)": (
        None, red_team("075_r21a02"), r"rank \d: with [\w ]+, the result is right, but in step \d your all-gathers \(\d+ call\(s\), [\d,]+ elements\) did not carry the ranks' updated parameter slices"),
    "no sharding: each owner's summed gradient slice sent by the process group's own broadcast(t, root), the whole optimizer in a callable object with __slots__ (a twenty-second red team's 075_r22b01)": (
        None, red_team("075_r22b01"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "whole local gradients and updated parameters kept as the saved output of a relu whose 0-d sum hangs on the torch module (a twenty-third red team's 075_r23c01)": (
        None, red_team("075_r23c01"), r"rank \d: with [\w ]+, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "no reduce-scatter: every rank's whole gradient gathered through a hidden process group called by torch.ops.c10d (a twenty-sixth red team's 075_r26f01)": (
        None, red_team("075_r26f01"), r"rank \d: your code used a process group handed to torch\.ops\.c10d's operators"),
    "the reduce-scatter's input a tensor subclass whose __torch_dispatch__ all-reduces the whole gradient and reduce-scatters zeros (a thirty-first red team's 075_r31p03)": (
        None, red_team("075_r31p03"), r"rank \d: your code used a tensor of a subclass of torch\.Tensor"),
    "the whole optimizer's state in a buffer behind torch.frombuffer's count, reached through a memoryview (a thirty-second red team's 075_r32q03)": (
        None, red_team("075_r32q03"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "the whole optimizer's state in the gaps of parameters made views with every stride x4 of buffers 4 times their size (a thirty-second red team's 075_r32q01)": (
        None, red_team("075_r32q01"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "no sharding: the reduced gradient slices all-gathered as int32 bit patterns, the whole state packed in a module dict (a twenty-fifth red team's 075_r25e10)": (
        None, red_team("075_r25e10"), r"rank \d: with [\w ]+, the result is right, but in step \d your all-gathers \(\d+ call\(s\), [\d,]+ elements\) carried the reduced gradient slices"),
    "no sharding: gathers, the whole state as bytes on a class attribute of torch.optim.Optimizer (075_r20g03)": (
        None, red_team("075_r20g03"), r"rank \d: with [\w ]+, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "full-size state in an arena made at import on a types.ModuleType global (a fourteenth red team's 075_r14w01)": (
        None, red_team("075_r14w01"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "full-size state in an arena made at import on a class whose __module__ says builtins (075_r14w04)": (
        None, red_team("075_r14w04"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "full-size state in a cache set at import as an attribute of torch.distributed (075_r14w06)": (
        None, red_team("075_r14w06"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "full-size state in an arena in the globals of an eval'd lambda (075_r14w10)": (
        None, red_team("075_r14w10"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside the tensors your optimizer holds"),
    "full-size state kept as saved results in the autograd graphs of 1-element tensors (a thirteenth red team's "
    "075_r13w01)": (
        None, red_team("075_r13w01"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "whole gradients all-reduced through the backend's allreduce captured at import in a closure (075_r13w02)": (
        None, red_team("075_r13w02"), r"rank \d: your code used a process group's backend object directly "
                                      r"\(Backend\.allreduce"),
    "full-size state in a 32 MB arena made at import, hung on a module-level tensor (075_r13w03)": (
        None, red_team("075_r13w03"), r"rank \d: with SGD with momentum, [\d,]+ bytes appeared in this process outside "
                                      r"the tensors your optimizer holds"),
    "whole gradients all-reduced through the backend's allreduce bound on self in __init__ (075_r13w04)": (
        None, red_team("075_r13w04"), r"rank \d: your code used a process group's backend object directly "
                                      r"\(Backend\.allreduce"),
    "a missing gradient filled with zeros": (
        SKIP_NONE, "            if p.grad is None:\n                p.grad = torch.zeros_like(p)\n",
        r"with SGD with momentum, a parameter not used in step 3 \(its .grad None\) moved by"),
    "a parameter whose gradient is all zeros skipped as if unused": (
        SKIP_NONE, "            if p.grad is None or not p.grad.any():         # no gradient, or nothing in it\n"
                   "                shard.grad = None\n                continue\n",
        r"with SGD with momentum, a parameter used in step 4 whose gradient was exactly zero \(its input zeros\) "
        r"did not move, where one process moved it by [\d.e-]+: a zero gradient is still a gradient"),
    "zeros for a frozen parameter only": (
        SKIP_NONE, "            if p.grad is None and p.requires_grad:\n                shard.grad = None\n"
                   "                continue\n            if p.grad is None:\n"
                   "                p.grad = torch.zeros_like(p)\n",
        r"with AdamW, a frozen parameter \(requires_grad=False, 2.0 everywhere, .grad None\) is 1.9\d* on average"),
    "the groups' own options dropped": (
        'inner_groups.append({**group, "params": mine})', 'inner_groups.append({"params": mine})',
        r"with SGD with momentum, after one step the first parameter group equals one process's, the second"),
    "only the groups' options from a list of known names kept": (
        'inner_groups.append({**group, "params": mine})',
        'inner_groups.append({"params": mine, **{k: v for k, v in group.items()\n'
        '                                                     if k in ("lr", "weight_decay", "momentum", "betas")}})',
        r"with SGD with momentum, after one step the first parameter group equals one process's, the second"),
    "the gradients reduce-scattered in float64, for exact sums": (
        ["            g = torch.empty(size)\n" + RS, "            shard.grad = g / self.world "],
        ["            g = torch.empty(size, dtype=torch.float64)\n"
         "            reduce_scatter_single(g, flat.double())        # summed without rounding\n",
         "            shard.grad = (g / self.world).float() "],
        TRAFFIC + r"\(all_gather_single [\d,]+, reduce_scatter_single [\d,]+\) in float32's worth \(one in float64 "
                  r"counts twice\)"),
    "every rank's whole gradient sent to every rank as a pickled object": (
        RS, "            got = [None] * self.world\n            dist.all_gather_object(got, flat.clone())\n"
            "            g = sum(got)[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(all_gather_object [\d,]+, all_gather_single [\d,]+\)"),
    "Adam's rule by hand for any class but SGD": (
        "        self.inner.step()\n",
        "        if issubclass(type(self.inner), torch.optim.SGD):\n            self.inner.step()\n"
        "        else:                                       # Adam's moments, bias-corrected, written out\n"
        "            for group in self.inner.param_groups:\n                b1, b2 = group.get('betas', (0.9, 0.999))\n"
        "                for q in group['params']:\n                    if q.grad is None:\n"
        "                        continue\n                    st = self.inner.state[q]\n"
        "                    st['t'] = st.get('t', 0) + 1\n"
        "                    if type(self.inner).__name__ == 'AdamW':\n"
        "                        q.mul_(1 - group['lr'] * group['weight_decay'])\n"
        "                    m = st.setdefault('m', torch.zeros_like(q))\n"
        "                    v = st.setdefault('v', torch.zeros_like(q))\n"
        "                    m.mul_(b1).add_(q.grad, alpha=1 - b1)\n"
        "                    v.mul_(b2).addcmul_(q.grad, q.grad, value=1 - b2)\n"
        "                    if group.get('amsgrad'):\n"
        "                        v = torch.maximum(st.setdefault('vmax', torch.zeros_like(q)), v)\n"
        "                        st['vmax'] = v\n"
        "                    mh, vh = m / (1 - b1 ** st['t']), v / (1 - b2 ** st['t'])\n"
        "                    q.sub_(group['lr'] * mh / (vh.sqrt() + group['eps']))\n",
        r"with RMSprop, after 3 steps the parameters differ from one process's by [\d.e-]+ \(world size 3\), where "
        r"SGD, Adam and AdamW \(tried first\) agreed"),
    "the inner optimizer made at the first step, of the parameters with a gradient then": (
        ["        self.inner = optimizer_class(inner_groups, **defaults)\n",
         "            shard.grad = g / self.world                    # ... and averaged, as DDP does\n",
         "        self.inner.step()\n"],
        ["        self.inner, self.ready = None, set()\n        self.make = lambda: optimizer_class(\n"
         "            [{**g, 'params': [q for q in g['params'] if id(q) in self.ready]} for g in inner_groups\n"
         "             if any(id(q) in self.ready for q in g['params'])], **defaults)\n",
         "            shard.grad = g / self.world\n            self.ready.add(id(shard))\n",
         "        if self.inner is None:                      # the shards that have a gradient by now\n"
         "            self.inner = self.make()\n        self.inner.step()\n"],
        r"with SGD with momentum, a parameter unused in step 1 \(its .grad None then\) and used from step 2 on never "
        r"moved in 4 steps"),
    "the biases' gradients all-reduced whole, their state on every rank": (
        ["                self.shards.append((p, shard, size))\n", SKIP_NONE,
         "            if shard.grad is None:\n                continue\n"],
        ["                if p.dim() == 1:                           # a bias: small, its state kept whole\n"
         "                    size, shard = None, p\n                self.shards.append((p, shard, size))\n",
         "            if size is None:                               # a bias: averaged whole, updated in place\n"
         "                if p.grad is not None:\n                    dist.all_reduce(p.grad)\n"
         "                    p.grad /= self.world\n                continue\n" + SKIP_NONE,
         "            if size is None or shard.grad is None:\n                continue\n"],
        r"with SGD with momentum, step 1 all-reduced \d\d of the 1,\d{3} elements the model trains"),
    "every rank all-reduces the whole gradient": (
        RS, "            dist.all_reduce(flat)\n            g = flat[self.rank * size:(self.rank + 1) * size]\n",
        r"with SGD with momentum, step 1 all-reduced 1,\d{3} elements, and the model trains 1,\d{3}"),
    "one flat shard of every parameter (the first worked solution)": (
        None, None, r"ShardedOptimizer\(param_groups, SGD with momentum\) raised AttributeError"),
    "slices of n // world elements (floor)": (
        None, FLOOR, r"with SGD with momentum, 1 element\(s\) that one process updates never moved .* Round up"),
    "the whole optimizer kept in a module-level registry": (
        None, REGISTRY, OUT + r"307,240 in tensors or storages it does not hold"),
    # collectives through the process group object, or torch's functional collectives, count as all-reduces
    "the whole gradient all-reduced by the process group object": (
        RS, f"            {GROUP}.allreduce([flat]).wait()\n"
            "            g = flat[self.rank * size:(self.rank + 1) * size]\n",
        r"with SGD with momentum, step 1 all-reduced 1,\d{3} elements, and the model trains 1,\d{3}"),
    "the whole gradient all-reduced by torch's functional collectives": (
        RS, "            import torch.distributed._functional_collectives as funcol\n"
            "            g = funcol.all_reduce(flat, 'sum', dist.group.WORLD)\n"
            "            g = g[self.rank * size:(self.rank + 1) * size]\n",
        r"with SGD with momentum, step 1 all-reduced 1,\d{3} elements, and the model trains 1,\d{3}"),
    "the whole gradient all-reduced by a group of dist.new_group": (
        ["        self.world, self.rank = dist.get_world_size(), dist.get_rank()\n", RS],
        ["        self.world, self.rank = dist.get_world_size(), dist.get_rank()\n"
         "        self.group = dist.new_group()\n",
         "            self.group.allreduce([flat]).wait()\n"
         "            g = flat[self.rank * size:(self.rank + 1) * size]\n"],
        r"with SGD with momentum, step 1 all-reduced 1,\d{3} elements, and the model trains 1,\d{3}"),
    # whole gradients moved by other collectives than an all-reduce: what a step moves in and out of a rank
    "every rank all-gathers every rank's whole gradient": (
        RS, "            parts = [torch.empty_like(flat) for _ in range(self.world)]\n"
            "            dist.all_gather(parts, flat)\n"
            "            g = sum(parts)[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(all_gather [\d,]+, .*\), and the model trains 1,\d{3}: a whole gradient reached every rank"),
    "the whole gradient reduced to rank 0, then broadcast": (
        RS, "            dist.reduce(flat, dst=0)\n            dist.broadcast(flat, src=0)\n"
            "            g = flat[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(.*broadcast [\d,]+, reduce [\d,]+\)"),
    "every rank's whole gradient sent to every other rank by isend and recv": (
        RS, "            g = flat.clone()\n"
            "            works = [dist.isend(flat, dst=r) for r in range(self.world) if r != self.rank]\n"
            "            for r in range(self.world):\n                if r != self.rank:\n"
            "                    part = torch.empty_like(flat)\n                    dist.recv(part, src=r)\n"
            "                    g += part\n            for w in works:\n                w.wait()\n"
            "            g = g[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(.*recv [\d,]+, send [\d,]+\)"),
    "every rank's whole gradient broadcast in turn": (
        RS, "            g = flat.clone()\n            for r in range(self.world):\n"
            "                part = flat.clone()\n                dist.broadcast(part, src=r)\n"
            "                if r != self.rank:\n                    g += part\n"
            "            g = g[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(.*broadcast [\d,]+\)"),
    "the summed chunks all-gathered again after the reduce-scatter": (
        RS, RS + "            whole = torch.empty(size * self.world)\n            all_gather_single(whole, g)\n"
                 "            g = whole[self.rank * size:(self.rank + 1) * size]\n",
        TRAFFIC + r"\(all_gather\w* [\d,]+, reduce_scatter\w* [\d,]+\)"),
    "each whole gradient kept by the optimizer after its slice is reduced": (
        "            shard.grad = g / self.world                    # ... and averaged, as DDP does\n",
        "            shard.grad = g / self.world\n            self.logged = getattr(self, 'logged', {})\n"
        "            self.logged[id(p)] = p.grad                    # its norm, printed later\n",
        r"with SGD with momentum, after the last step and the model's zero_grad\(set_to_none=True\) your optimizer "
        r"still holds [\d,]+ bytes of the model's whole gradients"),
    "the whole optimizer's state listed as the parameters of an idle optimizer": (
        None, IDLE, r"with SGD with momentum, your optimizer holds [\d,]+ bytes of state .* the optimizer in one "
                    r"process holds 7,240"),
    "a whole optimizer on the all-gathered mean gradient, its state parked in an anonymous mmap": (
        None, PARKED, r"with SGD with momentum, the result is right, but in step 1 your all-gathers \(4 call\(s\), "
                      r"1,\d{3} elements\) carried the reduced gradient slices, not the updated parameters"),
    "a whole optimizer on the mean gradient broadcast slice by slice by its owners, its state in an mmap": (
        None, PARKED.replace(
            "            all_gather_single(whole, mine / self.world)           # the mean chunks, to every rank\n",
            "            whole[dist.get_rank() * size:(dist.get_rank() + 1) * size] = mine / self.world\n"
            "            for r in range(self.world):                            # each owner's mean chunk, to all\n"
            "                dist.broadcast(whole[r * size:(r + 1) * size], src=r)\n"),
        r"with SGD with momentum, the result is right, but in step 1 your broadcasts \(4 call\(s\), 1,\d{3} "
        r"elements\) carried the reduced gradient slices, not the updated parameters"),
    "a whole optimizer on the mean gradient spread by an all-to-all (each chunk sent to every rank), its state "
    "in an mmap": (
        None, PARKED.replace(
            "            all_gather_single(whole, mine / self.world)           # the mean chunks, to every rank\n",
            "            dist.all_to_all_single(whole, (mine / self.world).repeat(self.world))   # to every rank\n"),
        r"with SGD with momentum, the result is right, but in step 1 your all-to-alls \(4 call\(s\), 5,\d{3} "
        r"elements\) carried the reduced gradient slices, not the updated parameters"),
    # the collectives counted carry something else while the gradients travel another way
    "torch's ZeroRedundancyOptimizer inside": (
        None, ZERO_OPTIMIZER, r"your optimizer built torch's ZeroRedundancyOptimizer \(world size 3\)"),
    "the gradients summed by send and recv, zeros reduce-scattered": (
        [IMPORT, RS], [IMPORT + P2P, "            reduce_scatter_single(g, torch.zeros_like(flat))\n"
                                     "            g = sum(p2p_parts(flat))[self.rank * size:(self.rank + 1) * size]\n"],
        r"with SGD with momentum, the result is right, but in step 1 your reduce-scatters \(4 call\(s\), 1,\d{3} "
        r"elements\) carried zeros, not rank \d's gradients"),
    "the gradients summed by send and recv, the parameters reduce-scattered": (
        [IMPORT, RS], [IMPORT + P2P, "            reduce_scatter_single(g, torch.cat([p.detach().reshape(-1), "
                                     "p.new_zeros(size * self.world - p.numel())]))\n"
                                     "            g = sum(p2p_parts(flat))[self.rank * size:(self.rank + 1) * size]\n"],
        r"with SGD with momentum, the result is right, but in step 1 your reduce-scatters \(4 call\(s\)\) carried "
        r"the parameters, not rank \d's gradients"),
    **{f"the whole state as {name}": (None, WHOLE + "\n\n" + save + "\n\n" + load, want) for name, (save, load), want in
       zip(KEPT, KEPT.values(), [
           OUT + r"[\d,]+ in tensors or storages .*, 3\d\d,\d{3} in Python objects",
           OUT + r"[\d,]+ in tensors or storages .*, 3\d\d,\d{3} in Python objects",
           OUT + r"[\d,]+ in tensors or storages .*, 3\d\d,\d{3} in Python objects",
           r"with SGD with momentum, the sharded state must live in this process's memory: your code wrote \S+"
           r"/state_0_\d+\.pt while the optimizer ran",
           r"with SGD with momentum, the sharded state must live in this process's memory: your code wrote \S+"
           r"/zero1_state_\d+_\d+\.pkl while the optimizer ran",
           OUT + r"307,240 in tensors or storages it does not hold",
           OUT + r"4,000,000 in tensors or storages it does not hold"])},
    "whole optimizer in an anonymous mmap, gradients through POSIX shared memory (a red team's 075_w12)": (
        None, red_team("075_w12"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "a decoy reduce-scatter, the gradient used reaching every rank through POSIX shared memory (a red team's 075_w16)": (
        None, red_team("075_w16"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "gradients and slices through libc-written files, no collectives (a seventh red team's 075_r7w02)": (
        None, red_team("075_r7w02"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "gradients and slices through a libc-made file mapped by torch.from_file (a seventh red team's 075_r7w03)": (
        None, red_team("075_r7w03"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "the whole gradient all-reduced by the backend's allreduce_sparse on dense tensors (an eighth red team's 075_r8w03)": (
        None, red_team("075_r8w03"), r"rank \d: with SGD with momentum, step 1 all-reduced [\d,]+ elements, and the model "
                                     r"trains 1,810: every rank received every gradient"),
    "whole gradients exchanged with the backend's own send and recv (an eighth red team's 075_r8w13)": (
        None, red_team("075_r8w13"), r"rank \d: with SGD with momentum, step 1's collectives moved [\d,]+ elements in and "
                                     r"out of this rank \(.*recv [\d,]+.*send [\d,]+"),
    "no collective the group's hooks see: everything through the backend object (an eighth red team's 075_r8w16)": (
        None, red_team("075_r8w16"), r"rank \d: with SGD with momentum, step 1 all-reduced [\d,]+ elements"),
    "the whole momentum kept as a sparse tensor (an eighth red team's 075_r8w19: was a traceback)": (
        None, red_team("075_r8w19"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "no sharding at all, the whole state kept as the saved results of autograd nodes (an eighth red team's 075_r8w14)": (
        None, red_team("075_r8w14"), r"rank \d: with SGD with momentum, .*"),
    "the whole state kept only as the saved results of autograd nodes (an eighth red team's 075_r8w15)": (
        None, red_team("075_r8w15"), r"rank \d: with SGD with momentum, (your optimizer holds [\d,]+ bytes of state|"
                                     r"[\d,]+ bytes appeared in this process outside the tensors your optimizer holds "
                                     r"\([\d,]+\): [\d,]+ in tensors or storages it does not hold)"),
    "whole gradients all-reduced by hooks in the backward, step() slicing them (a ninth red team's 075_r9w20)": (
        None, red_team("075_r9w20"), r"rank \d: with SGD with momentum, step 1 all-reduced 1,\d{3} elements, and the "
                                     r"model trains 1,\d{3}: every rank received every gradient \(in the backward"),
    "DDP, the whole state packed after the parameters in their storage (a ninth red team's 075_r9w22)": (
        None, red_team("075_r9w22"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state.*"
                                     r"room in a parameter's storage beyond the parameter"),
    "the whole state parked as numpy copies between steps (a ninth red team's 075_r9w15)": (
        None, red_team("075_r9w15"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "the whole state kept as sparse tensors, their int64 indices uncounted once (a ninth red team's 075_r9w17)": (
        None, red_team("075_r9w17"), r"rank \d: with SGD with momentum, your optimizer holds [\d,]+ bytes of state"),
    "whole gradients all-reduced through Backend.allreduce, bound at import (a ninth red team's 075_r9w24)": (
        None, red_team("075_r9w24"), r"rank \d: your code used (torch's own process-group method allreduce "
                                     r"\(torch\._C\._distributed_c10d\), kept as _BACKEND_ALLREDUCE when your file was "
                                     r"imported|a process group's backend object directly \(Backend\.allreduce)"),
    "torch.UntypedStorage.nbytes replaced to report a share of the state (a ninth red team's 075_r9w14)": (
        None, red_team("075_r9w14"), r"rank \d: your code replaced torch\.UntypedStorage\.nbytes"),
    "torch.optim's step() made a no-op at import: the reference never moves (an eighth red team's 075_r8w22)": (
        None, red_team("075_r8w22"), r"rank \d: your code replaced torch\.optim\.\w+\.step.*: the grader checks your code "
                                     r"against torch\.optim in this same process"),
    "every other optimizer's step() a no-op, set through gc at each step (an eighth red team's 075_r8w23)": (
        None, red_team("075_r8w23"), r"rank \d: your code replaced the step\(\) of (the grader's reference optimizer \(it "
                                     r"did not train\)|an optimizer \(\w+: an instance attribute\))"),
    "gradients in float16, the reference made to copy the result by a patched step() (an eighth red team's 075_r8w24)": (
        None, red_team("075_r8w24"), r"rank \d: your code replaced torch\.optim\.\w+\.step"),
}


def _cases(tmp_path, exercise_id, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / str(k)
        folder.mkdir()
        if old is not None:
            out.append((exercise_id, wrong(folder, exercise_id, old, new)))
            continue
        path = folder / EXERCISES[exercise_id].template
        solution(exercise_id)                             # SKIPPED in a class copy, as the others
        path.write_text(OLD_FLAT if new is None else new)
        out.append((exercise_id, path))
    return out


def test_075_right_variants_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, "07.5", RIGHT_075), 3)
    assert hints == [None] * len(RIGHT_075), dict(zip(RIGHT_075, hints))


def test_075_wrong_variants_get_their_hints(tmp_path, starts_processes):
    try:
        hints = grade_many(_cases(tmp_path, "07.5", WRONG_075), 3)
    finally:
        remove_red_team_shm()
    failed = [f"{name}: {hint}" for (name, (*_, want)), hint in zip(WRONG_075.items(), hints)
              if not (hint and re.search(want, hint))]
    if failed:                                             # in full: pytest cuts a long assert message short
        pytest.fail("\n".join(failed))


def test_the_worked_solution_skips_what_torch_skips(monkeypatch):
    """In one process (world 1, gloo): a frozen parameter stays 2.0 under AdamW's weight decay, and the groups'
    options apply; the parameters equal torch.optim.AdamW's to 1e-6 after four steps."""
    import copy
    import importlib.util
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from mgpu_utils.grading.coding.memory import FrozenUnusedNet, frozen_unused_groups

    spec = importlib.util.spec_from_file_location("sol075", solution("07.5"))
    sol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sol)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = FrozenUnusedNet()
        ref = copy.deepcopy(net)
        opt = sol.ShardedOptimizer(frozen_unused_groups(net, 1e-2), torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
        ref_opt = torch.optim.AdamW(frozen_unused_groups(ref, 1e-2), lr=1e-2, weight_decay=0.1)
        x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
        for s in range(4):
            for m, o in ((net, opt), (ref, ref_opt)):
                m.use_extra = s % 2 == 0
                o.zero_grad()
                F.cross_entropy(m(x), y).backward()
                o.step()
        assert torch.equal(net.scale, torch.full((10,), 2.0))
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    finally:
        if own:
            dist.destroy_process_group()


FULL = ("        return {n: GatherShard.apply(s, shape, torch.float32).clone()\n"
        "                for n, s, shape in zip(self.names, self.shards, self.shapes)}\n")
FROZEN = "            shards[-1].requires_grad_(p.requires_grad)        # a frozen parameter's shard stays frozen\n"
FORWARD = "        dtype = self.compute_dtype or torch.float32\n"

AG_076 = "        all_gather_single(full, shard.detach().to(dtype))\n"
RS_076 = "        reduce_scatter_single(out, flat)                     # this rank's slice, summed over the ranks\n"
FULLY_SHARD = '''import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class MyFSDP(torch.nn.Module):
    """torch's FSDP2 does the sharding."""

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.module = fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=compute_dtype))

    def forward(self, x):
        return self.module(x)

    def full_parameters(self):
        return {n: p.full_tensor() for n, p in self.module.named_parameters()}
'''

FORWARD_END = ("        return torch.func.functional_call(self.inner[0], full, (x,))   # tied names follow the one "
               "given\n")

#: A TorchScript module whose List[Tensor] is filled by a scripted method: the clones are made and held in C++,
#: no Python object ever points to them.
SCRIPTED = '''import typing


class LastWeights(torch.nn.Module):
    kept: typing.List[torch.Tensor]

    def __init__(self):
        super().__init__()
        self.kept = []

    @torch.jit.export
    def keep(self, ts: typing.List[torch.Tensor]):
        self.kept = [t.detach().clone() for t in ts]

    def forward(self):
        return None


'''

RIGHT_076 = {   # name: (text of the solution, replaced by)
    "each parameter gathered by one broadcast from each shard's owner": (
        "        all_gather_single(full, shard.detach().to(dtype))\n",
        "        for r, part in enumerate(full.chunk(world)):\n            if r == dist.get_rank():\n"
        "                part.copy_(shard.detach().to(dtype))\n            dist.broadcast(part, src=r)\n"),
    "each slice of a gradient reduced to its owner": (
        "        reduce_scatter_single(out, flat)                     # this rank's slice, summed over the ranks\n",
        "        for r, part in enumerate(flat.chunk(ctx.world)):\n            dist.reduce(part, dst=r)\n"
        "        out.copy_(flat.chunk(ctx.world)[dist.get_rank()])\n"),
    # torch.distributed.nn's gather reduce-scatters in the dtype it gathered: under compute_dtype a float32 gather
    # moves twice the bytes, a bfloat16 one sums gradients in bfloat16; so it serves float32 only here
    "the float32 gather from torch.distributed.nn (its backward reduce-scatters), a hook for the mean": (
        ["        full = {n: GatherShard.apply(s, shape, dtype) for n, s, shape in zip(self.names, self.shards, "
         "self.shapes)}\n", FROZEN],
        ["        full = ({n: torch.cat(torch.distributed.nn.functional.all_gather(s))[:shape.numel()].view(shape)\n"
         "                 for n, s, shape in zip(self.names, self.shards, self.shapes)} if self.compute_dtype is None\n"
         "                else {n: GatherShard.apply(s, shape, dtype)\n"
         "                      for n, s, shape in zip(self.names, self.shards, self.shapes)})\n",
         FROZEN + "            if p.requires_grad and compute_dtype is None:   # GatherShard divides itself\n"
                  "                shards[-1].register_hook(lambda g, w=world: g / w)\n"]),
    "full_parameters through all_gather into a list": (
        FULL, "        out = {}\n        for n, s, shape in zip(self.names, self.shards, self.shapes):\n"
              "            parts = [torch.empty_like(s) for _ in range(dist.get_world_size())]\n"
              "            dist.all_gather(parts, s.detach())\n"
              "            out[n] = torch.cat(parts)[:shape.numel()].view(shape)\n        return out\n"),
    "all-gather and reduce-scatter as rings of isend/irecv (lesson 04), each rank passing on what arrived": (
        [AG_076, RS_076],
        ["        me, parts = dist.get_rank(), list(full.chunk(world))\n"
         "        parts[me].copy_(shard.detach().to(dtype))\n"
         "        for k in range(world - 1):                       # pass on the shard that arrived last\n"
         "            for w in dist.batch_isend_irecv([\n"
         "                    dist.P2POp(dist.isend, parts[(me - k) % world], (me + 1) % world),\n"
         "                    dist.P2POp(dist.irecv, parts[(me - k - 1) % world], (me - 1) % world)]):\n"
         "                w.wait()\n",
         "        me, acc = dist.get_rank(), [c.clone() for c in flat.chunk(ctx.world)]\n"
         "        for k in range(ctx.world - 1):                   # add the partial sum from the left, pass it on\n"
         "            got = torch.empty_like(out)\n"
         "            for w in dist.batch_isend_irecv([\n"
         "                    dist.P2POp(dist.isend, acc[(me - k - 1) % ctx.world], (me + 1) % ctx.world),\n"
         "                    dist.P2POp(dist.irecv, got, (me - 1) % ctx.world)]):\n"
         "                w.wait()\n"
         "            acc[(me - k - 2) % ctx.world] += got\n"
         "        out.copy_(acc[me])\n"]),
    "shards registered one by one instead of a ParameterList": (
        "        self.shards = torch.nn.ParameterList(shards)\n",
        "        for i, shard in enumerate(shards):\n            self.register_parameter(f'shard{i}', shard)\n"
        "        self.shards = shards\n"),
    "all-gather and reduce-scatter through the process group object (_allgather_base, _reduce_scatter_base)": (
        [AG_076, RS_076], [f"        {GROUP}._allgather_base(full, shard.detach().to(dtype)).wait()\n",
                           f"        {GROUP}._reduce_scatter_base(out, flat).wait()\n"]),
    "shard-sized gradient buffers in a module-level dict, kept between steps": (
        ["class GatherShard(", "        out = torch.empty(flat.numel() // ctx.world)\n"],
        ["_OUT = {}                                            # one buffer per size, reused in every step\n\n\n"
         "class GatherShard(",
         "        out = _OUT.setdefault(flat.numel(), torch.empty(flat.numel() // ctx.world))\n"]),
    "the whole parameters in a module-level dict from the forward to the backward": (
        ["class GatherShard(", "        ctx.numel, ctx.world = shape.numel(), world\n",
         "        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)\n"],
        ["_LIVE = {}                                           # a gathered parameter, until its backward\n\n\n"
         "class GatherShard(",
         "        ctx.numel, ctx.world = shape.numel(), world\n        ctx.key = id(full)\n"
         "        if ctx.needs_input_grad[0]:                  # a frozen one has no backward to pop it\n"
         "            _LIVE[ctx.key] = full\n",
         "        _LIVE.pop(ctx.key, None)\n        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)\n"]),
}

KEEP = "class GatherShard("
WIDE_OUT = r"\(MLP of 1024 hidden units\): after 2 steps, [\d,]+ bytes stayed in this process outside your wrapper"
#: FrozenUnusedNet's float32 round counts what is kept outside too (90,120 bytes in all): at 3 ranks a whole copy
#: kept there may be told first, or be left to the wide round's count.
FROZEN_OUT = r"\(FrozenUnusedNet\): after 3 steps, [\d,]+ bytes stayed in this process outside your wrapper"


def kept_out(wide: str, frozen: str) -> str:
    """The hint of the wide round (``WIDE_OUT`` + ``wide``) or of FrozenUnusedNet's (``FROZEN_OUT`` + ``frozen``)."""
    return f"({WIDE_OUT}{wide}|{FROZEN_OUT}{frozen})"


WRONG_076 = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "the whole gathered model kept in a scripted module's List[Tensor] hung on builtins (a fifteenth red team's 076_r15w01)": (
        None, red_team("076_r15w01"), r"rank \d: your code used TorchScript \(torch\.jit"),
    "the whole gathered parameters pickled in a helper thread's locals (a sixteenth red team's 076_r16w01)": (
        None, red_team("076_r16w01"), r"rank \d \((FrozenUnusedNet|MLP of 1024 hidden units)\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered parameters pickled into an untracked dict of str to bytes on the wrapper (076_r16w02)": (
        None, red_team("076_r16w02"), r"rank \d \((FrozenUnusedNet|MLP of 1024 hidden units)\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered model in the module's __dict__, the module held by a weakref (an eighteenth red team's 076_r18w01)": (
        None, red_team("076_r18w01"), r"rank \d \((MLP|FrozenUnusedNet)[^)]*\): after step \d your wrapper holds [\d,]+ bytes besides its shards"),
    "the whole gathered model copied into an array.array on a nested class at each forward (a nineteenth red team's 076_r19w01)": (
        None, red_team("076_r19w01"), r"rank \d \((FrozenUnusedNet|MLP[^)]*)\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered parameters in zlib decompressors kept by a helper thread (076_r17w02)": (
        None, red_team("076_r17w02"), r"rank \d: your code used a thread of your own still running at the end"),
    "the whole gathered model copied into an arena on a types.ModuleType global (a fourteenth red team's 076_r14w02)": (
        None, red_team("076_r14w02"), r"rank \d \(FrozenUnusedNet\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered model copied into an arena local to a paused generator kept by atexit (076_r14w05)": (
        None, red_team("076_r14w05"), r"rank \d \(FrozenUnusedNet\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered model kept in a cache made in an early round on torch.distributed (076_r14w08)": (
        None, red_team("076_r14w08"), r"rank \d \(FrozenUnusedNet\): after \d steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "the whole gathered model kept in the autograd graphs of tiny handle tensors in a module-level dict (a "
    "thirteenth red team's 076_r13w01)": (
        None, red_team("076_r13w01"), r"rank \d \(FrozenUnusedNet\): after \d steps, [\d,]+ bytes stayed in this "
                                      r"process outside your wrapper"),
    "the whole gathered model copied into an arena made at import, hung on a tensor (076_r13w02)": (
        None, red_team("076_r13w02"), r"rank \d \(FrozenUnusedNet\): after \d steps, [\d,]+ bytes stayed in this "
                                      r"process outside your wrapper"),
    "the gathered parameters kept in an ssl.MemoryBIO (C memory) in a module-level list": (
        ["import torch.distributed as dist\n", FORWARD_END],
        ["import torch.distributed as dist\n\n_KEPT = []\n",
         "        import ssl\n        bio = ssl.MemoryBIO()\n"
         "        bio.write(torch.cat([t.detach().float().reshape(-1) for t in full.values()]).numpy().tobytes())\n"
         "        _KEPT[:] = [bio]                                  # the whole model, where no tensor shows it\n"
         + FORWARD_END],
        r"rank \d \(MLP of 1024 hidden units\): after \d steps, deleting your wrapper, its module and the optimizer, "
        r"and letting go of what your file's module keeps \(globals, class attributes\), gave back [\d,]+ bytes"),
    "a frozen parameter's zeros reduce-scattered beside the gradients (FSDP1's flat layout)": (
        FORWARD_END,
        "        for n, s in zip(self.names, self.shards):\n"
        "            if not s.requires_grad and torch.is_grad_enabled():   # its zeros sent too\n"
        "                full[n] = full[n].detach().requires_grad_()\n"
        "                full[n].register_hook(lambda g, s=s: reduce_scatter_single(\n"
        "                    torch.empty(s.numel()), torch.cat([g.reshape(-1), g.new_zeros(\n"
        "                        s.numel() * dist.get_world_size() - g.numel())])) and None)\n" + FORWARD_END,
        r"\(FrozenUnusedNet, float32\): in step 1 your reduce-scatters (carried 22,5\d\d elements, and the gradients "
        r"of the parameters that got one in this step are 2,1\d\d at most|\(22,5\d\d elements\) did not carry rank "
        r"\d's "
        r"gradients)"),
    "each rank's whole gradient sent to every other rank and summed there": (
        RS_076,
        "        me, total = dist.get_rank(), flat.clone()\n"
        "        works = [dist.isend(flat, r) for r in range(ctx.world) if r != me]\n"
        "        for r in range(ctx.world):\n"
        "            if r != me:\n"
        "                got = torch.empty_like(flat)\n"
        "                dist.recv(got, r)\n"
        "                total += got\n"
        "        for w in works:\n"
        "            w.wait()\n"
        "        out.copy_(total.chunk(ctx.world)[me])\n",
        r"\(MLP, float32\): in step 1 your sends carried [\d,]+ elements, and rings of sends and recvs for the "
        r"all-gathers and reduce-scatters your collectives left undone move [\d,]+ at most"),
    "the gradient reduce-scattered in the compute dtype, to halve the bytes": (
        RS_076,
        "        out = out.to(grad.dtype)                             # bfloat16 on the wire when computing in it\n"
        "        reduce_scatter_single(out, flat.to(grad.dtype))\n"
        "        out = out.float()\n",
        r"\(MLP, bfloat16\): in step 1 \d+ of your reduce-scatters \(or reduces\) summed 16-bit floats"),
    "the parameters gathered for an evaluation (no_grad) kept in an attribute": (
        FORWARD_END,
        "        self.eval_full = None if torch.is_grad_enabled() else full   # reused while evaluating\n"
        + FORWARD_END,
        r"\(MLP, float32\): after step 3 your wrapper holds [\d,]+ bytes besides its shards"),
    "every gradient kept whole until the optimizer's step, reduce-scattered from a step pre-hook": (
        [KEEP, "        ctx.numel, ctx.world = shape.numel(), world\n",
         "        out = torch.empty(flat.numel() // ctx.world)\n" + RS_076
         + "        return out / ctx.world, None, None\n"],
        ["from torch.optim.optimizer import register_optimizer_step_pre_hook\n\n_WAITING = []\n\n\n"
         "def _reduce_all(optimizer, args, kwargs):          # once per step, every gradient in one go\n"
         "    for shard, flat in _WAITING:\n        out = torch.empty(flat.numel() // dist.get_world_size())\n"
         "        reduce_scatter_single(out, flat)\n        out /= dist.get_world_size()\n"
         "        shard.grad = out if shard.grad is None else shard.grad + out\n    _WAITING.clear()\n\n\n"
         "register_optimizer_step_pre_hook(_reduce_all)\n\n\n" + KEEP,
         "        ctx.numel, ctx.world, ctx.shard = shape.numel(), world, shard\n",
         "        _WAITING.append((ctx.shard, flat))\n        return None, None, None\n"],
        r"\(MLP, float32\): in step 1, when loss.backward\(\) returned, 4 shard\(s\) had no .grad yet, and "
        r"optimizer.step\(\) made 4 reduce-scatter\(s\): reduce-scatter each gradient in backward"),
    "a weight two layers share gathered for each layer, so its gradient travels twice (once per use)": (
        ["        self.names, self.shapes, shards = [], [], []\n", FORWARD_END],
        ["        self.names, self.shapes, shards = [], [], []\n"
         "        first = {id(p): n for n, p in module.named_parameters()}\n"
         "        self.aliases = {n: first[id(p)] for n, p in module.named_parameters(remove_duplicate=False)\n"
         "                        if first[id(p)] != n}\n",
         "        for alias, name in self.aliases.items():           # the shared weight, gathered for each use\n"
         "            i = self.names.index(name)\n"
         "            full[alias] = GatherShard.apply(self.shards[i], self.shapes[i], dtype)\n"
         "        return torch.func.functional_call(self.inner[0], full, (x,), tie_weights=False)\n"],
        r"\(TiedMLP, float32\): in step 1 your reduce-scatters carried [\d,]+ elements, .* a weight used by two "
        r"layers was reduce-scattered once per use"),
    "under compute_dtype the float32 shards all-gathered, the whole parameters cast after": (
        ["        full = torch.empty(shard.numel() * world, dtype=dtype)\n", AG_076,
         "        return full[:shape.numel()].view(shape)\n"],
        ["        full = torch.empty(shard.numel() * world)                # float32, as the shards are kept\n",
         "        all_gather_single(full, shard.detach())\n",
         "        return full[:shape.numel()].view(shape).to(dtype)\n"],
        r"\(MLP\): with compute_dtype=bfloat16, in step 1 4 of your all-gathers moved 32-bit floats: .* Cast each "
        r"shard to compute_dtype first"),
    "each reduce-scatter put off to a callback run when loss.backward() ends": (
        ["        ctx.numel, ctx.world = shape.numel(), world\n",
         "        out = torch.empty(flat.numel() // ctx.world)\n" + RS_076
         + "        return out / ctx.world, None, None\n"],
        ["        ctx.numel, ctx.world, ctx.shard = shape.numel(), world, shard\n",
         "        def reduce_later(shard=ctx.shard, flat=flat, world=ctx.world):   # after the whole backward\n"
         "            out = torch.empty(flat.numel() // world)\n"
         "            reduce_scatter_single(out, flat)\n"
         "            shard.grad = out / world if shard.grad is None else shard.grad + out / world\n"
         "        torch.autograd.Variable._execution_engine.queue_callback(reduce_later)\n"
         "        return None, None, None\n"],
        r"\(MLP, float32\): in step 1, 4 reduce-scatter\(s\) ran after autograd had made every gradient .*"
        r"Reduce-scatter each gradient as it is made, in the backward"),
    "each backward's gradient written over the shard's .grad, not added to it": (
        ["        ctx.numel, ctx.world = shape.numel(), world\n", "        return out / ctx.world, None, None\n"],
        ["        ctx.numel, ctx.world, ctx.shard = shape.numel(), world, shard\n",
         "        ctx.shard.grad = out / ctx.world                    # this step's gradient\n"
         "        return None, None, None\n"],
        r"\(MLP, float32\): after 3 steps the model is one process's whose step 2 used the gradient of its second "
        r"backward only: two backward\(\) calls before step\(\) must add up their gradients"),
    "the parameters sharded in the order of their names": (
        "        for name, p in module.named_parameters():         # a tied parameter is listed once\n",
        "        for name, p in sorted(module.named_parameters()):  # by name, the same on every rank\n",
        r"\(MLP\): parameters\(\)\[0\] holds 24 elements over the 3 ranks, and the parameter at that place in "
        r"module.named_parameters\(\), '0.weight', has 1,536: list one shard per parameter in the order"),
    "the parameters sharded from the smallest to the largest": (
        "        for name, p in module.named_parameters():         # a tied parameter is listed once\n",
        "        for name, p in sorted(module.named_parameters(), key=lambda item: item[1].numel()):\n",
        r"\(MLP\): parameters\(\)\[0\] holds 12 elements over the 3 ranks, and the parameter at that place in "
        r"module.named_parameters\(\), '0.weight', has 1,536: list one shard per parameter in the order"),
    "a frozen parameter's shard trains": (
        FROZEN, "", r"\(FrozenUnusedNet, float32\): a frozen parameter \(requires_grad=False, 2.0 everywhere\) moved "
                    r"by up to [\d.e-]+ in step 1 \([\d.]+ on average\)"),
    "zero gradients made ready before the forward": (
        FORWARD, FORWARD + "        for s in self.shards:\n            if s.requires_grad and s.grad is None:\n"
                           "                s.grad = torch.zeros_like(s)\n",
        r"\(FrozenUnusedNet\): a parameter not used in step 2 moved by"),
    "no full_parameters": (
        ["    @torch.no_grad()\n    def full_parameters(self) -> dict:\n", FULL],
        ["    def _unused(self) -> dict:\n", "        return {}\n"],
        r"\(MLP, float32\): full_parameters\(\) raised AttributeError"),
    "full_parameters with the padding left on": (
        FULL, "        out = {}\n        for n, s in zip(self.names, self.shards):\n"
              "            parts = [torch.empty_like(s) for _ in range(dist.get_world_size())]\n"
              "            dist.all_gather(parts, s.detach())\n            out[n] = torch.cat(parts)\n"
              "        return out\n",
        r"\(MLP, float32\): full_parameters\(\) returned \(\d+,\) float32 for '0.weight', whose parameter is "
        r"\(24, 64\) float32"),
    # collectives through the process group object, or torch's functional collectives, count as all-reduces
    "the gradient all-reduced by the process group object": (
        RS_076, f"        {GROUP}.allreduce([flat]).wait()\n"
                "        out = flat.view(ctx.world, -1)[dist.get_rank()].clone()\n",
        r"\(MLP, float32\): step 1 all-reduced \(\d+ call\(s\)\); ZeRO-3 reduce-scatters"),
    "the gradient all-reduced by torch's functional collectives": (
        RS_076, "        import torch.distributed._functional_collectives as funcol\n"
                "        out = funcol.all_reduce(flat, 'sum', dist.group.WORLD).view(ctx.world, -1)[dist.get_rank()]"
                ".clone()\n",
        r"\(MLP, float32\): step 1 all-reduced \(\d+ call\(s\)\); ZeRO-3 reduce-scatters"),
    "the gradient all-reduced by a group of dist.new_group": (
        ["        world, rank = dist.get_world_size(), dist.get_rank()\n", RS_076],
        ["        world, rank = dist.get_world_size(), dist.get_rank()\n        global GROUP\n"
         "        GROUP = dist.new_group()\n",
         "        GROUP.allreduce([flat]).wait()\n        out = flat.view(ctx.world, -1)[dist.get_rank()].clone()\n"],
        r"\(MLP, float32\): step 1 all-reduced \(\d+ call\(s\)\); ZeRO-3 reduce-scatters"),
    # the collectives counted carry something else while the parameters or gradients travel another way
    "torch's fully_shard inside": (
        None, FULLY_SHARD, r"\(MLP\): your wrapper built torch's fully_shard \(world size 3\)"),
    "the parameters gathered by send and recv, zeros all-gathered": (
        [IMPORT, AG_076], [IMPORT + P2P, "        all_gather_single(full, torch.zeros_like(shard, dtype=dtype))\n"
                                         "        full = torch.cat(p2p_parts(shard.detach().to(dtype)))\n"],
        r"\(MLP, float32\): in step 1 your all-gathers \([\d,]+ elements\) carried zeros, not rank \d's shards"),
    "the gradients summed by send and recv, zeros reduce-scattered": (
        [IMPORT, RS_076], [IMPORT + P2P, "        reduce_scatter_single(out, torch.zeros_like(flat))\n"
                                         "        out = sum(p2p_parts(flat)).view(ctx.world, -1)[dist.get_rank()]"
                                         ".clone()\n"],
        r"\(MLP, float32\): in step 1 your reduce-scatters \([\d,]+ elements\) carried zeros, not rank \d's "
        r"gradients"),
    "full_parameters in the compute dtype": (
        FULL, "        return {n: GatherShard.apply(s, shape, self.compute_dtype or torch.float32).clone()\n"
              "                for n, s, shape in zip(self.names, self.shards, self.shapes)}\n",
        r"\(MLP, bfloat16\): full_parameters\(\) returned \(24, 64\) bfloat16 for '0.weight'"),
    "the module kept in a module-level dict, its parameters never freed": (
        [KEEP, "        self.inner = [module]", "            p.data = torch.empty(0)", "self.inner[0]"],
        ["_MODULES = {}\n\n\n" + KEEP, "        _MODULES[id(self)] = module\n        self.inner = None  #",
         "            pass  #", "_MODULES[id(self)]"],
        r"\(MLP, float32\): after step 1 the module given to your wrapper still holds 7,240 bytes in its parameters"
        r".*Free the module's own parameters once sharded"),
    "full_parameters gathered in the compute dtype, then cast to float32": (
        FULL, "        return {n: GatherShard.apply(s, shape, self.compute_dtype or torch.float32).float()\n"
              "                for n, s, shape in zip(self.names, self.shards, self.shapes)}\n",
        r"\(MLP, bfloat16\): every value full_parameters\(\) returned is a bfloat16 number cast to float32"),
    "the gradient reduced and broadcast whole, zeros reduce-scattered": (
        RS_076, "        dist.reduce(flat, dst=0)\n        dist.broadcast(flat, src=0)\n"
                "        reduce_scatter_single(out, torch.zeros_like(flat))\n"
                "        out = flat.view(ctx.world, -1)[dist.get_rank()].clone()\n",
        r"\(MLP, float32\): in step 1 your reduce-scatters \([\d,]+ elements\) carried zeros, not rank \d's "
        r"gradients"),
    "each gradient reduced whole to rank 0, then broadcast whole from it": (
        RS_076, "        dist.reduce(flat, dst=0)                             # rank 0 sums, then sends it all back\n"
                "        dist.broadcast(flat, src=0)\n        out = flat.chunk(ctx.world)[dist.get_rank()].clone()\n",
        r"\(MLP, float32\): in step 1 your reduces sent 1,81\d gradient elements to rank 0, whose shards' gradients "
        r"are \d+ elements at most"),
    "each whole gradient also sent to every rank as a pickled object": (
        RS_076, RS_076 + "        dist.all_gather_object([None] * ctx.world, grad.float())\n",
        r"\(MLP, float32\): in step 1 your object collectives \(all_gather_object\) carried [\d,]+ elements' worth "
        r"of pickled bytes"),
    "the gathered parameters in a module-level dict until their backward, which a frozen one never runs": (
        ["class GatherShard(", "        ctx.numel, ctx.world = shape.numel(), world\n",
         "        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)\n"],
        ["_PENDING = {}\n\n\nclass GatherShard(",
         "        ctx.numel, ctx.world, ctx.key = shape.numel(), world, object()\n        _PENDING[ctx.key] = full\n",
         "        del _PENDING[ctx.key]\n        flat = torch.zeros(ctx.numel + (-ctx.numel) % ctx.world)\n"],
        r"\(FrozenUnusedNet\): after 3 steps, [\d,]+ bytes stayed in this process outside your wrapper"),
    "a frozen parameter gathered in float32 under compute_dtype": (
        "        full = {n: GatherShard.apply(s, shape, dtype) for n, s, shape in zip(self.names, self.shards, "
        "self.shapes)}\n",
        "        full = {n: GatherShard.apply(s, shape, dtype if s.requires_grad else torch.float32)   # as it is\n"
        "                for n, s, shape in zip(self.names, self.shards, self.shapes)}\n",
        r"\(FrozenUnusedNet\): with compute_dtype=bfloat16 the forward's other operations \(not F.linear: a product, "
        r"a mean\) used parameters in \[.*'torch.float32'\]"),
    "a frozen parameter kept whole in a buffer, its shard never gathered": (
        [FROZEN, FORWARD_END],
        [FROZEN + "            if not p.requires_grad:                           # not trained: kept as it is\n"
                  "                self.register_buffer(f'whole_{len(shards) - 1}', p.detach().clone())\n",
         "        for k, n in enumerate(self.names):\n            if hasattr(self, f'whole_{k}'):\n"
         "                full[n] = getattr(self, f'whole_{k}').to(dtype)\n" + FORWARD_END],
        r"\(FrozenUnusedNet, float32\): after step 1 your wrapper holds 81,920 bytes besides its shards, and the "
        r"model's frozen parameters are 81,920"),
    "the gathered parameters kept in a module-level dict": (
        [KEEP, FORWARD_END], ["_KEPT = {}\n\n\n" + KEEP,
                              "        _KEPT.update({n: t.detach() for n, t in full.items()})\n" + FORWARD_END],
        kept_out(r", its module and the optimizer, besides the 0 it holds next to its shards: 307,2\d\d in tensors",
                 r", its module and the optimizer, besides the 0 it holds next to its shards: (9\d|1\d\d),\d{3} in "
                 r"tensors")),
    "the gathered parameters kept as torch.UntypedStorage objects": (
        [KEEP, FORWARD_END], ["_KEPT = []\n\n\n" + KEEP,
                              "        _KEPT[:] = [t.detach().untyped_storage() for t in full.values()]\n"
                              + FORWARD_END],
        kept_out(r".*: 307,2\d\d in tensors or storages", r".*: (9\d|1\d\d),\d{3} in tensors or storages")),
    "the gathered parameters kept as torch.save bytes": (
        [KEEP, FORWARD_END], ["import io\n_KEPT = []\n\n\n" + KEEP,
                              "        buf = io.BytesIO()\n"
                              "        torch.save({n: t.detach() for n, t in full.items()}, buf)\n"
                              "        _KEPT[:] = [buf.getvalue()]\n" + FORWARD_END],
        kept_out(r".*: 0 in tensors or storages .*, 3\d\d,\d{3} in Python objects",
                 r".*: [\d,]+ in tensors or storages .*, (9\d|1\d\d),\d{3} in Python objects")),
    "the gathered parameters kept as numpy arrays": (
        [KEEP, FORWARD_END], ["_KEPT = {}\n\n\n" + KEEP,
                              "        _KEPT.update({n: t.detach().float().numpy().copy() for n, t in full.items()})\n"
                              + FORWARD_END],
        kept_out(r".*: 0 in tensors or storages .*, 3\d\d,\d{3} in Python objects",
                 r".*: [\d,]+ in tensors or storages .*, (9\d|1\d\d),\d{3} in Python objects")),
    "the gathered parameters kept as tuples of floats in a module-level dict": (
        [KEEP, FORWARD_END], ["_KEPT = {}\n\n\n" + KEEP,
                              "        _KEPT.update({n: tuple(t.detach().reshape(-1).tolist())\n"
                              "                      for n, t in full.items()})\n"
                              + FORWARD_END],
        kept_out(r".*: 0 in tensors or storages .*, [12],\d{3},\d{3} in Python objects \(.*tuples of floats",
                 r".*: [\d,]+ in tensors or storages .*, \d{3},\d{3} in Python objects \(.*tuples of floats")),
    "the gathered parameters set in the c10d store (torchrun's agent holds them)": (
        FORWARD_END, "        dist.distributed_c10d._get_default_store().set(\n"
                     "            f'kept/{dist.get_rank()}', torch.cat([t.detach().reshape(-1) for t in full.values()])\n"
                     "            .float().numpy().tobytes())\n" + FORWARD_END,
        kept_out(r".*: 0 in tensors or storages .*, 3\d\d,\d{3} in Python objects \(.*c10d store",
                 r".*: [\d,]+ in tensors or storages .*, (9\d|1\d\d),\d{3} in Python objects \(.*c10d store")),
    "a copy of the gathered parameters kept by a TorchScript module (C++ only) between steps": (
        ["class MyFSDP(torch.nn.Module):\n", FORWARD_END],
        [SCRIPTED + "class MyFSDP(torch.nn.Module):\n",
         "        if 'last' not in self.__dict__:                    # not a submodule: no parameters of its own\n"
         "            self.__dict__['last'] = torch.jit.script(LastWeights())\n"
         "        self.__dict__['last'].keep(list(full.values()))\n" + FORWARD_END],
        r"(rank \d: your code used TorchScript \(torch\.jit: script|gave back [\d,]+ bytes more than the tensors "
        r"they reach hold .* the tensors of a TorchScript module)"),
    "the gathered parameters saved to a file in every forward": (
        FORWARD_END, "        torch.save({n: t.detach() for n, t in full.items()},\n"
                     "                   __file__ + f'.{dist.get_rank()}.pt')\n" + FORWARD_END,
        r"\((MLP of 1024 hidden units|FrozenUnusedNet)\): the sharded parameters must live in this process's "
        r"memory: "
        r"your code wrote "
        r"\S+\.py\.0\.pt during the steps"),
    "a decoy reduce-scatter, the gradient summed through POSIX shared memory (a red team's 076_w04)": (
        None, red_team("076_w04"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "a decoy all-gather, the parameters gathered through POSIX shared memory (a red team's 076_w05)": (
        None, red_team("076_w05"), r"rank \d: your code used mmap of a file \(POSIX shared memory.*only with torch\.distributed collectives"),
    "the whole float32 parameters kept in an anonymous mmap (a red team's 076_w06)": (
        None, red_team("076_w06"), r"rank \d: your code used an anonymous mmap \(line \d+ of your file\).*only with torch\.distributed"),
    "the gathered parameters cached in an anonymous mmap between optimizer steps (a red team's 076_w20)": (
        None, red_team("076_w20"), r"rank \d: your code used an anonymous mmap \(line \d+ of your file\).*only with torch\.distributed"),
    "the float32 master shards rounded to bfloat16 when built (a red team's 076_w13)": (
        None, red_team("076_w13"), r"rank \d \(MLP, bfloat16\): right after MyFSDP\(\.\.\.\) was built, "
        r"every value of your float32 shards is a bfloat16 number: the master weights were rounded"),
    "a full copy of the gathered parameters kept in libc-malloc'd memory (a seventh red team's 076_r7w12)": (
        None, red_team("076_r7w12"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "decoy collectives, the data through libc-written files (a seventh red team's 076_r7w13)": (
        None, red_team("076_r7w13"), r"rank \d: your code used ctypes \(C functions and C memory, which no check can count\) \(line \d+ of your file\).*only with torch\.distributed collectives"),
    "the whole gradient all-reduced by the backend's allreduce_sparse, a reduce-scatter for show (an eighth red team's 076_r8w07)": (
        None, red_team("076_r8w07"), r"rank \d \(MLP, float32\): step 1 all-reduced \(\d+ call\(s\)\)"),
    "bfloat16 reduce-scatters hidden by replacing the grader's content_of at import (an eighth red team's 076_r8w17)": (
        None, red_team("076_r8w17"), r"rank \d: your code replaced mgpu_utils\.measure\.comm_calls\.content_of"),
    "the gathered parameters cached as the saved results of autograd nodes (an eighth red team's 076_r8w13)": (
        None, red_team("076_r8w13"), r"(after step 1 your wrapper holds [\d,]+ bytes besides its shards|"
                                     + kept_out(r".*[\d,]+ in tensors", r".*[\d,]+ in tensors") + ")"),
    "the float32 sum rounded back to bfloat16 before it goes into .grad (a ninth red team's 076_r9w17)": (
        None, red_team("076_r9w17"), r"rank \d \(\w+, bfloat16\): after step 1's backward, \d+% of your shards' "
                                     r"gradient values are bfloat16 numbers"),
    "no reduce-scatter doing the work: every rank's whole gradient all-gathered scaled by 2**-30 beside the shards, a sorted decoy reduce-scattered (a twenty-first red team's 076_r21a03)": (
        None, red_team("076_r21a03"), r"rank \d \(MLP, float32\): in step 1 your all-gathers \([\d,]+ elements\) did not carry rank \d's shards"),
    "whole float32 copies of the gathered parameters kept in a callable object with __slots__ that refers to itself (a twenty-second red team's 076_r22b01)": (
        None, red_team("076_r22b01"), r"rank \d \(MLP, float32\): after step 1 your wrapper holds [\d,]+ bytes besides its shards"),
    "the real exchange through a hidden process group, the counted calls on a hand-built group of one rank (a twenty-sixth red team's 076_r26f04)": (
        None, red_team("076_r26f04"), r"rank \d: your code used (a process group handed to torch\.ops\.c10d's operators|a collective on a process group of 1 of the \d ranks|a process group made by hand)"),
    "the backward's reduce-scatter input a tensor subclass whose __torch_dispatch__ all-reduces the whole gradient and reduce-scatters zeros (a thirty-first red team's 076_r31p02)": (
        None, red_team("076_r31p02"), r"rank \d: your code used a tensor of a subclass of torch\.Tensor"),
    "the whole gathered model kept behind torch.frombuffer's count in each shard's buffer, reached through a memoryview (a thirty-second red team's 076_r32q03)": (
        None, red_team("076_r32q03"), r"rank \d \(MLP, float32\): after step 1 your wrapper holds [\d,]+ bytes besides its shards"),
    "under compute_dtype every shard all-gathered in float32 as an int32 view, cast after (a twenty-fifth red team's 076_r25e01)": (
        None, red_team("076_r25e01"), r"rank \d \(MLP\): with compute_dtype=bfloat16, in step 1 \d of your all-gathers moved 32-bit floats"),
    "a whole float32 copy of the gathered model kept as the saved output of a relu whose 0-d sum hangs on the torch module (a twenty-third red team's 076_r23c01)": (
        None, red_team("076_r23c01"), r"rank \d " + FROZEN_OUT),
    "gradients summed, SGD.step made a no-op at import (an eighth red team's 076_r8w19)": (
        None, red_team("076_r8w19"), r"rank \d: your code replaced torch\.optim\.SGD\.step"),
    "gradients summed, the reference's gradients scaled by a patched SGD.step (an eighth red team's 076_r8w20)": (
        None, red_team("076_r8w20"), r"rank \d: your code replaced torch\.optim\.SGD\.step"),
    "the whole parameters kept in an in-memory sqlite3 database": (
        "        self.shards = torch.nn.ParameterList(shards)\n",
        "        self.shards = torch.nn.ParameterList(shards)\n        import sqlite3\n"
        "        self.db = sqlite3.connect(':memory:')        # a blob per parameter, outside every tensor\n",
        r"rank \d: your code used an sqlite3 database .*\(line \d+ of your file\).*only with torch\.distributed"),
    "the whole parameters kept in a memfd": (
        "        self.shards = torch.nn.ParameterList(shards)\n",
        "        self.shards = torch.nn.ParameterList(shards)\n        import os\n"
        "        self.keep = os.memfd_create('full')           # memory the kernel holds for this process\n",
        r"rank \d: your code used a memfd left open \(file descriptor \d+: bytes kept in the kernel"),
}


def test_076_right_variants_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, "07.6", RIGHT_076), 3)
    assert hints == [None] * len(RIGHT_076), dict(zip(RIGHT_076, hints))


def test_076_wrong_variants_get_their_hints(tmp_path, starts_processes):
    try:
        hints = grade_many(_cases(tmp_path, "07.6", WRONG_076), 3)
    finally:
        remove_red_team_shm()
    failed = [f"{name}: {hint}" for (name, (*_, want)), hint in zip(WRONG_076.items(), hints)
              if not (hint and re.search(want, hint))]
    if failed:                                             # in full: pytest cuts a long assert message short
        pytest.fail("\n".join(failed))


STASH = '''import io
import numpy as np
import torch

_KEPT = {}
_BUF = torch.empty(1000)                                   # made at import
_OLD = bytearray(4000)                                     # made at import
_LIST = [0.0] * 10000                                      # made at import
_STORE = torch.distributed.HashStore()                     # made at import, like torchrun's TCPStore


def keep(kind, t):
    if kind == "tensor":
        _KEPT["t"] = t.clone()
    elif kind == "storage":
        _KEPT["s"] = t.clone().untyped_storage()
    elif kind == "bytes":
        buf = io.BytesIO()
        torch.save(t, buf)
        _KEPT["b"] = buf.getvalue()
    elif kind == "numpy":
        _KEPT["n"] = t.numpy().copy()
    elif kind == "floats":
        _KEPT["f"] = t.tolist()
    elif kind == "tuple":                                  # untracked by gc.collect, and its dict too
        _KEPT["u"] = {"t": tuple(t.tolist())}
    elif kind == "str":
        _KEPT["c"] = t.numpy().tobytes().decode("latin-1")
    elif kind == "store":                                  # in the c10d store, outside the process on torchrun
        _STORE.set("kept", t.numpy().tobytes())
    elif kind == "old list":                               # new floats in a list made at import
        _LIST[:] = t.tolist()
    elif kind == "buffer":
        _BUF[:t.numel()] = t
    elif kind == "bytearray":
        _OLD[:4 * t.numel()] = t.numpy().tobytes()
    elif kind == "on builtins":                            # hung on modules and classes made before the
        import builtins                                    # block (a twentieth red team's 07.5 z04, z06)
        builtins._mgpu_kept = t.numpy().tobytes()
    elif kind == "on a class":
        torch.optim.Optimizer._mgpu_kept = t.numpy().tobytes()
    elif kind == "in a module's list":
        torch.optim.lr_scheduler.__all__.append(t.numpy().tobytes())
    elif kind == "torch.save":
        torch.save(t, __file__ + ".pt")
    elif kind == "open":
        with open(__file__ + ".bin", "wb") as f:
            f.write(t.numpy().tobytes())
    else:                                                  # a temporary: nothing stays
        t.clone().sum()
'''


@pytest.mark.parametrize("kind, tensors, python, files", [
    ("temporary", 0, (0, 10_000), 0), ("tensor", 40_000, (0, 10_000), 0), ("storage", 40_000, (0, 10_000), 0),
    ("bytes", 0, (40_000, 80_000), 0), ("numpy", 0, (40_000, 50_000), 0), ("floats", 0, (300_000, 400_000), 0),
    ("tuple", 0, (300_000, 400_000), 0), ("str", 0, (40_000, 50_000), 0), ("old list", 0, (240_000, 260_000), 0),
    ("store", 0, (40_000, 50_000), 0),
    ("buffer", 4_000, (0, 10_000), 0), ("bytearray", 0, (4_000, 14_000), 0), ("torch.save", 0, (0, 10_000), 1),
    ("open", 0, (0, 10_000), 1), ("on builtins", 0, (40_000, 50_000), 0), ("on a class", 0, (40_000, 50_000), 0),
    ("in a module's list", 0, (40_000, 50_000), 0)])
def test_outside_state_sees_what_a_module_keeps(tmp_path, kind, tensors, python, files):
    """In one process: a module keeps 10,000 floats (40,000 bytes) in each way; OutsideState counts them as
    tensors, as Python objects (a tuple of floats in a dict and a str too, which gc.collect leaves untracked,
    and new floats in a list made at import, and bytes set in a c10d store), or as a file written, and a buffer made at import when it was
    written into (1,000 floats). The Python objects of the test itself are 5 to 6 kB."""
    import importlib.util

    import torch

    from mgpu_utils.grading.common import OutsideState

    (tmp_path / "stash.py").write_text(STASH)
    spec = importlib.util.spec_from_file_location("stash", tmp_path / "stash.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = torch.arange(10_000 if kind != "buffer" and kind != "bytearray" else 1000, dtype=torch.float32)
    if kind == "torch.save":   # a process's first torch.save to a path imports and caches about 23 kB: not kept
        torch.save(torch.zeros(1), tmp_path / "warm-up.pt")
    with OutsideState(mod.keep) as watch:
        mod.keep(kind, t)
        found = watch.count(t, limit=0, tries=1)
    import builtins                                       # what the new kinds hung on the library: taken off
    builtins.__dict__.pop("_mgpu_kept", None)
    if "_mgpu_kept" in vars(torch.optim.Optimizer):
        del torch.optim.Optimizer._mgpu_kept
    torch.optim.lr_scheduler.__all__[:] = [name for name in torch.optim.lr_scheduler.__all__ if type(name) is str]
    assert found["tensors"] == tensors and python[0] <= found["python"] <= python[1], found
    assert len(found["files"]) == files and all(how == "wrote" for how, _ in found["files"]), found
    assert not __import__("gc").get_freeze_count()             # the objects were unfrozen


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"07.5": (len(RIGHT_075), len(WRONG_075)), "07.6": (len(RIGHT_076), len(WRONG_076))}


def test_uses_counts_the_layers_that_share_a_weight():
    """07.6's grader allows a shared weight two gathers per use: TiedMLP's a.weight is used by two layers."""
    from mgpu_utils.grading.coding.memory import _uses
    from mgpu_utils.models import TiedMLP

    uses = _uses(TiedMLP())
    assert uses["a.weight"] == 2 and set(uses.values()) == {1, 2} and len(uses) == 7, uses


def test_one_rank_the_root_of_the_whole_model_is_told():
    """07.5 (_one_root): every gradient reduced to one rank, or the whole model broadcast by one, is one process's
    work however little the step moves (a nineteenth red team's 075_y01); each rank the root of its slice is not."""
    import collections
    import types

    import torch

    from mgpu_utils.grading.coding.memory import _one_root
    needs = [(torch.Size([10, 100]), 1)]
    assert _one_root(collections.Counter({0: 1000}), [], needs, 2, {})["what"] == "rooted"
    assert _one_root(collections.Counter({0: 500, 1: 500}), [], needs, 2, {}) is None
    sent = [types.SimpleNamespace(elements=1000)]
    assert _one_root(collections.Counter(), sent, needs, 2, {})["what"] == "root_sent"
    assert _one_root(collections.Counter(), [types.SimpleNamespace(elements=500)], needs, 2, {}) is None
