"""One small Llama (mgpu_utils.models.TinyLlama) under many layouts, each equal to one process (capstone, issue 59).
Each of --layouts is a DeviceMesh ("pp", "dp", "fsdp", "tp"), tp fastest (Megatron-LM's order): sizes joined by "-"
(size-1 dimensions left out; dp: what the others leave of the world), then ":" and a pipeline schedule, e.g.
"dp2-tp2-pp2:Interleaved1F1B", "fsdp4", "tp2" ("dp" alone: every rank a replica, also at world size 1).
  dp    replicas: the gradients (local shards under fsdp or tp) summed over the dp group and divided by dp.
  fsdp  FSDP2 (fully_shard per block, then the stage): parameters, gradients and optimizer state sharded.
  tp    Megatron TP + sequence parallelism (parallelize_module): wq, wk, wv, w1, w3 split by columns, wo, w2 by rows,
        the embedding and output by vocabulary rows; between blocks a rank holds seq/tp tokens, replicated norms.
  pp    torch.distributed.pipelining, the layout's schedule (default 1F1B) over --micro-batches; the tied embedding's
        copies (first, last stage) get their gradients summed. Refused: fsdp under a zero-bubble schedule (off).
A step's --global-batch rows are split over dp x fsdp. Rank 0 trains the reference (one process, whole batch) and
sends it to all; each layout trains from the same seeded weights, and every rank checks its parameters (gathered
from its shards) and the losses against it: within 1e-5 after --steps SGD steps (Adam would hide a gradient scaled
wrongly). --bug plants one: norm-grad (norms left out of the dp all-reduce), pp-unscaled (micro-batches summed).
    torchrun --standalone --nproc-per-node 4 launch_scripts/capstone_train.py --layouts dp2-tp2 tp2-pp2 fsdp4
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel as Col, PrepareModuleInput, RowwiseParallel as Row
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import device_mesh, distributed, emit_result, new_group
from mgpu_utils.models import LlamaConfig, pipeline_stage, tiny_llama
from mgpu_utils.parallel.experts import MoE
from mgpu_utils.text_data import byte_corpus, get_batch, split

TOL, SEED, LR = 1e-5, 0, 0.2   # fp32 layouts differ from one process in summation order only; SGD's rate


def loss_fn(logits, targets):                   # next-byte cross-entropy, the mean over (B, S) tokens
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tensor_parallel(model, tp_mesh):
    """Megatron TP + sequence parallelism of a model or a pipeline stage (activations between blocks: Shard(1))."""
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(), "attention": gather, "attention.wq": Col(), "attention.wk": Col(),
            "attention.wv": Col(), "attention.wo": Row(output_layouts=Shard(1)), "ffn_norm": SequenceParallel(),
            "feed_forward": gather, "feed_forward.w1": Col(), "feed_forward.w3": Col(),
            "feed_forward.w2": Row(output_layouts=Shard(1))})
    plan = {"tok_embeddings": Row(input_layouts=Replicate(), output_layouts=Shard(1)), "norm": SequenceParallel(),
            "output": Col(input_layouts=Shard(1), output_layouts=Replicate())}        # those this stage has
    parallelize_module(model, tp_mesh, {k: style for k, style in plan.items() if getattr(model, k) is not None})
    if model.tok_embeddings is not None and model.output is not None:
        model.output.weight = model.tok_embeddings.weight        # parallelize_module made two copies: tie again


def parse_layout(text, world):
    """"dp2-tp2-pp2:GPipe" -> {"dp": 2, "fsdp": 1, "tp": 2, "pp": 2, "schedule": "GPipe"} at this world size."""
    spec, _, schedule = text.partition(":")
    L = {"dp": 0, "fsdp": 1, "tp": 1, "pp": 1, "schedule": schedule or "1F1B"}
    for part in filter(None, spec.split("-")):
        name = part.rstrip("0123456789")
        if name not in ("dp", "fsdp", "tp", "pp"):
            raise SystemExit(f"layout {text!r}: {part!r} is not dp, fsdp, tp or pp and a size, e.g. tp2")
        L[name] = int(part[len(name):] or 0)
    L["dp"] = L["dp"] or world // (L["fsdp"] * L["tp"] * L["pp"])
    return L


def local_grad(q):
    """This rank's shard of q's gradient, laid out as q is (an embedding's comes back Replicate under TP)."""
    if isinstance(q.grad, DTensor) and q.grad.placements != q.placements:
        q.grad = q.grad.redistribute(q.device_mesh, q.placements)
    return q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad


def train_layout(L, a, cfg, ctx, batches):
    """Train layout L for --steps; returns the losses and this rank's parameters, gathered from their shards."""
    W, dp, fsdp, tp, pp = ctx.world_size, L["dp"], L["fsdp"], L["tp"], L["pp"]
    cls, rows = get_schedule_class(L["schedule"]), a.global_batch // max(1, dp * fsdp)
    per_rank = 2 if issubclass(cls, PipelineScheduleMulti) else 1      # stages per pp rank: a loop or a V
    n_stages, split_bw = pp * per_rank if pp > 1 else 1, "ZeroBubble" in cls.__name__ or "DualPipe" in cls.__name__
    if (dp * fsdp * tp * pp != W or a.layers % n_stages or a.kv_heads % tp or a.seq % tp or (a.experts and tp > 1)
            or rows * dp * fsdp != a.global_batch or (pp > 1 and rows % a.micro_batches) or (fsdp > 1 and split_bw)):
        raise SystemExit(f"layout {dp}x{fsdp}x{tp}x{pp} (dp x fsdp x tp x pp): needs a product of {W} (world size), "
                         f"--layers divisible by its {n_stages} stages, --kv-heads, --seq by tp, no --experts with tp, "
                         "--global-batch by dp x fsdp (x --micro-batches with pp), no fsdp under a zero-bubble schedule"
                         " or DualPipeV (0.05 off one process on torch 2.14: use 1F1B); e.g. --layouts dp2-tp2")
    names = [n for n in ("pp", "dp", "fsdp", "tp") if L[n] > 1]
    mesh = device_mesh(ctx.device.type, tuple(L[n] for n in names), mesh_dim_names=tuple(names)) if names else None
    at = {n: mesh.get_local_rank(n) if n in names else 0 for n in ("pp", "dp", "fsdp", "tp")}
    data_rank, v, tie_group = at["dp"] * fsdp + at["fsdp"], "V" in cls.__name__, None   # tie: pp's tied copies
    ids = [at["pp"], (2 * pp - 1 - at["pp"]) if v else at["pp"] + pp][:per_rank] if pp > 1 else [0]
    stages = [pipeline_stage(tiny_llama(cfg, SEED, MoE).to(ctx.device), s, n_stages) for s in ids]
    for m in stages:
        if tp > 1:
            tensor_parallel(m, mesh["tp"])
        for block in [*m.layers.values(), m] if fsdp > 1 else []:    # FSDP2: each block, then the stage
            fully_shard(block, mesh=mesh["fsdp"])
    tied = [m.tok_embeddings.weight for m in stages if m.tok_embeddings is not None]
    tied += [m.output.weight for m in stages if m.output is not None and m.tok_embeddings is None]
    if pp > 1:
        pipe = [PipelineStage(m, s, n_stages, ctx.device, group=mesh.get_group("pp")) for s, m in zip(ids, stages)]
        schedule = cls(pipe if per_rank > 1 else pipe[0], a.micro_batches, loss_fn, scale_grads=a.bug != "pp-unscaled")
        last = 0 if v else pp - 1                                       # the pp rank of the last stage
        for ranks in mesh.mesh.movedim(0, -1).reshape(-1, pp).tolist() if last else []:
            grp = new_group([ranks[0], ranks[last]])                    # every rank makes every pair's group
            tie_group = grp if ctx.rank in (ranks[0], ranks[last]) else tie_group
    params = [(n, q) for m in stages for n, q in m.named_parameters()]
    opt, losses = torch.optim.SGD([q for _, q in params], lr=LR), []
    for xb in batches:
        x, y = (t[data_rank * rows:(data_rank + 1) * rows] for t in (xb[:, :-1], xb[:, 1:]))
        opt.zero_grad()
        if pp > 1:
            mb_losses = []
            schedule.step(*([x] if 0 in ids else []), target=y if n_stages - 1 in ids else None, losses=mb_losses)
            mine = torch.stack(mb_losses).mean().item() if mb_losses else 0.0
            if tie_group is not None or len(tied) > 1:                  # the tied copies' gradients summed
                total = sum(local_grad(q) for q in tied)
                if tie_group is not None:
                    dist.all_reduce(total, group=tie_group)
                for q in tied:
                    local_grad(q).copy_(total)
        else:
            loss = loss_fn(stages[0](x), y)
            loss.backward()
            mine = loss.item()
        if dp > 1:                                     # the replicas' gradients: one flat all-reduce, averaged
            grads = [local_grad(q) for n, q in params if not (a.bug == "norm-grad" and "norm" in n)]
            flat = torch.cat([t.reshape(-1) for t in grads])
            dist.all_reduce(flat, group=mesh.get_group("dp"))
            for t, new in zip(grads, (flat / dp).split([t.numel() for t in grads])):
                t.copy_(new.view_as(t))
        opt.step()
        holds_loss = (pp == 1 or n_stages - 1 in ids) and at["tp"] == 0
        total = torch.tensor([mine / (dp * fsdp) if holds_loss else 0.0], dtype=torch.float64)
        if W > 1:
            dist.all_reduce(total)                      # the mean over every replica's rows
        losses.append(total.item())
    return losses, [(n, q.full_tensor() if isinstance(q, DTensor) else q) for n, q in params]


def main():
    p = argparse.ArgumentParser(description="one small Llama under many layouts, against one process")
    g = p.add_argument_group("layouts (see the docstring)")         # the result: each layout's losses, differences
    g.add_argument("--layouts", nargs="+", default=["dp"], help="e.g. dp2-tp2 fsdp4 pp2:ZBVZeroBubble; schedules: "
                   "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV")
    g.add_argument("--micro-batches", type=int, default=4, help="pipeline micro-batches per replica per step")
    g.add_argument("--bug", choices=["none", "norm-grad", "pp-unscaled"], default="none", help="plant a bug")
    g = p.add_argument_group("model (TinyLlama: width 64, 4 query heads) and training")
    g.add_argument("--layers", type=int, default=4, help="decoder blocks (divisible by the pipeline stages)")
    g.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA; divisible by tp)")
    g.add_argument("--experts", type=int, default=0, help="> 0: a mixture of experts in every block")
    g.add_argument("--seq", type=int, default=32, help="bytes per sequence (divisible by tp)")
    g.add_argument("--global-batch", type=int, default=16, help="sequences per step, all replicas together")
    g.add_argument("--steps", type=int, default=10, help="SGD steps")
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():
        cfg = LlamaConfig(layers=a.layers, kv_heads=a.kv_heads, experts=a.experts)
        layouts = [(text, parse_layout(text, ctx.world_size)) for text in a.layouts]
        train_bytes, _ = split(byte_corpus())
        batches = [get_batch(train_bytes, s, a.global_batch, a.seq, SEED).to(ctx.device) for s in range(a.steps)]
        ref, ref_losses = tiny_llama(cfg, SEED, MoE).to(ctx.device), torch.zeros(a.steps, dtype=torch.float64)
        opt = torch.optim.SGD(ref.parameters(), lr=LR)
        for step, xb in enumerate(batches if ctx.is_main else []):    # the reference: one process, on rank 0
            loss = loss_fn(ref(xb[:, :-1]), xb[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            ref_losses[step] = loss.item()
        flat = torch.cat([torch.nn.utils.parameters_to_vector(ref.parameters()).detach(), ref_losses.float()])
        if ctx.world_size > 1:
            dist.broadcast(flat, 0)                                   # ... sent to every rank
        torch.nn.utils.vector_to_parameters(flat[:-a.steps], ref.parameters())
        ref_losses = flat[-a.steps:].double()
        ref_params, ref_losses = dict(ref.named_parameters(remove_duplicate=False)), ref_losses.tolist()
        out = {"world_size": ctx.world_size, "steps": a.steps, "ref_losses": ref_losses, "bug": a.bug, "layouts": {},
               "params": sum(q.numel() for q in ref.parameters())}
        for text, L in layouts:
            losses, mine = train_layout(L, a, cfg, ctx, batches)
            worst, where = max(((q.detach() - ref_params[n].detach()).abs().max().item(), n) for n, q in mine)
            worst_all = torch.tensor([worst], dtype=torch.float64)
            if ctx.world_size > 1:
                dist.all_reduce(worst_all, op=dist.ReduceOp.MAX)
            loss_diff = max(abs(u - v) for u, v in zip(losses, ref_losses))
            ctx.log(f"{text}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; after {a.steps} steps largest difference from "
                    f"one process: loss {loss_diff:.2g}, parameters {worst_all.item():.2g} (allowed {TOL:g})")
            if worst_all.item() > TOL or loss_diff > TOL * max(1.0, abs(ref_losses[0])):
                where = where if worst > TOL else "another rank's parameter"
                raise AssertionError(f"layout {text}: {where} differs from one process by {worst_all.item():.3g} and "
                                     f"the loss by {loss_diff:.3g} after {a.steps} steps (allowed {TOL:g})")
            out["layouts"][text] = {**L, "losses": losses, "max_loss_diff": loss_diff,
                                    "max_param_diff": worst_all.item()}
        emit_result(out)


if __name__ == "__main__":
    main()
