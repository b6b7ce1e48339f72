"""A rank dies, torchrun restarts the job, and it resumes exactly (notebooks/12_fault_tolerance.ipynb).

DDP training of a small MLP with dropout on the digits, each rank its shard of every global batch; SGD
with momentum, StepLR. Every --snapshot-every steps rank 0 writes a snapshot atomically (temporary file,
fsync, os.replace: a crash leaves the previous one): model, optimizer, scheduler, step, position in the
data, every rank's RNG states (CPU, and cuda's: dropout). Every rank resumes from it on start.
Faults, on the first attempt only (TORCHELASTIC_RESTART_COUNT = 0): --kill-rank R --kill-step S sends rank R
SIGKILL before step S (OOM killer, hardware fault); torchrun stops the others and, with --max-restarts >= 1,
starts all again. --hang-rank/--hang-step: a rank sleeps, the collective timeout turns it into an error.
--drop PART leaves a part out of the snapshot; --resume-at S stops before step S and resumes in the same
processes as a restart would (lesson 12 compares the parts so). At the end the same job runs uninterrupted
and rank 0 reports max_param_diff_vs_uninterrupted and the batches trained twice. On Slurm (job.sbatch)
the folder is $MGPU_CKPT_DIR; a file STOP in it (the time-limit signal) stops all ranks after one step with
a snapshot, and the job requeues itself. (The variable below: mgpu_utils.launch.launcher.)

Run:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 4 --max-restarts 1 launch_scripts/elastic_train.py --ckpt-dir /tmp/snap --kill-rank 1 --kill-step 13
"""
import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import exact_fp32
from mgpu_utils.launch.cluster import mark_stopped, shared_folder, stop_requested
from mgpu_utils.data import load_data, shard_batches
from mgpu_utils.dist import distributed, emit_result

PARTS = ("optimizer", "scheduler", "sampler", "rng")


def make_job(args, device):
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=args.lr_step, gamma=0.5)
    return model, opt, sched


