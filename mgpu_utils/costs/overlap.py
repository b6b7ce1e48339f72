"""DDP's bucketed all-reduce overlapping backward, simulated from the alpha-beta model (lesson 03, exercise 03.9).

A deterministic timeline of one backward pass with DDP's gradient buckets, for choosing ``bucket_cap_mb``
without timing anything:

* gradient i (``grad_bytes[i]``, in ``model.parameters()`` order) is ready when backward has run the layers
  from the last down to i: at ``sum(backward_s[i:])`` seconds (backward runs in reverse order);
* gradients join the open bucket in the order they become ready; the bucket is closed once it holds at least
  ``cap_bytes`` (the rule of DDP's ``bucket_cap_mb`` and of exercise 03.6; one gradient is never split), and
  the bucket still open when backward ends is closed then;
* a bucket's all-reduce starts when it is closed and the link is free (one all-reduce at a time, in order, as
  on DDP's one communication stream), and takes the ring all-reduce's alpha-beta time
  (:func:`mgpu_utils.costs.bandwidth.ring_allreduce_model`: ``2(n-1) alpha + 2(n-1)/n S / B``);
* computation and communication do not slow each other down (a GPU's NCCL kernels do take some SMs; not
  modelled).

The **exposed** communication is what is left after backward ends: ``max(0, end of the last all-reduce - end
of backward)``. The forward and the optimizer step do not depend on the bucket size; :attr:`Timeline.step_s`
is backward plus the exposed communication: the time from the start of backward until the optimizer may step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mgpu_utils.costs.bandwidth import ring_allreduce_model

#: Bytes in one MiB: DDP's ``bucket_cap_mb`` counts MiB (2**20 bytes).
MIB = 2 ** 20


@dataclass(frozen=True)
class Timeline:
    """One simulated backward pass (seconds from the start of backward; bytes).

    ``buckets``: each bucket's gradient indices, in the order they joined it (ready order); ``bucket_bytes``,
    ``closed_s``, ``start_s``, ``end_s``: per bucket, its size, when it was closed, when its all-reduce
    started and ended; ``backward_s``: when backward ended; ``latency_s``: the all-reduces' latency terms
    together (``2(n-1) alpha`` each).
    """
    buckets: tuple
    bucket_bytes: tuple
    closed_s: tuple
    start_s: tuple
    end_s: tuple
    backward_s: float
    latency_s: float

    @property
    def exposed_s(self) -> float:
        """Communication left after backward ended (0 when every all-reduce finished under it)."""
        return max(0.0, (self.end_s[-1] if self.end_s else 0.0) - self.backward_s)

    @property
    def step_s(self) -> float:
        """Backward plus the exposed communication: when the optimizer may step."""
        return self.backward_s + self.exposed_s

    @property
    def comm_s(self) -> float:
        """Every all-reduce's time together (the link busy), hidden or not."""
        return sum(e - s for s, e in zip(self.start_s, self.end_s))


def _check(grad_bytes, backward_s, n, alpha_s, bandwidth_bps) -> None:
    if len(grad_bytes) != len(backward_s) or not len(grad_bytes):
        raise ValueError(f"grad_bytes and backward_s need one entry per gradient, the same number (got "
                         f"{len(grad_bytes)} and {len(backward_s)})")
    if any(not b > 0 for b in grad_bytes) or any(not t >= 0 for t in backward_s):
        raise ValueError("every gradient needs a positive size in bytes and a backward time >= 0 seconds")
    if int(n) != n or n < 1 or not alpha_s >= 0 or not bandwidth_bps > 0:
        raise ValueError(f"need a whole n >= 1, alpha_s >= 0 and bandwidth_bps > 0 (got n={n}, alpha_s={alpha_s}, "
                         f"bandwidth_bps={bandwidth_bps})")


