"""Top-k gradient sparsification with error feedback, as a DDP communication hook
(notebooks/09_sync_vs_async.ipynb).

DDP(SmallCNN) trains on the digits from the same start (the same data order), once per mode:

  dense          DDP's own all-reduce (no hook)
  top-k + EF     the from-scratch hook (mgpu_utils.parallel.sparsify): the --ratio largest entries of
                 gradient + residual per bucket, the rest kept for later
  top-k, no EF   the same without the residual: what is not sent is lost

First the hook sending every entry (ratio 1.0) is checked equal to dense after --check-steps steps
(parameters, assert_close), which proves its averaging (over many steps the two summation orders drift
apart by float rounding, as any two all-reduce algorithms do).
Plain SGD, no momentum: with momentum the residual and the momentum buffer compound (Deep Gradient
Compression adds "momentum correction" for that), which is beyond this lesson.
Per mode: test accuracy every --eval-every steps and the bytes each rank sent per step (the hook counts a
ring all-gather of its (index, value) pairs; dense: a ring all-reduce, 2(n-1)/n x 4 bytes per parameter).
Rank 0 prints one JSON line. World size: 2 or more.
    torchrun --standalone --nproc-per-node 4 launch_scripts/sparsify.py
"""
import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing import assert_close

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.models import SmallCNN
from mgpu_utils.parallel.sparsify import TopKState, topk_hook


def run(ctx, a, ratio, error_feedback, batches, test):
    """Train one mode; returns (model, accuracy curve [(step, acc)], hook state or None)."""
    torch.manual_seed(a.seed)
    ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    ddp = DDP(SmallCNN().to(ctx.device), device_ids=ids)
    state = None
    if ratio is not None:
        state = TopKState(ratio, error_feedback)
        ddp.register_comm_hook(state, topk_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)
    curve = []
    for step, (x, y) in enumerate(batches, start=1):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()             # the hook runs here, once per bucket
        opt.step()
        if step % a.eval_every == 0 or step == len(batches):
            with torch.no_grad():
                curve.append((step, (ddp(test[0]).argmax(1) == test[1]).float().mean().item()))
    return ddp.module, curve, state


def main():
    p = argparse.ArgumentParser(description="top-k sparsification with and without error feedback")
    g = p.add_argument_group("sparsification")
    g.add_argument("--ratio", type=float, default=0.01, help="share of each bucket's entries sent")
    g.add_argument("--check-steps", type=int, default=4, help="steps of the 100%% check against DDP")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=96)
    g.add_argument("--per-rank-batch", type=int, default=16)
    g.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (no momentum: see the docstring)")
    g.add_argument("--eval-every", type=int, default=16)
    g.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized() or ctx.world_size < 2:
            raise SystemExit("sparsification needs 2 or more ranks: torchrun --nproc-per-node 2 (or more)")
        train_set, test_set = load_data()
        X, Y = (t.to(ctx.device) for t in train_set.tensors)
        test = tuple(t.to(ctx.device) for t in test_set.tensors)
        stream = batch_stream(train_set, ctx.world_size, ctx.rank, a.per_rank_batch, a.seed)
        batches = [(X[i], Y[i]) for i in itertools.islice(stream, a.steps)]
        n = ctx.world_size
        dense, _, _ = run(ctx, a, None, False, batches[:a.check_steps], test)
        every, _, _ = run(ctx, a, 1.0, True, batches[:a.check_steps], test)
        for q, r in zip(every.parameters(), dense.parameters()):
            assert_close(q, r, rtol=1e-5, atol=1e-6)          # the hook's averaging is DDP's
        ctx.log(f"top-k sending 100% equals DDP's all-reduce after {a.check_steps} steps")
        modes = {"dense": (None, False), f"top-k {a.ratio:.0%} + EF": (a.ratio, True),
                 f"top-k {a.ratio:.0%}, no EF": (a.ratio, False)}
        runs = {}
        for name, (ratio, ef) in modes.items():
            model, curve, state = run(ctx, a, ratio, ef, batches, test)
            params = sum(q.numel() for q in model.parameters())
            sent = state.bytes_sent / a.steps if state else 2 * (n - 1) / n * params * 4
            runs[name] = {"ratio": ratio, "error_feedback": ef, "curve": curve, "final_acc": curve[-1][1],
                          "bytes_per_step": sent, "calls": state.calls if state else None}
            ctx.log(f"{name:>18}: test accuracy {curve[-1][1]:.3f}, {sent / 1e3:7.1f} kB sent per rank and step")
        emit_result({"world_size": n, "backend": ctx.backend, "params": params, "steps": a.steps,
                     "ratio": a.ratio, "check_steps": a.check_steps, "runs": runs})


if __name__ == "__main__":
    main()
