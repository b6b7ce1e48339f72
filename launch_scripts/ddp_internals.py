"""What DDP does to gradients, checked and measured (notebooks/03_ddp.ipynb).

1. Equivalence: N ranks x batch b give the same gradients as 1 process x batch N*b (DDP averages).
2. no_sync: accumulate K micro-batches locally, all-reduce once; gradients equal the reference, and
   a hook counts the all-reduce calls (the forward must run inside no_sync, or DDP syncs anyway).
3. The classic mistake: loss * world_size gives world_size-times-too-large gradients.
4. Buckets: DDP all-reduces gradients in buckets of --bucket-cap-mb while backward still runs;
   a communication hook counts the buckets and bytes per step, and each step is timed.

Every rank computes the single-process reference on the full global batch itself (a bare copy of
the model) and the largest difference over all ranks is reported. `--dump FILE` saves rank 0's
gradients for the tests.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/ddp_internals.py
"""
import argparse
import contextlib
import copy
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.checks import exact_fp32, max_abs_diff
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import ddp_recording_buckets, make_mlp


def now(device):
    """perf_counter after the device's queued work is done (CUDA kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def norm(gs):
    return torch.sqrt(sum((g.double() ** 2).sum() for g in gs)).item()


def accumulate(ddp, xl, yl, k, forward_inside):
    """k micro-batches, all but the last under no_sync; forward_inside=False is the common bug."""
    mb = len(xl) // k
    for i in range(k):
        quiet = ddp.no_sync() if i < k - 1 and dist.is_initialized() else contextlib.nullcontext()
        if forward_inside:
            with quiet:                   # right: DDP decides during forward whether to sync
                loss = F.cross_entropy(ddp(xl[i * mb:(i + 1) * mb]), yl[i * mb:(i + 1) * mb]) / k
                loss.backward()
        else:
            loss = F.cross_entropy(ddp(xl[i * mb:(i + 1) * mb]), yl[i * mb:(i + 1) * mb]) / k
            with quiet:                   # wrong: forward already ran outside, backward still syncs
                loss.backward()


def bucket_sweep(model, x, y, caps, steps):
    """Time a DDP step for each bucket cap; the hook records each bucket's size (bytes)."""
    rows = []
    for cap in caps:
        ddp, sizes = ddp_recording_buckets(copy.deepcopy(model), cap, warm=(x, y))
        times = []
        for _ in range(steps):
            if dist.is_initialized():
                dist.barrier()
            t0 = now(x.device)
            F.cross_entropy(ddp(x), y).backward()
            times.append(now(x.device) - t0)
        per_step = len(sizes) // steps
        rows.append({"bucket_cap_mb": "default" if cap is None else cap,
                     "buckets_per_step": per_step,
                     "bucket_bytes": sizes[:per_step], "step_seconds": sorted(times)[steps // 2]})
    bare = copy.deepcopy(model)  # same step without any communication
    times = []
    for _ in range(steps):
        t0 = now(x.device)
        F.cross_entropy(bare(x), y).backward()
        times.append(now(x.device) - t0)
    return rows, sorted(times)[steps // 2]


def main():
    p = argparse.ArgumentParser(description="DDP gradient checks and bucket sweep")
    g = p.add_argument_group("checks")
    g.add_argument("--global-batch", type=int, default=64, help="must be divisible by world size x --micro-batches")
    g.add_argument("--micro-batches", type=int, default=2, help="micro-batches per rank for the no_sync check")
    g.add_argument("--width", type=int, default=256)
    g.add_argument("--layers", type=int, default=10)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dump", default="", help="rank 0 saves its gradients and the reference here (torch.save)")
    g = p.add_argument_group("bucket sweep")
    g.add_argument("--caps", default="0.1,0.5,2,default",
                   help="comma-separated bucket_cap_mb values (MiB), 'default' for DDP's own ('' to skip)")
    g.add_argument("--steps", type=int, default=5, help="timed steps per bucket size (median reported)")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank = ctx.world_size, ctx.rank
        if args.global_batch % (world * args.micro_batches):
            raise ValueError(f"--global-batch {args.global_batch} must be divisible by world size {world} "
                             f"x --micro-batches {args.micro_batches}")
        b = args.global_batch // world
        torch.manual_seed(args.seed)
        model = make_mlp(args.width, args.layers).to(ctx.device)
        x = torch.randn(args.global_batch, 64).to(ctx.device)         # same global batch on every rank
        y = torch.randint(0, 10, (args.global_batch,)).to(ctx.device)  # (drawn on CPU: same numbers on GPUs)
        xl, yl = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]  # this rank's shard

        ref = copy.deepcopy(model)                                   # 1 process x the global batch
        F.cross_entropy(ref(x), y).backward()
        g_ref = grads(ref)

        ddp, calls = ddp_recording_buckets(copy.deepcopy(model), warm=(xl, yl))      # 1. N ranks x batch b
        F.cross_entropy(ddp(xl), yl).backward()
        g_ddp, per_step = grads(ddp), len(calls)

        acc, acc_calls = ddp_recording_buckets(copy.deepcopy(model), warm=(xl, yl))  # 2. no_sync accumulation
        accumulate(acc, xl, yl, args.micro_batches, forward_inside=True)
        g_acc = grads(acc)
        bug, bug_calls = ddp_recording_buckets(copy.deepcopy(model), warm=(xl, yl))  # ... forward outside no_sync
        accumulate(bug, xl, yl, args.micro_batches, forward_inside=False)

        bad, _ = ddp_recording_buckets(copy.deepcopy(model))                          # 3. the mistake
        (F.cross_entropy(bad(xl), yl) * world).backward()
        g_bad = grads(bad)

        diffs = torch.tensor([max_abs_diff(g_ddp, g_ref), max_abs_diff(g_acc, g_ref)], device=ctx.device)
        if dist.is_initialized():
            dist.all_reduce(diffs, op=dist.ReduceOp.MAX)            # worst rank
        if args.dump and ctx.is_main:
            torch.save({"ddp": g_ddp, "accum": g_acc, "ref": g_ref, "scaled": g_bad}, args.dump)

        caps = [None if c.strip() == "default" else float(c) for c in args.caps.split(",") if c.strip()]
        rows, compute_s = bucket_sweep(model, xl, yl, caps, args.steps) if caps else ([], 0.0)
        n_params = sum(p.numel() for p in model.parameters())
        ctx.log(f"max |grad_ddp - grad_ref| = {diffs[0]:.2e}, no_sync: {diffs[1]:.2e},\n  "
                f"loss x world_size: grad norm ratio {norm(g_bad) / norm(g_ref):.3f}")
        emit_result({"world_size": world, "global_batch": args.global_batch, "local_batch": b,
                     "micro_batches": args.micro_batches, "params": n_params,
                     "allreduce_calls": {"one_step": per_step, "no_sync": len(acc_calls),
                                         "no_sync_forward_outside": len(bug_calls)}, "grad_bytes": n_params * 4,
                     "max_diff_ddp": diffs[0].item(), "max_diff_no_sync": diffs[1].item(),
                     "scaled_loss_grad_ratio": norm(g_bad) / norm(g_ref),
                     "buckets": rows, "compute_only_seconds": compute_s})


if __name__ == "__main__":
    main()
