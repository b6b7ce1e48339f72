"""dp x tp x pp executed together: a residual MLP trained on a 3-D mesh of ranks, proven equal to one process
(notebooks/06_hybrid_parallel.ipynb, section 4b).

The ranks are numbered in Megatron-LM's order, tp fastest, then dp, then pp: rank = (s dp + d) tp + t for
stage s, replica d and tp rank t (the tp ranks of one stage and replica are neighbours, as the GPUs of one
node are; lesson 06's figure of section 4).
  pp  the --layers blocks are split into pp stages of consecutive blocks; stage s sends each micro-batch's
      activations to stage s + 1 and receives their gradients back (point-to-point; GPipe: all forwards,
      then all backwards, over --micro-batches micro-batches).
  tp  block: h <- h + relu(f(h) W1^T) W2^T with W1 [ffn, width] column parallel (ffn/tp rows on tp rank t)
      and W2 [width, ffn] row parallel; f is the identity forward and an all-reduce over the tp group
      backward, g (after W2) an all-reduce forward and the identity backward (lesson 05: CopyToTP and
      ReduceFromTP of mgpu_utils.parallel.tensor_parallel, here over the tp group).
  dp  the --global-batch rows are split over the dp replicas; each gradient is summed over the dp group
      (the loss is divided by the global batch, so the sum is the gradient of the global mean).
After --steps SGD steps every rank's shard is compared (assert_close) with its slice of the same model
trained in one process on the whole batch. Rank 0 prints one JSON line. Any world size: --dp, --tp and --pp
default to a split of it (8 ranks: 2 x 2 x 2, as lesson 06 runs it with --nproc-per-node 8; 4 ranks: 1 x 2 x 2;
1 rank: 1 x 1 x 1).
    torchrun --standalone --nproc-per-node 4 launch_scripts/hybrid_3d.py --dp 1 --tp 2 --pp 2
"""
import argparse

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result, new_group
from mgpu_utils.parallel.tensor_parallel import CopyToTP, ReduceFromTP


