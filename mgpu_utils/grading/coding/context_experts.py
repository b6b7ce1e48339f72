"""The graded coding exercise of lesson 08, context parallelism and experts
(notebooks/08_context_and_experts.ipynb): 08.3, the log-sum-exp merge of two partial attention results.

The check merges two parts at small and large scores and from the empty start against attention over both
key sets, names a wrong merge from the known mistakes' results (:func:`_which_merge`), then runs ring
attention (:mod:`mgpu_utils.parallel.context`) with the student's merge against full attention. The hints of
the problems it reports and the exercise's record are here too.
"""

from __future__ import annotations

import torch

from mgpu_utils.grading.common import CodingExercise, always, diff, note
from mgpu_utils.parallel.context import ring_attention, shard


def _merge_cases(scale: float):
    """Two partial attention results over keys 0-4 and 5-11 and the whole (out, lse), for scores times ``scale``."""
    g = torch.Generator().manual_seed(12)
    q, k, v = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 12, 8, generator=g), torch.randn(2, 3, 12, 8,
                                                                                                       generator=g)
    s = q @ k.transpose(-2, -1) * scale / 8 ** 0.5
    part = lambda a, b: (torch.softmax(s[..., a:b], -1) @ v[:, :, a:b], torch.logsumexp(s[..., a:b], -1))
    return part(0, 5), part(5, 12), part(0, 12), s.abs().max().item()


def _which_merge(got, p1, p2, whole) -> dict:
    """Name a wrong merge from its result on two parts: the first known mistake it equals."""
    (o1, l1), (o2, l2), (out, lse) = p1, p2, whole
    near = lambda a, b: a.shape == b.shape and bool(torch.isfinite(a).all()) and diff(a, b) < 1e-4
    o, l = got
    if near(o, o1) and near(l, l1):
        return {"variant": "first_only"}
    if near(o, out):
        return {"variant": "lse", "lse_is": next((name for name, t in (("max(lse1, lse2)", torch.maximum(l1, l2)),
                                                                        ("lse1 + lse2", l1 + l2), ("lse1", l1),
                                                                        ("lse2", l2)) if near(l, t)),
                                                  "something else")}
    big, both = torch.maximum(l1, l2), torch.logaddexp(l1, l2)
    for name, t in (("average", (o1 + o2) / 2), ("sum", o1 + o2),
                    ("swapped", o1 * (l2 - both).exp()[..., None] + o2 * (l1 - both).exp()[..., None]),
                    ("unnormalised", o1 * l1.exp()[..., None] + o2 * l2.exp()[..., None]),
                    ("max_weights", o1 * (l1 - big).exp()[..., None] + o2 * (l2 - big).exp()[..., None])):
        if near(o, t):
            return {"variant": name}
    return {"variant": "other", "max_diff": diff(o, out) if o.shape == out.shape else float("nan")}


