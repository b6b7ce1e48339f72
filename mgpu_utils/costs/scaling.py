"""Scaling laws and cost models fitted to measured runs (notebooks/11_benchmarking.ipynb).

* :func:`speedups`: speed-up and parallel efficiency from measured throughputs (strong or weak scaling).
* :func:`amdahl_speedup` / :func:`fit_amdahl`: Amdahl's law S(N) = 1 / (f + (1 - f) / N) and the serial
  fraction f that fits measured speed-ups best; :func:`gustafson_speedup` is its weak-scaling twin.
* :func:`predict_step` / :func:`predict_scaling`: the step time of data-parallel training from a compute
  time and the alpha-beta model of a ring all-reduce, t = 2 (N - 1) alpha + 2 (N - 1) / N * bytes / B
  (:func:`mgpu_utils.costs.bandwidth.ring_allreduce_model`, fitted by ``fit_ring_allreduce``, lesson 04), on
  this machine or on GPUs and links from :mod:`mgpu_utils.costs.hardware`; on nodes with a NIC per GPU,
  the two-level all-reduce (``hierarchical_allreduce_model``).
* :func:`critical_batch_steps` / :func:`fit_critical_batch`: McCandlish et al. (2018)'s steps to a target,
  S(B) = S_min (1 + B_crit / B), and its fit to measured steps per global batch (lesson 10,
  ``launch_scripts/batch_size_sweep.py``).

Pure Python and numpy: no process group, no torch.
"""

from __future__ import annotations

import numpy as np

from mgpu_utils.costs.bandwidth import hierarchical_allreduce_model, ring_allreduce_model


def speedups(rows: list[dict]) -> dict[int, dict]:
    """Speed-up and parallel efficiency of each world size against world size 1.

    Args:
        rows: one dict per run with ``world_size`` (int) and ``samples_per_s`` (the whole job's
            throughput); exactly one row must have world size 1.

    Returns:
        ``{N: {"speedup": S, "efficiency": S / N}}`` with S = samples_per_s(N) / samples_per_s(1).
        For strong scaling (same global batch) S = time(1) / time(N); for weak scaling (same batch per
        rank) it is the scaled speed-up, N * time(1) / time(N). Either way 100% efficiency is perfect.

    Raises:
        ValueError: no run with world size 1, or two runs with the same world size.
    """
    by_n = {}
    for r in rows:
        if r["world_size"] in by_n:
            raise ValueError(f"two runs with world size {r['world_size']}: keep one per world size")
        by_n[r["world_size"]] = r["samples_per_s"]
    if 1 not in by_n:
        raise ValueError("speed-ups need a run with world size 1 (the baseline): add it")
    return {n: {"speedup": s / by_n[1], "efficiency": s / by_n[1] / n} for n, s in sorted(by_n.items())}


def _law_inputs(n, serial_fraction: float):
    n = np.asarray(n, dtype=float)
    if not 0.0 <= serial_fraction <= 1.0:
        raise ValueError(f"the serial fraction is a share between 0 and 1, got {serial_fraction}")
    if np.any(n < 1):
        raise ValueError(f"world sizes must be >= 1, got {n}")
    return n


def amdahl_speedup(n, serial_fraction: float):
    """Amdahl's law (1967): S(N) = 1 / (f + (1 - f) / N) for a fixed problem (strong scaling).

    Args:
        n: world size(s) >= 1, scalar or array; serial_fraction: f in [0, 1].

    Raises:
        ValueError: f outside [0, 1] or a world size below 1.
    """
    n = _law_inputs(n, serial_fraction)
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def gustafson_speedup(n, serial_fraction: float):
    """Gustafson's law (1988): S(N) = N - f (N - 1) when the problem grows with N (weak scaling).

    Args and errors as :func:`amdahl_speedup`.
    """
    n = _law_inputs(n, serial_fraction)
    return n - serial_fraction * (n - 1.0)


