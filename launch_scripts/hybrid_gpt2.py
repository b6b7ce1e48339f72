"""2-D parallel training (data x tensor) of a small GPT-2 on stdlib docstrings (notebooks/06_hybrid_parallel.ipynb).

The ranks form a device mesh of shape (dp, tp) with init_device_mesh. Inside each row of the mesh
(a "tp" group) the GPT-2 blocks are tensor-parallel (Megatron layout, with parallelize_module):
q, k, v and the MLP's first layer are split by output columns (each rank holds n_head/tp heads and
4h/tp MLP units), the attention output projection and the MLP's second layer by input rows, whose
partial results are summed by one all-reduce. Across the rows (a "dp" group) the ranks see different
data and average their gradients with one all-reduce over the dp group per step: data parallelism.

HF GPT-2 uses Conv1D (y = x W + b, W stored as (in, out)), which ColwiseParallel/RowwiseParallel do not
accept: to_linear_gpt2() swaps each Conv1D for nn.Linear with the transposed weight and c_attn for
separate q, k, v Linears, and the script asserts the swapped model gives the same logits.

Rank 0 also trains the unmodified single-process GPT2LMHeadModel on the same global batches
(--reference, on by default), so every layout's losses can be compared with it.
--layouts runs several meshes one after the other in one launch (e.g. 2x2,1x4,4x1 on 4 ranks).
Rank 0 prints one JSON line (MGPU_RESULT) with the per-step losses of every layout and the reference.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/hybrid_gpt2.py --layouts 2x2,1x4,4x1
"""
import argparse
import contextlib
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               parallelize_module)
from transformers import GPT2Config, GPT2LMHeadModel

from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.text_data import byte_corpus, corpus_sha256, get_batch, split


def make_model(layers=2, embd=64, heads=4, seq=64, seed=0):
    """A randomly initialised byte-level GPT2LMHeadModel (vocab 256, dropout 0: runs are comparable)."""
    cfg = GPT2Config(vocab_size=256, n_positions=seq, n_embd=embd, n_layer=layers, n_head=heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).float()
    model.loss_type = "ForCausalLM"   # the loss HF uses anyway; naming it silences a notice
    return model


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
    """Megatron tensor parallelism of every block over tp_mesh: 2 all-reduces forward, 2 backward."""
    tp = tp_mesh.size()
    plan = {"attn.c_attn": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                              use_local_output=False),  # one input-grad all-reduce for q, k, v
            "attn.c_attn.q": ColwiseParallel(), "attn.c_attn.k": ColwiseParallel(),
            "attn.c_attn.v": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
    for block in model.transformer.h:
        parallelize_module(block, tp_mesh, plan)
        # the local c_attn output is [q_r | k_r | v_r] of h/tp columns each: split it there. The head
        # count follows, since HF reshapes with view(..., -1, head_dim): n_head/tp local heads.
        block.attn.split_size = block.attn.embed_dim // tp
    return model