def save_snapshot(path: Path, state: dict) -> None:
    """torch.save to a temporary file beside ``path``, flushed, then renamed onto it atomically;
    the folder flushed too (a power loss keeps complete data). Killed saves' files go first."""
    for stale in path.parent.glob(path.name + ".tmp*"):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state(device):
    """This rank's random state: the CPU generator, and on a GPU the device's generator (dropout on cuda)."""
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def train(args, ctx, snapshot: Path | None, attempt: int, stop_at: int = -1):
    """Train args.steps steps; with a snapshot path, resume from it and write it every args.snapshot_every steps;
    return before step ``stop_at`` if it is reached. Returns (model, info)."""
    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    model, opt, sched = make_job(args, device)            # the same initial weights on every rank
    torch.manual_seed(args.seed + 1000 * rank)            # then each rank its own dropout stream
    ddp = DDP(model) if dist.is_initialized() else model
    train_set, _ = load_data()
    step, epoch, pos, seen, resumed_from, save_s, saved_world, stopped = 0, 0, 0, [], None, [], None, None
    # region resume
    if snapshot is not None and snapshot.exists():
        s = torch.load(snapshot, map_location="cpu", weights_only=False)
        model.load_state_dict(s["model"])
        step, seen, resumed_from = s["step"], s["seen"], s["step"]
        saved_world = s.get("world_size", world)
        if "optimizer" in s:
            opt.load_state_dict(s["optimizer"])
        if "scheduler" in s:
            sched.load_state_dict(s["scheduler"])
        if "sampler" in s:
            epoch, pos = s["sampler"]
        else:                                              # without it: the epoch starts over
            epoch, pos = step // args.steps_per_epoch, 0
        if saved_world != world:         # elastic: the global batch stays, each rank's share changes
            ctx.log(f"snapshot of {saved_world} rank(s), now {world}: per-rank batch "
                    f"{args.global_batch // saved_world} -> {args.global_batch // world};\n"
                    f"  the RNG states are per rank and are not restored")
        elif "rng" in s:
            cpu, gpu = s["rng"][rank]
            torch.set_rng_state(cpu)
            if gpu is not None:
                torch.cuda.set_rng_state(gpu, device)
    # endregion
    while step < args.steps and step != stop_at and stopped is None:
        batches = shard_batches(train_set, world, rank, epoch, args.global_batch // world, args.seed)[:args.steps_per_epoch]
        while pos < len(batches) and step < args.steps and step != stop_at and stopped is None:
            if snapshot is not None and attempt == 0 and rank == args.kill_rank and step == args.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)      # no Python error, no cleanup: a hardware fault
            if snapshot is not None and attempt == 0 and rank == args.hang_rank and step == args.hang_step:
                time.sleep(3600)                          # a hung rank: its peers wait in the all-reduce
            if args.step_seconds and snapshot is not None:
                time.sleep(args.step_seconds)             # a longer step: time to stop a node mid-run
            x, y = (t.to(device) for t in train_set[batches[pos]])
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            sched.step()
            seen.append((epoch, pos))
            step, pos = step + 1, pos + 1
            stopping = snapshot is not None and stop_requested(snapshot.parent)
            # region snapshot
            if snapshot is not None and (step % args.snapshot_every == 0 or stopping):
                t0 = time.perf_counter()
                rngs = [None] * world
                if dist.is_initialized():
                    dist.all_gather_object(rngs, rng_state(device))
                else:
                    rngs = [rng_state(device)]
                if rank == 0:
                    state = {"model": model.state_dict(), "step": step, "seen": seen,
                             "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                             "sampler": (epoch, pos), "rng": rngs, "world_size": world}
                    for part in args.drop:
                        state.pop(part)
                    save_snapshot(snapshot, state)
                    if args.log_snapshots:
                        ctx.log(f"snapshot at step {step} (world size {world})")
                if dist.is_initialized():
                    dist.barrier()                        # nobody runs ahead of a snapshot being written
                save_s.append(time.perf_counter() - t0)
            # endregion
            stopped = step if stopping else None
        epoch, pos = epoch + 1, 0
    info = {"resumed_from_step": resumed_from, "snapshot_world_size": saved_world, "lr_at_end": sched.get_last_lr()[0],
            "batches_trained_twice": len(seen) - len(set(seen)), "snapshot_seconds": save_s, "stopped_at_step": stopped}
    return model, info


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("snapshot")
    g.add_argument("--ckpt-dir", default=os.environ.get("MGPU_CKPT_DIR"), required="MGPU_CKPT_DIR" not in os.environ,
                   help="folder for the snapshot (created if missing; default: $MGPU_CKPT_DIR, set by job.sbatch)")
    g.add_argument("--snapshot-every", type=int, default=5, help="snapshot every this many steps")
    g.add_argument("--drop", nargs="*", default=[], choices=PARTS, help="parts left out of the snapshot")
    g.add_argument("--log-snapshots", action="store_true", help="rank 0 prints a line at every snapshot")
    g.add_argument("--resume-at", type=int, default=-1,
                   help="stop before this step and resume from the snapshot in the same processes")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=30)
    g.add_argument("--global-batch", type=int, default=64, help="global batch, divisible by the world size")
    g.add_argument("--steps-per-epoch", type=int, default=8, help="batches per epoch (a short epoch: several epochs)")
    g.add_argument("--lr", type=float, default=0.1)
    g.add_argument("--lr-step", type=int, default=6, help="StepLR: halve the learning rate every this many steps")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dropout", type=float, default=0.2, help="0: no per-rank randomness (resume on another world size exactly)")
    g.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long in every step (a slower job)")
    g = p.add_argument_group("failure injection")
    for flag in ("--kill-rank", "--kill-step", "--hang-rank", "--hang-step"):
        g.add_argument(flag, type=int, default=-1)
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        if args.global_batch % ctx.world_size:
            raise ValueError(f"--global-batch {args.global_batch} is not divisible by the world size {ctx.world_size}: "
                             f"use a multiple of {ctx.world_size}")
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        snapshot = shared_folder(args.ckpt_dir, ctx.rank, ctx.world_size) / "snapshot.pt"   # all ranks read it
        if attempt > 0:
            ctx.log(f"attempt {attempt}: resuming from {snapshot.name}" if snapshot.exists() else
                    f"attempt {attempt}: no snapshot yet, starting over")
        if args.resume_at >= 0 and attempt == 0:
            train(args, ctx, snapshot, attempt, stop_at=args.resume_at)   # stopped, then resumed as a restart would
            attempt = 1
        model, info = train(args, ctx, snapshot, attempt)
        if info["stopped_at_step"] is not None:            # the job ends here; its next run resumes
            mark_stopped(snapshot.parent, ctx.rank)         # job.sbatch requeues the job
            ctx.log(f"stopped after step {info['stopped_at_step']} at a snapshot, for a requeue")
            emit_result({"world_size": ctx.world_size, "steps": args.steps, **info})
            return
        reference, _ = train(args, ctx, None, attempt)     # the same job, uninterrupted
        diff = max((a - b).abs().max().item() for a, b in zip(model.state_dict().values(),
                                                              reference.state_dict().values()))
        ctx.log(f"resumed from step {info['resumed_from_step']}; max |param - uninterrupted| = {diff:.1e}")
        emit_result({"world_size": ctx.world_size, "restarts": attempt, "steps": args.steps, "every": args.snapshot_every,
                     "dropped": args.drop, "max_param_diff_vs_uninterrupted": diff,
                     "snapshot_bytes": snapshot.stat().st_size if snapshot.exists() else 0, **info})


if __name__ == "__main__":
    main()
