"""Context parallelism from scratch: ring attention and Ulysses (notebooks/08_context_and_experts.ipynb).

The sequence of S tokens is split over the n ranks of the default process group (ring attention: or of the
group passed, e.g. a DeviceMesh's "cp" dimension in ``capstone_train.py``); every tensor here is
``[B, H, L, D]`` (batch, heads, local tokens L = S/n, head size D), fp32 (the partial results are kept in the
input's dtype: for bf16 inputs a real kernel keeps them in fp32), on the group's device.

* **Ring attention** (:func:`ring_attention`, Liu et al. 2023, "Ring Attention with Blockwise
  Transformers"): each rank keeps its queries; the key/value blocks travel around the ring (n-1
  exchanges in forward), and the partial results are merged with the log-sum-exp rule (:func:`merge`,
  the online softmax of FlashAttention). Backward is written by hand, FlashAttention-style: the key/value
  blocks travel again, carrying their gradients dK, dV, which come home after n hops. Bytes each rank
  sends, with ``B_kv`` the bytes of its local K (V is the same size): forward ``2(n-1) B_kv``, backward
  ``2(n-1) B_kv + 2n B_kv`` (for n > 1; nothing for n = 1).
* **Layouts** (:func:`chunk_ranges`): "contiguous" gives rank r tokens [rL, (r+1)L); with a causal mask
  rank n-1 then does n blocks of work and rank 0 one. "zigzag" cuts the sequence into 2n chunks and gives
  rank r chunks r and 2n-1-r: every rank does 2n+1 quarter-blocks (the zig-zag split of Megatron-LM's
  context parallelism and of ring-flash-attention; Striped Attention, Brandon et al. 2023, deals the
  tokens round-robin instead, to the same end).
* **Ulysses** (:func:`ulysses_attention`, Jacobs et al. 2023, "DeepSpeed Ulysses"): an all-to-all turns
  the sequence shards of q, k, v into head shards ``[B, H/n, S, D]``, each rank runs ordinary attention
  on its heads, and a second all-to-all turns the output back. Each all-to-all sends ``(n-1)/n`` of the
  local tensor: ``4 (n-1)/n B_kv`` per rank in forward and the same in backward. Needs n | H.

Communication is counted in a ``log`` dict the caller passes (``{"bytes_sent": int, "messages": int,
"score_elems": int, "peak_block_elems": int, "compute_s": float}``), so a lesson can put the measured bytes
beside the formula. ``compute_s`` is the CPU time of this rank's thread in the attention blocks
(``time.thread_time``, waits excluded; on a GPU it would count kernel launches only): the work per rank.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist


def chunk_ranges(rank: int, world: int, seq_len: int, layout: str = "contiguous") -> list[tuple[int, int]]:
    """The global token ranges ``[(start, end), ...]`` rank ``rank`` holds, in the order they are stored.

    Raises:
        ValueError: an unknown layout, or ``seq_len`` not divisible by ``world`` (contiguous) or
            ``2 * world`` (zigzag).
    """
    if layout == "contiguous":
        if seq_len % world:
            raise ValueError(f"sequence length {seq_len} is not divisible by the world size {world}")
        size = seq_len // world
        return [(rank * size, (rank + 1) * size)]
    if layout == "zigzag":
        if seq_len % (2 * world):
            raise ValueError(f"zigzag needs the sequence length ({seq_len}) divisible by 2 x world size "
                             f"({2 * world})")
        c = seq_len // (2 * world)
        return [(rank * c, (rank + 1) * c), ((2 * world - 1 - rank) * c, (2 * world - rank) * c)]
    raise ValueError(f"unknown layout {layout!r}: use 'contiguous' or 'zigzag'")


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (sequence along ``dim``), in :func:`chunk_ranges` order."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in chunk_ranges(rank, world, x.shape[dim], layout)], dim)


def merge(out1, lse1, out2, lse2):
    """Merge two partial attention results over disjoint key sets into the result over their union.

    ``out_i`` ``[..., L, D]`` is softmax attention over key set i, ``lse_i`` ``[..., L]`` the log of
    its softmax denominator (log-sum-exp of the scores). Set 1 holds the share
    ``e^lse1 / (e^lse1 + e^lse2) = sigmoid(lse1 - lse2)`` of the union's softmax mass, so
    ``out = lerp(out2, out1, share)`` and ``lse = logaddexp(lse1, lse2)``: neither exponentiates a
    large lse. A row with no keys yet has lse = -inf and out = 0 (two empty parts: the difference
    is taken as 0, not nan). Lesson 08 uses it until the student's merge (08.3) passes.
    """
    gap = torch.where(lse1 == lse2, torch.zeros_like(lse1), lse1 - lse2)     # -inf - -inf would be nan
    out = torch.lerp(out2, out1, torch.sigmoid(gap).unsqueeze(-1))
    return out, torch.logaddexp(lse1, lse2)


def _exchange(tensors, log, group=None):
    """Send tensors to rank+1 and receive the same shapes from rank-1 (of ``group``), all posted at once."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))   # P2POp: global
    tensors = [t.contiguous() for t in tensors]
    recv = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, peer((rank + 1) % n), group) for t in tensors] + \
          [dist.P2POp(dist.irecv, r, peer((rank - 1) % n), group) for r in recv]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    log["bytes_sent"] += sum(t.numel() * t.element_size() for t in tensors)
    log["messages"] += len(tensors)
    return recv


