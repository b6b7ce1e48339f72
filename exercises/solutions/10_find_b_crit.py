"""Solution of exercise 10.7: an adaptive sweep (for instructors).

Double the batch from 1 while a doubling still saves steps (two doublings in a row that save less than 15% end
it), three seeds per batch, each run's max_steps from what the last batch needed (a run short of the target is
run again four times longer); the median steps per batch, fitted to S(B) = S_min (1 + B_crit / B).
"""
import statistics

from mgpu_utils.costs.scaling import fit_critical_batch

SEEDS = 3


def steps_at(task, batch, guess):
    """Median steps to task.target over SEEDS runs at ``batch``; ``guess``: a max_steps to start from."""
    steps = []
    for seed in range(SEEDS):
        max_steps = guess
        losses = task.train(batch, max_steps, seed)
        while losses[-1] > task.target:                  # stopped short: the same run, four times longer
            max_steps *= 4
            losses = task.train(batch, max_steps, seed)
        steps.append(len(losses))
    return statistics.median(steps)


def find_b_crit(task):
    """The critical batch size of ``task`` (examples per step), from a sweep of task.train runs."""
    batches, steps = [], []
    batch, guess, flat = 1, 1000, 0
    while flat < 2:
        s = steps_at(task, batch, guess)
        if steps and s > 0.85 * steps[-1]:                # this doubling saved under 15%
            flat += 1
        batches.append(batch)
        steps.append(s)
        batch, guess = 2 * batch, int(1.2 * s) + 10       # a larger batch never needs more steps
    return fit_critical_batch(batches, steps)["b_crit"]
