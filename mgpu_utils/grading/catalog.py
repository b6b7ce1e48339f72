"""Every graded coding exercise of lessons 03 to 12, by id: ``EXERCISES["07.5"]`` is an
:class:`~mgpu_utils.grading.common.CodingExercise` (template, entry, world sizes, check, hints). Read in the
notebook by :mod:`mgpu_utils.grading.runner` and on the ranks by ``launch_scripts/grade_exercise.py``: it imports
no notebook-side module.
"""

from __future__ import annotations

from mgpu_utils.grading.coding import (benchmarking, case_studies, collectives, data_parallel, fault_tolerance,
                                       hybrid, memory, model_parallel, sync_async)
from mgpu_utils.grading.common import CodingExercise, always
from mgpu_utils.grading.rank_checks import check_attention_merge

#: What each problem a rank reports (:mod:`mgpu_utils.grading.rank_checks`) tells the student (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`), until each lesson's hints sit beside its checks.
HINTS: dict[str, list[tuple]] = {
    "shape": [(always, "rank {rank}: returned {got}, expected {want}")],
    "merge": [
        (lambda p, W: p["variant"] == "first_only",
         "rank {rank}: returned out1 and lse1 unchanged: the keys of the second part were left out"),
        (lambda p, W: p["variant"] == "overflow",
         "rank {rank}: the merge gives inf or nan when the scores are large (here up to {max_score:.0f}): exp() "
         "overflows above about 88 in float32 and 709 in float64. Subtract the larger of lse1 and lse2 before exponentiating (the max "
         "trick of the online softmax), or use torch.logaddexp"),
        (lambda p, W: p["variant"] == "lse",
         "rank {rank}: the output is right, but the lse returned is {lse_is}, not log(exp(lse1) + exp(lse2)): the "
         "next block of the ring merges with this lse, so from the third block on the result goes wrong"),
        (lambda p, W: p["variant"] == "average",
         "rank {rank}: the output is the plain average of out1 and out2: weight each part by its share of the "
         "softmax's mass, exp(lse_i - lse), where lse is the merged one"),
        (lambda p, W: p["variant"] == "sum",
         "rank {rank}: the output is out1 + out2: each part is already normalised over its own keys, so weight "
         "them by exp(lse_i - lse) (the weights sum to 1)"),
        (lambda p, W: p["variant"] == "unnormalised",
         "rank {rank}: the output is out1 exp(lse1) + out2 exp(lse2), not divided by exp(lse1) + exp(lse2)"),
        (lambda p, W: p["variant"] == "max_weights",
         "rank {rank}: the output weights the parts by exp(lse_i - max(lse1, lse2)): those weights sum to more than "
         "1. Subtract the merged lse, log(exp(lse1) + exp(lse2)), so that the weights are the parts' shares of the "
         "softmax's mass"),
        (lambda p, W: p["variant"] == "empty",
         "rank {rank}: merging into the empty start (out 0, lse -inf: no keys seen yet) gives {what}: with "
         "lse1 = -inf the result must be (out2, lse2); -inf - (-inf) is nan, so subtract the larger lse"),
        (lambda p, W: p["variant"] == "ring",
         "rank {rank}: your merge is right on two parts, but ring attention with it (causal={causal}) differs from "
         "full attention by {max_diff:.3g} at world size {W}: does it change its inputs in place?"),
        (always, "rank {rank}: the merged output differs from attention over both key sets by {max_diff:.3g}: out = "
                 "out1 exp(lse1 - lse) + out2 exp(lse2 - lse) with lse = log(exp(lse1) + exp(lse2))")],
}


_RECORDS = [
    CodingExercise("12.3", "12_merge_attention.py", "merge", (2, 3), check_attention_merge, HINTS,
                   "equal to attention over both key sets (scores up to about 1,900, and from the empty start), and "
                   "ring attention with it equals full attention, causal and not"),
]
#: The lessons' modules of :mod:`mgpu_utils.grading.coding`, in lesson order.
LESSONS = (data_parallel, collectives, model_parallel, hybrid, memory, sync_async, case_studies, benchmarking,
           fault_tolerance)
#: Every graded coding exercise, by id.
EXERCISES = {e.id: e for records in [*(m.EXERCISES for m in LESSONS), _RECORDS] for e in records}


def exercise(exercise_id: str) -> CodingExercise:
    """The exercise ``exercise_id`` (e.g. "04.4").

    Raises:
        KeyError: unknown exercise id (the message lists the known ones).
    """
    if exercise_id not in EXERCISES:
        raise KeyError(f"unknown coding exercise {exercise_id!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[exercise_id]
