"""The graded coding exercises of lesson 10, case studies (notebooks/10_case_studies.ipynb): 10.5, a GAN step
with DDP-wrapped models; 10.7 (design), the critical batch size of a task found from a sweep the student runs.

10.5's check runs 3 to 5 of the student's steps under DDP against the same steps in one process on every rank's
samples, and names a wrong result from the typical wrong steps run the same way (:data:`GAN_VARIANTS`); then it
checks the losses each step returned. It refuses a step that moves data itself (a collective of its own, or one
of DDP's methods called directly: an eighteenth red team's 10.5 x03 broadcast the batch with
``_distributed_broadcast_coalesced``), that computes G or D on more rows than this rank's share needs (the inner
modules' forward hooks count every call, through DDP or not), or that makes DDP all-reduce G's gradients more than
once or D's more than three times (x02 smuggled the batch through G's reducer as the upstream gradients of extra
backwards). Not seen: a copy of the models made without the hooks, trained on data smuggled within those bounds.

10.7's check (:func:`check_b_crit`) hands the student's ``find_b_crit`` each task of :data:`SWEEP_TASKS`, a
simulated training run (:class:`SweepTask`) whose steps to a target loss follow S(B) = S_min (1 + B_crit / B),
and accepts an answer within :data:`B_CRIT_BAND` times the task's B_crit; the hint names the task and what the
sweep the student ran shows (its batches, runs that never reached the target, the budget). Pure numpy: the same
answer on every machine, however loaded.

The hints of the problems they report and the exercises' records are here too.
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import secrets
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.costs.scaling import critical_batch_steps
from mgpu_utils.grading.common import CodingExercise, always, diff, note
from mgpu_utils.measure import comm_calls
from mgpu_utils.measure.comm_calls import patched_collectives


#: Exercise 10.5's reference procedures, in one process: the right step and the typical wrong ones, so that a
#: student's result can be named (the first that matches wins).
GAN_VARIANTS = ("right", "g_first", "g_labels_fake", "no_zero_d", "no_zero_g", "no_d_step", "no_g_step", "nothing",
                "d_half")


def gan_reference_step(G, D, opt_g, opt_d, real, z, variant: str, terms: dict | None = None
                       ) -> tuple[float, float] | None:
    """One step of ``variant`` (see :data:`GAN_VARIANTS`) on plain modules: D on real (1) and detached fakes (0),
    then G through the updated D (1); the wrong variants change one thing ("d_half": D's loss is the mean over
    real and fakes in one batch, half the sum of the two means). Returns (D's loss, G's loss). ``terms``: filled
    with each sample's terms of the two losses ("real", "fake", "g": [batch] float64 tensors), so that the loss of
    any rank's rows is their mean."""
    bce, ones, zeros = F.binary_cross_entropy_with_logits, torch.ones(len(real), 1), torch.zeros(len(real), 1)
    fake = G(z)

    losses = {}

    def d_step():
        if variant != "no_zero_d":
            opt_d.zero_grad(set_to_none=True)
        on_real, on_fake = D(real), D(fake.detach())
        loss = (bce(on_real, ones) + bce(on_fake, zeros)) / (2 if variant == "d_half" else 1)
        loss.backward()
        losses["d"] = loss.item()
        if terms is not None:
            terms["real"] = bce(on_real, ones, reduction="none").detach().double().reshape(-1)
            terms["fake"] = bce(on_fake, zeros, reduction="none").detach().double().reshape(-1)
        if variant != "no_d_step":
            opt_d.step()

    def g_step():
        if variant != "no_zero_g":
            opt_g.zero_grad(set_to_none=True)
        on_fake = D(fake)
        loss = bce(on_fake, zeros if variant == "g_labels_fake" else ones)
        loss.backward()
        losses["g"] = loss.item()
        if terms is not None:
            terms["g"] = bce(on_fake, ones, reduction="none").detach().double().reshape(-1)
        if variant != "no_g_step":
            opt_g.step()
    if variant == "nothing":
        return None
    for step in ((g_step, d_step) if variant == "g_first" else (d_step, g_step)):
        step()
    return losses["d"], losses["g"]


