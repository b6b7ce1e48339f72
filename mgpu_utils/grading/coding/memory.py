"""The graded coding exercises of lesson 07, memory (notebooks/07_memory.ipynb): 07.4 ZeRO-1 from scratch
(Adam's moments sharded), 07.5 ZeRO-1 for any element-wise optimizer, 07.6 ZeRO-3 (FSDP) from scratch.

Each check trains on this rank's rows against the optimizer in one process on the whole batch, and measures
what the student's optimizer or wrapper holds (:func:`~mgpu_utils.grading.common.held_bytes`) and counts what
the collectives of each step carry (however they are reached: a process group's own methods and torch's
functional collectives too), and checks what they carry: the reducing ones this rank's own gradients
(:func:`_reduced_right`; 07.6: :func:`_fsdp_carried`, its all-gathers this rank's shards too), not zeros sent
for show while the work happens elsewhere; torch's own ZeroRedundancyOptimizer or FSDP built by the student's
code is refused. 07.6 also reads the dtype the Linear layers compute in (:class:`LinearDtypes`).
07.5 and 07.6 end with a round on an MLP of :data:`WIDE` hidden units that also counts what the process keeps
outside the graded object (:class:`~mgpu_utils.grading.common.OutsideState`: tensors and storages elsewhere,
Python objects such as bytes, BytesIO, numpy arrays, lists or tuples of floats and strings, values written to
the c10d store, files written);
07.4 counts the tensors outside it.
The hints of the problems they report, the exercises' records and the bytes said on success are here too.

Routes around torch.distributed and the memory counted (an mmap, anonymous or of POSIX shared memory, a file in
/dev/shm, a socket of the student's) are refused for the three exercises (and 03.7) by
:func:`~mgpu_utils.grading.common.refusing_routes` (a sixth red team's, 2026-12-05: whole optimizers or parameters
kept in an anonymous mmap, the data really moved through POSIX shared memory while the collectives graded were
decoys whose results were thrown away). 07.4 has 07.5's bound on a step's traffic (sends, recvs, object
collectives) and a last round on the wide MLP that counts what is kept outside the optimizer
(:func:`_adam_outside`); 07.6 refuses float32 shards whose values are all bfloat16 numbers right after the
wrapper is built under compute_dtype (master shards rounded at build hid under the tolerance), and a step whose
shards' gradients are all bfloat16 numbers (the float32 sum rounded back: :func:`_share_in_dtype`).

Known limits, of any grader: code that does the work only at the world sizes graded (2 and 3) or only when it sees
the grader (its call stack, its file names) is not told apart: a check sees what it runs (a fifteenth red team's
03.7, 07.5 and 07.6 z01/z02 switch at 4 ranks and more). Known limits: state or whole parameters hidden where no
tensor, storage or counted Python object is (ctypes memory other than mmap, os.environ, a str, int or tuple of
floats the student's module does not reach (hung on builtins), a Python buffer made at import hung on a function
attribute) are not seen (a tensor made before the last round and written in it is, wherever it hangs: a fourteenth
red team's arenas on a module object, on torch.distributed, in a generator's frame; and so are, since a sixteenth
red team's, pickled bytes in a dict the garbage collector does not track and in the locals of the student's frames
in a helper thread); in 07.5 a
whole optimizer kept there still needs every whole gradient on every rank, which the bound on a step's collectives
and sends/recvs (:func:`_traffic_bound`) sees, and the all-gathers must carry the updated parameter slices
(:func:`_gathered_updated`: a fourth red team's whole optimizer on the reduced gradient slices all-gathered, its
state in an anonymous mmap or a TorchScript module, is caught since, and so are slices broadcast by their owners,
:func:`_broadcast_sources`, and an all-to-all spreading them; a process group's own broadcast method is not read;
07.4's all-gathers too). 07.6 counts what only C++ held for the wrapper (:func:`_malloc_settled`: a TorchScript
module's List[Tensor], a fourth red team's copy of the gathered model), and 07.5 and 07.6 what C memory the
student's module keeps, once its globals are let go of (:func:`_drop_student_globals`: a twelfth red team's
ssl.MemoryBIO objects in a module-level list); C memory kept where the student's module does not reach is not seen.
A second red team (2026-12-05) found more that pass (issue 55's note): 07.5 gradients all-reduced by hooks during
backward (outside step()), options of a group other than lr and weight_decay dropped, state hidden in spare room of
a parameter's storage, gradients packed two float32 to a float64 word; 07.6 the gathered parameters kept when
compute_dtype is set (the round that counts what is kept outside runs float32), whole parameters kept in autograd's
saved tensors or hung on the wrapped module beside its parameters. (Its flat reduce-scatter of frozen zeros and a
frozen weight trained in the compute dtype are caught since; an all-gather made of broadcasts from each owner and a
reduce to each owner are accepted, as in 07.5.) A third red team's (2026-12-05) are caught since: 07.5 gradients
sent whole by all_gather_object (object collectives count their pickled bytes), update rules written for SGD and
Adam only (an RMSprop round), an inner optimizer built from the first step's gradients; 07.6 gradients reduced whole
to rank 0 and broadcast back, a frozen parameter kept whole or gathered in float32 under compute_dtype, gathered
parameters kept until a backward that a frozen one never runs (FrozenUnusedNet's frozen table is 80 kB, and its
float32 round counts what is kept outside). A ninth red team's (2026-12-06) are caught since: 07.5 whole gradients
all-reduced from hooks in the backward (the backward's collectives count with step()'s), the whole state packed
after the parameters in their storage (room a parameter leaves in its storage is held state), kept as numpy copies
or sparse tensors (their buffers and indices count), and gloo's allreduce bound at import
(:func:`~mgpu_utils.grading.common.raw_collectives_kept`). An eighteenth red team's (2026-12-07) are caught since:
07.5 the whole state in room after the parameters with the optimizer reached only by weakrefs, kept alive by an
attribute of a parameter (held_bytes follows weak references, and the grader's model with its parameters counts
with the optimizer: what hangs on them is held); 07.6 the whole gathered model kept in the module's ``__dict__``,
the module held by a weakref (:func:`_beyond`: what the module reaches and the wrapper does not is held). A
nineteenth red team's (2026-12-07) too: the whole state, or the gathered model, in an ``array.array`` made at
import on a class inside the student's class (any object with the buffer protocol counts as a Python buffer, and
nested classes' attributes are let go of with the module's), and 07.5's rank 0 updating everything from gradients
reduced to it and broadcasting the result (:func:`_one_root`).
Accepted: 07.6 a gradient divided by the world size in
bfloat16 before the float32 reduce-scatter (one more rounding, exact at a power-of-two world size). """

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import inspect
import sys
import time
import types
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import (ROUTE_HINTS, CodingExercise, OutsideState, always, diff, held_bytes,
                                      inner_parameters, live_storages, malloc_bytes, note, reachable_storages,
                                      reference_untouched, routes_refused, tensor_storage)
from mgpu_utils.measure.comm_calls import (OBJECT_CALLS, TORCH_FSDP, TORCH_ZERO, Content, add_content, built,
                                           carries, carries_some, content_of, counted_collectives, how_differs,
                                           named_content, namespaces_of, patched_collectives, scaled_content,
                                           times_content)
from mgpu_utils.models import TiedMLP, make_mlp


