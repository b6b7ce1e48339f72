"""The small models the launch scripts train: a CNN, an MLP factory and a residual MLP of transformer MLP
blocks (digits in, 10 logits out), a byte-level GPT-2 (:func:`byte_gpt2`, lessons 06 and 11), and a small
Llama-style decoder (:class:`TinyLlama`, the capstone's one model for every parallelism, ``capstone_train.py``).

Introduced in ``notebooks/03_ddp.ipynb`` (``SmallCNN`` in ``ddp_train.py``, ``make_mlp`` in
``ddp_internals.py``); lessons 07 and 09 reuse them. Also: :func:`ddp_recording_buckets`, DDP with a
communication hook that records the bytes of every bucket it all-reduces (lessons 03 and 07), and
:class:`TiedMLP`, an MLP that uses one weight twice (the graders of exercises 03.7 and 07.6).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """(B, 1, 8, 8) float32 -> (B, 10) logits; two 3x3 convolutions and two linear layers, 38,282 parameters."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class MLPBlock(nn.Module):
    """A transformer's MLP sub-block with its residual: ``h + down(gelu(up(norm(h))))``, (B, width) -> (B, width).
    ``up`` is [4 width, width], ``down`` [width, 4 width]: the pair Megatron splits by columns and rows."""

    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, h):
        return h + self.down(F.gelu(self.up(self.norm(h))))


class ResidualMLP(nn.Module):
    """Digits (B, 1, 8, 8) or (B, 64) float32 -> Linear(64, width) -> ``layers`` :class:`MLPBlock` (in
    ``self.blocks``, the units FSDP2 shards one by one) -> Linear(width, 10) logits. Width 64 and 4 layers:
    137,674 parameters. Used by ``fsdp2_scale.py`` (lessons 06 and 07)."""

    def __init__(self, width: int = 64, layers: int = 4):
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(MLPBlock(width) for _ in range(layers))
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        h = self.inp(x.flatten(1))
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class TiedMLP(nn.Module):
    """An MLP whose two middle layers share one weight (as tied input and output embeddings do): that weight is
    used twice in a step, model.parameters() lists it once, each layer's parameters(recurse=False) once
    each; its gradient is the sum of both uses and is ready once, after both (03.7, 07.6). A buffer, the
    input's centre ``centre`` [64] (zeros), is subtracted from the input, as a normalisation's running mean
    is: DDP broadcasts buffers with the parameters, and so must 03.7's wrapper."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.inp, self.a, self.b, self.out = (nn.Linear(64, width), nn.Linear(width, width),
                                              nn.Linear(width, width), nn.Linear(width, 10))
        self.b.weight = self.a.weight
        self.register_buffer("centre", torch.zeros(64))

    def forward(self, x):
        return self.out(torch.relu(self.b(torch.relu(self.a(torch.relu(self.inp(x - self.centre.to(x.dtype))))))))


def make_mlp(width: int, depth: int, d_in: int = 64, d_out: int = 10, flatten: bool = False) -> nn.Sequential:
    """An MLP of ``depth`` hidden Linear+ReLU layers of size ``width``, then Linear to ``d_out``.

    Args:
        width: hidden size.
        depth: number of hidden layers (>= 0); the model has ``depth + 1`` Linear layers.
        d_in, d_out: input features and output logits.
        flatten: start with ``nn.Flatten()`` so images (B, 1, 8, 8) go in directly (lesson 09);
            without it the input is (B, d_in).

    Returns:
        ``nn.Sequential`` mapping (B, d_in) (or (B, 1, 8, 8) with ``flatten``) float32 to (B, d_out) logits.
        ``make_mlp(128, 1, flatten=True)`` is lesson 09's 9,610-parameter model.

    Raises:
        ValueError: a negative depth or a non-positive width.
    """
    if depth < 0 or width < 1:
        raise ValueError(f"make_mlp needs depth >= 0 and width >= 1, got depth={depth}, width={width}")
    layers, d = ([nn.Flatten()] if flatten else []), d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, d_out))


def ddp_recording_buckets(model: nn.Module, cap_mb: float | None = None, warm=None):
    """DDP around a model already on its device, with a hook that records every all-reduce it launches.

    The hook does exactly what DDP's default does (``default_hooks.allreduce_hook``: average the
    bucket over the ranks) and appends the bucket's size in bytes to a list.

    Args:
        model: the module to wrap (its parameters on ``cuda:local_rank`` with NCCL, on the CPU with gloo).
        cap_mb: DDP's ``bucket_cap_mb``; None keeps DDP's default (25 MiB, and a small first bucket).
        warm: ``(x, y)``: run one step first, then clear the gradients and the record (DDP rebuilds
            its buckets after its first iteration, so the record then shows the steady state).

    Returns:
        ``(ddp, sizes)``: the wrapped model and the list that receives each bucket's bytes. Without an
        initialized process group: ``(model, [])``, the bare model.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    sizes: list[int] = []
    if not dist.is_initialized():
        return model, sizes
    dev = next(model.parameters()).device
    kw = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, **kw)

    def counting_hook(state, bucket):  # the same all-reduce as DDP's default, plus bookkeeping
        sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    if warm is not None:
        F.cross_entropy(ddp(warm[0]), warm[1]).backward()
        ddp.zero_grad(set_to_none=True)
        sizes.clear()
    return ddp, sizes


