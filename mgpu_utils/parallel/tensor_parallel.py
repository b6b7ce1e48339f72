"""Megatron-style tensor parallelism from scratch (notebooks/05_model_parallel.ipynb,
launch_scripts/tensor_parallel.py).

Notation: t = tensor-parallel ranks, x of shape ``(b, s, h)`` (batch, sequence, hidden), fp32.

* Column-parallel linear ``Y = X A``: A is split by output columns, ``A = [A_1 ... A_t]``; rank r
  computes ``Y_r = X A_r`` (its slice of the output features), no communication.
* Row-parallel linear ``Z = Y B``: B is split by input rows, ``B = [B_1; ...; B_t]``; rank r computes
  the partial sum ``Y_r B_r`` and ``Z = sum_r Y_r B_r`` needs one all-reduce.
* MLP ``Z = gelu(X A) B``: column then row parallel, so the gelu works on local columns and the whole
  block costs one all-reduce forward (operator g) and one backward (operator f, which is the identity
  forward and all-reduces the input gradient, since every rank's X fed only its own A_r).
* Attention: heads are independent, so rank r keeps heads ``r*a/t .. (r+1)*a/t`` (rows of W_q, W_k,
  W_v: column parallel) and the matching columns of W_o (row parallel): again one all-reduce each way.
* Sequence parallelism: between the blocks the activations are split along the sequence instead of
  replicated; f becomes an all-gather (backward: reduce-scatter), g a reduce-scatter (backward:
  all-gather). Same bytes as the all-reduce (all-reduce = reduce-scatter + all-gather), but the
  LayerNorm/dropout activations are stored once, not t times. A parameter applied in the
  sequence-split region (fc2's bias here; a LayerNorm's weight and bias) sees only this rank's
  tokens, so its gradient is a partial sum: :class:`TPMLP` passes the bias through f
  (:class:`CopyToTP`: identity forward, all-reduce backward), which sums it over the ranks, a small
  ``h``-sized all-reduce per parameter (Megatron-LM all-reduces these gradients after backward).

Every collective these functions issue is appended to :data:`COMM_LOG` as
``{"op", "phase" ("forward"|"backward"), "bytes"}`` (bytes of the full tensor the operation produces
or reduces), so a run can count its communication. Without a process group (world size 1) the
collectives are skipped, but still logged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mgpu_utils.compat import all_gather_single, reduce_scatter_single

#: Every collective issued by the functions below: {"op", "phase", "bytes"}.
COMM_LOG: list[dict] = []


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _all_reduce(t, phase, group=None):
    """Sum ``t`` in place over ``group`` (None: every rank); skipped without a process group or on one rank."""
    COMM_LOG.append({"op": "all_reduce", "phase": phase, "bytes": t.numel() * t.element_size()})
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)
    return t


def _all_gather(t, dim, phase):
    """Concatenate every rank's ``t`` along ``dim``."""
    r, n = _world()
    COMM_LOG.append({"op": "all_gather", "phase": phase, "bytes": n * t.numel() * t.element_size()})
    if n == 1:
        return t
    t = t.movedim(dim, 0).contiguous()
    out = torch.empty((n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    all_gather_single(out, t)
    return out.movedim(0, dim)


def check_split(size: int, n: int, what: str, fix: str) -> None:
    """Raise ValueError(naming ``fix``) unless ``size`` splits evenly over ``n`` ranks."""
    if size % n:
        raise ValueError(f"{what} {size} does not split evenly over {n} ranks: {fix}")


def sequence_slice(s: int, rank: int, n: int) -> slice:
    """This rank's part of a sequence of length ``s`` for sequence parallelism (input of
    ``TPMLP(..., sequence_parallel=True)``): positions ``rank*s/n .. (rank+1)*s/n``.

    Raises:
        ValueError: ``s`` not divisible by ``n`` (uneven parts would make the all-gather fail).
    """
    check_split(s, n, "sequence length", f"use a sequence length (--seq) that is a multiple of {n}")
    return slice(rank * s // n, (rank + 1) * s // n)


def valid_world_sizes(*sizes: int) -> list[int]:
    """World sizes that divide every one of ``sizes`` (e.g. heads, ffn, seq): the divisors of their gcd."""
    import math
    g = math.gcd(*sizes)
    return [d for d in range(1, g + 1) if g % d == 0]


def _reduce_scatter(t, dim, phase):
    """Sum over ranks, then keep this rank's 1/n slice along ``dim``.

    Raises:
        ValueError: ``t.shape[dim]`` (the sequence length) is not divisible by the world size.
    """
    r, n = _world()
    check_split(t.shape[dim], n, f"dimension {dim} of size", "use a sequence length divisible by the world size")
    COMM_LOG.append({"op": "reduce_scatter", "phase": phase, "bytes": t.numel() * t.element_size()})
    if n == 1:
        return t
    t = t.movedim(dim, 0).contiguous()
    out = torch.empty((t.shape[0] // n, *t.shape[1:]), dtype=t.dtype, device=t.device)
    reduce_scatter_single(out, t)
    return out.movedim(0, dim)


class CopyToTP(torch.autograd.Function):
    """Operator f: identity forward, all-reduce of the gradient backward. ``CopyToTP.apply(x)``
    over every rank, ``CopyToTP.apply(x, group)`` over the tensor-parallel group of a larger mesh
    (launch_scripts/hybrid_3d.py)."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.contiguous(), "backward", ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """Operator g: all-reduce forward (sum of the partial results), identity backward; ``group``
    as for :class:`CopyToTP`."""

    @staticmethod
    def forward(ctx, x, group=None):
        return _all_reduce(x.contiguous(), "forward", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class GatherFromSP(torch.autograd.Function):
    """Sequence parallel f: all-gather along the sequence (dim 1) forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x):
        return _all_gather(x, 1, "forward")

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, 1, "backward")


class ScatterToSP(torch.autograd.Function):
    """Sequence parallel g: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter(x, 1, "forward")

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, 1, "backward")


class MLP(nn.Module):
    """The dense reference: ``fc2(gelu(fc1(x)))``, h -> ffn -> h."""

    def __init__(self, h: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """The dense reference: causal multi-head self-attention with separate q, k, v, o projections.

    ``view(b, s, -1, head_dim)`` lets the same code run on a rank's share of the heads (DTensor)."""

    def __init__(self, h: int, n_heads: int):
        super().__init__()
        check_split(h, n_heads, "hidden size", f"use --width a multiple of --heads {n_heads}")
        self.head_dim = h // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (lin(x).view(b, s, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def _shard(t: torch.Tensor, dim: int, rank: int, n: int) -> nn.Parameter:
    if t.shape[dim] % n:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} is not divisible by {n} ranks")
    return nn.Parameter(t.detach().chunk(n, dim)[rank].clone())


class TPMLP(nn.Module):
    """Column-parallel fc1, row-parallel fc2, built from a dense :class:`MLP` (rank r keeps its shards).

    Input: x replicated ``(b, s, h)``, or with ``sequence_parallel`` this rank's sequence slice
    ``(b, s/t, h)`` (s divisible by t: take it with :func:`sequence_slice`, which checks); output in
    the same layout. One all-reduce forward and one
    backward (or one all-gather + one reduce-scatter each way with sequence parallelism, plus the
    backward all-reduce of fc2's bias gradient, which saw only this rank's tokens: after backward
    ``b2.grad`` is the full gradient on every rank, nothing left for the caller to sum).

    Raises:
        ValueError: ffn not divisible by the world size; with ``sequence_parallel``, an input whose
            gathered sequence length is not divisible by it.
    """

    def __init__(self, dense: MLP, sequence_parallel: bool = False):
        super().__init__()
        r, n = _world()
        self.sp = sequence_parallel
        self.w1, self.b1 = _shard(dense.fc1.weight, 0, r, n), _shard(dense.fc1.bias, 0, r, n)  # A_r: out rows
        self.w2 = _shard(dense.fc2.weight, 1, r, n)                                            # B_r: in columns
        self.b2 = nn.Parameter(dense.fc2.bias.detach().clone())      # added once, after the reduction

    def forward(self, x):
        if self.sp:
            x = GatherFromSP.apply(x)
            partial = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)
            # the bias gradient: summed over the ranks
            return ScatterToSP.apply(partial) + CopyToTP.apply(self.b2)
        x = CopyToTP.apply(x)
        partial = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)
        return ReduceFromTP.apply(partial) + self.b2


