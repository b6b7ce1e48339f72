"""Train a small CNN on scikit-learn's digits with DistributedDataParallel (notebooks/03_ddp.ipynb).

Data: 1,797 real 8x8 handwritten digits shipped with scikit-learn (no download), split once into
1,438 training and 359 test images (stratified by class, seed 0). Each rank reads its own shard of
the training set through DistributedSampler (set_epoch every epoch: a new shuffle per epoch),
DDP averages the gradients with an all-reduce during backward, and every rank takes the same step.

`--single N` runs the same training in ONE process with the global batch (N x --per-rank-batch) made of
exactly the samples that N ranks would see: the reference for the equivalence check.

Rank 0 prints one JSON line (MGPU_RESULT) with per-epoch loss, test accuracy, samples/s, and each
rank's sample count.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/ddp_train.py --epochs 8
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import load_data, shard_batches
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import SmallCNN
from mgpu_utils.timing import synced_clock


def evaluate(model, test, rank, world, device):
    """Accuracy on the test set; each rank scores its slice, an all-reduce adds the counts."""
    model.eval()
    idx = list(range(rank, len(test), world))
    with torch.no_grad():
        x, y = test[idx]
        correct = (model(x.to(device)).argmax(1) == y.to(device)).sum().float()
    counts = torch.stack([correct, torch.tensor(float(len(idx)), device=device)])
    if dist.is_initialized():
        dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def main():
    p = argparse.ArgumentParser(description="DDP on digits")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, default=8)
    g.add_argument("--per-rank-batch", type=int, default=16, help="per rank; global batch = world size x this")
    g.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("DDP and checks")
    g.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size (MB)")
    g.add_argument("--single", type=int, default=0, metavar="N",
                   help="run in one process with the global batch of N ranks (reference run)")
    g.add_argument("--save", default="", help="rank 0 saves the DDP model's state_dict() here")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if args.single and world != 1:
            raise ValueError(f"--single runs in one process; start it with plain python or --nproc-per-node 1 "
                             f"(got world size {world})")
        virtual = args.single or world            # how many ranks' batches make one step
        train, test = load_data()
        # region train
        torch.manual_seed(args.seed)              # same init everywhere (DDP also broadcasts rank 0's)
        model = SmallCNN().to(device)             # move to the device first, then wrap
        ids = [ctx.local_rank] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb) if dist.is_initialized() \
            else model
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        hist = {"train_loss": [], "test_acc": [], "samples_per_s": [], "epoch_seconds": []}
        seen = 0
        for epoch in range(args.epochs):
            t0, loss_sum, n_sum = synced_clock(device), torch.zeros((), device=device), 0
            # batches this process computes per step: its own shard, or all N shards when --single
            ranks = range(virtual) if args.single else [rank]
            per_rank = [shard_batches(train, virtual, r, epoch, args.per_rank_batch, args.seed)
                        for r in ranks]
            for step in range(len(per_rank[0])):
                idx = [i for b in per_rank for i in b[step]]
                x, y = (t.to(device) for t in train[idx])
                loss = F.cross_entropy(ddp(x), y)   # mean over the local batch
                opt.zero_grad(set_to_none=True)
                loss.backward()                     # DDP: bucketed all-reduce (average) overlaps backward
                opt.step()
                loss_sum += loss.detach() * len(idx)
                n_sum += len(idx)
                seen += len(idx)
        # endregion
            stats = torch.stack([loss_sum, torch.tensor(float(n_sum), device=device)])
            if dist.is_initialized():
                dist.all_reduce(stats)
            sec = synced_clock(device) - t0
            hist["train_loss"].append((stats[0] / stats[1]).item())
            hist["test_acc"].append(evaluate(ddp, test, rank, world, device))
            hist["samples_per_s"].append(stats[1].item() / sec)
            hist["epoch_seconds"].append(sec)
            ctx.log(f"epoch {epoch + 1}/{args.epochs}: loss {hist['train_loss'][-1]:.4f}  "
                    f"test acc {hist['test_acc'][-1]:.3f}")
        counts = [seen] * world
        if dist.is_initialized():
            dist.all_gather_object(counts, seen)
        if args.save and ctx.is_main:
            torch.save(ddp.state_dict(), args.save)   # keys start with "module." when wrapped in DDP
        if dist.is_initialized():
            dist.barrier()                            # the file exists before anyone reads it
        emit_result({"world_size": world, "backend": ctx.backend, "single": args.single,
                     "global_batch": virtual * args.per_rank_batch, "samples_per_rank": counts,
                     "train_size": len(train), "test_size": len(test), **hist})


if __name__ == "__main__":
    main()
