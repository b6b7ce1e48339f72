"""The graded coding exercise of lesson 09, synchronous and asynchronous training
(notebooks/09_sync_vs_async.ipynb): 09.4, local SGD.

The check trains one replica per rank in this process, averaged every ``period`` steps, against the student's
class after every step, and counts the collectives in between (there must be none). The hints of the problems
it reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import CodingExercise, always, diff, note
from mgpu_utils.measure.comm_calls import counted_collectives
from mgpu_utils.models import make_mlp


def check_local_sgd(cls, ctx, problems, period=3, steps=7, batch=8):
    """09.4: ``cls(model, period)`` with ``.after_step()`` after every SGD step, against W replicas trained in this
    process on the ranks' shards and averaged after steps period, 2 period, ...; and silent in between. Another
    instance, on a copy of the model, takes one step first: a step count kept outside the object (a module-level
    global, a class attribute) counts it too. Each step's gradients are compared before and after after_step():
    averaging p.grad after the optimizer's step leaves the parameters this rank's own."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    model = make_mlp(32, 1)
    x, y = load_data()[0][:world * steps * batch]
    shards = [(x.flatten(1)[r::world], y[r::world]) for r in range(world)]
    replicas, mine = [copy.deepcopy(model) for _ in range(world)], copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in replicas + [mine]]
    flat = lambda m: torch.cat([q.detach().reshape(-1) for q in m.parameters()])

    def sgd(m, opt, r, s):                                # one local step of rank r's replica on its batch s
        (xs, ys), b = shards[r], slice(s * batch, (s + 1) * batch)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(m(xs[b]), ys[b]).backward()
        opt.step()
    other = copy.deepcopy(model)                          # another model's averaging, one step ahead of yours
    spare = cls(other, period)
    sgd(other, torch.optim.SGD(other.parameters(), lr=0.1), rank, 0)
    spare.after_step()
    sync, talked, wrong = cls(mine, period), [], None
    for s in range(1, steps + 1):
        for r, m in enumerate(replicas):
            sgd(m, opts[r], r, s - 1)
        before = [flat(m) for m in replicas]              # each rank's own parameters, before any averaging
        if s % period == 0:
            with torch.no_grad():
                for qs in zip(*(m.parameters() for m in replicas)):
                    mean = torch.stack(qs).mean(0)
                    for q in qs:
                        q.copy_(mean)
        sgd(mine, opts[-1], rank, s - 1)
        calls, grads = [], [q.grad.clone() for q in mine.parameters()]
        with counted_collectives(calls, cls):
            sync.after_step()
        talked += [s] if calls else []
        got, want = flat(mine), flat(replicas[rank])
        if wrong is None and diff(got, want) > 1e-5:
            total = torch.stack(before).sum(0)
            near = lambda t: min(diff(got, t), diff(got, t / world)) < 1e-6     # t, or t divided by the world
            wrong = {"step": s, "max_diff": diff(got, want), "own": near(before[rank]),
                     "summed": diff(got, total) < 1e-4,
                     "copied_from": next((q for q in range(world) if q != rank and near(before[q])), None),
                     "grads": any(q.grad is not None and not torch.equal(q.grad, g)      # p.grad averaged
                                  for q, g in zip(mine.parameters(), grads))}
    expected = [s for s in range(1, steps + 1) if s % period == 0]
    if talked != expected:
        note(problems, {"rank": rank, "kind": "talked", "talked": talked, "want": expected, "period": period,
                        "shared": talked == [s for s in range(1, steps + 1) if (s + 1) % period == 0]})
    elif wrong:
        note(problems, {"rank": rank, "kind": "local_sgd", **wrong})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "talked": [
        (lambda p, W: not p["talked"],
         "rank {rank}: the ranks never communicated: after steps {want} (every {period} steps) replace each "
         "parameter by its mean over the ranks"),
        (lambda p, W: p.get("shared"),
         "rank {rank}: the ranks communicated after steps {talked}, one step early, as if the step that another "
         "PeriodicAveraging took (on another model, before yours) were yours: keep the step count in the object "
         "(self.steps), not in a module-level global or a class attribute; with period {period} they average "
         "after steps {want}"),
        (always, "rank {rank}: the ranks communicated after steps {talked}; with period {period} they average after "
                 "steps {want} only (count the steps from 1: the first averaging follows step {period}) and do not "
                 "communicate in between")],
    "local_sgd": [
        (lambda p, W: p["own"] and p.get("grads"),
         "rank {rank}: after step {step} the parameters are still this rank's own, and their gradients changed: "
         "local SGD averages the parameters themselves after the optimizer's step (all_reduce(p), then divide by "
         "{W}); averaging p.grad once the step is taken changes nothing"),
        (lambda p, W: p["own"],
         "rank {rank}: after step {step} the parameters are still this rank's own (or them divided by {W}): the "
         "all-reduce's result was not kept (all_reduce works in place on the tensor it is given: pass the parameter "
         "itself)"),
        (lambda p, W: p["summed"],
         "rank {rank}: after step {step} the parameters are the sum over the ranks, {W} times the mean: divide by "
         "the world size"),
        (lambda p, W: p["copied_from"] is not None,
         "rank {rank}: after step {step} the parameters are rank {copied_from}'s own (or them divided by {W}): a "
         "broadcast copies one rank's "
         "parameters; the mean needs all_reduce (a sum) and a division by {W}"),
        (always, "rank {rank}: after step {step} the parameters differ from local SGD's by {max_diff:.3g} (world size "
                 "{W})")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="09.4", template="09_local_sgd.py", entry="PeriodicAveraging", world_sizes=(2, 3),
        check=check_local_sgd, hints=HINTS,
        what="after every one of 7 SGD steps the parameters equal local SGD's (replicas averaged after steps 3 "
             "and 6), with no communication in between"),
]