class TPAttention(nn.Module):
    """Heads split across ranks, built from a dense :class:`Attention`: rank r keeps heads
    ``r*a/t .. (r+1)*a/t`` (rows of q, k, v) and the matching input columns of o.

    Raises:
        ValueError: the number of heads is not divisible by the world size.
    """

    def __init__(self, dense: Attention, n_heads: int):
        super().__init__()
        r, n = _world()
        if n_heads % n:
            raise ValueError(f"{n_heads} heads do not split over {n} ranks")
        self.head_dim = dense.head_dim
        self.wq, self.wk, self.wv = (_shard(lin.weight, 0, r, n) for lin in (dense.q, dense.k, dense.v))
        self.bq, self.bk, self.bv = (_shard(lin.bias, 0, r, n) for lin in (dense.q, dense.k, dense.v))
        self.wo = _shard(dense.o.weight, 1, r, n)
        self.bo = nn.Parameter(dense.o.bias.detach().clone())

    def forward(self, x):
        b, s, _ = x.shape
        x = CopyToTP.apply(x)
        q, k, v = (F.linear(x, w, bias).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w, bias in ((self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        return ReduceFromTP.apply(F.linear(y, self.wo)) + self.bo


def tp_bytes_per_layer(b: int, s: int, h: int, t: int, bytes_per_el: int = 4, sequence_parallel: bool = False) -> dict:
    """Communication of one transformer layer (attention + MLP) per rank, forward and backward.

    Without sequence parallelism: 2 all-reduces of ``b*s*h`` elements forward and 2 backward; with
    it, 2 all-gathers + 2 reduce-scatters each way, the same bytes. Per rank, a ring all-reduce of S
    bytes sends ``2(t-1)/t * S``; an all-gather or reduce-scatter of S (the full tensor) ``(t-1)/t * S``.

    Returns:
        ``{"collectives_per_pass", "tensor_bytes", "sent_per_rank_per_pass"}`` (bytes).
    """
    size = b * s * h * bytes_per_el
    calls = 4 if sequence_parallel else 2
    sent = 2 * (t - 1) / t * size * 2                 # same with SP: 4 x (t-1)/t x S
    return {"collectives_per_pass": calls, "tensor_bytes": size, "sent_per_rank_per_pass": sent}
