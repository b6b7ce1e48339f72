"""Where the time of a DDP step goes, and how much of the machine it uses (notebooks/11_benchmarking.ipynb).

A byte-level GPT-2 (transformers, random init; mgpu_utils.models.byte_gpt2) trains with DDP on stdlib
docstrings, --threads intra-op threads per rank. Each step is four named phases (torch.profiler's
record_function): "data" (this rank's batch), "forward", "backward" (DDP all-reduces gradient buckets
during it) and "optimizer" (AdamW). After --warmup untraced steps, --traced-steps steps run under torch.profiler
on every rank, and each rank writes its own Chrome/Perfetto trace, <--trace-dir>/trace_rank<r>.json.

MFU: the model FLOPs of one rank's step are counted with torch.utils.flop_counter.FlopCounterMode
(forward + backward, on the model without DDP, attention through SDPA's math backend so that it is
counted) and compared with 6 N per token (N: non-embedding parameters; Kaplan et al., 2020). The peak per
rank is measured on a CPU as in lesson 01 (the best median FLOP/s of fp32 matmuls, with the same threads)
and taken from the datasheet on a GPU (mgpu_utils.costs.hardware).
MFU = counted FLOPs per step x world size / (median step seconds x world size x peak per rank).

Rank 0 prints one JSON line (MGPU_RESULT): world_size, threads_per_rank, device, params, non_embedding_params,
tokens_per_step (all ranks), flops_per_step (counted, all ranks), flops_6n, layers, seq, embd, heads, vocab,
step_seconds (median of the untraced steps), peak_flops_per_s (one rank's peak), peak_source, mfu, losses,
traces (the trace files' paths).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/profile_step.py --trace-dir build/traces
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from mgpu_utils.launch.cluster import shared_folder
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.costs.hardware import GPUS, match_gpu
from mgpu_utils.models import byte_gpt2
from mgpu_utils.text_data import byte_corpus, get_batch
from mgpu_utils.timing import matmul_flops, synced_clock, time_fn


def peak_per_rank(device) -> tuple[float, str]:
    """(FLOP/s one rank can reach, where the number comes from): the datasheet fp32 peak on a known GPU,
    else lesson 01's method, the best median FLOP/s of n x n fp32 matmuls (n up to 2048) on this device."""
    if device.type == "cuda" and match_gpu(torch.cuda.get_device_name(device)):
        gpu = match_gpu(torch.cuda.get_device_name(device))
        return GPUS[gpu]["fp32_tflops"] * 1e12, f"datasheet fp32, {gpu}"
    best = 0.0
    for n in (256, 512, 1024, 2048):
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        best = max(best, matmul_flops(n) / time_fn(lambda: a @ b, device, iters=5, warmup=2)["median_s"])
    return best, f"measured: best median fp32 matmul, {torch.get_num_threads()} thread(s)"


def main():
    p = argparse.ArgumentParser(description="profile a DDP step of a byte-level GPT-2")
    g = p.add_argument_group("the model and batch (defaults: about 0.3 s per step with one thread)")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--width", type=int, default=256, help="d_model (hidden size)")
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--seq", type=int, default=64, help="context length (bytes)")
    g.add_argument("--per-rank-batch", type=int, default=8, help="sequences per rank per step")
    g = p.add_argument_group("timing and tracing")
    g.add_argument("--warmup", type=int, default=2, help="untraced steps first")
    g.add_argument("--steps", type=int, default=4, help="untraced timed steps (the median is step_seconds)")
    g.add_argument("--traced-steps", type=int, default=3, help="traced steps")
    g.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    g.add_argument("--trace-dir", default="build/traces", help="one trace_rank<r>.json per rank; a folder every rank sees (checked)")
    args = p.parse_args()

    with distributed() as ctx:
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        torch.set_num_threads(args.threads)
        data = byte_corpus()
        model = byte_gpt2(args.layers, args.width, args.heads, args.seq).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if dist.is_initialized() \
            else model
        opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)

        xb = get_batch(data, 0, args.per_rank_batch, args.seq - 1, seed=rank).to(device)  # windows of --seq bytes
        # one rank's forward + backward, without DDP's hooks; attention through SDPA's math backend: the same
        # FLOPs, but the counter has no formula for the fused CPU kernel and would miss the T x T products
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(xb, labels=xb).loss.backward()
        model.zero_grad(set_to_none=True)
        flops_rank = counter.get_total_flops()
        embed = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
        n_params = sum(q.numel() for q in model.parameters())
        tokens_rank = args.per_rank_batch * args.seq

        losses = []

        # region profiled-step
        def step(i):
            with record_function("data"):
                xb = get_batch(data, i, args.per_rank_batch, args.seq - 1, seed=rank).to(device)
            with record_function("forward"):
                loss = ddp(xb, labels=xb).loss
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss.item())

        times = []
        for i in range(args.warmup + args.steps):
            if dist.is_initialized():
                dist.barrier()
            t0 = synced_clock(device)
            step(i)
            times.append(synced_clock(device) - t0)
        peak, peak_source = peak_per_rank(device)  # all ranks at once, as they train

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        if device.type != "cuda":                  # kineto's "gpuGetDeviceCount failed" on a CPU-only machine
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")   # is not an error (read when the profiler starts)
        trace = str(shared_folder(args.trace_dir, rank, world) / f"trace_rank{rank}.json")   # rank 0 lists them all
        if dist.is_initialized():
            dist.barrier()
        with profile(activities=acts) as prof:
            for i in range(args.warmup + args.steps, args.warmup + args.steps + args.traced_steps):
                step(i)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        prof.export_chrome_trace(trace)            # every rank its own file: the rank is in the name
        # endregion

        step_s = statistics.median(times[args.warmup:])
        flops = torch.tensor([flops_rank, peak], dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(flops)                  # the job's FLOPs per step and its summed peak
        traces = [None] * world
        if dist.is_initialized():
            dist.all_gather_object(traces, trace)
        else:
            traces = [trace]
        ctx.log(f"step {1e3 * step_s:.0f} ms, {flops_rank / 1e9:.2f} GFLOP per rank, trace {trace}")
        emit_result({"world_size": world, "threads_per_rank": args.threads, "device": device.type,
                     "params": n_params, "non_embedding_params": n_params - embed,
                     "tokens_per_step": tokens_rank * world, "flops_per_step": flops[0].item(),
                     "flops_6n": 6 * (n_params - embed) * tokens_rank * world, "layers": args.layers,
                     "seq": args.seq, "embd": args.width, "heads": args.heads, "vocab": model.config.vocab_size,
                     "step_seconds": step_s, "peak_flops_per_s": flops[1].item() / world,
                     "peak_source": peak_source, "mfu": flops[0].item() / step_s / flops[1].item(),
                     "losses": losses, "traces": traces}, rank)


if __name__ == "__main__":
    main()
