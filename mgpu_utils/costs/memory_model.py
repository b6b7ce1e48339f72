"""Memory per GPU from formulas: model states (ZeRO), transformer activations (Korthikanti et al.);
lesson 07's calculator, and lessons 05, 06, 10 and 10.

Shared by the memory calculator (notebooks/07_memory.ipynb) and the 3-D parallelism planner
(notebooks/06_hybrid_parallel.ipynb). Units: bytes; "GB" in the notebooks is 1e9 bytes, as in the
ZeRO paper.

Sources:

* Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC20),
  section 3.1 and figure 1: mixed-precision Adam keeps 2 bytes (fp16/bf16 parameters) + 2 (gradients)
  + K = 12 (fp32 master parameters, momentum and variance) per parameter; stage 1 shards the
  optimizer states over the data-parallel degree Nd, stage 2 also the gradients, stage 3 also the
  parameters. Their example: 7.5B parameters on 64 GPUs -> 120, 31.4, 16.6 and 1.9 GB per GPU.
* Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023),
  section 4: one transformer layer stores ``s*b*h*(34 + 5*a*s/h)`` bytes of activations (16-bit
  activations, 1-byte dropout masks); with tensor parallelism t: ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``;
  with tensor + sequence parallelism: ``s*b*h/t*(34 + 5*a*s/h)``; selective recomputation drops
  the ``5*a*s/h`` attention term; full recomputation keeps only the layer input, ``2*s*b*h``.
* Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC21): parameters of a GPT layer ``12*h^2 + 13*h``; 1F1B keeps at most p
  micro-batches in flight on the first stage, GPipe all m.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes per parameter for (parameters, gradients, optimizer states) by precision and optimizer.
#: "mixed": 16-bit parameters and gradients, fp32 master copy inside the optimizer states (ZeRO's K).
#: "mixed_fp32_grads": 16-bit parameters, fp32 gradients (Megatron-LM's default for bf16 training,
#: which accumulates and all-reduces gradients in fp32): 18 bytes per parameter with Adam.
#: "fp32": everything in fp32 (the CPU demos of the course).
BYTES_PER_PARAM: dict[tuple[str, str], tuple[int, int, int]] = {
    ("mixed", "adam"): (2, 2, 12),        # master 4 + momentum 4 + variance 4
    ("mixed_fp32_grads", "adam"): (2, 4, 12),  # Megatron-LM: fp32 gradient accumulation buffer
    ("mixed_fp32_grads", "sgd_momentum"): (2, 4, 8),
    ("mixed_fp32_grads", "sgd"): (2, 4, 4),
    ("mixed", "sgd_momentum"): (2, 2, 8),  # master 4 + momentum 4
    ("mixed", "sgd"): (2, 2, 4),          # master 4
    ("fp32", "adam"): (4, 4, 8),          # momentum 4 + variance 4
    ("fp32", "sgd_momentum"): (4, 4, 4),
    ("fp32", "sgd"): (4, 4, 0),
    ("bf16", "adam"): (2, 2, 4),          # pure bf16: states kept in bf16, no master copy
    ("bf16", "sgd_momentum"): (2, 2, 2),
    ("bf16", "sgd"): (2, 2, 0),
}

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by kind. ``total`` is their sum; ``gb()`` the same in GB (1e9 bytes)."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def gb(self) -> dict[str, float]:
        """``{"params", "grads", "optimizer", "activations", "total"}`` in GB (1e9 bytes)."""
        return {k: v / 1e9 for k, v in [("params", self.params), ("grads", self.grads),
                                         ("optimizer", self.optimizer),
                                         ("activations", self.activations), ("total", self.total)]}


def _check_positive(**kw):
    for k, v in kw.items():
        if v < 1 or int(v) != v:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")


def model_state_bytes(n_params: float, *, precision: str = "mixed", optimizer: str = "adam",
                      zero_stage: int = 0, dp: int = 1, tp: int = 1, pp: int = 1) -> MemoryBreakdown:
    """Bytes per GPU of parameters, gradients and optimizer states (no activations).

    The model's ``n_params`` are first split evenly by tensor (``tp``) and pipeline (``pp``)
    parallelism; ZeRO then shards over the ``dp`` data-parallel replicas: stage 1 the optimizer
    states, stage 2 also the gradients, stage 3 also the parameters (FSDP ``fully_shard`` = stage 3;
    ``reshard_after_forward=False`` keeps them gathered from forward to backward, like stage 2
    only there: after backward and between steps the parameters are sharded, as in stage 3).

    Example (ZeRO paper, 7.5B parameters, 64 GPUs, mixed-precision Adam): stage 0/1/2/3 ->
    120 / 31.4 / 16.6 / 1.9 GB.

    Raises:
        ValueError: an unknown precision/optimizer pair or ZeRO stage, or non-positive degrees.
    """
    key = (precision, optimizer)
    if key not in BYTES_PER_PARAM:
        raise ValueError(f"unknown precision/optimizer {key}; known: {sorted(BYTES_PER_PARAM)}")
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}")
    _check_positive(dp=dp, tp=tp, pp=pp)
    if n_params < 0:
        raise ValueError(f"n_params must be >= 0, got {n_params}")
    p_b, g_b, o_b = BYTES_PER_PARAM[key]
    local = n_params / (tp * pp)
    return MemoryBreakdown(params=p_b * local / (dp if zero_stage >= 3 else 1),
                           grads=g_b * local / (dp if zero_stage >= 2 else 1),
                           optimizer=o_b * local / (dp if zero_stage >= 1 else 1))


def transformer_params(n_layers: int, hidden: int, vocab: int, seq_len: int) -> int:
    """Parameters of a GPT-style model: ``L*(12h^2 + 13h) + V*h + s*h + 2h`` (tied embeddings).

    GPT-3 175B (L=96, h=12288, V=50257, s=2048) gives 174.6e9.
    """
    _check_positive(n_layers=n_layers, hidden=hidden, vocab=vocab, seq_len=seq_len)
    return n_layers * (12 * hidden**2 + 13 * hidden) + vocab * hidden + seq_len * hidden + 2 * hidden


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, n_heads: int, *,
                               tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", act_bytes: int = 2) -> float:
    """Activation bytes one transformer layer keeps for backward, per GPU (Korthikanti et al. sec. 4).

    ``act_bytes`` bytes per activation value (default 2: the paper's 16-bit activations; 4 for fp32)
    and 1-byte dropout masks. The paper's 2-byte formula splits into values and masks
    (:func:`activation_elements_per_layer`); with B bytes a value it reads
    ``s*b*h*((4B+2) + 12B/t + (2B+1)*a*s/(h*t))`` (B = 2: ``10 + 24/t + 5*a*s/(h*t)``), with
    sequence parallelism ``s*b*h/t*((16B+2) + (2B+1)*a*s/h)``, full recomputation ``B*s*b*h``
    (÷ t with sequence parallelism). The replicated ``4B+2``: LayerNorm inputs, the inputs of the
    attention and MLP blocks (4 values) and two dropout masks. ``recompute``: "none",
    "selective" (the attention scores/softmax/dropout are recomputed: the ``5*a*s/h`` term goes)
    or "full" (only the layer's input ``2*s*b*h`` bytes are kept, divided by ``tp`` with sequence
    parallelism).

    Raises:
        ValueError: unknown ``recompute`` or non-positive sizes.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, n_heads=n_heads, tp=tp,
                    act_bytes=act_bytes)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a, t, B = seq_len, micro_batch, hidden, n_heads, tp, act_bytes
    if recompute == "full":
        return B * s * b * h / (t if sequence_parallel else 1)
    attn = 0.0 if recompute == "selective" else (2 * B + 1) * a * s / h
    if sequence_parallel:
        return s * b * h / t * (16 * B + 2 + attn)
    return s * b * h * (4 * B + 2 + 12 * B / t + attn / t)


