"""Case study: a torchvision ResNet trained with DDP on real images (for lesson 09, case studies).

torchvision's resnet18 (or --arch resnet50) with a small-image stem (3x3 convolution, no max-pool) learns
scikit-learn's digits, augmented with torchvision.transforms.v2 (mgpu_utils.data.AugmentedDigits), with
DDP and a DistributedSampler (set_epoch every epoch): with the defaults, 6 epochs at 2 ranks reach 98.6%
test accuracy in about 26 s on 2 CPU cores. SGD with momentum and a cosine schedule; the learning rate
follows the large-batch recipe of Goyal et al. (2017) when asked: --scale-lr multiplies --lr by global batch /
--base-batch (the linear scaling rule), --warmup-epochs ramps it up linearly from --lr first.

BatchNorm under DDP: each rank normalises with its own batch's statistics, and DDP broadcasts rank 0's
running statistics at every forward (broadcast_buffers=True). --check-grads compares DDP's first-step
gradients with a single-process reference that does the same (each rank's shard normalised on its own,
gradients averaged), and reports how far the gradient of the whole global batch in one piece is from it.
--sync-bn converts BatchNorm to SyncBatchNorm, which needs GPUs: on CPU ranks the error is caught and
reported in the result (sync_bn), and training continues with plain BatchNorm.

With --data DIR (an ImageFolder: DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg) the same script trains
the standard ImageNet stem at 224 pixels: with --arch resnet50 on GPUs, the real recipe.

Rank 0 prints one JSON line (MGPU_RESULT): world_size, arch, image_size, global_batch, lr, warmup_epochs,
epoch_losses, test_accuracy, samples_per_s, sync_bn, and with --check-grads grad_max_diff (DDP vs the
per-shard reference) and grad_vs_global_batch (vs the global batch in one piece).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/case_resnet.py --scale-lr
"""
import argparse
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
    norm = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.485, 0.456, 0.406],
                                                                             [0.229, 0.224, 0.225])]
    train = torchvision.datasets.ImageFolder(f"{args.data}/train", v2.Compose(
        [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()] + norm))
    test = torchvision.datasets.ImageFolder(f"{args.data}/val", v2.Compose([v2.Resize(256), v2.CenterCrop(224)] + norm))
    return train, test, 3, len(train.classes)


def grads(model):
    return torch.cat([q.grad.reshape(-1) for q in model.parameters()])


def main():
    p = argparse.ArgumentParser(description="ResNet with DDP")
    g = p.add_argument_group("model and data")
    g.add_argument("--arch", default="resnet18", help="a torchvision.models ResNet (resnet18, resnet50, ...)")
    g.add_argument("--size", type=int, default=8, help="digits: image size in pixels")
    g.add_argument("--data", default="", help="an ImageFolder root with train/ and val/ instead of the digits")
    g = p.add_argument_group("training (the large-batch recipe: --scale-lr --warmup-epochs 1)")
    g.add_argument("--epochs", type=int, default=6)
    g.add_argument("--batch", type=int, default=32, help="images per rank per step")
    g.add_argument("--lr", type=float, default=0.05, help="learning rate for --base-batch images")
    g.add_argument("--base-batch", type=int, default=64, help="the global batch --lr is meant for")
    g.add_argument("--scale-lr", action="store_true", help="linear scaling rule: lr x global batch / base")
    g.add_argument("--warmup-epochs", type=float, default=1.0, help="linear warm-up from --lr to the scaled lr")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm (GPUs only)")
    g.add_argument("--check-grads", action="store_true", help="compare the first step with a single process")
    g.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    g.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        torch.manual_seed(args.seed)
        train, test, channels, classes = datasets(args)
        model = make_resnet(args.arch, not args.data, channels, classes).to(device)
        sync_bn = "off"
        if args.sync_bn:
            try:
                probe = nn.SyncBatchNorm.convert_sync_batchnorm(make_resnet(args.arch, not args.data, channels,
                                                                            classes)).to(device)
                probe(torch.zeros(2, channels, args.size, args.size, device=device))
                model, sync_bn = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device), "on"
            except (ValueError, RuntimeError) as e:       # CPU ranks: SyncBatchNorm needs CUDA tensors
                sync_bn = f"{type(e).__name__}: {e}"
        reference = make_resnet(args.arch, not args.data, channels, classes).to(device) if args.check_grads else None
        if reference is not None:
            reference.load_state_dict(model.state_dict())
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if dist.is_initialized() \
            else model
        global_batch = args.batch * world
        lr = args.lr * global_batch / args.base_batch if args.scale_lr else args.lr
        opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(train, batch_size=args.batch, sampler=sampler, drop_last=True)
        steps_per_epoch = len(loader)
        warm = max(1, round(args.warmup_epochs * steps_per_epoch))
        total = args.epochs * steps_per_epoch

        def factor(step):                                 # warm-up from args.lr, then cosine to 0
            if args.warmup_epochs and step < warm:
                return (args.lr + (lr - args.lr) * step / warm) / lr
            start = warm if args.warmup_epochs else 0
            return 0.5 * (1 + math.cos(math.pi * (step - start) / max(1, total - start)))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)

        result, losses, step, seen = {}, [], 0, 0
        t0 = synced_clock(device)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            total_loss = torch.zeros(2, device=device)
            for x, y in loader:
                if args.max_steps and step >= args.max_steps:
                    break
                x, y = x.to(device), y.to(device)
                loss = F.cross_entropy(ddp(x), y)
                loss.backward()
                if step == 0 and reference is not None:
                    result.update(check_first_step(reference, model, x, y, world, rank, device))
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                total_loss += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
                step, seen = step + 1, seen + len(y) * world
            if dist.is_initialized():
                dist.all_reduce(total_loss)
            losses.append((total_loss[0] / total_loss[1]).item())
            ctx.log(f"epoch {epoch}: loss {losses[-1]:.3f}")
        elapsed = synced_clock(device) - t0
        result.update(world_size=world, arch=args.arch, image_size=args.size if not args.data else 224,
                      global_batch=global_batch, lr=lr, warmup_epochs=args.warmup_epochs, epoch_losses=losses,
                      test_accuracy=accuracy(ddp, test, world, rank, device), samples_per_s=seen / elapsed,
                      sync_bn=sync_bn)
        emit_result(result, rank)


def check_first_step(reference, model, x, y, world, rank, device) -> dict:
    """DDP's averaged gradient against one process: the same shards normalised one by one, and the whole
    global batch in one piece (other BatchNorm statistics). Max absolute differences."""
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
    return {"grad_max_diff": (ddp_grad - per_shard).abs().max().item(),
            "grad_vs_global_batch": (whole - per_shard).abs().max().item(),
            "grad_scale": per_shard.abs().max().item()}


def accuracy(model, test, world, rank, device) -> float:
    """Test accuracy; each rank scores every world-th image, an all-reduce adds the counts."""
    model.eval()
    items = [test[i] for i in range(rank, len(test), world)]
    x = torch.stack([x for x, _ in items]).to(device)
    y = torch.tensor([int(y) for _, y in items], device=device)
    with torch.no_grad():
        correct = torch.stack([(model(x).argmax(1) == y).sum().float(), torch.tensor(float(len(y)), device=device)])
    if dist.is_initialized():
        dist.all_reduce(correct)
    model.train()
    return (correct[0] / correct[1]).item()


if __name__ == "__main__":
    main()