def check_gan_step(fn, ctx, problems, steps=None, batch=8):
    """10.5: ``fn(G, D, opt_g, opt_d, real, z)`` on DDP-wrapped G and D, 3 to 5 steps (drawn each run), against
    :func:`gan_reference_step` in one process on every rank's samples at once: the parameters (a wrong result
    named from :data:`GAN_VARIANTS`; G unchanged and without a gradient: G's loss on detached fakes), then the
    (d_loss, g_loss) returned: floats, on each rank its own rows' losses or the whole batch's (the mean over the
    ranks is one process's on the whole batch). The optimizers are SGD with a learning rate and a momentum drawn
    each run, and the data's seed too (a fifteenth red team's 10.5, 2026-12-07: an update hard-coded as the
    grader's SGD, the whole batch rebuilt on every rank, a step right for two calls only); every step must call
    the DDP-wrapped G and D (not ``.module``) and move no data itself (a collective of torch.distributed called
    from its code: the whole batch gathered on every rank)."""
    world, rank = ctx.world_size, ctx.rank
    draw = torch.tensor([secrets.randbelow(2 ** 31), 0.03 + secrets.randbelow(1001) * 5e-5,
                         0.5 + secrets.randbelow(1001) * 4e-4, 3 + secrets.randbelow(3)], dtype=torch.float64)
    dist.broadcast(draw, src=0)                           # the ranks agree on rank 0's draw
    seed, lr, momentum = int(draw[0]), round(float(draw[1]), 6), round(float(draw[2]), 6)
    steps = int(draw[3]) if steps is None else steps
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    torch.manual_seed(0)
    g0 = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    d0 = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
    gen = torch.Generator().manual_seed(seed)
    data = [(torch.randn(world * batch, 16, generator=gen) + 2, torch.randn(world * batch, 8, generator=gen))
            for _ in range(steps)]
    flat = lambda *ms: torch.cat([q.detach().reshape(-1) for m in ms for q in m.parameters()])
    g, d = copy.deepcopy(g0), copy.deepcopy(d0)
    gd, dd = DDP(g), DDP(d)
    opt_g, opt_d = sgd(gd), sgd(dd)
    forwards = {"G": 0, "D": 0}
    rows = {"G": 0, "D": 0}                               # the rows each model computed on, however it was called
    for name, m, inner in (("G", gd, g), ("D", dd, d)):
        m.register_forward_pre_hook(lambda mod, args, name=name: forwards.__setitem__(name, forwards[name] + 1))
        inner.register_forward_pre_hook(lambda mod, args, name=name: rows.__setitem__(
            name, rows[name] + (args[0].shape[0] if args and isinstance(args[0], torch.Tensor) and args[0].dim()
                                else 0)))
    sizes = {"G": sum(q.numel() for q in g.parameters()), "D": sum(q.numel() for q in d.parameters())}
    error, returned, moved, bypassed, excess = "", [], [], None, None
    file = getattr(getattr(fn, "__code__", None), "co_filename", None)
    try:
        for s, (real, z) in enumerate(data):
            before, ddp_calls = dict(forwards), []
            rows.update(G=0, D=0)
            with patched_collectives(lambda name, original: _moving(name, original, moved), fn,
                                     below=lambda call: _moving_below(call, moved, ddp_calls, file)):
                returned.append(fn(gd, dd, opt_g, opt_d, real[rank::world], z[rank::world]))
            unused = [k for k in forwards if forwards[k] == before[k]]
            bypassed = bypassed or ({"step": s + 1, "model": unused[0]} if unused else None)
            excess = excess or _excess(s, rows, ddp_calls, sizes, len(real[rank::world]))
    except RuntimeError as e:                             # DDP's or autograd's own error, the same on every rank
        error = str(e).strip().splitlines()[0][:200]
        if "modified by an inplace operation" in str(e):
            return note(problems, {"rank": rank, "kind": "gan_ddp", "what": "stale", "error": error})
        if not any(k in str(e) for k in ("only once", "finished reduction", "second time")):
            raise
    if error:
        return note(problems, {"rank": rank, "kind": "gan_ddp", "error": error})
    moved = _moved_data(moved, len(returned))
    if moved:
        return note(problems, {"rank": rank, "kind": "gan_ddp", "what": "moved", "call": moved[0][0],
                               "n": len(moved)})
    if excess:
        return note(problems, {"rank": rank, "kind": "gan_ddp", **excess})
    losses = torch.tensor([r if _pair(r) else (float("nan"),) * 2 for r in returned], dtype=torch.float64)
    everyone = [torch.zeros_like(losses) for _ in range(world)]
    dist.all_gather(everyone, losses)                     # every rank's, whatever it returned
    got = flat(g, d)
    for variant in GAN_VARIANTS:
        rg, rd = copy.deepcopy(g0), copy.deepcopy(d0)
        og, od = sgd(rg), sgd(rd)
        want, own = [], []
        for real, z in data:
            terms = {}
            want.append(gan_reference_step(rg, rd, og, od, real, z, variant, terms if variant == "right" else None))
            if variant == "right":
                own.append([terms["real"][r::world].mean().item() + terms["fake"][r::world].mean().item()
                            for r in range(world)] + [terms["g"][r::world].mean().item() for r in range(world)])
        if diff(got, flat(rg, rd)) < 1e-5:
            if variant == "no_g_step" and all(q.grad is None or not q.grad.any() for q in g.parameters()):
                note(problems, {"rank": rank, "kind": "gan", "variant": "g_no_grad", "steps": steps})
            elif variant != "right":
                note(problems, {"rank": rank, "kind": "gan", "variant": variant, "steps": steps})
            elif bypassed:                                # right, but not through DDP
                note(problems, {"rank": rank, "kind": "gan_ddp", "what": "module", **bypassed})
            else:
                own = torch.tensor(own, dtype=torch.float64).reshape(steps, 2, world).permute(2, 0, 1)
                _check_losses(returned, everyone, own, torch.tensor(want, dtype=torch.float64), rank, problems)
            return
        if variant == "right":
            worst = diff(got, flat(rg, rd))
    note(problems, {"rank": rank, "kind": "gan", "variant": "other", "steps": steps, "max_diff": worst})


