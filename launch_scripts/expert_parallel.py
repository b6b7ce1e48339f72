"""Expert parallelism: a mixture-of-experts layer with its experts split over the ranks, proven equal to
the layer on one process, then trained (notebooks/08_context_and_experts.ipynb).

1. Check: every rank builds the same MoE layer (mgpu_utils.parallel.experts, no capacity limit) and the same
   tokens; the one-process layer runs on all of them as the reference. ExpertParallelMoE runs on this rank's
   tokens: dispatch and combine with all_to_all_single (uneven splits). Outputs, input gradients, each
   expert's gradients and the router's (summed over ranks) are compared with assert_close. Run on a 1-D
   group (--ep-size = world size) and, where the world splits into dp x ep with both > 1, on a 2-D mesh:
   experts split inside each ep group and replicated across dp groups (their gradients summed over dp).
2. Training: an MoE classifier of the digits (embed, MoE with a residual, head), data parallel over all
   ranks and expert parallel over all ranks, for --steps steps with and without the load-balancing loss;
   tokens per expert are counted every step (summed over ranks). Then the capacity factor: dropped
   assignments and all-to-all bytes for each of --capacity-factors on one batch (the balanced model).
Rank 0 prints one JSON line. World size: any that divides --experts.
    torchrun --standalone --nproc-per-node 4 launch_scripts/expert_parallel.py
"""
import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.measure.memory import tensor_bytes
from mgpu_utils.parallel.experts import MoE, ExpertParallelMoE


def check(args, rank, world, ep, device):
    """EP (groups of ep ranks, dp = world / ep replicas) against one process; returns a row."""
    dp = world // ep
    mesh = device_mesh(device.type, (dp, ep), mesh_dim_names=("dp", "ep"))
    torch.manual_seed(args.seed)
    full = MoE(args.width, args.ffn, args.experts, args.top_k).to(device)
    x = torch.randn(world * args.tokens, args.width, device=device, requires_grad=True)
    w = torch.randn(world * args.tokens, args.width, device=device)
    y_ref, r_ref = full(x)
    (y_ref * w).sum().backward()
    layer = ExpertParallelMoE(copy.deepcopy(full), mesh.get_group("ep"))
    mine = slice(rank * args.tokens, (rank + 1) * args.tokens)
    xs = x.detach()[mine].clone().requires_grad_()
    log = {"bytes_sent": 0}
    y, r = layer(xs, log)
    fwd_bytes = log["bytes_sent"]
    (y * w[mine]).sum().backward()
    assert_close(y, y_ref[mine].detach(), rtol=1e-5, atol=1e-5)
    assert_close(xs.grad, x.grad[mine], rtol=1e-5, atol=1e-5)
    for p in layer.experts.parameters():                       # replicas across dp hold the same experts
        dist.all_reduce(p.grad, group=mesh.get_group("dp"))
    first = mesh.get_local_rank("ep") * layer.local
    for j, expert in enumerate(layer.experts):
        for (name, p), q in zip(expert.named_parameters(), full.experts[first + j].parameters()):
            assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, j=j, name=name:
                         f"expert {first + j} {name}: {m}")
    dist.all_reduce(layer.gate.weight.grad)                    # every rank's tokens went through the router
    assert_close(layer.gate.weight.grad, full.gate.weight.grad, rtol=1e-4, atol=1e-6)
    load, probs = r["load"].clone(), r["aux"].new_zeros(args.experts)
    dist.all_reduce(load)                                     # the balancing loss of all tokens at once
    probs += torch.softmax(layer.gate(xs), -1).sum(0).detach()
    dist.all_reduce(probs)
    aux = args.experts * (load / load.sum() * probs / (world * args.tokens)).sum()
    assert_close(aux, r_ref["aux"].detach())
    return {"dp": dp, "ep": ep, "fwd_bytes": fwd_bytes, "bwd_bytes": log["bytes_sent"] - fwd_bytes,
            "rows_out": log["rows_out"], "rows_in": log["rows_in"],
            "assignments": int(r["keep"].sum()),
            "param_bytes_full": tensor_bytes(full.parameters()),
            "param_bytes_rank": tensor_bytes(list(layer.parameters()))}


class Classifier(nn.Module):
    def __init__(self, full_moe, width):
        super().__init__()
        self.embed, self.head = nn.Linear(64, width), nn.Linear(width, 10)
        self.moe = ExpertParallelMoE(full_moe)

    def forward(self, x, log=None):
        h = torch.relu(self.embed(x.flatten(1)))
        y, r = self.moe(h, log)
        return self.head(h + y), r


