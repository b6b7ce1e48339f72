"""Solution of exercise 10.5: one GAN training step under DDP (for instructors)."""
import torch
import torch.nn.functional as F


def gan_step(G, D, opt_g, opt_d, real: torch.Tensor, z: torch.Tensor) -> tuple[float, float]:
    """One discriminator step, then one generator step; returns (d_loss, g_loss) as floats."""
    ones = torch.ones(len(real), 1, device=real.device)
    zeros = torch.zeros(len(real), 1, device=real.device)
    fake = G(z)
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) \
        + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)      # detach: G stays out of D's backward
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)             # through the updated D
    opt_g.zero_grad(set_to_none=True)
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()
