"""Figures of notebooks/10_benchmarking.ipynb and benchmarks/scaling.py: scaling, timelines, predictions.

Every figure names the threads per rank it was measured with; text is at least 9 pt at the displayed width.
"""

from __future__ import annotations

from mgpu_utils import scaling
from mgpu_utils.bandwidth import ring_allreduce_model

_PHASE_COLORS = {"data": "#8FB8DE", "forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868",
                 "all-reduce": "#C44E52"}


def plot_scaling(study: dict, strong: list[dict], weak: list[dict] | None = None, cores: int | None = None):  # pragma: no mutate block
    """Measured speed-ups (strong and weak scaling) with the ideal line, Amdahl's fit and the alpha-beta model.

    Args:
        study: :func:`mgpu_utils.bench.study` of the same runs.
        strong, weak: the runs (rows of :func:`mgpu_utils.bench.scaling_runs`).
        cores: physical cores (the shaded region beyond them is oversubscribed).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    threads = strong[0]["threads_per_rank"]
    n_max = max(r["world_size"] for r in strong + (weak or []))
    grid = np.linspace(1, max(n_max, 2), 50)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, rows, label in ((a1, strong, "strong"), (a1, weak, "weak")):
        if rows:
            ns = [r["world_size"] for r in rows]
            ax.plot(ns, [r["speedup"] for r in rows], "o-", label=f"{label} scaling, measured")
    a1.plot(grid, grid, "k--", lw=1, label="ideal")
    f = study.get("serial_fraction")
    if f is not None:
        a1.plot(grid, scaling.amdahl_speedup(grid, f), ":", color="gray", label=f"Amdahl fit, f = {f:.3f}")
    if cores and cores < n_max:
        a1.axvspan(cores + 0.5, n_max + 0.5, color="#F2C9A9", alpha=0.5, label="more ranks than cores")
    a1.set(xlabel="ranks", ylabel="speed-up over 1 rank", title=f"Speed-up ({threads} thread per rank)")
    a1.legend(fontsize=9, loc="upper left")
    a1.grid(alpha=0.3)
    ab = study.get("alpha_beta")
    if ab:
        from matplotlib.ticker import FuncFormatter

        r = next(r for r in strong if r["world_size"] == ab["world_size"])
        b = np.array([p[0] for p in r["allreduce_s"]], dtype=float)
        a2.loglog(b / 2**20, [1e3 * p[1] for p in r["allreduce_s"]], "o", label=f"{ab['world_size']} ranks, measured")
        a2.loglog(b / 2**20, 1e3 * ring_allreduce_model(b, ab["world_size"], ab["alpha_s"], ab["bandwidth_bps"]),
                  "-", color="gray", label="alpha-beta fit")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        for axis in (a2.xaxis, a2.yaxis):
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        a2.set(xlabel="all-reduce size (MiB)", ylabel="ms (median)",
               title=f"all-reduce: alpha {1e6 * ab['alpha_s']:.0f} us, B {ab['bandwidth_bps'] / 1e9:.2f} GB/s")
        a2.legend(fontsize=9)
        a2.grid(alpha=0.3, which="both")
    else:
        a2.text(0.5, 0.5, "no all-reduce sweep\n(needs 2 or more ranks)", ha="center", va="center",
                transform=a2.transAxes, fontsize=11)
        a2.set_axis_off()
    fig.tight_layout()
    return fig


def plot_timeline(traces: list[dict], threads_per_rank: int | None = None):  # pragma: no mutate block
    """Each rank's traced steps on one time axis: its phases on one row, its all-reduces on the row below.

    Args:
        traces: :func:`mgpu_utils.profiling.load_spans` of every rank (same machine: one clock).
        threads_per_rank: named in the title.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = min(s["start_us"] for t in traces for s in t["spans"])
    traces = sorted(traces, key=lambda t: t["rank"])
    height = 1.2 + 0.8 * len(traces)
    fig, ax = plt.subplots(figsize=(11, height))
    labels = []
    for i, t in enumerate(traces):
        y_main, y_comm = 2 * i, 2 * i + 1
        labels += [f"rank {t['rank']} steps", f"rank {t['rank']} all-reduce"]
        for s in t["spans"]:
            if s["kind"] == "compute":
                continue
            y = y_comm if s["kind"] == "all-reduce" else y_main
            ax.barh(y, s["dur_us"] / 1e3, left=(s["start_us"] - t0) / 1e3, height=0.7,
                    color=_PHASE_COLORS[s["kind"]], edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first traced event")
    threads = f", {threads_per_rank} thread per rank" if threads_per_rank else ""
    ax.set_title(f"torch.profiler traces of {len(traces)} ranks{threads}")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in _PHASE_COLORS.items()], ncol=5, fontsize=9,
               loc="lower center")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))
    return fig
