"""WRONG (10.5): DDP's own gradient sync is switched off (no_sync) and every rank trains on the whole batch, gathered with torch's functional all_gather_tensor; the 10.5 check ignores collectives below torch.distributed's functions, and the forwards still go through the DDP wrappers."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F


def _everyone(t):
    world = dist.get_world_size()
    g = funcol.all_gather_tensor(t.contiguous(), 0, dist.group.WORLD)
    g = funcol.wait_tensor(g) if hasattr(funcol, "wait_tensor") else g
    g = torch.as_tensor(g).clone()
    n = len(t)
    whole = torch.empty(world * n, *t.shape[1:], dtype=t.dtype)
    for r in range(world):
        whole[r::world] = g[r * n:(r + 1) * n]
    return whole


def gan_step(G, D, opt_g, opt_d, real: torch.Tensor, z: torch.Tensor) -> tuple[float, float]:
    real, z = _everyone(real), _everyone(z)
    ones = torch.ones(len(real), 1)
    zeros = torch.zeros(len(real), 1)
    with G.no_sync(), D.no_sync():                    # no gradient ever crosses the ranks: each has the whole batch
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