def check_sharded_adam(cls, ctx, problems, steps=3, scale=1e-2):
    """07.4: ``cls(params, lr)`` on this rank's share of the batch against Adam in one process. Reported: the
    parameters after the steps (named when they are Adam's on the ranks' summed gradients: Adam's update does not
    change when the gradient is scaled, but for eps, so the loss is multiplied by ``scale``, and there eps = 1e-8
    tells a sum from the mean by 1e-3 and more, where at scale 1 a sum stayed within 1e-5 at 2 ranks), the tensor
    bytes the optimizer holds and those that appeared in the process outside it (a module-level dict), and a step whose
    collectives carry whole gradients (an all-reduce, or an all-gather or broadcast of every rank's gradient):
    each rank needs its slice's gradient only; and reducing collectives that do not carry this rank's gradients
    (:func:`_reduced_right`), all-gathers (or owners' broadcasts) that do not carry the updated slices
    (:func:`_gathered_updated`: the mean gradient's slices gathered give every rank the whole gradient, and whole
    moments can be kept where no tensor is, numpy arrays), a step that moved more than 07.5's bound
    (:func:`_traffic_bound`: sends, recvs and object collectives count), and torch's ZeroRedundancyOptimizer
    built, each a problem of its own; then, with none on any rank, :func:`_adam_outside`."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    mine = make_mlp(24, 1)
    ref, ref_sum = copy.deepcopy(mine), copy.deepcopy(mine)
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    n = sum(p.numel() for p in mine.parameters())
    size = -(-n // world)
    existing = set(live_storages(collect=False))            # alive before the student's optimizer
    with built(TORCH_ZERO) as torch_built:                  # torch's ZeroRedundancyOptimizer, in __init__ or step()
        opt = cls(mine.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    sum_opt = torch.optim.Adam(ref_sum.parameters(), lr=1e-2, foreach=False)
    start = [p.detach().clone() for p in mine.parameters()]
    comm = wrong_carried = gathered_wrong = traffic = None
    for s in range(steps):
        opt.zero_grad()
        (F.cross_entropy(mine(x[rank::world]), y[rank::world]) * scale).backward()   # this rank's share of the batch
        calls, carried, content = [], [], []
        grads = content_of([p.grad for p in mine.parameters() if p.grad is not None])
        weights = content_of(list(mine.parameters()))
        sent = []                                           # what this rank broadcast as the source
        with counted_collectives(calls, cls, carried, content, p2p=True), built(TORCH_ZERO) as used, \
                _broadcast_sources(cls, sent):
            opt.step()
        torch_built += used
        wrong_carried = wrong_carried or _reduced_right(content, grads, world, weights,
                                                        {"rank": rank, "kind": "adam_carried", "step": s + 1})
        for model, o, times in ((ref, ref_opt, 1), (ref_sum, sum_opt, world)):
            o.zero_grad()
            (F.cross_entropy(model(x), y) * scale * times).backward()      # one process, the whole batch
            o.step()
        gathered_wrong = gathered_wrong or _gathered_updated(
            content, sent, grads, mine, [True] * len(start), ref, world,
            {"rank": rank, "kind": "adam_gathered", "step": s + 1})
        reduced = sum(k for call, k in carried if call == "all_reduce")
        gathered = sum(k for call, k in carried if call in GATHERS + ("broadcast",))
        moved = _traffic(carried, content, world)         # sends, recvs and object collectives too (07.5's bound)
        if comm is None and (reduced >= n / 2 or gathered >= 2 * world * size):
            comm = {"rank": rank, "kind": "adam_comm", "step": s + 1, "full": n, "slices": world * size,
                    "what": "all_reduce" if reduced >= n / 2 else "gather", "elements": max(reduced, gathered)}
        elif traffic is None and sum(moved.values()) > _traffic_bound(world * size, world):
            traffic = {"rank": rank, "kind": "adam_comm", "step": s + 1, "full": n, "what": "traffic",
                       "elements": sum(moved.values()), "right": round(2 * world * size * (1 + 1 / world)),
                       "calls": ", ".join(f"{k} {v:,}" for k, v in sorted(moved.items()))}
    got = torch.cat([p.detach().reshape(-1) for p in mine.parameters()])
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    summed = torch.cat([p.detach().reshape(-1) for p in ref_sum.parameters()])
    first = torch.cat([p.reshape(-1) for p in start])
    held = held_bytes(opt, exclude=list(mine.parameters()))
    known = existing | reachable_storages(opt, mine, ref, ref_sum, ref_opt, sum_opt, x, y, got, want, summed, first,
                                          start)
    limit = 8 * size * 1.05 + 256
    outside = _outside_bytes(known, limit)
    if torch_built:
        note(problems, {"rank": rank, "kind": "torch_zero", "what": torch_built[0]})
    if not reference_untouched(ref_opt, not torch.equal(want, first), problems, rank):
        pass
    elif diff(got, want) > 1e-5:
        should = want != first                             # what Adam in one process moved (not the pixels always 0)
        note(problems, {"rank": rank, "kind": "adam", "max_diff": diff(got, want), "summed": diff(got, summed) < 1e-5,
                        "moved_share": ((got != first) & should).sum().item() / max(1, should.sum().item())})
    elif held > limit:
        note(problems, {"rank": rank, "kind": "adam_memory", "bytes": held, "full": 8 * n})
    elif outside > limit:
        note(problems, {"rank": rank, "kind": "adam_memory", "what": "outside", "bytes": outside, "full": 8 * n})
    elif comm is not None:
        note(problems, comm)
    elif wrong_carried is not None:
        note(problems, wrong_carried)
    elif gathered_wrong is not None:
        note(problems, gathered_wrong)
    elif traffic is not None:
        note(problems, traffic)
    if not _stop_together(problems or routes_refused()):   # the last round has collectives: every rank or none
        _adam_outside(cls, ctx, problems)
    return {"optimizer_bytes": held, "full_adam_bytes": 8 * n}


def _adam_outside(cls, ctx, problems, steps=2):
    """07.4's last round, 07.5's on Adam: :func:`make_mlp` of :data:`WIDE` hidden units for ``steps`` steps on
    this rank's rows; then the files written, and what the process keeps besides the optimizer and the grader's
    tensors (:class:`~mgpu_utils.grading.common.OutsideState`: tensors and storages, Python objects such as numpy
    arrays or the bytes of a torch.save, values set in the c10d store), with what the optimizer holds, against
    this rank's slice of the moments and :data:`PYTHON_SLACK` (whole moments: 614,480 bytes); and, all ranks
    together, at least 90% of the moments' bytes in tensors (an eighth red team's 07.4 w20 kept its slice in
    ``array('f')``: the state sharded, but not in tensors, as the statement asks)."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    torch.manual_seed(0)
    model = make_mlp(WIDE, 1)
    n = sum(p.numel() for p in model.parameters())
    size = -(-n // world)
    allowed = 8 * size * 1.05 + 256 + PYTHON_SLACK
    base = {"rank": rank, "kind": "adam_memory", "model": f"MLP of {WIDE} hidden units", "full": 8 * n}
    with OutsideState(cls) as watch:                       # from before the student's optimizer on
        opt = cls(model.parameters(), lr=1e-2)
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x[rank::world]), y[rank::world]).backward()
            opt.step()
        last = [p.grad for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        held = held_bytes(opt, exclude=list(model.parameters()))
        found = watch.count(opt, model, x, y, last, limit=allowed - held)
    # the moments in tensors, all ranks together (a layout may give one rank more than another): at least m and v
    in_tensors = torch.tensor([float(held + found["tensors"])])
    dist.all_reduce(in_tensors)
    if found["files"]:
        note(problems, {**base, "what": "file", "how": found["files"][0][0], "path": found["files"][0][1]})
    elif held + found["tensors"] + found["python"] > allowed:
        note(problems, {**base, "what": "python", "bytes": found["tensors"] + found["python"],
                        "tensors": found["tensors"], "python": found["python"], "held": held,
                        "shard": 8 * size})
    elif in_tensors.item() < 0.9 * 8 * n:
        note(problems, {**base, "what": "not_tensors", "bytes": int(in_tensors.item()), "python": found["python"]})


#: The collectives that reduce (07.4, 07.5): each carries this rank's gradients (or slices of them) to be summed;
#: and those that move them to be summed locally after (MOVES: an all-to-all, a scatter, a gather).
REDUCES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")
MOVES = ("all_to_all", "all_to_all_single", "scatter", "gather")


def _reduced_right(content: list, grads, world: int, weights, problem: dict, rtol: float = 1e-4) -> dict | None:
    """``problem`` completed (``what``: "zeros", "weights" or "other"; ``calls``, ``elements``, ``got`` and
    ``want``, sums of squares) when a step's reducing collectives (``content``, each call's
    :class:`~mgpu_utils.measure.comm_calls.Content`) did not carry ``grads`` (the content of this rank's own
    gradients), in any layout, padded with zeros, divided by the world size first or not: the reduce-scatters
    (reduces, all-reduces) alone, or with the all-to-alls, scatters and gathers that move gradients to be summed;
    None when they did, or when none ran (the result, or a rule of calls, tells that)."""
    reducing = [c for c in content if c.name in REDUCES]
    moving = reducing + [c for c in content if c.name in MOVES]
    if not moving or any(carries(add_content(part), grads, world, rtol) for part in (reducing, moving) if part):
        return None
    got = add_content(reducing or moving)
    return {**problem, "what": named_content(got, world, rtol, weights=weights), "calls": len(reducing or moving),
            "elements": got.elements, "got": got.squares, "want": grads.squares,
            "differs": how_differs(got, grads, world, rtol)}


def _row_padding(params, world: int) -> float:
    """How much more than 1/world of the parameters' elements a rank holds when each parameter is split by rows
    (dim 0) padded to a multiple of ``world`` (FSDP2's layout), the largest rank's share: >= 1."""
    params = [p for p in params if p.requires_grad]
    padded = sum(-(-(p.shape[0] if p.dim() else 1) // world) * (p.numel() // max(1, p.shape[0] if p.dim() else 1))
                 for p in params)
    return padded * world / max(1, sum(p.numel() for p in params))


def _outside_bytes(known: set, limit: float, tries: int = 5) -> int:
    """Bytes of the live tensors whose storage is not in ``known``; a count over ``limit`` is taken again after a
    pause, up to ``tries`` times, and the smallest count is returned: state kept outside stays, while a
    collective's tensors can outlive the call by a moment (gloo's worker thread lets go of them after the caller
    has returned: 07.4's all-to-all output, 7,248 bytes, on one rank of three in one launch of three; in 07.5 a
    right plain round flagged with 7,248 bytes, and a registry's 7,240 read 7,248 or 7,360, in one of three)."""
    counts = []
    for k in range(tries):
        counts.append(sum(n for ptr, n in live_storages().items() if ptr not in known))
        if counts[-1] <= limit:
            break
        time.sleep(0.05 * (k + 1))
    return min(counts)


#: The hidden units of the MLP of the last rounds of 07.5 and 07.6, which look for state kept outside the graded
#: object (:class:`~mgpu_utils.grading.common.OutsideState`): 76,810 parameters, 307,240 bytes in float32, so
#: that the Python objects a right solution and the grader make (10 to 20 kB) stay far from a full copy.
WIDE = 1024
#: Bytes allowed outside the graded object besides a rank's share: the Python objects the student's object and
#: the grader's make within the round (right solutions of tests/grading/test_memory.py at world 2 and 3: 11 to
#: 21 kB, and a collective's tensor that gloo let go of late, up to 41 kB more, counted again after a pause).
PYTHON_SLACK = 64_000

#: Exercise 07.5's optimizers: (name, class, keyword arguments), each element-wise.
ANY_OPTIMIZERS = (("SGD with momentum", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                  ("Adam", torch.optim.Adam, {"lr": 1e-2}),
                  ("AdamW", torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}))
#: One more, tried on the small MLP only: a wrapper that writes the rules of SGD and Adam(W) by hand, and runs
#: any other class as one of them, gets it wrong.
OTHER_OPTIMIZER = ("RMSprop", torch.optim.RMSprop, {"lr": 1e-2})


class FrozenUnusedNet(torch.nn.Module):
    """07.5's second model: an MLP (64 -> 24 -> 10, float32) whose logits [B, 10] are scaled by ``scale`` [10], a
    frozen parameter (2.0, requires_grad False: its .grad stays None), plus, while ``use_extra`` is true, a
    second head ``extra`` [10, 24] (the check turns it off in every other step: a parameter unused in a step has
    no .grad in it; 07.5 from step 1 on: one first used in step 2 must train from then on). While ``zero_extra``
    is true (07.5's last step) the head gets zeros for input: used, its gradient exactly zero, not None. With
    ``rows`` (07.6: :data:`FROZEN_ROWS`) the frozen parameter is a table [rows, 10], 2.0 everywhere, whose mean
    over the rows scales the logits: the bulk of the model, so that a rank keeping it whole, or a copy of it
    gathered in every step, shows in the memory measured."""

    def __init__(self, rows: int = 0):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 24), torch.nn.Linear(24, 10)
        self.extra = torch.nn.Linear(24, 10, bias=False)
        self.scale = torch.nn.Parameter(torch.full((rows, 10) if rows else (10,), 2.0), requires_grad=False)
        self.use_extra, self.zero_extra = True, False

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        out = self.fc2(h) * (self.scale.mean(0) if self.scale.dim() > 1 else self.scale)
        if not self.use_extra:
            return out
        return out + self.extra(torch.zeros_like(h) if self.zero_extra else h)


#: 07.6's frozen table (:class:`FrozenUnusedNet`): 20,480 elements, 81,920 bytes, against 2,050 trained: kept
#: whole on every rank it passes a shard's allowance (held), and 3 steps' gathered copies left behind pass
#: :data:`PYTHON_SLACK` and a shard (what is kept outside), at world 2 and 3.
FROZEN_ROWS = 2048


def frozen_unused_groups(net: FrozenUnusedNet, lr: float, opt_class=None) -> list[dict]:
    """Two parameter groups of :class:`FrozenUnusedNet`: the body, the frozen scale and the extra head with the
    optimizer's defaults; the last layer with half the lr, weight_decay 0.05 and, for ``opt_class`` SGD or
    Adam(W), options of the optimizer's own too (momentum 0.5 and nesterov; betas (0.8, 0.95) and amsgrad): a
    wrapper that keeps only lr and weight_decay of a group, or a list of the options it knows (momentum, betas),
    loses them."""
    own = ({"momentum": 0.5, "nesterov": True} if opt_class is not None and issubclass(opt_class, torch.optim.SGD)
           else {"betas": (0.8, 0.95), "amsgrad": True} if opt_class is not None and issubclass(
               opt_class, (torch.optim.Adam, torch.optim.AdamW)) else {})
    return [{"params": [net.fc1.weight, net.fc1.bias, net.scale, net.extra.weight]},
            {"params": [net.fc2.weight, net.fc2.bias], "lr": lr / 2, "weight_decay": 0.05, **own}]


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def _stop_together(problems) -> bool:
    """True on every rank once any rank found a problem (the next round has collectives: no rank may leave)."""
    found = torch.tensor([float(bool(problems))])
    dist.all_reduce(found)
    return bool(found.item())


def _sharded_round(cls, ctx, problems, name, opt_class, kwargs, frozen_round, steps, watch=None):
    """One optimizer of 07.5: the student's and the reference trained side by side; see check_sharded_any.
    ``watch``: an :class:`~mgpu_utils.grading.common.OutsideState` (begun here, stopped by the caller): the MLP
    has :data:`WIDE` hidden units instead of 24, and the state kept outside the optimizer's tensors counts too
    (tensors and storages elsewhere in the process, Python objects, files). Returns (the problem of a step whose
    collectives moved more than :func:`_traffic_bound`, that of gathers that carried something else, that of
    right results from optimizers holding under half a slice in the watched round), each or None: the caller
    tells them after every round, in that order (state kept outside, found in the last round only, comes
    first)."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    torch.manual_seed(0)
    mine = FrozenUnusedNet() if frozen_round else make_mlp(24 if watch is None else WIDE, 1)
    ref = copy.deepcopy(mine)
    base = {"rank": rank, "optimizer": name, "round": "groups" if frozen_round else "plain"}
    if watch is not None:
        watch.begin()                                      # from before the student's optimizer on
    try:
        with built(TORCH_ZERO) as torch_built:             # torch's ZeroRedundancyOptimizer, in __init__ or step()
            opt = cls(frozen_unused_groups(mine, kwargs["lr"], opt_class) if frozen_round else mine.parameters(),
                      opt_class, **kwargs)
        error = ""
    except Exception as e:                                 # every rank builds the same: every rank fails alike
        error = f"{type(e).__name__}: {e}"[:160]
    if error:
        note(problems, {**base, "kind": "any_groups", "what": "error", "error": error})
        return None, None, None
    ref_opt = opt_class(frozen_unused_groups(ref, kwargs["lr"], opt_class) if frozen_round else ref.parameters(),
                        foreach=False, **kwargs)
    trainable = sum(p.numel() for p in mine.parameters() if p.requires_grad)
    padded = sum(-(-p.numel() // world) * world for p in mine.parameters() if p.requires_grad)
    few = sum(1 for p in mine.parameters() if p.requires_grad) + 1   # all-reduced: a flag per parameter, a norm
    start, comm, wrong_carried, traffic, gathered = _flat(mine.parameters()), None, None, None, None
    extra = mine.extra.weight.detach().clone() if frozen_round else None
    if torch_built:
        note(problems, {**base, "kind": "torch_zero", "what": torch_built[0]})
    for s in range(steps):
        use = not frozen_round or s % 2 == 1               # the extra head: used in steps 2, 4, ... only
        zero = frozen_round and s == steps - 1 and use     # ... and in the last, with a gradient of zeros
        mine.use_extra = ref.use_extra = use
        mine.zero_extra = ref.zero_extra = zero
        before = mine.extra.weight.detach().clone() if frozen_round else None
        ref_before = ref.extra.weight.detach().clone() if zero else None
        opt.zero_grad()
        back_calls, back_carried, back_content = [], [], []       # hooks of the student's in the backward count
        step_roots = collections.Counter()                 # elements reduced to each rank (dist.reduce's dst)
        with counted_collectives(back_calls, cls, back_carried, back_content, p2p=True), \
                _reduce_roots(cls, step_roots):            # (a ninth red team's w20: DDP's all-reduce)
            F.cross_entropy(mine(x[rank::world]), y[rank::world]).backward()
        calls, carried, content = [], [], []
        grads = content_of([p.grad for p in mine.parameters() if p.grad is not None])
        weights = content_of(list(mine.parameters()))
        stepped = [p.grad is not None for p in mine.parameters()]
        sent = []                                          # what this rank broadcast as the source
        with counted_collectives(calls, cls, carried, content, p2p=True), built(TORCH_ZERO) as used, \
                _broadcast_sources(cls, sent), _reduce_roots(cls, step_roots):
            opt.step()
        if used and not torch_built:
            torch_built += used
            note(problems, {**base, "kind": "torch_zero", "what": used[0]})
        wrong_carried = wrong_carried or _reduced_right(content, grads, world, weights,
                                                        {**base, "kind": "any_carried", "step": s + 1})
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        gathered = gathered or _gathered_updated(content, sent, grads, mine, stepped, ref, world,
                                                 {**base, "kind": "any_gathered", "step": s + 1})
        ref_opt.step()
        if frozen_round and s == 0:                        # after one step, from the same start, a lost option
            first, second = (frozen_unused_groups(m, 1.0) for m in (mine, ref))   # shows in its own group only
            group_diffs = [diff(_flat(a["params"]), _flat(b["params"])) for a, b in zip(first, second)]
        reduced = sum(n for call, n in back_carried + carried if call == "all_reduce")
        moved = _traffic(back_carried + carried, back_content + content, world)
        if reduced > few and comm is None:                 # told after the results and the memory: the lesser fault
            comm = {**base, "kind": "any_comm", "step": s + 1, "elements": reduced, "full": trainable,
                    **({"what": "some"} if reduced < trainable / 2 else {})}
        elif sum(moved.values()) > _traffic_bound(padded, world) and traffic is None:
            traffic = {**base, "kind": "any_comm", "what": "traffic", "step": s + 1, "elements": sum(moved.values()),
                    "full": trainable, "right": round(2 * padded * (1 + 1 / world)),
                       "calls": ", ".join(f"{k} {v:,}" for k, v in sorted(moved.items()))}
        needs = [(p.shape, 1) for p, g in zip(mine.parameters(), stepped) if g and p.requires_grad]
        traffic = traffic or _one_root(step_roots, sent, needs, world, {**base, "kind": "any_comm", "step": s + 1})
        if frozen_round and not torch.equal(mine.scale.detach(), ref.scale.detach()):
            note(problems, {**base, "kind": "any_nograd", "what": "frozen", "step": s + 1,
                            "got": mine.scale.detach().mean().item()})
        elif frozen_round and not use and not torch.equal(mine.extra.weight.detach(), before):
            note(problems, {**base, "kind": "any_nograd", "what": "unused", "step": s + 1,
                            "moved": diff(mine.extra.weight.detach(), before)})
        elif (zero and torch.equal(mine.extra.weight.detach(), before) and not torch.equal(before, extra)
              and not torch.equal(ref.extra.weight.detach(), ref_before)):   # it trained in step 2: not "late"
            note(problems, {**base, "kind": "any_nograd", "what": "zero", "step": s + 1,
                            "moved": diff(ref.extra.weight.detach(), ref_before)})
    got, want = _flat(mine.parameters()), _flat(ref.parameters())
    last = [p.grad for p in mine.parameters() if p.grad is not None]   # the last step's whole gradients, which
    mine.zero_grad(set_to_none=True)                       # count from here on where the optimizer still keeps them
    # the optimizer and the grader's model: what is hung on the model or its parameters (an inner optimizer, room
    # after a parameter's values) is the optimizer's wherever it reaches it (an eighteenth red team's 07.5 x01: the
    # whole state in room appended to the parameters' storages, the optimizer reached by weakrefs)
    roots = [opt, mine]
    held = held_bytes(roots, exclude=list(mine.parameters()) + _shards_only(inner_parameters(opt), mine, world))
    grads = held - held_bytes(roots, exclude=list(mine.parameters()) + last
                              + _shards_only(inner_parameters(opt), mine, world))
    full = held_bytes(ref_opt, exclude=list(ref.parameters()))
    # this rank's slice of the state, padded: a flat split, or FSDP2's (each parameter's rows padded to a multiple
    # of the world size: 1.19x of a third at 3 ranks for this MLP, an eighth red team's right 07.5 r03)
    allowed = full / world * max(1.05, _row_padding(mine.parameters(), world)) + 512
    found, hidden, stepped_with, little = {"tensors": 0, "python": 0, "files": []}, 0, None, None
    if watch is not None:                                  # the slice once, held or not, and Python's own objects
        found = watch.count(opt, mine, ref, ref_opt, x, y, got, want, start, before, last,
                            limit=allowed + PYTHON_SLACK - held)
        inner = [o for o in found.pop("optimizers") if o is not ref_opt]   # the student's, wherever they are kept
        held = held_bytes(roots, exclude=list(mine.parameters()) + _shards_only(inner_parameters(inner), mine, world))
        stepped_with = held_bytes(roots + [inner], exclude=list(mine.parameters())
                                  + _shards_only(inner_parameters(inner), mine, world))
        watch.stop()                                       # it keeps what the module reached at the start alive
        owned = held_bytes([opt, inner, _student_globals(cls)], exclude=list(mine.parameters()), grads=True,
                           python=True) + _container_bytes([opt, inner, _student_globals(cls)])
        c_start = _malloc_settled()                        # (tensors the module reaches are counted elsewhere)
        del opt, inner                                     # what only the optimizer and the student's module
        _drop_student_globals(cls)                         # hold is given back, C memory too
        hidden = max(0, c_start - _malloc_settled() - owned) if c_start is not None else 0
    tampered = not reference_untouched(ref_opt, not torch.equal(want, start), problems, rank)
    if not tampered and frozen_round and group_diffs[0] <= 1e-5 < group_diffs[1]:
        note(problems, {**base, "kind": "any_groups", "what": "options", "max_diff": group_diffs[1]})
    if tampered:
        pass
    elif frozen_round and torch.equal(mine.extra.weight.detach(), extra) and not torch.equal(ref.extra.weight, extra):
        note(problems, {**base, "kind": "any_nograd", "what": "late", "steps": steps,
                        "moved": diff(ref.extra.weight.detach(), extra)})
    elif diff(got, want) > 1e-5:
        should = want != start
        note(problems, {**base, "kind": "any_opt", "max_diff": diff(got, want), "steps": steps,
                        "moved_share": ((got != start) & should).sum().item() / max(1, should.sum().item()),
                        "unmoved": ((got == start) & should).sum().item(),
                        "few": world * sum(1 for p in mine.parameters() if p.requires_grad)})
    elif held > allowed:
        note(problems, {**base, "kind": "any_memory", "bytes": held, "full": full, "grads": grads})
    elif found["files"]:
        note(problems, {**base, "kind": "any_memory", "what": "file", "how": found["files"][0][0],
                        "path": found["files"][0][1]})
    elif held + found["tensors"] + found["python"] + hidden > allowed + PYTHON_SLACK:
        note(problems, {**base, "kind": "any_memory", "bytes": found["tensors"] + found["python"],
                        "what": "hidden" if hidden > found["tensors"] + found["python"] else "outside",
                        "tensors": found["tensors"], "python": found["python"], "held": held, "hidden": hidden,
                        "shard": round(full / world), "full": full})
    elif comm is not None:
        note(problems, comm)
    elif wrong_carried is not None:
        note(problems, wrong_carried)
    elif stepped_with is not None and stepped_with < 0.5 * full / world:
        # the results are right, yet the optimizers hold under half a slice: the state lives where the grader
        # does not count it as a tensor (a twenty-fifth red team's 07.5 e10: the whole state packed in a module's
        # dict as a bit mask and float16, within the slack allowed for Python's own objects); told last, after
        # the traffic, which says more where whole gradients moved
        little = {**base, "kind": "any_memory", "what": "little", "held": stepped_with,
                  "shard": round(full / world), "full": full}
    return traffic, gathered, little


def _gathered_updated(content: list, sent: list, grads, model, stepped: list, ref, world: int, problem: dict,
                      rtol: float = 1e-4) -> dict | None:
    """07.4, 07.5: ``problem`` completed (``what``: "gradients", "zeros" or "other"; ``how``: "all-gathers",
    "broadcasts", "all-to-alls" or several; ``calls``, ``elements``) when a step's all-gathers, broadcasts and
    all-to-alls (``content``: each call's :class:`~mgpu_utils.measure.comm_calls.Content`, what this rank put in;
    ``sent``: the broadcasts whose source this rank was, :func:`_broadcast_sources`) did not carry the ranks'
    updated parameter slices: summed over the ranks (one all-reduce of twelve numbers: every rank calls this),
    what they put in must be the parameters after the step, in any layout and padded with zeros, each parameter
    stepped (``stepped``: its .grad was not None) once, the others (frozen, unused) once or not at all. An
    all-to-all (and a gather or scatter: :data:`SPREADS`) counts for 1/world of what it carries (a slice sent to every rank is put in world times), after
    the gradients it may sum as a reduce-scatter does (``grads``: this rank's, summed over the ranks, divided by
    the world size or not). A rank that all-gathers (or whose owners broadcast, or that all-to-alls) the reduced
    gradient slices instead has the whole mean gradient, and can step a whole optimizer kept anywhere. None when
    they did, or when nothing but reduce-scatters ran (a process group's own broadcast method is not read).
    ``ref``: the reference after its backward (its gradients, the mean over the batch, name what was
    gathered)."""
    mine = [c for c in content if c.name in GATHERS] + list(sent)
    spread = [c for c in content if c.name in SPREADS]
    parts = (add_content(mine), add_content(spread), grads)
    summed = torch.tensor([v for c in parts for v in (c.elements, c.total, c.squares, c.absolute, c.nonzero,
                                                      c.logs)], dtype=torch.float64)
    dist.all_reduce(summed)
    got, moved, every = (Content("", int(summed[k].item()), *(v.item() for v in summed[k + 1:k + 4]),
                                 nonzero=summed[k + 4].item(), logs=summed[k + 5].item()) for k in (0, 6, 12))
    if got.elements == 0 and moved.elements == 0:
        return None
    pieces = [content_of(p) for p in model.parameters()]
    required = [s and p.requires_grad for s, p in zip(stepped, model.parameters())]
    for f in ((0.0, 1.0, 1.0 / world) if moved.elements else (0.0,)):   # what the all-to-alls summed as gradients
        summed_f = scaled_content(every, f)
        rest = Content("", 0, (moved.total - summed_f.total) / world, (moved.squares - summed_f.squares) / world,
                       (moved.absolute - summed_f.absolute) / world,
                       nonzero=(moved.nonzero - summed_f.nonzero) / world, logs=(moved.logs - summed_f.logs) / world)
        if (got.elements == 0 and f and abs(rest.absolute) <= rtol * every.absolute * f + 1e-30
                and abs(rest.squares) <= 2 * rtol * f * f * every.squares + 1e-30):
            return None                                   # all-to-alls as reduce-scatters, and nothing gathered
        if carries_some(add_content([got, rest]), pieces, required, rtol, most=1):
            return None
    mean = content_of([p.grad for p in ref.parameters() if p.grad is not None])
    summed_grads = scaled_content(mean, world)
    named = add_content([got, times_content(moved, 1 / world)])
    how = {"broadcasts" if c.name == "broadcast" else "all-gathers" for c in mine} | {
        "gathers" if c.name == "gather" else "scatters" if c.name == "scatter" else "all-to-alls" for c in spread}
    return {**problem, "what": named_content(named, world, rtol, gradients=summed_grads),
            "how": " and ".join(sorted(how)) or "all-gathers",
            "calls": len(mine) + len(spread), "elements": got.elements + moved.elements}


#: What a rank puts in world times over a step's calls when it spreads slices (every rank's to every rank):
#: an all-to-all, and the gathers or scatters that make one, each rank the root once (a twentieth red team's
#: 07.5 z04: every rank's summed gradient slice gathered to every rank, world gathers; counted as an all-to-all,
#: what they carried is the gradients, not the updated slices).
SPREADS = ("all_to_all", "all_to_all_single", "gather", "scatter")


_BROADCAST = inspect.signature(dist.broadcast)


@contextlib.contextmanager
def _broadcast_sources(fn, sent: list):
    """Within the block (inside :func:`~mgpu_utils.measure.comm_calls.counted_collectives`'s), the
    :class:`~mgpu_utils.measure.comm_calls.Content` of the tensor of every ``dist.broadcast`` call whose source
    (``src``, or ``group_src`` in its group) is this rank goes to ``sent``, taken before the call: what this
    rank sent (07.5: an owner's updated slice, broadcast in place of an all-gather), however torch.distributed's
    function is reached (:func:`~mgpu_utils.measure.comm_calls.patched_collectives`), and of a process group's
    own broadcast method whose root is this rank in that group (a twenty-second red team's 075 b01 sent each
    owner's summed gradient slice that way, unread)."""
    def replace(name, original):
        if name != "broadcast":
            return original

        def call(*args, **kwargs):
            try:
                bound = _BROADCAST.bind_partial(*args, **kwargs).arguments
                tensor, group = bound.get("tensor"), bound.get("group")
                mine = (bound.get("src") == dist.get_rank() if bound.get("src") is not None else
                        bound.get("group_src") is not None and bound.get("group_src") == dist.get_rank(group))
                if mine and isinstance(tensor, torch.Tensor):
                    sent.append(content_of(tensor, "broadcast"))
            except (TypeError, ValueError, RuntimeError):   # torch tells the student what is wrong
                pass
            return original(*args, **kwargs)
        return call

    def below(call):
        if call.name == "broadcast" and call.root is not None:
            try:
                me = call.group.rank() if call.group is not None else dist.get_rank()
            except (RuntimeError, AttributeError):
                return
            if call.root == me:
                sent.append(content_of(call.inputs, "broadcast"))
    with patched_collectives(replace, fn, below):
        yield


#: The collectives whose first tensor (what :func:`~mgpu_utils.measure.comm_calls.counted_collectives` counts) is
#: their output; the others' is what they put in (all_reduce, broadcast, reduce, gather; all-to-all: see
#: :func:`_traffic`).
OUTPUT_FIRST = ("all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
                "reduce_scatter_tensor", "reduce_scatter_single", "scatter")


def _traffic(carried: list, content: list, world: int) -> dict:
    """{collective: elements in and out of this rank} over a step's calls (``carried`` and ``content`` of
    :func:`~mgpu_utils.measure.comm_calls.counted_collectives`, one entry per call): what this rank puts in, plus
    the output of those that have one (:data:`OUTPUT_FIRST`), an all-reduced tensor twice (in and out), a
    broadcast or reduced one once (sent by one rank or received by the others; sent by every rank), a gather's
    input only, an all-to-all's input and 1/world of it (the reduce-scatter it stands for: its output is summed
    locally into a slice; it puts on the wire what a reduce-scatter does), a send's or a recv's tensor once (whole
    gradients sent to every rank by isend/irecv: 2 (world - 1) x). A right ZeRO-1 step: 2 x (1 + 1/world) x the
    parameters (a reduce-scatter, an all-gather; one built of sends and recvs moves 2 (world - 1) / world x). An
    object collective (all_gather_object: whole gradients pickled) counts its pickled bytes, in and out, 4 to an
    element (:data:`~mgpu_utils.measure.comm_calls.OBJECT_CALLS`). A call in a dtype wider than float32 counts
    float32's worth of its bytes (gradients sent in float64: twice their elements)."""
    moved = collections.Counter()
    for (name, first), put in zip(carried, content):
        out = (first if name in OUTPUT_FIRST or name in ("all_reduce", "recv", *OBJECT_CALLS) else
               put.elements / world if name in ("all_to_all", "all_to_all_single") else 0)
        wide = max(1.0, put.nbytes / (4 * put.elements)) if put.elements else 1.0
        moved[name] += round((put.elements + out) * wide)
    return dict(moved)


def _traffic_bound(padded: int, world: int) -> float:
    """The most elements a right ZeRO-1 step may move in and out of a rank (:func:`_traffic`), ``padded`` the
    trainable parameters each padded to a multiple of the world: a reduce-scatter and an all-gather of each,
    2 x (1 + 1/world) x padded, and a quarter of the parameters more; a whole gradient that reached every rank
    (all-gathered: (world + 1) x; reduced then broadcast: 2 x; broadcast by each rank: world x; all-gathered
    after the reduce-scatter: another (1 + 1/world) x) passes it at world 2 and 3."""
    return 2 * padded * (1 + 1 / world) + padded / 4


def _shards_only(params: list, model, world: int) -> list:
    """Of ``params`` (the parameters of the optimizers inside the student's, :func:`inner_parameters`), those
    that may be left out of the state held: the model's own parameters, and others up to a rank's shard of
    every parameter (their storages' bytes, in float32; a flat split's or, if larger, a split of each parameter's
    rows padded to a multiple of ``world``): an idle optimizer over the state tensors does not make them
    parameters."""
    own = {id(p) for p in model.parameters()}
    flat = sum(-(-p.numel() // world) for p in model.parameters())
    rows = sum(-(-(p.shape[0] if p.dim() else 1) // world) * (p.numel() // max(1, p.shape[0] if p.dim() else 1))
               for p in model.parameters())             # FSDP2's layout: each parameter's rows padded (07.5 r03)
    budget = 4 * (max(flat, rows) + world)
    out, seen = [], set()
    for t in params:
        ptr = tensor_storage(t).data_ptr()
        if id(t) in own or ptr in seen:
            out.append(t)
            continue
        if tensor_storage(t).nbytes() <= budget:
            budget -= tensor_storage(t).nbytes()
            seen.add(ptr)
            out.append(t)
    return out


def check_sharded_any(cls, ctx, problems, steps=3):
    """07.5: ``cls(params, optimizer_class, **defaults)`` for each of :data:`ANY_OPTIMIZERS` on a small MLP, then
    with SGD and AdamW on :class:`FrozenUnusedNet` in two parameter groups (:func:`frozen_unused_groups`; four
    steps, the extra head unused in steps 1 and 3: a parameter first used in step 2 must train; in step 4 its
    gradient is exactly zero: torch steps it, and a wrapper that skips zeros as unused does not), and with
    :data:`OTHER_OPTIMIZER` on the small MLP, each on this rank's share of the batch against the optimizer
    in one process. Reported: a constructor that refuses parameter groups, a step that all-reduces more than a flag
    per parameter and a scalar (the elements each collective carries: half the model, or its biases), or whose
    collectives move more elements in and out of the rank than a reduce-scatter and an all-gather of the parameters
    do (:func:`_traffic_bound`: a whole gradient all-gathered, reduced and broadcast, broadcast by each rank, or
    all-gathered after the reduce-scatter), a frozen or unused parameter that moved, the second group's options
    ignored, the parameters after the steps, and the state held (:func:`held_bytes` without the model's parameters
    and its inner optimizers' parameters up to a rank's share, :func:`_shards_only`) against the reference's state
    over the world, measured after the model's ``zero_grad(set_to_none=True)`` (a whole gradient the optimizer keeps
    a reference to counts: told so);
    reducing collectives that do not carry this rank's gradients (:func:`_reduced_right`: zeros sent for show),
    and torch's ZeroRedundancyOptimizer built, each a problem of its own. A last round, SGD with momentum on an
    MLP of :data:`WIDE` hidden units, also counts the state kept outside the optimizer
    (:class:`~mgpu_utils.grading.common.OutsideState`: files written, and the tensors, storages and Python
    objects that appeared, which with the state held may not pass a rank's slice and :data:`PYTHON_SLACK`)."""
    rounds = [(name, c, kw, False, steps) for name, c, kw in ANY_OPTIMIZERS]
    rounds += [(name, c, kw, True, steps + 1) for name, c, kw in ANY_OPTIMIZERS if name != "Adam"]
    rounds += [(*OTHER_OPTIMIZER, False, steps)]
    rounds += [(name, c, kw, False, steps) for name, c, kw in ANY_OPTIMIZERS if name == "SGD with momentum"]
    traffic = gathered = little = None   # told last: a whole optimizer kept outside moves whole gradients too
    for k, (name, opt_class, kwargs, frozen_round, n) in enumerate(rounds):
        watch = OutsideState(cls) if k == len(rounds) - 1 else None   # the wide MLP, and what is kept outside
        try:
            found, wrong_gathered, too_little = _sharded_round(cls, ctx, problems, name, opt_class, kwargs,
                                                               frozen_round, n, watch)
        finally:
            if watch is not None:
                watch.stop()
        traffic, gathered, little = traffic or found, gathered or wrong_gathered, little or too_little
        if _stop_together(problems):                       # an uneven shard may flag one rank only
            return
    told = traffic or gathered or (None if routes_refused() else little)   # a route used says where the state is
    if told is not None:
        note(problems, told)


GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
#: What brings each rank its shard's gradient summed over the ranks: a reduce-scatter, or an all-to-all and a
#: local sum (torch.distributed.nn.functional.all_gather's backward: on gloo an all-to-all made of one scatter
#: per rank).
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
            "scatter")


#: The operations besides F.linear whose operands of a parameter's shape :class:`LinearDtypes` reads (07.6:
#: FrozenUnusedNet's frozen table, averaged, then multiplying the logits).
COMPUTES = (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.mean, torch.Tensor.mean,
            torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.matmul,
            torch.Tensor.__matmul__)


class LinearDtypes(torch.overrides.TorchFunctionMode):
    """Within the block, the dtype of every weight that ``F.linear`` computes with goes to ``seen`` (07.6: the
    compute dtype, however the wrapper puts its gathered parameters in place: functional_call, hooks, setattr);
    with ``shapes`` (the model's parameters' shapes), the dtype of every floating-point operand of such a shape
    of the other operations of :data:`COMPUTES` goes to ``others`` (a frozen parameter gathered in float32,
    which promotes what it multiplies)."""

    def __init__(self, seen: set, shapes=(), others: set | None = None):
        super().__init__()
        self.seen, self.shapes, self.others = seen, set(shapes), others

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            self.seen.add((args[1] if len(args) > 1 else kwargs["weight"]).dtype)
        elif self.others is not None and func in COMPUTES:
            self.others.update(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()
                               and tuple(a.shape) in self.shapes)
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
    the collectives of each step, the dtype the Linear layers saw, and :func:`held_bytes` between steps (before
    the last one's, an evaluation forward under no_grad: a cache of the gathered parameters shows); then
    what the collectives carried (:func:`_fsdp_carried`: the all-gathers this rank's shards, the
    reduce-scatters its own gradients, not zeros while the gradients are summed another way; sends and recvs,
    a ring's, do their work, their elements bounded by :func:`_sends_bound`; reduce-scatters in a dtype narrower
    than float32, against the statement; under compute_dtype, all-gathers or broadcasts wider than it: float32
    shards gathered and cast after, twice FSDP2's bytes), and torch's FSDP
    or fully_shard built, each a problem of its own; the module handed to the wrapper still holding its whole
    parameters between steps (:func:`_module_bytes`, wherever it is kept); in bfloat16, full_parameters() whose
    values are all bfloat16 numbers (gathered in the compute dtype); then what the process keeps outside the
    wrapper (:func:`_fsdp_outside`).
    The shards' order (:func:`_shard_order`): parameters() sorted by name or size puts a group's lr on other
    tensors.
    When loss.backward() returns, every shard that gets a gradient has its .grad, and step() makes no
    reduce-scatter (one made from an optimizer step hook holds every whole gradient until then); each
    reduce-scatter of the backward starts while autograd runs a node (a hook, a Function's backward), not from a
    final callback queued for the end of backward (``queue_callback``: every whole gradient held until then).
    The MLP's step 2 comes after two backwards, each on half of this rank's rows (:func:`_micro_batches`): their
    gradients add up in .grad (a result equal to the second backward's alone is named), and that step's
    collectives are not checked against one backward's gradients."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    models = (("MLP", lambda: make_mlp(24, 1), (None, torch.bfloat16)), ("TiedMLP", TiedMLP, (None, torch.bfloat16)),
              ("FrozenUnusedNet", lambda: FrozenUnusedNet(FROZEN_ROWS), (None, torch.bfloat16)))
    for model_name, model_fn, dtypes in models:
        for dtype in dtypes:
            found = torch.tensor([float(bool(problems))])
            dist.all_reduce(found)                           # every rank stops together once any rank found one
            if found.item():
                return
            base = {"rank": rank, "kind": "fsdp", "model": model_name,
                    "dtype": "float32" if dtype is None else str(dtype).replace("torch.", "")}
            torch.manual_seed(0)
            model = model_fn()
            accumulates = model_name == "MLP"              # step 2 after two backwards (gradient accumulation)
            refs = {v: copy.deepcopy(model) for v in ("right", "sum", "own", *(("last",) if accumulates else ()))}
            full = sum(p.numel() for p in model.parameters())
            # the most a rank may hold: each parameter padded to a multiple of the world, or cut in whole rows
            bound = sum(max(-(-p.numel() // world), -(-p.shape[0] // world) * (p.numel() // p.shape[0]))
                        for p in model.parameters()) + world
            seen = set()
            names = [n for n, _ in model.named_parameters()]
            uses = _uses(model)
            shapes = {n: p.shape for n, p in model.named_parameters()}
            with built(TORCH_FSDP) as torch_built:          # torch's FSDP or fully_shard, in __init__ or forward
                wrapper = cls(model) if dtype is None else cls(model, dtype)
            if torch_built:
                note(problems, {**base, "what": "torch_fsdp", "used": torch_built[0]})
            shards = list(wrapper.parameters())
            mine = sum(p.numel() for p in shards)
            grouped = model_name == "FrozenUnusedNet"       # two groups: the last layer with half the lr
            misplaced = _shard_order(shards, refs["right"], world)   # the model's own are freed by now
            if grouped and len(shards) != len(names):
                note(problems, {**base, "what": "order", "got": len(shards), "want": len(names)})
            elif mine > bound:
                note(problems, {**base, "what": "params", "got": mine, "full": full, "bound": bound})
            elif any(p.dtype != torch.float32 for p in shards):
                note(problems, {**base, "what": "master_dtype", "got": str(shards[0].dtype)})
            elif misplaced is not None:
                note(problems, {**base, "what": "shard_order", **misplaced})
            elif dtype is not None and all(torch.equal(p.detach(), p.detach().to(dtype).float()) for p in shards):
                note(problems, {**base, "what": "master_built"})   # float32 masters rounded when built
            found = torch.tensor([float(bool(problems))])
            dist.all_reduce(found)                           # agree before the steps: their collectives are shared
            if found.item():
                return
            def groups(params):
                if not grouped:
                    return params
                params = list(params)
                last = [n.startswith("fc2.") for n in names]
                return [{"params": [p for p, x in zip(params, last) if not x]},
                        {"params": [p for p, x in zip(params, last) if x], "lr": lr / 2, "weight_decay": 0.05}]
            opt = torch.optim.SGD(groups(shards), lr=lr, momentum=0.9)
            ref_opts = {v: torch.optim.SGD(groups(m.parameters()), lr=lr, momentum=0.9) for v, m in refs.items()}
            extra = wrong_carried = params = None
            # FrozenUnusedNet in float32: what stays outside too (a frozen or unused parameter has no backward)
            watch = OutsideState(cls).begin() if grouped and dtype is None else None   # stopped after the steps
            for s in range(steps):
                for m in [model, *refs.values()]:
                    m.use_extra = s % 2 == 0                     # FrozenUnusedNet: its extra head in odd steps only
                micro = _micro_batches(len(x), rank, world, 2 if accumulates and s == 1 else 1)
                calls, content, nodes = [], [], []
                mine_now = [content_of(p) for p in shards]       # this rank's shards, before the step
                roots, others = collections.Counter(), set()    # elements reduced to each rank; dtypes used
                with counted_collectives(calls, cls, content=content, p2p=True, nodes=nodes), \
                        built(TORCH_FSDP) as used, \
                        _reduce_roots(cls, roots):
                    for rows, _ in micro:                        # gradient accumulation: each backward adds up
                        with LinearDtypes(seen, [tuple(t) for t in shapes.values()], others):
                            out = wrapper(x[rows])
                        F.cross_entropy(out.float(), y[rows]).backward()
                    in_backward = len(calls)                     # what step() calls comes after
                    ready = [p.grad is not None for p in shards]
                    rounded = (_share_in_dtype([p.grad for p in shards if p.grad is not None], dtype)
                               if dtype is not None and len(micro) == 1 else 0.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                if used and not torch_built:
                    torch_built += used
                    note(problems, {**base, "what": "torch_fsdp", "used": used[0]})
                used_now = [not (grouped and n.startswith("extra.") and s % 2) for n in names]
                whole = len(used_now) == len(mine_now)           # a shard per parameter, in their order
                needs = [(shapes[n], uses[n]) for (n, q), u in zip(refs["right"].named_parameters(), used_now)
                         if q.requires_grad and u]         # the parameters that get a gradient in this step
                late = [c for c in calls[in_backward:] if c in (*SCATTERS, "reduce")]
                after = sum(1 for c, n in zip(calls[:in_backward], nodes) if c in (*SCATTERS, "reduce") and not n)
                unready = sum(1 for r, u, (_, q) in zip(ready, used_now, refs["right"].named_parameters())
                              if u and q.requires_grad and not r) if whole else 0
                if len(micro) == 1:                              # one backward: what it carried is one gradient
                    wrong_carried = wrong_carried or _scatter_bound(content, needs, world,
                                                                    {**base, "what": "scattered", "step": s + 1})
                    wrong_carried = wrong_carried or _fsdp_carried(
                        content, mine_now, used_now if whole else [True] * len(mine_now),
                        [2 * uses[n] for n in names] if whole else 2 * max(uses.values()),
                        _own_gradients(refs["right"], x[rank::world], y[rank::world], dtype), world,
                        {**base, "what": "carried", "step": s + 1}, 1e-4 if dtype is None else 5e-2)
                    wrong_carried = wrong_carried or _roots_bound(roots, content, needs, world,
                                                                  {**base, "what": "rooted", "step": s + 1})
                narrow = [c for c in content if c.name in (*SCATTERS, "reduce") and 0 < c.nbytes < 4 * c.elements]
                if narrow and wrong_carried is None:            # the statement: reduce-scattered in float32
                    wrong_carried = {**base, "what": "scatter_dtype", "step": s + 1, "calls": len(narrow),
                                     "bits": 8 * min(c.nbytes // c.elements for c in narrow)}
                wide = [c for c in content if dtype is not None and c.name in (*GATHERS, "broadcast") and c.elements
                        and c.nbytes > c.elements * dtype.itemsize]   # gathered in float32, cast after
                if len(micro) == 1:
                    wrong_carried = wrong_carried or _sends_bound(
                        content, calls, needs, [(shapes[n], uses[n]) for n in names], world,
                        {**base, "what": "sent", "step": s + 1})
                for v, m in refs.items():
                    for k, (own, every) in enumerate(micro):
                        if v == "last" and k < len(micro) - 1:   # the gradients overwritten, not added up
                            continue
                        rows = own if v == "own" else every
                        loss = F.cross_entropy(_fsdp_reference(m, x[rows], dtype).float(), y[rows])
                        (loss * world if v == "sum" else loss).backward()
                    ref_opts[v].step()
                    ref_opts[v].zero_grad(set_to_none=True)
                if s == steps - 1:                               # an evaluation forward keeps nothing either
                    with torch.no_grad():
                        wrapper(x[:16])
                held = held_bytes(wrapper, grads=True) - sum(p.numel() * p.element_size() for p in shards)
                if "all_reduce" in calls:
                    note(problems, {**base, "what": "all_reduce", "step": s + 1, "calls": calls.count("all_reduce")})
                elif not set(calls) & {*GATHERS, "broadcast", *P2P} or not set(calls) & {*SCATTERS, "reduce", *P2P}:
                    note(problems, {**base, "what": "collectives", "step": s + 1, "calls": sorted(set(calls))})
                elif late or unready:                            # reduce-scattered at step(), not in the backward
                    note(problems, {**base, "what": "at_step", "step": s + 1, "calls": len(late), "unready": unready})
                elif after:                                      # in a callback at backward's end: none overlaps
                    note(problems, {**base, "what": "at_end", "step": s + 1, "calls": after})
                elif dtype is not None and seen != {dtype}:
                    note(problems, {**base, "what": "compute_dtype", "seen": sorted(str(d) for d in seen)})
                elif dtype is not None and others - {dtype}:
                    note(problems, {**base, "what": "compute_dtype", "other": True,
                                    "seen": sorted(str(d) for d in others)})
                elif wide:
                    note(problems, {**base, "what": "gather_dtype", "step": s + 1, "calls": len(wide),
                                    "bits": 8 * max(c.nbytes // c.elements for c in wide)})
                elif rounded >= 0.99:                            # the float32 sum rounded to the compute dtype
                    note(problems, {**base, "what": "grad_rounded", "step": s + 1, "share": rounded})
                elif held > 4 * full / world + 1024:             # a shard's worth more at most: a buffer
                    frozen = sum(4 * p.numel() for p in refs["right"].parameters() if not p.requires_grad)
                    note(problems, {**base, "what": "held", "step": s + 1, "bytes": held, "full_bytes": full * 4,
                                    "frozen": frozen if held >= frozen > 4 * full / world else 0})
                elif max(_module_bytes(model), _beyond(model, wrapper)) > 4 * full / world + 1024:   # kept where
                    note(problems, {**base, "what": "module", "step": s + 1, "full_bytes": full * 4,    # the wrapper
                                    "bytes": max(_module_bytes(model), _beyond(model, wrapper))})    # does not reach
                seen.clear()
                if grouped:
                    params = _full_parameters(wrapper, names, base, problems, shapes)
                    if params is None:
                        break
                    if not torch.equal(params["scale"], torch.full_like(params["scale"], 2.0)):
                        note(problems, {**base, "what": "frozen", "step": s + 1, "got": params["scale"].mean().item(),
                                        "moved": diff(params["scale"], torch.full_like(params["scale"], 2.0))})
                    elif extra is not None and s % 2 == 1 and not torch.equal(params["extra.weight"], extra):
                        note(problems, {**base, "what": "unused", "step": s + 1,
                                        "moved": diff(params["extra.weight"], extra)})
                    extra = params["extra.weight"]
            if watch is not None:
                out = None                                       # its graph holds a leaf the student made
                try:
                    _fsdp_kept(watch, wrapper, base, problems, steps, full, world,
                               [model, shards, opt, refs, ref_opts, x, y, extra, params, mine_now, content])
                finally:
                    watch.stop()
            with torch.no_grad():
                got = wrapper(x[:16]).float()
                outs = {v: _fsdp_reference(m, x[:16], dtype).float() for v, m in refs.items()}
            atol, rtol = (1e-4, 0.0) if dtype is None else (4e-3, 2e-2)   # bfloat16: 2^-8 relative rounding
            close = lambda a, b: bool(((a - b).abs() <= atol + rtol * b.abs()).all())
            if not close(got, outs["right"]):
                named = next((v for v in ("sum", "own", "last") if v in outs and close(got, outs[v])), None)
                note(problems, {**base, "what": "output", "steps": steps, "max_diff": diff(got, outs["right"]),
                                "variant": named})
            params = _full_parameters(wrapper, names, base, problems, shapes)
            if params is not None and dtype is not None and all(
                    torch.equal(t, t.to(dtype).float()) for t in params.values()):
                note(problems, {**base, "what": "full_rounded"})   # gathered in the compute dtype, cast back
                params = None
            for name, want in refs["right"].named_parameters():
                if params is not None and not close(params[name].float(), want.detach()):
                    note(problems, {**base, "what": "full_params", "steps": steps, "name": name,
                                    "max_diff": diff(params[name].float(), want.detach())})
            if wrong_carried is not None:                        # told last: the results and the memory first
                note(problems, wrong_carried)

    if not _stop_together(problems):
        _fsdp_outside(cls, ctx, problems, lr=lr)


def _share_in_dtype(grads: list, dtype: torch.dtype) -> float:
    """The share of the nonzero values of ``grads`` (float32 tensors) that are ``dtype`` numbers (unchanged by a
    round trip through it); 0.0 with fewer than 64 of them. A float32 sum of a few bfloat16 gradients, divided by
    the world size, is one in a few at most (its mantissa needs more than 8 bits); a sum rounded back to
    bfloat16 (a ninth red team's 07.6 w17) is one in one."""
    values = torch.cat([g.detach().reshape(-1).float() for g in grads]) if grads else torch.zeros(0)
    values = values[values != 0]
    if values.numel() < 64:
        return 0.0
    return (values == values.to(dtype).float()).float().mean().item()


def _fsdp_kept(watch, wrapper, base, problems, steps, full, world, known):
    """07.6's FrozenUnusedNet round in float32, after its steps: the state kept outside the wrapper
    (:class:`~mgpu_utils.grading.common.OutsideState`, begun before the steps; ``known``: the grader's objects),
    with what the wrapper holds besides its shards, against a shard's worth and :data:`PYTHON_SLACK`, as in
    :func:`_fsdp_outside`: a gathered parameter that gets no backward (frozen, unused) left behind shows here."""
    if problems:
        return
    shards = list(wrapper.parameters())
    held = held_bytes(wrapper, grads=True) - sum(p.numel() * p.element_size() for p in shards) + \
        _beyond(known[0], wrapper)
    allowed = 4 * full / world * 1.05 + 1024 + PYTHON_SLACK
    found = watch.count(wrapper, *known, limit=allowed - held)
    if found["files"]:
        note(problems, {**base, "what": "file", "how": found["files"][0][0], "path": found["files"][0][1]})
    elif held + found["tensors"] + found["python"] > allowed:
        note(problems, {**base, "what": "outside", "steps": steps, "bytes": found["tensors"] + found["python"],
                        "tensors": found["tensors"], "python": found["python"], "held": held,
                        "shard": round(4 * full / world), "full_bytes": 4 * full})


def _fsdp_outside(cls, ctx, problems, steps=2, lr=0.05):
    """07.6's last round: :func:`make_mlp` of :data:`WIDE` hidden units in float32 for ``steps`` SGD steps
    (momentum 0.9) on this rank's rows (two by default: the measure is taken between steps, and every step's
    collectives cost time); then the files written, and what the process keeps besides the module,
    the shards, the optimizer and the grader's own tensors (:class:`~mgpu_utils.grading.common.OutsideState`:
    tensors and storages, Python objects), with what the wrapper holds besides its shards, against a shard's
    worth and :data:`PYTHON_SLACK`; and the output against one process's."""
    world, rank = ctx.world_size, ctx.rank
    x, y = load_data()[0][:48]
    x = x.flatten(1)
    torch.manual_seed(0)
    model = make_mlp(WIDE, 1)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    full = 4 * sum(p.numel() for p in model.parameters())
    base = {"rank": rank, "kind": "fsdp", "model": f"MLP of {WIDE} hidden units", "dtype": "float32"}
    allowed = full / world * 1.05 + 1024 + PYTHON_SLACK      # a shard's worth (a buffer), and Python's objects
    with OutsideState(cls) as watch:                       # from before the student's wrapper on
        wrapper = cls(model)
        shards = list(wrapper.parameters())
        opt = torch.optim.SGD(shards, lr=lr, momentum=0.9)
        for _ in range(steps):
            F.cross_entropy(wrapper(x[rank::world]).float(), y[rank::world]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        held = held_bytes(wrapper, grads=True) - sum(p.numel() * p.element_size() for p in shards) + \
            _beyond(model, wrapper)
        found = watch.count(wrapper, model, shards, opt, ref, ref_opt, x, y, limit=allowed - held)
    with torch.no_grad():
        got, want = wrapper(x[:16]).float(), ref(x[:16])
    del found["optimizers"]                                # the student's optimizer, inside it or not
    owned = held_bytes([wrapper, shards, opt, model, _student_globals(cls)], grads=True, python=True) + \
        _container_bytes([wrapper, shards, opt, _student_globals(cls)])
    start = _malloc_settled()
    try:
        alive = weakref.ref(wrapper)
    except TypeError:                                      # __slots__ without __weakref__
        alive = lambda: True
    del wrapper, shards, opt, model                        # what only they hold is freed: C++'s too,
    _drop_student_globals(cls)                             # and what only the student's module holds
    hidden = max(0, start - _malloc_settled(collect=alive() is not None) - owned) if start is not None else 0
    if diff(got, want) > 1e-4:
        note(problems, {**base, "what": "output", "steps": steps, "max_diff": diff(got, want), "variant": None})
    elif found["files"]:
        note(problems, {**base, "what": "file", "how": found["files"][0][0], "path": found["files"][0][1]})
    elif held + found["tensors"] + found["python"] + hidden > allowed:
        note(problems, {**base, "what": "hidden" if hidden > found["tensors"] + found["python"] else "outside",
                        "steps": steps, "bytes": found["tensors"] + found["python"], "hidden": hidden,
                        "tensors": found["tensors"], "python": found["python"], "held": held,
                        "shard": round(full / world), "full_bytes": full})


def _malloc_settled(tries: int = 5, collect: bool = True) -> int | None:
    """:func:`~mgpu_utils.grading.common.malloc_bytes` after a full collection of the garbage collector
    (``collect``; 0.1 to 0.2 s in a grading rank: 07.6 makes one before deleting the student's objects, where
    reading without it counted 141 kB to 1.1 MB of the right solutions' cycles as freed by the deletion, and one
    after it only when the wrapper is still alive, in a reference cycle), read again after a pause
    until two reads agree (up to ``tries`` times; the last read): gloo's worker thread lets go of a collective's
    buffers a moment after the call returned (131 or 262 kB at times, gone 50 ms later), which would count as
    freed by what is deleted next. None without mallinfo2. 07.6 reads it before and after deleting the wrapper,
    its shards, the optimizer and the module: what the C allocator got back beyond the tensors they reach is
    what only C++ held for them (a TorchScript module's List[Tensor]: no Python object, no tensor the garbage
    collector lists); the math libraries' and gloo's caches, kept for the process, are not in it."""
    if collect:
        gc.collect()
    now = malloc_bytes()
    for _ in range(tries):
        if now is None:
            return None
        time.sleep(0.05)
        now, before = malloc_bytes(), now
        if now == before:
            break
    return now


def _drop_student_globals(cls) -> None:
    """After a check's last round (07.5, 07.6): what the student's module keeps is let go of, so that memory only
    it holds is given back and :func:`_malloc_settled` sees it (a twelfth red team's 07.5: the optimizer's state
    in ssl.MemoryBIO objects kept in a module-level list, C memory no count of tensors or Python objects sees).
    Set to None: the module's globals other than modules, classes and functions; the data attributes of the
    classes it defines; the default arguments and the closure cells of the functions it defines and of those
    classes' methods (not of a function it imported: the library's own). The grader loads each graded file as a
    module of its own and uses it no further."""
    def drop_class(value, own, seen):
        if id(value) in seen:
            return
        seen.add(id(value))
        for attr, item in list(vars(value).items()):
            if attr.startswith("__"):
                continue
            if inspect.isfunction(item):
                if item.__module__ == own:
                    _drop_function_state(item)
            elif isinstance(item, type):                   # a class inside it: its attributes too (a nineteenth
                if item.__module__ == own:                 # red team's 07.5 y01 kept the state on one)
                    drop_class(item, own, seen)
            elif not isinstance(item, (staticmethod, classmethod, property)):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(value, attr, None)

    for space in namespaces_of(cls):
        own = space.get("__name__")
        for key, value in list(space.items()):
            if key.startswith("__"):
                continue
            if isinstance(value, type) and value.__module__ == own:
                drop_class(value, own, set())
            elif inspect.isfunction(value):
                if value.__module__ == own:                # not an imported one: others still use it
                    _drop_function_state(value)
            elif not (inspect.ismodule(value) or isinstance(value, type) or inspect.isbuiltin(value)):
                space[key] = None


def _student_globals(cls) -> list[dict]:
    """The globals of the student's module (those :func:`_drop_student_globals` lets go of), without Python's
    own (``__builtins__``): what :func:`held_bytes` is given to count the tensors they reach."""
    return [{k: v for k, v in space.items() if not k.startswith("__")} for space in namespaces_of(cls)]


#: The containers :func:`_container_bytes` counts: Python's own types only (a class of the student's could say
#: anything in its ``__sizeof__``).
_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque, collections.OrderedDict, collections.defaultdict)


def _container_bytes(roots, depth: int = 10) -> int:
    """``sys.getsizeof`` of every dict, list, tuple, set and deque reachable from ``roots`` (items, values, and
    objects' ``__dict__``, ``depth`` levels down; not into modules, classes, functions or tensors), each once:
    the Python memory that deleting them gives back to the C allocator (a table over 512 bytes comes from
    malloc), which the count of what only C++ held leaves out (a right 07.5's registry of every optimizer ever
    made: 53 kB of dicts and lists)."""
    seen, total, todo = set(), 0, [(r, depth) for r in roots]
    while todo:
        o, d = todo.pop()
        if d < 0 or id(o) in seen or isinstance(o, (torch.Tensor, type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(o))
        if type(o) in _CONTAINERS:
            total += sys.getsizeof(o)
            items = [*o.keys(), *o.values()] if isinstance(o, dict) else list(o)
        else:
            items = [getattr(o, "__dict__", None)]
        todo += [(i, d - 1) for i in items if i is not None]
    return total


def _drop_function_state(fn) -> None:
    """A function's default arguments and closure cells set to None (:func:`_drop_student_globals`)."""
    fn.__defaults__ = None if fn.__defaults__ is None else tuple(None for _ in fn.__defaults__)
    fn.__kwdefaults__ = None
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):
            cell.cell_contents = None


def _micro_batches(n: int, rank: int, world: int, count: int) -> list:
    """07.6: the rows of each of ``count`` backwards of a step, as (this rank's, every rank's) index tensors of
    the ``n`` rows of the batch: this rank's rows (rank, rank + world, ...) split in ``count`` (every
    ``count``-th of them), and the same split of every rank's, which one process trains on. One: this rank's
    rows and the whole batch."""
    if count == 1:
        return [(slice(rank, None, world), slice(None))]
    return [(torch.arange(rank, n, world)[k::count], torch.cat([torch.arange(r, n, world)[k::count]
                                                                 for r in range(world)])) for k in range(count)]


def _shard_order(shards: list, model: torch.nn.Module, world: int) -> dict | None:
    """07.6: where parameters() lists one shard per parameter but not in the order of ``model.named_parameters()``:
    {index, name, got, want} of the first shard whose elements over the ranks (each rank's summed, a collective
    every rank makes) do not fit its parameter (at least its elements, at most each rank's padded share or
    whole rows) but fit another's (sorted by name or size), else None."""
    params = list(model.named_parameters())
    sizes = torch.zeros(len(params))
    for i, p in enumerate(shards[:len(params)]):
        sizes[i] = p.numel()
    dist.all_reduce(sizes)                                 # every rank, whatever it lists
    if len(shards) != len(params):
        return None
    fits = lambda got, p: p.numel() <= got <= world * (max(-(-p.numel() // world), -(-p.shape[0] // world)
                                                            * (p.numel() // p.shape[0])) + 1)
    for i, ((name, p), got) in enumerate(zip(params, sizes.tolist())):
        if not fits(got, p) and any(fits(got, q) for j, (_, q) in enumerate(params) if j != i):
            return {"index": i, "name": name, "got": int(got), "want": p.numel()}
    return None


def _module_bytes(model: torch.nn.Module) -> int:
    """Bytes of the storages of ``model.parameters()`` (each once): 07.6's module, whose whole parameters the
    wrapper must free once sharded, wherever the module is kept (a module-level dict, a weakref)."""
    storages = {tensor_storage(p).data_ptr(): tensor_storage(p).nbytes() for p in model.parameters()}
    return sum(storages.values())


def _beyond(model: torch.nn.Module, wrapper) -> int:
    """07.6: bytes of the tensors that the grader's ``model`` (the module handed to the wrapper) reaches and the
    wrapper does not: what is hung on the module, or on its parameters, where the wrapper reaches it some other
    way (an eighteenth red team's 07.6 x01: the whole gathered model kept in the module's ``__dict__``, the
    module reached by a weakref). The grader's objects count as known to :class:`OutsideState`, so this is
    counted as held."""
    return max(0, held_bytes([wrapper, model], grads=True) - held_bytes(wrapper, grads=True))


def _own_gradients(model, x, y, dtype) -> list:
    """The content of this rank's own gradients (rows ``x``, ``y``) of a copy of ``model`` (one process's model,
    with the weights the student's should have), computing in ``dtype`` as :func:`_fsdp_reference` does; and,
    when ``model`` shares a weight between layers, the content of the gradients with that weight untied (one
    gradient per use: what a wrapper that gathers the weight once per use reduce-scatters). A list of one or two
    :class:`~mgpu_utils.measure.comm_calls.Content`."""
    found = []
    for untie in (False, True):
        probe = copy.deepcopy(model)
        if untie:
            seen = set()
            for m in probe.modules():
                for name, p in list(m.named_parameters(recurse=False)):
                    if id(p) in seen:                        # a second use: its own copy, its own gradient
                        setattr(m, name, torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
                    seen.add(id(p))
            if len(list(probe.parameters())) == len(list(model.parameters())):
                break                                        # nothing shared
        F.cross_entropy(_fsdp_reference(probe, x, dtype).float(), y).backward()
        found.append(content_of([p.grad for p in probe.parameters() if p.grad is not None]))
    return found


def _uses(model: torch.nn.Module) -> dict:
    """{name: how many modules hold that parameter} for ``model.named_parameters()`` (TiedMLP's shared weight:
    2), so a wrapper that gathers a tied weight once per use is not told its all-gathers carried something else."""
    held = collections.Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
    return {n: held[id(p)] for n, p in model.named_parameters()}


def _scatter_bound(content: list, needs: list, world: int, problem: dict) -> dict | None:
    """07.6: ``problem`` completed (``elements``, ``most``) when a step's reduce-scatters (all-to-alls,
    scatters: :data:`SCATTERS`) carried more elements than the gradients of the parameters that got one in this
    step (``needs``: (shape, uses) each; a tied weight is one parameter: its gradient once, however many layers
    use it) padded in the most generous right layout: each padded to a multiple of ``world``, each cut in whole
    rows, or all flattened into one padded vector (FSDP1's). A frozen parameter's or an unused one's zeros sent
    beside them pass none of them (FSDP1's flat layout did send them); a tied weight's gradient reduce-scattered
    once per use (twice the traffic) neither (``per_use``: the count would pass once per use); None otherwise."""
    sent = sum(c.elements for c in content if c.name in SCATTERS)
    up = lambda n: -(-n // world) * world
    bound = lambda once: max(sum((1 if once else u) * up(shape.numel()) for shape, u in needs),
                             sum((1 if once else u) * up(shape[0]) * (shape.numel() // shape[0])
                                 for shape, u in needs if len(shape)),
                             up(sum((1 if once else u) * shape.numel() for shape, u in needs)))
    most = bound(True)
    if sent <= most:
        return None
    return {**problem, "elements": sent, "most": most,
            "per_use": any(u > 1 for _, u in needs) and sent <= bound(False)}


#: Point-to-point calls (recorded with ``p2p``): a ring of sends and recvs does an all-gather's or a
#: reduce-scatter's work (lesson 04), bounded by :func:`_sends_bound`.
P2P = ("send", "recv")


def _sends_bound(content: list, calls: list, needs: list, every: list, world: int, problem: dict) -> dict | None:
    """07.6: ``problem`` completed (``elements``, ``most``) when a step's sends carried more elements than
    rings (or each rank sending each other rank its part) of the all-gathers and reduce-scatters not made by
    named collectives move: (world - 1) / world of each parameter (``every``: (shape, uses) each) padded the most
    generous right way, gathered up to twice per use (again for the backward), and of each gradient (``needs``)
    once (a tied weight's too); a whole gradient or parameter sent to every rank ((world - 1) x) passes it at world 2 at
    most. None otherwise."""
    sent = sum(c.elements for c in content if c.name == "send")
    if not sent:
        return None
    up = lambda shape: max(-(-shape.numel() // world) * world,
                           -(-shape[0] // world) * world * (shape.numel() // shape[0]) if len(shape) else world)
    named = set(calls)
    work = (0 if named & {*GATHERS, "broadcast"} else sum(2 * u * up(shape) for shape, u in every)) \
        + (0 if named & {*SCATTERS, "reduce"} else sum(up(shape) for shape, _ in needs))
    most = round(work * (world - 1) / world) + world
    return {**problem, "elements": sent, "most": most} if sent > most else None


_REDUCE = inspect.signature(dist.reduce)


@contextlib.contextmanager
def _reduce_roots(fn, roots: collections.Counter):
    """Within the block (inside :func:`~mgpu_utils.measure.comm_calls.counted_collectives`'s), ``roots`` counts
    the elements of each ``dist.reduce`` call by its destination (``dst``, or ``("group", group_dst)``), however
    torch.distributed's function is reached (:func:`~mgpu_utils.measure.comm_calls.patched_collectives`; a
    process group's own reduce is not seen)."""
    def replace(name, original):
        if name != "reduce":
            return original

        def call(*args, **kwargs):
            try:
                bound = _REDUCE.bind_partial(*args, **kwargs).arguments
                tensor, dst = bound.get("tensor"), bound.get("dst")
                key = dst if dst is not None else ("group", bound.get("group_dst"))
                roots[key] += tensor.numel() if isinstance(tensor, torch.Tensor) else 0
            except TypeError:                                # torch tells the student what is wrong
                pass
            return original(*args, **kwargs)
        return call
    with patched_collectives(replace, fn, lambda call: None):
        yield


def _one_root(roots: collections.Counter, sent: list, needs: list, world: int, problem: dict) -> dict | None:
    """07.5, one step: ``problem`` completed when one rank was the destination of more reduced elements than a
    rank's slice of the gradients (``what`` "rooted", :func:`_roots_bound`'s bound), or when this rank broadcast
    more than its slice of the parameters (``what`` "root_sent"): a nineteenth red team's 07.5 reduced every
    gradient to rank 0, which updated the whole model with the whole state and broadcast it (2 x the parameters
    per step, as ZeRO's traffic, and rank 0's broadcast taken for its updated slice). None otherwise."""
    rooted = _roots_bound(roots, [], needs, world, {**problem, "what": "rooted"})
    if rooted is not None:
        return rooted
    most = sum(max(-(-shape.numel() // world), -(-shape[0] // world) * (shape.numel() // shape[0]) if len(shape)
                   else 1) for shape, _ in needs) + world
    if sum(c.elements for c in sent) > most:
        return {**problem, "what": "root_sent", "elements": sum(c.elements for c in sent), "most": most}
    return None


def _roots_bound(roots: collections.Counter, content: list, needs: list, world: int, problem: dict) -> dict | None:
    """07.6: ``problem`` completed when a step reduced to one rank more than the gradients of its shards
    (``what`` "rooted": ``dst``, ``elements``, ``most``: each parameter that got a gradient in this step, a tied
    one once, cut the most generous right way, padded to a multiple of ``world`` or in whole rows, over
    the world; a whole gradient reduced to rank 0 and broadcast back is an all-reduce made of two calls, and
    every rank receives every sum), or when its object collectives carried a quarter of those gradients'
    elements or more (``what`` "objects": pickled parameters or gradients, :data:`OBJECT_CALLS`); None
    otherwise."""
    most = sum(max(-(-shape.numel() // world), -(-shape[0] // world) * (shape.numel() // shape[0]) if len(shape)
                   else 1) for shape, _ in needs) + world
    dst, elements = max(roots.items(), key=lambda kv: kv[1], default=(0, 0))
    if elements > most:
        return {**problem, "dst": dst, "elements": elements, "most": most}
    pickled = [c for c in content if c.name in OBJECT_CALLS]
    if sum(c.elements for c in pickled) * 4 >= most * world:
        return {**problem, "what": "objects", "elements": sum(c.elements for c in pickled),
                "calls": ", ".join(sorted({c.name for c in pickled})), "most": most * world}
    return None


def _fsdp_carried(content: list, shards: list, required: list, most, grads, world: int, problem: dict,
                  rtol: float) -> dict | None:
    """07.6: ``problem`` completed (``carried``: "gathers" or "gradients"; ``content``: "zeros" or "other";
    ``elements``) when a step's all-gathers did not carry this rank's shards (``shards``, each one's content, in
    the dtype they are kept: each 0 to ``most`` times (2 per use, :func:`_uses`), at least once where
    ``required``: gathered again for the backward, or not at all when unused) or its reduce-scatters (all-to-alls,
    scatters) not this rank's own gradients (one of ``grads``, :func:`_own_gradients`; divided by the world size
    first or not; reduce-scatters of zeros only, while a reduce and a broadcast carry the gradients, are not
    padding); ``rtol``: 5e-2 in bfloat16, whose gradients
    come from weights that differ a little from one process's after a step. None when both did."""
    gathered = add_content(c for c in content if c.name in GATHERS)
    if gathered.elements and not carries_some(gathered, shards, required, rtol, most):
        return {**problem, "carried": "gathers", "content": named_content(gathered, world, rtol),
                "elements": gathered.elements}
    scattered = add_content(c for c in content if c.name in SCATTERS)
    if scattered.elements and scattered.squares == 0:      # zeros for show, the gradients summed another way
        return {**problem, "carried": "gradients", "content": "zeros", "elements": scattered.elements}
    reduced = add_content(c for c in content if c.name in SCATTERS + ("reduce",))
    if reduced.elements and not any(carries(reduced, g, world, rtol) for g in grads):
        return {**problem, "carried": "gradients", "content": named_content(reduced, world, rtol),
                "elements": reduced.elements}
    return None


def _full_parameters(wrapper, names, base, problems, shapes=None) -> dict | None:
    """07.6: ``wrapper.full_parameters()`` (every rank calls it), or None with the problem noted: missing, not
    a dict of these names, or (with ``shapes``, {name: shape}) a tensor of another shape or not float32."""
    try:
        params = wrapper.full_parameters()
    except Exception as e:                                  # every rank the same: no rank left waiting
        note(problems, {**base, "what": "no_full", "error": f"raised {type(e).__name__}: {e}"[:160]})
        return None
    if not isinstance(params, dict) or sorted(params) != sorted(names):
        note(problems, {**base, "what": "no_full", "error": "returned "
                        + (f"the names {sorted(params)[:4]}" if isinstance(params, dict) else type(params).__name__)})
        return None
    for n, t in params.items():
        if shapes is not None and (not isinstance(t, torch.Tensor) or t.shape != shapes[n] or t.dtype != torch.float32):
            got = f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" if isinstance(t, torch.Tensor) else type(t)
            note(problems, {**base, "what": "no_full", "error": f"returned {got} for {n!r}, whose parameter is "
                                                                f"{tuple(shapes[n])} float32"})
            return None
    return {n: t.detach() for n, t in params.items()}


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "outside_routes": ROUTE_HINTS,
    "adam": [
        (lambda p, W: p["moved_share"] < 1 - 1 / (2 * W),           # about 1/W moved: only this rank's own slice
         "rank {rank}: only {moved_share:.0%} of the parameters that Adam updates moved (world size {W}): the "
         "other ranks' updated slices never arrived; gather every slice on every rank (step 3)"),
        (lambda p, W: p.get("summed"),
         "rank {rank}: after three steps the parameters are those of Adam on the sum of the ranks' gradients, {W} "
         "times their mean: divide the reduce-scattered slice by the world size (step 1). Adam hides most of it, "
         "m / sqrt(v) does not change when g is scaled, but eps does not scale with it"),
        (always, "rank {rank}: after three steps the parameters differ from Adam in one process by {max_diff:.3g} "
                 "(world size {W}): is g the mean over the ranks of this rank's slice (step 1)?")],
    "adam_memory": [
        (lambda p, W: p.get("what") == "file",
         "rank {rank} ({model}): Adam's moments must live in this process's memory: your code "
         "{how} {path} while the optimizer ran (read: written by torch.save to a path, then torch.load). State kept in a file is state this rank keeps, whole, out of sight; "
         "keep only this rank's slice of m and v, in tensors"),
        (lambda p, W: p.get("what") == "python",
         "rank {rank} ({model}): {bytes:,} bytes appeared in this process outside the tensors your optimizer holds "
         "({held:,}): {tensors:,} in tensors or storages it does not hold, {python:,} in Python objects (numpy "
         "arrays, bytes or BytesIO of a torch.save, lists of floats, values set in the c10d store: the grader "
         "counts Python's memory too, a few kB are its own). Full Adam's moments are {full:,} bytes, this rank's "
         "slice {shard:,}: where they are kept does not change what a rank holds; keep only this rank's slice of "
         "m and v, in tensors"),
        (lambda p, W: p.get("what") == "not_tensors",
         "rank {rank} ({model}): the {W} ranks together hold {bytes:,} bytes of tensors besides the parameters, "
         "less than Adam's moments take ({full:,}: m and v of every parameter, split over the ranks; {python:,} "
         "bytes appeared in Python objects on this rank): keep this rank's slice of m and v in tensors (the "
         "statement asks for it: tensors are what the checks count), not in Python arrays, lists or numpy"),
        (lambda p, W: p.get("what") == "outside",
         "rank {rank}: {bytes:,} bytes of tensors appeared in this process outside your optimizer (in a "
         "module-level dict, a registry, a global: the grader looks at every live tensor); full Adam's moments are "
         "{full:,}: where they are kept does not change what a rank holds; keep only this rank's slice of m and v"),
        (always, "rank {rank}: your optimizer holds {bytes:,} bytes of tensors (counting every tensor it can reach: "
                 "attributes, lists, dicts, a wrapped optimizer's state); full Adam's moments are {full:,}: keep only "
                 "this rank's slice of m and v")],
    "adam_comm": [
        (lambda p, W: p["what"] == "traffic",
         "rank {rank}: the result is right, but step {step}'s communication moved {elements:,} elements in and out "
         "of this rank ({calls}; an object collective counts its pickled bytes, 4 to an element), and the model "
         "has {full:,}: a whole gradient reached every rank (all_gather_object, sends and recvs, ...), though it "
         "updates its slice only. ZeRO-1 reduce-scatters the gradients (each rank receives its slice's sum: "
         "reduce_scatter_single) and all-gathers the updated slices, about {right:,} elements in and out"),
        (lambda p, W: p["what"] == "all_reduce",
         "rank {rank}: the result is right, but step {step} all-reduced {elements:,} elements, and the model has "
         "{full:,}: every rank received every gradient, as in DDP, though it updates its slice only. ZeRO-1 "
         "reduce-scatters (each rank receives its slice's gradient, summed: reduce_scatter_single) and all-gathers "
         "the updated slices"),
        (always, "rank {rank}: the result is right, but step {step} gathered or broadcast {elements:,} elements, and "
                 "the model has {full:,}: every rank received every rank's whole gradient, though it updates its "
                 "slice only. ZeRO-1 reduce-scatters the gradients (each rank receives its slice's sum: "
                 "reduce_scatter_single) and gathers the updated slices only ({slices:,} elements)")],
    "adam_carried": [
        (lambda p, W: p["what"] == "zeros",
         "rank {rank}: the result is right, but in step {step} your reduce-scatters ({calls} call(s), {elements:,} "
         "elements) carried zeros, not rank {rank}'s gradients (world size {W}): the gradients reached the other "
         "ranks some other way (send/recv?). Reduce-scatter the gradients themselves: each rank receives its "
         "slice's sum"),
        (lambda p, W: p["what"] == "weights",
         "rank {rank}: the result is right, but in step {step} your reduce-scatters ({calls} call(s)) carried the "
         "parameters, not rank {rank}'s gradients (world size {W}): reduce-scatter the gradients themselves"),
        (always, "rank {rank}: the result is right, but in step {step} your reduce-scatters ({calls} call(s), "
                 "{elements:,} elements) did not carry rank {rank}'s gradients: {differs} (world size {W}). "
                 "Reduce-scatter every gradient once, padded with zeros if need be, and nothing else")],
    "adam_gathered": [
        (lambda p, W: p["what"] == "gradients",
         "rank {rank}: the result is right, but in step {step} your {how} ({calls} call(s), {elements:,} elements) "
         "carried the mean gradient's slices, not the updated parameters (world size {W}): every rank then holds "
         "the whole gradient and can run Adam on every parameter, its moments kept whole wherever they are. "
         "Step 3 gathers each rank's updated slice (mine, after Adam), not its gradient slice"),
        (always, "rank {rank}: the result is right, but in step {step} your {how} ({calls} call(s), {elements:,} "
                 "elements) did not carry the ranks' updated slices (summed over the ranks, what they put in is "
                 "not the parameters after the step; world size {W}): step 3 gathers each rank's updated slice "
                 "(mine, after Adam), once, and nothing else")],
    "torch_zero": [(always, "rank {rank}: your optimizer built {what} (world size {W}): the exercise is to write "
                            "ZeRO-1 yourself; shard the optimizer's state with your own reduce-scatter and "
                            "all-gather, without torch.distributed.optim")],
    "any_carried": [
        (lambda p, W: p["what"] == "zeros",
         "rank {rank}: with {optimizer}, the result is right, but in step {step} your reduce-scatters ({calls} "
         "call(s), {elements:,} elements) carried zeros, not rank {rank}'s gradients (world size {W}): the "
         "gradients reached the other ranks some other way (send/recv?). Reduce-scatter the gradients "
         "themselves: each rank receives its slices' sums"),
        (lambda p, W: p["what"] == "weights",
         "rank {rank}: with {optimizer}, the result is right, but in step {step} your reduce-scatters ({calls} "
         "call(s)) carried the parameters, not rank {rank}'s gradients (world size {W}): reduce-scatter the "
         "gradients themselves"),
        (lambda p, W: not p["got"] <= 100 * p["want"],      # nan too: what torch.empty left in memory
         "rank {rank}: with {optimizer}, the result is right, but in step {step} your reduce-scatters ({calls} "
         "call(s), {elements:,} elements) carried a sum of squares of {got:.4g}, the gradients' {want:.4g} (world "
         "size {W}): is the padding zeros? torch.empty leaves whatever was in memory, and it is summed and sent "
         "with the gradients (a NaN there reaches the optimizer's state); pad with zeros (torch.zeros, new_zeros)"),
        (always, "rank {rank}: with {optimizer}, the result is right, but in step {step} your reduce-scatters "
                 "({calls} call(s), {elements:,} elements) did not carry rank {rank}'s gradients: {differs} (world "
                 "size {W}). Reduce-scatter every gradient once (those that are not None), padded with zeros if "
                 "need be, and nothing else")],
    "any_gathered": [
        (lambda p, W: p["what"] == "gradients",
         "rank {rank}: with {optimizer}, the result is right, but in step {step} your {how} ({calls} call(s), "
         "{elements:,} elements) carried the reduced gradient slices, not the updated parameters (world size {W}): "
         "every rank then holds the whole mean gradient and steps every parameter, so each keeps the whole "
         "optimizer state, wherever it is hidden. In ZeRO-1 each rank steps its own slice only, and the all-gather "
         "(or each owner's broadcast) after the step carries this rank's updated parameter slice"),
        (always, "rank {rank}: with {optimizer}, the result is right, but in step {step} your {how} ({calls} "
                 "call(s), {elements:,} elements) did not carry the ranks' updated parameter slices (summed over "
                 "the ranks, what they put in is not the parameters after the step; world size {W}): in ZeRO-1 "
                 "each rank steps its own slice, then all-gathers that updated slice, once per step, and nothing "
                 "else")],
    "any_opt": [
        (lambda p, W: p["optimizer"] == OTHER_OPTIMIZER[0],
         "rank {rank}: with {optimizer}, after {steps} steps the parameters differ from one process's by "
         "{max_diff:.3g} (world size {W}), where SGD, Adam and AdamW (tried first) agreed: ShardedOptimizer "
         "must work for any element-wise optimizer. Build optimizer_class itself on this rank's slices, with "
         "the keyword arguments and groups given, and let its step() do the update, rather than update rules "
         "written for some classes"),
        (lambda p, W: p["moved_share"] == 0,
         "rank {rank}: with {optimizer}, no parameter moved in {steps} steps (world size {W}): step() must update "
         "the parameters"),
        (lambda p, W: p["moved_share"] < 1 - 1 / (2 * W),
         "rank {rank}: with {optimizer}, only {moved_share:.0%} of the parameters that one process updates moved "
         "(world size {W}): the other ranks' updated slices never arrived; gather every slice on every rank"),
        (lambda p, W: 0 < p.get("unmoved", 0) < p.get("few", 0),
         "rank {rank}: with {optimizer}, {unmoved} element(s) that one process updates never moved (world size "
         "{W}): slices of n // world elements leave the last n % world of each vector in no slice. Round up, "
         "-(-n // world), and pad the last slice with zeros"),
        (always, "rank {rank}: with {optimizer}, after {steps} steps the parameters differ from one process's by "
                 "{max_diff:.3g} (world size {W}): is each slice's gradient the mean over the ranks, and does the "
                 "inner optimizer get every keyword argument (lr, momentum, weight_decay)?")],
    "any_groups": [
        (lambda p, W: p["what"] == "error",
         "rank {rank}: ShardedOptimizer(param_groups, {optimizer}) raised {error}. params may be a list of "
         "parameter groups, as torch.optim accepts: dicts with \"params\" and their own options (lr, "
         "weight_decay); give the inner optimizer the same groups, each holding this rank's slices of its "
         "parameters"),
        (always, "rank {rank}: with {optimizer}, after one step the first parameter group equals one process's, the "
                 "second (half the lr, weight_decay 0.05, its own momentum and nesterov, or betas and amsgrad) "
                 "differs by {max_diff:.3g}: each group's own options, every one of them (not a list of those you "
                 "know), must reach the inner optimizer (a group per group, with this rank's slices of its "
                 "parameters)")],
    "any_comm": [(lambda p, W: p.get("what") in ("rooted", "root_sent"),
                  "rank {rank}: with {optimizer}, step {step} made one rank the root of {elements:,} elements "
                  "(reduced to it, or broadcast by it), where a rank's slice is at most {most:,}: one rank received "
                  "or sent the whole model, so it updates every parameter, as one process does. ZeRO-1 gives each "
                  "rank its own slice: reduce-scatter the gradients (or reduce each slice to its owner), update the "
                  "slice, all-gather the slices (or each owner broadcasts its own)"),
                 (lambda p, W: p.get("what") == "traffic",
                  "rank {rank}: with {optimizer}, step {step}'s collectives moved {elements:,} elements in and out "
                  "of this rank ({calls}) in float32's worth (one in float64 counts twice), and the model trains "
                  "{full:,}: a whole gradient reached every rank "
                  "(all-gathered, reduced then broadcast, broadcast by each rank, or all-gathered again after the "
                  "reduce-scatter), as in DDP, though each rank updates its slice only; or the gradients and slices "
                  "went in a wider dtype than the parameters' (float64). ZeRO-1 reduce-scatters the "
                  "gradients (each rank receives its slice, summed) and all-gathers the updated slices, in the "
                  "parameters' dtype, about {right:,} elements in and out; send no whole gradient anywhere"),
                 (lambda p, W: p.get("what") == "some",
                  "rank {rank}: with {optimizer}, step {step} all-reduced {elements:,} of the {full:,} elements the "
                  "model trains: the whole gradient of some parameters (small ones, biases say) reached every "
                  "rank, and their optimizer state is kept whole on every rank. ZeRO-1 shards every parameter, small "
                  "ones too: reduce-scatter each gradient and all-gather the updated slices; it needs no all-reduce"),
                 (always, "rank {rank}: with {optimizer}, step {step} all-reduced {elements:,} elements, and the "
                          "model trains {full:,}: every rank received every gradient (in the backward, from hooks, or "
                          "in step()), as in DDP, though it updates "
                          "its slice only. ZeRO-1 reduce-scatters (each rank receives its slice's gradient, summed: "
                          "reduce_scatter_single) and all-gathers the updated slices: 2 x the parameters per step, "
                          "not 3 x")],
    "any_nograd": [
        (lambda p, W: p["what"] == "late",
         "rank {rank}: with {optimizer}, a parameter unused in step 1 (its .grad None then) and used from step 2 on "
         "never moved in {steps} steps, where one process moved it by up to {moved:.3g}: its slice must be in the "
         "inner optimizer from the start, whether or not it has a gradient in the first step (torch's optimizers "
         "take every parameter they are given and skip it only in a step where its .grad is None)"),
        (lambda p, W: p["what"] == "zero",
         "rank {rank}: with {optimizer}, a parameter used in step {step} whose gradient was exactly zero (its "
         "input zeros) did not move, where one process moved it by {moved:.3g}: a zero gradient is still a "
         "gradient: only p.grad is None means unused; torch's optimizers step it (momentum, weight decay, Adam's "
         "moments move it). Skip a parameter only when its .grad is None, not when its values are zeros"),
        (lambda p, W: p["what"] == "frozen",
         "rank {rank}: with {optimizer}, a frozen parameter (requires_grad=False, 2.0 everywhere, .grad None) is "
         "{got:.4g} on average after step {step}: torch's optimizers skip a parameter whose .grad is None (no "
         "weight decay, no momentum); skip it too: leave its slices' .grad None, do not fill in zeros"),
        (always, "rank {rank}: with {optimizer}, a parameter not used in step {step} (its .grad None) moved by "
                 "{moved:.3g} in that step: torch's optimizers skip it, momentum and weight decay included; leave "
                 "its slices' .grad None rather than zeros")],
    "any_memory": [
        (lambda p, W: p.get("what") == "file" and p["how"] == "wrote",
         "rank {rank}: with {optimizer}, the sharded state must live in this process's memory: your code wrote "
         "{path} while the optimizer ran. State kept in a file is state this rank keeps, whole, out of sight; "
         "keep the state of this rank's slice only, in tensors, about 1/{W}"),
        (lambda p, W: p.get("what") == "file",
         "rank {rank}: with {optimizer}, the sharded state must live in this process's memory: your code read back "
         "{path}, written while the optimizer ran (torch.save to a path, then torch.load). State kept in a file is "
         "state this rank keeps, whole, out of sight; keep the state of this rank's slice only, in tensors, about "
         "1/{W}"),
        (lambda p, W: p.get("what") == "hidden",
         "rank {rank}: with {optimizer}, deleting your optimizer and letting go of what your module keeps (its "
         "globals, its classes' attributes) gave back {hidden:,} bytes of C memory beyond the {held:,} bytes of "
         "tensors your optimizer holds: state kept where no tensor or Python object shows it (ssl.MemoryBIO, a "
         "compressor's buffer, a TorchScript module, a ctypes buffer). This rank's slice of the state is {shard:,} "
         "bytes, the whole optimizer's {full:,}: where it is kept does not change what a rank holds; keep the "
         "state of this rank's slice only, in tensors, about 1/{W}"),
        (lambda p, W: p.get("what") == "little",
         "rank {rank}: with {optimizer}, the result is right, but your optimizer holds {held:,} bytes of state, "
         "where this rank's slice of the state is {shard:,} bytes (the whole optimizer's {full:,}): the state it "
         "steps with is kept somewhere else, packed or out of sight. Keep this rank's slice of the state in your "
         "optimizer (an inner torch optimizer over this rank's shards, or tensors it holds), about 1/{W}"),
        (lambda p, W: p.get("what") == "outside",
         "rank {rank}: with {optimizer}, {bytes:,} bytes appeared in this process outside the tensors your "
         "optimizer holds ({held:,}): {tensors:,} in tensors or storages it does not hold (a module-level dict, a "
         "registry, a global: the grader looks at every live tensor and torch.UntypedStorage), {python:,} in "
         "Python objects (bytes or BytesIO of a torch.save, numpy arrays, lists or tuples of floats, strings, "
         "values set in the c10d store: the grader counts Python's "
         "memory too, a few kB are its own). This rank's slice of the state is {shard:,} bytes, the whole "
         "optimizer's {full:,}: where it is kept does not change what a rank holds; keep the state of this rank's "
         "slice only, in tensors, about 1/{W}"),
        (lambda p, W: p.get("grads", 0) > p["full"] / W * 0.05 + 512,
         "rank {rank}: with {optimizer}, after the last step and the model's zero_grad(set_to_none=True) your "
         "optimizer still holds {grads:,} bytes of the model's whole gradients ({bytes:,} in all; the optimizer in "
         "one process holds {full:,}): a reference kept to a gradient keeps it alive, so zero_grad frees nothing. "
         "Keep only this rank's slice of each gradient, and drop the whole one once its slice is reduced"),
        (always, "rank {rank}: with {optimizer}, your optimizer holds {bytes:,} bytes of state (every "
                            "tensor it can reach but the model's parameters and, up to a rank's share of the model, "
                            "the parameters an optimizer inside it updates: state listed as an optimizer's "
                            "parameters is still state; so is room in a parameter's storage beyond the parameter "
                            "itself); the optimizer in one process holds {full:,}: keep the "
                            "state of this rank's slice only, about 1/{W}")],
    "fsdp": [
        (lambda p, W: p["what"] == "torch_fsdp",
         "rank {rank} ({model}): your wrapper built {used} (world size {W}): the exercise is to write ZeRO-3 "
         "yourself; shard the parameters, all-gather them for the forward and reduce-scatter their gradients "
         "with your own collectives, without torch.distributed.fsdp"),
        (lambda p, W: p["what"] == "scattered" and p.get("per_use"),
         "rank {rank} ({model}, {dtype}): in step {step} your reduce-scatters carried {elements:,} elements, and "
         "the gradients of the parameters that got one in this step are {most:,} at most, padded: a weight used by "
         "two layers was reduce-scattered once per use (twice its traffic). A tied weight is one parameter: gather "
         "it once for both uses (functional_call ties the names) so that autograd adds up its uses' gradients, "
         "and reduce-scatter that one gradient once"),
        (lambda p, W: p["what"] == "scattered",
         "rank {rank} ({model}, {dtype}): in step {step} your reduce-scatters carried {elements:,} elements, and "
         "the gradients of the parameters that got one in this step are {most:,} at most, padded in any layout "
         "(each to a multiple of the world size, in whole rows, or one flat vector): a frozen parameter "
         "(requires_grad=False) or one unused in this step has no gradient, and nothing of it is reduce-scattered "
         "(FSDP2 leaves it out; FSDP1's flat layout sent zeros in its place)"),
        (lambda p, W: p["what"] == "rooted",
         "rank {rank} ({model}, {dtype}): in step {step} your reduces sent {elements:,} gradient elements to rank "
         "{dst}, whose shards' gradients are {most:,} elements at most: rank {dst} received the sum of whole "
         "gradients, and every rank needs only its own shard's. Reduce-scatter each gradient "
         "(reduce_scatter_single) so that each rank receives the sum of its shard only, not a reduce to one rank "
         "and a broadcast of the whole back"),
        (lambda p, W: p["what"] == "scatter_dtype",
         "rank {rank} ({model}, {dtype}): in step {step} {calls} of your reduce-scatters (or reduces) summed "
         "{bits}-bit floats: the gradients are reduce-scattered in float32, as the statement asks, so that the sum "
         "over the ranks is not rounded to {bits} bits. Cast the gathered parameter's gradient to float32 before "
         "the reduce-scatter (compute_dtype is for the forward and backward only)"),
        (lambda p, W: p["what"] == "sent",
         "rank {rank} ({model}, {dtype}): in step {step} your sends carried {elements:,} elements, and rings of "
         "sends and recvs for the all-gathers and reduce-scatters your collectives left undone move {most:,} at "
         "most (each rank sends ({W} - 1)/{W} of each padded parameter per gather, of each gradient per "
         "reduce-scatter): whole parameters or gradients went to every rank. Send each rank only the shard or "
         "the slice of the gradient it needs"),
        (lambda p, W: p["what"] == "objects",
         "rank {rank} ({model}, {dtype}): in step {step} your object collectives ({calls}) carried {elements:,} "
         "elements' worth of pickled bytes (float32's: 4 bytes each), and the gradients of this step are {most:,}: "
         "parameters or gradients moved whole as Python objects. All-gather the shards and reduce-scatter the "
         "gradients as tensors, each rank sending and receiving its shard's share only"),
        (lambda p, W: p["what"] == "carried" and p["carried"] == "gathers" and p["content"] == "zeros",
         "rank {rank} ({model}, {dtype}): in step {step} your all-gathers ({elements:,} elements) carried zeros, "
         "not rank {rank}'s shards of the parameters: the parameters reached the ranks some other way "
         "(send/recv?). All-gather each rank's own shard"),
        (lambda p, W: p["what"] == "carried" and p["carried"] == "gathers",
         "rank {rank} ({model}, {dtype}): in step {step} your all-gathers ({elements:,} elements) did not carry "
         "rank {rank}'s shards of the parameters (the tensors parameters() lists, each once, or again for the "
         "backward): all-gather each rank's own shard, cast to the compute dtype or not, and nothing else"),
        (lambda p, W: p["what"] == "carried" and p["content"] == "zeros",
         "rank {rank} ({model}, {dtype}): in step {step} your reduce-scatters ({elements:,} elements) carried "
         "zeros, not rank {rank}'s gradients: the gradients reached the ranks some other way (send/recv?). "
         "Reduce-scatter the gradient of each gathered parameter"),
        (lambda p, W: p["what"] == "carried",
         "rank {rank} ({model}, {dtype}): in step {step} your reduce-scatters ({elements:,} elements) did not carry "
         "rank {rank}'s gradients (of the loss on its own rows, with respect to the gathered parameters): "
         "reduce-scatter each parameter's gradient once, padded with zeros if need be, and nothing else"),
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
         "before they are used and reduce-scatters their gradients (all_gather_single, reduce_scatter_single; a "
         "broadcast from each shard's owner and a reduce to it move the same)"),
        (lambda p, W: p["what"] == "compute_dtype" and p.get("other"),
         "rank {rank} ({model}): with compute_dtype={dtype} the forward's other operations (not F.linear: a "
         "product, a mean) used parameters in {seen}: a parameter gathered in float32 (a frozen one?) promotes "
         "what it touches back to float32. Cast every gathered parameter, frozen or not, to compute_dtype"),
        (lambda p, W: p["what"] == "gather_dtype",
         "rank {rank} ({model}): with compute_dtype={dtype}, in step {step} {calls} of your all-gathers moved "
         "{bits}-bit floats: the shards were gathered in float32 and cast after, twice the bytes on the wire. Cast "
         "each shard to compute_dtype first and all-gather that, as FSDP2's MixedPrecisionPolicy(param_dtype) "
         "does (frozen or not); full_parameters() alone gathers float32"),
        (lambda p, W: p["what"] == "compute_dtype",
         "rank {rank} ({model}): with compute_dtype={dtype} the Linear layers saw weights of {seen}: cast the "
         "gathered parameters (and a floating-point input) to compute_dtype"),
        (lambda p, W: p["what"] == "held" and p.get("frozen"),
         "rank {rank} ({model}, {dtype}): after step {step} your wrapper holds {bytes:,} bytes besides its shards, "
         "and the model's frozen parameters are {frozen:,} (the whole model {full_bytes:,}): a frozen parameter "
         "kept whole on every rank? Frozen or not, ZeRO-3 shards every parameter (1/{W} on each rank) and gathers "
         "it for the forward; only its gradient is skipped"),
        (lambda p, W: p["what"] == "held",
         "rank {rank} ({model}, {dtype}): after step {step} your wrapper holds {bytes:,} bytes besides its shards, "
         "and the whole model is {full_bytes:,}: free the module's own parameters once sharded, keep the "
         "gathered ones only while autograd needs them (not in an attribute; after a forward under "
         "torch.no_grad, an evaluation, not at all), leave no whole gradient behind "
         "(p.grad = None, not zero_()), and make each shard a tensor of its own (a slice of a whole one keeps "
         "the whole storage)"),
        (lambda p, W: p["what"] == "module",
         "rank {rank} ({model}, {dtype}): after step {step} the module given to your wrapper still holds "
         "{bytes:,} bytes in its parameters (module.parameters()), and the whole model is {full_bytes:,}: kept "
         "where your wrapper does not reach it (a module-level dict, a weakref), it is still on this rank. Free "
         "the module's own parameters once sharded (p.data = torch.empty(0)) and gather them for each forward"),
        (lambda p, W: p["what"] == "grad_rounded",
         "rank {rank} ({model}, {dtype}): after step {step}'s backward, {share:.0%} of your shards' gradient values "
         "are {dtype} numbers: the reduce-scattered float32 sum was rounded to the compute dtype. The sum must "
         "stay float32's: cast each gradient to float32 before its reduce-scatter, and keep the result (divided "
         "by the world size) in float32"),
        (lambda p, W: p["what"] == "full_rounded",
         "rank {rank} ({model}, {dtype}): every value full_parameters() returned is a {dtype} number cast to "
         "float32: the parameters were gathered in the compute dtype, which rounds each to 8 bits. Gather the "
         "float32 shards for full_parameters(); cast to compute_dtype only what the forward uses"),
        (lambda p, W: p["what"] == "file" and p["how"] == "wrote",
         "rank {rank} ({model}): the sharded parameters must live in this process's memory: your code wrote "
         "{path} during the steps. A file keeps whole parameters out of sight, but this rank still holds them; "
         "keep only this rank's shard between steps, and gather the whole parameters when they are used"),
        (lambda p, W: p["what"] == "file",
         "rank {rank} ({model}): the sharded parameters must live in this process's memory: your code read back "
         "{path}, written during the steps (torch.save to a path, then torch.load). A file keeps whole parameters "
         "out of sight, but this rank still holds them; keep only this rank's shard between steps, and gather "
         "the whole parameters when they are used"),
        (lambda p, W: p["what"] == "hidden",
         "rank {rank} ({model}): after {steps} steps, deleting your wrapper, its module and the optimizer, and "
         "letting go of what your file's module keeps (globals, class attributes), gave back {hidden:,} bytes more "
         "than the tensors they reach hold (the shards, the optimizer's state, the "
         "{held:,} bytes your wrapper holds next to its shards): memory your wrapper kept through C++ only, such as "
         "the tensors of a TorchScript module (torch.jit.script), a torch.futures.Future's value, ssl.MemoryBIO or "
         "a ctypes buffer. A shard is {shard:,} bytes, the whole model {full_bytes:,}: keep only this rank's shard between "
         "steps, wherever it is kept; the gathered parameters live only while autograd needs them (the exercise "
         "needs no TorchScript)"),
        (lambda p, W: p["what"] == "outside",
         "rank {rank} ({model}): after {steps} steps, {bytes:,} bytes stayed in this process outside your "
         "wrapper, its module and the optimizer, besides the {held:,} it holds next to its shards: {tensors:,} "
         "in tensors or storages (a module-level dict or "
         "list, a cache, a global: the grader looks at every live tensor and torch.UntypedStorage), {python:,} in "
         "Python objects (bytes or BytesIO of a torch.save, numpy arrays, lists or tuples of floats, strings, "
         "values set in the c10d store: the grader counts Python's "
         "memory too, a few kB are its own). A shard is {shard:,} bytes, the whole model {full_bytes:,}: keep only "
         "this rank's shard between steps, wherever it is kept; the gathered parameters live only while autograd "
         "needs them"),
        (lambda p, W: p["what"] == "shard_order",
         "rank {rank} ({model}): parameters()[{index}] holds {got:,} elements over the {W} ranks, and the "
         "parameter at that place in module.named_parameters(), '{name}', has {want:,}: list one shard per "
         "parameter in the order of module.named_parameters(), not sorted (by name or size): an optimizer's "
         "parameter groups are made of them by position, and a group's lr would go to other tensors"),
        (lambda p, W: p["what"] == "at_step",
         "rank {rank} ({model}, {dtype}): in step {step}, when loss.backward() returned, {unready} shard(s) had no "
         ".grad yet, and optimizer.step() made {calls} reduce-scatter(s): reduce-scatter each gradient in backward "
         "(a hook, or the backward of an autograd.Function), not at step: until then every rank holds the full "
         "gradients. FSDP reduce-scatters each gradient as soon as the backward has made it, and frees it"),
        (lambda p, W: p["what"] == "at_end",
         "rank {rank} ({model}, {dtype}): in step {step}, {calls} reduce-scatter(s) ran after autograd had made "
         "every gradient (from a callback queued for the end of loss.backward(), or outside the backward): until "
         "then every rank holds the full gradients of the whole model, and no communication overlaps the backward. "
         "Reduce-scatter each gradient as it is made, in the backward (the backward of your autograd.Function, or "
         "a hook), so that its full gradient can be freed"),
        (lambda p, W: p["what"] == "order",
         "rank {rank} ({model}): parameters() lists {got} tensors and the module has {want} parameters: list one "
         "shard per parameter, in the order of module.named_parameters() (the grader makes parameter groups of "
         "them, as a student of FSDP2 does)"),
        (lambda p, W: p["what"] == "frozen",
         "rank {rank} ({model}, {dtype}): a frozen parameter (requires_grad=False, 2.0 everywhere) moved by up to "
         "{moved:.3g} in step {step} ({got:.6g} on average): its shard must not require grad either (shard.requires_grad_(p.requires_grad)), so "
         "that it gets no gradient and the optimizer skips it"),
        (lambda p, W: p["what"] == "unused",
         "rank {rank} ({model}): a parameter not used in step {step} moved by {moved:.3g} in that step: no "
         "gradient reached it, so its shard's .grad must stay None, not zeros (SGD's momentum moves a zero-gradient "
         "parameter; torch skips one whose .grad is None)"),
        (lambda p, W: p["what"] == "no_full",
         "rank {rank} ({model}, {dtype}): full_parameters() {error}: return {{name: the whole parameter, float32}} "
         "for every name of module.named_parameters(), all-gathered from the shards on every rank"),
        (lambda p, W: p["what"] == "master_built",
         "rank {rank} ({model}, {dtype}): right after MyFSDP(...) was built, every value of your float32 shards is "
         "a {dtype} number: the master weights were rounded to the compute dtype, and training starts from other "
         "weights than the module's. Cut the shards from the float32 parameters as they are; cast to "
         "compute_dtype only what the forward uses"),
        (lambda p, W: p["what"] == "full_params",
         "rank {rank} ({model}, {dtype}): the outputs agree with one process's, but after {steps} steps "
         "full_parameters()['{name}'] differs from its parameter by {max_diff:.3g}: gather every rank's shard, cut "
         "the padding and reshape to the parameter's shape, in float32"),
        (lambda p, W: p["what"] == "output" and p["variant"] == "sum",
         "rank {rank} ({model}, {dtype}): after {steps} steps the model is one process's trained on the sum of "
         "the ranks' gradients: divide the reduce-scattered gradient by the world size, {W}"),
        (lambda p, W: p["what"] == "output" and p["variant"] == "last",
         "rank {rank} ({model}, {dtype}): after {steps} steps the model is one process's whose step 2 used the "
         "gradient of its second backward only: two backward() calls before step() must add up their gradients "
         "in the shards' .grad (gradient accumulation, as torch and FSDP do): return the shard's gradient from the "
         "backward (autograd adds it to .grad) or add to shard.grad, do not overwrite it"),
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
        check=check_sharded_adam, hints=HINTS, collectives_only=True, on_success=_bytes_held,
        what="three steps equal torch.optim.Adam in one process, with the moments sharded over the ranks (none "
             "kept outside the optimizer) and step() reduce-scattering the gradients, not all-reducing or "
             "all-gathering them whole"),
    CodingExercise(
        id="07.5", template="07_zero1_any.py", entry="ShardedOptimizer", world_sizes=(2, 3),
        check=check_sharded_any, hints=HINTS, collectives_only=True,
        what="SGD with momentum, Adam, AdamW and RMSprop equal one process's, also with a frozen parameter, one "
             "unused in every other step and two parameter groups, with each rank holding about 1/world of the "
             "optimizer's state (none kept outside it: not in a module-level variable, Python objects or a file) "
             "and step() reduce-scattering, not all-reducing, the gradients and all-gathering the updated "
             "slices"),
    CodingExercise(
        id="07.6", template="07_my_fsdp.py", entry="MyFSDP", world_sizes=(2, 3),
        check=check_my_fsdp, hints=HINTS, collectives_only=True,
        what="three SGD steps equal one process's on an MLP and on a model with a tied weight, in float32 and "
             "computing in bfloat16, with each rank holding about 1/world of the parameters between steps "
             "(none kept whole elsewhere: not in a module-level variable, Python objects or a file), all-gathered "
             "(or broadcast by their owners) for the forward and their gradients reduce-scattered"),
]
