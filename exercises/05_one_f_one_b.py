"""Exercise 05.4: write the 1F1B pipeline schedule (notebooks/05_model_parallel.ipynb, section on schedules).

A schedule is, for every rank r (which holds pipeline stage r), the ordered list of its actions:
("F", mb, r) runs the forward of micro-batch mb through stage r, ("B", mb, r) its backward. GPipe runs all
m forwards, then all m backwards: rank r then holds the activations of all m micro-batches at once. 1F1B
(PipeDream-flush) has the same bubble, but each rank starts its backwards early: a few warm-up forwards,
then one forward and one backward in turn, then the remaining backwards. How many warm-up forwards does
stage r need so that the first backward's gradient has arrived (and no stage waits longer than GPipe)?

The grader checks your lists (every forward and backward once, forward before backward, no deadlock with
the executor's messages, bubble (p-1)/(m+p-1), and at most min(p-r, m) micro-batches in flight on rank r),
then runs them for real with the course's executor on 2, 3 and 4 ranks and compares the gradients with one
process. Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("05.4")
"""


def one_f_one_b(p: int, m: int) -> list[list[tuple]]:
    """The 1F1B action list of each rank for p stages (one per rank) and m micro-batches."""
    schedule = []
    for r in range(p):
        # TODO: this is GPipe (all forwards, then all backwards). Run `warmup` forwards, then alternate
        #       ("F", next micro-batch) and ("B", oldest micro-batch not yet backwarded), then the rest of the backwards.
        warmup = m
        actions = [("F", i, r) for i in range(warmup)] + [("B", i, r) for i in range(m)]
        schedule.append(actions)
    return schedule
