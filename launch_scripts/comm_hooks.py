"""Cutting DDP's communication with communication hooks, and an interconnect emulator
(notebooks/09_sync_vs_async.ipynb).

Part 1, accuracy: DDP(SmallCNN) on digits trained from the same start with each hook:
  default (allreduce_hook: fp32, what DDP does without a hook), fp16_compress_hook, bf16_compress_hook,
  and PowerSGD (powerSGD_hook, rank-r factors with error feedback after --powersgd-start vanilla steps).
  Every hook is wrapped by mgpu_utils.costs.interconnect.emulated_link_hook with link=None, which only counts
  the bytes each all-reduce carries (after compression). --bucket-cap-mb sets DDP's buckets, except PowerSGD's
  on gloo: one bucket (mgpu_utils.dist.powersgd_bucket_cap_mb says why).
Part 2, time: for each link in --links (keys of mgpu_utils.costs.hardware.LINKS) and hooks fp32 / fp16 / PowerSGD,
  2 warm-up steps (PowerSGD's plain all-reduce) then --emu-steps timed ones, the emulator adding the
  alpha-beta time of a ring all-reduce of the bytes sent, charged for --scale x the payload (a model --scale
  times bigger on the same compute), so the link's effect shows next to this tiny model's compute.
  The fastest timed step is reported (the least disturbed by other processes).

Rank 0 prints JSON: per hook, accuracy curve, bytes per step; per (link, hook), step time, modelled time,
every hook call's (bytes, modelled s, slept s) on rank 0.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/comm_hooks.py --scale 1000
"""
import argparse
import itertools
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import distributed, emit_result, powersgd_bucket_cap_mb
from mgpu_utils.costs.hardware import LINKS
from mgpu_utils.costs.interconnect import emulated_link_hook
from mgpu_utils.models import SmallCNN

HOOKS = {"fp32 (default)": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
         "bf16": default_hooks.bf16_compress_hook, "PowerSGD": powerSGD_hook}


def make_ddp(ctx, a, hook_name, link, scale, powersgd_start):
    """A fresh DDP(SmallCNN) (the same initial weights each time) and its hook: (ddp, stats)."""
    torch.manual_seed(a.seed)
    model = SmallCNN().to(ctx.device)
    inner = HOOKS[hook_name]
    cap = a.bucket_cap_mb
    if inner is powerSGD_hook:            # on gloo one bucket: two can hang its hook (the helper says why)
        cap = powersgd_bucket_cap_mb(model, ctx.backend, cap, log=ctx.log)
    ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=cap)
    state = (PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                           start_powerSGD_iter=powersgd_start, use_error_feedback=True,
                           warm_start=True, random_seed=a.seed)
             if inner is powerSGD_hook else None)
    stats, hook = emulated_link_hook(inner, state, link, ctx.world_size, scale=scale)
    ddp.register_comm_hook(stats, hook)
    return ddp, stats