def activation_elements_per_layer(seq_len: int, micro_batch: int, hidden: int, n_heads: int) -> dict:
    """What :func:`activation_bytes_per_layer` counts (no parallelism, no recomputation), as elements.

    ``{"values": 16*s*b*h + 2*a*s^2*b, "masks": 2*s*b*h + a*s^2*b}``: values are the saved
    activations (2 bytes each in the paper), masks the dropout masks (1 byte each), so
    ``2 * values + masks`` is the paper's ``s*b*h*(34 + 5*a*s/h)``. Multiply by your own element
    sizes to compare with a measurement (fp32: 4 bytes a value; PyTorch's CPU dropout keeps a mask
    in the input's dtype, CUDA's a 1-byte bool). LayerNorm's per-token mean and rstd are not counted.
    """
    _check_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, n_heads=n_heads)
    sbh, as2b = seq_len * micro_batch * hidden, n_heads * seq_len**2 * micro_batch
    return {"values": 16 * sbh + 2 * as2b, "masks": 2 * sbh + as2b}


def in_flight_micro_batches(schedule: str, pp: int, n_micro: int) -> int:
    """Micro-batches whose activations the first pipeline stage holds at its peak.

    "gpipe": all ``n_micro`` (every forward runs before any backward); "1f1b": ``min(pp, n_micro)``;
    "none" (no pipeline): 1.

    Raises:
        ValueError: unknown schedule.
    """
    if schedule == "gpipe":
        return n_micro
    if schedule == "1f1b":
        return min(pp, n_micro)
    if schedule == "none":
        return 1
    raise ValueError(f"schedule must be 'gpipe', '1f1b' or 'none', got {schedule!r}")