def check_attention_merge(fn, ctx, problems):
    """08.3: ``fn(out1, lse1, out2, lse2)`` on two parts (scores small, up to about 190 where float32's exp
    overflows, and up to about 1,900 where float64's does) and from the empty state, then inside ring attention (mgpu_utils.parallel.context) at this world size against full attention,
    causal and not."""
    rank, world = ctx.rank, ctx.world_size
    for scale in (1.0, 50.0, 500.0):
        p1, p2, whole, top = _merge_cases(scale)
        got = fn(*p1, *p2)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
                and got[0].shape == whole[0].shape and got[1].shape == whole[1].shape):
            return note(problems, {"rank": rank, "kind": "shape", "want": "(out [2, 3, 5, 8], lse [2, 3, 5])",
                                   "got": str([tuple(getattr(t, "shape", ())) for t in got]) if isinstance(
                                       got, (tuple, list)) else type(got).__name__})
        if diff(got[0], whole[0]) < 1e-4 and diff(got[1], whole[1]) < 1e-4:
            continue
        finite = bool(torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all())
        if not finite and scale > 1:
            return note(problems, {"rank": rank, "kind": "merge", "variant": "overflow", "max_score": top})
        return note(problems, {"rank": rank, "kind": "merge", **_which_merge(got, p1, p2, whole)})
    empty = (torch.zeros_like(p2[0]), torch.full_like(p2[1], float("-inf")))
    o, l = fn(*empty, *p2)
    if not (diff(o, p2[0]) < 1e-5 and diff(l, p2[1]) < 1e-5):
        return note(problems, {"rank": rank, "kind": "merge", "variant": "empty",
                               "what": "nan" if bool(torch.isnan(o).any() or torch.isnan(l).any()) else "a wrong value"})
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 12 * world, 8, generator=g) for _ in range(3))
    for causal, layout in ((False, "contiguous"), (True, "zigzag")):
        s = q @ k.transpose(-2, -1) / 8 ** 0.5
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        want = shard(torch.softmax(s, -1) @ v, rank, world, layout)
        got = ring_attention(*(shard(t, rank, world, layout) for t in (q, k, v)), seq_len=12 * world,
                             layout=layout, causal=causal, merge_fn=fn)
        if diff(got, want) > 1e-4 or not bool(torch.isfinite(got).all()):
            return note(problems, {"rank": rank, "kind": "merge", "variant": "ring", "causal": causal,
                                   "max_diff": diff(got, want)})


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "shape": [(always, "rank {rank}: returned {got}, expected {want}")],
    "merge": [
        (lambda p, W: p["variant"] == "first_only",
         "rank {rank}: returned out1 and lse1 unchanged: the keys of the second part were left out"),
        (lambda p, W: p["variant"] == "overflow",
         "rank {rank}: the merge gives inf or nan when the scores are large (here up to {max_score:.0f}): exp() "
         "overflows above about 88 in float32 and 709 in float64. Subtract the larger of lse1 and lse2 before exponentiating (the max "
         "trick of the online softmax), or use torch.logaddexp"),
        (lambda p, W: p["variant"] == "lse",
         "rank {rank}: the output is right, but the lse returned is {lse_is}, not log(exp(lse1) + exp(lse2)): the "
         "next block of the ring merges with this lse, so from the third block on the result goes wrong"),
        (lambda p, W: p["variant"] == "average",
         "rank {rank}: the output is the plain average of out1 and out2: weight each part by its share of the "
         "softmax's mass, exp(lse_i - lse), where lse is the merged one"),
        (lambda p, W: p["variant"] == "sum",
         "rank {rank}: the output is out1 + out2: each part is already normalised over its own keys, so weight "
         "them by exp(lse_i - lse) (the weights sum to 1)"),
        (lambda p, W: p["variant"] == "swapped",
         "rank {rank}: the output weights out1 by exp(lse2 - lse) and out2 by exp(lse1 - lse): the weights are "
         "swapped. Each part's weight is its own share of the softmax's mass, out1 exp(lse1 - lse) + out2 "
         "exp(lse2 - lse)"),
        (lambda p, W: p["variant"] == "unnormalised",
         "rank {rank}: the output is out1 exp(lse1) + out2 exp(lse2), not divided by exp(lse1) + exp(lse2)"),
        (lambda p, W: p["variant"] == "max_weights",
         "rank {rank}: the output weights the parts by exp(lse_i - max(lse1, lse2)): those weights sum to more than "
         "1. Subtract the merged lse, log(exp(lse1) + exp(lse2)), so that the weights are the parts' shares of the "
         "softmax's mass"),
        (lambda p, W: p["variant"] == "empty",
         "rank {rank}: merging into the empty start (out 0, lse -inf: no keys seen yet) gives {what}: with "
         "lse1 = -inf the result must be (out2, lse2); -inf - (-inf) is nan, so subtract the larger lse"),
        (lambda p, W: p["variant"] == "ring",
         "rank {rank}: your merge is right on two parts, but ring attention with it (causal={causal}) differs from "
         "full attention by {max_diff:.3g} at world size {W}: does it change its inputs in place?"),
        (always, "rank {rank}: the merged output differs from attention over both key sets by {max_diff:.3g}: out = "
                 "out1 exp(lse1 - lse) + out2 exp(lse2 - lse) with lse = log(exp(lse1) + exp(lse2))")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="08.3", template="08_merge_attention.py", entry="merge", world_sizes=(2, 3),
        check=check_attention_merge, hints=HINTS,
        what="equal to attention over both key sets (scores up to about 1,900, and from the empty start), and "
             "ring attention with it equals full attention, causal and not"),
]
