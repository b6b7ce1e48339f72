"""Exercise 10.5: one GAN training step under DDP (notebooks/10_case_studies.ipynb, section 4).

G and D arrive wrapped in DistributedDataParallel, each with its own optimizer. Complete gan_step so that

    for real, z in my_batches:                   # this rank's real samples (B, 16) and noise (B, 8)
        d_loss, g_loss = gan_step(G, D, opt_g, opt_d, real, z)

trains as lesson 10's GAN does:
  1. the discriminator: D(real) labelled 1 and D(fake) labelled 0, where fake = G(z); one step of opt_d.
     G must stay out of this backward (under DDP a second backward through G in the same step fails);
  2. the generator, through the discriminator just updated: D(fake) labelled 1 (G wants D to say real); one
     step of opt_g.
D returns logits: use F.binary_cross_entropy_with_logits. Zero each model's gradients before its backward
(G's backward also goes through D). The grader runs 3 to 5 steps on 2 and 3 ranks (the number of steps, the
optimizers' learning rate and momentum and the data are drawn each run) and compares both models' parameters
with the same steps in one process on every rank's samples at once; each step must call G and D (the
DDP-wrapped modules) on this rank's rows only, with one backward for each loss, and move no data of its own;
typical mistakes get their own hint.

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("10.5")
"""
import torch
import torch.nn.functional as F


def gan_step(G, D, opt_g, opt_d, real: torch.Tensor, z: torch.Tensor) -> tuple[float, float]:
    """One discriminator step, then one generator step; returns (d_loss, g_loss) as floats."""
    ones = torch.ones(len(real), 1, device=real.device)
    zeros = torch.zeros(len(real), 1, device=real.device)
    fake = G(z)
    d_loss = g_loss = torch.zeros(())
    # TODO 1: D's loss: D(real) against ones plus D(fake) against zeros, with the fakes kept out of G's graph;
    #         then opt_d.zero_grad(), backward, opt_d.step()
    # TODO 2: G's loss: D(fake) against ones; then opt_g.zero_grad(), backward, opt_g.step()
    return d_loss.item(), g_loss.item()
