"""Three ways to save a distributed job, timed; a sharded one loads on another world size (notebooks/12_fault_tolerance.ipynb).

--phase save (N ranks): an MLP trained a few Adam steps on the digits, saved three ways (seconds: the slowest rank's, median of --repeats):
  torch_save  DDP: rank 0 saves model and optimizer, a barrier, every rank loads it and compares with its replica.
  zero1       ZeroRedundancyOptimizer: state_dict() before consolidate_state_dict(to=0) raises (caught and
              reported); after it rank 0 saves; a fresh ZeRO-1 optimizer loaded from it takes the same next step.
  dcp         FSDP2 + torch.distributed.checkpoint: a file per rank plus metadata, the full state beside it
              as the reference; then dcp.async_save: how long the training loop is blocked.
--phase load (M ranks): dcp.load of the N-rank checkpoint into an FSDP2 model on M ranks (resharding) and
  set_state_dict; the gathered state against the reference (max_param_diff, max_optim_diff: expected 0).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/checkpoint_formats.py --phase save --ckpt-dir /tmp/ckpt && torchrun --standalone --nproc-per-node 2 launch_scripts/checkpoint_formats.py --phase load --ckpt-dir /tmp/ckpt
"""
import argparse
import shutil
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import check_optimizer_matches, exact_fp32, max_abs_diff
from mgpu_utils.launch.cluster import shared_folder
from mgpu_utils.data import load_data
from mgpu_utils.dist import device_mesh, distributed, emit_result, new_group
from mgpu_utils.models import make_mlp


def timed(fn, repeats, before=None):
    """(last return value of fn(), median over repeats of the slowest rank's seconds: a checkpoint is done
    when the last rank is); ``before()`` runs untimed before each repeat."""
    times, out = [], None
    for _ in range(repeats):
        before and before()
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return out, statistics.median(times)


def train(model, opt, x, y, steps):
    """``steps`` full-batch steps on (x, y)."""
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def full_state(model, opt):
    """(parameters, optimizer states), whole (FSDP shards gathered), on CPU, on rank 0 ({} on the others)."""
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def fresh_folder(path: Path, rank: int) -> None:
    """Rank 0 empties ``path`` (DCP warns before overwriting a checkpoint), and nobody writes before it has."""
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()


def sharded(args, ctx):
    """The seeded MLP, each Linear and then the whole of it under FSDP2 on every rank; its Adam."""
    torch.manual_seed(args.seed)
    model = make_mlp(args.width, args.layers).to(ctx.device)
    mesh = device_mesh(ctx.device.type, (ctx.world_size,))
    for part in [m for m in model if isinstance(m, nn.Linear)] + [model]:
        fully_shard(part, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)       # after fully_shard: the sharded parameters
    check_optimizer_matches(model, opt)
    return model, opt