def byte_gpt2(layers: int = 2, embd: int = 64, heads: int = 4, seq: int = 64, seed: int = 0):
    """A randomly initialised byte-level ``transformers.GPT2LMHeadModel`` (vocab 256, dropout 0: runs are comparable).

    Args:
        layers, embd, heads: depth, width (d_model) and attention heads; seq: the context length (positions).
        seed: ``torch.manual_seed`` before the weights are drawn (same seed, same model on every rank).

    Returns:
        the model in fp32 on the CPU; input ids are bytes (0..255), ``model(x, labels=x).loss`` is the
        next-byte cross-entropy. Introduced in ``notebooks/06_hybrid_parallel.ipynb`` (``hybrid_gpt2.py``).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=256, n_positions=seq, n_embd=embd, n_layer=layers, n_head=heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).float()
    model.loss_type = "ForCausalLM"   # the loss HF uses anyway; naming it silences a notice
    return model


class LlamaConfig:
    """The shape of a :class:`TinyLlama`. Defaults: 4 layers, d_model 64, 4 query heads sharing 2 key/value heads,
    SwiGLU hidden 128, vocabulary 256 (bytes): 164,416 parameters; 10 steps at 8 ranks on 2 cores take seconds.

    Args:
        vocab, width, layers, heads, kv_heads, ffn: vocabulary, d_model, decoder blocks, query heads, key/value
            heads (grouped-query attention: ``heads`` divisible by ``kv_heads``), SwiGLU hidden size.
        experts, top_k: ``experts > 0`` replaces every SwiGLU by a mixture of ``experts`` experts of hidden
            ``ffn``, ``top_k`` per token (the layer is passed to :class:`TinyLlama`: lesson 08's
            :class:`mgpu_utils.parallel.experts.MoE`).
        rope_base: the rotary embedding's base (10,000 as in Llama). eps: RMSNorm's epsilon.

    Raises:
        ValueError: a width not divisible by ``heads``, an odd head dimension, or ``heads`` not divisible by
            ``kv_heads``.
    """

    def __init__(self, vocab: int = 256, width: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 ffn: int = 128, experts: int = 0, top_k: int = 2, rope_base: float = 10000.0, eps: float = 1e-5):
        if width % heads or (width // heads) % 2 or heads % kv_heads:
            raise ValueError(f"TinyLlama needs width ({width}) divisible by heads ({heads}) into an even head "
                             f"dimension, and heads divisible by kv_heads ({kv_heads})")
        self.vocab, self.width, self.layers, self.heads, self.kv_heads, self.ffn = vocab, width, layers, heads, \
            kv_heads, ffn
        self.experts, self.top_k, self.rope_base, self.eps = experts, top_k, rope_base, eps

    def __repr__(self):
        return "LlamaConfig(" + ", ".join(f"{k}={v}" for k, v in vars(self).items()) + ")"


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2, last dim) + eps) * weight``, (..., width) -> (..., width); ``weight`` [width] starts at 1
    (Zhang and Sennrich 2019). Under tensor parallelism with sequence parallelism the weight is replicated and
    its gradient must be summed over the ranks that hold different tokens."""

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, base: float = 10000.0, positions=None):
    """Rotary position embedding (Su et al. 2021, in the rotate-half form of GPT-NeoX and HF's Llama).

    Args:
        x: (B, S, H, D) queries or keys, position s at index s of dim 1; D even.
        positions: None, or (S,) int64, the global position of each of the S tokens (a context-parallel rank
            holds a slice of the sequence, or two: ``mgpu_utils.parallel.layouts``, capstone_train.py).
    Returns:
        (B, S, H, D): each pair (x_i, x_{i + D/2}) rotated by the angle ``s * base^(-2i/D)``, so that the dot
        product of a rotated query and key depends on their positions' difference only.
    """
    s, d = x.shape[1], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)            # [D/2]
    pos = torch.arange(s, device=x.device) if positions is None else positions.to(x.device)
    ang = pos.to(torch.float32)[:, None] * inv                                                  # [S, D/2]
    cos, sin = (torch.cat([f(ang)] * 2, -1)[None, :, None, :].to(x.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings, (B, S, width) -> (B, S, width).

    ``wq`` [heads hd, width], ``wk`` and ``wv`` [kv_heads hd, width], ``wo`` [width, heads hd] (hd = width / heads),
    no biases. Query head h reads key/value head ``h // (heads / kv_heads)``. The head count is read from the
    projections' output (``view(B, S, -1, hd)``), so a tensor-parallel rank holding a slice of the heads' rows
    (``wq`` and ``wk``/``wv`` split by columns, ``wo`` by rows; kv_heads divisible by tp) runs the same code."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.hd, self.base = cfg.width // cfg.heads, cfg.rope_base
        self.wq = nn.Linear(cfg.width, cfg.heads * self.hd, bias=False)
        self.wk = nn.Linear(cfg.width, cfg.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(cfg.width, cfg.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(cfg.heads * self.hd, cfg.width, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.hd) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, self.base), rotary(k, self.base)
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)                 # GQA: share kv heads
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` (Shazeer 2020), (..., width) -> (..., width); w1, w3 [ffn, width], w2 [width, ffn]."""

    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.w2 = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoEFeedForward(nn.Module):
    """A mixture-of-experts layer on (B, S, width) activations: the tokens are flattened to rows (T, width), routed
    by ``moe_layer(width, ffn, experts, top_k)`` (a module returning ``(rows, routing)``, as lesson 08's
    :class:`mgpu_utils.parallel.experts.MoE` does), and put back; the last call's routing is in ``self.routing``."""

    def __init__(self, cfg: LlamaConfig, moe_layer):
        super().__init__()
        self.moe, self.routing = moe_layer(cfg.width, cfg.ffn, cfg.experts, cfg.top_k), None

    def forward(self, x):
        y, self.routing = self.moe(x.reshape(-1, x.shape[-1]))
        return y.view_as(x)


class DecoderBlock(nn.Module):
    """Pre-norm block: ``h = x + attention(attention_norm(x))``, ``out = h + feed_forward(ffn_norm(h))``."""

    def __init__(self, cfg: LlamaConfig, moe_layer=None):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(cfg.width, cfg.eps), RMSNorm(cfg.width, cfg.eps)
        self.attention = GroupedQueryAttention(cfg)
        self.feed_forward = MoEFeedForward(cfg, moe_layer) if cfg.experts else SwiGLU(cfg.width, cfg.ffn)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    """A small Llama-style decoder: token ids (B, S) int64 -> logits (B, S, vocab) float32 (the capstone's model).

    ``tok_embeddings`` [vocab, width] -> ``layers`` (an ``nn.ModuleDict`` of :class:`DecoderBlock` keyed "0", "1",
    ...) -> ``norm`` (:class:`RMSNorm`) -> ``output`` (Linear, no bias), whose weight *is* the embedding's (tied:
    ``named_parameters()`` lists it once, as ``tok_embeddings.weight``). Weights: N(0, 0.02) for every Linear and
    the embedding, norms at 1.

    A pipeline stage is the same model with parts removed (:func:`pipeline_stage`): ``tok_embeddings`` None (not
    the first stage: the input is already (B, S, width) activations), blocks deleted from ``layers`` (the others
    keep their keys, so their parameter names are the full model's), ``norm`` and ``output`` None (not the last:
    the output is the activations). A last stage that is not also the first keeps the tied weight as its own
    ``output.weight``, whose gradient must be summed with the first stage's (Megatron-LM does the same).

    ``moe_layer``: with ``cfg.experts > 0``, the mixture-of-experts class (:class:`MoEFeedForward`); the package's
    top modules import no room, so the caller passes lesson 08's ``mgpu_utils.parallel.experts.MoE``.

    Raises:
        ValueError: ``cfg.experts > 0`` without ``moe_layer``.
    """

    def __init__(self, cfg: LlamaConfig, moe_layer=None):
        super().__init__()
        if cfg.experts and moe_layer is None:
            raise ValueError("LlamaConfig(experts=...) needs the layer: TinyLlama(cfg, moe_layer=MoE) with "
                             "from mgpu_utils.parallel.experts import MoE")
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.width)
        self.layers = nn.ModuleDict({str(i): DecoderBlock(cfg, moe_layer) for i in range(cfg.layers)})
        self.norm = RMSNorm(cfg.width, cfg.eps)
        self.output = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            h = block(h)
        return self.output(self.norm(h)) if self.output is not None else h


def tiny_llama(cfg: LlamaConfig | None = None, seed: int = 0, moe_layer=None) -> TinyLlama:
    """A :class:`TinyLlama` of ``cfg`` (default :class:`LlamaConfig`; ``moe_layer`` as there) drawn after
    ``torch.manual_seed(seed)``: the same weights in every process and every layout (``capstone_train.py``).
    fp32, on the CPU."""
    torch.manual_seed(seed)
    return TinyLlama(cfg or LlamaConfig(), moe_layer)


def pipeline_stage(model: TinyLlama, s: int, n: int) -> TinyLlama:
    """Stage ``s`` of ``n`` of ``model``, in place: blocks ``s L/n ... (s+1) L/n - 1`` (L = ``len(model.layers)``),
    the embedding on the first stage, the final norm and output on the last (the capstone's pipelines).
    Chained, the ``n`` stages of ``n`` copies compute the model's logits.

    Raises:
        ValueError: ``n`` does not divide the blocks, or ``s`` is not in 0 .. n-1.
    """
    per = len(model.layers) // n
    if per * n != len(model.layers) or not 0 <= s < n:
        raise ValueError(f"stage {s} of {n}: needs 0 <= stage < {n} and {n} dividing the {len(model.layers)} blocks")
    for key in [k for k in model.layers if not s * per <= int(k) < (s + 1) * per]:
        del model.layers[key]
    if s > 0:
        model.tok_embeddings = None
    if s < n - 1:
        model.norm = model.output = None
    return model
