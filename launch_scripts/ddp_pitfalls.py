"""DDP in the wild: unused parameters, seeding per rank, and clipping with no_sync accumulation, each shown
going wrong, then fixed and checked against one process (notebooks/03_ddp.ipynb).

  unused   A model whose forward skips a branch on odd steps. Plain DDP raises in the forward after the first
           skip (that step's reduction never finished: the skipped parameters got no gradient, and the step
           used each rank's own, unsynchronised gradients). With find_unused_parameters=True it trains; with
           static_graph=True a branch that is never used trains too: parameters equal one process's on the
           global batch, on every rank. The time per step with and without the search for unused
           parameters is reported (on a model that uses all of them).
  seeding  Dropout: one seed on every rank gives every rank the same mask; seed + rank, different masks.
           DistributedSampler: its seed must be the SAME on every rank (it shuffles one permutation and
           each rank takes a slice); per-rank seeds read some samples twice and miss others (counted).
           Initialisation with per-rank seeds: DDP's constructor broadcasts rank 0's parameters.
  clip     clip_grad_norm_ with --micro-batches accumulated under no_sync: clipping after every micro-batch
           (local, unsynchronised sums) against once after the synchronising backward; the second equals
           one process's clipped step.

Without torchrun the script makes a one-process gloo group (world size 1). Rank 0 prints one JSON line.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/ddp_pitfalls.py
"""
import argparse
import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import clip_grad_norm_, parameters_to_vector
from torch.utils.data import DistributedSampler

from mgpu_utils.checks import exact_fp32, max_abs_diff
from mgpu_utils.data import load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import make_mlp
from mgpu_utils.timing import synced_clock


class Branchy(nn.Module):
    """64 -> 32 -> 10 digits classifier; branch `b` runs only when use_b; `never` (if asked for) is never used."""

    def __init__(self, never=False):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(64, 32), nn.Linear(32, 32), nn.Linear(32, 10)
        self.never = nn.Linear(1, 1) if never else None

    def forward(self, x, use_b=True):
        h = torch.relu(self.a(x))
        return self.head(h + torch.relu(self.b(h)) if use_b else h)


def ids(device):
    """DDP's device_ids: this rank's GPU, or None on the CPU."""
    return [device.index] if device.type == "cuda" else None


def gathered(t):
    """Every rank's copy of the 1-D tensor t, as a list (rank order)."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


# region unused
def train(model, x, y, steps, skip_odd, lr=0.1):
    """SGD on (x, y), skipping the branch on odd steps if skip_odd. Returns (steps done, error)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        try:
            loss = F.cross_entropy(model(x, use_b=not (skip_odd and step % 2)), y)
        except RuntimeError as err:                   # plain DDP: raised in the forward after the skip
            return step, str(err)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps, None


def unused_case(a, rank, world, X, Y, device):
    b, n = a.per_rank_batch, a.per_rank_batch * world
    mine = slice(rank * b, (rank + 1) * b)              # this rank's share of the global batch
    res = {}
    runs = (("plain", {}, True, False),                 # (name, DDP's options, skip, never)
            ("find_unused", {"find_unused_parameters": True}, True, False),
            ("static_graph", {"static_graph": True}, False, True))
    for name, kw, skip, never in runs:
        torch.manual_seed(a.seed)
        base = Branchy(never).to(device)
        ref, ddp = copy.deepcopy(base), DDP(copy.deepcopy(base), device_ids=ids(device), **kw)
        done, err = train(ddp, X[mine], Y[mine], a.steps, skip)
        train(ref, X[:n], Y[:n], done, skip)          # one process, the same steps on the whole batch
        flat = parameters_to_vector(ddp.module.parameters()).detach()
        one = parameters_to_vector(ref.parameters())
        res[name] = {"steps_done": done, "error": err and err.splitlines()[0][:300],
                     "max_diff_vs_one_process": max_abs_diff(flat, one),
                     "same_on_every_rank": all(torch.equal(flat, f) for f in gathered(flat))}
    base = Branchy().to(device)
    for find in (False, True):                          # what the search costs when nothing is unused
        ddp = DDP(copy.deepcopy(base), device_ids=ids(device), find_unused_parameters=find)
        train(ddp, X[mine], Y[mine], 3, False)            # warm-up
        dist.barrier()
        t0 = synced_clock(device)                       # the barrier is gloo's: it does not wait for the GPU
        train(ddp, X[mine], Y[mine], a.repeats, False)
        res[f"ms_per_step_find_unused_{find}"] = (synced_clock(device) - t0) / a.repeats * 1e3
    return res
# endregion


# region seeding
def spread(model):
    """Largest |difference| between any rank's parameters and rank 0's."""
    flats = gathered(parameters_to_vector(model.parameters()).detach())
    return max(max_abs_diff(f, flats[0]) for f in flats)


