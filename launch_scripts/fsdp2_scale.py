"""FSDP2 for a model that outgrows one device, each case against one process (07_memory.ipynb 5c, 06_hybrid 3b).

ResidualMLP (mgpu_utils.models) on the digits, SGD (lr 0.1, momentum 0.9), --per-rank-batch images per rank;
every rank also trains the one-process reference on the whole global batch. Without torchrun: one process.
  meta      built on the meta device, sharded, to_empty, then initialised. reset_parameters() on the shards:
            on a CPU mesh (no DTensor random tracker) every rank draws the first rows; on CUDA the tracker
            draws distinct numbers, not one process's. The replay: one seed, then module by module in build
            order, its whole weights drawn on the CPU and this rank's rows copied: one process's numbers.
  prefetch  one step's per-rank order of all-gathers (AG), reduce-scatters (RS), block i's forward (F<i>) and
            backward (B<i>): default, then set_modules_to_forward_prefetch (block i gathers block i+1).
  tp        (dp, tp) mesh: up column- and down row-parallel over tp, then fully_shard over dp.
  offload   CPUOffloadPolicy: device bytes (end, peak), ms per step, with and without (CUDA; else says so).
  compile   each block compiled after fully_shard (--compile-backend): graphs, ms per step, vs eager.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/fsdp2_scale.py
"""
import argparse
import copy
import gc
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset as local_shape_and_offset
from torch.distributed.tensor import _random as dtensor_random
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from mgpu_utils.checks import check_optimizer_matches, exact_fp32, shard_max_diff
from mgpu_utils.data import load_data
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.measure.profiling import collective_order
from mgpu_utils.models import ResidualMLP


def train(model, batches, steps, ms=None):
    """SGD (momentum 0.9) on batches[:steps] ((images, labels) pairs); each step's ms appended to ms."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    check_optimizer_matches(model, opt)              # built after fully_shard, over the model's parameters
    for x, y in batches[:steps]:
        t0 = time.perf_counter()                       # (on CUDA, synchronised below)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize() if x.is_cuda else None
        (ms if ms is not None else []).append((time.perf_counter() - t0) * 1e3)
    return model


# region meta
def shard(model, mesh, **kw):
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kw)
    return fully_shard(model, mesh=mesh, **kw)


def init_like_one_process(model, template, seed):
    """model: sharded, after to_empty; template: the model on the meta device. Replays one
    process's manual_seed(seed); ResidualMLP(): module by module, weights whole on the CPU, our
    rows copied to the device. Returns the most bytes held whole at once (one module's)."""
    torch.manual_seed(seed)
    sharded, held = dict(model.named_modules()), 0
    for name, mod in template.named_modules():
        if hasattr(mod, "reset_parameters"):
            whole = copy.deepcopy(mod).to_empty(device="cpu")  # this module only, on the CPU
            whole.reset_parameters()                           # the draws of ResidualMLP(...)
            held = max(held, sum(q.numel() * q.element_size() for q in whole.parameters()))
            for pname, p in sharded[name].named_parameters(recurse=False):
                size, start = local_shape_and_offset(p.shape, p.device_mesh, p.placements)
                cut = tuple(slice(o, o + n) for o, n in zip(start, size))
                with torch.no_grad():                          # only our rows reach the device
                    p.to_local().copy_(getattr(whole, pname)[cut])
            del whole
    return held
# endregion


# region fsdp-tp
def fsdp_tp(model, mesh):
    """Megatron's MLP pair over mesh['tp'] (lesson 05), then FSDP splits each over mesh['dp']."""
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])
# endregion


CASES = ["meta", "prefetch", "tp", "offload", "compile"]


