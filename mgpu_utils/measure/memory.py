"""Measuring training memory, on CPU and on GPU (notebooks/07_memory.ipynb).

What a training step keeps in memory, by kind, *measured* (the formulas are in
:mod:`mgpu_utils.costs.memory_model`):

* :func:`tensor_bytes`: bytes of a set of tensors, each underlying storage counted once (a view, a
  slice or a transposed weight shares its storage with the original). DTensors (FSDP2 shards)
  count their local shard on this rank.
* :func:`state_bytes`: parameters, gradients and optimizer states of a model/optimizer on this rank.
* :class:`SavedTensorCounter`: a context manager that records every tensor autograd saves for
  backward (``torch.autograd.graph.saved_tensors_hooks``), i.e. the activations; parameters and
  storages already counted are left out.
* :func:`gpu_peak`: the CUDA caching allocator's peak (``torch.cuda.max_memory_allocated``) around
  a block; on CPU it records nothing and says so.
* :func:`checkpointed`: an ``nn.Sequential`` whose layers run in activation-checkpointed segments
  (``torch.utils.checkpoint``, ``use_reentrant=False``).

All byte counts are plain ``int`` bytes (1 MB = 1e6 bytes in the notebook, as in the ZeRO paper).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's memory: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_key(t: torch.Tensor) -> tuple:
    """``(device, storage address)``: equal for tensors that share memory (views, slices, ``.t()``)."""
    t = _local(t)
    return (str(t.device), t.untyped_storage().data_ptr())


def tensor_bytes(tensors, exclude=()) -> int:
    """Bytes held by ``tensors``, each storage counted once (its full size, as it stays allocated).

    Args:
        tensors: iterable of tensors (``None`` entries are skipped); DTensors count their local shard.
        exclude: tensors whose storages are not counted (e.g. the parameters, when counting
            activations).

    Returns:
        int bytes. Example: ``x = torch.zeros(10)`` (40 bytes): ``tensor_bytes([x, x[2:], x.view(2, 5)])``
        is 40, ``tensor_bytes([x, x.clone()])`` is 80. A freed FSDP buffer (storage resized to 0) counts 0.
    """
    seen = {storage_key(t) for t in exclude if t is not None}
    total = 0
    for t in tensors:
        if t is None:
            continue
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += _local(t).untyped_storage().nbytes()
    return total


def optimizer_tensors(optimizer) -> list:
    """Every tensor in ``optimizer.state`` (Adam: ``step``, ``exp_avg``, ``exp_avg_sq`` per parameter).

    For ``ZeroRedundancyOptimizer`` pass its local optimizer ``zero.optim``: that holds this rank's shard.
    """
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def state_bytes(model: nn.Module, optimizer=None) -> dict:
    """Measured bytes of this rank's model states: ``{"params", "grads", "optimizer", "total"}``.

    Parameters and gradients are read from ``model.parameters()`` (local shards for FSDP2, whose
    padding is included: it is allocated), optimizer states from :func:`optimizer_tensors`.
    """
    params = list(model.parameters())
    out = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
           "optimizer": tensor_bytes(optimizer_tensors(optimizer)) if optimizer is not None else 0}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


@dataclass
class SavedTensorCounter:
    """Count the bytes autograd saves for backward inside a ``with`` block (the activations).

    Usage::

        with SavedTensorCounter(exclude=model.parameters()) as saved:
            loss = loss_fn(model(x), y)
        saved.bytes            # int: distinct storages saved for backward, parameters excluded
        saved.records          # [(shape, dtype, bytes)] one per counted storage, in order

    Works on CPU and GPU. Tensors sharing a storage (q, k, v as views of one projection; a weight's
    ``.t()``) count once, with the storage's full size. ``torch.utils.checkpoint`` (non-reentrant)
    hides the tensors of a checkpointed region from outer hooks and saves only the region's inputs,
    which are counted, exactly what stays in memory.

    The counter holds a reference to one tensor of every counted storage until the ``with`` block
    ends, so a storage freed inside the block (a graph that was discarded) cannot hand its address
    to a later tensor that would then be mistaken for already counted.
    """

    exclude: object = ()
    records: list = field(default_factory=list)

    def __post_init__(self):
        self._seen = {storage_key(t) for t in self.exclude}
        self._held = []                      # keeps counted storages alive: their addresses stay unique
        self._hooks = None

    def _pack(self, t: torch.Tensor):
        key = storage_key(t)
        if key not in self._seen:
            self._seen.add(key)
            self._held.append(t)
            self.records.append((tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                 _local(t).untyped_storage().nbytes()))
        return t

    @staticmethod
    def _unpack(t):
        return t

    @property
    def bytes(self) -> int:
        return sum(r[2] for r in self.records)

    def by_dtype(self) -> dict:
        """``{dtype name: bytes}`` of the counted storages."""
        out = {}
        for _, dt, b in self.records:
            out[dt] = out.get(dt, 0) + b
        return out

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._held = []
        return False


@contextlib.contextmanager
def gpu_peak(device):
    """Measure the CUDA allocator's peak inside a block. Yields a dict filled on exit.

    On a CUDA ``device``: ``{"peak_bytes": max_memory_allocated - allocated before,
    "allocated_before", "peak_allocated", "reserved"}`` (bytes; ``torch.cuda.memory_summary(device)``
    shows the allocator's full table). On CPU the dict stays ``{"skipped": "needs a CUDA device, got cpu"}``:
    CPU memory has no such counter, so use :func:`state_bytes` and :class:`SavedTensorCounter`.
    """
    device = torch.device(device)
    rec: dict = {}
    if device.type != "cuda":
        rec["skipped"] = f"needs a CUDA device, got {device.type}"
        yield rec
        return
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield rec
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    rec.update(peak_bytes=peak - before, allocated_before=before, peak_allocated=peak,
               reserved=torch.cuda.memory_reserved(device))


class Checkpointed(nn.Module):
    """Run an ``nn.Sequential`` in segments of ``every`` layers, each under ``torch.utils.checkpoint``.

    ``every=0`` is the plain model (no checkpointing). Only each segment's input is kept for
    backward; the segment's forward is recomputed during backward (one extra forward per segment).
    The parameters are the wrapped model's own (``state_dict`` keys gain a ``seq.`` prefix).
    """

    def __init__(self, seq: nn.Sequential, every: int):
        super().__init__()
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        self.seq, self.every = seq, every

    def forward(self, x):
        if self.every == 0:
            return self.seq(x)
        from torch.utils.checkpoint import checkpoint
        layers = list(self.seq)
        for i in range(0, len(layers), self.every):
            segment = nn.Sequential(*layers[i:i + self.every])
            x = checkpoint(segment, x, use_reentrant=False)
        return x


def checkpointed(seq: nn.Sequential, every: int) -> Checkpointed:
    """:class:`Checkpointed` view of ``seq`` (shares its parameters)."""
    return Checkpointed(seq, every)


def fragmentation_demo(device="cuda", n_blocks: int = 50, block_mib: int = 4) -> dict:
    """Fragment the CUDA caching allocator on purpose; report allocated vs reserved bytes.

    Allocates ``n_blocks`` blocks of ``block_mib`` MiB (requests of 1-10 MB share 20 MiB segments),
    frees every other one, allocates ``n_blocks // 4`` blocks of twice the size (they do not fit
    the freed holes, so new memory is reserved), then calls ``torch.cuda.empty_cache()``, which can
    only give back whole free segments. With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    (set before CUDA starts: run this in a fresh process) the allocator grows one segment in place
    and can unmap the free pages in the middle of it.

    Returns:
        bytes: ``allocated``, ``reserved`` (after ``empty_cache``), ``fragmented`` (= reserved -
        allocated) and ``alloc_conf``; or ``{"skipped": "needs a CUDA GPU, found 0"}`` without CUDA.
    """
    import os
    if not torch.cuda.is_available():
        return {"skipped": f"needs a CUDA GPU, found {torch.cuda.device_count()}"}
    device = torch.device(device)
    size = block_mib * 2**20
    blocks = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(n_blocks)]
    for i in range(0, n_blocks, 2):
        blocks[i] = None                       # holes of block_mib between live blocks
    big = [torch.empty(2 * size, dtype=torch.uint8, device=device) for _ in range(n_blocks // 4)]
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    alloc, res = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    del blocks, big
    return {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "allocated": alloc,
            "reserved": res, "fragmented": res - alloc}


class TransformerBlock(nn.Module):
    """A GPT layer written out op by op, as Korthikanti et al. count it (notebooks/07_memory.ipynb).

    (s, b, h) -> (s, b, h): x + Dropout(Proj(Attention(LN1(x)))), then + Dropout(FC2(GELU(FC1(LN2(.))))),
    with ``n_heads`` heads, softmax and dropout on the (b, a, s, s) scores, and a 4h MLP. Dropout
    is active in training mode (``p > 0``), so its masks are saved as in the paper.
    """

    def __init__(self, hidden: int, n_heads: int, p_drop: float = 0.1):
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden={hidden} must be divisible by n_heads={n_heads}")
        self.a, self.p = n_heads, p_drop
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        import torch.nn.functional as F
        s, b, h = x.shape
        d = h // self.a
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)                  # each (s, b, h)
        q, k, v = (t.reshape(s, b * self.a, d).transpose(0, 1) for t in (q, k, v))  # (b*a, s, d)
        scores = torch.bmm(q, k.transpose(1, 2)) * d**-0.5                # (b*a, s, s)
        probs = F.dropout(torch.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, h)        # (s, b, h)
        x = x + F.dropout(self.proj(ctx), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)
