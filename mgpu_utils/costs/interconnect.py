"""An interconnect emulator for DDP: what a gradient all-reduce would cost on a chosen link, from
the alpha-beta model and published link specifications (lesson 09; also 11).

The alpha-beta model of ring all-reduce (lesson 04, :func:`mgpu_utils.costs.bandwidth.ring_allreduce_model`)
for a payload of S bytes on n ranks, per-message latency alpha and link bandwidth B::

    T(S) = 2(n-1) * (alpha + S / (n * B))        seconds

(2(n-1) steps, each sending one chunk of S/n bytes). alpha and B come from
:data:`mgpu_utils.costs.hardware.LINKS` (``latency_us`` and ``gbps`` per direction, GB = 1e9 bytes; sources
there: PCI-SIG, NVIDIA datasheets, IEEE 802.3).

:func:`emulated_link_hook` wraps a DDP communication hook (``allreduce_hook``, ``fp16_compress_hook``,
``powerSGD_hook``, ...), counts the bytes it puts into the all-reduce, and sleeps for T(bytes) on top,
so a laptop run shows how the link's bandwidth shapes step time and why compression helps on slow
links. The sleep starts after the real (loopback) all-reduce was launched, so the bucket completes
after max(real time, modelled time): the step behaves as if the link were the modelled one whenever
the model is slower than loopback. The sleep blocks the backward pass: no overlap with compute is
modelled (exact when the model has one bucket, an upper bound otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mgpu_utils.costs.bandwidth import ring_allreduce_model
from mgpu_utils.costs.hardware import LINKS


def link_alpha_beta(link: str) -> tuple[float, float]:
    """``(alpha_s, bandwidth_Bps)`` of a link named in :data:`mgpu_utils.costs.hardware.LINKS`.

    alpha in seconds (``latency_us`` x 1e-6), bandwidth in bytes/s per direction (``gbps`` x 1e9).

    Raises:
        KeyError: unknown link, with the list of known names.
    """
    if link not in LINKS:
        raise KeyError(f"unknown link {link!r}; known: {', '.join(LINKS)}")
    spec = LINKS[link]
    return spec["latency_us"] * 1e-6, spec["gbps"] * 1e9


def ring_allreduce_seconds(size_bytes: float, n: int, link: str) -> float:
    """Modelled time (s) of a ring all-reduce of ``size_bytes`` on ``n`` ranks over ``link``:
    2(n-1)(alpha + S/(n B)); 0.0 when n == 1 (nothing to send).

    Raises:
        KeyError: unknown link. ValueError: n < 1 or a negative size.
    """
    if n < 1 or size_bytes < 0:
        raise ValueError(f"need n >= 1 and size_bytes >= 0, got n={n}, size_bytes={size_bytes}")
    alpha, bw = link_alpha_beta(link)
    return float(ring_allreduce_model(size_bytes, n, alpha, bw)) if n > 1 else 0.0


@dataclass
class HookStats:
    """What an :func:`emulated_link_hook` (or a counting hook, ``link=None``) recorded, per rank.

    Attributes:
        calls: hook calls (one per gradient bucket per step).
        payload_bytes: bytes handed to all-reduce in total (after compression; summed over calls).
        modelled_s: modelled link time added by sleeping, in seconds, summed over calls.
        slept_s: measured duration of those sleeps (>= modelled_s).
        per_call: ``[(payload_bytes, modelled_s, slept_s)]`` for each call.
    """

    calls: int = 0
    payload_bytes: int = 0
    modelled_s: float = 0.0
    slept_s: float = 0.0
    per_call: list = field(default_factory=list)


def hierarchical_allreduce_seconds(size_bytes: float, ranks_per_node: int, nodes: int, intra: str,
                                   inter: str) -> dict:
    """Modelled time (s) of a two-level all-reduce of ``size_bytes`` (lesson 04), by level: inside each node a
    ring reduce-scatter and, at the end, a ring all-gather over the k = ``ranks_per_node`` ranks
    (``(k-1)(alpha + S/(k B))`` each, on ``intra``); between nodes k all-reduces at once, one per local
    rank, each of S/k over the ``nodes`` nodes (a ring all-reduce of S/k on ``inter``, each rank its own NIC).

    Returns:
        ``{"intra_s", "inter_s", "total_s", "flat_s", "flat_channels_s"}``; ``flat_s`` is one ring over all
        k x nodes ranks, whose every step waits for the slowest link it uses (``inter`` when nodes > 1): one NIC
        per node carries it. ``flat_channels_s`` is the flat ring as NCCL runs it on a node with a NIC per GPU:
        k rings at once (channels), each of S/k over all k x nodes ranks and each crossing nodes on its own NIC
        (rail-aligned), so a node injects k NICs' bandwidth, as the hierarchy does.

    Raises:
        KeyError: unknown link. ValueError: k or nodes < 1, or a negative size.
    """
    k, m = ranks_per_node, nodes
    if k < 1 or m < 1 or size_bytes < 0:
        raise ValueError(f"need ranks_per_node, nodes >= 1 and size_bytes >= 0, got {k}, {m}, {size_bytes}")
    a_in, b_in = link_alpha_beta(intra)
    intra_s = 2 * (k - 1) * (a_in + size_bytes / (k * b_in))
    inter_s = ring_allreduce_seconds(size_bytes / k, m, inter)
    slowest = inter if m > 1 else intra
    flat_s = ring_allreduce_seconds(size_bytes, k * m, slowest)
    flat_channels_s = ring_allreduce_seconds(size_bytes / k, k * m, slowest)
    return {"intra_s": intra_s, "inter_s": inter_s, "total_s": intra_s + inter_s, "flat_s": flat_s,
            "flat_channels_s": flat_channels_s}


def _payload_bytes(bucket, inner_state, inner_hook, before_numel) -> int:
    """Bytes the inner hook all-reduced for this bucket (computed after it ran)."""
    name = getattr(inner_hook, "__name__", "")
    buf = bucket.buffer()
    if hasattr(inner_state, "compression_stats"):       # PowerSGDState: public element counters
        after = inner_state.compression_stats()[2]
        if after > before_numel:                         # compressed this call: P, Q and uncompressed tensors
            return (after - before_numel) * buf.element_size()
        return buf.numel() * buf.element_size()          # warm-up iterations: vanilla all-reduce
    if name.startswith(("fp16", "bf16")):
        return buf.numel() * 2
    return buf.numel() * buf.element_size()


def emulated_link_hook(inner_hook, inner_state, link: str | None, n: int, scale: float = 1.0,
                       stats: HookStats | None = None):
    """A DDP communication hook: runs ``inner_hook(inner_state, bucket)`` and adds a modelled link delay.

    Register it with ``ddp.register_comm_hook(stats, hook)`` where ``stats, hook = ...``; see below.

    Args:
        inner_hook: a DDP hook, e.g. ``default_hooks.allreduce_hook`` or ``powerSGD_hook``.
        inner_state: its state (the process group, or a ``PowerSGDState``).
        link: a key of :data:`mgpu_utils.costs.hardware.LINKS`, or None to only count bytes (no delay).
        n: ranks in the all-reduce (the process group's size).
        scale: charge the delay for ``scale`` x the payload (stands for a model ``scale`` times bigger on
            the same compute); the bytes recorded are the real payload.
        stats: a :class:`HookStats` to fill (a new one if None).

    Returns:
        ``(stats, hook)``: pass both to ``ddp.register_comm_hook(stats, hook)``; ``stats`` fills up as DDP runs.
    """
    stats = HookStats() if stats is None else stats
    if link is not None:
        link_alpha_beta(link)                            # unknown names fail now, not in backward

    def hook(state: HookStats, bucket):
        before = inner_state.compression_stats()[2] if hasattr(inner_state, "compression_stats") else 0
        fut = inner_hook(inner_state, bucket)            # launches the real all-reduce (async)
        size = _payload_bytes(bucket, inner_state, inner_hook, before)
        modelled = ring_allreduce_seconds(size * scale, n, link) if link is not None else 0.0
        t0 = time.perf_counter()
        if modelled > 0:
            time.sleep(modelled)
        slept = time.perf_counter() - t0
        state.calls += 1
        state.payload_bytes += size
        state.modelled_s += modelled
        state.slept_s += slept
        state.per_call.append((size, modelled, slept))
        return fut

    return stats, hook
