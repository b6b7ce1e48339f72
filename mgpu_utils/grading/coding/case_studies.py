"""The graded coding exercise of lesson 10, case studies (notebooks/10_case_studies.ipynb): 10.5, a GAN step
with DDP-wrapped models.

The check runs two of the student's steps under DDP against the same steps in one process on every rank's
samples, and names a wrong result from the typical wrong steps run the same way (:data:`GAN_VARIANTS`); then it
checks the losses each step returned. The
hints of the problems it reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.grading.common import CodingExercise, always, diff, note


#: Exercise 10.5's reference procedures, in one process: the right step and the typical wrong ones, so that a
#: student's result can be named (the first that matches wins).
GAN_VARIANTS = ("right", "g_first", "g_labels_fake", "no_zero_d", "no_zero_g", "no_d_step", "no_g_step", "nothing",
                "d_half")


def gan_reference_step(G, D, opt_g, opt_d, real, z, variant: str) -> tuple[float, float] | None:
    """One step of ``variant`` (see :data:`GAN_VARIANTS`) on plain modules: D on real (1) and detached fakes (0),
    then G through the updated D (1); the wrong variants change one thing ("d_half": D's loss is the mean over
    real and fakes in one batch, half the sum of the two means). Returns (D's loss, G's loss)."""
    bce, ones, zeros = F.binary_cross_entropy_with_logits, torch.ones(len(real), 1), torch.zeros(len(real), 1)
    fake = G(z)

    losses = {}

    def d_step():
        if variant != "no_zero_d":
            opt_d.zero_grad(set_to_none=True)
        loss = (bce(D(real), ones) + bce(D(fake.detach()), zeros)) / (2 if variant == "d_half" else 1)
        loss.backward()
        losses["d"] = loss.item()
        if variant != "no_d_step":
            opt_d.step()

    def g_step():
        if variant != "no_zero_g":
            opt_g.zero_grad(set_to_none=True)
        loss = bce(D(fake), zeros if variant == "g_labels_fake" else ones)
        loss.backward()
        losses["g"] = loss.item()
        if variant != "no_g_step":
            opt_g.step()
    if variant == "nothing":
        return None
    for step in ((g_step, d_step) if variant == "g_first" else (d_step, g_step)):
        step()
    return losses["d"], losses["g"]


def check_gan_step(fn, ctx, problems, steps=2, batch=8):
    """10.5: ``fn(G, D, opt_g, opt_d, real, z)`` on DDP-wrapped G and D, two steps, against
    :func:`gan_reference_step` in one process on every rank's samples at once: the parameters (a wrong result
    named from :data:`GAN_VARIANTS`; G unchanged and without a gradient: G's loss on detached fakes), then the
    (d_loss, g_loss) returned, floats whose mean over the ranks is the loss of one process on the whole batch."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    g0 = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    d0 = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(world * batch, 16, generator=gen) + 2, torch.randn(world * batch, 8, generator=gen))
            for _ in range(steps)]
    flat = lambda *ms: torch.cat([q.detach().reshape(-1) for m in ms for q in m.parameters()])
    g, d = copy.deepcopy(g0), copy.deepcopy(d0)
    gd, dd = DDP(g), DDP(d)
    opt_g, opt_d = torch.optim.SGD(gd.parameters(), lr=0.05), torch.optim.SGD(dd.parameters(), lr=0.05)
    error, returned = "", []
    try:
        for real, z in data:
            returned.append(fn(gd, dd, opt_g, opt_d, real[rank::world], z[rank::world]))
    except RuntimeError as e:                             # DDP's or autograd's own error, the same on every rank
        error = str(e).strip().splitlines()[0][:200]
        if "modified by an inplace operation" in str(e):
            return note(problems, {"rank": rank, "kind": "gan_ddp", "what": "stale", "error": error})
        if not any(k in str(e) for k in ("only once", "finished reduction", "second time")):
            raise
    if error:
        return note(problems, {"rank": rank, "kind": "gan_ddp", "error": error})
    losses = torch.tensor([r if _pair(r) else (float("nan"),) * 2 for r in returned], dtype=torch.float64)
    dist.all_reduce(losses)                               # every rank, whatever it returned: the mean over the ranks
    got = flat(g, d)
    for variant in GAN_VARIANTS:
        rg, rd = copy.deepcopy(g0), copy.deepcopy(d0)
        og, od = torch.optim.SGD(rg.parameters(), lr=0.05), torch.optim.SGD(rd.parameters(), lr=0.05)
        want = [gan_reference_step(rg, rd, og, od, real, z, variant) for real, z in data]
        if diff(got, flat(rg, rd)) < 1e-5:
            if variant == "no_g_step" and all(q.grad is None or not q.grad.any() for q in g.parameters()):
                note(problems, {"rank": rank, "kind": "gan", "variant": "g_no_grad", "steps": steps})
            elif variant != "right":
                note(problems, {"rank": rank, "kind": "gan", "variant": variant, "steps": steps})
            else:
                _check_losses(returned, losses / world, torch.tensor(want, dtype=torch.float64), rank, problems)
            return
        if variant == "right":
            worst = diff(got, flat(rg, rd))
    note(problems, {"rank": rank, "kind": "gan", "variant": "other", "steps": steps, "max_diff": worst})


