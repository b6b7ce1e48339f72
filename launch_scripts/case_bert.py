"""Case study: BERT masked-language modelling with DDP, offline (for lesson 10, case studies).

transformers' BertForMaskedLM from a small BertConfig (random weights: nothing is downloaded), a WordPiece
tokenizer built here with the tokenizers library from the word counts of text that ships with Python
(mgpu_utils.text_data.stdlib_docstrings), and DataCollatorForLanguageModeling (15% of the tokens chosen:
80% of those become [MASK], 10% a random token, 10% stay). Every rank draws the same global batch (same
seed per step) and takes its rows, so --check-grads can compare DDP's first gradient with one process on
the whole global batch (dropout off).

The loss each rank backpropagates is the sum over its masked tokens divided by the masked tokens of the
whole global batch, times the world size: DDP's average of those is exactly the global batch's mean. (Each
rank's own mean would weight ranks with few masked tokens as much as ranks with many.)

BERT itself was trained by Google on TPUs with TensorFlow, not with PyTorch DDP; this is the same
objective, at a size that trains on a laptop.

Rank 0 prints one JSON line (MGPU_RESULT): world_size, vocab_size, params, global_batch, seq, losses (the
global batch's masked-token loss per step), masked_per_rank (masked tokens of each rank's rows at step 0),
samples_per_s, and with --check-grads grad_max_diff and grad_scale.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/case_bert.py --steps 400
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.text_data import stdlib_docstrings
from mgpu_utils.timing import synced_clock

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_tokenizer(text: str, vocab_size: int):
    """A BERT-style WordPiece tokenizer for ``text`` (tokenizers' normaliser, pre-tokeniser and WordPiece model),
    as a transformers PreTrainedTokenizerFast. The vocabulary: the special tokens, every character alone and as
    a "##" continuation, then the most frequent words (ties by spelling). Deterministic, unlike tokenizers'
    WordPieceTrainer, whose ties follow hash order: two processes would disagree on the token ids."""
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    norm, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(w for line in text.splitlines() for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    chars = sorted({c for w in words for c in w})
    vocab = SPECIAL + chars + ["##" + c for c in chars]
    known = set(vocab)
    ranked = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if w not in known]
    vocab += ranked[:max(0, vocab_size - len(vocab))]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = norm, pre, decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def chunks(tokenizer, text: str, seq: int) -> torch.Tensor:
    """The text as rows of ``seq`` token ids: [CLS] + seq - 2 tokens + [SEP] each."""
    ids = tokenizer(text.replace("\n", " "), add_special_tokens=False)["input_ids"]
    n = (len(ids) // (seq - 2)) * (seq - 2)
    body = torch.tensor(ids[:n]).view(-1, seq - 2)
    col = lambda t: torch.full((len(body), 1), tokenizer.convert_tokens_to_ids(t))
    return torch.cat([col("[CLS]"), body, col("[SEP]")], dim=1)


def main():
    p = argparse.ArgumentParser(description="BERT MLM with DDP")
    g = p.add_argument_group("model and data")
    g.add_argument("--vocab", type=int, default=2000, help="WordPiece vocabulary size")
    g.add_argument("--width", type=int, default=128, help="d_model, the hidden size (4x in the feed-forward layers)")
    g.add_argument("--layers", type=int, default=2, help="transformer layers")
    g.add_argument("--heads", type=int, default=2, help="attention heads (must divide --width)")
    g.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=400, help="optimizer steps")
    g.add_argument("--per-rank-batch", type=int, default=8, help="sequences per rank per step")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--check-grads", action="store_true", help="compare the first step with one process")
    args = p.parse_args()

    with distributed() as ctx, exact_fp32():
        from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling

        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        text = stdlib_docstrings()
        tokenizer = train_tokenizer(text, args.vocab)        # the same on every rank (deterministic)
        rows = chunks(tokenizer, text, args.seq)
        collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")
        cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=args.width, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, intermediate_size=4 * args.width, max_position_embeddings=args.seq,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(0)
        model = BertForMaskedLM(cfg).to(device)
        reference = BertForMaskedLM(cfg).to(device) if args.check_grads and rank == 0 else None
        if reference is not None:
            reference.load_state_dict(model.state_dict())
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if dist.is_initialized() \
            else model
        opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
        result, losses, global_batch = {}, [], args.per_rank_batch * world
        t0 = synced_clock(device)
        # region mlm-loss
        for step in range(args.steps):
            torch.manual_seed(1000 + step)             # the same global batch and masks on every rank
            pick = torch.randint(0, len(rows), (global_batch,))
            batch = collate([{"input_ids": r} for r in rows[pick]])
            masked = (batch["labels"] != -100).sum().item()
            if step == 0:                               # unequal: why each rank's own mean would be wrong
                result["masked_per_rank"] = (batch["labels"] != -100).view(world, -1).sum(1).tolist()
            mine = slice(rank * args.per_rank_batch, (rank + 1) * args.per_rank_batch)
            x, y = batch["input_ids"][mine].to(device), batch["labels"][mine].to(device)
            logits = ddp(input_ids=x).logits
            token_sum = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-100,
                                        reduction="sum")
            (token_sum * world / masked).backward()     # DDP averages: the global batch's mean
        # endregion
            if step == 0 and args.check_grads:                # the check is not training: not timed
                tc = synced_clock(device)
                result.update(check_first_step(reference, model, batch, device, rank))
                t0 += synced_clock(device) - tc
            opt.step()
            opt.zero_grad(set_to_none=True)
            total = token_sum.detach().clone()
            if dist.is_initialized():
                dist.all_reduce(total)
            losses.append((total / masked).item())
        elapsed = synced_clock(device) - t0
        ctx.log(f"MLM loss {losses[0]:.2f} -> {losses[-1]:.2f} in {args.steps} steps")
        result.update(world_size=world, vocab_size=len(tokenizer), params=sum(q.numel() for q in model.parameters()),
                      global_batch=global_batch, seq=args.seq, losses=losses,
                      samples_per_s=args.steps * global_batch / elapsed)
        emit_result(result, rank)


def check_first_step(reference, model, batch, device, rank) -> dict:
    """Rank 0: the DDP gradient against one process on the whole global batch (HF's own mean loss)."""
    out = {}
    if rank == 0:
        loss = reference(input_ids=batch["input_ids"].to(device), labels=batch["labels"].to(device)).loss
        loss.backward()
        ref = torch.cat([q.grad.reshape(-1) for q in reference.parameters() if q.grad is not None])
        got = torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None])
        out = {"grad_max_diff": (got - ref).abs().max().item(), "grad_scale": ref.abs().max().item()}
    return out


if __name__ == "__main__":
    main()
