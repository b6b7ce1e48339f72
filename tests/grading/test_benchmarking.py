"""Exercise 11.5's grader (mgpu_utils.grading.coding.benchmarking), round 2 of issue 55: a timed step that
starts while earlier work is still queued, and a mean where the median is asked for (one timed step is 0.6 s
slower: the median ignores it, a mean moves by 75 ms); the fastest step, the last one, a clock started after
step() returned, the warm-up timed too (the steps' times vary in an order drawn each run). Right variants pass; wrong ones get the hint that
names them. Each list is graded in one launch at 3 ranks."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

START = "        sync()                                   # the clock starts when the queue is empty ...\n"
LOOP = ("    times = []\n    for _ in range(repeats):\n" + START + "        t0 = time.perf_counter()\n        step()\n"
        "        sync()                                   # ... and stops when this step's work is done\n"
        "        times.append(time.perf_counter() - t0)\n")
MEDIAN = "statistics.median(times)"

RIGHT = {   # name: (text of the solution, replaced by)
    "a nanosecond clock": ("        t0 = time.perf_counter()\n", "        t0 = time.perf_counter_ns() / 1e9\n"),
    "the middle of the sorted times": (
        MEDIAN, "sorted(times)[len(times) // 2 - 1] / 2 + sorted(times)[len(times) // 2] / 2"),
    "one sync after the warm-up, then back-to-back synced steps": (
        LOOP, "    sync()\n    times, t0 = [], time.perf_counter()\n    for _ in range(repeats):\n        step()\n"
              "        sync()\n        t1 = time.perf_counter()\n        times.append(t1 - t0)\n        t0 = t1\n"),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "no sync between the warm-up and the first timed step": (
        START, "", r"the first timed step started while the warm-up's work was still queued"),
    "the mean of synced steps": (
        MEDIAN, "statistics.fmean(times)",
        r"[\d.]+ ms per step is the mean of the timed steps \([\d.]+ ms\), not their median \([\d.]+ ms\)"),
    "the synced loop timed once and averaged": (
        LOOP, "    sync()\n    t0 = time.perf_counter()\n    for _ in range(repeats):\n        step()\n        sync()\n"
              "    times = [(time.perf_counter() - t0) / repeats]\n",
        r"ms per step is the mean of the timed steps .* take the median"),
    "a CPU-time clock": (
        ["        t0 = time.perf_counter()\n", "times.append(time.perf_counter() - t0)"],
        ["        t0 = time.process_time()\n", "times.append(time.process_time() - t0)"],
        r"though sync\(\) was called around every timed step: your clock does not count the time spent waiting"),
    "FLOPs summed over the module tree": (
        "counter.get_total_flops()", "sum(sum(ops.values()) for ops in counter.get_flop_counts().values())",
        r"FLOPs for the one step you counted, .* did you sum get_flop_counts\(\) over the module tree"),
    # a thirteenth red team's (2026-12-07): the timed steps' work varies, in an order drawn each run, and the
    # median lies 40 ms or more from every single step: a hint names a mistake only where one number fits
    "the fastest timed step (best of N)": (
        MEDIAN, "min(times)", r"(is the fastest timed step, not their median|but the median of the timed steps)"),
    "the last timed step's time": (
        MEDIAN, "times[-1]", r"(is the last timed step's time, one sample|but the median of the timed steps)"),
    "the clock started after step() returns": (
        "        t0 = time.perf_counter()\n        step()\n", "        step()\n        t0 = time.perf_counter()\n",
        r"(the clock started after step\(\) returned|but the median of the timed steps)"),
    "the warm-up steps timed with the others": (
        ["    for _ in range(warmup):", "        step()\n    times = []\n    for _ in range(repeats):\n"],
        ["    if False:", "        step()\n    times = []\n    for _ in range(warmup + repeats):\n"],
        r"(is the median of all \d+ steps, the warm-up's included|but the median of the timed steps.*a warm-up step "
        r"timed too moves it)"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("11.5", wrong(tmp_path / str(k), "11.5", old, new)))
    return out


def test_right_timings_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_timings_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"11.5": (len(RIGHT), len(WRONG))}
