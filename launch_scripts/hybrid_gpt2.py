"""2-D parallel training (data x tensor) of a small GPT-2 on stdlib docstrings (notebooks/06_hybrid_parallel.ipynb).

A (dp, tp) device mesh: in a row ("tp" group) the blocks are Megatron tensor-parallel (parallelize_module:
q, k, v and fc1 split by output columns, the attention projection and fc2 by input rows, one all-reduce
each); across rows ("dp" group) ranks see different data and average gradients with one all-reduce per step.
HF's Conv1D is swapped for nn.Linear first (the logits are asserted unchanged). Rank 0 then trains the plain GPT2LMHeadModel
on the same batches (--no-reference skips it); its JSON line (MGPU_RESULT): losses and step-0 gradient norms per mesh.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/hybrid_gpt2.py --layouts 2x2,1x4,4x1
"""
import argparse
import contextlib
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.models import byte_gpt2 as make_model
from mgpu_utils.costs.planner import parse_layouts
from mgpu_utils.text_data import byte_corpus, corpus_sha256, get_batch, split
from mgpu_utils.timing import synced_clock


def _linear(w, b):
    """nn.Linear computing x @ w + b for a Conv1D weight w of shape (in, out)."""
    lin = nn.Linear(w.shape[0], w.shape[1], device=w.device, dtype=w.dtype)   # on the model's device
    with torch.no_grad():
        lin.weight.copy_(w.t())
        lin.bias.copy_(b)
    return lin


class QKV(nn.Module):
    """Separate q, k, v projections returning cat([q, k, v], -1), like GPT-2's fused c_attn."""

    def __init__(self, conv):
        super().__init__()
        h = conv.weight.shape[0]
        self.q, self.k, self.v = (_linear(conv.weight[:, i * h:(i + 1) * h], conv.bias[i * h:(i + 1) * h])
                                  for i in range(3))

    def forward(self, x):
        return torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)


def to_linear_gpt2(model):
    """Swap every Conv1D of the blocks for nn.Linear (same function) in place; return the model."""
    for block in model.transformer.h:
        block.attn.c_attn = QKV(block.attn.c_attn)
        block.attn.c_proj = _linear(block.attn.c_proj.weight, block.attn.c_proj.bias)
        block.mlp.c_fc = _linear(block.mlp.c_fc.weight, block.mlp.c_fc.bias)
        block.mlp.c_proj = _linear(block.mlp.c_proj.weight, block.mlp.c_proj.bias)
    return model