def fit_amdahl(world_sizes, speedup_values) -> float:
    """The serial fraction f in [0, 1] whose Amdahl curve fits measured speed-ups best.

    1 / S = f + (1 - f) / N is linear in f: 1 / S - 1 / N = f (1 - 1 / N), solved by least squares
    through the origin. World size 1 carries no information (x = 0); with a single N > 1 the fit is
    exact: f = (N / S - 1) / (N - 1).

    Raises:
        ValueError: lengths differ, or no world size above 1.
    """
    n = np.asarray(world_sizes, dtype=float)
    s = np.asarray(speedup_values, dtype=float)
    if n.shape != s.shape:
        raise ValueError(f"{n.size} world sizes but {s.size} speed-ups: give one speed-up per world size")
    x, y = 1.0 - 1.0 / n, 1.0 / s - 1.0 / n
    if not np.any(x > 0):
        raise ValueError("an Amdahl fit needs at least one run with more than 1 rank")
    return float(np.clip(np.dot(x, y) / np.dot(x, x), 0.0, 1.0))


def predict_step(n: int, compute_s: float, grad_bytes: float, alpha_s: float, bandwidth_bps: float,
                 mode: str = "strong", overlap: float = 0.0, gpus_per_node: int | None = None,
                 inter_node: tuple[float, float] | None = None) -> float:
    """Predicted seconds per data-parallel step on ``n`` ranks.

    Args:
        n: world size (>= 1).
        compute_s: seconds of the step's computation on ONE rank with the whole (strong) or its own
            (weak) batch: whatever the caller measured (``ddp_speedup.py``'s ``compute_seconds`` is the
            forward and backward without DDP; the optimizer step is not in it).
        grad_bytes: bytes all-reduced per step (parameters x bytes per gradient element).
        alpha_s, bandwidth_bps: the link's latency per message (s) and bandwidth (bytes/s), fitted with
            :func:`mgpu_utils.costs.bandwidth.fit_ring_allreduce` or from a datasheet.
        mode: "strong" (the global batch is split: compute_s / n per rank) or "weak" (compute_s per rank).
        overlap: 0..1, the share of the compute under which the all-reduce can hide (DDP overlaps bucket
            all-reduces with the backward pass: about 2/3 of the step at best). 0 is no overlap.
        gpus_per_node, inter_node: nodes of GPUs (both or neither): the all-reduce is then
            :func:`mgpu_utils.costs.bandwidth.hierarchical_allreduce_model`, with ``alpha_s`` and
            ``bandwidth_bps`` the link inside a node and ``inter_node`` = (alpha_s, bandwidth_bps) of each
            GPU's own NIC between nodes. Without them: one flat ring over the one link.

    Returns:
        compute + max(0, comm - overlap * compute), with comm = ring_allreduce_model(grad_bytes, n, ...)
        (0 for n = 1).

    Raises:
        ValueError: n < 1, an unknown mode or overlap outside [0, 1].
    """
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap is a share between 0 and 1, got {overlap}")
    compute = compute_s / n if mode == "strong" else compute_s
    if (gpus_per_node is None) != (inter_node is None):
        raise ValueError("give gpus_per_node and inter_node together (nodes and their NICs), or neither")
    if n == 1:
        comm = 0.0
    elif gpus_per_node is None:
        comm = float(ring_allreduce_model(grad_bytes, n, alpha_s, bandwidth_bps))
    else:
        comm = float(hierarchical_allreduce_model(grad_bytes, n, gpus_per_node, (alpha_s, bandwidth_bps),
                                                  inter_node))
    return compute + max(0.0, comm - overlap * compute)


def predict_scaling(world_sizes, compute_s: float, grad_bytes: float, alpha_s: float, bandwidth_bps: float,
                    mode: str = "strong", overlap: float = 0.0, gpus_per_node: int | None = None,
                    inter_node: tuple[float, float] | None = None) -> dict[int, dict]:
    """:func:`predict_step` for each world size, with the speed-up and efficiency it implies.

    Args:
        world_sizes: iterable of N >= 1; the other arguments as :func:`predict_step`.

    Returns:
        ``{N: {"step_s", "speedup", "efficiency"}}``; the speed-up is against the same model at N = 1,
        in throughput (weak scaling: N times the samples per step).

    Raises:
        ValueError: as :func:`predict_step`.
    """
    nodes = {"gpus_per_node": gpus_per_node, "inter_node": inter_node}
    base = predict_step(1, compute_s, grad_bytes, alpha_s, bandwidth_bps, mode, overlap, **nodes)
    out = {}
    for n in world_sizes:
        step = predict_step(n, compute_s, grad_bytes, alpha_s, bandwidth_bps, mode, overlap, **nodes)
        s = base / step * (n if mode == "weak" else 1)
        out[int(n)] = {"step_s": step, "speedup": s, "efficiency": s / n}
    return out