def train(ddp, a, data, idx_list, eval_every, test=None):
    """SGD with momentum over idx_list; returns (per-step seconds, accuracy curve [(step, acc)])."""
    X, Y = data
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    step_s, curve = [], []
    for step, idx in enumerate(idx_list, start=1):
        t0 = time.perf_counter()
        loss = F.cross_entropy(ddp(X[idx]), Y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()                           # the hook runs here, once per gradient bucket
        opt.step()
        if X.is_cuda:
            torch.cuda.synchronize()              # the GPU's work is in the step time
        step_s.append(time.perf_counter() - t0)
        if test is not None and (step % eval_every == 0 or step == len(idx_list)):
            with torch.no_grad():                 # every rank holds the same parameters
                curve.append((step, (ddp(test[0]).argmax(1) == test[1]).float().mean().item()))
    return step_s, curve


def main():
    p = argparse.ArgumentParser(description="DDP communication hooks and an interconnect emulator")
    g = p.add_argument_group("accuracy runs")
    g.add_argument("--steps", type=int, default=64)
    g.add_argument("--per-rank-batch", type=int, default=16, help="per rank")
    g.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    g.add_argument("--eval-every", type=int, default=16)
    g.add_argument("--powersgd-rank", type=int, default=2, help="rank r of PowerSGD's factors")
    g.add_argument("--powersgd-start", type=int, default=10, help="vanilla all-reduce steps before PowerSGD (> 1)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb in MiB (default: DDP's own, 25 with a 1 MiB first bucket)")
    g = p.add_argument_group("interconnect emulator")
    g.add_argument("--links", nargs="*", default=["NVLink 4 (H100, 18 links)", "PCIe 4.0 x16",
                                                  "InfiniBand NDR (400 Gb/s)", "Ethernet 100 GbE", "Ethernet 10 GbE"])
    g.add_argument("--emu-hooks", nargs="*", default=["fp32 (default)", "fp16", "PowerSGD"])
    g.add_argument("--emu-steps", type=int, default=3, help="timed steps per (link, hook), after 2 warm-up steps")
    g.add_argument("--scale", type=float, default=1000.0, help="charge the link for scale x the bytes sent")
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        if not dist.is_initialized():
            raise ValueError("DDP communication hooks need a process group: start with torchrun "
                             "--nproc-per-node 2 or more (e.g. 4)")
        bad = [x for x in a.links if x not in LINKS] + [h for h in a.emu_hooks if h not in HOOKS]
        if bad:
            raise ValueError(f"unknown link or hook {bad}; links: {list(LINKS)}; hooks: {list(HOOKS)}")
        train_set, test_set = load_data()
        data = tuple(t.to(ctx.device) for t in train_set.tensors)
        test = tuple(t.to(ctx.device) for t in test_set.tensors)
        stream = batch_stream(train_set, ctx.world_size, ctx.rank, a.per_rank_batch, a.seed)
        idx_list = list(itertools.islice(stream, max(a.steps, a.emu_steps + 2)))
        n = ctx.world_size
        hooks = {}
        for name in HOOKS:
            ddp, stats = make_ddp(ctx, a, name, None, 1.0, a.powersgd_start)
            step_s, curve = train(ddp, a, data, idx_list[:a.steps], a.eval_every, test)
            hooks[name] = {"curve": curve, "final_acc": curve[-1][1], "median_step_s": statistics.median(step_s),
                           "payload_bytes_per_step": [c[0] for c in stats.per_call],
                           "payload_bytes_total": stats.payload_bytes, "calls": stats.calls}
            ctx.log(f"{name:>15}: test acc {curve[-1][1]:.3f}, "
                    f"payload {stats.payload_bytes / stats.calls / 1e3:.1f} kB per all-reduce (last step "
                    f"{stats.per_call[-1][0] / 1e3:.1f} kB)")
        emu = []
        for link in a.links:
            for name in a.emu_hooks:
                ddp, stats = make_ddp(ctx, a, name, link, a.scale, 2)   # PowerSGD compresses from step 3
                step_s, _ = train(ddp, a, data, idx_list[:a.emu_steps + 2], a.eval_every)
                # fastest timed step (least disturbed by other processes), of the slowest rank
                t = torch.tensor(min(step_s[2:]), device=ctx.device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                last = stats.per_call[-1]
                emu.append({"link": link, "hook": name, "step_s": t.item(),
                            "payload_bytes": last[0], "modelled_s": last[1],
                            "per_call": stats.per_call})
            ctx.log(f"{link}: step " + ", ".join(f"{e['hook']} {e['step_s'] * 1e3:.1f} ms"
                                                       for e in emu[-len(a.emu_hooks):]))
        emit_result({"world_size": n, "backend": ctx.backend, "params": sum(p.numel() for p in ddp.parameters()),
                     "steps": a.steps, "scale": a.scale, "powersgd_rank": a.powersgd_rank, "hooks": hooks,
                     "emulator": emu,
                     "links": {k: LINKS[k] for k in a.links}})


if __name__ == "__main__":
    main()
