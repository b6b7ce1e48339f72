"""The vocabulary split over the ranks: embedding, LM head and cross-entropy without gathering the logits,
proven equal to one process (notebooks/05_model_parallel.ipynb).

A small language model, ``embedding (V x h) -> tanh(x W) -> LM head (V x h) -> cross-entropy``, with a large
vocabulary (--vocab). Every rank builds the same model and tokens (one seed) and runs it whole on one
process as the reference; then the vocabulary-parallel version (mgpu_utils.parallel.vocab_parallel): this
rank's V/t rows of the embedding and the head, the cross-entropy from three all-reduces of one number per
token. Checked with assert_close: the per-token losses, the gradients of this rank's embedding and head rows
and of the replicated W, and the losses of --steps SGD steps. Every collective of one training step is
counted with its bytes; the logits this rank holds are measured against the full ones.
Rank 0 prints one JSON line. World size: any that divides --vocab.
    torchrun --standalone --nproc-per-node 4 launch_scripts/vocab_parallel.py
"""
import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.measure.comm_calls import patched_collectives
from mgpu_utils.parallel.vocab_parallel import (VocabParallelEmbedding, lm_head, vocab_parallel_cross_entropy,
                                                vocab_range)


class TinyLM(nn.Module):
    """Embedding, one tanh layer, an untied LM head: the vocabulary layers are most of its parameters."""

    def __init__(self, vocab, width):
        super().__init__()
        self.embed, self.w = nn.Embedding(vocab, width), nn.Linear(width, width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        return self.head(torch.tanh(self.w(self.embed(ids))))


class VocabParallelLM(nn.Module):
    """The same model with this rank's vocabulary rows of the embedding and the head."""

    def __init__(self, full: TinyLM):
        super().__init__()
        self.embed, self.w = VocabParallelEmbedding(full.embed), copy.deepcopy(full.w)   # W: replicated
        first, end = vocab_range(full.head.out_features, dist.get_rank(), dist.get_world_size())
        self.head = nn.Parameter(full.head.weight.detach()[first:end].clone())

    def forward(self, ids):
        return lm_head(torch.tanh(self.w(self.embed(ids))), self.head)      # [tokens, V/t]


def counting(log):
    """Record every collective's name and the bytes of its tensor, and run it."""
    def replace(name, original):
        def call(t, *args, **kwargs):
            log.append((name, t.numel() * t.element_size()))
            return original(t, *args, **kwargs)
        return call
    return replace


def main():
    p = argparse.ArgumentParser(description="vocabulary-parallel embedding, head and cross-entropy")
    p.add_argument("--vocab", type=int, default=32_000, help="vocabulary size V (split over the ranks)")
    p.add_argument("--width", type=int, default=64, help="hidden size h")
    p.add_argument("--tokens", type=int, default=64, help="tokens per step (the same on every rank)")
    p.add_argument("--steps", type=int, default=3, help="SGD steps compared with one process")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized():
            raise SystemExit("needs a process group: run under torchrun (--nproc-per-node 1 works)")
        rank, t, dev = ctx.rank, ctx.world_size, ctx.device
        if args.vocab % t:
            raise SystemExit(f"--vocab {args.vocab} does not split over {t} ranks: pad it to a multiple of {t}")
        torch.manual_seed(args.seed)
        full = TinyLM(args.vocab, args.width).to(dev)
        par = VocabParallelLM(full).to(dev)
        first, end = vocab_range(args.vocab, rank, t)
        g = torch.Generator().manual_seed(args.seed + 1)
        batches = [torch.randint(args.vocab, (2, args.tokens), generator=g).to(dev) for _ in range(args.steps)]
        opt_full = torch.optim.SGD(full.parameters(), lr=0.5)
        opt_par = torch.optim.SGD(par.parameters(), lr=0.5)
        losses, comm = [], []
        for step, (ids, target) in enumerate(batches):
            ref = F.cross_entropy(full(ids), target, reduction="none")
            log = []
            with patched_collectives(counting(log)):
                logits = par(ids)
                mine = vocab_parallel_cross_entropy(logits, target, args.vocab)
                opt_par.zero_grad()
                mine.mean().backward()
            opt_full.zero_grad()
            ref.mean().backward()
            assert_close(mine, ref.detach(), rtol=1e-5, atol=1e-5)
            if step == 0:                         # the gradients of one step, shard by shard
                assert_close(par.embed.weight.grad, full.embed.weight.grad[first:end], rtol=1e-4, atol=1e-7)
                assert_close(par.head.grad, full.head.weight.grad[first:end], rtol=1e-4, atol=1e-7)
                assert_close(par.w.weight.grad, full.w.weight.grad, rtol=1e-4, atol=1e-7)
                comm, local_logit_bytes = log, logits.numel() * logits.element_size()
            opt_full.step()
            opt_par.step()
            losses.append((ref.mean().item(), mine.mean().item()))
        ctx.log(f"vocabulary of {args.vocab} over {t} ranks: losses equal one process for {args.steps} steps "
                f"({losses[-1][1]:.4f} vs {losses[-1][0]:.4f}); logits held {local_logit_bytes:,} B per rank "
                f"instead of {args.tokens * args.vocab * 4:,} B; one step's collectives: {comm}")
        emit_result({"world_size": t, "backend": ctx.backend, "vocab": args.vocab, "width": args.width,
                     "tokens": args.tokens, "losses": losses, "collectives_step0": comm,
                     "logit_bytes_rank": local_logit_bytes, "logit_bytes_full": args.tokens * args.vocab * 4,
                     "vocab_param_bytes_rank": 2 * (end - first) * args.width * 4,
                     "vocab_param_bytes_full": 2 * args.vocab * args.width * 4})


if __name__ == "__main__":
    main()