def train(model, batches, lr, dp_group=None, comm=None):
    """AdamW over ``batches``; with ``dp_group`` the gradients are averaged over it after backward (data
    parallelism, one flat all-reduce per step). Returns the losses, averaged over the dp group."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    dp = dist.get_world_size(dp_group) if dp_group is not None else 1
    losses = []
    for step, xb in enumerate(batches):
        with comm if (comm is not None and step == 0) else contextlib.nullcontext(), warnings.catch_warnings():
            # CommDebugMode's module hooks cannot see HF's output objects (harmless notice)
            warnings.filterwarnings("ignore", message="For backward hooks to be called")
            loss = model(xb, labels=xb).loss              # HF shifts the labels by one itself
            opt.zero_grad(set_to_none=True)
            loss.backward()
        stat = loss.detach().clone()
        if dp > 1:
            grads = [q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad for q in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)         # sum over the dp group ...
            flat /= dp                                    # ... and average, like DDP
            for g, new in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(new.view_as(g))
            dist.all_reduce(stat, group=dp_group)
        opt.step()
        losses.append(stat.item() / dp)                   # mean over the global batch
    return losses


def main():
    p = argparse.ArgumentParser(description="2-D (data x tensor) parallel GPT-2")
    g = p.add_argument_group("mesh")
    g.add_argument("--layouts", default="auto", help="comma list of DPxTP meshes run one after the other "
                   "(product = world size); auto: (world/2)x2, or world x 1 for an odd world size")
    g = p.add_argument_group("model (GPT2Config) and training")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--embd", type=int, default=64)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--seq", type=int, default=64, help="sequence length in bytes (= n_positions)")
    g.add_argument("--global-batch", type=int, default=8, help="sequences per step, split over dp")
    g.add_argument("--steps", type=int, default=30)
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (3e-3: near the edge of stability)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the single-process reference on rank 0")
    args = p.parse_args()

    with distributed() as ctx:
        world, device, n = ctx.world_size, ctx.device, args.global_batch
        layouts = args.layouts if args.layouts != "auto" else (f"{world // 2}x2" if world % 2 == 0 else f"{world}x1")
        layouts = [tuple(int(v) for v in s.lower().split("x")) for s in layouts.split(",")]
        for dp, tp in layouts:
            if dp * tp != world or args.heads % tp or n % dp:
                raise ValueError(f"layout {dp}x{tp} needs world size dp*tp = {dp * tp} (got {world}: use "
                                 f"--nproc-per-node {dp * tp}), tp dividing --heads {args.heads} and dp "
                                 f"dividing --global-batch {n}")
        train_bytes, val_bytes = split(byte_corpus())
        # windows of --seq bytes: the model predicts bytes 2..seq from the ones before
        batches = [get_batch(train_bytes, step, n, args.seq - 1, args.seed).to(device) for step in range(args.steps)]
        val_x = get_batch(val_bytes, 10**6, 32, args.seq - 1, args.seed).to(device)
        mk = lambda: make_model(args.layers, args.embd, args.heads, args.seq, args.seed).to(device)
        out = {"world_size": world, "backend": ctx.backend, "corpus_bytes": len(train_bytes) + len(val_bytes),
               "corpus_sha256": corpus_sha256(torch.cat([train_bytes, val_bytes])), "layouts": {}}

        if args.reference and ctx.is_main:  # single process: unmodified HF model (Conv1D), whole batch
            ref, swapped = mk(), to_linear_gpt2(mk())
            with torch.no_grad():
                a, b = ref(val_x).logits, swapped(val_x).logits
            torch.testing.assert_close(b, a)              # the Conv1D -> Linear swap changes nothing
            t0 = time.perf_counter()
            out["reference"] = {"loss": train(ref, batches, args.lr), "swap_max_logit_diff": (a - b).abs().max().item(),
                                "ms_per_step": (time.perf_counter() - t0) / args.steps * 1e3,
                                "params_total": sum(q.numel() for q in ref.parameters())}
            with torch.no_grad():
                out["reference"]["val_loss"] = ref(val_x, labels=val_x).loss.item()

        for dp, tp in layouts:
            model, d, dp_group = to_linear_gpt2(mk()), 0, None
            if dist.is_initialized():                     # plain python (world size 1): no mesh
                mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
                d, dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
                model = tensor_parallel(model, mesh["tp"])
            rows = slice(d * n // dp, (d + 1) * n // dp)  # this dp rank's rows of every global batch
            comm, t0 = CommDebugMode(), time.perf_counter()   # comm counts DTensor collectives of step 0
            losses = train(model, [xb[rows] for xb in batches], args.lr, dp_group, comm)
            sec = time.perf_counter() - t0
            with torch.no_grad():
                val_loss = model(val_x, labels=val_x).loss.item()
            counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
            local_params = sum((q.to_local() if isinstance(q, DTensor) else q).numel() for q in model.parameters())
            ctx.log(f"mesh {dp}x{tp}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, val {val_loss:.4f}, "
                    f"{sec / args.steps * 1e3:.1f} ms/step, {local_params} parameters on this rank")
            out["layouts"][f"{dp}x{tp}"] = {"dp": dp, "tp": tp, "loss": losses, "val_loss": val_loss,
                                            "ms_per_step": sec / args.steps * 1e3,
                                            "tp_comm_counts_step0": counts, "params_on_rank0": local_params}
            if dist.is_initialized():
                dist.barrier()
        out.update(layers=args.layers, embd=args.embd, heads=args.heads, seq=args.seq, steps=args.steps,
                   global_batch=n, lr=args.lr)
        emit_result(out)


if __name__ == "__main__":
    main()
