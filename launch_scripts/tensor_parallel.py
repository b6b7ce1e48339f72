"""Tensor parallelism (Megatron-style), checked against dense layers (notebooks/05_model_parallel.ipynb).

Every rank builds the same dense MLP (h -> ffn -> h, gelu), causal self-attention and a
LayerNorm + MLP block, then checks parallel versions of them against the dense ones, forward
(outputs) and backward (input gradient and every parameter gradient, compared shard by shard):

  scratch: column-parallel fc1 + row-parallel fc2, heads split across ranks, with the f/g operators
           written as autograd Functions (mgpu_utils.parallel.tensor_parallel), and the sequence-parallel MLP
           (all-gather + reduce-scatter instead of all-reduce); every collective is logged with its bytes
  dtensor: the same with init_device_mesh + parallelize_module (ColwiseParallel, RowwiseParallel,
           SequenceParallel); collectives counted with CommDebugMode. The plain attention plan
           all-reduces the input gradient once per projection (q, k, v); PrepareModuleInput makes it one

Rank 0 returns the largest errors over ranks, the collectives of each forward and backward, and the
formula's bytes per layer. Needs a world size that divides --heads, --ffn and --seq.
    torchrun --standalone --nproc-per-node 4 launch_scripts/tensor_parallel.py
"""
import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from mgpu_utils.parallel import tensor_parallel as tp
from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import device_mesh, distributed, emit_result


class Block(nn.Module):
    """x + MLP(LayerNorm(x)): the part of a transformer layer where sequence parallelism matters."""

    def __init__(self, h, ffn):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(h), tp.MLP(h, ffn)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def compare(dense, par, x, dy, pairs, seq_slice, mode=None):
    """Run dense on the full x and par on its input; return ([output, input grad, param grad] max errors,
    {"forward": {op: calls}, "backward": {...}} counted by ``mode`` (CommDebugMode) or {}).

    pairs(par) -> [(parallel parameter grad, matching shard of the dense grad), ...] after backward.
    seq_slice: par sees and returns only this rank's sequence slice (sequence parallel), else all of it.
    """
    xd = x.clone().requires_grad_(True)
    yd = dense(xd)
    (yd * dy).sum().backward()
    sl = (slice(None), seq_slice) if seq_slice is not None else (slice(None),)
    xp = x[sl].clone().requires_grad_(True)
    tp.COMM_LOG.clear()
    counts, modes = {}, [mode() if mode else None for _ in range(2)]
    for phase, m in zip(("forward", "backward"), modes):
        if m:
            m.__enter__()
        try:
            if phase == "forward":
                yp = par(xp)
            else:
                (yp * dy[sl]).sum().backward()
        finally:
            if m:
                m.__exit__(None, None, None)
                counts[phase] = {str(k).split(".")[-1]: v for k, v in m.get_comm_counts().items()}
    out_err = (yp - yd[sl]).abs().max().item()
    xgrad_err = (xp.grad - xd.grad[sl]).abs().max().item()
    grad_err = max((a - b).abs().max().item() for a, b in pairs(par))
    return [out_err, xgrad_err, grad_err], counts


