"""The graded coding exercises of lesson 07, memory (notebooks/07_memory.ipynb): 07.4 ZeRO-1 from scratch
(Adam's moments sharded), 07.5 ZeRO-1 for any element-wise optimizer, 07.6 ZeRO-3 (FSDP) from scratch.

Each check trains on this rank's rows against the optimizer in one process on the whole batch, and measures
what the student's optimizer or wrapper holds (:func:`~mgpu_utils.grading.common.held_bytes`); 07.6 also
counts the collectives of each step and reads the dtype the Linear layers compute in (:class:`LinearDtypes`).
The hints of the problems they report, the exercises' records and the bytes said on success are here too.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import CodingExercise, always, diff, held_bytes, inner_parameters, note
from mgpu_utils.measure.comm_calls import counted_collectives
from mgpu_utils.models import TiedMLP, make_mlp


def check_sharded_adam(cls, ctx, problems, steps=3):
    """07.4: ``cls(params, lr)`` on this rank's share of the batch against Adam in one process; its tensor bytes."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    mine = make_mlp(24, 1)
    ref = copy.deepcopy(mine)
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    opt, ref_opt = cls(mine.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    start = [p.detach().clone() for p in mine.parameters()]
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(mine(x[rank::world]), y[rank::world]).backward()    # this rank's share of the batch
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()                              # one process, the whole batch
        ref_opt.step()
    got = torch.cat([p.detach().reshape(-1) for p in mine.parameters()])
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    held = held_bytes(opt, exclude=list(mine.parameters()))
    n = want.numel()
    if diff(got, want) > 1e-5:
        first = torch.cat([p.reshape(-1) for p in start])
        should = want != first                             # what Adam in one process moved (not the pixels always 0)
        note(problems, {"rank": rank, "kind": "adam", "max_diff": diff(got, want),
                        "moved_share": ((got != first) & should).sum().item() / max(1, should.sum().item())})
    elif held > 8 * (-(-n // world)) * 1.05 + 256:
        note(problems, {"rank": rank, "kind": "adam_memory", "bytes": held, "full": 8 * n})
    return {"optimizer_bytes": held, "full_adam_bytes": 8 * n}


#: Exercise 07.5's optimizers: (name, class, keyword arguments), each element-wise.
ANY_OPTIMIZERS = (("SGD with momentum", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                  ("Adam", torch.optim.Adam, {"lr": 1e-2}),
                  ("AdamW", torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}))


def check_sharded_any(cls, ctx, problems, steps=3):
    """07.5: ``cls(params, optimizer_class, **defaults)`` for each of :data:`ANY_OPTIMIZERS`, on this rank's share
    of the batch, against the optimizer in one process; the state it holds (:func:`held_bytes` without the
    model's parameters and its inner optimizers' parameters) against the reference's state over the world."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    for name, opt_class, kwargs in ANY_OPTIMIZERS:
        torch.manual_seed(0)
        mine = make_mlp(24, 1)
        ref = copy.deepcopy(mine)
        opt, ref_opt = cls(mine.parameters(), opt_class, **kwargs), opt_class(ref.parameters(), foreach=False,
                                                                              **kwargs)
        start = torch.cat([p.detach().reshape(-1) for p in mine.parameters()])
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(mine(x[rank::world]), y[rank::world]).backward()
            opt.step()
            ref_opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()
        got = torch.cat([p.detach().reshape(-1) for p in mine.parameters()])
        want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        held = held_bytes(opt, exclude=list(mine.parameters()) + inner_parameters(opt))
        full = held_bytes(ref_opt, exclude=list(ref.parameters()))
        if diff(got, want) > 1e-5:
            should = want != start
            note(problems, {"rank": rank, "kind": "any_opt", "optimizer": name, "max_diff": diff(got, want),
                            "moved_share": ((got != start) & should).sum().item() / max(1, should.sum().item())})
        elif held > full / world * 1.05 + 512:
            note(problems, {"rank": rank, "kind": "any_memory", "optimizer": name, "bytes": held, "full": full})
        found = torch.tensor([float(bool(problems))])
        dist.all_reduce(found)                             # every rank stops together: an uneven shard may flag
        if found.item():                                   # one rank only, and the next round has collectives
            return


GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
#: What brings each rank its shard's gradient summed over the ranks: a reduce-scatter, or an all-to-all and a
#: local sum (torch.distributed.nn.functional.all_gather's backward on gloo).
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single")


class LinearDtypes(torch.overrides.TorchFunctionMode):
    """Within the block, the dtype of every weight that ``F.linear`` computes with goes to ``seen`` (07.6: the
    compute dtype, however the wrapper puts its gathered parameters in place: functional_call, hooks, setattr)."""

    def __init__(self, seen: set):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            self.seen.add((args[1] if len(args) > 1 else kwargs["weight"]).dtype)
        return func(*args, **kwargs)


def _fsdp_reference(model, x, dtype):
    """One process's forward of ``model`` computing in ``dtype`` (None: float32): its parameters cast, as
    gathered, and a floating-point input cast; float32 master weights receive the gradients."""
    if dtype is None:
        return model(x)
    cast = {n: p.to(dtype) for n, p in model.named_parameters()}
    return torch.func.functional_call(model, cast, (x.to(dtype),))


def check_my_fsdp(cls, ctx, problems, steps=3, lr=0.05):
    """07.6: ``cls(model, compute_dtype)`` for three SGD steps (momentum 0.9) on this rank's rows, on an MLP and
    on :class:`TiedMLP`, in float32 and bfloat16, against one process on the whole batch (and, to name a wrong
    result, one process with the gradients summed, and this rank's rows alone); the elements in parameters(),
    the collectives of each step, the dtype the Linear layers saw, and :func:`held_bytes` between steps."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    for model_name, model_fn in (("MLP", lambda: make_mlp(24, 1)), ("TiedMLP", TiedMLP)):
        for dtype in (None, torch.bfloat16):
            found = torch.tensor([float(bool(problems))])
            dist.all_reduce(found)                           # every rank stops together once any rank found one
            if found.item():
                return
            base = {"rank": rank, "kind": "fsdp", "model": model_name,
                    "dtype": "float32" if dtype is None else str(dtype).replace("torch.", "")}
            torch.manual_seed(0)
            model = model_fn()
            refs = {v: copy.deepcopy(model) for v in ("right", "sum", "own")}
            full = sum(p.numel() for p in model.parameters())
            # the most a rank may hold: each parameter padded to a multiple of the world, or cut in whole rows
            bound = sum(max(-(-p.numel() // world), -(-p.shape[0] // world) * (p.numel() // p.shape[0]))
                        for p in model.parameters()) + world
            seen = set()
            wrapper = cls(model) if dtype is None else cls(model, dtype)
            shards = list(wrapper.parameters())
            mine = sum(p.numel() for p in shards)
            if mine > bound:
                note(problems, {**base, "what": "params", "got": mine, "full": full, "bound": bound})
            elif any(p.dtype != torch.float32 for p in shards):
                note(problems, {**base, "what": "master_dtype", "got": str(shards[0].dtype)})
            found = torch.tensor([float(bool(problems))])
            dist.all_reduce(found)                           # agree before the steps: their collectives are shared
            if found.item():
                return
            opt = torch.optim.SGD(shards, lr=lr, momentum=0.9)
            ref_opts = {v: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for v, m in refs.items()}
            for s in range(steps):
                calls = []
                with counted_collectives(calls, cls):
                    with LinearDtypes(seen):
                        out = wrapper(x[rank::world])
                    F.cross_entropy(out.float(), y[rank::world]).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                for v, m in refs.items():
                    rows = slice(rank, None, world) if v == "own" else slice(None)
                    loss = F.cross_entropy(_fsdp_reference(m, x[rows], dtype).float(), y[rows])
                    (loss * world if v == "sum" else loss).backward()
                    ref_opts[v].step()
                    ref_opts[v].zero_grad(set_to_none=True)
                held = held_bytes(wrapper, grads=True) - sum(p.numel() * p.element_size() for p in shards)
                if "all_reduce" in calls:
                    note(problems, {**base, "what": "all_reduce", "step": s + 1, "calls": calls.count("all_reduce")})
                elif not set(calls) & set(GATHERS) or not set(calls) & set(SCATTERS):
                    note(problems, {**base, "what": "collectives", "step": s + 1, "calls": sorted(set(calls))})
                elif dtype is not None and seen != {dtype}:
                    note(problems, {**base, "what": "compute_dtype", "seen": sorted(str(d) for d in seen)})
                elif held > 4 * full / world + 1024:             # a shard's worth more at most: a buffer
                    note(problems, {**base, "what": "held", "step": s + 1, "bytes": held, "full_bytes": full * 4})
                seen.clear()
            with torch.no_grad():
                got = wrapper(x[:16]).float()
                outs = {v: _fsdp_reference(m, x[:16], dtype).float() for v, m in refs.items()}
            atol, rtol = (1e-4, 0.0) if dtype is None else (4e-3, 2e-2)   # bfloat16: 2^-8 relative rounding
            close = lambda a, b: bool(((a - b).abs() <= atol + rtol * b.abs()).all())
            if not close(got, outs["right"]):
                named = next((v for v in ("sum", "own") if close(got, outs[v])), None)
                note(problems, {**base, "what": "output", "steps": steps, "max_diff": diff(got, outs["right"]),
                                "variant": named})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "adam": [
        (lambda p, W: p["moved_share"] < 1 - 1 / (2 * W),           # about 1/W moved: only this rank's own slice
         "rank {rank}: only {moved_share:.0%} of the parameters that Adam updates moved (world size {W}): the "
         "other ranks' updated slices never arrived; gather every slice on every rank (step 3)"),
        (always, "rank {rank}: after three steps the parameters differ from Adam in one process by {max_diff:.3g} "
                 "(world size {W}): is g the mean over the ranks of this rank's slice (step 1)?")],
    "adam_memory": [(always, "rank {rank}: your optimizer holds {bytes:,} bytes of tensors (counting every tensor it "
                             "can reach: attributes, lists, dicts, a wrapped optimizer's state); full Adam's moments "
                             "are {full:,}: keep only this rank's slice of m and v")],
    "any_opt": [
        (lambda p, W: p["moved_share"] == 0,
         "rank {rank}: with {optimizer}, no parameter moved in three steps (world size {W}): step() must update "
         "the parameters"),
        (lambda p, W: p["moved_share"] < 1 - 1 / (2 * W),
         "rank {rank}: with {optimizer}, only {moved_share:.0%} of the parameters that one process updates moved "
         "(world size {W}): the other ranks' updated slices never arrived; gather every slice on every rank"),
        (always, "rank {rank}: with {optimizer}, after three steps the parameters differ from one process's by "
                 "{max_diff:.3g} (world size {W}): is each slice's gradient the mean over the ranks, and does the "
                 "inner optimizer get every keyword argument (lr, momentum, weight_decay)?")],
    "any_memory": [(always, "rank {rank}: with {optimizer}, your optimizer holds {bytes:,} bytes of state (every "
                            "tensor it can reach but the parameters an optimizer inside it updates); the optimizer "
                            "in one process holds {full:,}: keep the state of this rank's slice only, about 1/{W}")],
    "fsdp": [
        (lambda p, W: p["what"] == "params",
         "rank {rank} ({model}): your wrapper's parameters() hold {got:,} elements, the whole model {full:,}: keep "
         "only this rank's shard of each parameter, at most {bound:,} elements at world size {W} (a tied weight "
         "once), "
         "and do not register the wrapped module as a submodule (its parameters would be listed too)"),
        (lambda p, W: p["what"] == "master_dtype",
         "rank {rank} ({model}, compute dtype {dtype}): the shards are {got}; keep the shards, their gradients and "
         "the optimizer in float32 and cast to compute_dtype only what is gathered for the forward"),
        (lambda p, W: p["what"] == "all_reduce",
         "rank {rank} ({model}, {dtype}): step {step} all-reduced ({calls} call(s)); ZeRO-3 reduce-scatters the "
         "gradients, so that each rank receives the sum of its own shard only, and all-gathers the parameters"),
        (lambda p, W: p["what"] == "collectives",
         "rank {rank} ({model}, {dtype}): step {step} called {calls}; a ZeRO-3 step all-gathers the parameters "
         "before they are used and reduce-scatters their gradients (all_gather_single, reduce_scatter_single)"),
        (lambda p, W: p["what"] == "compute_dtype",
         "rank {rank} ({model}): with compute_dtype={dtype} the Linear layers saw weights of {seen}: cast the "
         "gathered parameters (and a floating-point input) to compute_dtype"),
        (lambda p, W: p["what"] == "held",
         "rank {rank} ({model}, {dtype}): after step {step} your wrapper holds {bytes:,} bytes besides its shards, "
         "and the whole model is {full_bytes:,}: free the module's own parameters once sharded, keep the "
         "gathered ones only while autograd needs them (not in an attribute), leave no whole gradient behind "
         "(p.grad = None, not zero_()), and make each shard a tensor of its own (a slice of a whole one keeps "
         "the whole storage)"),
        (lambda p, W: p["what"] == "output" and p["variant"] == "sum",
         "rank {rank} ({model}, {dtype}): after {steps} steps the model is one process's trained on the sum of "
         "the ranks' gradients: divide the reduce-scattered gradient by the world size, {W}"),
        (lambda p, W: p["what"] == "output" and p["variant"] == "own",
         "rank {rank} ({model}, {dtype}): after {steps} steps the model is one trained on this rank's rows alone: "
         "the shard's gradient must be reduce-scattered from every rank's whole gradient"),
        (always, "rank {rank} ({model}, {dtype}): after {steps} SGD steps the output differs from one process's by "
                 "{max_diff:.3g}: gather every parameter (a tied one once, used twice), reduce-scatter its gradient "
                 "and divide by the world size"),
    ],
}


def _bytes_held(info: dict, world: int) -> list[str]:
    """07.4, on success: the optimizer's bytes on rank 0 against Adam's moments."""
    if "optimizer_bytes" not in info:
        return []
    return [f"world size {world}: your optimizer holds {info['optimizer_bytes']:,} bytes on rank 0; "
            f"Adam's moments for the whole model are {info['full_adam_bytes']:,}"]


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="07.4", template="07_zero1.py", entry="ShardedAdam", world_sizes=(2, 3),
        check=check_sharded_adam, hints=HINTS, on_success=_bytes_held,
        what="three steps equal torch.optim.Adam in one process, with the moments sharded over the ranks"),
    CodingExercise(
        id="07.5", template="07_zero1_any.py", entry="ShardedOptimizer", world_sizes=(2, 3),
        check=check_sharded_any, hints=HINTS,
        what="three steps of SGD with momentum, Adam and AdamW equal one process's, with each rank holding "
             "about 1/world of the optimizer's state"),
    CodingExercise(
        id="07.6", template="07_my_fsdp.py", entry="MyFSDP", world_sizes=(2, 3),
        check=check_my_fsdp, hints=HINTS,
        what="three SGD steps equal one process's on an MLP and on a model with a tied weight, in float32 and "
             "computing in bfloat16, with each rank holding about 1/world of the parameters, all-gathered "
             "for the forward and their gradients reduce-scattered"),
]