def bucket_timeline(grad_bytes, backward_s, cap_bytes: float, n: int, alpha_s: float,
                    bandwidth_bps: float) -> Timeline:
    """The simulated backward pass of one DDP step with buckets of ``cap_bytes`` (module docstring).

    Args:
        grad_bytes: bytes of each gradient, in ``model.parameters()`` order (the first layer first).
        backward_s: seconds of backward spent on each gradient's layer (same order; backward runs it from the
            last entry to the first, so gradient i is ready at ``sum(backward_s[i:])``).
        cap_bytes: a bucket is closed once it holds at least this many bytes (``bucket_cap_mb * MIB``); 0 gives
            one bucket per gradient, anything from the total up one bucket.
        n: ranks in the all-reduce; alpha_s: latency per ring step (s); bandwidth_bps: link bandwidth (bytes/s).

    Returns:
        a :class:`Timeline` (its ``exposed_s`` and ``step_s`` are what a bucket size changes).

    Raises:
        ValueError: lists of different lengths or empty, a size <= 0, a time < 0, cap_bytes < 0 or not a number,
            n < 1, alpha_s < 0 or bandwidth_bps <= 0.
    """
    _check(grad_bytes, backward_s, n, alpha_s, bandwidth_bps)
    if not (isinstance(cap_bytes, (int, float)) or hasattr(cap_bytes, "__float__")) or math.isnan(float(cap_bytes)) \
            or cap_bytes < 0:
        raise ValueError(f"cap_bytes must be a number >= 0, got {cap_bytes!r}")
    ready, t = [0.0] * len(grad_bytes), 0.0
    for i in reversed(range(len(grad_bytes))):
        t += float(backward_s[i])
        ready[i] = t
    buckets, sizes, closed, held, open_ = [], [], [], 0.0, []
    for i in reversed(range(len(grad_bytes))):
        open_.append(i)
        held += grad_bytes[i]
        if held >= cap_bytes:
            buckets.append(tuple(open_))
            sizes.append(held)
            closed.append(ready[i])
            open_, held = [], 0.0
    if open_:
        buckets.append(tuple(open_))
        sizes.append(held)
        closed.append(t)
    starts, ends, free = [], [], 0.0
    for size, c in zip(sizes, closed):
        start = max(c, free)
        free = start + (float(ring_allreduce_model(size, n, alpha_s, bandwidth_bps)) if n > 1 else 0.0)
        starts.append(start)
        ends.append(free)
    latency = len(sizes) * 2 * (n - 1) * alpha_s
    return Timeline(tuple(buckets), tuple(sizes), tuple(closed), tuple(starts), tuple(ends), t, latency)


def distinct_caps(grad_bytes) -> list[float]:
    """Every bucket size that gives a different bucketing: the sums of consecutive gradients in ready order
    (a cap between two of them buckets as the larger one does), ascending. At most L(L+1)/2 for L gradients."""
    ready = [float(b) for b in reversed(grad_bytes)]
    sums = set()
    for i in range(len(ready)):
        s = 0.0
        for b in ready[i:]:
            s += b
            sums.add(s)
    return sorted(sums)


def best_bucket_cap(grad_bytes, backward_s, n: int, alpha_s: float, bandwidth_bps: float) -> tuple[float, Timeline]:
    """The bucket size with the shortest :attr:`Timeline.step_s`, searched over every distinct bucketing
    (:func:`distinct_caps`): ``(cap_bytes, timeline)``; of equal steps (within 1e-9 relative), the largest cap
    (the fewest calls). Every candidate runs :func:`bucket_timeline`'s rule at once, as numpy arrays (a model
    of 300 gradients has some 45,000 candidates).

    Raises:
        ValueError: as :func:`bucket_timeline`.
    """
    _check(grad_bytes, backward_s, n, alpha_s, bandwidth_bps)
    caps = np.array(distinct_caps(grad_bytes))
    per_call = 2 * (n - 1) * alpha_s if n > 1 else 0.0
    per_byte = 2 * (n - 1) / n / bandwidth_bps if n > 1 else 0.0
    held, free, t = np.zeros_like(caps), np.zeros_like(caps), 0.0
    for i in reversed(range(len(grad_bytes))):
        t += float(backward_s[i])                       # gradient i is ready now
        held += float(grad_bytes[i])
        full = held >= caps
        free[full] = np.maximum(free[full], t) + per_call + per_byte * held[full]
        held[full] = 0.0
    last = held > 0                                     # the bucket still open when backward ends
    free[last] = np.maximum(free[last], t) + per_call + per_byte * held[last]
    step = t + np.maximum(0.0, free - t)
    ok = np.flatnonzero(step <= step.min() * (1 + 1e-9))
    cap = float(caps[ok[-1]])
    return cap, bucket_timeline(grad_bytes, backward_s, cap, n, alpha_s, bandwidth_bps)