def gpu_compute_seconds(flops: float, peak_tflops: float, efficiency: float) -> float:
    """Seconds a GPU needs for ``flops`` while computing at ``efficiency`` (0..1] of its datasheet peak
    (lesson 11). This is the kernels' share of peak, not MFU: MFU is measured over the whole step, so a
    step that also waits for communication has an MFU of ``efficiency`` x the parallel efficiency.

    Raises:
        ValueError: efficiency outside (0, 1] or a peak <= 0.
    """
    if not 0.0 < efficiency <= 1.0:
        raise ValueError(f"efficiency is a share of the peak between 0 and 1, got {efficiency}")
    if peak_tflops <= 0:
        raise ValueError(f"peak must be > 0 TFLOP/s, got {peak_tflops}")
    return flops / (peak_tflops * 1e12 * efficiency)


def critical_batch_steps(batch, s_min: float, b_crit: float):
    """Steps to a target at global batch B: S(B) = S_min (1 + B_crit / B) (McCandlish et al. 2018, section 2).

    Below B_crit, doubling the batch nearly halves the steps (S ~ S_min B_crit / B: the same number of
    examples); above it the steps approach S_min and the examples, E = S B = E_min (1 + B / B_crit) with
    E_min = S_min B_crit, grow about linearly with B: a larger batch then buys little time and costs compute.

    Args:
        batch: global batch size(s) B > 0, scalar or array; s_min: steps at an infinite batch (> 0);
        b_crit: the critical batch size (>= 0), where S = 2 S_min and E = 2 E_min.

    Returns:
        Steps, float or numpy array like ``batch``.

    Raises:
        ValueError: a batch <= 0, s_min <= 0 or b_crit < 0.
    """
    b = np.asarray(batch, dtype=float)
    if np.any(b <= 0) or s_min <= 0 or b_crit < 0:
        raise ValueError(f"need batch > 0, s_min > 0 and b_crit >= 0, got {batch}, {s_min}, {b_crit}")
    out = s_min * (1 + b_crit / b)
    return float(out) if out.ndim == 0 else out


def fit_critical_batch(batches, steps) -> dict:
    """Fit S(B) = S_min (1 + B_crit / B) to measured steps to a target (lesson 10).

    S is linear in 1 / B (S = S_min + S_min B_crit / B), so a least-squares line through (1 / B, S), each
    point weighted by 1 / S so that every batch size counts by its relative error, gives both numbers.

    Args:
        batches: global batch sizes (at least 2 different, > 0); steps: measured steps to the target (> 0).

    Returns:
        ``{"s_min", "b_crit", "e_min", "max_rel_error"}``: steps at an infinite batch, the critical batch
        size, the examples at a tiny batch (S_min B_crit) and the largest |fit - measured| / measured.

    Raises:
        ValueError: fewer than 2 distinct batch sizes, lengths differ, a value <= 0, or the measured steps do
            not fit the model (rising with B, or falling faster than 1 / B: S_min or B_crit would be negative).
    """
    b, s = np.asarray(batches, dtype=float), np.asarray(steps, dtype=float)
    if b.shape != s.shape or len(set(b.tolist())) < 2 or np.any(b <= 0) or np.any(s <= 0):
        raise ValueError("need steps > 0 for at least 2 different batch sizes > 0, one value per batch size")
    slope, s_min = np.polyfit(1 / b, s, 1, w=1 / s)
    if s_min <= 0 or slope < 0:
        raise ValueError(f"the steps do not fit S_min (1 + B_crit / B) with both >= 0 (fitted S_min = "
                         f"{s_min:.3g}, S_min B_crit = {slope:.3g}): they must fall as B grows, at most as 1 / B; "
                         f"measure more batch sizes, more seeds, or a harder target")
    fitted = critical_batch_steps(b, s_min, slope / s_min)
    return {"s_min": float(s_min), "b_crit": float(slope / s_min), "e_min": float(slope),
            "max_rel_error": float(np.max(np.abs(fitted - s) / s))}