def main():
    p = argparse.ArgumentParser(description="tensor parallel MLP and attention, from scratch and with DTensor")
    p.add_argument("--width", type=int, default=64, help="d_model h (hidden size)")
    p.add_argument("--heads", type=int, default=8, help="attention heads a (divisible by the world size)")
    p.add_argument("--ffn", type=int, default=256, help="MLP inner size (divisible by the world size)")
    p.add_argument("--global-batch", type=int, default=2, help="sequences b per step (every rank sees all of them)")
    p.add_argument("--seq", type=int, default=16, help="sequence length s (divisible by the world size)")
    args = p.parse_args()
    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        r, t, dev = ctx.rank, ctx.world_size, ctx.device
        ok = tp.valid_world_sizes(args.heads, args.ffn, args.seq)
        if t not in ok:
            raise SystemExit(f"needs a world size dividing heads={args.heads}, ffn={args.ffn} and seq={args.seq}, "
                             f"got {t}: use --nproc-per-node one of {ok}")
        if args.width % args.heads:
            raise SystemExit(f"--width {args.width} is not divisible by --heads {args.heads}: "
                             f"use a multiple of {args.heads}")
        h, s = args.width, args.seq
        torch.manual_seed(0)                                  # the same dense layers on every rank
        mlp, attn, block = tp.MLP(h, args.ffn).to(dev), tp.Attention(h, args.heads).to(dev), Block(h, args.ffn).to(dev)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.global_batch, s, h, generator=g).to(dev)
        dy = torch.randn(args.global_batch, s, h, generator=g).to(dev)   # upstream gradient: loss = sum(y * dy)
        mine = tp.sequence_slice(s, r, t)

        def chunk(w, dim):
            return w.grad.chunk(t, dim)[r]

        def mlp_pairs(d):
            return lambda m: [(m.w1.grad, chunk(d.fc1.weight, 0)), (m.b1.grad, chunk(d.fc1.bias, 0)),
                              (m.w2.grad, chunk(d.fc2.weight, 1)), (m.b2.grad, d.fc2.bias.grad)]

        def attn_pairs(d):
            return lambda m: [(getattr(m, "w" + n).grad, chunk(getattr(d, n).weight, 0)) for n in "qkv"] + \
                [(getattr(m, "b" + n).grad, chunk(getattr(d, n).bias, 0)) for n in "qkv"] + \
                [(m.wo.grad, chunk(d.o.weight, 1)), (m.bo.grad, d.o.bias.grad)]

        errors, comm, placements = {}, {}, {}                 # placements: of dtensor block_sp's grads
        # region scratch-and-library
        for name, dense, make, pairs, sl in [
                ("mlp", mlp, lambda d: tp.TPMLP(d), mlp_pairs, None),
                ("attention", attn, lambda d: tp.TPAttention(d, args.heads), attn_pairs, None),
                ("mlp_sp", mlp, lambda d: tp.TPMLP(d, sequence_parallel=True), mlp_pairs, mine)]:
            d = copy.deepcopy(dense)
            errors["scratch_" + name] = compare(d, make(d), x, dy, pairs(d), sl)[0]
            comm["scratch_" + name] = list(tp.COMM_LOG)
        if dist.is_initialized():
            from torch.distributed.tensor import Replicate, Shard
            from torch.distributed.tensor.debug import CommDebugMode
            from torch.distributed.tensor.parallel import (
                ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)
            mesh = device_mesh(dev.type, (t,))
            col, row = ColwiseParallel, RowwiseParallel
            plans = [("mlp", mlp, {"fc1": col(), "fc2": row()}, None),
                     ("attention", attn, {"q": col(), "k": col(), "v": col(), "o": row()}, None),
                     # x as one replicated DTensor for q, k and v: their input gradients add up before
                     # a single all-reduce (the f operator), instead of one all-reduce per projection
                     ("attention_prep", attn, {"": PrepareModuleInput(
                         input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                         use_local_output=False), "q": col(), "k": col(), "v": col(), "o": row()}, None),
                     ("block_sp", block, {"norm": SequenceParallel(),
                                          "mlp.fc1": col(input_layouts=Shard(1)),
                                          "mlp.fc2": row(output_layouts=Shard(1))}, mine)]
            for name, dense, plan, sl in plans:
                d, par = copy.deepcopy(dense), parallelize_module(copy.deepcopy(dense), mesh, plan)

                def pairs(m, d=d, name=name):                 # DTensor grads, gathered to full tensors
                    if name == "block_sp":                    # (a Partial grad is summed by full_tensor())
                        placements.update({k: str(q.grad.placements[0]) for k, q in m.named_parameters()})
                    return [(a.grad.full_tensor(), b.grad) for a, b in zip(m.parameters(), d.parameters())]

                errors["dtensor_" + name], comm["dtensor_" + name] = compare(d, par, x, dy, pairs, sl,
                                                                             CommDebugMode)
        # endregion

        else:
            ctx.log("SKIPPED DTensor part: init_device_mesh needs a process group (run under torchrun)")
        names = sorted(errors)
        t_err = torch.tensor([errors[n] for n in names], dtype=torch.float64, device=dev)
        if dist.is_initialized():
            dist.all_reduce(t_err, op=dist.ReduceOp.MAX)
        errors = {n: dict(zip(("out", "x_grad", "param_grad"), v)) for n, v in zip(names, t_err.tolist())}
        for n in names:
            ctx.log(f"{n:22s} max error: output {errors[n]['out']:.1e}, input grad {errors[n]['x_grad']:.1e}, "
                    f"param grads {errors[n]['param_grad']:.1e}")
        emit_result({"world_size": t, "backend": ctx.backend, "batch": args.global_batch, "seq": s, "hidden": h,
                     "heads": args.heads, "ffn": args.ffn, "errors": errors, "comm": comm,
                     "grad_placements": placements,
                     "formula": {k: tp.tp_bytes_per_layer(args.global_batch, s, h, t, 4, k == "sp") for k in ("tp", "sp")}})


if __name__ == "__main__":
    main()