def seeding_case(a, rank, world, train_set, device):
    res = {}
    for name, seed in (("same_seed", a.seed), ("seed_plus_rank", a.seed + rank)):
        torch.manual_seed(seed)
        masks = gathered((F.dropout(torch.ones(1000, device=device), p=0.5) > 0).int())
        res[f"dropout_{name}_ranks_like_rank0"] = sum(torch.equal(m, masks[0]) for m in masks[1:])
    for name, seed in (("same_seed", a.seed), ("seed_per_rank", a.seed + rank)):
        mine = list(DistributedSampler(train_set, world, rank, shuffle=True, seed=seed))
        reads = torch.cat(gathered(torch.tensor(mine, device=device))).tolist()
        res[f"sampler_{name}"] = {"read": len(reads), "distinct": len(set(reads)),
                                  "missed": len(train_set) - len(set(reads))}
    torch.manual_seed(a.seed + rank)                    # the mistake: a different initialisation per rank
    model = make_mlp(32, 1).to(device)
    before = spread(model)
    after = spread(DDP(model, device_ids=ids(device)))  # the constructor broadcasts rank 0's parameters
    res["init_max_diff_between_ranks"] = {"before_ddp": before, "after_ddp": after}
    return res
# endregion


# region clip
def clip_case(a, rank, world, X, Y, device):
    torch.manual_seed(a.seed)
    base, k, b = make_mlp(64, 2).to(device), a.micro_batches, a.per_rank_batch
    n, mine = b * world, slice(rank * b, (rank + 1) * b)
    xs, ys = X[mine].chunk(k), Y[mine].chunk(k)
    ref = copy.deepcopy(base)                           # one process: the global batch's mean gradient
    F.cross_entropy(ref(X[:n]), Y[:n]).backward()
    norm = clip_grad_norm_(ref.parameters(), a.max_norm).item()
    if norm <= a.max_norm:
        raise ValueError(f"--max-norm {a.max_norm} does not clip (the gradient's norm: {norm:.3f})")
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    res = {"grad_norm_one_process": norm, "max_norm": a.max_norm}
    for name in ("every_micro_batch", "after_sync"):
        ddp = DDP(copy.deepcopy(base), device_ids=ids(device))
        for i, (x, y) in enumerate(zip(xs, ys)):
            with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
                (F.cross_entropy(ddp(x), y) / k).backward()
            if name == "every_micro_batch":             # the mistake: local sums, before the all-reduce
                clip_grad_norm_(ddp.parameters(), a.max_norm)
        if name == "after_sync":                          # the fix: once, on the synchronised gradient
            clip_grad_norm_(ddp.parameters(), a.max_norm)
        torch.optim.SGD(ddp.parameters(), lr=0.1).step()
        mine, one = parameters_to_vector(ddp.parameters()), parameters_to_vector(ref.parameters())
        res[f"{name}_max_diff_vs_one_process"] = max_abs_diff(mine, one)
    return res
# endregion


def main():
    p = argparse.ArgumentParser(description="unused parameters, per-rank seeding and clipping under DDP")
    g = p.add_argument_group("cases and data")
    g.add_argument("--case", nargs="+", choices=["unused", "seeding", "clip"], default=["unused", "seeding", "clip"])
    g.add_argument("--per-rank-batch", type=int, default=32, help="digits per rank and step")
    g.add_argument("--steps", type=int, default=4, help="training steps of the unused-parameter runs")
    g.add_argument("--repeats", type=int, default=30, help="steps timed with and without the search")
    g.add_argument("--micro-batches", type=int, default=4, help="per rank, accumulated under no_sync")
    g.add_argument("--max-norm", type=float, default=0.1, help="clip_grad_norm_'s bound (must clip)")
    g.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        if not dist.is_initialized():                   # plain python: a one-process group for DDP
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rank, world = dist.get_rank(), dist.get_world_size()
        device, (train_set, _) = ctx.device, load_data()
        X, Y = (t.to(device) for t in train_set.tensors)
        X = X.flatten(1)                                # 8x8 images as 64 features
        if a.per_rank_batch * world > len(X) or a.per_rank_batch % a.micro_batches:
            raise ValueError(f"--per-rank-batch {a.per_rank_batch} x world size {world} must fit in {len(X)} digits "
                             f"and divide into --micro-batches {a.micro_batches}")
        out = {"world_size": world}
        cases = {"unused": lambda: unused_case(a, rank, world, X, Y, device),
                 "seeding": lambda: seeding_case(a, rank, world, train_set, device),
                 "clip": lambda: clip_case(a, rank, world, X, Y, device)}
        for name in a.case:
            out[name] = cases[name]()
        emit_result(out)


if __name__ == "__main__":
    main()
