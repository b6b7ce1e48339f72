"""Figures of notebooks/11_benchmarking.ipynb and benchmarks/scaling.py: scaling, timelines, predictions.

Every figure names the threads per rank it was measured with; text is at least 9 pt at the displayed width.
"""

from __future__ import annotations

from mgpu_utils.costs import scaling
from mgpu_utils.costs.bandwidth import ring_allreduce_model

_PHASE_COLORS = {"data": "#8FB8DE", "forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868",
                 "all-reduce": "#C44E52"}


def plot_scaling(study: dict, strong: list[dict], weak: list[dict] | None = None,  # pragma: no mutate block
                 cores: int | None = None):
    """Measured speed-ups (strong and weak scaling) with the ideal line, Amdahl's fit and the alpha-beta model.

    Args:
        study: :func:`mgpu_utils.measure.scaling_study.study` of the same runs.
        strong, weak: the runs (rows of :func:`mgpu_utils.measure.scaling_study.scaling_runs`).
        cores: physical cores (the shaded region beyond them is oversubscribed); None for GPU runs.

    Returns:
        the matplotlib figure (speed-ups left, the all-reduce sweep and its fit right).
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
    a1.set_xticks(sorted({r["world_size"] for r in strong + (weak or [])}))
    a1.set(xlabel="ranks", ylabel="speed-up over 1 rank", title=f"Speed-up ({threads} thread per rank)")
    a1.legend(fontsize=9, loc="upper left")
    a1.grid(alpha=0.3)
    ab = study.get("alpha_beta")
    if ab:
        from matplotlib.ticker import FuncFormatter, LogLocator

        r = next(r for r in strong if r["world_size"] == ab["world_size"])
        b = np.array([p[0] for p in r["allreduce_s"]], dtype=float)
        a2.loglog(b / 2**20, [1e3 * p[1] for p in r["allreduce_s"]], "o", label=f"{ab['world_size']} ranks, measured")
        a2.loglog(b / 2**20, 1e3 * ring_allreduce_model(b, ab["world_size"], ab["alpha_s"], ab["bandwidth_bps"]),
                  "-", color="gray", label="alpha-beta fit")
        for axis in (a2.xaxis, a2.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
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


def plot_trace_timeline(traces: list[dict], threads_per_rank: int | None = None):  # pragma: no mutate block
    """Each rank's traced steps on one time axis: its phases on one row, its all-reduces on the row below.

    Args:
        traces: :func:`mgpu_utils.measure.profiling.load_spans` of every rank (same machine: one clock).
        threads_per_rank: named in the title.

    Returns:
        the matplotlib figure.
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


def draw_clock_pitfall():  # pragma: no mutate block
    """Why a host clock needs a synchronisation: the host enqueues work that runs later on a device stream
    (or a communication thread); reading the clock right after the enqueue measures the launch, not the work.
    Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 2.6))
    ax.barh(1, 0.6, left=0.2, color="#8FB8DE", height=0.5)
    ax.text(0.5, 1, "enqueue", ha="center", va="center", fontsize=10)
    ax.barh(0, 5.2, left=0.8, color="#4C72B0", height=0.5)
    ax.text(3.4, 0, "the work: kernels on a CUDA stream, or an all-reduce on NCCL / gloo", ha="center",
            va="center", color="white", fontsize=10)
    for x, label, color in ((0.8, "naive clock read\n(measures the launch)", "#C44E52"),
                            (6.0, "after synchronize()\n(measures the work)", "#55A868")):
        ax.axvline(x, color=color, lw=2, ls="--")
        ax.text(x + 0.08, 1.45, label, color=color, fontsize=10, va="center")
    ax.set_yticks([0, 1], ["device / comm thread", "host (Python)"])
    ax.set_ylim(-0.5, 1.9)
    ax.set_xlim(0, 7.6)
    ax.set_xticks([])
    ax.set_xlabel("time")
    ax.set_title("Asynchronous work: stop the clock after a synchronisation")
    fig.tight_layout()
    return fig


def plot_gpu_prediction(pred: dict, title: str):  # pragma: no mutate block
    """Predicted parallel efficiency against GPUs (log2 axis), one line per link and overlap assumption.

    Args:
        pred: ``{label: {N: {"efficiency", ...}}}`` from :func:`mgpu_utils.costs.scaling.predict_scaling`.
        title: the figure's title.

    Returns:
        the matplotlib figure.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.8))
    for label, rows in pred.items():
        ns = sorted(rows)
        ax.plot(ns, [100 * rows[n]["efficiency"] for n in ns], "o-" if "overlap" not in label else "s--",
                ms=4, label=label)
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set(xlabel="GPUs (data parallel)", ylabel="predicted efficiency (%)", ylim=(0, 105), title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def plot_report(rows: list[dict], cores: int | None = None):  # pragma: no mutate block
    """The scaling report's figure: throughput against ranks (strong and weak, with the ideal), and each run's
    parallel efficiency and MFU side by side.

    Args:
        rows: scaling rows with ``mode``, ``world_size``, ``samples_per_s``, ``efficiency`` and ``mfu``.
        cores: physical cores, named in the title (None for runs on GPUs).

    Returns:
        the matplotlib figure; a run without an MFU shows "n/a" instead of a bar.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    threads = rows[0]["threads_per_rank"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for mode, marker in (("strong", "o-"), ("weak", "s-")):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["world_size"])
        if not rs:
            continue
        ns = [r["world_size"] for r in rs]
        line, = a1.plot(ns, [r["samples_per_s"] for r in rs], marker, label=f"{mode} scaling")
        a1.plot(ns, [rs[0]["samples_per_s"] * n for n in ns], ":", color=line.get_color(), label=f"{mode}, ideal")
    a1.set_xticks(sorted({r["world_size"] for r in rows}))
    a1.set(xlabel="ranks", ylabel="samples/s (whole job)",
           title=f"Throughput ({threads} thread per rank" + (f", {cores} cores)" if cores else ")"))
    a1.legend(fontsize=9)
    a1.grid(alpha=0.3)
    labels = [f"{r['mode']}\n{r['world_size']} rank" + ("s" if r["world_size"] > 1 else "") for r in rows]
    x = np.arange(len(rows))
    eff = [100 * r["efficiency"] for r in rows]
    mfu = [100 * r["mfu"] if r.get("mfu") is not None else None for r in rows]
    a2.bar(x - 0.2, eff, 0.4, label="parallel efficiency", color="#4C72B0")
    a2.bar(x + 0.2, [m or 0 for m in mfu], 0.4, label="MFU", color="#DD8452")
    for xi, e, m in zip(x, eff, mfu):
        a2.text(xi - 0.2, e + 1, f"{e:.0f}%", ha="center", va="bottom", fontsize=9)
        a2.text(xi + 0.2, (m or 0) + 1, "n/a" if m is None else f"{m:.0f}%", ha="center", va="bottom", fontsize=9)
    a2.set_xticks(x, labels, fontsize=9)
    a2.set(ylabel="%", ylim=(0, 118), title="Efficiency and MFU per run")
    a2.legend(fontsize=9, loc="upper right")
    fig.tight_layout()
    return fig
