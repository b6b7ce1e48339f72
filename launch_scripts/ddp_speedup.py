"""Strong and weak scaling of one DDP training step on real digits (notebooks/03_ddp.ipynb, section 5b;
notebooks/11_benchmarking.ipynb and benchmarks/scaling.py).

The step is compute-bound on purpose: an MLP of --layers hidden layers of --width units on the
1,438 training digits, a global batch of --global-batch samples split evenly over the ranks, and
each rank limited to --threads intra-op threads (default 1). One process with one thread on the
whole global batch is world size 1 of the same script, so the speed-up N ranks give is
time(1) / time(N), and the parallel efficiency is speed-up / N.

Each timed step is forward, backward (DDP's bucketed all-reduce included) and an SGD step. Every rank
waits at a barrier before the clock starts; the step time is rank 0's median over --steps steps after
--warmup untimed ones. Before each step the same forward + backward runs on the local batch without
DDP (no communication) and is timed the same way: its median is the compute share of the step.

Weak scaling: --per-rank-batch B keeps B samples per rank, so the global batch is B x N.
--sweep-bytes 65536,1048576,... then times all-reduces of those sizes (10 back to back, median of 5, for an
alpha-beta fit; none at world size 1).
Where the machine has energy counters (NVML on GPUs, Linux RAPL on CPUs; mgpu_utils.measure.energy), --energy-steps
more DDP steps run alone under the meter: energy_j and joules_per_sample (null, with energy_note, if none), and
energy_source ("nvml" or "rapl"). Ranks on GPUs count their GPUs only: without NVML, none (not the CPUs' RAPL).

Rank 0 prints one JSON line (MGPU_RESULT): world_size, threads_per_rank, global_batch, local_batch,
params, grad_bytes, step_seconds (median), step_seconds_all, compute_seconds (median), samples_per_s,
final_loss (the last step's loss on the whole global batch), allreduce_s ([bytes, median seconds] pairs),
energy_j, joules_per_sample, energy_source and energy_note.

For a speed-up, start at most one rank per physical core (4 ranks on a 2-core laptop only take turns).

Run:
    torchrun --standalone --nproc-per-node 2 launch_scripts/ddp_speedup.py --threads 1 --per-rank-batch 1024
    torchrun --standalone --nproc-per-node 4 launch_scripts/ddp_speedup.py --threads 1
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.measure.energy import EnergyMeter
from mgpu_utils.models import make_mlp


def sync(device):
    """Wait for queued GPU work so that a host clock measures it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def energy_meter(device, powercap_root="/sys/class/powercap"):
    """A rank's meter: on CUDA its own GPU by NVML (by UUID: NVML's indices need not match CUDA's), never
    RAPL, whose CPU packages would pass for the GPU run's energy; on the CPU tier what the machine has."""
    if device.type == "cuda":
        return EnergyMeter("nvml", gpus=[str(torch.cuda.get_device_properties(device).uuid)],
                           powercap_root=powercap_root)
    return EnergyMeter(powercap_root=powercap_root)


