"""The graded coding exercise of lesson 11, benchmarking (notebooks/11_benchmarking.ipynb): 11.5, a step timed
after warm-up with the clock read when the work is done, its FLOPs counted, its MFU.

The check hands the student a DDP step whose first call is slow and whose work runs after the call returns
(:class:`QueuedDevice`, a CUDA stream's behaviour on the CPU), and checks the step time between two bounds,
the FLOPs against FlopCounterMode's and the MFU from the student's own numbers. The hints of the problems it
reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import CodingExercise, always, note


#: Exercise 11.5's step: its queued device work (seconds), how slow its first call is, the warm-up and timed
#: steps the student is given, and the peak passed in (FLOP/s).
MEASURE_PLAN = {"device_s": 0.05, "first_s": 1.5, "warmup": 2, "repeats": 8, "peak": 5e9, "batch": 16,
                "slow_at": 4, "slow_s": 0.6}
#: ``slow_at``, ``slow_s``: the 4th step after the warm-up queues 0.6 s more work (a hiccup: another job, a
#: page fault): the median of 8 steps ignores it, a mean moves by 75 ms.


class QueuedDevice:
    """Work that runs after the call that queued it has returned, in order, on a worker thread: a CUDA stream's
    behaviour on the CPU. ``put(seconds, tag)`` queues work that takes that long (``done[tag]``: the
    perf_counter when it finished); ``sync()`` waits for all of it; ``pending()``: work still queued or running."""

    def __init__(self):
        import queue
        import threading

        self.q, self.done = queue.Queue(), {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            seconds, tag = self.q.get()
            if seconds is not None:
                time.sleep(seconds)
                self.done[tag] = time.perf_counter()
            self.q.task_done()
            if seconds is None:
                return

    def put(self, seconds: float, tag=None) -> None:
        self.q.put((seconds, tag))

    def pending(self) -> bool:
        return self.q.unfinished_tasks > 0

    def sync(self) -> None:
        self.q.join()

    def close(self) -> None:
        self.q.put((None, None))
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
    starts, behind = {}, []                                # when each step was called; steps called with work queued
    counted, flops_at = [0], set()                         # steps run inside a FlopCounterMode, and which

    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    def step():
        calls[0] += 1
        k = calls[0]
        starts[k] = time.perf_counter()
        counting = any("FlopCounter" in type(m).__name__ for m in _get_current_dispatch_mode_stack())
        counted[0] += counting                             # a counted step is not a timed one
        if counting:
            flops_at.add(k)
        if k > plan["warmup"] and device.pending() and not counting:
            behind.append(k)                               # a timed step would also pay for the work before it
        if k == 1:
            time.sleep(plan["first_s"])                    # lazy initialisation, autotuning: once
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        slow = plan["slow_s"] if k == plan["warmup"] + plan["slow_at"] else 0.0
        device.put(plan["device_s"] + slow, tag=k)        # this step's kernels, still to run
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
        return note(problems, {**base, "what": "unsynced", "ms": step_s * 1e3,
                               "synced": syncs[0] >= 2 * plan["repeats"] and not behind})   # before and after each
    if step_s > 2 * plan["device_s"] + 0.05:
        return note(problems, {**base, "what": "warmup", "ms": step_s * 1e3, "calls": calls[0]})
    if syncs[0] < plan["repeats"]:
        return note(problems, {**base, "what": "per_step", "syncs": syncs[0], "repeats": plan["repeats"]})
    if calls[0] < plan["warmup"] + plan["repeats"]:
        return note(problems, {**base, "what": "no_warmup", "calls": calls[0], "warmup": plan["warmup"],
                               "repeats": plan["repeats"]})
    if behind:
        return note(problems, {**base, "what": "behind", "step": behind[0] - plan["warmup"],
                               "after_warmup": behind[0] == plan["warmup"] + 1})
    took = [device.done[k] - starts[k] for k in starts
            if k > plan["warmup"] and k in device.done and k not in flops_at]
    median, mean = statistics.median(took), statistics.fmean(took)
    if abs(step_s - mean) < abs(step_s - median):
        return note(problems, {**base, "what": "mean", "ms": step_s * 1e3, "median_ms": median * 1e3,
                               "mean_ms": mean * 1e3, "slow_ms": plan["slow_s"] * 1e3})
    ratio = flops / want_flops
    if abs(ratio - 1) > 1e-9:
        k = round(ratio)
        if k >= 2 and abs(ratio - k) < 1e-9 and counted[0] == 1:    # one step counted, k times over
            return note(problems, {**base, "what": "flops_tree", "flops": flops, "want": want_flops})
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
        (lambda p, W: p["what"] == "unsynced" and p["synced"],
         "rank {rank}: {ms:.2f} ms per step, less than the {device_ms:.0f} ms of work each step queues, though "
         "sync() was called around every timed step: your clock does not count the time spent waiting "
         "(time.process_time counts this process's CPU time only). Time a step on the wall clock, "
         "time.perf_counter()"),
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
        (lambda p, W: p["what"] == "behind" and p["after_warmup"],
         "rank {rank}: the first timed step started while the warm-up's work was still queued, so its time "
         "includes the warm-up's: call sync() after the warm-up steps, before the clock starts"),
        (lambda p, W: p["what"] == "behind",
         "rank {rank}: step {step} after the warm-up started while earlier work was still queued, so its time "
         "includes that work: call sync() before each step's clock starts"),
        (lambda p, W: p["what"] == "mean",
         "rank {rank}: {ms:.1f} ms per step is the mean of the timed steps ({mean_ms:.1f} ms), not their median "
         "({median_ms:.1f} ms): one of them took {slow_ms:.0f} ms more (a hiccup: another job, a page fault) and "
         "the mean moved with it. Time each step on its own and take the median (statistics.median)"),
        (lambda p, W: p["what"] == "no_warmup",
         "rank {rank}: step() ran {calls} time(s) for {warmup} warm-up and {repeats} timed steps: run the warm-up "
         "steps, untimed, before the timed ones (here the median hid the slow first step; a mean would not)"),
        (lambda p, W: p["what"] == "flops_tree",
         "rank {rank}: {flops:.4g} FLOPs for the one step you counted, {want:.4g} in it: did you sum "
         "get_flop_counts() over the module tree? Its \"Global\" entry already holds every module's FLOPs, and "
         "each module's count is inside its parent's: counter.get_total_flops()"),
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
