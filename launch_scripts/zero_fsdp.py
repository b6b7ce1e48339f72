"""Memory per rank under DDP, ZeRO-1 and FSDP2 (ZeRO-2-like and ZeRO-3), measured (notebooks/07_memory.ipynb).

One Adam step of an MLP on real digits (--global-batch samples split over the ranks), in four modes:

  ddp       ZeRO stage 0: every rank holds all parameters, gradients and Adam states
  zero1     ZeroRedundancyOptimizer: Adam states sharded (each rank updates its parameters, then broadcasts)
  fsdp2     fully_shard(reshard_after_forward=False): gradients and states sharded, parameters stay
            gathered from forward to backward (stage-2-like at its peak)
  fsdp3     fully_shard(reshard_after_forward=True): parameters sharded too, gathered layer by layer

Per rank and mode, measured with mgpu_utils.measure.memory (storages of local tensors, DTensor.to_local()):
parameter bytes held at the end of forward, gradient bytes after backward, optimizer-state bytes
after the step, parameter bytes held after the step (params_sharded: FSDP has resharded them), and
on CUDA the allocator's peak during the mode's step (cuda_peak_bytes: torch.cuda.max_memory_allocated
above the bytes allocated before it, all-gather/reduce-scatter buffers and activations included).
Checks against a single-process reference (Adam on the full batch, computed by every rank): the
gradients (FSDP's sharded gradients gathered with full_tensor()) and the updated parameters, and the
worst rank's |gradient norm ratio - 1| (an averaging reduce-scatter that silently summed would make
the gradients world-size times too large).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/zero_fsdp.py
"""
import argparse
import copy
import gc

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import check_optimizer_matches, exact_fp32
from mgpu_utils.data import load_data
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.measure.memory import optimizer_tensors, tensor_bytes
from mgpu_utils.models import make_mlp

MODES = ("ddp", "zero1", "fsdp2", "fsdp3")
STAGE = {"ddp": 0, "zero1": 1, "fsdp2": 2, "fsdp3": 3}


def full(t):
    """The whole tensor on every rank: DTensor shards gathered (full_tensor), plain tensors as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def wrap(mode, model, device, lr, mesh):
    """(model, optimizer, local optimizer whose state this rank holds) for one mode."""
    if mode in ("ddp", "zero1"):
        ids = [device.index] if device.type == "cuda" else None
        if dist.is_initialized():  # gradients in DDP's buckets: no second copy of them
            model = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
        if mode == "ddp":
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            return model, opt, opt
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
        return model, opt, opt.optim  # .optim: this rank's local Adam over its partition
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=(mode == "fsdp3"))
    fully_shard(model, mesh=mesh, reshard_after_forward=(mode == "fsdp3"))
    opt = torch.optim.Adam(model.parameters(), lr=lr)    # after fully_shard: over the sharded parameters
    check_optimizer_matches(model, opt)
    return model, opt, opt


def one_step(mode, base, xl, yl, g_ref, p_ref, device, lr, mesh):
    """One Adam step of a copy of base in this mode: (this rank's measured bytes, tensor of errors).

    The wrapped model and optimizer live only inside this function, so they are freed before the
    next mode is measured.
    """
    if device.type == "cuda":                                   # the allocator's peak of this mode only
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    model, opt, local_opt = wrap(mode, copy.deepcopy(base), device, lr, mesh)
    loss = F.cross_entropy(model(xl), yl)
    params_fwd = tensor_bytes(model.parameters())               # what forward left gathered
    loss.backward()
    grads = [full(p.grad) for p in model.parameters()]
    grad_bytes = tensor_bytes(p.grad for p in model.parameters())
    opt.step()
    mine = {"params_after_forward": params_fwd, "params_sharded": tensor_bytes(model.parameters()),
            "grads": grad_bytes, "optimizer": tensor_bytes(optimizer_tensors(local_opt))}
    errs = torch.tensor([max((u - v).abs().max().item() for u, v in zip(grads, g_ref)),
                         max((full(p).detach() - q).abs().max().item()
                             for p, q in zip(model.parameters(), p_ref)),
                         # |ratio of gradient norms - 1|: 0 if averaged, world size - 1 if summed
                         abs(torch.stack([u.norm() for u in grads]).norm().item()
                             / torch.stack([v.norm() for v in g_ref]).norm().item() - 1)],
                        device=device)
    if device.type == "cuda":  # everything the step allocated at its peak, temporaries and buffers included
        torch.cuda.synchronize(device)
        mine["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    return mine, errs


def main():
    p = argparse.ArgumentParser(description="per-rank memory of DDP, ZeRO-1, FSDP2")
    g = p.add_argument_group("model and data")
    g.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    g.add_argument("--layers", type=int, default=9, help="hidden layers (64 -> width ... -> 10)")
    g.add_argument("--global-batch", type=int, default=64, help="digits per step, split over the ranks")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("modes")
    g.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        raise ValueError(f"unknown modes {sorted(set(modes) - set(MODES))}; choose from {MODES}")

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if args.global_batch % world:
            raise ValueError(f"--global-batch {args.global_batch} is not divisible by world size {world}: use "
                             f"--nproc-per-node 2, 4 or 8, or a --global-batch that {world} divides")
        if world == 1 and {"zero1", "fsdp2", "fsdp3"} & set(modes):
            ctx.log("world size 1: ZeRO/FSDP have nothing to shard over; running ddp only")
            modes = [m for m in modes if m == "ddp"]
        train, _ = load_data()
        x, y = (t[:args.global_batch].clone().to(device) for t in train.tensors)
        x = x.flatten(1)                                        # (B, 64) pixels
        b = args.global_batch // world
        xl, yl = x[rank * b:(rank + 1) * b].clone(), y[rank * b:(rank + 1) * b].clone()  # own storage
        torch.manual_seed(args.seed)
        base = make_mlp(args.width, args.layers).to(device)
        n_params = sum(p.numel() for p in base.parameters())

        ref = copy.deepcopy(base)                               # 1 process x the full batch
        F.cross_entropy(ref(x), y).backward()
        g_ref = [p.grad.clone() for p in ref.parameters()]
        torch.optim.Adam(ref.parameters(), lr=args.lr).step()
        p_ref = [p.detach().clone() for p in ref.parameters()]

        mesh = device_mesh(device.type, (world,)) if world > 1 else None
        out = {}
        for mode in modes:
            gc.collect()                                        # the previous mode's model is gone
            mine, errs = one_step(mode, base, xl, yl, g_ref, p_ref, device, args.lr, mesh)
            per_rank = [mine] * world
            if dist.is_initialized():
                dist.all_reduce(errs, op=dist.ReduceOp.MAX)     # worst rank
                dist.all_gather_object(per_rank, mine)
            ctx.log(f"{mode}: max |grad - ref| {errs[0]:.1e}, max |param - ref| after Adam {errs[1]:.1e}; "
                    f"bytes on rank 0:\n  " + ", ".join(f"{k} {v}" for k, v in mine.items()))
            out[mode] = {"zero_stage": STAGE[mode], "per_rank": per_rank, "max_grad_diff": errs[0].item(),
                         "max_param_diff": errs[1].item(), "max_grad_norm_ratio_error": errs[2].item()}
        emit_result({"world_size": world, "backend": ctx.backend, "device": device.type, "params": n_params,
                     "global_batch": args.global_batch, "width": args.width, "depth": args.layers, "modes": out})


if __name__ == "__main__":
    main()