def memory_per_gpu(n_layers: int, hidden: int, n_heads: int, vocab: int, seq_len: int,
                   micro_batch: int, *, n_params: float | None = None, precision: str = "mixed",
                   optimizer: str = "adam", zero_stage: int = 0, dp: int = 1, tp: int = 1,
                   pp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                   schedule: str = "1f1b", n_micro: int = 1, act_bytes: int = 2) -> MemoryBreakdown:
    """Model states plus activations per GPU for a GPT-style model (first pipeline stage, the fullest).

    ``n_params`` defaults to :func:`transformer_params`. Activations: ``n_layers/pp`` layers per
    stage times the micro-batches in flight (:func:`in_flight_micro_batches`) times
    :func:`activation_bytes_per_layer` (``act_bytes`` bytes a value, default 2 as in the paper).
    Embedding/logit activations are left out (small for large h), and so is the first stage's
    share of the embedding weights: model states are ``n_params/(tp*pp)``. Returns a :class:`MemoryBreakdown` in bytes.

    Raises:
        ValueError: ``n_layers`` not divisible by ``pp``, ``n_heads`` or ``hidden`` not divisible by
        ``tp``, or any error of the functions above.
    """
    _check_positive(n_layers=n_layers, pp=pp, tp=tp)
    if n_layers % pp:
        raise ValueError(f"n_layers={n_layers} is not divisible by pp={pp}; pick pp from its divisors")
    if n_heads % tp or hidden % tp:
        raise ValueError(f"hidden={hidden} and n_heads={n_heads} must be divisible by tp={tp}")
    if n_params is None:
        n_params = transformer_params(n_layers, hidden, vocab, seq_len)
    states = model_state_bytes(n_params, precision=precision, optimizer=optimizer,
                               zero_stage=zero_stage, dp=dp, tp=tp, pp=pp)
    act = (n_layers // pp) * in_flight_micro_batches(schedule if pp > 1 else "none", pp, n_micro) \
        * activation_bytes_per_layer(seq_len, micro_batch, hidden, n_heads, tp=tp,
                                     sequence_parallel=sequence_parallel, recompute=recompute,
                                     act_bytes=act_bytes)
    return MemoryBreakdown(states.params, states.grads, states.optimizer, act)


def calculate(n_params: float | None = None, *, layers: int = 0, hidden: int = 0, heads: int = 1,
              seq_len: int = 1, micro_batch: int = 1, vocab: int = 50257, precision: str = "mixed",
              optimizer: str = "adam", zero_stage: int = 0, dp: int = 1, tp: int = 1, pp: int = 1,
              recompute: str = "none", sequence_parallel: bool = False) -> MemoryBreakdown:
    """Bytes per GPU of a training configuration.

    Either ``n_params`` alone (model states only, no activations: any model, e.g. an MLP) or a GPT
    shape (``layers``, ``hidden``, ``heads``, ``seq_len``, ``micro_batch``, ``vocab``; ``n_params``
    then defaults to the GPT count) for model states plus Korthikanti activations (1F1B with one
    micro-batch per stage in flight times ``pp``). ``precision``/``optimizer`` pick the bytes per
    parameter (:data:`BYTES_PER_PARAM`), ``zero_stage`` 0-3 shards over ``dp``.
    Activation values take 4 bytes with ``precision="fp32"`` and 2 otherwise, as in the planner
    (:mod:`mgpu_utils.costs.planner`); dropout masks 1 byte.

    Returns:
        :class:`MemoryBreakdown` in bytes.

    Raises:
        ValueError: neither ``n_params`` nor ``layers``/``hidden`` given, or any error of memory_model.
    """
    if layers and hidden:
        return memory_per_gpu(layers, hidden, heads, vocab, seq_len, micro_batch, n_params=n_params,
                              precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=dp,
                              tp=tp, pp=pp, recompute=recompute, sequence_parallel=sequence_parallel,
                              schedule="1f1b", n_micro=pp, act_bytes=4 if precision == "fp32" else 2)
    if n_params is None:
        raise ValueError("give n_params, or a transformer shape with layers and hidden")
    return model_state_bytes(n_params, precision=precision, optimizer=optimizer, zero_stage=zero_stage,
                             dp=dp, tp=tp, pp=pp)
