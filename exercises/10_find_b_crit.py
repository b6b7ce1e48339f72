"""Exercise 10.7 (design): find the critical batch size of a task from a sweep you run
(notebooks/10_case_studies.ipynb, section 1's "Deeper: do larger batches converge faster?", which measures it
for the digits MLP and gives McCandlish et al.'s S(B) = S_min (1 + B_crit / B)).

Write find_b_crit(task) -> float: the task's B_crit, in examples per step. ``task`` is a simulated training task
(mgpu_utils.grading.coding.case_studies.SweepTask); all you can do with it is train:

    losses = task.train(batch, max_steps, seed=0)   # one run at global batch `batch`, until the held-out loss
                                                    # reaches task.target, or max_steps steps
    reached = losses[-1] <= task.target              # then len(losses) is this run's steps to the target
    task.budget, task.spent                          # examples (batch x steps, all runs) allowed, and used
    task.runs                                        # (batch, seed, steps, reached) of each run so far

Each run trains at the best learning rate for its batch. Its steps to the target vary by about 10% with the
seed, and a run that stops at max_steps short of the target has not measured its steps: run it again with more
(the same seed gives the same losses first). A run costs batch x its steps examples; a run that would take the
sweep past task.budget raises BudgetSpent, and the task fails even if you catch it (the budget is far more than a
sweep needs, far less than a run at every batch up to 10^5). You know nothing else about the task: not where
B_crit is (between 1 and 10^5), nor how many steps a run takes.

Decide which batch sizes to run, how many seeds, how long, and how to turn the steps into B_crit.
mgpu_utils.costs.scaling.fit_critical_batch(batches, steps) may be used (it is the lesson's fit). The grader gives
your function six tasks, the two of practice_tasks() (in mgpu_utils.grading.coding.case_studies) and four it
does not name, with B_crit from under 10 to over 10,000, and accepts an answer within 1.5 times the task's
B_crit. A task that fails gets a hint that says what your sweep on it shows. Try it on the named tasks in a
cell first (they tell you their B_crit; lesson 10's try-it cell does this with your copy):

    from mgpu_utils.grading.coding.case_studies import practice_tasks
    for task, b_crit in practice_tasks():
        print(task.name, find_b_crit(task), b_crit, f"{task.spent:,} of {task.budget:,} examples")

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("10.7")
"""


def find_b_crit(task):
    """The critical batch size of ``task`` (examples per step), from a sweep of task.train runs."""
    # TODO: choose the batch sizes, seeds and max_steps of a sweep, read each run's steps to task.target, and
    # turn them into B_crit
    return None
