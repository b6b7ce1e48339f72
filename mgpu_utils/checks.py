"""Comparisons whose tolerance follows the scale of the values compared (the launch scripts of lessons
02-12, and lessons 03 and 09).

``torch.testing.assert_close``'s default ``atol=1e-5`` is larger than most gradients of a deep MLP
(lesson 03's 11-layer MLP: 93% of the gradient entries are below it), so a layer left un-averaged,
or zeroed, still passes. :func:`assert_tensors_close` scales the absolute tolerance by each tensor's
own largest entry. Introduced in ``notebooks/03_ddp.ipynb`` (the proof of equivalence).

For FSDP2 (lesson 07): :func:`shard_max_diff` compares a sharded model with one process's, shard by shard, and
:func:`check_optimizer_matches` refuses an optimizer built before ``fully_shard`` (it would train nothing).
"""

from __future__ import annotations

from contextlib import contextmanager


def assert_tensors_close(actual, expected, rel: float = 1e-4, names=None) -> float:
    """Assert that each tensor of ``actual`` equals the one of ``expected`` within ``rel`` of its scale.

    For every pair: ``|a - e| <= rel * |e| + rel * max|e|`` element-wise (``rtol = rel`` and
    ``atol = rel * max|e|``), so a tensor of gradients around 1e-6 is held to about 1e-10, not 1e-5.

    Args:
        actual, expected: sequences of tensors of equal shapes (any float dtype, any device).
        rel: the relative tolerance (1e-4 suits fp32 results that differ only in summation order).
        names: optional labels for the tensors (default: their index), used in the error message.

    Returns:
        The largest ``max|a - e| / max|e|`` over the pairs (0 for identical tensors).

    Raises:
        AssertionError: different numbers of tensors, different shapes, or a pair out of tolerance;
            the message names the tensor, its largest difference and its scale.
    """
    import torch

    actual, expected = list(actual), list(expected)
    if len(actual) != len(expected):
        raise AssertionError(f"{len(actual)} tensors against {len(expected)} expected")
    names = list(names) if names is not None else [str(i) for i in range(len(expected))]
    worst = 0.0
    for name, a, e in zip(names, actual, expected):
        a, e = a.detach().double().cpu(), e.detach().double().cpu()
        if a.shape != e.shape:
            raise AssertionError(f"tensor {name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        scale = e.abs().max().item() if e.numel() else 0.0
        diff = (a - e).abs()
        bad = diff > rel * e.abs() + rel * scale
        if bool(bad.any()):
            raise AssertionError(f"tensor {name}: differs by up to {diff.max().item():.3g} where its entries reach "
                                 f"{scale:.3g} (allowed: {rel:g} of that scale)")
        if scale > 0:
            worst = max(worst, diff.max().item() / scale)
    return worst


def max_abs_diff(a, b) -> float:
    """Largest ``|a - b|`` over two tensors or two nested containers of them (dicts with the same keys, lists,
    tuples), in float64; other leaves (ints, strings) must be equal. 0.0 for empty containers and tensors.
    The launch scripts' "max diff vs the reference" numbers (lessons 03, 07, 12).

    Raises:
        AssertionError: the two structures differ (keys, lengths, or a non-tensor value).
    """
    import torch

    if isinstance(a, (dict, list, tuple)):
        assert len(a) == len(b) and (not isinstance(a, dict) or a.keys() == b.keys()), "different structures"
        return max([max_abs_diff(a[k], b[k]) for k in (a if isinstance(a, dict) else range(len(a)))] or [0.0])
    if isinstance(a, torch.Tensor):
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert a == b, (a, b)
    return 0.0


def shard_max_diff(model, ref) -> float:
    """Largest ``|shard - the same slice of ref's parameter|`` over every parameter of ``model`` and every rank.

    ``model``'s parameters are DTensors (FSDP2, tensor parallel, or both); ``ref`` is the same architecture
    with plain tensors (one process's model), in the same parameter order. Each rank cuts its slice from
    ``ref`` locally (``distribute_tensor(..., src_data_rank=None)``), so nothing is gathered; one all-reduce
    (MAX) of a scalar on ``ref``'s device makes the answer the same on every rank. Shards held on the CPU
    (CPU offload) are compared on ``ref``'s device. Used by ``fsdp2_scale.py`` (lessons 06 and 07).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import distribute_tensor

    d = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        mine = distribute_tensor(q.detach(), p.device_mesh, p.placements, src_data_rank=None).to_local()
        d = max(d, (p.to_local().detach().to(q.device) - mine).abs().max().item() if mine.numel() else 0.0)
    t = torch.tensor(d, dtype=torch.float64, device=next(ref.parameters()).device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def check_optimizer_matches(model, optimizer) -> None:
    """Check that every tensor ``optimizer`` updates is one of ``model``'s current parameters (lesson 07, FSDP2).

    ``fully_shard(module)`` replaces each of the module's parameters with a new one, a DTensor holding this
    rank's shard. An optimizer built before it still holds the old, unsharded tensors: they get no gradient,
    so its steps change nothing, no error is raised, and the model never trains (it ends where it started,
    away from one process's result). Call this after building the optimizer, before training; the course's
    FSDP2 scripts do. An optimizer that covers only some of the parameters (frozen layers, or several
    optimizers) passes: only tensors that are not the model's are refused.

    Args:
        model: the module the optimizer should train (after ``fully_shard``, DDP or nothing).
        optimizer: a ``torch.optim.Optimizer`` (its ``param_groups`` are read).

    Returns:
        None; the check passed.

    Raises:
        ValueError: some optimizer tensors are not the model's parameters; the message names the fix:
            build the optimizer after ``fully_shard(...)``.
    """
    current = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    stale = [p for p in held if id(p) not in current]
    if not stale:
        return
    sharded = sum(hasattr(p, "full_tensor") for p in model.parameters())      # DTensors: fully_shard ran
    kinds = "DTensor shards" if sharded else "plain tensors"
    raise ValueError(
        f"the optimizer holds {len(stale)} of its {len(held)} tensors that are not the model's parameters "
        f"(the model's {len(current)} are {kinds}), so optimizer.step() would not change the model. "
        "fully_shard(...) replaces every parameter with a sharded DTensor: build the optimizer after "
        "fully_shard(...), e.g. opt = torch.optim.AdamW(model.parameters()) once the model is sharded")


@contextmanager
def exact_fp32():
    """Turn TF32 off for fp32 matmuls and convolutions inside the block (and cuDNN deterministic), and
    restore the settings after.

    On NVIDIA Ampere and newer GPUs, TF32 runs fp32 matmuls and convolutions with a 10-bit mantissa
    (about 3 significant digits) on the tensor cores: a real speed feature, which cuDNN uses for fp32
    convolutions by default (``torch.backends.cudnn.conv.fp32_precision == "tf32"``). An equivalence
    check (DDP against one process, a sharded layer against the dense one) at ``rel=1e-4`` would then
    compare rounding, not algorithms, so every check in this course runs its fp32 work inside this
    block: ``torch.backends.cuda.matmul.fp32_precision`` and ``torch.backends.cudnn.conv.fp32_precision``
    are set to ``"ieee"`` (on torch older than 2.9, ``allow_tf32 = False`` on both). It changes
    nothing on a CPU, where fp32 is always IEEE. It also asks cuDNN for deterministic algorithms (no
    atomic adds in convolution weight gradients), so two runs of the same GPU job compare exactly. Used
    by the launch scripts whose results are compared (``notebooks/03_ddp.ipynb`` explains TF32).
    """
    import torch

    b = torch.backends
    cudnn_saved = (b.cudnn.deterministic, b.cudnn.benchmark)
    b.cudnn.deterministic, b.cudnn.benchmark = True, False     # no atomics in cuDNN's weight gradients
    try:
        with _ieee_fp32(b):
            yield
    finally:
        b.cudnn.deterministic, b.cudnn.benchmark = cudnn_saved


@contextmanager
def _ieee_fp32(b):
    if hasattr(b.cuda.matmul, "fp32_precision"):
        saved = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision)
        b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision = "ieee", "ieee"
        try:
            yield
        finally:
            b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision = saved
    else:                                                   # torch < 2.9
        saved = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = False, False
        try:
            yield
        finally:
            b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = saved
