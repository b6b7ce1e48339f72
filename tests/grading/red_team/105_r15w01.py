"""WRONG (10.5): bypasses DDP entirely: all_gathers every rank's samples and runs the whole batch on G.module/D.module on every rank (no data parallelism); the result is numerically the same, so it might pass."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.cat(out)


def gan_step(G, D, opt_g, opt_d, real, z):
    g, d = G.module, D.module
    real, z = _gather(real), _gather(z)
    ones = torch.ones(len(real), 1)
    zeros = torch.zeros(len(real), 1)
    fake = g(z)
    d_loss = F.binary_cross_entropy_with_logits(d(real), ones) + F.binary_cross_entropy_with_logits(d(fake.detach()), zeros)
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(d(fake), ones)
    opt_g.zero_grad(set_to_none=True)
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()