def save_phase(args, ctx, x, y, r):
    rank, folder, path = ctx.rank, Path(args.ckpt_dir), Path(args.ckpt_dir) / "ddp.pt"
    xl, yl = x[rank::ctx.world_size].flatten(1), y[rank::ctx.world_size]          # this rank's share of the batch
    torch.manual_seed(args.seed)                          # 1. DDP: one file from rank 0
    ddp = DDP(make_mlp(args.width, args.layers).to(ctx.device))
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    train(ddp, opt, xl, yl, args.steps)

    def save_rank0():
        if rank == 0:
            torch.save({"model": ddp.module.state_dict(), "optim": opt.state_dict()}, path)
        dist.barrier()                                     # the file is complete before anyone reads it
    _, r["torch_save_s"] = timed(save_rank0, args.repeats)
    load = partial(torch.load, map_location=ctx.device, weights_only=True)
    loaded, r["torch_load_s"] = timed(lambda: load(path), args.repeats)
    worst = torch.tensor([max_abs_diff(loaded, {"model": ddp.module.state_dict(), "optim": opt.state_dict()})])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)          # every rank compared the file with its own replica
    r["torch_save_max_diff"] = worst.item()
    r["torch_save_bytes"] = path.stat().st_size
    # 2. ZeRO-1: consolidate, then save
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    train(ddp, zero, xl, yl, args.steps)
    r["zero1_error"] = None
    try:
        zero.state_dict()
    except RuntimeError as e:                             # the states of other ranks' partitions are not here
        r["zero1_error"] = str(e).splitlines()[0]
    path = folder / "zero1.pt"

    def consolidate_and_save():
        zero.consolidate_state_dict(to=0)                 # every rank sends its partition's states to rank 0
        if rank == 0:
            torch.save(zero.state_dict(), path)
        dist.barrier()
    _, r["zero1_save_s"] = timed(consolidate_and_save, args.repeats)
    params = [p.detach().clone() for p in ddp.parameters()]
    fresh = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    fresh.load_state_dict(load(path))                     # each rank keeps its own partition
    train(ddp, zero, xl, yl, 1)
    expected = [p.detach().clone() for p in ddp.parameters()]
    with torch.no_grad():                                 # back to before that step, then the fresh optimizer's step
        for p, q in zip(ddp.parameters(), params):
            p.copy_(q)
    train(ddp, fresh, xl, yl, 1)
    r["zero1_resume_max_diff"] = max(max_abs_diff(p.detach(), e) for p, e in zip(ddp.parameters(), expected))
    r["zero1_bytes"] = path.stat().st_size
    # 3. FSDP2 + DCP: every rank writes its own shards
    model, opt = sharded(args, ctx)
    train(model, opt, xl, yl, args.steps)
    # region dcp-save
    state = dict(zip(("model", "optim"), get_state_dict(model, opt)))   # this rank's shards (DTensors)
    _, r["dcp_save_s"] = timed(lambda: dcp.save(state, checkpoint_id=folder / "dcp"), args.repeats,
                               before=lambda: fresh_folder(folder / "dcp", rank))
    # endregion
    ref = full_state(model, opt)                          # on rank 0 (the other ranks get {})
    if rank == 0:
        torch.save(ref, folder / "reference.pt")
    r["dcp_files"] = sorted(p.name for p in (folder / "dcp").iterdir())
    r["dcp_bytes"] = sum(p.stat().st_size for p in (folder / "dcp").iterdir())
    # async_save runs the save's collectives in a background thread: on a group of their own, or they interleave
    # with this thread's collectives on the default group and the ranks hang (measured here: 1 run in 3)
    pending, group = [], new_group(backend="gloo")

    def wait_then_clear():                                # a real loop trains meanwhile, and waits before the next save
        pending and pending.pop().result()
        fresh_folder(folder / "dcp_async", rank)
    _, r["dcp_async_blocked_s"] = timed(lambda: pending.append(dcp.async_save(
        state, checkpoint_id=folder / "dcp_async", process_group=group)), args.repeats, wait_then_clear)
    pending.pop().result()


def load_phase(args, ctx, out):
    folder = Path(args.ckpt_dir)
    model, opt = sharded(args, ctx)
    state = dict(zip(("model", "optim"), get_state_dict(model, opt)))   # to fill (zero Adam states)
    _, out["dcp_load_s"] = timed(lambda: dcp.load(state, checkpoint_id=folder / "dcp"), args.repeats)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = full_state(model, opt)                          # gathered on rank 0
    if ctx.rank == 0:
        ref = torch.load(folder / "reference.pt", weights_only=False)
        out["max_param_diff"], out["max_optim_diff"] = max_abs_diff(got[0], ref[0]), max_abs_diff(got[1], ref[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("checkpoint")
    g.add_argument("--phase", choices=("save", "load"), required=True)
    g.add_argument("--ckpt-dir", required=True, help="checkpoint folder every rank sees: shared storage across nodes (checked at start)")
    g.add_argument("--repeats", type=int, default=3, help="timed saves/loads per format (median reported)")
    g = p.add_argument_group("model and training")
    g.add_argument("--width", type=int, default=512, help="hidden width of the MLP")
    g.add_argument("--layers", type=int, default=4, help="hidden layers")
    g.add_argument("--steps", type=int, default=3, help="Adam steps before the save (moments are not zero)")
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized():
            raise RuntimeError("checkpoint_formats.py needs a process group: run it under torchrun (any world size)")
        shared_folder(args.ckpt_dir, ctx.rank, ctx.world_size)   # every rank reads files rank 0 wrote
        x, y = (t.to(ctx.device) for t in load_data()[0][:256])   # (256, 1, 8, 8) digits, (256,) labels
        out = {"phase": args.phase, "world_size": ctx.world_size,
               "parameters": sum(t.numel() for t in make_mlp(args.width, args.layers).parameters())}
        if args.phase == "save":
            save_phase(args, ctx, x, y, out)
        else:
            load_phase(args, ctx, out)
        emit_result(out)


if __name__ == "__main__":
    main()
