"""The graded coding exercises of lesson 04, collectives (notebooks/04_collectives.ipynb): 04.4 ring
all-gather and 04.5 ring reduce-scatter from point-to-point messages, 04.6 a hang to fix.

04.4 and 04.5 are checked on every rank against dist.all_gather and reduce-scatter, with every collective
switched off for the student's code (:func:`~mgpu_utils.measure.comm_calls.point_to_point_only`). 04.6 is a
script that runs itself: it starts from :func:`start_values` and ends with :func:`emit_every_rank`, and
:func:`_every_rank_hint` (its judge, in the notebook) reads rank 0's result. The hints of the problems the
checks report and the exercises' records are here too.
"""

from __future__ import annotations

import contextlib

import os

import torch
import torch.distributed as dist

from mgpu_utils.compat import reduce_scatter_single
from mgpu_utils.dist import emit_result
from mgpu_utils.grading.common import CodingExercise, always, diff, note
from mgpu_utils.measure.comm_calls import point_to_point_only


def start_values(rank: int, n: int = 4, seed: int | None = None) -> torch.Tensor:
    """Exercise 04.6's numbers: ``n`` whole numbers (float32, shape (n,)) of rank ``rank``'s own, drawn from
    ``seed`` (default: ``MGPU_GRADE_SEED``, 0 when unset). The grader picks a new seed for every run, so the
    sum over the ranks cannot be written down in advance: it has to be communicated. Each is 1 to 99, and 100
    more at position ``rank % n``: with up to ``n`` ranks each rank holds the largest number somewhere, so the
    element-wise maximum over the ranks is no rank's own numbers (a ReduceOp.MAX is not taken for a
    broadcast)."""
    seed = int(os.environ.get("MGPU_GRADE_SEED", "0")) if seed is None else seed
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    t = torch.randint(1, 100, (n,), generator=g).float()
    t[rank % n] += 100
    return t


def emit_every_rank(ctx, t: torch.Tensor) -> None:
    """Exercise 04.6's result line: every rank's ``t``, gathered on rank 0 by a collective of its own (so
    the grader sees what each rank ends with, not only rank 0)."""
    every = [None] * ctx.world_size
    if dist.is_initialized():
        dist.all_gather_object(every, t.tolist())
    else:
        every = [t.tolist()]
    emit_result({"world_size": ctx.world_size, "every_rank": every, "total": sum(every[0])})


#: Elements of the large message of 04.4 and 04.5: 4 Mi float32, 16 MiB, more than a TCP socket buffers (Linux: at
#: most 4 MiB sent and 6 MiB received by default), so a blocking send waits for its receiver.
LARGE = 1 << 22


@contextlib.contextmanager
def empty_is_nan():
    """Within the block torch.empty and its kin fill floating-point tensors with NaN (torch's deterministic mode,
    warnings only: nothing refused), so that a slot the student never wrote shows as NaN, not as whatever the
    memory held (5.6e+37 one run, 2e+03 the next)."""
    import torch.utils.deterministic as det

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              det.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        det.fill_uninitialized_memory = before[2]


def check_all_gather(fn, ctx, problems):
    """04.4: ``fn(x)`` against ``dist.all_gather`` for lengths 1, 7 and :data:`LARGE` (float32), point-to-point
    only. The large message outgrows the sockets' buffers: two blocking calls in the same order on every rank
    (send, then receive) deadlock there, as they would on NCCL at any size."""
    world, rank = ctx.world_size, ctx.rank
    for length in (1, 7, LARGE):
        x = torch.arange(length, dtype=torch.float32) + 1000.0 * (rank + 1)
        with point_to_point_only("04.4", fn), empty_is_nan():
            out = fn(x.clone())
        ref = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(ref, x)
        if not isinstance(out, (list, tuple)) or len(out) != world:
            note(problems, {"rank": rank, "kind": "shape", "want": f"a list of {world} tensors",
                            "got": f"{len(out)} tensors" if isinstance(out, (list, tuple)) else type(out).__name__})
            continue
        shared = _one_tensor_twice(out)
        if shared:                                    # [t] * W, or one receive buffer for every step
            note(problems, {"rank": rank, "kind": "aliased", "first": shared[0], "second": shared[1],
                            "length": length})
            continue
        for j, (o, r) in enumerate(zip(out, ref)):
            if not isinstance(o, torch.Tensor) or o.shape != r.shape:
                note(problems, {"rank": rank, "kind": "shape", "got": str(getattr(o, "shape", type(o).__name__)),
                                "want": str(r.shape), "index": j})
            elif diff(o, r):
                same = [i for i, q in enumerate(ref) if q.shape == o.shape and diff(o, q) == 0]
                note(problems, {"rank": rank, "kind": "entry", "index": j, "length": length, "max_diff": diff(o, r),
                                "equals_rank": same[0] if same else None, "unwritten": bool(o.isnan().any())})


