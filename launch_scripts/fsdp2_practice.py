"""FSDP2 as practitioners use it, on a byte-level GPT-2: per-block sharding, mixed precision, clipping and HSDP,
each checked against one process (notebooks/07_memory.ipynb).

  blocks  fully_shard on every transformer block, then on the root, against one fully_shard of the whole
          model: the all-gathers and reduce-scatters of one step counted, and the most parameter bytes held
          gathered at once during forward (hooks), against the formula: whole model = every parameter; per
          block = the root's own parameters + the largest block. (reshard_after_forward: zero_fsdp.py.)
  mixed   MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the stored shards stay fp32,
          the all-gathers carry bf16 and the reduce-scatters fp32 (bytes counted); the losses and the
          parameters after --steps AdamW steps against the fp32 run (distance measured).
  clip    clip_grad_norm_ on the sharded (DTensor) gradients: the total norm and the step equal one
          process's.
  hsdp    a 2-D mesh (replicate x shard): shards within groups of --shard-size ranks, replicas across the
          groups (an all-reduce joins each reduce-scatter); parameters after --steps steps equal one
          process's.
Collectives are counted by a small dispatch mode that also sums their bytes (all-gather: the gathered
tensor; reduce-scatter: the tensor reduced); CommDebugMode counts the same calls. Every rank computes the
one-process reference on the whole global batch (AdamW, fp32). Without torchrun the script makes a
one-process gloo group (world size 1: FSDP2 then sends nothing).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/fsdp2_practice.py
"""
import argparse
import collections
import contextlib
import copy
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.nn.utils import clip_grad_norm_
from torch.utils._python_dispatch import TorchDispatchMode

from mgpu_utils.checks import check_optimizer_matches, exact_fp32, max_abs_diff
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.models import byte_gpt2
from mgpu_utils.text_data import byte_corpus, get_batch, split


class CollectiveBytes(TorchDispatchMode):
    """While active: calls and bytes of each c10d collective (all-gather: output; others: input)."""

    def __init__(self):
        super().__init__()
        self.calls, self.bytes = collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("c10d::") and name != "c10d::barrier":
            op = name[6:].strip("_")
            t = args[1] if op == "reduce_scatter_base" else args[0]
            self.calls[op] += 1
            self.bytes[op] += sum(x.numel() * x.element_size() for x in (t if isinstance(t, list) else [t]))
        return func(*args, **(kwargs or {}))


def nbytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def full(model):
    """Every parameter as one flat fp32 vector (DTensors gathered)."""
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().reshape(-1)
                      for p in model.parameters()])


def train(model, batches, steps, clip=None, first=None):
    """AdamW on batches[:steps] (int64 (b, seq+1) byte windows), step 0 inside the context manager `first`
    (a counter). Returns the losses and the first step's gradient norm (with clip)."""
    opt, losses, norm = torch.optim.AdamW(model.parameters(), lr=1e-3), [], None
    check_optimizer_matches(model, opt)              # built after fully_shard, over the model's parameters
    for step, xb in enumerate(batches[:steps]):
        with first if first is not None and step == 0 else contextlib.nullcontext():
            loss = model(xb, labels=xb).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
        if clip is not None:
            n = clip_grad_norm_(model.parameters(), clip)
            norm = norm if norm is not None else (n.full_tensor() if isinstance(n, DTensor) else n).item()
        opt.step()
        losses.append(loss.item())
    return losses, norm


# region fsdp2
def shard(model, mesh, per_block=True, **policy):
    """FSDP2: each transformer block its own unit (one all-gather), then the root (the rest)."""
    for block in model.transformer.h if per_block else []:
        fully_shard(block, mesh=mesh, **policy)
    return fully_shard(model, mesh=mesh, **policy)


def gathered_peak(model, x):
    """One forward: the most parameter bytes held gathered (not as DTensor shards) at a leaf."""
    peak, hooks = [0], []
    for m in model.modules():
        if not list(m.children()):
            hooks.append(m.register_forward_pre_hook(lambda *_: peak.append(
                nbytes(p for p in model.parameters() if not isinstance(p, DTensor)))))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return max(peak)
# endregion


