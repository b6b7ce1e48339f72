"""Pipeline parallelism, checked and timed (notebooks/05_model_parallel.ipynb).

A stack of --layers blocks (Linear(d, d) + Tanh) is cut into one stage per rank (stage r on rank r).
Parts, each run twice: once with real compute only, checked against a single-device copy of the
whole model on every rank (loss, last-stage output, every parameter gradient; the largest error over
ranks is reported), then once timed, with every stage forward also sleeping --stage-ms and every
backward twice that (a rank with v chunks sleeps 1/v of it per chunk; with --layer-ms a stage sleeps the
sum of its layers', and --split cuts stages of unequal length: load balancing), so that the measured
per-rank timeline shows the schedule (on a few shared CPU cores real compute mostly shows contention;
on GPUs use --stage-ms 0 and a larger --width):

  naive     layer split, no micro-batches: send/recv of activations forward, gradients backward
  gpipe     hand-written executor, all forwards then all backwards, --micro-batches micro-batches
  1f1b      hand-written executor, one forward one backward (mgpu_utils.parallel.schedules action lists)
  lib_gpipe, lib_1f1b, lib_interleaved   torch.distributed.pipelining: ScheduleGPipe,
            Schedule1F1B, ScheduleInterleaved1F1B (--chunks stages per rank)

Rank 0 returns the errors (out_err None if the last stage returned no output) and every rank's
timeline ({kind, mb, stage, start, end} in seconds since the earliest rank's start).
    torchrun --standalone --nproc-per-node 4 launch_scripts/pipeline_parallel.py --stage-ms 30
"""
import argparse
import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.parallel.pipeline import Recorder, Timed, build_model, check_args, layer_split_step, run_schedule, split_stages
from mgpu_utils.parallel.schedules import schedule_actions

LIBRARY = {"lib_gpipe": "ScheduleGPipe", "lib_1f1b": "Schedule1F1B", "lib_interleaved": "ScheduleInterleaved1F1B"}


def parse():
    p = argparse.ArgumentParser(description="layer split, GPipe, 1F1B (hand-written and torch.distributed.pipelining)")
    g = p.add_argument_group("model and data")
    g.add_argument("--layers", type=int, default=8, help="Linear+Tanh blocks; divisible by world size x chunks")
    g.add_argument("--width", type=int, default=64, help="width d of every layer")
    g.add_argument("--global-batch", type=int, default=32, help="samples per step (divisible by --micro-batches)")
    g = p.add_argument_group("schedules")
    g.add_argument("--micro-batches", type=int, default=8, help="micro-batches m (interleaved: a multiple of the world size)")
    g.add_argument("--chunks", type=int, default=2, help="stages per rank in the interleaved schedule")
    g.add_argument("--schedules", default="naive,gpipe,1f1b," + ",".join(LIBRARY), help="which schedules to run")
    g.add_argument("--stage-ms", type=float, default=30.0, help="sleep per stage forward when timed (x2 backward)")
    g.add_argument("--layer-ms", default="", help="sleep per layer forward when timed, comma-separated (replaces --stage-ms)")
    g.add_argument("--split", default="", help="layers per stage, comma-separated (default: equal); not with lib_interleaved")
    return p.parse_args()


