"""Reading torch.profiler traces of a distributed step (notebooks/11_benchmarking.ipynb, profile_step.py).

Each rank writes its own Chrome trace (JSON, loadable in https://ui.perfetto.dev or chrome://tracing):
``trace_rank<r>.json``. :func:`load_spans` keeps what a step breakdown needs: the ``record_function``
phases of :data:`PHASES`, the all-reduces that did the gradient communication (gloo runs them on its own
worker threads, NCCL as kernels on a GPU stream) and the computation they could hide behind (autograd's
backward functions on a CPU, kernels on a GPU); :func:`breakdown` sums them per step, with the share of
the all-reduce time that ran while the backward pass was still computing (overlapped) and the rest, during
which the rank only waited (exposed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: The phases profile_step.py names with ``torch.profiler.record_function``, in step order.
PHASES = ("data", "forward", "backward", "optimizer")

#: Events that are the all-reduce's work: gloo's worker-thread span and NCCL's GPU kernel. (The host-side
#: spans, ``c10d::allreduce_`` and NCCL's ``nccl:all_reduce``, only enqueue the work: not counted.)
COMM = re.compile(r"^gloo:all_reduce$|^nccl(Dev)?Kernel_AllReduce", re.IGNORECASE)


def trace_file(trace_dir, rank: int) -> Path:
    """The trace of ``rank`` in ``trace_dir``: ``trace_rank<rank>.json`` (one per rank, never shared)."""
    return Path(trace_dir) / f"trace_rank{rank}.json"


def load_spans(path) -> dict:
    """The phase and all-reduce spans of one rank's trace.

    Returns:
        ``{"rank", "timeline", "spans": [{"kind", "name", "start_us", "dur_us", "tid"}, ...]}``, spans sorted
        by start; ``kind`` is a phase of :data:`PHASES`, "all-reduce" or "compute". On a CPU trace
        (``timeline`` "host") compute is autograd's backward functions; on a GPU trace ("device") it is the
        GPU's kernels other than NCCL's, and the phases are the profiler's GPU-side record of them where
        it has one (the host's spans only enqueue the work). Times in microseconds on the trace's clock
        (the same clock for every process of one machine). The rank is the trace's
        ``distributedInfo.rank`` (the file name's number without a process group).

    Raises:
        FileNotFoundError: no such trace; ValueError: not a Chrome trace (no ``traceEvents``).
    """
    with open(path) as f:
        trace = json.load(f)
    if "traceEvents" not in trace:
        raise ValueError(f"{path} is not a Chrome trace: it has no 'traceEvents'")
    rank = (trace.get("distributedInfo") or {}).get("rank")
    if rank is None:
        m = re.search(r"rank(\d+)", Path(path).name)
        rank = int(m.group(1)) if m else 0
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    # a GPU trace: the work is the device's (NCCL's kernel overlaps the GPU's kernels, not the host's
    # autograd calls, which only enqueue them); phases too, where the profiler recorded them on the GPU
    on_gpu = any(e.get("cat") == "kernel" for e in events)
    phase_cat = "gpu_user_annotation" if on_gpu and any(
        e.get("cat") == "gpu_user_annotation" and e.get("name") in PHASES for e in events) else "user_annotation"
    spans = []
    for e in events:
        name = e.get("name", "")
        kind = name if name in PHASES and e.get("cat") == phase_cat else \
            "all-reduce" if COMM.search(name) else \
            "compute" if (e.get("cat") == "kernel" if on_gpu else
                          name.startswith("autograd::engine::evaluate_function")) else None
        if kind:
            spans.append({"kind": kind, "name": name, "start_us": float(e["ts"]), "dur_us": float(e["dur"]),
                          "tid": e.get("tid")})
    return {"rank": int(rank), "timeline": "device" if on_gpu else "host",
            "spans": sorted(spans, key=lambda s: s["start_us"])}


def _union(intervals) -> list[tuple[float, float]]:
    """Merge overlapping (start, end) intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(xs, ys) -> float:
    """Total length of the intersection of two lists of disjoint intervals."""
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


def breakdown(rank_trace: dict) -> dict:
    """Milliseconds per step of each phase of one rank, and of its all-reduces.

    Args:
        rank_trace: :func:`load_spans` of one rank.

    Returns:
        ``{"steps", "data", "forward", "backward", "optimizer", "all-reduce", "overlapped", "exposed"}`` in
        ms per step: each phase's total time; "all-reduce" the time during which at least one all-reduce
        ran (the union of their spans); "overlapped" the part of it during which the rank also computed
        (autograd functions or kernels: hidden behind computation, as DDP intends); "exposed" the rest,
        during which the rank only waited. "steps" is the number of traced forward phases.

    Raises:
        ValueError: the trace has no forward phase (not a profile_step.py trace).
    """
    spans = rank_trace["spans"]
    steps = sum(s["kind"] == "forward" for s in spans)
    if not steps:
        raise ValueError(f"no 'forward' phase in rank {rank_trace['rank']}'s trace: trace profile_step.py")
    out = {"steps": steps}
    for k in PHASES:
        out[k] = sum(s["dur_us"] for s in spans if s["kind"] == k) / steps / 1e3
    comm = _union((s["start_us"], s["start_us"] + s["dur_us"]) for s in spans if s["kind"] == "all-reduce")
    busy = _union((s["start_us"], s["start_us"] + s["dur_us"]) for s in spans if s["kind"] == "compute")
    out["all-reduce"] = sum(b - a for a, b in comm) / steps / 1e3
    out["overlapped"] = _overlap(comm, busy) / steps / 1e3
    out["exposed"] = out["all-reduce"] - out["overlapped"]
    return out


def collective_order(blocks, step) -> list[str]:
    """Run ``step()`` (one forward and backward) and return this rank's events in the order it issues them.

    ``'AG'`` / ``'RS'``: an all-gather / a reduce-scatter (c10d ops, seen by a ``TorchDispatchMode``, so
    CPU and GPU alike); ``'F<i>'`` / ``'B<i>'``: ``blocks[i]``'s forward / backward starting (module
    pre-hooks, registered after FSDP2's own, so a unit's all-gather comes before its ``F``). Positions are
    issue order, not time. Introduced in ``notebooks/07_memory.ipynb`` (section 5c, ``fsdp2_scale.py``).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    log = []

    class Order(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            log.extend(["AG"] if "allgather" in name else ["RS"] if "reduce_scatter" in name else [])
            return func(*args, **(kwargs or {}))

    hooks = []
    for i, block in enumerate(blocks):
        hooks += [block.register_forward_pre_hook(lambda *_, i=i: log.append(f"F{i}")),
                  block.register_full_backward_pre_hook(lambda *_, i=i: log.append(f"B{i}"))]
    try:
        with Order():
            step()
    finally:
        for h in hooks:
            h.remove()
    return log
