"""Case study: a torchvision ResNet trained with DDP on real images (for lesson 10, case studies).

torchvision's resnet18 (or --arch resnet50) with a small-image stem (3x3 convolution, no max-pool) learns scikit-learn's
digits, augmented with torchvision.transforms.v2 (mgpu_utils.data.AugmentedDigits), with DDP and a DistributedSampler
(set_epoch every epoch); each rank draws its own augmentations. SGD with momentum and a cosine schedule (lesson 10
asserts >= 90% test accuracy: 2 epochs, global batch 64).
The large-batch recipe of Goyal et al. (2017) when asked: --scale-lr multiplies --lr by global batch / --base-batch
(the linear scaling rule); --warmup-epochs ramps the rate up linearly from --lr to that (the gradual warm-up).

BatchNorm under DDP: each rank normalises with its own batch's statistics, and DDP broadcasts rank 0's
running statistics at every forward (broadcast_buffers=True; the test accuracy uses them too).
--check-grads compares DDP's first-step gradients with two single-process references: each rank's shard normalised on
its own and the gradients averaged (what plain BatchNorm gives), and the whole global batch in one piece (what
SyncBatchNorm gives). --sync-bn converts BatchNorm to SyncBatchNorm, which needs GPUs: on CPU ranks the error is
caught and reported in the result (sync_bn), and training goes on without it.

--data DIR (an ImageFolder: DIR/train/<class>/*.jpg, DIR/val/...) trains the ImageNet stem at 224 pixels, e.g.
--arch resnet50 --workers 8 on GPUs: a start for the real recipe (lesson 10 lists what it leaves out).

Rank 0 prints one JSON line (MGPU_RESULT): the run's settings, epoch_losses, step_losses (rank 0's own shard),
test_accuracy, samples_per_s (training steps only), sync_bn; --check-grads adds grad_vs_* and grad_max_diff.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/case_resnet.py --scale-lr
"""
import argparse
import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import AugmentedDigits
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.timing import synced_clock


def make_resnet(arch: str, small_images: bool, channels: int, classes: int) -> nn.Module:
    """torchvision's ResNet; for small images a 3x3 stride-1 stem without max-pool (as for CIFAR)."""
    model = getattr(torchvision.models, arch)(num_classes=classes)
    if small_images:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    return model


def datasets(args):
    """(train, test, channels, classes): the digits by default, an ImageFolder with --data."""
    if not args.data:
        return AugmentedDigits(args.size), AugmentedDigits(args.size, train=False, augment=False), 1, 10
    from torchvision.transforms import v2
    norm = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),    # ImageNet's mean and std per channel
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    folder = lambda split, steps: torchvision.datasets.ImageFolder(f"{args.data}/{split}", v2.Compose(steps + norm))
    train = folder("train", [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()])
    test = folder("val", [v2.Resize(256), v2.CenterCrop(224)])
    return train, test, 3, len(train.classes)


def grads(model):  # every parameter's gradient, flattened into one vector
    return torch.cat([q.grad.reshape(-1) for q in model.parameters()])