def _one_tensor_twice(out) -> tuple[int, int] | None:
    """The first two entries of ``out`` that share memory (one tensor twice in the list, or views of one
    buffer that overlap), or None."""
    spans = []
    for j, o in enumerate(out):
        if isinstance(o, torch.Tensor) and o.numel():
            start = o.data_ptr()
            spans.append((j, o.untyped_storage().data_ptr(), start, start + o.numel() * o.element_size()))
    for a, (i, si, lo_i, hi_i) in enumerate(spans):
        for j, sj, lo_j, hi_j in spans[a + 1:]:
            if si == sj and lo_i < hi_j and lo_j < hi_i:
                return i, j
    return None


def _partial_sum(out, shares, rank) -> tuple[int, list[int]] | None:
    """Which chunk ``out`` is, summed over which ranks, when that is a proper subset of two or more ranks
    (``shares[s][j]``: rank s's chunk j): (chunk, ranks), this rank's own chunk first, or None."""
    import itertools

    world = len(shares)
    for j in [rank] + [c for c in range(world) if c != rank]:
        for size in range(2, world):
            for ranks in itertools.combinations(range(world), size):
                if diff(out, sum(shares[s][j] for s in ranks)) == 0:
                    return j, list(ranks)
    return None


def check_reduce_scatter(fn, ctx, problems):
    """04.5: ``fn(x)``, x of world_size * k elements, against reduce-scatter for k = 1, 3 and :data:`LARGE`,
    point-to-point only (the large chunks deadlock blocking calls, as in :func:`check_all_gather`)."""
    world, rank = ctx.world_size, ctx.rank
    for k in (1, 3, LARGE):
        # small integers (every sum is exact), not linear in the rank: a mean over the ranks is no rank's share
        x = (torch.arange(world * k) % 251).float() * (rank + 1) + rank * rank
        with point_to_point_only("04.5", fn):
            out = fn(x.clone())
        ref = torch.empty(k)
        reduce_scatter_single(ref, x)
        wrong_shape = not isinstance(out, torch.Tensor) or out.shape != ref.shape
        bad = torch.tensor([float(wrong_shape or bool(diff(out, ref)))])
        dist.all_reduce(bad)                          # every rank gathers the inputs below, or none does
        xs = [torch.empty_like(x) for _ in range(world)]
        if bad.item():
            dist.all_gather(xs, x)
        if wrong_shape:
            note(problems, {"rank": rank, "kind": "shape", "got": str(getattr(out, "shape", type(out).__name__)),
                            "want": str(ref.shape)})
        elif diff(out, ref):
            total = sum(xs).chunk(world)
            same = [j for j in range(world) if diff(out, total[j]) == 0]          # another chunk's full sum
            alone = [j for j in range(world) if diff(out, xs[j].chunk(world)[rank]) == 0]   # one rank's share
            part = _partial_sum(out, [t.chunk(world) for t in xs], rank) if k < LARGE else None
            note(problems, {"rank": rank, "kind": "value", "k": k, "max_diff": diff(out, ref),
                            "equals_chunk": same[0] if same else None, "one_rank": alone[0] if alone else None,
                            "mean": diff(out, ref / world) < 1e-4 * (1 + ref.abs().max().item()),
                            "part_chunk": part[0] if part else None, "part_ranks": part[1] if part else None})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "shape": [(always, "rank {rank}: returned {got}, expected {want}")],
    "entry": [
        (lambda p, W: p.get("equals_rank") is not None,
         "rank {rank}: the entry for rank {index} holds rank {equals_rank}'s tensor (world size {W}). At step s a "
         "rank forwards what it received at step s - 1: the tensor of rank (rank - s) mod W, and receives that of "
         "rank (rank - s - 1) mod W"),
        (lambda p, W: p.get("unwritten") and p["index"] == p["rank"],
         "rank {rank}: its own entry, out[{rank}], was never written (world size {W}, length {length}): it still holds "
         "what torch.empty_like left there, and the ring forwarded that. Put a copy of this rank's x there before "
         "the first step"),
        (lambda p, W: p.get("unwritten"),
         "rank {rank}: the entry for rank {index} was never written (world size {W}, length {length}): it still "
         "holds what torch.empty_like left there. Each of the W - 1 steps must receive one tensor from the left "
         "into its own slot, and wait for it"),
        (always, "rank {rank}: the entry for rank {index} differs from dist.all_gather's by {max_diff:.3g} (world size "
                 "{W}, length {length}): was it received into the right slot, and waited for before use?")],
    "aliased": [
        (always, "rank {rank}: the entries for ranks {first} and {second} are one and the same tensor (world size "
                 "{W}, length {length}): [t] * W repeats one tensor W times, and a buffer reused for every receive is "
                 "one tensor too, so each receive overwrites the last. Give every entry a tensor of its own "
                 "(torch.empty_like per entry, or a new one per step)")],
    "value": [
        (lambda p, W: p.get("mean"),
         "rank {rank}: returned the mean over the {W} ranks of chunk {rank}, not their sum (world size {W}): "
         "reduce-scatter sums (its default op, ReduceOp.SUM); do not divide by the world size"),
        (lambda p, W: p.get("one_rank") is not None and p["one_rank"] == p["rank"],
         "rank {rank}: returned its own share of chunk {rank}, unchanged (world size {W}): nothing from the other "
         "ranks was added"),
        (lambda p, W: p.get("one_rank") is not None,
         "rank {rank}: returned rank {one_rank}'s share of chunk {rank} alone (world size {W}): the partial sums "
         "were replaced on the way, not added to"),
        (lambda p, W: p.get("equals_chunk") is not None and p["equals_chunk"] != p["rank"],
         "rank {rank}: returned the complete sum of chunk {equals_chunk}, not chunk {rank} (world size {W}): start "
         "one chunk earlier, so that after W - 1 steps the chunk completed is rank's own"),
        (lambda p, W: p.get("part_chunk") is not None,
         "rank {rank}: returned chunk {part_chunk} summed over ranks {part_ranks} only, where reduce-scatter gives "
         "chunk {rank} summed over all {W} (world size {W}, chunks of {k}): after W - 1 steps the chunk complete on "
         "a rank is the one its last step received into; make that chunk {rank}, and return it"),
        (always, "rank {rank}: differs from reduce-scatter's chunk by {max_diff:.3g} (world size {W}, chunks of {k}): "
                 "each step must add the incoming partial sum to this rank's copy of the same chunk")],
}