def full_model(a):
    """Every block's (W1 [ffn, width], W2 [width, ffn]), the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(a.seed)
    return [(torch.randn(a.ffn, a.width, generator=g) / a.width ** 0.5,
             torch.randn(a.width, a.ffn, generator=g) / a.ffn ** 0.5) for _ in range(a.layers)]


def my_shard(blocks, s, pp, t, tp):
    """Stage s's blocks, tp rank t's rows of W1 and columns of W2, as leaf tensors that require grad."""
    per, n = len(blocks) // pp, blocks[0][0].shape[0] // tp
    return [(w1[t * n:(t + 1) * n].clone().requires_grad_(), w2[:, t * n:(t + 1) * n].clone().requires_grad_())
            for w1, w2 in blocks[s * per:(s + 1) * per]]


def stage_forward(h, shard, tp_group):
    for w1, w2 in shard:
        h = h + ReduceFromTP.apply(torch.relu(CopyToTP.apply(h, tp_group) @ w1.T) @ w2.T, tp_group)
    return h


def one_process_forward(h, blocks):
    """The same blocks on whole weights in one process, without f and g: the reference."""
    for w1, w2 in blocks:
        h = h + torch.relu(h @ w1.T) @ w2.T
    return h


def train_step(shard, x, target, global_batch, mesh, m):
    """One GPipe step of this rank's stage over m micro-batches of its replica's rows; returns
    its share of the global mean loss (the last stage; 0 on the others)."""
    s, pp, tp_group = mesh["s"], mesh["pp"], mesh["tp_group"]
    prev_rank, next_rank = mesh["prev"], mesh["next"]
    rows, outs, ins, sends, total = x.shape[0] // m, [], [], [], 0.0
    for k in range(m):                                       # forwards: receive, compute, send on
        h = x[k * rows:(k + 1) * rows].clone() if s == 0 else torch.empty_like(x[:rows])
        if s > 0:
            dist.recv(h, src=prev_rank)
        h.requires_grad_(s > 0)
        out = stage_forward(h, shard, tp_group)
        ins.append(h)
        if s < pp - 1:
            sent = out.detach().contiguous()
            sends.append((dist.isend(sent, dst=next_rank), sent))
            outs.append(out)
        else:                                       # the last stage: loss, and its backward at once
            err = out - target[k * rows:(k + 1) * rows]
            loss = (err ** 2).sum() / (global_batch * x.shape[1])      # a share of the global mean
            loss.backward()
            total += loss.item()
            if s > 0:
                sent = h.grad.contiguous()
                sends.append((dist.isend(sent, dst=prev_rank), sent))
    for k, out in enumerate(outs):                  # backwards: the next stage's gradient, in order
        grad = torch.empty_like(out)
        dist.recv(grad, src=next_rank)
        out.backward(grad)
        if s > 0:
            sent = ins[k].grad.contiguous()
            sends.append((dist.isend(sent, dst=prev_rank), sent))
    for work, _ in sends:                           # each sent tensor kept alive until its send is done
        work.wait()
    return total


def main():
    p = argparse.ArgumentParser(description="dp x tp x pp on one small model, against one process")
    g = p.add_argument_group("mesh (dp x tp x pp = world size; 0: chosen from the world size)")
    g.add_argument("--dp", type=int, default=0, help="data-parallel replicas")
    g.add_argument("--tp", type=int, default=0, help="tensor-parallel ranks per stage")
    g.add_argument("--pp", type=int, default=0, help="pipeline stages")
    g = p.add_argument_group("model and training")
    g.add_argument("--width", type=int, default=8, help="activation width")
    g.add_argument("--ffn", type=int, default=16, help="MLP inner size (divisible by tp)")
    g.add_argument("--layers", type=int, default=4, help="blocks (divisible by pp)")
    g.add_argument("--global-batch", type=int, default=16, help="rows per step, all replicas together")
    g.add_argument("--micro-batches", type=int, default=2, help="micro-batches per replica per step")
    g.add_argument("--steps", type=int, default=2, help="SGD steps")
    g.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    g.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    a = p.parse_args()

    with distributed() as ctx:
        W = ctx.world_size
        pp = a.pp or (2 if W % 2 == 0 and a.layers % 2 == 0 else 1)
        tp = a.tp or (2 if (W // pp) % 2 == 0 and a.ffn % 2 == 0 else 1)
        dp = a.dp or W // (pp * tp)
        if dp * tp * pp != W or a.ffn % tp or a.layers % pp or a.global_batch % (dp * a.micro_batches):
            raise SystemExit(f"needs dp x tp x pp = world size {W} (got {dp} x {tp} x {pp}), --ffn {a.ffn} divisible "
                             f"by tp, --layers {a.layers} by pp and --global-batch {a.global_batch} by dp x "
                             f"--micro-batches: e.g. torchrun --nproc-per-node 8 ... --dp 2 --tp 2 --pp 2")
        s, d, t = ctx.rank // (dp * tp), ctx.rank // tp % dp, ctx.rank % tp
        rank_of = lambda d_, s_, t_: (s_ * dp + d_) * tp + t_
        tp_group = dp_group = None
        if W > 1:                                            # every rank creates every group, in the same order
            for d_ in range(dp):
                for s_ in range(pp):
                    grp = new_group([rank_of(d_, s_, u) for u in range(tp)])
                    tp_group = grp if (d_, s_) == (d, s) else tp_group
            for s_ in range(pp):
                for t_ in range(tp):
                    grp = new_group([rank_of(e, s_, t_) for e in range(dp)])
                    dp_group = grp if (s_, t_) == (s, t) else dp_group
        mesh = {"s": s, "pp": pp, "tp_group": tp_group,
                "prev": rank_of(d, s - 1, t), "next": rank_of(d, s + 1, t)}

        blocks = [(w1.to(ctx.device), w2.to(ctx.device)) for w1, w2 in full_model(a)]   # made on the CPU
        shard = my_shard(blocks, s, pp, t, tp)
        ref = [(w1.clone().requires_grad_(), w2.clone().requires_grad_()) for w1, w2 in blocks]
        gen = torch.Generator().manual_seed(a.seed + 1)
        rows = a.global_batch // dp
        for step in range(a.steps):
            X, T = (torch.randn(a.global_batch, a.width, generator=gen).to(ctx.device) for _ in range(2))
            sq = train_step(shard, X[d * rows:(d + 1) * rows], T[d * rows:(d + 1) * rows], a.global_batch, mesh,
                            a.micro_batches)
            with torch.no_grad():
                for w in (w for pair in shard for w in pair):
                    if dp > 1:
                        dist.all_reduce(w.grad, group=dp_group)    # the sum over replicas: the global mean's
                    w -= a.lr * w.grad
                    w.grad = None
            ref_loss = torch.nn.functional.mse_loss(one_process_forward(X, ref), T)   # one process, whole batch
            ref_loss.backward()
            with torch.no_grad():
                for w in (w for pair in ref for w in pair):
                    w -= a.lr * w.grad
                    w.grad = None
            loss = torch.tensor([sq if t == 0 else 0.0], device=ctx.device)
            if W > 1:
                dist.all_reduce(loss)                             # the last stage's tp rank 0 of every replica
            torch.testing.assert_close(loss.item(), ref_loss.item(), rtol=1e-5, atol=1e-7)
        want = my_shard([(w1.detach(), w2.detach()) for w1, w2 in ref], s, pp, t, tp)
        worst = max((x - y).abs().max().item() for pair, ref_pair in zip(shard, want) for x, y in zip(pair, ref_pair))
        for pair, ref_pair in zip(shard, want):
            for x, y in zip(pair, ref_pair):
                torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-5, atol=1e-6)
        worst_t = torch.tensor([worst], device=ctx.device)
        if W > 1:
            dist.all_reduce(worst_t, op=dist.ReduceOp.MAX)
        ctx.log(f"{dp} x {tp} x {pp} (dp x tp x pp): after {a.steps} steps every shard equals one process's "
                f"(largest difference {worst_t.item():.2g}); last loss {loss.item():.4f}")
        emit_result({"world_size": W, "dp": dp, "tp": tp, "pp": pp, "steps": a.steps,
                     "micro_batches": a.micro_batches, "loss": loss.item(), "ref_loss": ref_loss.item(),
                     "max_diff": worst_t.item(), "blocks_per_stage": a.layers // pp})


if __name__ == "__main__":
    main()