def main():
    p = argparse.ArgumentParser(description="FSDP2 per block, mixed precision, clipping, HSDP")
    g = p.add_argument_group("model, data and cases")
    g.add_argument("--case", nargs="+", choices=["blocks", "mixed", "clip", "hsdp"],
                   default=["blocks", "mixed", "clip", "hsdp"])
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--width", type=int, default=64)
    g.add_argument("--seq", type=int, default=32, help="bytes per sequence")
    g.add_argument("--per-rank-batch", type=int, default=4, help="sequences per rank and step")
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--max-norm", type=float, default=0.5, help="clip_grad_norm_'s bound (must clip)")
    g.add_argument("--shard-size", type=int, default=2, help="hsdp: ranks per shard group (divides the world; at most the world)")
    g.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        # harmless here: hooks cannot see HF's output objects; nothing edits FSDP's outputs in place
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        warnings.filterwarnings("ignore", message=".*returned a view tensor")
        if not dist.is_initialized():                   # plain python: a one-process group for the mesh
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        shard_size = min(a.shard_size, world)
        if world % shard_size and "hsdp" in a.case:
            raise ValueError(f"--shard-size {a.shard_size} must divide the world size {world}")
        mesh = device_mesh(device.type, (world,))
        base = byte_gpt2(layers=a.layers, embd=a.width, heads=4, seq=a.seq, seed=a.seed).to(device)
        train_bytes, _ = split(byte_corpus())
        n = a.per_rank_batch * world
        glob = [get_batch(train_bytes, s, n, a.seq - 1, a.seed).to(device) for s in range(a.steps)]
        mine = [b[rank * a.per_rank_batch:(rank + 1) * a.per_rank_batch] for b in glob]
        ref = copy.deepcopy(base)                       # one process, the whole global batch
        ref_losses, _ = train(ref, glob, a.steps)
        out = {"world_size": world, "params": sum(q.numel() for q in base.parameters())}
        if "blocks" in a.case:
            blocks = max(nbytes(b.parameters()) for b in base.transformer.h)
            root = nbytes(base.parameters()) - sum(nbytes(b.parameters()) for b in base.transformer.h)
            for name, per_block in (("whole", False), ("per_block", True)):
                m = shard(copy.deepcopy(base), mesh, per_block)
                with CommDebugMode() as cdm, CollectiveBytes() as cb:
                    train(m, mine, 1)
                peak = gathered_peak(m, mine[0])
                out[name] = {"gathered_peak_bytes": peak, "calls": dict(cb.calls), "bytes": dict(cb.bytes),
                             "commdebugmode_total": cdm.get_total_counts()}
            out["formula"] = {"whole": nbytes(base.parameters()), "per_block": root + blocks,
                              "layers": a.layers}
        if "mixed" in a.case:
            for name, policy in (("fp32", {}), ("bf16", {"mp_policy": MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32)})):
                m = shard(copy.deepcopy(base), mesh, **policy)
                losses, _ = train(m, mine, a.steps, first=(cb := CollectiveBytes()))
                local = [q.to_local() for q in m.parameters()]
                out[name] = {"stored_dtype": str(local[0].dtype), "bytes": dict(cb.bytes), "losses": losses,
                             "max_diff_vs_one_process": max_abs_diff(full(m), full(ref))}
            out["ref_losses"] = ref_losses
        if "clip" in a.case:
            one = copy.deepcopy(base)
            norm_one = train(one, glob, 1, clip=a.max_norm)[1]
            m = shard(copy.deepcopy(base), mesh)
            norm = train(m, mine, 1, clip=a.max_norm)[1]
            if norm_one <= a.max_norm:
                raise ValueError(f"--max-norm {a.max_norm} does not clip (the norm: {norm_one:.3f})")
            out["clip"] = {"norm_one_process": norm_one, "norm_sharded": norm, "max_norm": a.max_norm,
                           "max_diff_vs_one_process": max_abs_diff(full(m), full(one))}
        if "hsdp" in a.case:
            mesh2 = device_mesh(device.type, (world // shard_size, shard_size),
                                     mesh_dim_names=("replicate", "shard"))
            m = shard(copy.deepcopy(base), mesh2)
            train(m, mine, a.steps, first=(cb := CollectiveBytes()))
            out["hsdp"] = {"mesh": list(mesh2.shape), "calls": dict(cb.calls),
                           "max_diff_vs_one_process": max_abs_diff(full(m), full(ref))}
        emit_result(out)


if __name__ == "__main__":
    main()
