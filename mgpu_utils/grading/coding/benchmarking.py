"""The graded coding exercise of lesson 11, benchmarking (notebooks/11_benchmarking.ipynb): 11.5, a step timed
after warm-up with the clock read when the work is done, its FLOPs counted, its MFU.

The check hands the student a DDP step whose first call is slow and whose work runs after the call returns
(:class:`QueuedDevice`, a CUDA stream's behaviour on the CPU), and checks the step time between two bounds,
the FLOPs against FlopCounterMode's and the MFU from the student's own numbers. The hints of the problems it
reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import CodingExercise, always, note


#: Exercise 11.5's step: its queued device work (seconds), how slow its first call is, the warm-up and timed
#: steps the student is given, and the peak passed in (FLOP/s).
MEASURE_PLAN = {"device_s": 0.05, "first_s": 1.5, "warmup": 2, "repeats": 8, "peak": 5e9, "batch": 16}


class QueuedDevice:
    """Work that runs after the call that queued it has returned, in order, on a worker thread: a CUDA stream's
    behaviour on the CPU. ``put(seconds)`` queues work that takes that long; ``sync()`` waits for all of it."""

    def __init__(self):
        import queue
        import threading

        self.q = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            seconds = self.q.get()
            if seconds is not None:
                time.sleep(seconds)
            self.q.task_done()
            if seconds is None:
                return

    def put(self, seconds: float) -> None:
        self.q.put(seconds)

    def sync(self) -> None:
        self.q.join()

    def close(self) -> None:
        self.q.put(None)
        self.q.join()


def check_measure(fn, ctx, problems):
    """11.5: ``fn(step, sync, warmup, repeats, peak_flops)`` on a DDP step whose first call takes 1.5 s and
    whose queued work takes 50 ms (:class:`QueuedDevice`): the step time between two bounds (a clock read
    before the work is done reads the step's compute alone, about 5 ms at 3 ranks on 2 cores, under 45 ms; a
    sleep never ends early, so a synced step reads at least 50 ms under any load; a warm-up in the mean adds
    1.5 s over the timed steps, more than 150 ms), one step's FLOPs as FlopCounterMode counts them, and the
    MFU from the student's own two numbers."""
    from torch.utils.flop_counter import FlopCounterMode

    plan, world, rank = MEASURE_PLAN, ctx.world_size, ctx.rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y = load_data()[0][:plan["batch"] * world]
    x, y = x[rank::world], y[rank::world]
    plain = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(plain(x), y).backward()
    want_flops = counter.get_total_flops()
    ddp, device, calls = DDP(model), QueuedDevice(), [0]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        calls[0] += 1
        if calls[0] == 1:
            time.sleep(plan["first_s"])                    # lazy initialisation, autotuning: once
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        device.put(plan["device_s"])                       # this step's kernels, still to run
    syncs = [0]

    def sync():
        syncs[0] += 1
        device.sync()
    try:
        got = fn(step, sync, plan["warmup"], plan["repeats"], plan["peak"])
    finally:
        device.close()
    base = {"rank": rank, "kind": "measure", "device_ms": plan["device_s"] * 1e3, "first_s": plan["first_s"]}
    if not (isinstance(got, dict) and all(isinstance(got.get(k), (int, float)) for k in ("step_s", "flops", "mfu"))):
        return note(problems, {**base, "what": "type", "got": repr(got)[:80]})
    step_s, flops, mfu = float(got["step_s"]), float(got["flops"]), float(got["mfu"])
    if step_s < 0.9 * plan["device_s"]:
        return note(problems, {**base, "what": "unsynced", "ms": step_s * 1e3})
    if step_s > 2 * plan["device_s"] + 0.05:
        return note(problems, {**base, "what": "warmup", "ms": step_s * 1e3, "calls": calls[0]})
    if syncs[0] < plan["repeats"]:
        return note(problems, {**base, "what": "per_step", "syncs": syncs[0], "repeats": plan["repeats"]})
    if calls[0] < plan["warmup"] + plan["repeats"]:
        return note(problems, {**base, "what": "no_warmup", "calls": calls[0], "warmup": plan["warmup"],
                               "repeats": plan["repeats"]})
    ratio = flops / want_flops
    if abs(ratio - 1) > 1e-9:
        k = round(ratio)
        return note(problems, {**base, "what": "flops", "flops": flops, "want": want_flops,
                               "steps": k if k >= 2 and abs(ratio - k) < 1e-9 else None})
    expected = flops / step_s / plan["peak"]
    if abs(mfu - expected) > 1e-9 * expected:
        r = mfu / expected
        return note(problems, {**base, "what": "mfu", "mfu": mfu, "expected": expected,
                               "as": "percent" if abs(r - 100) < 1e-6 else "world" if abs(r - world) < 1e-6 and
                               world > 1 else None})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "measure": [
        (lambda p, W: p["what"] == "type",
         "rank {rank}: measure_step returned {got}; return a dict with the numbers step_s, flops and mfu"),
        (lambda p, W: p["what"] == "unsynced",
         "rank {rank}: {ms:.2f} ms per step, less than the {device_ms:.0f} ms of work each step queues: the clock "
         "was read before the step's work was done (step() returns when its work is queued, as CUDA kernels and "
         "NCCL collectives do). Call sync() before reading the clock, at the start and at the end"),
        (lambda p, W: p["what"] == "warmup",
         "rank {rank}: {ms:.0f} ms per step, several times the {device_ms:.0f} ms a step's work takes: the first "
         "step, {first_s:g} s (lazy initialisation, autotuning), is in the number. Run the warm-up steps "
         "untimed, and take the median of the timed ones"),
        (lambda p, W: p["what"] == "per_step",
         "rank {rank}: sync() was called {syncs} time(s) for {repeats} timed steps: the median needs each step's "
         "own time, so sync before reading the clock at the start and at the end of every timed step"),
        (lambda p, W: p["what"] == "no_warmup",
         "rank {rank}: step() ran {calls} time(s) for {warmup} warm-up and {repeats} timed steps: run the warm-up "
         "steps, untimed, before the timed ones (here the median hid the slow first step; a mean would not)"),
        (lambda p, W: p["what"] == "flops" and not p["flops"],
         "rank {rank}: flops is 0: count one step with torch.utils.flop_counter.FlopCounterMode "
         "(counter.get_total_flops())"),
        (lambda p, W: p["what"] == "flops" and p["steps"],
         "rank {rank}: {flops:.4g} FLOPs, the count of {steps} steps ({want:.4g} each): count one step"),
        (lambda p, W: p["what"] == "flops",
         "rank {rank}: {flops:.4g} FLOPs per step; FlopCounterMode counts {want:.4g} for one step of this rank "
         "(forward and backward)"),
        (lambda p, W: p["what"] == "mfu" and p["as"] == "percent",
         "rank {rank}: mfu {mfu:.4g} is a percentage; return the fraction, flops / step_s / peak_flops"),
        (lambda p, W: p["what"] == "mfu" and p["as"] == "world",
         "rank {rank}: mfu {mfu:.4g} is {W} times flops / step_s / peak_flops: this rank's FLOPs go over this "
         "rank's peak (the job's MFU is the same fraction: W times the FLOPs over W times the peak)"),
        (always, "rank {rank}: mfu {mfu:.4g}, but your flops / step_s / peak_flops is {expected:.4g}")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="11.5", template="11_measure_step.py", entry="measure_step", world_sizes=(2, 3),
        check=check_measure, hints=HINTS,
        what="the step time after warm-up with the clock read when the work is done, one step's FLOPs, and "
             "the MFU from them"),
]
