"""One small Llama (mgpu_utils.models.TinyLlama) under many layouts, each equal to one process (capstone, issue 59).
Each of --layouts is a DeviceMesh (pp, dp, fsdp, ep, cp, tp; tp fastest, as Megatron-LM orders them): sizes joined
by "-" (size-1 dimensions left out; dp: what the others leave of the world), then ":" and a pipeline schedule, e.g.
"dp2-tp2-pp2:Interleaved1F1B", "fsdp4", "cp2-tp2", "dp2-ep2" ("dp" alone: every rank a replica, also at 1 rank).
The pieces are in mgpu_utils.parallel.layouts:
  dp    replicas: the gradients (local shards under fsdp or tp) summed over the dp group and divided by dp.
  fsdp  FSDP2 (fully_shard per block, then the stage): parameters, gradients and optimizer state sharded.
  tp    Megatron TP + sequence parallelism (parallelize_module): wq, wk, wv, w1, w3 split by columns, wo, w2 by rows,
        the embedding and output by vocabulary rows; between blocks a rank holds seq/tp tokens, replicated norms.
  pp    torch.distributed.pipelining, the layout's schedule (default 1F1B) over --micro-batches; the tied embedding's
        copies (first, last stage) get their gradients summed. Refused: fsdp under a zero-bubble schedule (off).
  cp    context parallelism: a cp rank holds seq/cp tokens of each row (--cp-layout zigzag: two chunks, balanced
        under the causal mask); attention is lesson 08's ring attention over the cp group, rotary embeddings at the
        global positions; a rank's loss is the mean over its tokens, so gradients are summed over cp and divided.
  ep    expert parallelism (--experts, or --ep-experts in a dense launch, against their own one process): lesson
        08's ExpertParallelMoE, the experts split over the ep ranks, tokens sent to their expert by all-to-all. The
        ep ranks are data replicas too (each its own rows, as dp's): the router, attention and norms are summed over
        ep as over dp; an expert's gradient already holds every ep rank's tokens (the all-to-all's backward), so it
        is summed over dp and cp only. All divided by dp x ep x cp.
A step's --global-batch rows are split over dp x fsdp x ep. Rank 0 trains the reference (one process, whole batch)
and sends it to all; each layout trains from the same seeded weights, and every rank checks its parameters
(gathered from its shards) and the losses against it: within 1e-5 after --steps SGD steps (Adam would hide a
gradient scaled wrongly). --bug plants one: norm-grad (norms left out of the replicas' all-reduce), pp-unscaled
(micro-batches summed), cp-positions (rotary embeddings at a cp rank's local positions).
    torchrun --standalone --nproc-per-node 4 launch_scripts/capstone_train.py --layouts dp2-tp2 cp2-tp2 fsdp4
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
from torch.distributed.tensor import DTensor

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.models import LlamaConfig, pipeline_stage, tiny_llama
from mgpu_utils.parallel.experts import MoE
from mgpu_utils.parallel.layouts import DIMS, context_parallel, cp_shard, expert_parallel, next_token_loss, \
    parse_layout, reduce_gradients, sum_tied, tensor_parallel, tie_group
from mgpu_utils.text_data import byte_corpus, get_batch, split

TOL, SEED, LR = 1e-5, 0, 0.2   # fp32 layouts differ from one process in summation order only; SGD's rate


def train_layout(L, a, cfg, ctx, batches):
    """Train layout L for --steps; returns the losses and this rank's parameters (gathered from
    their shards, named as in the whole model)."""
    W, (pp, dp, fsdp, ep, cp, tp) = ctx.world_size, (L[d] for d in DIMS)
    cls, reps = get_schedule_class(L["schedule"]), dp * fsdp * ep           # reps: the replicas, each its rows
    rows, per_rank = a.global_batch // reps, 2 if issubclass(cls, PipelineScheduleMulti) else 1  # a loop or a V
    n_stages = pp * per_rank if pp > 1 else 1
    split_bw = "ZeroBubble" in cls.__name__ or "DualPipe" in cls.__name__
    if (reps * cp * tp * pp != W or a.layers % n_stages or a.kv_heads % tp or a.seq % (cp * tp)
            or (cp > 1 and a.cp_layout == "zigzag" and a.seq % (2 * cp)) or (cfg.experts and tp > 1)
            or (ep > 1 and cfg.experts % ep) or rows * reps != a.global_batch
            or (pp > 1 and rows % a.micro_batches) or (fsdp > 1 and split_bw)):
        raise SystemExit(
            f"layout {'-'.join(f'{d}{L[d]}' for d in DIMS)}: needs a product of {W} (world size), "
            f"--layers divisible by its {n_stages} stages, --kv-heads by tp, --seq by cp x tp "
            "(zigzag: 2 cp), no experts with tp, the experts by ep, --global-batch by dp x fsdp "
            "x ep (x --micro-batches with pp), no fsdp under a zero-bubble schedule or DualPipeV "
            "(0.05 off one process on torch 2.14: use 1F1B)")
    names = [n for n in DIMS if L[n] > 1]
    mesh = (device_mesh(ctx.device.type, tuple(L[n] for n in names), mesh_dim_names=tuple(names))
            if names else None)
    at = {n: mesh.get_local_rank(n) if n in names else 0 for n in DIMS}
    cp_group = mesh.get_group("cp") if cp > 1 else None
    data_rank = (at["dp"] * fsdp + at["fsdp"]) * ep + at["ep"]
    v, rename = "V" in cls.__name__, (lambda n: n)
    ids = [at["pp"], (2 * pp - 1 - at["pp"]) if v else at["pp"] + pp][:per_rank] if pp > 1 else [0]
    stages = [pipeline_stage(tiny_llama(cfg, SEED, MoE).to(ctx.device), s, n_stages) for s in ids]
    for m in stages:
        if cp > 1:
            context_parallel(m, cp_group, a.seq, a.cp_layout)          # ring attention over the cp ranks
            for block in m.layers.values() if a.bug == "cp-positions" else []:
                block.attention.positions = torch.arange(a.seq // cp, device=ctx.device)   # local, not global
        if ep > 1:
            rename = expert_parallel(m, mesh.get_group("ep"))
        if tp > 1:
            tensor_parallel(m, mesh["tp"])
        for block in [*m.layers.values(), m] if fsdp > 1 else []:    # FSDP2: each block, then the stage
            fully_shard(block, mesh=mesh["fsdp"])
    tied = [m.tok_embeddings.weight for m in stages if m.tok_embeddings is not None]
    tied += [m.output.weight for m in stages if m.output is not None and m.tok_embeddings is None]
    if pp > 1:
        pipe = [PipelineStage(m, s, n_stages, ctx.device, group=mesh.get_group("pp"))
                for s, m in zip(ids, stages)]
        schedule = cls(pipe if per_rank > 1 else pipe[0], a.micro_batches, next_token_loss,
                       scale_grads=a.bug != "pp-unscaled")
        tied_with = tie_group(mesh, pp, 0 if v else pp - 1, ctx.rank)   # the other copy's rank (V: this one)
    params = [(n, q) for m in stages for n, q in m.named_parameters()]
    opt, losses = torch.optim.SGD([q for _, q in params], lr=LR), []
    for xb in batches:
        x, y = (cp_shard(t[data_rank * rows:(data_rank + 1) * rows], cp_group, a.cp_layout)
                for t in (xb[:, :-1], xb[:, 1:]))
        opt.zero_grad()
        if pp > 1:
            mb_losses = []
            schedule.step(*([x] if 0 in ids else []), target=y if n_stages - 1 in ids else None,
                          losses=mb_losses)
            mine = torch.stack(mb_losses).mean().item() if mb_losses else 0.0
            sum_tied(tied, tied_with)                                  # the tied copies' gradients summed
        else:
            loss = next_token_loss(stages[0](x), y)
            loss.backward()
            mine = loss.item()
        reduce_gradients(params, mesh, L, skip=lambda n: a.bug == "norm-grad" and "norm" in n)   # dp, ep, cp
        opt.step()
        holds_loss = (pp == 1 or n_stages - 1 in ids) and at["tp"] == 0
        total = torch.tensor([mine / (reps * cp) if holds_loss else 0.0], dtype=torch.float64)
        if W > 1:
            dist.all_reduce(total)                      # the mean over every replica's rows and cp rank's tokens
        losses.append(total.item())
    return losses, [(rename(n), q.full_tensor() if isinstance(q, DTensor) else q)
                    for n, q in params]


def reference(cfg, ctx, batches):
    """One process (rank 0) trains cfg's model on the whole batch; every rank gets its parameters (by name, the
    tied weight under both names), its losses and its parameter count."""
    ref, ref_losses = tiny_llama(cfg, SEED, MoE).to(ctx.device), torch.zeros(len(batches), dtype=torch.float64)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step, xb in enumerate(batches if ctx.is_main else []):
        loss = next_token_loss(ref(xb[:, :-1]), xb[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses[step] = loss.item()
    flat = torch.cat([torch.nn.utils.parameters_to_vector(ref.parameters()).detach(), ref_losses.float()])
    if ctx.world_size > 1:
        dist.broadcast(flat, 0)                                   # ... sent to every rank
    torch.nn.utils.vector_to_parameters(flat[:-len(batches)], ref.parameters())
    return (dict(ref.named_parameters(remove_duplicate=False)), flat[-len(batches):].double().tolist(),
            sum(q.numel() for q in ref.parameters()))


def main():
    p = argparse.ArgumentParser(description="one small Llama under many layouts, against one process")
    g = p.add_argument_group("layouts (see the docstring)")         # the result: each layout's losses, differences
    g.add_argument("--layouts", nargs="+", default=["dp"], help="e.g. dp2-tp2 fsdp4 pp2:ZBVZeroBubble; schedules: "
                   "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV")
    g.add_argument("--cp-layout", choices=["zigzag", "contiguous"], default="zigzag",
                   help="a cp rank's tokens: two chunks, load-balanced under the causal mask, or one slice")
    g.add_argument("--micro-batches", type=int, default=4, help="pipeline micro-batches per replica per step")
    g.add_argument("--bug", choices=["none", "norm-grad", "pp-unscaled", "cp-positions"], default="none", help="plant a bug")
    g = p.add_argument_group("model (TinyLlama: width 64, 4 query heads) and training")
    g.add_argument("--layers", type=int, default=4, help="decoder blocks (divisible by the pipeline stages)")
    g.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA; divisible by tp)")
    g.add_argument("--experts", type=int, default=0, help="> 0: a mixture of experts in every block")
    g.add_argument("--ep-experts", type=int, default=4, help="the experts of a layout with ep when --experts is 0 "
                   "(its own reference, one process with them): ep layouts join a dense launch")
    g.add_argument("--seq", type=int, default=32, help="bytes per sequence (divisible by cp x tp)")
    g.add_argument("--global-batch", type=int, default=16, help="sequences per step, all replicas together")
    g.add_argument("--steps", type=int, default=10, help="SGD steps")
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():
        train_bytes, _ = split(byte_corpus())
        batches = [get_batch(train_bytes, s, a.global_batch, a.seq, SEED).to(ctx.device) for s in range(a.steps)]
        layouts, refs = [(text, parse_layout(text, ctx.world_size)) for text in a.layouts], {}
        experts_of = {text: a.experts or (a.ep_experts if L["ep"] > 1 else 0) for text, L in layouts}
        for experts in dict.fromkeys([a.experts, *experts_of.values()]):      # one reference per model
            cfg = LlamaConfig(layers=a.layers, kv_heads=a.kv_heads, experts=experts)
            refs[experts] = (cfg, *reference(cfg, ctx, batches))
        out = {"world_size": ctx.world_size, "steps": a.steps, "ref_losses": refs[a.experts][2], "bug": a.bug,
               "layouts": {}, "params": refs[a.experts][3]}
        for text, L in layouts:
            cfg, ref_params, ref_losses, _ = refs[experts_of[text]]
            losses, mine = train_layout(L, a, cfg, ctx, batches)
            worst, where = max(((q.detach() - ref_params[n].detach()).abs().max().item(), n) for n, q in mine)
            worst_all = torch.tensor([worst], dtype=torch.float64)
            if ctx.world_size > 1:
                dist.all_reduce(worst_all, op=dist.ReduceOp.MAX)
            loss_diff = max(abs(u - v) for u, v in zip(losses, ref_losses))
            ctx.log(f"{text}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; after {a.steps} steps largest difference from "
                    f"one process: loss {loss_diff:.2g}, parameters {worst_all.item():.2g} (allowed {TOL:g}; "
                    f"the loss: {TOL:g} x its first value)")
            if worst_all.item() > TOL or loss_diff > TOL * max(1.0, abs(ref_losses[0])):
                where = where if worst > TOL else "another rank's parameter"
                raise AssertionError(f"layout {text}: {where} differs from one process by {worst_all.item():.3g} and "
                                     f"the loss by {loss_diff:.3g} after {a.steps} steps (allowed {TOL:g}; the loss: "
                                     f"{TOL:g} x its first value)")
            out["layouts"][text] = {**L, "experts": cfg.experts, "losses": losses, "max_loss_diff": loss_diff,
                                    "max_param_diff": worst_all.item()}
        emit_result(out)


if __name__ == "__main__":
    main()
