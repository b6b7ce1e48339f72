"""Local SGD (periodic parameter averaging every H steps) on digits, for several H, in one launch
(notebooks/09_sync_vs_async.ipynb).

Every rank trains its own copy of lesson 09's small MLP (mgpu_utils.models.make_mlp(128, 1, flatten=True))
on its own shard with plain SGD (--lr per local step of --per-rank-batch samples); every H steps the ranks average their parameters with one
all-reduce. H=1 is synchronous data parallelism: averaging the parameters after one step from the same
parameters equals one step with the averaged gradient. With --with-sync a last run, "sync", all-reduces the gradients
every step (the reference for H=1). Between runs the model restarts from the same initial parameters.

Communication is counted, not guessed: each averaging is one all-reduce of 4 x P bytes (fp32), which
a ring moves as 2(n-1)/n x 4P bytes per rank. Parameter snapshots after an averaging (every
--eval-every steps, a multiple of every H) are scored on the test set after the run.

DiLoCo (Douillard et al. 2023, --diloco H ...): the same local steps, but every H steps the averaged change of
the parameters is treated as a gradient for an outer optimizer (SGD with Nesterov momentum, --outer-lr,
--outer-momentum) that updates the shared parameters; with outer lr 1 and momentum 0 it is local SGD exactly.
The communication is the same one all-reduce every H steps.

Rank 0 prints JSON: per H, accuracy curve, all-reduce count, payload bytes and ring bytes per rank,
seconds, time inside all-reduce. --dump PATH: rank 0 saves {run: final flat parameters} (tests).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/local_sgd.py --H 1 4 16
"""
import argparse
import itertools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
from mgpu_utils.models import make_mlp
from mgpu_utils.timing import synced_clock


def train_run(model, theta0, X, Y, batches, H, lr, world, eval_every, outer=None):
    """Local SGD with averaging every H steps (H=0: all-reduce gradients every step). ``outer``:
    (lr, momentum) of DiLoCo's outer Nesterov step on the averaged change, instead of the average.

    Returns (snapshots [(step, seconds, theta)], all-reduce calls, all-reduce seconds, seconds)."""
    with torch.no_grad():
        vector_to_parameters(theta0.clone(), model.parameters())
    params = list(model.parameters())
    shared, buf = theta0.clone(), torch.zeros_like(theta0)   # DiLoCo: the outer parameters, momentum
    calls, comm_s, snaps = 0, 0.0, [(0, 0.0, theta0.clone())]
    t0 = synced_clock(X.device)
    for step, idx in enumerate(batches, start=1):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        with torch.no_grad():
            if H == 0:                                    # synchronous: average the gradient, then step
                g = torch.cat([p.grad.reshape(-1) for p in params])
                tc = synced_clock(g.device)               # backward done before the clock starts
                if dist.is_initialized():
                    dist.all_reduce(g)
                comm_s, calls = comm_s + synced_clock(g.device) - tc, calls + 1   # NCCL: wait for the GPU
                vector_to_parameters(parameters_to_vector(params) - lr * g / world, params)
            else:                                         # local step ...
                for p in params:
                    p.sub_(lr * p.grad)
                if step % H == 0:                         # ... and every H steps average the parameters
                    theta = parameters_to_vector(params)
                    tc = synced_clock(theta.device)
                    if dist.is_initialized():
                        dist.all_reduce(theta)
                    comm_s, calls = comm_s + synced_clock(theta.device) - tc, calls + 1
                    if outer is None:
                        vector_to_parameters(theta / world, params)
                    else:                                 # DiLoCo: an outer SGD step, Nesterov momentum,
                        # region diloco
                        delta = shared - theta / world    # the "outer gradient": how far the mean moved
                        buf.mul_(outer[1]).add_(delta)
                        shared -= outer[0] * (delta + outer[1] * buf)
                        vector_to_parameters(shared, params)
                        # endregion
        if step % eval_every == 0 or step == len(batches):
            theta = parameters_to_vector(params).detach().cpu().clone()   # waits for the device
            snaps.append((step, time.perf_counter() - t0, theta))
    return snaps, calls, comm_s, synced_clock(X.device) - t0


