"""The graded coding exercise of lesson 10, case studies (notebooks/10_case_studies.ipynb): 10.5, a GAN step
with DDP-wrapped models.

The check runs two of the student's steps under DDP against the same steps in one process on every rank's
samples, and names a wrong result from the typical wrong steps run the same way (:data:`GAN_VARIANTS`). The
hints of the problems it reports and the exercise's record are here too.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.grading.common import CodingExercise, always, diff, note


#: Exercise 10.5's reference procedures, in one process: the right step and the typical wrong ones, so that a
#: student's result can be named (the first that matches wins).
GAN_VARIANTS = ("right", "g_first", "g_labels_fake", "no_zero_d", "no_zero_g", "no_d_step", "no_g_step", "nothing")


def gan_reference_step(G, D, opt_g, opt_d, real, z, variant: str) -> None:
    """One step of ``variant`` (see :data:`GAN_VARIANTS`) on plain modules: D on real (1) and detached fakes (0),
    then G through the updated D (1); the wrong variants change one thing."""
    bce, ones, zeros = F.binary_cross_entropy_with_logits, torch.ones(len(real), 1), torch.zeros(len(real), 1)
    fake = G(z)

    def d_step():
        if variant != "no_zero_d":
            opt_d.zero_grad(set_to_none=True)
        (bce(D(real), ones) + bce(D(fake.detach()), zeros)).backward()
        if variant != "no_d_step":
            opt_d.step()

    def g_step():
        if variant != "no_zero_g":
            opt_g.zero_grad(set_to_none=True)
        bce(D(fake), zeros if variant == "g_labels_fake" else ones).backward()
        if variant != "no_g_step":
            opt_g.step()
    if variant == "nothing":
        return
    for step in ((g_step, d_step) if variant == "g_first" else (d_step, g_step)):
        step()


def check_gan_step(fn, ctx, problems, steps=2, batch=8):
    """10.5: ``fn(G, D, opt_g, opt_d, real, z)`` on DDP-wrapped G and D, two steps, against
    :func:`gan_reference_step` in one process on every rank's samples at once."""
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
    error = ""
    try:
        for real, z in data:
            fn(gd, dd, opt_g, opt_d, real[rank::world], z[rank::world])
    except RuntimeError as e:                             # DDP's own error, the same on every rank
        if not any(k in str(e) for k in ("only once", "finished reduction", "second time")):
            raise
        error = str(e).strip().splitlines()[0][:200]
    if error:
        return note(problems, {"rank": rank, "kind": "gan_ddp", "error": error})
    got = flat(g, d)
    for variant in GAN_VARIANTS:
        rg, rd = copy.deepcopy(g0), copy.deepcopy(d0)
        og, od = torch.optim.SGD(rg.parameters(), lr=0.05), torch.optim.SGD(rd.parameters(), lr=0.05)
        for real, z in data:
            gan_reference_step(rg, rd, og, od, real, z, variant)
        if diff(got, flat(rg, rd)) < 1e-5:
            if variant != "right":
                note(problems, {"rank": rank, "kind": "gan", "variant": variant, "steps": steps})
            return
        if variant == "right":
            worst = diff(got, flat(rg, rd))
    note(problems, {"rank": rank, "kind": "gan", "variant": "other", "steps": steps, "max_diff": worst})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "gan_ddp": [(always, "rank {rank}: the step failed: {error}. D's backward went through G, so G's backward ran "
                         "twice in one step (its graph was freed, and DDP marks each parameter ready once). Keep the "
                         "fakes out of D's backward: D(fake.detach())")],
    "gan": [
        (lambda p, W: p["variant"] == "nothing",
         "rank {rank}: neither G nor D changed in {steps} steps: each step needs opt_d.step() and then opt_g.step()"),
        (lambda p, W: p["variant"] == "no_d_step", "rank {rank}: D never changed: step opt_d after D's backward"),
        (lambda p, W: p["variant"] == "no_g_step", "rank {rank}: G never changed: step opt_g after G's backward"),
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
             "detached fakes first, then G through the updated D)"),
]