def _pairs(q_ranges, k_ranges, causal, device):
    """(q rows, k rows, mask or None) for every chunk pair with at least one visible key; the mask (True:
    hidden) is made on ``device``, where the scores are."""
    out, qo = [], 0
    for qa, qb in q_ranges:
        ko = 0
        for ka, kb in k_ranges:
            if not (causal and ka >= qb):                    # all keys after all queries: skipped
                mask = None
                if causal and kb > qa + 1:                   # some key after some query
                    mask = (torch.arange(qa, qb, device=device)[:, None]
                            < torch.arange(ka, kb, device=device)[None, :])
                out.append((slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), mask))
            ko += kb - ka
        qo += qb - qa
    return out


def _scores(q, k, mask, scale):
    s = q @ k.transpose(-2, -1) * scale
    return s.masked_fill(mask, float("-inf")) if mask is not None else s


class RingAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(D) [+ causal mask]) v over the whole ring; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, ranges, causal, log, merge_fn, group=None):
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        kv = (k, v)
        for step in range(n):
            owner = (rank - step) % n                        # whose keys/values this rank holds now
            t0 = time.thread_time()
            for qs, ks, mask in _pairs(ranges[rank], ranges[owner], causal, q.device):
                s = _scores(q[..., qs, :], kv[0][..., ks, :], mask, scale)
                log["score_elems"] += s.numel()
                log["peak_block_elems"] = max(log["peak_block_elems"], s.numel())
                blk_lse = torch.logsumexp(s, -1)
                blk_out = torch.softmax(s, -1) @ kv[1][..., ks, :]
                out[..., qs, :], lse[..., qs] = merge_fn(out[..., qs, :], lse[..., qs],
                                                         blk_out, blk_lse)
            log["compute_s"] += time.thread_time() - t0
            if step < n - 1:
                kv = tuple(_exchange(kv, log, group))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ranges, ctx.causal, ctx.log, ctx.group = ranges, causal, log, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, n = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1)                         # D_i = sum_j P_ij dP_ij, per query row
        dq = torch.zeros_like(q)
        kv, dkv = (k, v), (torch.zeros_like(k), torch.zeros_like(v))
        for step in range(n):
            owner = (rank - step) % n
            t0 = time.thread_time()
            for qs, ks, mask in _pairs(ctx.ranges[rank], ctx.ranges[owner], ctx.causal, q.device):
                kb, vb = kv[0][..., ks, :], kv[1][..., ks, :]
                p = torch.exp(_scores(q[..., qs, :], kb, mask, scale) - lse[..., qs].unsqueeze(-1))
                dkv[1][..., ks, :] += p.transpose(-2, -1) @ dout[..., qs, :]
                ds = p * (dout[..., qs, :] @ vb.transpose(-2, -1) - delta[..., qs].unsqueeze(-1))
                dq[..., qs, :] += ds @ kb * scale
                dkv[0][..., ks, :] += ds.transpose(-2, -1) @ q[..., qs, :] * scale
            ctx.log["compute_s"] += time.thread_time() - t0
            if n > 1:                                        # gradients travel with their block...
                moved = _exchange(kv + dkv if step < n - 1 else dkv, ctx.log, ctx.group)
                if step < n - 1:
                    kv, dkv = tuple(moved[:2]), tuple(moved[2:])
                else:
                    dkv = tuple(moved)
        return dq, dkv[0], dkv[1], None, None, None, None, None    # ...and are home after n hops