def main():
    p = argparse.ArgumentParser(description="ResNet with DDP")
    g = p.add_argument_group("model and data")
    g.add_argument("--arch", default="resnet18", help="a torchvision.models ResNet (resnet18, resnet50, ...)")
    g.add_argument("--size", type=int, default=8, help="digits: image size in pixels")
    g.add_argument("--data", default="", help="an ImageFolder root with train/ and val/ instead of the digits")
    g.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    g = p.add_argument_group("training (the large-batch recipe: add --scale-lr --warmup-epochs 1)")
    g.add_argument("--epochs", type=int, default=6)
    g.add_argument("--per-rank-batch", type=int, default=32, help="images per rank per step")
    g.add_argument("--lr", type=float, default=0.05, help="learning rate for --base-batch images")
    g.add_argument("--base-batch", type=int, default=64, help="the global batch --lr is meant for")
    g.add_argument("--scale-lr", action="store_true", help="linear scaling rule: lr x global batch / base")
    g.add_argument("--warmup-epochs", type=float, default=0.0, help="linear warm-up from --lr to the scaled lr")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm (GPUs only)")
    g.add_argument("--check-grads", action="store_true", help="compare the first step with a single process")
    g.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    g.add_argument("--seed", type=int, default=0, help="weights and shuffling; augmentations use seed + 1 + rank")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        torch.manual_seed(args.seed)
        train, test, channels, classes = datasets(args)
        model = make_resnet(args.arch, not args.data, channels, classes).to(device)
        reference = copy.deepcopy(model) if args.check_grads else None      # plain BatchNorm, the same weights
        sync_bn = "off"
        # region recipe
        if args.sync_bn:                                  # try it on a copy: CPU ranks raise
            try:
                plain = make_resnet(args.arch, not args.data, channels, classes)
                probe = nn.SyncBatchNorm.convert_sync_batchnorm(plain).to(device)
                side = 224 if args.data else args.size
                probe(torch.zeros(2, channels, side, side, device=device))
                model, sync_bn = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device), "on"
            except ValueError as e:
                sync_bn = f"{type(e).__name__}: {e}"
        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids) if dist.is_initialized() else model
        torch.manual_seed(args.seed + 1 + rank)          # the weights are shared; augmentations per rank
        global_batch = args.per_rank_batch * world
        lr = args.lr * global_batch / args.base_batch if args.scale_lr else args.lr
        opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(train, batch_size=args.per_rank_batch, sampler=sampler, drop_last=True,
                            num_workers=args.workers)
        if (steps_per_epoch := len(loader)) == 0:
            raise ValueError(f"--per-rank-batch {args.per_rank_batch} exceeds a rank's shard "
                             f"({len(sampler)}): use a smaller --per-rank-batch")
        warm = round(args.warmup_epochs * steps_per_epoch) if lr > args.lr else 0   # only to ramp up
        total = args.epochs * steps_per_epoch

        def factor(step):                                 # gradual warm-up from args.lr, then cosine to 0
            if step < warm:
                return (args.lr + (lr - args.lr) * step / warm) / lr
            return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        # endregion

        result, losses, step_losses, step, seen, t0 = {}, [], [], 0, 0, synced_clock(device)
        for epoch in range(min(args.epochs, math.ceil(args.max_steps / steps_per_epoch)) if args.max_steps else args.epochs):
            sampler.set_epoch(epoch)
            total_loss = torch.zeros(2, device=device)
            for x, y in loader:
                if args.max_steps and step >= args.max_steps:
                    break
                x, y = x.to(device), y.to(device)
                (loss := F.cross_entropy(ddp(x), y)).backward()
                if step == 0 and reference is not None:           # the check is not training: not timed
                    tc = synced_clock(device)
                    result.update(check_first_step(reference, model, x, y, world, sync_bn == "on"))
                    t0 += synced_clock(device) - tc
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                total_loss += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
                step_losses.append(loss.detach())         # this rank's shard only (no extra sync)
                step, seen = step + 1, seen + len(y) * world
            if dist.is_initialized():
                dist.all_reduce(total_loss)
            losses.append((total_loss[0] / total_loss[1]).item())
            ctx.log(f"epoch {epoch}: loss {losses[-1]:.3f}")
        elapsed, step_losses = synced_clock(device) - t0, [v.item() for v in step_losses]
        acc, n_test = accuracy(ddp, test, world, rank, device, args.workers)   # rank 0's BatchNorm statistics
        result.update(world_size=world, arch=args.arch, image_size=args.size if not args.data else 224, lr=lr,
                      global_batch=global_batch, warmup_epochs=warm / steps_per_epoch, epoch_losses=losses,
                      step_losses=step_losses, test_accuracy=acc, test_images=n_test, sync_bn=sync_bn,
                      samples_per_s=seen / elapsed)
        emit_result(result, rank)


def check_first_step(reference, model, x, y, world, synced: bool) -> dict:
    """DDP's averaged gradient against one process: the same shards normalised one by one (plain BatchNorm),
    and the whole global batch in one piece (SyncBatchNorm). Max absolute differences."""
    xs, ys = [torch.empty_like(x) for _ in range(world)], [torch.empty_like(y) for _ in range(world)]
    if dist.is_initialized():
        dist.all_gather(xs, x)
        dist.all_gather(ys, y)
    else:
        xs, ys = [x], [y]
    reference.zero_grad()
    for xr, yr in zip(xs, ys):                            # what DDP computes: per-shard BN, mean of grads
        (F.cross_entropy(reference(xr), yr) / world).backward()
    per_shard = grads(reference).clone()
    reference.zero_grad()
    F.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
    whole = grads(reference)
    ddp_grad = grads(model)
    out = {"grad_vs_per_shard": (ddp_grad - per_shard).abs().max().item(), "grad_vs_global_batch": (ddp_grad - whole).abs().max().item()}
    match = whole if synced else per_shard
    return out | {"grad_max_diff": (ddp_grad - match).abs().max().item(), "grad_scale": match.abs().max().item()}


def accuracy(model, test, world, rank, device, workers) -> tuple[float, int]:
    """(test accuracy, images scored): each rank scores every world-th image, an all-reduce adds the counts."""
    model.eval()
    mine = torch.utils.data.Subset(test, range(rank, len(test), world))
    correct = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in DataLoader(mine, batch_size=256, num_workers=workers):
            hits = (model(x.to(device)).argmax(1) == y.to(device)).sum().float()
            correct += torch.stack([hits, torch.tensor(float(len(y)), device=device)])
    if dist.is_initialized():
        dist.all_reduce(correct)
    model.train()
    return (correct[0] / correct[1]).item(), int(correct[1].item())


if __name__ == "__main__":
    main()
