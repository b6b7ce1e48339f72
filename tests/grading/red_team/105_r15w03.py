"""WRONG (10.5): right for the first two calls only; from the third step on it skips the generator's step (and leaks every step's fakes with their graphs in a list on D); the grader runs only two steps."""
import torch
import torch.nn.functional as F


def gan_step(G, D, opt_g, opt_d, real, z):
    n = opt_d.__dict__.setdefault("_calls", [0])
    n[0] += 1
    ones = torch.ones(len(real), 1)
    zeros = torch.zeros(len(real), 1)
    fake = G(z)
    D.__dict__.setdefault("_leak", []).append(fake)
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()
    if n[0] > 2:
        return d_loss.item(), 0.0
    g_loss = F.binary_cross_entropy_with_logits(D(fake.detach() if n[0] > 2 else fake), ones)
    opt_g.zero_grad(set_to_none=True)
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()
