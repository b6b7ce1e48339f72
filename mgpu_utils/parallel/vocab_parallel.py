"""The vocabulary split over tensor-parallel ranks: embedding, LM head and cross-entropy that never gather
the logits (notebooks/05_model_parallel.ipynb, launch_scripts/vocab_parallel.py).

A language model's largest layers are often its vocabulary layers: V x h weights (V = 50,257 for GPT-2,
128,256 for Llama 3) and, worse, ``[tokens, V]`` logits. Megatron-LM splits the vocabulary over the t ranks
of the tensor-parallel group (Shoeybi et al. 2019, section 3; ``VocabParallelEmbedding`` and
``vocab_parallel_cross_entropy``); rank r holds vocabulary rows ``r V/t .. (r+1) V/t - 1``:

* **Embedding** (:class:`VocabParallelEmbedding`): each rank looks up the ids in its range (zeros for the
  others) and one all-reduce of the ``[tokens, h]`` result sums the pieces (backward: none needed, each
  rank's rows get the gradient of their own ids).
* **LM head**: column parallel over the vocabulary, ``logits_r = x W_r^T`` ``[tokens, V/t]``; x enters
  through f (identity forward, all-reduce of its gradient backward), as in lesson 05's MLP.
* **Cross-entropy** (:func:`vocab_parallel_cross_entropy`): ``loss = log sum_v exp(z_v) - z_target`` from
  three all-reduces of one number per token (the max for stability, the sum of exponentials, the target's
  logit, which only its owner has), never the ``[tokens, V]`` logits. Backward needs no communication:
  ``dz_r = softmax_r - onehot_r``, all local.

Bytes each rank holds for the logits: ``tokens x V/t x 4`` instead of ``tokens x V x 4``. Tensors are fp32;
``ids`` and ``target`` are int64 ``[tokens]``. Needs a process group (world size 1 works).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def vocab_range(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """``(first, end)``: the vocabulary rows rank ``rank`` holds.

    Raises:
        ValueError: ``vocab`` not divisible by ``world`` (pad the vocabulary, as Megatron-LM does).
    """
    if vocab % world:
        raise ValueError(f"a vocabulary of {vocab} does not split over {world} ranks: pad it to a multiple "
                         f"of {world} (Megatron-LM pads to a multiple of 128 x the tensor-parallel size)")
    size = vocab // world
    return rank * size, (rank + 1) * size


class _SumOverRanks(torch.autograd.Function):
    """All-reduce forward, identity backward (lesson 05's g)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _CopyToRanks(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient backward (lesson 05's f)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of a full ``nn.Embedding``: ``forward(ids [tokens]) -> [tokens, h]`` on every rank."""

    def __init__(self, full: nn.Embedding):
        super().__init__()
        self.first, self.end = vocab_range(full.num_embeddings, dist.get_rank(), dist.get_world_size())
        self.weight = nn.Parameter(full.weight.detach()[self.first:self.end].clone())

    def forward(self, ids):
        mine = (ids >= self.first) & (ids < self.end)
        local = torch.where(mine, ids - self.first, torch.zeros_like(ids))
        return _SumOverRanks.apply(F.embedding(local, self.weight) * mine.unsqueeze(-1))


def lm_head(x, weight):
    """This rank's logits ``[tokens, V/t]`` from ``x [tokens, h]`` and its rows ``weight [V/t, h]``."""
    return _CopyToRanks.apply(x) @ weight.t()


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, first, end):
        big = logits.max(-1).values.detach()
        dist.all_reduce(big, op=dist.ReduceOp.MAX)                # the largest logit of each token
        z = logits - big.unsqueeze(-1)
        exp = z.exp()
        total = exp.sum(-1)
        dist.all_reduce(total)                                     # sum of exp over the whole vocabulary
        mine = (target >= first) & (target < end)
        local = torch.where(mine, target - first, torch.zeros_like(target))
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine
        dist.all_reduce(picked)                                    # the target's logit, from its owner
        ctx.save_for_backward(exp / total.unsqueeze(-1), local, mine)
        return total.log() - picked

    @staticmethod
    def backward(ctx, g):
        softmax, local, mine = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(len(local), device=grad.device)
        grad[rows, local] -= mine.to(grad.dtype)                   # minus one-hot, where the target is here
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, target, vocab: int):
    """Per-token cross-entropy ``[tokens]`` from this rank's logits ``[tokens, V/t]`` and the targets
    ``[tokens]`` (global ids), equal to ``F.cross_entropy(full_logits, target, reduction="none")``."""
    first, end = vocab_range(vocab, dist.get_rank(), dist.get_world_size())
    return _VocabParallelCE.apply(logits, target, first, end)
