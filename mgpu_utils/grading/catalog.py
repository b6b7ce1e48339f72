"""Every graded coding exercise of lessons 03 to 13, by id: ``EXERCISES["07.5"]`` is a
:class:`~mgpu_utils.grading.common.CodingExercise` (template, entry, world sizes, check, hints), gathered from
the lesson modules of :mod:`mgpu_utils.grading.coding`. Read in the notebook by :mod:`mgpu_utils.grading.runner`
and on the ranks by ``launch_scripts/grade_exercise.py``: it imports no notebook-side module.
"""

from __future__ import annotations

from mgpu_utils.grading.coding import (benchmarking, capstone, case_studies, collectives, context_experts,
                                       data_parallel, fault_tolerance, hybrid, memory, model_parallel, sync_async)
from mgpu_utils.grading.common import CodingExercise

#: The lessons' modules of :mod:`mgpu_utils.grading.coding`, in lesson order.
LESSONS = (data_parallel, collectives, model_parallel, hybrid, memory, context_experts, sync_async, case_studies,
           benchmarking, fault_tolerance, capstone)
#: Every graded coding exercise, by id, in lesson order.
EXERCISES = {e.id: e for module in LESSONS for e in module.EXERCISES}


def exercise(exercise_id: str) -> CodingExercise:
    """The exercise ``exercise_id`` (e.g. "04.4").

    Raises:
        KeyError: unknown exercise id (the message lists the known ones).
    """
    if exercise_id not in EXERCISES:
        raise KeyError(f"unknown coding exercise {exercise_id!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[exercise_id]
