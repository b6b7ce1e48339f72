"""WRONG (10.5): ignores opt_g/opt_d and hard-codes a plain SGD update p -= 0.05 * grad (the grader's optimizer and lr), so any other optimizer or lr is silently wrong; also only rank 0 reports the losses (the sum), the other ranks return 0.0 -- the grader only checks the mean over ranks."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _sgd(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.05 * p.grad)


def gan_step(G, D, opt_g, opt_d, real, z):
    ones = torch.ones(len(real), 1)
    zeros = torch.zeros(len(real), 1)
    fake = G(z)
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
    for p in D.parameters():
        p.grad = None
    d_loss.backward()
    _sgd(D)
    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
    for p in G.parameters():
        p.grad = None
    g_loss.backward()
    _sgd(G)
    t = torch.tensor([d_loss.item(), g_loss.item()], dtype=torch.float64)
    dist.all_reduce(t)
    if dist.get_rank() != 0:
        t.zero_()
    return float(t[0]), float(t[1])
