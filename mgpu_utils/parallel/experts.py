"""A mixture-of-experts layer and expert parallelism from scratch (notebooks/08_context_and_experts.ipynb).

Tokens are rows: ``x`` is ``[T, h]`` (T tokens of width h, fp32). The layer (:class:`MoE`):

* **Router**: ``probs = softmax(x W_g)`` ``[T, E]``; each token goes to its ``top_k`` experts with weight
  ``probs[t, e]`` (not renormalised, so with k = 1 the router still gets a gradient, as in the Switch
  Transformer; Fedus et al. 2021).
* **Capacity** (:func:`route`): an expert takes at most ``C = ceil(capacity_factor * T * k / E)``
  assignments; first choices are served before second choices, earlier tokens before later ones (GShard's
  priority, Lepikhin et al. 2020). The rest are *dropped*: that expert adds nothing to the token (the
  residual path around the layer still carries it). ``capacity_factor=None``: nothing is dropped.
* **Load-balancing loss**: ``E * sum_e f_e P_e`` with ``f_e`` the share of assignments routed to e (before
  dropping) and ``P_e`` the mean router probability of e (Switch Transformer, eq. 4): 1.0 when the load is
  uniform, up to E when one expert takes everything.

**Expert parallelism** (:class:`ExpertParallelMoE`): the router is replicated, the E experts are split
over the ``n`` ranks of a group (rank r holds experts ``r E/n ... (r+1) E/n - 1``), each rank routes its
own tokens, sends each kept assignment to the rank of its expert with one ``all_to_all_single`` of uneven
splits (dispatch), runs its experts on what arrives, and sends the results back with a second one
(combine). Backward does the same two exchanges in reverse (:class:`AllToAll`). With nothing dropped the
outputs equal the one-process layer on all ranks' tokens, and so do the gradients: each expert's directly,
the router's after a sum over ranks. Bytes each rank sends: ``h * 4`` (fp32) per row, for every assignment
it routes to an expert on another rank (dispatch) and every row other ranks routed to its experts (combine);
backward sends the same again. ``log`` also counts those rows (``rows_out``, ``rows_in``).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn


class Expert(nn.Module):
    """One expert: an MLP h -> ffn -> h with GELU."""

    def __init__(self, h: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def route(probs: torch.Tensor, top_k: int, capacity_factor: float | None):
    """Assignments of T tokens to experts, with capacity.

    Args:
        probs: ``[T, E]`` router probabilities (rows sum to 1).
    Returns:
        dict of 1-D tensors over the ``T * top_k`` assignments in priority order (all first
        choices, then all second choices): ``token`` (int64), ``expert`` (int64), ``weight``
        (probs, differentiable), ``keep`` (bool: within capacity); plus ``capacity`` (int or None),
        ``aux`` (the load-balancing loss, differentiable) and ``load`` (``[E]`` int64: assignments
        per expert before dropping).
    """
    t, e = probs.shape
    weight, expert = probs.topk(top_k, dim=-1)                       # [T, k]
    token = torch.arange(t, device=probs.device).repeat(top_k)       # choice-major order
    expert, weight = expert.t().reshape(-1), weight.t().reshape(-1)
    one_hot = torch.nn.functional.one_hot(expert, e)
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1             # place in its expert's queue
    capacity = None if capacity_factor is None else math.ceil(capacity_factor * t * top_k / e)
    keep = torch.ones_like(expert, dtype=torch.bool) if capacity is None else position < capacity
    load = one_hot.sum(0)
    aux = e * ((load.float() / (t * top_k)) * probs.mean(0)).sum()
    return {"token": token, "expert": expert, "weight": weight, "keep": keep, "capacity": capacity,
            "aux": aux, "load": load}


class MoE(nn.Module):
    """The layer on one process: ``forward(x [T, h]) -> (y [T, h], routing dict of :func:`route`)``."""

    def __init__(self, h: int, ffn: int, n_experts: int, top_k: int = 2, capacity_factor: float | None = None):
        super().__init__()
        self.gate = nn.Linear(h, n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(h, ffn) for _ in range(n_experts))
        self.top_k, self.capacity_factor = top_k, capacity_factor

    def forward(self, x):
        r = route(torch.softmax(self.gate(x), -1), self.top_k, self.capacity_factor)
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = r["keep"] & (r["expert"] == e)
            tok = r["token"][sel]
            y = y.index_add(0, tok, expert(x[tok]) * r["weight"][sel, None])
        return y, r


class AllToAll(torch.autograd.Function):
    """Differentiable ``all_to_all_single`` of rows: rank r sends ``send[d]`` rows to rank d and
    receives ``recv[s]`` rows from rank s; backward sends the gradients back, the way reversed."""

    @staticmethod
    def forward(ctx, x, recv, send, group, log):
        ctx.recv, ctx.send, ctx.group, ctx.log = recv, send, group, log
        return _exchange(x, recv, send, group, log)

    @staticmethod
    def backward(ctx, g):
        return _exchange(g, ctx.send, ctx.recv, ctx.group, ctx.log), None, None, None, None


def _exchange(x, recv, send, group, log):
    x = x.contiguous()
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, recv, send, group=group)
    me = dist.get_rank(group)
    row = x[0].numel() * x.element_size() if x.shape[0] else 0
    if log is not None:
        log["bytes_sent"] += (sum(send) - send[me]) * row
    return out


class ExpertParallelMoE(nn.Module):
    """The same layer with its experts split over ``group``: built from a full :class:`MoE` (this rank keeps
    the router and its own E/n experts). ``forward(x [T_r, h])`` takes this rank's tokens.

    ``log`` (optional dict with ``"bytes_sent"``) counts the bytes this rank sends in both all-to-alls.

    Raises:
        ValueError: the number of experts is not divisible by the group's size.
    """

    def __init__(self, full: MoE, group=None):
        super().__init__()
        self.group = group
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if len(full.experts) % n:
            raise ValueError(f"{len(full.experts)} experts cannot be split evenly over {n} ranks")
        self.n_experts, self.local = len(full.experts), len(full.experts) // n
        self.gate = full.gate
        self.experts = nn.ModuleList(full.experts[rank * self.local:(rank + 1) * self.local])
        self.top_k, self.capacity_factor = full.top_k, full.capacity_factor

    def forward(self, x, log=None):
        n = dist.get_world_size(self.group)
        r = route(torch.softmax(self.gate(x), -1), self.top_k, self.capacity_factor)
        kept = r["keep"].nonzero().flatten()
        order = kept[torch.argsort(r["expert"][kept], stable=True)]          # grouped by expert
        counts = torch.bincount(r["expert"][order], minlength=self.n_experts)  # [E] this rank sends
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)                # [n * E/n]: per source
        send = counts.view(n, self.local).sum(1).tolist()
        recv = got.view(n, self.local).sum(1).tolist()
        if log is not None:                                                  # rows to and from other ranks
            me = dist.get_rank(self.group)
            log["rows_out"] = log.get("rows_out", 0) + sum(send) - send[me]
            log["rows_in"] = log.get("rows_in", 0) + sum(recv) - recv[me]
        rows = AllToAll.apply(x[r["token"][order]], recv, send, self.group, log)   # dispatch
        local_id = torch.repeat_interleave(torch.arange(self.local, device=got.device).repeat(n), got)
        outs, where = [], []
        for j, expert in enumerate(self.experts):
            idx = (local_id == j).nonzero().flatten()
            outs.append(expert(rows[idx]))
            where.append(idx)
        done = torch.cat(outs)[torch.argsort(torch.cat(where))] if outs else rows
        back = AllToAll.apply(done, send, recv, self.group, log)             # combine
        y = torch.zeros_like(x).index_add(0, r["token"][order], back * r["weight"][order, None])
        return y, r