def main():
    p = argparse.ArgumentParser(description="FSDP2 at scale: meta init, prefetching, FSDP + TP, offload, compile")
    g = p.add_argument_group("model, data and cases")
    g.add_argument("--case", nargs="+", choices=CASES, default=CASES)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--width", type=int, default=64)
    g.add_argument("--per-rank-batch", type=int, default=16, help="images per rank and step")
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--tp", type=int, default=0, help="tp: tensor-parallel ranks (divides the world; 0: 2 if even)")
    g.add_argument("--compile-backend", default=None, help="compile: default inductor on CUDA, aot_eager on CPU")
    g.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    with distributed() as ctx, exact_fp32(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(backward hooks|view tensor|record_function|DTensor random)")
        if not dist.is_initialized():                   # plain python: a one-process group for the mesh
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        world, rank, dev = ctx.world_size, ctx.rank, ctx.device
        tp = a.tp or (2 if world % 2 == 0 else 1)
        if "tp" in a.case and (tp < 1 or world % tp or 4 * a.width % tp):
            raise ValueError(f"--tp {a.tp} must divide the world size {world} and 4 x --width")
        mesh = device_mesh(dev.type, (world,))
        data, _ = load_data()
        n, mk = a.per_rank_batch * world, lambda: ResidualMLP(a.width, a.layers)
        glob = [(data.tensors[0][s * n:(s + 1) * n].to(dev), data.tensors[1][s * n:(s + 1) * n].to(dev))
                for s in range(a.steps)]
        if a.steps * n > len(data):
            raise ValueError(f"--steps x --per-rank-batch x world > {len(data)} training images: use fewer")
        rows = slice(rank * a.per_rank_batch, (rank + 1) * a.per_rank_batch)
        mine = [(x[rows], y[rows]) for x, y in glob]
        torch.manual_seed(a.seed)
        base = mk().to(dev)
        ref = train(copy.deepcopy(base), glob, a.steps)     # one process, the whole global batch
        out = {"world_size": world, "device": dev.type, "steps": a.steps,   # device: cpu or cuda, the tier
               "params": sum(q.numel() for q in base.parameters())}
        if "meta" in a.case:
            with torch.device("meta"):
                template = mk()
            wrong = shard(copy.deepcopy(template), mesh).to_empty(device=dev)
            torch.manual_seed(a.seed)                       # reset_parameters() on the shards
            [mod.reset_parameters() for mod in wrong.modules() if hasattr(mod, "reset_parameters")]
            w, w0 = wrong.inp.weight.to_local(), base.inp.weight    # does every rank hold the first rows?
            first = torch.tensor((w - w0[:len(w)]).abs().max().item() if len(w) else 0.0, device=dev)
            dist.all_reduce(first, op=dist.ReduceOp.MAX)
            m = shard(copy.deepcopy(template), mesh).to_empty(device=dev)
            held = init_like_one_process(m, template, a.seed)
            biggest = max(sum(q.numel() * 4 for q in t.parameters(recurse=False)) for t in template.modules())
            out["meta"] = {"reset_per_shard": {"init_max_diff": shard_max_diff(wrong, base),
                                               "max_diff_from_first_rows": first.item(),
                                               "dtensor_rng": (r := dtensor_random._rng_tracker) and type(r).__name__},
                           "replayed": {"init_max_diff": shard_max_diff(m, base), "held_bytes": held,
                                        "trained_max_diff": shard_max_diff(train(m, mine, a.steps), ref)},
                           "model_bytes": out["params"] * 4, "largest_module_bytes": biggest}
        if "prefetch" in a.case:
            m = shard(copy.deepcopy(base), mesh)
            step = lambda: F.cross_entropy(m(mine[0][0]), mine[0][1]).backward()     # noqa: E731
            out["prefetch"] = {"default": collective_order(m.blocks, step)}
            for b, nxt in zip(m.blocks, list(m.blocks)[1:]):
                b.set_modules_to_forward_prefetch([nxt])        # block i's forward gathers block i+1
            out["prefetch"]["explicit"] = collective_order(m.blocks, step)
        if "tp" in a.case:
            mesh2 = device_mesh(dev.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
            per, d = n // (world // tp), mesh2.get_local_rank("dp")   # rows per dp rank; tp ranks share
            m = train(fsdp_tp(copy.deepcopy(base), mesh2), [(x[d * per:(d + 1) * per], y[d * per:(d + 1) * per])
                                                              for x, y in glob], a.steps)
            up = m.blocks[0].up.weight
            out["tp"] = {"mesh": [world // tp, tp], "up_placements": [str(q) for q in up.placements],
                         "up_local_shape": list(up.to_local().shape), "up_shape": list(up.shape),
                         "max_diff_vs_one_process": shard_max_diff(m, ref)}
        if "offload" in a.case and dev.type != "cuda":
            out["offload"] = {"ran": False, "why": f"the device is the {dev.type} already: nothing to "
                              "offload to (CPUOffloadPolicy frees an accelerator's memory)"}
        elif "offload" in a.case:
            out["offload"], m = {"ran": True}, None
            for how, kw in (("on_device", {}), ("offloaded", {"offload_policy": CPUOffloadPolicy()})):
                del m
                gc.collect()                                # FSDP2 modules sit in reference cycles
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                m = train(shard(copy.deepcopy(base), mesh, **kw), mine, a.steps, ms := [])
                out["offload"][how] = {"device_bytes": torch.cuda.memory_allocated() - before, "ms_per_step": ms,
                                       "device_peak_bytes": torch.cuda.max_memory_allocated() - before,
                                       "shard_device": str(next(m.parameters()).to_local().device),
                                       "max_diff_vs_one_process": shard_max_diff(m, ref)}
        if "compile" in a.case:
            backend = a.compile_backend or ("inductor" if dev.type == "cuda" else "aot_eager")
            graphs, lookup = [], torch._dynamo.lookup_backend(backend)
            counted = lambda gm, example: graphs.append(len(gm.graph.nodes)) or lookup(gm, example)  # noqa: E731
            eager, comp = shard(copy.deepcopy(base), mesh), shard(copy.deepcopy(base), mesh)
            [b.compile(backend=counted) for b in comp.blocks]
            train(eager, mine, a.steps, t_eager := [])
            train(comp, mine, a.steps, t_comp := [])     # step 0 includes compiling
            out["compile"] = {"backend": backend, "graphs": len(graphs), "graph_nodes": graphs,
                              "ms_per_step_eager": t_eager, "ms_per_step_compiled": t_comp,
                              "max_diff_vs_eager": shard_max_diff(comp, eager),
                              "max_diff_vs_one_process": shard_max_diff(comp, ref)}
        emit_result(out)


if __name__ == "__main__":
    main()