def _every_rank_hint(res: dict, world: int, seed: int) -> str | None:
    """04.6: None when every rank ends with the element-wise sum of every rank's start values, else the hint."""
    starts = [start_values(r, seed=seed).tolist() for r in range(world)]
    want = [sum(col) for col in zip(*starts)]
    every = res.get("every_rank")
    if not isinstance(every, list) or len(every) != world:
        return (f"the script reported no t for each of the {world} ranks (its result: {res}): end it with "
                f"emit_every_rank(ctx, t), as exercises/04_fix_the_hang.py does (a copy made before that line "
                f"existed: start again from it)")
    copied = [j for j in range(world) if all(got == starts[j] for got in every)]
    if copied and world > 1:
        return (f"every rank holds rank {copied[0]}'s numbers {starts[copied[0]]}, not the sum over the ranks {want} "
                f"(world size {world}): a broadcast copies one rank's t and adds nothing; dist.all_reduce sums")
    top, mean = [max(col) for col in zip(*starts)], [w / world for w in want]
    if world > 1 and all(got == top for got in every):          # no rank's own numbers (start_values)
        return (f"rank 0 ends with {top}, the element-wise maximum over the ranks, not their sum {want} (world size "
                f"{world}), and so does every rank: all_reduce's default op, ReduceOp.SUM, adds")
    if world > 1 and all(isinstance(got, list) and len(got) == len(mean)
                         and max(abs(g - m) for g, m in zip(got, mean)) < 1e-4 for got in every):
        return (f"rank 0 ends with {every[0]}, the mean over the {world} ranks, not their sum {want} (world size "
                f"{world}), and so does every rank: the exercise asks for the sum; do not divide by the world size")
    for r, got in enumerate(every):
        if got == want:
            continue
        if got == starts[r]:
            return (f"rank {r} still holds its own numbers {got}, not the sum over the ranks {want} (world size "
                    f"{world}): every rank must end with the sum; dist.reduce leaves it on the destination only, "
                    f"dist.all_reduce on every rank")
        return f"rank {r} ends with {got}, expected the sum over the ranks {want} (world size {world})"
    return None


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="04.4", template="04_ring_all_gather.py", entry="ring_all_gather", world_sizes=(2, 3, 4),
        check=check_all_gather, hints=HINTS,
        what="equal to dist.all_gather for lengths 1, 7 and 4 Mi elements (where blocking calls deadlock), "
             "with point-to-point messages only"),
    CodingExercise(
        id="04.5", template="04_ring_reduce_scatter.py", entry="ring_reduce_scatter", world_sizes=(2, 3, 4),
        check=check_reduce_scatter, hints=HINTS,
        what="equal to reduce-scatter for chunks of 1, 3 and 4 Mi elements (where blocking calls deadlock), "
             "with point-to-point messages only"),
    CodingExercise(
        id="04.6", template="04_fix_the_hang.py", entry=None, world_sizes=(2, 3),
        check=None, hints=HINTS, judge=_every_rank_hint,
        what="every rank ends with the sum, and the job finishes"),
]