def new_log() -> dict:
    """An empty communication/work log for :func:`ring_attention` and :func:`ulysses_attention`."""
    return {"bytes_sent": 0, "messages": 0, "score_elems": 0, "peak_block_elems": 0, "compute_s": 0.0}


def ring_attention(q, k, v, *, seq_len: int, layout: str = "contiguous", causal: bool = False, log=None,
                   merge_fn=merge, group=None):
    """Ring attention over ``group`` (default: the default group; the capstone passes its mesh's "cp" group):
    q, k, v ``[B, H, L, D]`` are this rank's tokens in :func:`chunk_ranges` order (rank = its rank in the
    group); returns this rank's output rows ``[B, H, L, D]``, differentiable. ``merge_fn`` (default
    :func:`merge`) combines the partial results: exercise 08.3 passes the student's."""
    n = dist.get_world_size(group)
    ranges = [chunk_ranges(r, n, seq_len, layout) for r in range(n)]
    return RingAttention.apply(q, k, v, ranges, causal, new_log() if log is None else log, merge_fn, group)


class _SeqToHeads(torch.autograd.Function):
    """``[B, H, L, D]`` sequence shard -> ``[B, H/n, S, D]`` head shard with one all-to-all (and back)."""

    @staticmethod
    def forward(ctx, x, log, inverse):
        ctx.log, ctx.inverse = log, inverse
        return _heads_from_seq(x, log) if not inverse else _seq_from_heads(x, log)

    @staticmethod
    def backward(ctx, g):
        return (_seq_from_heads(g, ctx.log) if not ctx.inverse else _heads_from_seq(g, ctx.log)), None, None


def _all_to_all(x, log):
    """all_to_all_single along dim 0 (one equal part per rank), counting the bytes that leave the rank."""
    x = x.contiguous()
    out = torch.empty_like(x)                       # contiguous too: the collective writes it in order
    dist.all_to_all_single(out, x)
    n = dist.get_world_size()
    log["bytes_sent"] += x.numel() * x.element_size() * (n - 1) // n
    log["messages"] += n - 1
    return out


def _heads_from_seq(x, log):
    b, h, l, d = x.shape
    n = dist.get_world_size()
    parts = x.reshape(b, n, h // n, l, d).transpose(0, 1)          # [n: destination, B, H/n, L, D]
    got = _all_to_all(parts, log)                                  # [n: source rank, B, H/n, L, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * l, d)


def _seq_from_heads(x, log):
    b, hn, s, d = x.shape
    n = dist.get_world_size()
    parts = x.reshape(b, hn, n, s // n, d).permute(2, 0, 1, 3, 4)   # [n: destination (its tokens), ...]
    got = _all_to_all(parts, log)                                   # [n: source (its heads), B, H/n, L, D]
    return got.transpose(0, 1).reshape(b, n * hn, s // n, d)


def ulysses_attention(q, k, v, *, causal: bool = False, log=None):
    """Ulysses attention over the default group: q, k, v ``[B, H, L, D]`` are contiguous sequence
    shards; returns this rank's output rows ``[B, H, L, D]``, differentiable.

    Raises:
        ValueError: the number of heads is not divisible by the world size (Ulysses' limit).
    """
    n, log = dist.get_world_size(), new_log() if log is None else log
    if q.shape[1] % n:
        raise ValueError(f"Ulysses splits the heads: {q.shape[1]} heads are not divisible by {n} "
                         "ranks (use ring attention, or a world size that divides the heads)")
    qh, kh, vh = (_SeqToHeads.apply(t, log, False) for t in (q, k, v))
    log["score_elems"] += qh.shape[0] * qh.shape[1] * qh.shape[2] * kh.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return _SeqToHeads.apply(out, log, True)