def _moving(name: str, original, moved: list):
    """10.5: a collective of torch.distributed called from the student's step, noted in ``moved`` as (name, elements
    of its tensors), then run."""
    def call(*args, **kwargs):
        tensors = [a for a in [*args, *kwargs.values()] for a in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(a, torch.Tensor)]
        moved.append((name, sum(t.numel() for t in tensors)))
        return original(*args, **kwargs)
    return call


#: The files whose collectives are DDP's own (its reducer is called from autograd's engine, its forward may
#: broadcast buffers): the first frame outside the grader's instruments says who asked.
_DDP_OWN = (os.path.join("torch", "autograd", "graph.py"), os.path.join("torch", "nn", "parallel", ""))


#: The calls by which the student's step may reach DDP's collectives: a module called (its forward, which may
#: broadcast buffers) and a backward (the reducer's all-reduces); a method of DDP called directly is not one.
_DDP_ENTRIES = ((os.path.join("torch", "nn", "modules", "module.py"), ("_wrapped_call_impl", "_call_impl")),
                (os.path.join("torch", "_tensor.py"), ("backward",)),
                (os.path.join("torch", "autograd", "__init__.py"), ("backward", "grad")))


def _moving_below(call, moved: list, ddp_calls: list | None = None, file: str | None = None) -> None:
    """10.5: a collective reached below torch.distributed's functions (a process group's method, a functional
    collective, DDP's reducer): noted in ``moved`` as (name, elements) unless DDP asked for it (the first Python
    frame outside the instruments is autograd's engine running the reducer's hooks, or DDP's own module; a
    sixteenth red team's 10.5 gathered the whole batch with a group's allgather and a functional all_gather,
    2026-12-07), and the student's code (``file``) reached it by calling a module or a backward, not a method of
    DDP's (an eighteenth red team's 10.5 x03 broadcast the batch with ``G._distributed_broadcast_coalesced``).
    DDP's own go to ``ddp_calls`` (:func:`_excess` counts them)."""
    frame, instruments = sys._getframe(1), (comm_calls.__file__, __file__)
    while frame is not None and frame.f_code.co_filename in instruments:
        frame = frame.f_back
    name = frame.f_code.co_filename if frame is not None else ""
    callee = None
    while file and frame is not None and frame.f_code.co_filename != file:   # the call the student's code made
        callee, frame = frame, frame.f_back
    entry = callee is None or any(callee.f_code.co_filename.endswith(path) and callee.f_code.co_name in names
                                  for path, names in _DDP_ENTRIES)
    if not any(own in name for own in _DDP_OWN) or not entry:
        moved.append((call.name, call.elements))
    elif ddp_calls is not None:
        ddp_calls.append((call.name, call.elements))


