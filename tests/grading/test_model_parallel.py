"""Exercise 05.4's grader (mgpu_utils.grading.coding.model_parallel, check_schedule), round 2 of issue 55: 1F1B
written other ways (the warm-up counted with the first backward's forward, a loop that runs a backward once
p - r micro-batches are in flight, actions as lists), a warm-up not capped at m (right while m >= p, so the
grader also asks for m < p) and a cool-down run last in, first out. Right variants pass; wrong ones get the
hint that names them. Each list is graded in one launch at 3 ranks."""
import re

from helpers import solution_module, wrong
from mgpu_utils.grading.runner import grade_many
from mgpu_utils.parallel.schedules import one_f_one_b_actions

WARMUP = "        warmup = min(p - r - 1, m)"
STEADY = ("        for i in range(m - warmup):\n            actions += [(\"F\", warmup + i, r), (\"B\", i, r)]\n")
COOLDOWN = "        actions += [(\"B\", i, r) for i in range(m - warmup, m)]\n"
BODY = ("        warmup = min(p - r - 1, m)            # the last stage starts backwards at once, stage 0 after p - 1 "
        "forwards\n        actions = [(\"F\", i, r) for i in range(warmup)]\n" + STEADY + COOLDOWN)

RIGHT = {   # name: (text of the solution, replaced by)
    "p - r forwards first, then backward-forward pairs": (
        BODY, "        warm = min(p - r, m)\n        actions = [(\"F\", i, r) for i in range(warm)]\n"
              "        for i in range(m - warm):\n            actions += [(\"B\", i, r), (\"F\", warm + i, r)]\n"
              "        actions += [(\"B\", i, r) for i in range(m - warm, m)]\n"),
    "a backward whenever p - r micro-batches are in flight": (
        BODY, "        actions, f, b = [], 0, 0\n        while b < m:\n"
              "            if f < m and f - b < p - r:\n                actions.append((\"F\", f, r))\n"
              "                f += 1\n            else:\n                actions.append((\"B\", b, r))\n"
              "                b += 1\n"),
    "actions as lists": (
        BODY, BODY.replace('("F", i, r)', '["F", i, r]').replace('("F", warmup + i, r), ("B", i, r)',
                                                                 '["F", warmup + i, r], ["B", i, r]')
                  .replace('("B", i, r) for', '["B", i, r] for')),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "a warm-up not capped at m": (WARMUP, "        warmup = p - r - 1",
                                  r"with p = 3 and m = 1, fewer micro-batches than stages: .* the warm-up cannot run "
                                  r"more forwards than there are micro-batches: min\(p - r - 1, m\)"),
    "the cool-down last in, first out": (
        COOLDOWN, "        actions += [(\"B\", i, r) for i in reversed(range(m - warmup, m))]\n",
        r"with p = 3 and m = 5 the messages between two ranks are out of order: rank 1 sends \('B', 3, 1\) while "
        r"rank 0 waits for \('B', 4, 1\)\. .* in micro-batch order"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("05.4", wrong(tmp_path / str(k), "05.4", old, new)))
    return out


def test_right_schedules_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_schedules_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"05.4": (len(RIGHT), len(WRONG))}


def test_the_library_1f1b_is_the_worked_solution_built_another_way():
    """Lesson 05 draws and runs schedules.one_f_one_b_actions (from each action's slot); the worked solution of
    05.4 builds the lists by warm-up, steady state and drain. A class copy keeps the first only: they must agree."""
    mine = solution_module("05.4").one_f_one_b
    differ = [(p, m) for p in range(1, 7) for m in range(1, 13) if one_f_one_b_actions(p, m) != mine(p, m)]
    assert differ == []

