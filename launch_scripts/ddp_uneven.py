"""Uneven data under DDP: ranks with different numbers of batches, and evaluation with DistributedSampler's
padding (notebooks/03_ddp.ipynb).

  --case join   rank r has --batches + r batches (the last rank the most). Inside Join([ddp]), a rank that
                ran out shadows the others' all-reduces with zeros until every rank is done; the gradients
                stay divided by the world size. The parameters equal one process's replay of the same steps
                (each step: the sum of the gradients of the ranks that still had a batch, over the world
                size), on every rank.
  --case hang   the same without Join: rank 0 runs out first and goes on to other work (here it sleeps); the
                others wait in the all-reduce of their next batch until the collective timeout (--timeout
                seconds): an error naming the wait, not a hang.
  --case eval   accuracy on --eval-size digits with DistributedSampler (shuffle off): it pads every rank to
                the same count by repeating samples, so all-reducing (correct, count) counts some digits
                twice. The fix: gather each rank's (index, correct) and count each index once: equal to one
                process's accuracy.

Without torchrun the script makes a one-process gloo group (world size 1). Rank 0 prints one JSON line.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/ddp_uneven.py --case join eval
"""
import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DistributedSampler

from mgpu_utils.checks import exact_fp32, max_abs_diff
from mgpu_utils.data import load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import make_mlp


def batches_of(rank, a, X, Y):
    """Rank r's --batches + r batches of --per-rank-batch digits (disjoint across ranks and steps)."""
    out, start = [], sum(a.batches + q for q in range(rank)) * a.per_rank_batch
    for i in range(a.batches + rank):
        s = slice(start + i * a.per_rank_batch, start + (i + 1) * a.per_rank_batch)
        out.append((X[s], Y[s]))
    return out


# region join
def train_uneven(a, rank, world, X, Y, device, use_join):
    torch.manual_seed(a.seed)
    base = make_mlp(64, 1).to(device)
    ddp = DDP(copy.deepcopy(base), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    mine = batches_of(rank, a, X, Y)
    if use_join:
        with Join([ddp]):                             # ranks that ran out shadow the others' all-reduces
            for x, y in mine:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
    else:
        for x, y in mine:                             # a rank with more batches waits for rank 0 ...
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        time.sleep(3 * a.timeout)                     # ... who went on to work without collectives
    ref = copy.deepcopy(base)                           # one process replays every step
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    every_rank = [batches_of(r, a, X, Y) for r in range(world)]
    for step in range(a.batches + world - 1):         # the ranks that still have a batch, over the world size
        ref_opt.zero_grad(set_to_none=True)
        losses = [F.cross_entropy(ref(b[step][0]), b[step][1]) for b in every_rank if step < len(b)]
        (sum(losses) / world).backward()
        ref_opt.step()
    flat = parameters_to_vector(ddp.parameters()).detach()
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    return {"batches_per_rank": [a.batches + r for r in range(world)],
            "max_diff_vs_one_process": max_abs_diff(flat, parameters_to_vector(ref.parameters())),
            "same_on_every_rank": all(torch.equal(flat, f) for f in every)}
# endregion


# region eval
def evaluate(a, rank, world, X, Y, device):
    torch.manual_seed(a.seed)
    model, n = make_mlp(64, 1).to(device), a.eval_size   # untrained: about one digit in ten is right
    with torch.no_grad():
        right_one = (model(X[:n]).argmax(1) == Y[:n]).long()      # one process, every digit once
        idx = list(DistributedSampler(range(n), world, rank, shuffle=False))   # padded to ceil(n / W)
        idx = torch.tensor(idx, device=device)
        right = (model(X[idx]).argmax(1) == Y[idx]).long()
    counts = torch.stack([right.sum(), torch.tensor(len(idx), device=device)])
    dist.all_reduce(counts)                             # the usual way: sum of correct / sum of count
    pairs = [torch.empty(2, len(idx), dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(pairs, torch.stack([idx, right]))   # the fix: each digit counted once, by its index
    once = dict(zip(*torch.cat(pairs, 1).tolist()))
    return {"eval_size": n, "samples_counted": counts[1].item(), "padded": counts[1].item() - n,
            "accuracy_one_process": right_one.sum().item() / n,
            "accuracy_summed": counts[0].item() / counts[1].item(),
            "accuracy_deduplicated": sum(once.values()) / len(once), "distinct_counted": len(once)}
# endregion


def main():
    p = argparse.ArgumentParser(description="uneven batches (Join) and padded evaluation under DDP")
    g = p.add_argument_group("cases and data")
    g.add_argument("--case", nargs="+", choices=["join", "hang", "eval"], default=["join", "eval"])
    g.add_argument("--per-rank-batch", type=int, default=16, help="digits per batch (every rank)")
    g.add_argument("--batches", type=int, default=3, help="batches of rank 0; rank r has r more")
    g.add_argument("--eval-size", type=int, default=101, help="digits evaluated (not a multiple of the world size)")
    g.add_argument("--timeout", type=float, default=5.0, help="collective timeout in seconds")
    g.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    with distributed(timeout_s=a.timeout) as ctx, exact_fp32():   # TF32 off: results are compared
        if not dist.is_initialized():                   # plain python: a one-process group for DDP
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rank, world, device = dist.get_rank(), dist.get_world_size(), ctx.device
        if "hang" in a.case and world < 2:
            raise ValueError("--case hang needs ranks with different numbers of batches: "
                             "torchrun --standalone --nproc-per-node 2 (or more)")
        train_set, _ = load_data()
        X, Y = (t.to(device) for t in train_set.tensors)
        X = X.flatten(1)                                # 8x8 images as 64 features
        need = sum(a.batches + r for r in range(world)) * a.per_rank_batch
        if need > len(X) or a.eval_size > len(X):
            raise ValueError(f"{need} training digits (--per-rank-batch x batches of every rank) and --eval-size "
                             f"{a.eval_size} must each fit in {len(X)}: lower --per-rank-batch or --batches")
        out = {"world_size": world}
        for case in a.case:
            if case == "eval":
                out["eval"] = evaluate(a, rank, world, X, Y, device)
            else:
                out[case] = train_uneven(a, rank, world, X, Y, device, use_join=case == "join")
        emit_result(out)


if __name__ == "__main__":
    main()