def _excess(step: int, rows: dict, ddp_calls: list, sizes: dict, batch: int) -> dict | None:
    """10.5, one step: more rows than a step of this rank's own computes (G on ``batch`` rows, twice at most: the
    fakes made again for G's step; D on the real rows and the fakes twice), or DDP's all-reduces of G's gradients
    more than once or of D's more than three times (real and fake apart, then G's step): the batch smuggled to
    every rank through the reducer, as upstream gradients of extra backwards (an eighteenth red team's 10.5 x02),
    or the whole batch trained on. None when within."""
    if rows["G"] > 2 * batch or rows["D"] > 3 * batch:
        model = "G" if rows["G"] > 2 * batch else "D"
        return {"what": "rows", "step": step + 1, "model": model, "rows": rows[model], "batch": batch,
                "most": 2 * batch if model == "G" else 3 * batch}
    reduced = {k: sum(1 for c, n in ddp_calls if c == "all_reduce" and n == size) for k, size in sizes.items()}
    if reduced["G"] > 1 or reduced["D"] > 3:
        model = "G" if reduced["G"] > 1 else "D"
        return {"what": "backwards", "step": step + 1, "model": model, "n": reduced[model],
                "most": 1 if model == "G" else 3}
    return None


def _moved_data(moved: list, steps: int) -> list:
    """10.5: the calls of ``moved`` that carry data: all but all-reduces of the losses (up to 2 elements each, 2 per
    step: the whole batch's loss returned on every rank)."""
    small = [m for m in moved if m[0] == "all_reduce" and m[1] <= 2]
    return [m for m in moved if m not in small] or (small if len(small) > 2 * steps else [])


def _pair(r) -> bool:
    """Whether ``r``, what one step returned, is two Python floats."""
    return isinstance(r, (tuple, list)) and len(r) == 2 and all(isinstance(v, float) for v in r)


def _check_losses(returned, everyone, own, want, rank, problems) -> None:
    """10.5, the parameters right: each step returned two floats; on every rank each step's pair is that rank's own
    rows' (d_loss, g_loss) (``own``: [world, steps, 2]) or the whole batch's (``want``: [steps, 2]), and their mean
    over the ranks the whole batch's. ``everyone``: what each rank returned, [steps, 2] each."""
    bad = next((r for r in returned if not _pair(r)), None)
    if bad is not None:
        got = f"({', '.join(type(v).__name__ for v in bad)})" if isinstance(bad, (tuple, list)) else \
            f"a {type(bad).__name__}"
        return note(problems, {"rank": rank, "kind": "gan_return", "what": "type", "got": got})
    close = lambda a, b: torch.allclose(a, b, atol=1e-5, rtol=0)
    mean = sum(everyone) / len(everyone)
    if all(close(e, o) or close(e, want) for e, o in zip(everyone, own)):
        return
    if close(mean, want) or not close(mean.flip(-1), want):
        r = next(r for r, (e, o) in enumerate(zip(everyone, own)) if not (close(e, o) or close(e, want)))
        s = next(s for s in range(len(want)) if not (close(everyone[r][s], own[r][s])
                                                       or close(everyone[r][s], want[s])))
        return note(problems, {"rank": rank, "kind": "gan_return", "what": "values", "step": s + 1, "of": r,
                               "got": f"({everyone[r][s, 0]:.4f}, {everyone[r][s, 1]:.4f})",
                               "own": f"({own[r][s, 0]:.4f}, {own[r][s, 1]:.4f})",
                               "want": f"({want[s, 0]:.4f}, {want[s, 1]:.4f})"})
    s = next(s for s in range(len(want)) if not close(mean[s], want[s]))
    note(problems, {"rank": rank, "kind": "gan_return", "what": "swapped", "step": s + 1,
                    "got": f"({mean[s, 0]:.4f}, {mean[s, 1]:.4f})", "want": f"({want[s, 0]:.4f}, {want[s, 1]:.4f})"})


#: 10.7: the most steps one run may be asked for (a sweep that needs more started at too small a batch).
MAX_STEPS = 2_000_000
#: 10.7: the most runs a sweep may start on one task (a loop that never ends is stopped).
MAX_RUNS = 400
#: 10.7 accepts a B_crit between the task's divided by this and the task's times this.
B_CRIT_BAND = 1.5


class BudgetSpent(RuntimeError):
    """10.7: a run that would take a sweep past its task's budget of examples, or past :data:`MAX_RUNS` runs."""


