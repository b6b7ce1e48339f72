"""Gradient accumulation with no_sync, and activation checkpointing under DDP (notebooks/07_memory.ipynb).

Each rank takes its --global-batch / world_size digits and splits them into --micro-batches micro-batches
(loss divided by --micro-batches, so the accumulated gradient is the mean over the rank's samples):

  every     DDP all-reduces after every micro-batch's backward: --micro-batches rounds of all-reduces
  no_sync   the first --micro-batches - 1 micro-batches (forward and backward) under ddp.no_sync(): one round

A DDP communication hook counts the all-reduce calls and bytes of one optimizer step. Both give the
gradient of one process on the whole global batch (computed by every rank as the reference).

Checkpointing: the same MLP run by mgpu_utils.measure.memory.Checkpointed in segments of --segment-layers layers
(torch.utils.checkpoint, use_reentrant=False) under DDP: the gradients equal the reference, and the
bytes autograd saved (mgpu_utils.measure.memory.SavedTensorCounter) are reported per segment size.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/grad_accumulation.py
"""
import argparse
import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.checks import exact_fp32, max_abs_diff
from mgpu_utils.data import load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.measure.memory import SavedTensorCounter, checkpointed
from mgpu_utils.models import ddp_recording_buckets, make_mlp


def accumulate(ddp, x, y, k, use_no_sync):
    """k micro-batches of x; with use_no_sync all but the last run entirely inside ddp.no_sync()."""
    mb = len(x) // k
    for i in range(k):
        skip = use_no_sync and i < k - 1 and dist.is_initialized()
        quiet = ddp.no_sync() if skip else contextlib.nullcontext()
        with quiet:  # DDP decides during forward whether this backward all-reduces
            (F.cross_entropy(ddp(x[i * mb:(i + 1) * mb]), y[i * mb:(i + 1) * mb]) / k).backward()


def main():
    p = argparse.ArgumentParser(description="no_sync accumulation and checkpointing under DDP")
    g = p.add_argument_group("model and data")
    g.add_argument("--width", type=int, default=256)
    g.add_argument("--layers", type=int, default=8, help="hidden Linear+ReLU layers")
    g.add_argument("--global-batch", type=int, default=128, help="digits per optimizer step, all ranks")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("accumulation and checkpointing")
    g.add_argument("--micro-batches", type=int, default=4, help="micro-batches per rank per step")
    g.add_argument("--segment-layers", default="2,4,8",
                   help="comma-separated checkpoint segment sizes in layers (a Linear and a ReLU are 2 layers)")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if args.global_batch % (world * args.micro_batches):
            raise ValueError(f"--global-batch {args.global_batch} must be divisible by world size {world} "
                             f"x --micro-batches {args.micro_batches}: use --nproc-per-node 2, 4 or 8, or change --global-batch")
        train, _ = load_data()
        x, y = (t[:args.global_batch].clone().to(device) for t in train.tensors)
        x = x.flatten(1)
        b = args.global_batch // world
        xl, yl = x[rank * b:(rank + 1) * b].clone(), y[rank * b:(rank + 1) * b].clone()  # own storage
        torch.manual_seed(args.seed)
        base = make_mlp(args.width, args.layers).to(device)
        grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())

        ref = copy.deepcopy(base)                                    # 1 process x the global batch
        F.cross_entropy(ref(x), y).backward()
        g_ref = [p.grad for p in ref.parameters()]

        res, errs = {}, []
        for name, use_no_sync in (("every", False), ("no_sync", True)):
            ddp, sizes = ddp_recording_buckets(copy.deepcopy(base), warm=(xl, yl))     # hook records each bucket's bytes
            accumulate(ddp, xl, yl, args.micro_batches, use_no_sync)
            res[name] = {"allreduce_calls": len(sizes), "allreduce_bytes": sum(sizes)}
            errs.append(max_abs_diff([p.grad for p in ddp.parameters()], g_ref))

        ckpt = []
        for every in [0] + [int(e) for e in args.segment_layers.split(",") if e]:
            model = copy.deepcopy(base)
            ddp, _ = ddp_recording_buckets(checkpointed(model, every), warm=(xl, yl))
            with SavedTensorCounter(exclude=ddp.parameters()) as saved:
                loss = F.cross_entropy(ddp(xl), yl)
            loss.backward()
            errs.append(max_abs_diff([p.grad for p in ddp.parameters()], g_ref))
            ckpt.append({"every": every, "saved_bytes": saved.bytes, "saved_tensors": len(saved.records)})

        errs = torch.tensor(errs, device=device)
        if dist.is_initialized():
            dist.all_reduce(errs, op=dist.ReduceOp.MAX)              # worst rank
        ctx.log(f"all-reduce per step: every micro-batch {res['every']},\n  no_sync {res['no_sync']}; "
                f"max |grad - ref| {errs.max().item():.1e}")
        emit_result({"world_size": world, "backend": ctx.backend, "global_batch": args.global_batch,
                     "micro_batches": args.micro_batches, "micro_batch_size": b // args.micro_batches, "grad_bytes": grad_bytes,
                     "accumulation": res, "max_grad_diff_accumulation": errs[:2].max().item(),
                     "checkpointing": ckpt, "max_grad_diff_checkpointing": errs[2:].max().item()})


if __name__ == "__main__":
    main()