def numbers(text, kind, flag):
    try:
        return [kind(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers (e.g. 5,3), got {text!r}") from None


def max_over_ranks(values, device):
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main():
    args = parse()
    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        r, p, dev = ctx.rank, ctx.world_size, ctx.device
        parts = [s for s in args.schedules.split(",") if s]
        try:
            sizes = numbers(args.split, int, "--split") if args.split else None
            layer_ms = numbers(args.layer_ms, float, "--layer-ms") if args.layer_ms else None
            check_args(args.layers, args.global_batch, args.micro_batches, args.chunks, p, parts, sizes, layer_ms)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        if dist.is_initialized():
            dist.barrier()      # NCCL: every rank joins the first call (batch_isend_irecv's first use must)
        model = build_model(args.layers, args.width).to(dev)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.global_batch, args.width, generator=g).to(dev)
        y = torch.randn(args.global_batch, args.width, generator=g).to(dev)
        loss_fn = nn.MSELoss()
        ref_out = model(x)                                   # the single-device reference, on every rank
        ref_loss = loss_fn(ref_out, y)
        ref_loss.backward()
        x_mbs, y_mbs = list(x.chunk(args.micro_batches)), list(y.chunk(args.micro_batches))
        rec = Recorder()
        # region stage-times
        split = sizes or [args.layers // p] * p          # layers per stage, one stage per rank
        ends = [sum(split[:s + 1]) for s in range(p)]
        # a stage's forward sleeps the sum of its layers' times (its backward twice that): Recorder.start
        stage_ms = ([sum(layer_ms[e - k:e]) for e, k in zip(ends, split)] if layer_ms
                    else [args.stage_ms] * p)
        # endregion
        checks, timelines, step_s = {}, {}, {}

        def setup(part):
            """This rank's stage modules (fresh copies of the model, wrapped in Timed) for a part."""
            v = args.chunks if part == "lib_interleaved" else 1
            n = p * v
            cut = sizes if v == 1 else None
            copies, refs = split_stages(copy.deepcopy(model), n, cut), split_stages(model, n, cut)
            return {s: Timed(copies[s], s, rec) for s in range(r, n, p)}, refs, n

        # region run-schedule
        def run(part, mods, n, sched):
            """One step of ``part``; returns (loss on the last stage or None, output or None)."""
            if part == "naive":
                out, loss = layer_split_step(mods[r], x, y, loss_fn, r, p)
                return loss, out
            if part in ("gpipe", "1f1b"):
                actions = schedule_actions(part, p, args.micro_batches)[r]
                return run_schedule(actions, mods, x_mbs, y_mbs, loss_fn, r, p)
            losses = []
            kw = {"target": y, "losses": losses} if (n - 1) in mods else {}
            out = sched.step(*((x,) if 0 in mods else ()), **kw)     # the merged output on the last stage
            return (sum(losses) / len(losses) if losses else None), (out if (n - 1) in mods else None)
        # endregion

        for part in parts:
            mods, refs, n = setup(part)
            sched = None
            if part in LIBRARY:
                if not dist.is_initialized():
                    ctx.log(f"SKIPPED {part}: torch.distributed.pipelining needs a process group (run under torchrun)")
                    continue
                # region library
                from torch.distributed import pipelining
                stages = [pipelining.PipelineStage(mods[s], s, n, dev) for s in sorted(mods)]
                cls = getattr(pipelining, LIBRARY[part])
                sched = cls(stages[0] if len(stages) == 1 else stages, args.micro_batches, loss_fn=loss_fn)
                # endregion
            loss, out = run(part, mods, n, sched)            # 1) real compute only: check
            errs = [0.0, 0.0, 0.0, 0.0]                      # last: 1 if the last stage returned no output
            if loss is not None:
                errs[0] = abs(loss.item() - ref_loss.item())
            elif r == p - 1:
                errs[0] = float("inf")                       # the last stage must return the loss
            if r == p - 1:
                if out is None:
                    errs[3] = 1.0
                else:
                    errs[1] = (out - ref_out).abs().max().item()
            for s in range(r, n, p):
                for a, b in zip(mods[s].parameters(), refs[s].parameters()):
                    errs[2] = max(errs[2], (a.grad - b.grad).abs().max().item())
                    a.grad = None
            loss_err, out_err, grad_err, no_out = max_over_ranks(errs, dev)
            checks[part] = {"loss_err": loss_err, "out_err": None if no_out else out_err, "grad_err": grad_err}
            if dist.is_initialized():                        # 2) timed, with --stage-ms sleeps
                dist.barrier()
            rec.start({s: stage_ms[r] / 1e3 / len(mods) for s in mods})   # a rank's sleep, split over its chunks
            run(part, mods, n, sched)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)                  # the step ends when the device is done
            t1 = rec.now()
            events = rec.stop()
            t0 = -max_over_ranks([-rec.t0], dev)[0]          # earliest start over ranks: the common origin
            t1 += rec.shift(t0)
            gathered = [None] * p if r == 0 else None
            if dist.is_initialized():
                dist.gather_object(events, gathered, dst=0)
            else:
                gathered = [events]
            step_s[part] = max_over_ranks([t1], dev)[0]
            timelines[part] = gathered
            ctx.log(f"{part:16s} loss err {loss_err:.1e}  grad err {grad_err:.1e}  timed step {step_s[part]:.3f} s")
        emit_result({"world_size": p, "backend": ctx.backend, "layers": args.layers, "dim": args.width,
                     "batch": args.global_batch, "micro": args.micro_batches, "chunks": args.chunks, "stage_ms": stage_ms,
                     "split": split, "layer_ms": layer_ms,
                     "checks": checks, "timelines": timelines, "step_s": step_s})


if __name__ == "__main__":
    main()