def main():
    p = argparse.ArgumentParser(description="local SGD: average every H steps")
    g = p.add_argument_group("training")
    g.add_argument("--H", type=int, nargs="+", default=[1, 4, 16], help="averaging periods to compare")
    g.add_argument("--steps", type=int, default=96, help="local steps per rank (a multiple of every H)")
    g.add_argument("--per-rank-batch", type=int, default=16, help="per rank and step")
    g.add_argument("--lr", type=float, default=0.3, help="plain SGD learning rate of every local step")
    g.add_argument("--eval-every", type=int, default=16, help="steps between snapshots (a multiple of every H)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--with-sync", action="store_true", help="also run 'sync' (gradient all-reduce every step)")
    g.add_argument("--diloco", type=int, nargs="*", default=[], help="H values also run with DiLoCo's outer step")
    g.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo: outer learning rate (1 with momentum 0: "
                   "local SGD)")
    g.add_argument("--outer-momentum", type=float, default=0.9, help="DiLoCo: outer Nesterov momentum")
    g.add_argument("--dump", default="", help="rank 0 saves {run: final flat parameters} here (tests)")
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if any(h < 1 or a.steps % h or a.eval_every % h for h in a.H):
            raise ValueError(f"every H must be >= 1 and divide --steps ({a.steps}) and --eval-every "
                             f"({a.eval_every}), got {a.H}: snapshots are taken right after an averaging")
        if world == 1:
            ctx.log("world size 1: every H gives the same single-process SGD (start with torchrun "
                    "--nproc-per-node 4 to see the differences)")
        train, test = load_data()
        X, Y = (t.to(device) for t in train.tensors)
        Xt, Yt = (t.to(device) for t in test.tensors)
        torch.manual_seed(a.seed)
        model = make_mlp(128, 1, flatten=True).to(device)
        theta0 = parameters_to_vector(model.parameters()).detach().clone()
        P = theta0.numel()
        batches = list(itertools.islice(batch_stream(train, world, rank, a.per_rank_batch, a.seed), a.steps))
        runs, finals = {}, {}
        if any(h < 1 or a.steps % h or a.eval_every % h for h in a.diloco):
            raise ValueError(f"every --diloco H must be >= 1 and divide --steps and --eval-every, got {a.diloco}")
        plan = [(H, None) for H in [*a.H, *([0] if a.with_sync else [])]] + \
            [(H, (a.outer_lr, a.outer_momentum)) for H in a.diloco]
        for H, outer in plan:
            name = f"DiLoCo H={H}" if outer else f"H={H}" if H else "sync"
            if dist.is_initialized():
                dist.barrier()
            snaps, calls, comm_s, sec = train_run(model, theta0, X, Y, batches, H, a.lr,
                                                 world if dist.is_initialized() else 1, a.eval_every, outer)
            curve = []
            with torch.no_grad():
                for step, s, theta in snaps:
                    vector_to_parameters(theta.to(device), model.parameters())
                    curve.append((step, s, (model(Xt).argmax(1) == Yt).float().mean().item()))
            runs[name] = {"H": H, "outer": outer, "curve": curve, "final_acc": curve[-1][2], "allreduce_calls": calls,
                          "payload_bytes": calls * 4 * P,
                          "ring_bytes_per_rank": calls * ring_bytes_per_rank(4 * P, world),
                          "seconds": sec, "allreduce_seconds": comm_s}
            finals[name] = snaps[-1][2]
            ctx.log(f"{name:>12}: {calls:3d} all-reduces, test acc {curve[-1][2]:.3f}, {sec:.2f} s")
        if a.dump and ctx.is_main:
            torch.save(finals, a.dump)
        if dist.is_initialized():
            dist.barrier()
        emit_result({"world_size": world, "backend": ctx.backend, "params": P, "steps": a.steps,
                     "per_rank_batch": a.per_rank_batch, "lr": a.lr, "runs": runs})


if __name__ == "__main__":
    main()