def _pair(r) -> bool:
    """Whether ``r``, what one step returned, is two Python floats."""
    return isinstance(r, (tuple, list)) and len(r) == 2 and all(isinstance(v, float) for v in r)


def _check_losses(returned, mean, want, rank, problems) -> None:
    """10.5, the parameters right: each step returned two floats, whose mean over the ranks (``mean``, [steps,
    2]) is one process's (d_loss, g_loss) on the whole batch (``want``)."""
    bad = next((r for r in returned if not _pair(r)), None)
    if bad is not None:
        got = f"({', '.join(type(v).__name__ for v in bad)})" if isinstance(bad, (tuple, list)) else \
            f"a {type(bad).__name__}"
        return note(problems, {"rank": rank, "kind": "gan_return", "what": "type", "got": got})
    close = lambda a, b: torch.allclose(a, b, atol=1e-5, rtol=0)
    if close(mean, want):
        return
    s = next(s for s in range(len(want)) if not close(mean[s], want[s]))
    note(problems, {"rank": rank, "kind": "gan_return", "what": "swapped" if close(mean.flip(1), want) else "values",
                    "step": s + 1, "got": f"({mean[s, 0]:.4f}, {mean[s, 1]:.4f})",
                    "want": f"({want[s, 0]:.4f}, {want[s, 1]:.4f})"})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "gan_ddp": [
        (lambda p, W: p.get("what") == "stale",
         "rank {rank}: the step failed: {error}. G's loss went back through D's output from before opt_d.step(), "
         "which changed D's weights in place: compute D(fake) for G's loss after D's step (G learns from the "
         "updated D)"),
        (always, "rank {rank}: the step failed: {error}. D's backward went through G, so G's backward ran twice in "
                 "one step (its graph was freed, and DDP marks each parameter ready once). Keep the fakes out of D's "
                 "backward: D(fake.detach())")],
    "gan_return": [
        (lambda p, W: p["what"] == "type",
         "rank {rank}: G and D are right, but gan_step returned {got}: return (d_loss, g_loss) as Python floats "
         "(loss.item()), not tensors that hold their graphs"),
        (lambda p, W: p["what"] == "swapped",
         "rank {rank}: G and D are right, but the losses returned are (g_loss, d_loss): return D's loss first, "
         "(d_loss, g_loss)"),
        (always, "rank {rank}: G and D are right, but at step {step} the losses returned, averaged over the ranks, are "
                 "{got}, and one process's on the whole batch are {want}: return this step's (d_loss, g_loss) as "
                 "floats, D's loss on real and fakes before its step, G's through the updated D")],
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
        what="after two steps G and D equal the same GAN steps in one process on every rank's samples (D on "
             "detached fakes first, then G through the updated D), and each step returns its (d_loss, g_loss) as "
             "floats"),
]
