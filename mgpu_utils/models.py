"""The small models the launch scripts train: a CNN, an MLP factory and a residual MLP of transformer MLP
blocks (digits in, 10 logits out), and a byte-level GPT-2 (:func:`byte_gpt2`, lessons 06 and 11).

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
