"""WRONG (10.5): every rank gathers the whole batch through the process group's own allgather method (not dist.*) and trains G and D on all ranks' rows; the 10.5 check ignores collectives reached below torch.distributed's functions (below=lambda call: None)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _everyone(t):
    pg = dist.distributed_c10d._get_default_group()
    world = pg.size()
    outs = [torch.empty_like(t) for _ in range(world)]
    pg.allgather([outs], [t.contiguous()]).wait()
    whole = torch.empty(world * len(t), *t.shape[1:], dtype=t.dtype)
    for r, o in enumerate(outs):
        whole[r::world] = o
    return whole


def gan_step(G, D, opt_g, opt_d, real: torch.Tensor, z: torch.Tensor) -> tuple[float, float]:
    real, z = _everyone(real), _everyone(z)            # the whole batch on every rank
    ones = torch.ones(len(real), 1, device=real.device)
    zeros = torch.zeros(len(real), 1, device=real.device)
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
