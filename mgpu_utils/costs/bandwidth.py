"""Bandwidth arithmetic for collectives, as NVIDIA's nccl-tests report it (lesson 04; also 06, 08
and 10).

For an operation on ``size_bytes`` that took ``seconds``:

* **algbw** (algorithm bandwidth) = size / time: what the caller experiences.
* **busbw** (bus bandwidth) = algbw x a factor that counts the bytes each rank must really move in an
  optimal (ring) algorithm, so that busbw is comparable with the hardware's link bandwidth whatever
  the number of ranks n (nccl-tests' doc/PERFORMANCE.md):

  =================  ==================  ============================================
  op                 factor              size means
  =================  ==================  ============================================
  all_reduce         2(n-1)/n            the buffer each rank reduces
  all_gather         (n-1)/n             the *output* buffer (n x each rank's input)
  reduce_scatter     (n-1)/n             the *input* buffer (n x each rank's output)
  all_to_all         (n-1)/n             each rank's send buffer
  broadcast, reduce  1                   the buffer
  =================  ==================  ============================================

Units: bytes, seconds, GB/s with GB = 1e9 bytes (as nccl-tests).
"""

from __future__ import annotations

import numpy as np

_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor for ``op`` on ``n`` ranks.

    Raises:
        ValueError: unknown op or n < 1.
    """
    if op not in _FACTORS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(_FACTORS)}")
    if n < 1:
        raise ValueError(f"number of ranks must be >= 1, got {n}")
    return _FACTORS[op](n)


def ring_bytes_per_rank(size_bytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends (and receives) in a ring all-reduce of ``size_bytes``:
    2(n-1)/n x size_bytes, the all-reduce's busbw factor times the size (0 when n == 1; lessons 04, 06, 09).

    Raises:
        ValueError: n < 1.
    """
    return bus_factor("all_reduce", n) * size_bytes


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s). Raises ValueError for seconds <= 0."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return size_bytes / seconds / 1e9


def busbw_gbps(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s: ``algbw_gbps(size, seconds) * bus_factor(op, n)``."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, n)


def ring_allreduce_model(size_bytes, n: int, alpha_s: float, bandwidth_bps: float):
    """The alpha-beta time of ring all-reduce, in seconds: 2(n-1)*alpha + 2(n-1)/n * S / B.

    Args:
        size_bytes: S, scalar or array (bytes).
        n: ranks.
        alpha_s: per-message latency alpha (seconds).
        bandwidth_bps: link bandwidth B (bytes per second).
    """
    return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * np.asarray(size_bytes, dtype=float) / bandwidth_bps


def hierarchical_allreduce_model(size_bytes, n: int, gpus_per_node: int, intra: tuple[float, float],
                                 inter: tuple[float, float]):
    """The alpha-beta time of a two-level all-reduce over nodes of ``g = gpus_per_node`` GPUs, in seconds
    (lesson 11's cluster prediction).

    How NCCL uses a node with one NIC per GPU (DGX H100: 8 GPUs, NVLink 4, 8 ConnectX-7 NDR NICs):
    a reduce-scatter inside each node over NVLink, so each GPU holds the node's sum of 1/g of the
    buffer; an all-reduce of that slice across the ``k = n / g`` nodes, every GPU over its own NIC (g
    rings at once: the node injects g NICs' bandwidth, not one); an all-gather inside the node::

        t = 2(g-1) alpha_intra + 2(g-1)/g S / B_intra + 2(k-1) alpha_inter + 2(k-1)/k (S/g) / B_inter

    Args:
        size_bytes: S, scalar or array (bytes).
        n: GPUs in all; ``n <= g`` is one node (the intra-node ring alone), else a multiple of g.
        gpus_per_node: g.
        intra, inter: ``(alpha_s, bandwidth_bps)`` of the link inside a node and of one GPU's NIC.

    Raises:
        ValueError: n > g and not a multiple of g, or g < 1.
    """
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if n <= gpus_per_node:
        return ring_allreduce_model(size_bytes, n, *intra)
    if n % gpus_per_node:
        raise ValueError(f"{n} GPUs do not fill nodes of {gpus_per_node}: use a multiple of {gpus_per_node}")
    k = n // gpus_per_node
    inside = ring_allreduce_model(size_bytes, gpus_per_node, *intra)
    return inside + ring_allreduce_model(np.asarray(size_bytes, dtype=float) / gpus_per_node, k, *inter)


def fit_ring_allreduce(size_bytes, seconds, n: int) -> tuple[float, float]:
    """Least-squares fit of :func:`ring_allreduce_model` to measurements.

    Fits T = a + b*S minimising *relative* errors (weights 1/T, so small messages count as much as
    large ones), then alpha = a / (2(n-1)) and B = 2(n-1)/n / b.

    Args:
        size_bytes, seconds: 1-D sequences of equal length (>= 2 distinct sizes).
        n: ranks (>= 2).

    Returns:
        ``(alpha_s, bandwidth_bps)``: latency per step (seconds; clipped at 0) and bandwidth (bytes/s).

    Raises:
        ValueError: n < 2, or fewer than 2 distinct sizes.
    """
    s, t = np.asarray(size_bytes, dtype=float), np.asarray(seconds, dtype=float)
    if n < 2:
        raise ValueError("the model needs at least 2 ranks")
    if len(np.unique(s)) < 2:
        raise ValueError("need measurements at 2 or more distinct sizes")
    b, a = np.polyfit(s, t, 1, w=1 / t)
    return max(a, 0.0) / (2 * (n - 1)), 2 * (n - 1) / n / b
