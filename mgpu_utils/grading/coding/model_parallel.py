"""The graded coding exercise of lesson 05, model parallelism (notebooks/05_model_parallel.ipynb): 05.4, the
1F1B schedule as action lists.

The check runs the student's lists through the course's schedule simulator (complete, deadlock-free, 1F1B's
bubble and memory) and then for real, one stage per rank, with the course's pipeline executor, against the
gradients of one process. The hints of the problems it reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy

import torch

from mgpu_utils.grading.common import CodingExercise, always, diff, note
from mgpu_utils.parallel.pipeline import build_model, run_schedule, split_stages
from mgpu_utils.parallel.schedules import (bubble_formula, bubble_fraction, check_p2p_deadlock_free, p2p_plan,
                                           peak_in_flight, simulate)


def _schedule_problem(acts, p, m, r) -> dict | None:
    """05.4's checks without running, or the problem found: every micro-batch's F and B once per rank, no deadlock
    (simulated, and the messages in order), 1F1B's bubble, at most min(p - r, m) micro-batches in flight."""
    want = [sorted((k, i, q) for k in "FB" for i in range(m)) for q in range(p)]
    if not isinstance(acts, list) or len(acts) != p or any(sorted(map(tuple, a)) != w for a, w in zip(acts, want)):
        return {"rank": r, "kind": "actions", "p": p, "m": m, "few": m < p - 1}
    try:
        timeline = simulate(acts)
        check_p2p_deadlock_free([p2p_plan(acts[q], q, p) for q in range(p)])
    except ValueError as e:
        return {"rank": r, "kind": "deadlock", "p": p, "m": m, "detail": str(e)[:300]}
    bubble, peak = bubble_fraction(timeline), peak_in_flight(acts)
    if bubble > bubble_formula(p, m) + 1e-9:
        warm = [next((i for i, a in enumerate(acts[q]) if a[0] == "B"), m) for q in range(p)]
        q = next((q for q in range(p) if warm[q] != min(p - q, m)), None)
        why = "" if q is None else (f" (rank {q} runs {warm[q]} forward(s) before its first backward; 1F1B's "
                                    f"rank r runs min(p - r, m) = {min(p - q, m)})")
        return {"rank": r, "kind": "bubble", "p": p, "m": m, "bubble": bubble, "formula": bubble_formula(p, m),
                "warmup": why}
    if any(peak[q] > min(p - q, m) for q in range(p)):
        q = next(q for q in range(p) if peak[q] > min(p - q, m))
        return {"rank": q, "kind": "memory", "p": p, "m": m, "peak": peak[q], "limit": min(p - q, m)}
    return None


def check_schedule(fn, ctx, problems, m=5):
    """05.4: ``fn(p, m)`` action lists: complete, deadlock-free, 1F1B's bubble and memory (:func:`_schedule_problem`),
    at m = 5 and with fewer micro-batches than stages, m = 1 and p - 1 (a warm-up of p - r - 1 forwards, not
    capped at m, is right while m >= p - 1); then run for real, m = 5, one stage per rank, against one process."""
    p, r = ctx.world_size, ctx.rank
    acts = fn(p, m)                                       # the same lists on every rank: the same verdicts
    for k in [m] + sorted({1, p - 1} - {m}):
        problem = _schedule_problem(acts if k == m else fn(p, k), p, k, r)
        if problem:
            return note(problems, problem)
    model, g = build_model(2 * p, 16), torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * m, 16, generator=g), torch.randn(4 * m, 16, generator=g)
    torch.nn.MSELoss()(model(x), y).backward()            # the single-process reference
    mine = split_stages(copy.deepcopy(model), p)[r]
    run_schedule(acts[r], {r: mine}, list(x.chunk(m)), list(y.chunk(m)), torch.nn.MSELoss(), r, p)
    worst = max(diff(a.grad, b.grad) for a, b in zip(mine.parameters(), split_stages(model, p)[r].parameters()))
    if worst > 1e-5:
        note(problems, {"rank": r, "kind": "param", "what": "grad", "max_diff": worst})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "actions": [
        (lambda p, W: p.get("few"),
         "with p = {p} and m = {m}, fewer micro-batches than stages: rank r's list must hold ('F', i, r) and "
         "('B', i, r) exactly once for every micro-batch i in 0..m-1; the warm-up cannot run more forwards than there "
         "are micro-batches: min(p - r - 1, m)"),
        (always, "with p = {p} and m = {m}: return one list per rank, and rank r's list must hold ('F', i, r) and "
                 "('B', i, r) exactly once for every micro-batch i in 0..m-1")],
    "deadlock": [
        (lambda p, W: " while rank " in p["detail"],
         "with p = {p} and m = {m} the messages between two ranks are out of order: {detail}. Messages pair up in the "
         "order they are posted: every rank runs its backwards, as its forwards, in micro-batch order 0, 1, ..., m-1 "
         "(first in, first out)"),
        (always, "with p = {p} and m = {m} the schedule deadlocks: {detail}")],
    "bubble": [(always, "with p = {p} and m = {m} the bubble is {bubble:.3f}, more than 1F1B's (p-1)/(m+p-1) = "
                        "{formula:.3f}: a stage waits for a backward it could have run earlier{warmup}")],
    "memory": [(always, "rank {rank} holds {peak:g} micro-batches' activations at once (p = {p}, m = {m}); 1F1B holds "
                        "at most min(p - r, m) = {limit}: start the backwards after fewer warm-up forwards")],
    "param": [(always, "rank {rank}: gradients differ from one process's by {max_diff:.3g} (world size {W})")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="05.4", template="05_one_f_one_b.py", entry="one_f_one_b", world_sizes=(2, 3, 4),
        check=check_schedule, hints=HINTS,
        what="complete, deadlock-free, the bubble (p-1)/(m+p-1) with at most min(p-r, m) micro-batches in "
             "flight, and the gradients of one process when run on real ranks"),
]
