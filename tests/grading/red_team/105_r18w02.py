# CHEAT 10.5: whole batch smuggled to every rank through G's own DDP reducer (data written as the upstream gradient of G's last bias, many extra backward passes), then every rank trains on the whole batch (no data parallelism).
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _everyone(G, t):
    world, rank = dist.get_world_size(), dist.get_rank()
    whole = torch.zeros(world * t.numel())
    flat = torch.zeros(world * t.numel())
    flat[rank * t.numel():(rank + 1) * t.numel()] = t.reshape(-1)
    bias = list(G.module.parameters())[-1]
    k = bias.numel()
    pad = -(-flat.numel() // k) * k
    flat = torch.cat([flat, flat.new_zeros(pad - flat.numel())])
    out = []
    for i in range(0, pad, k):
        G.zero_grad(set_to_none=True)
        y = G(torch.zeros(1, G.module[0].in_features))
        (y * flat[i:i + k].view(1, k)).sum().backward()   # DDP averages the bias gradient: our slots, summed
        out.append(bias.grad.detach().clone() * world)
    G.zero_grad(set_to_none=True)
    whole = torch.cat(out)[:world * t.numel()]
    return whole.view(world, *t.shape).transpose(0, 1).reshape(world * t.shape[0], t.shape[1])


def gan_step(G, D, opt_g, opt_d, real, z):
    both = _everyone(G, torch.cat([real, z], 1))
    real, z = both[:, :real.shape[1]].contiguous(), both[:, real.shape[1]:].contiguous()
    ones = torch.ones(len(real), 1)
    zeros = torch.zeros(len(real), 1)
    fake = G(z)
    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) \
        + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)
    opt_g.zero_grad(set_to_none=True)
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()