def train(args, aux_coef, rank, world, device, train_set):
    """DP x EP training for --steps; returns (the model, imbalance per step, final loss)."""
    torch.manual_seed(args.seed)
    model = Classifier(MoE(args.width, args.ffn, args.experts, args.top_k), args.width).to(device)
    replicated = [p for n, p in model.named_parameters() if ".experts." not in n]
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    stream = batch_stream(train_set, world, rank, args.per_rank_batch, args.seed)
    imbalance = []
    for _ in range(args.steps):
        idx = next(stream)
        xb, yb = train_set.tensors[0][idx].to(device), train_set.tensors[1][idx].to(device)
        logits, r = model(xb)
        ce = F.cross_entropy(logits, yb, reduction="sum") / (len(idx) * world)
        opt.zero_grad()
        (ce + aux_coef * r["aux"] / world).backward()
        for p in replicated:                                   # experts: already the sum over all tokens
            dist.all_reduce(p.grad)
        opt.step()
        load = r["load"].clone()
        dist.all_reduce(load)
        imbalance.append((load.max() / load.float().mean()).item())
    return model, imbalance


def main():
    p = argparse.ArgumentParser(description="expert parallelism against one process, then trained")
    g = p.add_argument_group("layer")
    g.add_argument("--width", type=int, default=16, help="token width h")
    g.add_argument("--ffn", type=int, default=32, help="hidden size of each expert")
    g.add_argument("--experts", type=int, default=8, help="number of experts E (split over the ranks)")
    g.add_argument("--top-k", type=int, default=2, help="experts per token")
    g.add_argument("--tokens", type=int, default=24, help="tokens per rank in the check")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=80)
    g.add_argument("--per-rank-batch", type=int, default=32)
    g.add_argument("--lr", type=float, default=0.01)
    g.add_argument("--aux-coef", type=float, default=0.05, help="weight of the load-balancing loss")
    g.add_argument("--capacity-factors", default="0.5,1,1.25,2", help="capacity factors to compare")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized():
            raise SystemExit("expert parallelism needs a process group: run under torchrun "
                             "(--nproc-per-node 1 works)")
        rank, world = ctx.rank, ctx.world_size
        if args.experts % world:
            raise SystemExit(f"--experts {args.experts} cannot be split over {world} ranks: "
                             "choose a world size that divides it")
        checks = []
        for ep in sorted({world} | ({world // 2} if world % 2 == 0 and world >= 4 else set())):
            checks.append(check(args, rank, world, ep, ctx.device))
            ctx.log(f"dp={checks[-1]['dp']} x ep={ep}: outputs, input, expert and router gradients equal to "
                    f"one process; rank 0 sent {checks[-1]['fwd_bytes']} + {checks[-1]['bwd_bytes']} bytes "
                    f"(forward + backward) in the all-to-alls")
        train_set, _ = load_data()
        runs = {}
        for coef in (0.0, args.aux_coef):
            model, imbalance = train(args, coef, rank, world, ctx.device, train_set)
            runs[coef] = {"imbalance": imbalance, "model": model}
            tail = imbalance[-10:]
            ctx.log(f"aux coef {coef}: busiest expert / mean load, last 10 steps: {sum(tail) / len(tail):.2f}")
        idx = list(range(rank * args.per_rank_batch, (rank + 1) * args.per_rank_batch))
        trained = runs[args.aux_coef]["model"]                  # the balanced router
        h = torch.relu(trained.embed(train_set.tensors[0][idx].to(ctx.device).flatten(1)))
        capacity = []
        for cf in (float(c) for c in args.capacity_factors.split(",") if c):
            moe = trained.moe
            moe.capacity_factor, log = cf, {"bytes_sent": 0}
            with torch.no_grad():
                _, r = moe(h, log)
            stats = torch.tensor([int((~r["keep"]).sum()), r["keep"].numel(), log["bytes_sent"]])
            dist.all_reduce(stats)
            capacity.append({"capacity_factor": cf, "capacity": r["capacity"], "dropped": int(stats[0]),
                             "assignments": int(stats[1]), "bytes_sent": int(stats[2])})
            ctx.log(f"capacity factor {cf}: capacity {r['capacity']} per expert per rank, "
                    f"{int(stats[0])} of {int(stats[1])} assignments dropped, {int(stats[2])} bytes sent")
        emit_result({"world_size": world, "backend": ctx.backend, "experts": args.experts, "top_k": args.top_k,
                     "width": args.width, "checks": checks, "capacity": capacity,
                     "imbalance": {str(c): v["imbalance"] for c, v in runs.items()}})


if __name__ == "__main__":
    main()