def transformer_gradients(layers: int, hidden: int, vocab: int, tokens: int, flops_per_s: float, *,
                          bytes_per_grad: int = 4, tied: bool = True) -> tuple[list[int], list[float]]:
    """``(grad_bytes, backward_s)`` of a GPT-2-style decoder for :func:`bucket_timeline`, one entry per parameter
    tensor in ``model.parameters()`` order: the token embedding (vocab x hidden), per block LayerNorm (weight,
    bias), the fused q/k/v projection (weight 3h x h, bias), the attention output (h x h, bias), LayerNorm, the
    MLP (4h x h and h x 4h, biases), then the final LayerNorm and, untied, the output head (vocab x hidden).

    Backward costs 4 flops per weight element per token (twice the forward's 2), at ``flops_per_s``, for the
    matrices (attention's scores and the norms are left out); ``tokens`` is the tokens of one rank's batch. A
    layer's time sits on its bias, the entry backward reaches first, so that its weight and bias are ready
    together after it. A tied head's backward runs first (its time sits on the final LayerNorm's bias) but its
    gradient adds into the embedding's, which is ready last.
    """
    numel, flops = [vocab * hidden], [0.0]
    h = hidden
    for _ in range(layers):
        numel += [h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]
        flops += [0, 0, 0, 4 * 3 * h * h, 0, 4 * h * h, 0, 0, 0, 4 * 4 * h * h, 0, 4 * 4 * h * h]
    numel += [h, h]
    flops += [0, 4 * vocab * h] if tied else [0, 0]       # a tied head: its backward comes first, before ln_f's
    if not tied:
        numel.append(vocab * h)
        flops.append(4 * vocab * h)
    return [n * bytes_per_grad for n in numel], [f * tokens / flops_per_s for f in flops]


def resnet_gradients(batch: int, flops_per_s: float, *, widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3),
                     image: int = 224, classes: int = 1000, bytes_per_grad: int = 4) -> tuple[list[int], list[float]]:
    """``(grad_bytes, backward_s)`` of a bottleneck ResNet (ResNet-50 by default: 161 tensors, 25.6 M parameters)
    for :func:`bucket_timeline`, in ``model.parameters()`` order: the stem (7x7 convolution, BatchNorm weight
    and bias), per block three convolutions (1x1, 3x3, 1x1 to 4x the width) each with its BatchNorm, a 1x1
    projection with its BatchNorm in each stage's first block, then the classifier (weight, bias).

    Backward costs 4 flops per weight element per output pixel per image (``batch`` images on one rank), at
    ``flops_per_s``; BatchNorm's is left out. The first stage works at image/4 pixels a side, each next one at
    half the size: the early layers have few parameters and much compute, the late ones the reverse.
    """
    numel, flops = [], []

    def conv(c_in, c_out, k, side):
        numel.extend([c_in * c_out * k * k, c_out, c_out])
        flops.extend([4 * c_in * c_out * k * k * side * side, 0, 0])
    conv(3, widths[0], 7, image // 2)
    c_in, side = widths[0], image // 4
    for stage, (w, n) in enumerate(zip(widths, blocks)):
        if stage:
            side //= 2
        for b in range(n):
            conv(c_in, w, 1, side)
            conv(w, w, 3, side)
            conv(w, 4 * w, 1, side)
            if b == 0:
                conv(c_in, 4 * w, 1, side)
            c_in = 4 * w
    numel += [c_in * classes, classes]
    flops += [4 * c_in * classes, 0]
    return [n * bytes_per_grad for n in numel], [f * batch / flops_per_s for f in flops]