def main():
    p = argparse.ArgumentParser(description="DDP strong scaling on digits")
    g = p.add_argument_group("the step (defaults: about 0.2 s per step with one rank and one thread)")
    g.add_argument("--global-batch", type=int, default=2048, help="samples per step over all ranks (strong)")
    g.add_argument("--per-rank-batch", type=int, default=None, help="samples per rank instead (weak scaling)")
    g.add_argument("--width", type=int, default=1024, help="hidden units per layer")
    g.add_argument("--layers", type=int, default=3, help="hidden layers")
    g.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    g = p.add_argument_group("timing")
    g.add_argument("--steps", type=int, default=12, help="timed steps (the median is reported)")
    g.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    g.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (torch.set_num_threads)")
    g.add_argument("--sweep-bytes", default="", help="comma-separated all-reduce sizes to time (bytes)")
    g.add_argument("--energy-steps", type=int, default=10, help="DDP steps under the energy meter, if any")
    args = p.parse_args()

    with distributed() as ctx:
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if args.per_rank_batch:
            args.global_batch = args.per_rank_batch * world
        if args.global_batch % world:
            raise ValueError(f"--global-batch {args.global_batch} is not divisible by world size {world}: "
                             f"choose a multiple of {world}")
        torch.set_num_threads(args.threads)
        local = args.global_batch // world
        train, _ = load_data()
        x_all, y_all = train.tensors
        torch.manual_seed(0)
        model = make_mlp(args.width, args.layers, flatten=True).to(device)
        ids = [ctx.local_rank] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids) if dist.is_initialized() else model
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        gen = torch.Generator().manual_seed(1)

        def batch():
            """This rank's slice of a global batch drawn the same way on every rank."""
            idx = torch.randint(0, len(x_all), (args.global_batch,), generator=gen)
            idx = idx[rank * local:(rank + 1) * local]
            return x_all[idx].to(device), y_all[idx].to(device)

        def timed(fn, cpu_share=None):
            """Seconds one call of fn takes, with every rank starting together; ``cpu_share`` (a list) gets
            this process's CPU time over the wall time: about 1 for one thread that had its core."""
            if dist.is_initialized():
                dist.barrier()
            sync(device)
            t0, p0 = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            wall = time.perf_counter() - t0
            if cpu_share is not None:
                cpu_share.append((time.process_time() - p0) / wall)
            return wall

        # region step
        def ddp_step():
            nonlocal loss
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()                       # DDP all-reduces the gradient buckets here
            opt.step()
            opt.zero_grad(set_to_none=True)

        def compute_only():                       # the same forward + backward without DDP: no communication
            F.cross_entropy(model(x), y).backward()
            model.zero_grad(set_to_none=True)

        times, compute, loss, shares = [], [], None, []
        for step in range(args.warmup + args.steps):  # interleaved, so both see the same machine state
            x, y = batch()
            c, t = timed(compute_only, shares if step >= args.warmup else None), timed(ddp_step)
            if step >= args.warmup:
                times.append(t)
                compute.append(c)
        # endregion

        meter = energy_meter(device)              # a GPU rank: its GPU (NVML), or nothing measured
        # NVML: each rank its own GPU; RAPL counts the whole machine: one rank per node reads it
        counts = meter.source == "nvml" or ctx.env.local_rank == 0
        measure = torch.tensor([int(meter.available or not counts)], device=device)
        if dist.is_initialized():
            dist.all_reduce(measure, op=dist.ReduceOp.MIN)  # every rank runs the steps, or none
        energy, energy_steps = None, 0
        if measure.item():
            with meter if counts else contextlib.nullcontext():
                t0 = time.perf_counter()
                while True:                       # chunks of --energy-steps, for NVML's window at least 1 s
                    for _ in range(args.energy_steps):
                        x, y = batch()
                        ddp_step()
                    energy_steps += args.energy_steps
                    sync(device)
                    more = torch.tensor([int(meter.source == "nvml" and time.perf_counter() - t0 < 1.0)],
                                        device=device)
                    if dist.is_initialized():
                        dist.all_reduce(more, op=dist.ReduceOp.MAX)   # all ranks run the same steps
                    if not more.item():
                        break
            joules = meter.joules if counts else 0.0
            got = torch.tensor([joules or 0.0, float(joules is None)], dtype=torch.float64, device=device)
            if dist.is_initialized():
                dist.all_reduce(got)              # the GPUs, or the nodes' machines, summed
            energy = None if got[1].item() else got[0]
        sweep = []
        for nbytes in [int(b) for b in args.sweep_bytes.split(",") if b and world > 1]:   # alone: nothing to reduce
            buf = torch.ones(nbytes // 4, device=device)
            def ten():                            # back to back after one barrier, as nccl-tests times them
                for _ in range(10):
                    dist.all_reduce(buf)
            ts = [timed(ten) / 10 for _ in range(6)]
            sweep.append([nbytes, statistics.median(ts[1:])])

        step_s = statistics.median(times)
        share = torch.tensor([statistics.median(shares)], dtype=torch.float64)   # a CPU tensor: gloo, or
        if dist.is_initialized() and device.type == "cpu":                        # the group's CPU backend
            dist.all_reduce(share, op=dist.ReduceOp.MIN)                          # the rank that got least
        last = loss.detach().clone()              # the last step's loss on the global batch:
        if dist.is_initialized():                 # equal shards, so the mean of the ranks' means
            dist.all_reduce(last)
            last /= world
        ctx.log(f"world size {world}, {args.threads} thread(s) per rank, {local} samples per rank: "
                f"step {1e3 * step_s:.1f} ms (compute {1e3 * statistics.median(compute):.1f} ms)")
        emit_result({"world_size": world, "threads_per_rank": torch.get_num_threads(),  # as set, read back
                     "global_batch": args.global_batch,
                     "local_batch": local, "params": sum(q.numel() for q in model.parameters()),
                     "grad_bytes": sum(q.numel() * q.element_size() for q in model.parameters()),
                     "step_seconds": step_s, "step_seconds_all": times,
                     "compute_seconds": statistics.median(compute),
                     "compute_cpu_share": share.item() if device.type == "cpu" else None,
                     "samples_per_s": args.global_batch / step_s, "final_loss": last.item(), "allreduce_s": sweep,
                     "energy_j": None if energy is None else energy.item(),
                     "joules_per_sample": None if energy is None else energy.item() / (energy_steps
                                                                                       * args.global_batch),
                     "energy_source": meter.source, "energy_note": meter.reason}, rank)


if __name__ == "__main__":
    main()