def _whole(value, what: str, least: int) -> int:
    """``value`` as an int (numpy integers and whole floats too), at least ``least``; else a ValueError."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():
        value = int(value)
    else:
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if value < least:
        raise ValueError(f"{what} must be at least {least}, got {value}")
    return value


class SweepTask:
    """A simulated training task of exercise 10.7 (notebooks/10_case_studies.ipynb): what a student's sweep runs.

    Each run trains at the best learning rate for its global batch B and reaches ``target`` after
    S(B) = S_min (1 + B_crit / B) steps (:func:`~mgpu_utils.costs.scaling.critical_batch_steps`), times a
    factor of about 10 % that the run's seed draws. Its held-out loss after step t is
    floor + (start - floor) exp(-k t / S_run), with k such that it equals ``target`` at S_run, plus an
    evaluation noise of 1 % of (target - floor). Runs are deterministic: the same (batch, seed) gives the same
    losses, and a longer run the same losses first. S_min and B_crit are the grader's (:data:`SWEEP_TASKS`), not
    attributes of the task.

    Attributes:
        name: what the task is (said in hints). target: the held-out loss to reach. budget: the examples
            (batch x steps, every run together) the sweep may use. spent: examples used so far. runs: one
            ``(batch, seed, steps, reached)`` per run, in order.
    """

    def __init__(self, name: str, s_min: float, b_crit: float, seed: int, start: float = 2.3,
                 floor: float = 0.2, target: float = 0.5, budget_e_min: float = 1000):
        """``s_min``, ``b_crit``: the task's S(B); ``seed``: the task's runs' randomness; ``start``, ``floor``,
        ``target``: losses; ``budget_e_min``: the budget in units of E_min = S_min B_crit."""
        self.name, self.target = name, float(target)
        self.budget = int(float(f"{budget_e_min * s_min * b_crit:.1g}"))   # rounded to one digit
        self.spent, self.runs, self.asked = 0, [], 0
        k = math.log((start - floor) / (target - floor))
        noise = 0.01 * (target - floor)

        def losses(batch: int, max_steps: int, run_seed: int) -> np.ndarray:
            rng = np.random.default_rng([seed, batch, run_seed])
            s_run = critical_batch_steps(batch, s_min, b_crit) * math.exp(0.1 * rng.standard_normal())
            n = min(max_steps, int(1.5 * s_run) + 10)          # it reaches the target long before 1.5 S_run
            t = np.arange(1, n + 1)
            curve = floor + (start - floor) * np.exp(-k * t / s_run) + noise * rng.standard_normal(n)
            hit = np.flatnonzero(curve <= target)
            return curve[:hit[0] + 1] if hit.size else curve

        self._losses = losses

    def train(self, batch, max_steps, seed=0) -> np.ndarray:
        """Train one run at global batch ``batch`` (examples per step) until its held-out loss reaches
        ``target``, for at most ``max_steps`` steps; it costs batch x its steps examples of ``budget``.

        Returns:
            The held-out loss after each step, a float64 numpy array: its length is the run's steps to the
            target when its last value is <= ``target``; otherwise the run stopped at ``max_steps`` short of it.

        Raises:
            ValueError: ``batch`` < 1, ``max_steps`` not in 1 to :data:`MAX_STEPS`, ``seed`` < 0, or one of them
                not a whole number. BudgetSpent: the run would take the sweep past ``budget`` examples or past
                :data:`MAX_RUNS` runs (nothing is charged).
        """
        batch, seed = _whole(batch, "batch", 1), _whole(seed, "seed", 0)
        max_steps = _whole(max_steps, "max_steps", 1)
        if max_steps > MAX_STEPS:
            raise ValueError(f"max_steps must be at most {MAX_STEPS:,}, got {max_steps:,}: a run that needs more "
                             f"steps is at a batch far below this task's interesting range; start larger")
        if len(self.runs) >= MAX_RUNS:
            self.asked = self.spent
            raise BudgetSpent(f"{MAX_RUNS} runs already on {self.name}: a sweep needs a few batch sizes, each "
                              f"doubling the last, and a few seeds at each")
        curve = self._losses(batch, max_steps, seed)
        cost = batch * len(curve)
        if self.spent + cost > self.budget:
            self.asked = self.spent + cost
            raise BudgetSpent(f"a run at batch {batch} for {len(curve):,} steps ({cost:,} examples) would bring "
                              f"the sweep on {self.name} to {self.spent + cost:,} examples, over its budget of "
                              f"{self.budget:,} (task.budget)")
        self.spent += cost
        self.runs.append((batch, seed, len(curve), bool(curve[-1] <= self.target)))
        return curve


#: 10.7's tasks: (name, S_min, B_crit, seed, budget in units of the fewest examples E_min = S_min B_crit). The
#: first two are named in the template (practice_tasks()); the others are not. B_crit spans 6 to 12,000 and
#: S_min / B_crit 0.0025 to 250, so that neither a fixed range of batches nor a number of steps passes for
#: B_crit; the budgets differ, so that B_crit cannot be read from one.
SWEEP_TASKS = (
    ("the digits MLP of section 1", 45, 20, 1, 1000),
    ("a small language model", 400, 700, 2, 2000),
    ("unnamed task 3", 1500, 60, 3, 700),
    ("unnamed task 4", 80, 3000, 4, 2500),
    ("unnamed task 5", 250, 6, 5, 800),
    ("unnamed task 6", 30, 12000, 6, 1500),
)
#: How many of :data:`SWEEP_TASKS` the template names.
SWEEP_NAMED = 2


def practice_tasks() -> list[tuple[SweepTask, float]]:
    """10.7's two named tasks, fresh (nothing spent), each with its B_crit: ``[(task, b_crit), ...]``."""
    return [(SweepTask(name, s, b, seed, budget_e_min=e), float(b)) for name, s, b, seed, e in
            SWEEP_TASKS[:SWEEP_NAMED]]


