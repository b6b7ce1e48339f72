"""Case study: a GAN trained with DDP on the digits (for lesson 10, case studies).

A small generator (noise -> 8x8 image, with BatchNorm) and discriminator (image -> one logit), both wrapped
in DDP. Each step: the discriminator learns from a real batch and a fake batch (the fakes detached, so no
gradient reaches the generator), then the generator learns through the discriminator (fakes labelled
real). The discriminator runs three times per step: its DDP all-reduces its gradients once per backward,
so the generator's backward also all-reduces discriminator gradients that nobody uses (zeroed before the
next discriminator step); with broadcast_buffers, every forward of a DDP module with BatchNorm also
broadcasts rank 0's running statistics. Losses are BCEWithLogitsLoss on logits (log(sigmoid(x)) by hand
underflows to -inf for confident logits).

--bug no-d-step skips the discriminator's optimizer step (the classic broken loop: it never learns),
so its parameters stay at their initial values. --check-grads compares the first discriminator step's
DDP gradient with one process on the global batch (every rank's real and fake images, gathered).

Rank 0 prints one JSON line (MGPU_RESULT): world_size, steps, d_losses, g_losses, d_changed (whether the
discriminator's parameters moved), max_param_spread (largest difference of any parameter across ranks:
0 means identical replicas), samples (16 generated images, 8x8, values in [0, 1]), samples_per_s (real
images per second over all ranks, the training loop only), and with
--check-grads grad_max_diff and grad_scale.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/case_gan.py --steps 300
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.timing import synced_clock

NOISE = 16


def generator() -> nn.Module:
    """Noise (NOISE,) -> an 8x8 image in [-1, 1] (the digits are rescaled to that range)."""
    return nn.Sequential(nn.Linear(NOISE, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 64), nn.Tanh())


def discriminator() -> nn.Module:
    """An 8x8 image -> one logit (real if positive)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))


def flat(module) -> torch.Tensor:
    return torch.cat([q.detach().reshape(-1) for q in module.parameters()])


def main():
    p = argparse.ArgumentParser(description="GAN with DDP")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=300, help="steps (one discriminator and one generator update)")
    g.add_argument("--per-rank-batch", type=int, default=32, help="real (and fake) images per rank per step")
    g.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate of both networks")
    g.add_argument("--seed", type=int, default=0, help="weights and data order; noise uses 1000 + rank")
    g = p.add_argument_group("bugs and checks")
    g.add_argument("--bug", choices=["none", "no-d-step"], default="none", help="a classic broken loop")
    g.add_argument("--check-grads", action="store_true", help="compare the first D step with one process")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        torch.manual_seed(args.seed)
        g_net, d_net = generator().to(device), discriminator().to(device)
        d_ref = discriminator().to(device) if args.check_grads else None
        if d_ref is not None:
            d_ref.load_state_dict(d_net.state_dict())
        # region two-models
        wrap = (lambda m: DDP(m, device_ids=[device.index] if device.type == "cuda" else None)) \
            if dist.is_initialized() else (lambda m: m)
        g, d = wrap(g_net), wrap(d_net)
        opt_g = torch.optim.Adam(g.parameters(), lr=args.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(d.parameters(), lr=args.lr, betas=(0.5, 0.999))
        bce = nn.BCEWithLogitsLoss()
        train, _ = load_data()
        images = train.tensors[0].reshape(len(train), 64) * 2 - 1            # [0, 1] -> [-1, 1]
        batches = batch_stream(train, world, rank, args.per_rank_batch, seed=args.seed)
        noise = torch.Generator(device="cpu").manual_seed(1000 + rank)       # each rank its own noise
        d_start, result, d_losses, g_losses = flat(d_net).clone(), {}, [], []
        ones = torch.ones(args.per_rank_batch, 1, device=device)
        zeros = torch.zeros(args.per_rank_batch, 1, device=device)
        t0 = synced_clock(device)
        for step in range(args.steps):
            idx = next(batches)
            if len(idx) < args.per_rank_batch:
                idx = next(batches)
            real = images[idx].to(device)
            z = torch.randn(args.per_rank_batch, NOISE, generator=noise).to(device)
            fake = g(z)
            # 1) the discriminator: real -> 1, fake -> 0; detach() keeps the generator out of this backward
            d_loss = bce(d(real), ones) + bce(d(fake.detach()), zeros)
            opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            if step == 0 and d_ref is not None:
                tc = synced_clock(device)                     # the check is not training: not timed
                result.update(check_first_step(d_ref, d_net, real, fake.detach(), world))
                t0 += synced_clock(device) - tc
            if args.bug != "no-d-step":
                opt_d.step()
            # 2) the generator, through the discriminator: fakes labelled real
            g_loss = bce(d(fake), ones)
            opt_g.zero_grad(set_to_none=True)
            g_loss.backward()
            opt_g.step()
        # endregion
            stats = torch.stack([d_loss.detach(), g_loss.detach()])
            if dist.is_initialized():
                dist.all_reduce(stats)
            d_losses.append(stats[0].item() / world)
            g_losses.append(stats[1].item() / world)
        samples_per_s = args.steps * args.per_rank_batch * world / (synced_clock(device) - t0)   # real images, all ranks
        params = torch.cat([flat(g_net), flat(d_net)])
        spread = torch.zeros((), device=device)
        if dist.is_initialized():
            hi, lo = params.clone(), params.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            spread = (hi - lo).max()
        g_net.eval()
        with torch.no_grad():
            samples = (g_net(torch.randn(16, NOISE, generator=torch.Generator().manual_seed(7)).to(device)) + 1) / 2
        ctx.log(f"{args.steps} steps: D loss {d_losses[-1]:.3f}, G loss {g_losses[-1]:.3f}")
        result.update(world_size=world, steps=args.steps, d_losses=d_losses, g_losses=g_losses,
                      d_changed=bool((flat(d_net) - d_start).abs().max() > 0), max_param_spread=spread.item(),
                      samples=samples.reshape(16, 8, 8).cpu().tolist(), samples_per_s=samples_per_s)
        emit_result(result, rank)


def check_first_step(d_ref, d_net, real, fake, world) -> dict:
    """The discriminator's first DDP gradient against one process on every rank's images at once."""
    reals, fakes = [torch.empty_like(real) for _ in range(world)], [torch.empty_like(fake) for _ in range(world)]
    if dist.is_initialized():
        dist.all_gather(reals, real)
        dist.all_gather(fakes, fake)
    else:
        reals, fakes = [real], [fake]
    bce = nn.BCEWithLogitsLoss()
    r, f = torch.cat(reals), torch.cat(fakes)
    ones, zeros = torch.ones(len(r), 1, device=r.device), torch.zeros(len(f), 1, device=f.device)
    loss = bce(d_ref(r), ones) + bce(d_ref(f), zeros)
    d_ref.zero_grad()
    loss.backward()
    ref = torch.cat([q.grad.reshape(-1) for q in d_ref.parameters()])
    got = torch.cat([q.grad.reshape(-1) for q in d_net.parameters()])
    return {"grad_max_diff": (got - ref).abs().max().item(), "grad_scale": ref.abs().max().item()}


if __name__ == "__main__":
    main()