def tensor_parallel(model, tp_mesh):
    """Megatron tensor parallelism of every block over tp_mesh: 2 all-reduces forward, 2 backward.
    Run to_linear_gpt2(model) first. Raises ValueError if tp does not divide n_head or the model is
    not swapped."""
    tp = tp_mesh.size()
    if model.config.n_head % tp:
        raise ValueError(f"tp={tp} does not divide n_head={model.config.n_head}: "
                         f"pick tp from its divisors")
    if not all(isinstance(b.attn.c_attn, QKV) for b in model.transformer.h):
        raise ValueError("tensor_parallel needs to_linear_gpt2(model) first "
                         "(Conv1D -> nn.Linear, q/k/v split)")
    # one input-grad all-reduce for q, k, v
    qkv_in = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                use_local_output=False)
    plan = {"attn.c_attn": qkv_in,
            "attn.c_attn.q": ColwiseParallel(), "attn.c_attn.k": ColwiseParallel(),
            "attn.c_attn.v": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
    for block in model.transformer.h:
        parallelize_module(block, tp_mesh, plan)
        # the local c_attn output is [q_r | k_r | v_r] of h/tp columns each: split it there. The
        # head count follows, since HF reshapes with view(..., -1, head_dim): n_head/tp local heads.
        block.attn.split_size = block.attn.embed_dim // tp
    return model


def grad_norms(model):
    """{parameter name: L2 norm of its whole gradient}; a DTensor gradient is gathered over its mesh first."""
    return {k: (q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad).norm().item()
            for k, q in model.named_parameters() if q.grad is not None}


def train(model, batches, lr, dp_group=None, comm=None):
    """AdamW over ``batches`` (int64 (b, seq) byte ids: this rank's rows). With ``dp_group``: the
    parameters (local shards) are first broadcast from dp rank 0, as DDP does at construction; after
    each backward the gradients are averaged over it (one flat all-reduce; parameters without a
    gradient are skipped: all ranks run the same code, so they agree). Returns the losses over the
    global batch and step 0's gradient norms."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    dp = dist.get_world_size(dp_group) if dp_group is not None else 1
    with torch.no_grad():
        for q in model.parameters() if dp > 1 else []:
            local = q.to_local() if isinstance(q, DTensor) else q
            dist.broadcast(local, group=dp_group, group_src=0)
    losses = []
    for step, xb in enumerate(batches):
        with (comm if (comm is not None and step == 0) else contextlib.nullcontext(),
              warnings.catch_warnings()):
            # CommDebugMode's module hooks cannot see HF's output objects (harmless notice)
            warnings.filterwarnings("ignore", message="For backward hooks to be called")
            loss = model(xb, labels=xb).loss              # HF shifts the labels by one itself
            opt.zero_grad(set_to_none=True)
            loss.backward()
        stat = loss.detach().clone()
        if dp > 1:
            grads = [q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad
                     for q in model.parameters() if q.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)         # sum over the dp group ...
            flat /= dp                                    # ... and average, like DDP
            for g, new in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(new.view_as(g))
            dist.all_reduce(stat, group=dp_group)
        norms0 = grad_norms(model) if step == 0 else norms0
        opt.step()
        losses.append(stat.item() / dp)                   # mean over the global batch
    return losses, norms0


def main():
    p = argparse.ArgumentParser(description="2-D (data x tensor) parallel GPT-2")
    g = p.add_argument_group("layouts")
    g.add_argument("--layouts", default="auto", help="comma list of DPxTP meshes run one after the other "
                   "(product = world size); auto: (world/2)x2, or world x 1 for an odd world size or head count")
    g.add_argument("--no-reference", dest="reference", action="store_false", help="skip rank 0's 1-process reference")
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--width", type=int, default=64, help="d_model (hidden size)")
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--seq", type=int, default=64, help="sequence length in bytes (= n_positions)")
    g = p.add_argument_group("training")
    g.add_argument("--global-batch", type=int, default=8, help="sequences per step, split over dp")
    g.add_argument("--steps", type=int, default=30)
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (3e-3: near the edge of stability)")
    g.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, device, n = ctx.world_size, ctx.device, args.global_batch
        layouts = parse_layouts(args.layouts, world, args.heads, n)
        train_bytes, val_bytes = split(byte_corpus())
        batches = [get_batch(train_bytes, step, n, args.seq - 1, args.seed).to(device) for step in range(args.steps)]
        val_x = get_batch(val_bytes, 10**6, 32, args.seq - 1, args.seed).to(device)
        mk = lambda: make_model(args.layers, args.width, args.heads, args.seq, args.seed).to(device)
        out = {"world_size": world, "backend": ctx.backend, "corpus_bytes": len(train_bytes) + len(val_bytes),
               "corpus_sha256": corpus_sha256(torch.cat([train_bytes, val_bytes])), "layouts": {}}
        for dp, tp in layouts:
            model, d, dp_group = to_linear_gpt2(mk()), 0, None
            if dist.is_initialized():                     # plain python (world size 1): no mesh
                mesh = device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
                d, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
                model = tensor_parallel(model, mesh["tp"])
            rows = slice(d * n // dp, (d + 1) * n // dp)  # this dp rank's rows of every global batch
            comm, t0 = CommDebugMode(), synced_clock(ctx.device)   # comm counts DTensor collectives of step 0
            losses, norms0 = train(model, [xb[rows] for xb in batches], args.lr, dp_group, comm)
            sec = synced_clock(ctx.device) - t0
            with torch.no_grad():
                val_loss = model(val_x, labels=val_x).loss.item()
            counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
            local_params = sum((q.to_local() if isinstance(q, DTensor) else q).numel() for q in model.parameters())
            ctx.log(f"mesh {dp}x{tp}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, val {val_loss:.4f}, "
                    f"{sec / args.steps * 1e3:.1f} ms/step, {local_params} parameters on this rank")
            out["layouts"][f"{dp}x{tp}"] = {"dp": dp, "tp": tp, "loss": losses, "val_loss": val_loss,
                                            "ms_per_step": sec / args.steps * 1e3, "grad_norms_step0": norms0,
                                            "tp_comm_counts_step0": counts, "params_on_rank0": local_params}
            if dist.is_initialized():
                dist.barrier()
        if args.reference and ctx.is_main:  # after the meshes: no rank waits in a collective meanwhile
            ref, swapped = mk(), to_linear_gpt2(mk())
            with torch.no_grad():
                a, b = ref(val_x).logits, swapped(val_x).logits
            torch.testing.assert_close(b, a)              # the Conv1D -> Linear swap changes nothing
            t0 = synced_clock(ctx.device)
            out["reference"] = {"loss": train(ref, batches, args.lr)[0], "swap_max_logit_diff": (a - b).abs().max().item(),
                                "ms_per_step": (synced_clock(ctx.device) - t0) / args.steps * 1e3,
                                "params_total": sum(q.numel() for q in ref.parameters())}
            with torch.no_grad():
                out["reference"]["val_loss"] = ref(val_x, labels=val_x).loss.item()
            out["reference"]["grad_norms_step0"] = train(swapped, batches[:1], args.lr)[1]   # the meshes' names

        out.update(layers=args.layers, embd=args.width, heads=args.heads, seq=args.seq, steps=args.steps,
                   global_batch=n, lr=args.lr)
        emit_result(out)


if __name__ == "__main__":
    main()