def _sweep_text(task: SweepTask) -> str:
    """What a sweep ran: "9 runs at batches 1 to 256, 30,000 of 90,000 examples"."""
    if not task.runs:
        return "no run (task.train was never called)"
    batches = sorted({b for b, *_ in task.runs})
    return (f"{len(task.runs)} run(s) at batches {batches[0]} to {batches[-1]}, {task.spent:,} of "
            f"{task.budget:,} examples")


def check_b_crit(fn, ctx, problems):
    """10.7: ``fn(task)`` for each task of :data:`SWEEP_TASKS` (a fresh :class:`SweepTask`); the answer must be a
    number within :data:`B_CRIT_BAND` times the task's B_crit, found within the task's budget. Returns the worst
    factor and the largest share of a budget used."""
    worst, used = 1.0, 0.0
    for name, s_min, b_crit, seed, budget in SWEEP_TASKS:
        task = SweepTask(name, s_min, b_crit, seed, budget_e_min=budget)
        base = {"rank": ctx.rank, "kind": "b_crit", "task": name}
        try:
            got = fn(task)
        except BudgetSpent:
            got = None
        except Exception as e:                             # the student's own error, or train's ValueError
            if not task.asked:
                top = max((b for b, *_ in task.runs), default=0)
                return note(problems, {**base, "what": "raised", "sweep": _sweep_text(task),
                                       "stopped": 0 < top < 2 * b_crit,
                                       "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                                       if str(e).strip() else type(e).__name__})
        if task.asked:                                     # over the budget, raised or caught by the student
            return note(problems, {**base, "what": "budget", "asked": task.asked, "budget": task.budget,
                                   "sweep": _sweep_text(task)})
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got) or got <= 0:
            return note(problems, {**base, "what": "form", "got": repr(got)[:80]})
        ratio = float(got) / b_crit
        if 1 / B_CRIT_BAND <= ratio <= B_CRIT_BAND:
            worst, used = max(worst, ratio, 1 / ratio), max(used, task.spent / task.budget)
            continue
        reached = {(b, s) for b, s, _, ok in task.runs if ok}
        short = sorted({b for b, s, _, ok in task.runs if not ok and (b, s) not in reached})
        batches = sorted({b for b, *_ in task.runs})
        what = "s_min" if abs(got / s_min - 1) < 0.2 else "e_min" if abs(got / (s_min * b_crit) - 1) < 0.2 else \
            "short" if short else "none" if not batches else "stopped" if batches[-1] < 2 * b_crit else \
            "started" if batches[0] > b_crit / 2 else "high" if ratio > 1 else "low"
        return note(problems, {**base, "what": what, "got": float(got), "sweep": _sweep_text(task),
                               "short": short[:6], "top": batches[-1] if batches else 0,
                               "bottom": batches[0] if batches else 0, "band": B_CRIT_BAND})
    return {"tasks": len(SWEEP_TASKS), "worst": worst, "used": used}


def _b_crit_lines(info: dict, world: int) -> list[str]:
    """10.7's success lines: the tasks, the worst factor against the true B_crit, the budget used."""
    return [f"{info['tasks']} tasks; your B_crit within {info['worst']:.2f}x of each task's (at most {B_CRIT_BAND}x "
            f"passes), with at most {info['used']:.0%} of a task's budget"] if info else []


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "gan_ddp": [
        (lambda p, W: p.get("what") == "moved",
         "rank {rank}: your gan_step called torch.distributed's {call} ({n} call(s) that carry data): this step "
         "moves no data of its own. Each rank trains on its own rows, and DDP averages the gradients in backward: "
         "call G and D (the DDP-wrapped modules) on this rank's real and z (an all-reduce of the two losses, to "
         "return the whole batch's, is fine)"),
        (lambda p, W: p.get("what") == "rows",
         "rank {rank}: at step {step} {model} computed on {rows} rows, where this rank's share of the batch is {batch} "
         "(at most {most} in a step: G on z, D on the real rows and on the fakes twice): each rank trains on its "
         "own rows only, and DDP's all-reduce of the gradients makes the step the whole batch's"),
        (lambda p, W: p.get("what") == "backwards",
         "rank {rank}: at step {step} DDP all-reduced {model}'s gradients {n} times (at most {most}: one backward "
         "through G for its loss; D's for its real and fake terms and G's loss): extra backwards through the "
         "DDP-wrapped models move data between the ranks. One backward for D's loss, one for G's"),
        (lambda p, W: p.get("what") == "module",
         "rank {rank}: at step {step} the DDP-wrapped {model} was never called (its .module, or another copy, "
         "was): DDP all-reduces the gradients only of a forward that went through it. Call G(z) and D(...), the "
         "modules you are given"),
        (lambda p, W: p.get("what") == "stale",
         "rank {rank}: the step failed: {error}. G's loss went back through D's output from before opt_d.step(), "
         "which changed D's weights in place: compute D(fake) for G's loss after D's step (G learns from the "
         "updated D)"),
        (always, "rank {rank}: the step failed: {error}. D's backward went through G, so G's backward ran twice in "
                 "one step (its graph was freed, and DDP marks each parameter ready once). Keep the fakes out of D's "
                 "backward: D(fake.detach())")],
    "b_crit": [
        (lambda p, W: p["what"] == "raised" and p["stopped"],
         "for {task} find_b_crit raised {error} (your sweep: {sweep}). The sweep stopped where the steps were still "
         "falling fast: a fit must see the floor S_min that they approach. Keep doubling the batch until a doubling "
         "saves little (S(2B) close to S(B)), then fit"),
        (lambda p, W: p["what"] == "raised", "for {task} find_b_crit raised {error} (your sweep: {sweep})"),
        (lambda p, W: p["what"] == "budget",
         "for {task} your sweep asked for {asked:,} examples, over the task's budget of {budget:,} (task.budget; "
         "{sweep}). Far above B_crit a larger batch saves few steps and costs examples in proportion: double the "
         "batch only until a doubling saves little, and give each run a max_steps near what the last batch needed"),
        (lambda p, W: p["what"] == "form",
         "for {task} find_b_crit returned {got}: return the critical batch size as a positive number (examples per "
         "step, a float)"),
        (lambda p, W: p["what"] == "none",
         "for {task} you returned {got:.4g} without a run (task.train was never called): B_crit is the task's own, "
         "measured by a sweep of batch sizes"),
        (lambda p, W: p["what"] == "s_min",
         "for {task} you returned {got:.4g}, this task's S_min (the fewest steps, at a batch far above B_crit): "
         "B_crit is a batch size, the B at which S(B) = S_min (1 + B_crit / B) is twice S_min"),
        (lambda p, W: p["what"] == "e_min",
         "for {task} you returned {got:.4g}, this task's S_min x B_crit (the fewest examples, at a tiny batch): "
         "B_crit is that divided by S_min"),
        (lambda p, W: p["what"] == "short",
         "for {task} your B_crit, {got:.4g}, is more than {band}x off, and at batch(es) {short} no run reached "
         "task.target within its max_steps: the length of such a run is not its steps to the target. Run it again "
         "with a larger max_steps (the same seed gives the same losses first) and count the steps of a run whose "
         "last loss is <= task.target"),
        (lambda p, W: p["what"] == "stopped",
         "for {task} your B_crit, {got:.4g}, is more than {band}x off, and your sweep ({sweep}) stopped where the "
         "steps were still falling fast: a fit must see the floor S_min that they approach. Keep doubling the "
         "batch until a doubling saves little (S(2B) close to S(B)), then fit"),
        (lambda p, W: p["what"] == "started",
         "for {task} your B_crit, {got:.4g}, is more than {band}x off, and your sweep ({sweep}) started where a "
         "doubling of the batch already saves little: below B_crit the steps halve when the batch doubles, and the "
         "fit needs that regime too. Start at a smaller batch"),
        (lambda p, W: p["what"] == "high",
         "for {task} your B_crit, {got:.4g}, is more than {band}x too high ({sweep}). B_crit is not where the "
         "steps stop falling: it is the batch at which a run takes twice the fewest steps, S(B_crit) = 2 S_min "
         "(and twice the fewest examples). Fit S(B) = S_min (1 + B_crit / B) to the steps of each batch "
         "(mgpu_utils.costs.scaling.fit_critical_batch does)"),
        (always, "for {task} your B_crit, {got:.4g}, is more than {band}x too low ({sweep}). Check the steps you "
                 "read at each batch (the first step whose loss is <= task.target; a median over seeds) and the "
                 "fit: S = S_min + S_min B_crit / B is a line in 1 / B, and B_crit is its slope over its "
                 "intercept")],
    "gan_return": [
        (lambda p, W: p["what"] == "type",
         "rank {rank}: G and D are right, but gan_step returned {got}: return (d_loss, g_loss) as Python floats "
         "(loss.item()), not tensors that hold their graphs"),
        (lambda p, W: p["what"] == "swapped",
         "rank {rank}: G and D are right, but the losses returned are (g_loss, d_loss): return D's loss first, "
         "(d_loss, g_loss)"),
        (always, "rank {rank}: G and D are right, but at step {step} rank {of} returned {got}, and its own rows' "
                 "losses are {own} (the whole batch's: {want}): return this step's (d_loss, g_loss) as floats, "
                 "D's loss on real and fakes before its step, G's through the updated D (each rank its own, or "
                 "the whole batch's on every rank)")],
    "gan": [
        (lambda p, W: p["variant"] == "nothing",
         "rank {rank}: neither G nor D changed in {steps} steps: each step needs opt_d.step() and then opt_g.step()"),
        (lambda p, W: p["variant"] == "no_d_step", "rank {rank}: D never changed: step opt_d after D's backward"),
        (lambda p, W: p["variant"] == "g_no_grad",
         "rank {rank}: G never changed, and no gradient reached it: G's loss must go back through G, D(fake), not "
         "D(fake.detach()) (the detach is for D's loss only)"),
        (lambda p, W: p["variant"] == "no_g_step", "rank {rank}: G never changed: step opt_g after G's backward"),
        (lambda p, W: p["variant"] == "d_half",
         "rank {rank}: the parameters are those of D's loss halved: the mean over real and fakes in one batch is "
         "(BCE(real) + BCE(fake)) / 2. D's loss is the sum of the two means (or twice the mean of one batch)"),
        (lambda p, W: p["variant"] == "g_first",
         "rank {rank}: the parameters are those of G stepping before D: step D first (on the detached fakes), then "
         "G through the updated D"),
        (lambda p, W: p["variant"] == "g_labels_fake",
         "rank {rank}: G's loss labels its fakes 0, as D's does: G wants D to say real, so its target is ones"),
        (lambda p, W: p["variant"] == "no_zero_d",
         "rank {rank}: D's gradients carried over from the step before (G's backward also goes through D): "
         "opt_d.zero_grad() before D's backward"),
        (lambda p, W: p["variant"] == "no_zero_g",
         "rank {rank}: G's gradients accumulated over the steps: opt_g.zero_grad() before G's backward"),
        (always, "rank {rank}: after {steps} steps the parameters differ from one process's by {max_diff:.3g} (world "
                 "size {W}): D(real) against ones plus D(fake.detach()) against zeros, then D(fake) against ones")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="10.5", template="10_gan_step.py", entry="gan_step", world_sizes=(2, 3),
        check=check_gan_step, hints=HINTS,
        what="after 3 to 5 steps (SGD at a learning rate and momentum drawn each run) G and D equal the same GAN "
             "steps in one process on every rank's samples (D on detached fakes first, then G through the updated "
             "D), each step through the DDP-wrapped G and D with no data moved by your code, and each returns its "
             "(d_loss, g_loss) as floats"),
    CodingExercise(
        id="10.7", template="10_find_b_crit.py", entry="find_b_crit", world_sizes=(1,),
        check=check_b_crit, hints=HINTS, on_success=_b_crit_lines,
        what=f"the critical batch size of each of the {len(SWEEP_TASKS)} tasks within {B_CRIT_BAND}x, from "
             "sweeps within their budgets"),
]
