"""Do larger batches converge faster? Steps and seconds to a target accuracy across global batch sizes
(notebooks/10_case_studies.ipynb).

For every global batch B of --global-batches, an MLP (make_mlp(--width, 1)) trains on the digits with plain SGD
at each learning rate of --lrs and each of --seeds seeds, until its test accuracy first reaches --target (checked
after every step) or --max-steps pass. Steps to target for B = the fewest over the learning rates (the best rate
for each batch size, as Shallue et al. 2019 measure it), then the median over seeds. After the first rate, a run
stops as soon as it needs more steps than the best so far for its (B, seed), so a worse rate costs little; each
rank tries the rates outwards from its previous run's best rate (the batches grow), so the best usually comes first.

A data-parallel step at global batch B computes the same update as one process at B (lesson 03 proved it), so
each run trains in one process; the ranks share the runs (a sweep is the other way to keep many GPUs busy: one
run per device) and rank 0 gathers them. Seconds per step are each run's median step (training only, not the
test evaluation), so they time this device at batch B, not a data-parallel job.

Rank 0 fits McCandlish et al. (2018)'s model S(B) = S_min (1 + B_crit / B) to the medians
(mgpu_utils.costs.scaling.fit_critical_batch; "fit" holds "error" where the steps do not fall with B) and
prints one JSON line. Any world size, including 1.
    torchrun --standalone --nproc-per-node 4 launch_scripts/batch_size_sweep.py
"""
import argparse
import itertools
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.costs.scaling import fit_critical_batch
from mgpu_utils.data import load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import make_mlp


# region sweep-run
def steps_to_target(data, test, batch, lr, seed, target, cap, width):
    """Train until the test accuracy reaches target: (steps, median s per step), or (None, s)."""
    (X, Y), (Xt, Yt) = data, test
    torch.manual_seed(seed)
    model = make_mlp(width, 1).to(X.device)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    order = torch.Generator().manual_seed(seed)          # the same data order for every rate
    perm, pos, step_s = torch.randperm(len(X), generator=order), 0, []
    for step in range(1, cap + 1):
        if pos + batch > len(X):                          # a new epoch: reshuffle, drop the remainder
            perm, pos = torch.randperm(len(X), generator=order), 0
        idx = perm[pos:pos + batch].to(X.device)
        pos += batch
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
        if X.is_cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        with torch.no_grad():
            if (model(Xt).argmax(1) == Yt).float().mean().item() >= target:
                return step, statistics.median(step_s)
    return None, statistics.median(step_s)


def best_over_rates(data, test, batch, seed, a, first=0):
    """Fewest steps to target over the learning rates (a tie: the earlier rate of a.lrs).

    The rates are tried from a.lrs[first] outwards, and each run is capped at the best so far,
    so a worse rate costs little."""
    best = {"steps": None, "lr": None, "step_s": None, "index": None}
    for i in sorted(range(len(a.lrs)), key=lambda i: (abs(i - first), -i)):
        # a rate later in a.lrs must beat the best; an earlier one wins a tie
        cap = best["steps"] - (i > best["index"]) if best["steps"] else a.max_steps
        steps, step_s = steps_to_target(data, test, batch, a.lrs[i], seed, a.target, cap, a.width)
        if steps is not None:
            best = {"steps": steps, "lr": a.lrs[i], "step_s": step_s, "index": i}
    return best
# endregion


def main():
    p = argparse.ArgumentParser(description="steps and seconds to a target accuracy per global batch size")
    g = p.add_argument_group("sweep")
    g.add_argument("--global-batches", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256, 512])
    g.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.2, 0.4, 0.8, 1.6],
                   help="SGD learning rates tried for every batch size (the best one counts)")
    g.add_argument("--seeds", type=int, default=3, help="runs per (batch, rate); the median counts")
    g.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    g.add_argument("--max-steps", type=int, default=1000, help="a run that needs more counts as failed")
    g.add_argument("--width", type=int, default=64, help="hidden width of the one-hidden-layer MLP")
    a = p.parse_args()
    if min(a.global_batches) < 1 or a.seeds < 1 or not 0 < a.target <= 1 or not a.lrs:
        raise SystemExit("need batch sizes >= 1, --seeds >= 1, 0 < --target <= 1 and at least one rate")

    with distributed() as ctx:
        torch.set_num_threads(1)                          # one run per rank; ranks share the cores
        train_set, test_set = load_data()
        if max(a.global_batches) > len(train_set):
            raise SystemExit(f"--global-batches: at most {len(train_set)} (the training set), got "
                             f"{max(a.global_batches)}")
        data = tuple(t.flatten(1) if t.dim() > 1 else t for t in train_set.tensors)
        test = tuple(t.flatten(1) if t.dim() > 1 else t for t in test_set.tensors)
        data, test = (tuple(t.to(ctx.device) for t in d) for d in (data, test))
        jobs = list(itertools.product(a.global_batches, range(a.seeds)))
        mine, first = [], 0
        for b, s in jobs[ctx.rank::ctx.world_size]:      # the batches grow: start at the last best rate
            mine.append((b, s, best_over_rates(data, test, b, s, a, first)))
            first = mine[-1][2]["index"] if mine[-1][2]["steps"] else first
        everyone = [mine]
        if dist.is_initialized():
            everyone = [None] * ctx.world_size
            dist.all_gather_object(everyone, mine)
        runs = [r for per_rank in everyone for r in per_rank]

        rows = []
        for b in a.global_batches:
            got = [r for bb, _, r in runs if bb == b]
            ok = [r for r in got if r["steps"] is not None]
            if len(ok) < len(got):
                raise SystemExit(f"batch {b}: {len(got) - len(ok)} of {len(got)} seeds never reached "
                                 f"{a.target:.0%} in {a.max_steps} steps; raise --max-steps or widen --lrs")
            steps = statistics.median(r["steps"] for r in ok)
            step_s = statistics.median(r["step_s"] for r in ok)
            rows.append({"global_batch": b, "steps": steps, "examples": steps * b,
                         "epochs": steps * b / len(train_set), "step_s": step_s,
                         "seconds": steps * step_s, "lrs": [r["lr"] for r in ok],
                         "steps_per_seed": [r["steps"] for r in ok]})
        try:
            fit = fit_critical_batch([r["global_batch"] for r in rows], [r["steps"] for r in rows])
            ctx.log(f"{len(runs)} runs on {ctx.world_size} rank(s); B_crit = {fit['b_crit']:.1f}, "
                    f"S_min = {fit['s_min']:.1f} steps")
        except ValueError as e:                           # e.g. a target so easy that every B needs 1 step
            fit = {"error": str(e)}
            ctx.log(f"{len(runs)} runs on {ctx.world_size} rank(s); no fit: {e}")
        emit_result({"world_size": ctx.world_size, "device": str(ctx.device), "target": a.target,
                     "train_images": len(train_set), "lrs": a.lrs, "seeds": a.seeds,
                     "rows": rows, "fit": fit})


if __name__ == "__main__":
    main()
