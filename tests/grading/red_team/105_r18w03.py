# CHEAT 10.5: whole batch broadcast from each rank via DDP's own _distributed_broadcast_coalesced method (its frame is in torch/nn/parallel, so exempt), then every rank trains on the whole batch.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def gan_step(G, D, opt_g, opt_d, real, z):
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = torch.cat([real, z], 1)
    parts = [mine.clone() if r == rank else torch.empty_like(mine) for r in range(world)]
    for r in range(world):
        G._distributed_broadcast_coalesced([parts[r]], 1 << 20, r)
    both = torch.stack(parts, 1).reshape(world * len(mine), mine.shape[1])
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
