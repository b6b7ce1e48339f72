"""The graded coding exercise of lesson 11, benchmarking (notebooks/11_benchmarking.ipynb): 11.5, a step timed
after warm-up with the clock read when the work is done, its FLOPs counted, its MFU.

The check hands the student a DDP step whose first call is slow and whose work runs after the call returns
(:class:`QueuedDevice`, a CUDA stream's behaviour on the CPU), and checks the step time between two bounds,
the FLOPs against FlopCounterMode's and the MFU from the student's own numbers. The hints of the problems it
reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import CodingExercise, always, note


#: Exercise 11.5's step: its queued device work (seconds), how slow its first call is, the warm-up and timed
#: steps the student is given, and the peak passed in (FLOP/s).
MEASURE_PLAN = {"device_s": 0.04, "first_s": 0.8, "warmup": 2, "repeats": 8, "peak": 5e9, "batch": 16,
                "slow_s": 0.6, "host_s": 0.03, "spread_s": (0.0, 0.005, 0.010, 0.015, 0.095, 0.100, 0.105, 0.110),
                "tolerance_s": 0.02, "warm_s": 0.2}
#: ``slow_s``: one timed step, drawn each run among the slower half, queues 0.6 s more work (a hiccup: another job, a
#: page fault): the median of 8 steps ignores it (it stays between the fast and the slow half), a mean moves by 75 ms.
#: ``host_s``: every step spends 30 ms on the host before its work is queued (Python, kernel launches): a clock started
#: when step() returns misses it. ``spread_s``: the timed steps' work varies by these, in an order drawn each run: the
#: median (55 ms above the least) is 40 ms or more from every single step's time, so the fastest, the last or any one
#: step is not it; an answer within ``tolerance_s`` of the median of the steps' times (each from its call to the end of
#: its work, as the grader saw them) passes: a clock read a few ms late under load stays inside it (20 ms: half the gap
#: to the nearest step). ``warm_s``: the warm-up steps after the first queue that much more work (autotuning goes on):
#: timed with the others, they move the median of 10.


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
    """11.5: ``fn(step, sync, warmup, repeats, peak_flops)`` on a DDP step whose first call takes 0.8 s, that
    spends 30 ms on the host and then queues 40 ms of work and more (:class:`QueuedDevice`, :data:`MEASURE_PLAN`):
    the step time within ``tolerance_s`` of the median of the timed steps as the grader saw them (a clock read
    before the work is done reads the host's part alone, about 35 ms at 3 ranks on 2 cores, under 66 ms; a sleep
    never ends early, so a synced step reads at least 70 ms under any load; a warm-up in the mean adds the first
    step's 0.8 s over 8 to 10 steps, 80 to 125 ms above the median, and is named where the answer is such a mean or
    more than 100 ms above the median; any other number is named where one fits: the mean, the fastest or the
    last step, the warm-up's steps timed too, the clock started after step() returned), one step's FLOPs as FlopCounterMode counts them, and the
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
    seed = torch.tensor([random.SystemRandom().getrandbits(31)])   # an order no file can know, the same on
    dist.broadcast(seed, src=0)                            # every rank (a rank waits for the others' hiccups)
    draw = random.Random(int(seed))
    extra = list(plan["spread_s"])[:plan["repeats"]]
    draw.shuffle(extra)
    extra[draw.choice([i for i, e in enumerate(extra) if e > 0.05])] += plan["slow_s"]   # one of the slow half
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    starts, queued, behind = {}, {}, []                    # when each step was called, when its work was queued;
                                                           # steps called with work queued
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
        warm = plan["warm_s"] if 1 < k <= plan["warmup"] else 0.0   # and the other warm-up steps' work is slower
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        time.sleep(plan["host_s"])                         # the host's part: Python, kernel launches
        timed = k - plan["warmup"] - counted[0] - 1        # the k-th step after the warm-up, not a counted one
        more = extra[timed] if 0 <= timed < len(extra) and not counting else 0.0
        queued[k] = time.perf_counter()
        device.put(plan["device_s"] + more + warm, tag=k)  # this step's kernels, still to run
    syncs = [0]

    def sync():
        syncs[0] += 1
        device.sync()
    try:
        got = fn(step, sync, plan["warmup"], plan["repeats"], plan["peak"])
    finally:
        device.close()
    base = {"rank": rank, "kind": "measure", "device_ms": plan["device_s"] * 1e3, "first_s": plan["first_s"],
            "repeats": plan["repeats"], "host_ms": plan["host_s"] * 1e3}
    if not (isinstance(got, dict) and all(isinstance(got.get(k), (int, float)) for k in ("step_s", "flops", "mfu"))):
        return note(problems, {**base, "what": "type", "got": repr(got)[:80]})
    step_s, flops, mfu = float(got["step_s"]), float(got["flops"]), float(got["mfu"])
    if step_s < plan["host_s"] + 0.9 * plan["device_s"]:
        return note(problems, {**base, "what": "unsynced", "ms": step_s * 1e3,
                               "synced": syncs[0] >= 2 * plan["repeats"] and not behind})   # before and after each
    timed = [k for k in sorted(starts) if k > plan["warmup"] and k in device.done and k not in flops_at]
    took = [device.done[k] - starts[k] for k in timed]    # each timed step, from its call to the end of its work
    every = [device.done[k] - starts[k] for k in sorted(starts) if k in device.done and k not in flops_at]

    def near(v):
        return abs(step_s - v) <= plan["tolerance_s"]
    # a mean that holds the first step's 0.8 s: of the first `repeats` steps (no warm-up run) or of every step;
    # named where the answer is nearer to it than to the timed steps' mean
    first_in = [statistics.fmean(s) for s in (every[:plan["repeats"]], every) if s]
    if not took or ((step_s > statistics.median(took) + 0.1 or any(
            near(v) and abs(step_s - v) < abs(step_s - statistics.fmean(took)) for v in first_in))
            and not near(took[-1])):
        return note(problems, {**base, "what": "warmup", "ms": step_s * 1e3, "calls": calls[0],
                               "median_ms": statistics.median(took) * 1e3 if took else float("nan")})
    if syncs[0] < plan["repeats"]:
        return note(problems, {**base, "what": "per_step", "syncs": syncs[0], "repeats": plan["repeats"]})
    if calls[0] < plan["warmup"] + plan["repeats"]:
        return note(problems, {**base, "what": "no_warmup", "calls": calls[0], "warmup": plan["warmup"],
                               "repeats": plan["repeats"]})
    if behind:
        return note(problems, {**base, "what": "behind", "step": behind[0] - plan["warmup"],
                               "after_warmup": behind[0] == plan["warmup"] + 1})
    median, mean = statistics.median(took), statistics.fmean(took)
    if abs(step_s - median) > plan["tolerance_s"]:        # which other number it is, if any
        others = {"warmed": statistics.median(every), "mean": mean,      # the warm-up timed too; the mean;
                  "after": statistics.median(device.done[k] - queued[k] for k in timed),   # the clock started
                  "min": min(took), "last": took[-1]}                    # after step() returned: the work only
        fits = [n for n, v in others.items() if abs(step_s - v) <= plan["tolerance_s"]]
        return note(problems, {**base, "what": fits[0] if len(fits) == 1 else "off", "steps": len(every),
                               "ms": step_s * 1e3, "median_ms": median * 1e3, "mean_ms": mean * 1e3,
                               "slow_ms": plan["slow_s"] * 1e3, "host_ms": plan["host_s"] * 1e3,
                               "took_ms": ", ".join(f"{t * 1e3:.0f}" for t in took)})
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
         "rank {rank}: {ms:.2f} ms per step, less than a step takes ({host_ms:.0f} ms on the host, then "
         "{device_ms:.0f} ms of queued work or more), though sync() was called around every timed step: your "
         "clock does not count the time spent waiting (time.process_time counts this process's CPU time only). "
         "Time a step on the wall clock, time.perf_counter()"),
        (lambda p, W: p["what"] == "unsynced",
         "rank {rank}: {ms:.2f} ms per step, less than a step takes ({host_ms:.0f} ms on the host, then "
         "{device_ms:.0f} ms of queued work or more): the clock was read before the step's work was done (step() "
         "returns when its work is queued, as CUDA kernels and NCCL collectives do). Call sync() before reading "
         "the clock, at the start and at the end"),
        (lambda p, W: p["what"] == "warmup",
         "rank {rank}: {ms:.0f} ms per step, far above the median of the timed steps ({median_ms:.0f} ms): the "
         "first step, {first_s:g} s (lazy initialisation, autotuning), is in the number. Run the warm-up steps "
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
        (lambda p, W: p["what"] == "warmed",
         "rank {rank}: {ms:.1f} ms per step is the median of all {steps} steps, the warm-up's included, not of the "
         "{repeats} timed ones ({median_ms:.1f} ms; they took {took_ms} ms): the warm-up steps are slower (lazy "
         "initialisation, autotuning) and move the median. Run them untimed, then time the others"),
        (lambda p, W: p["what"] == "min",
         "rank {rank}: {ms:.1f} ms per step is the fastest timed step, not their median ({median_ms:.1f} ms; the "
         "steps took {took_ms} ms): the best case says what a step can do, not what a step takes. Return the "
         "median (statistics.median)"),
        (lambda p, W: p["what"] == "last",
         "rank {rank}: {ms:.1f} ms per step is the last timed step's time, one sample, not the median of the "
         "{repeats} timed steps ({median_ms:.1f} ms; they took {took_ms} ms): keep each step's time in a list and "
         "return its median"),
        (lambda p, W: p["what"] == "after",
         "rank {rank}: {ms:.1f} ms per step, {host_ms:.0f} ms short of the median of the timed steps "
         "({median_ms:.1f} ms): the clock started after step() returned, so the host's part of the step (Python, "
         "the kernel launches: {host_ms:.0f} ms here) is left out. sync(), read the clock, then call step()"),
        (lambda p, W: p["what"] == "off",
         "rank {rank}: {ms:.1f} ms per step, but the median of the timed steps, each from its call to the end of "
         "its work, is {median_ms:.1f} ms (they took {took_ms} ms, in order): time each of the {repeats} steps "
         "after the warm-up on its own, between two sync()s, and return their median (a warm-up step timed too "
         "moves it)"),
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
