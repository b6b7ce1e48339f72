"""Figures of data parallelism (lessons 00, 02 and 03): ranks, a DataParallel and a DDP step, training
curves, gradient buckets, speed-up, uneven inputs with and without Join.

Concept pictures (``draw_*``) are schematic; data plots (``plot_*``) draw measured results that a
launch script returned. Every function returns the matplotlib Figure (end the cell with ``;``).
"""

from __future__ import annotations

from mgpu_utils.figures.common import rank_color


def draw_ranks(nproc: int = 4, backend: str = "gloo"):
    """Picture of a job: ``nproc`` rank processes and what connects them, here and on GPUs.

    Left: what a launch uses here (``backend`` "gloo": CPU processes; "nccl": one GPU per rank);
    right: the same job on a multi-GPU machine. From 00_setup.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    panels = [("This machine: " + ("ranks on CPU, gloo" if backend == "gloo" else "one GPU per rank, NCCL"),
               "cpu" if backend == "gloo" else "gpu"),
              ("A multi-GPU node: one GPU per rank", "gpu")]
    for ax, (title, kind) in zip(axes, panels):
        ax.set_xlim(0, nproc * 2.2)
        ax.set_ylim(0, 4)
        ax.axis("off")
        ax.set_title(title, fontsize=11)
        for r in range(nproc):
            x = 0.3 + r * 2.2
            ax.add_patch(FancyBboxPatch((x, 1.9), 1.6, 1.3, boxstyle="round,pad=0.05", fc=rank_color(r), alpha=0.85))
            ax.text(x + 0.8, 2.75, f"rank {r}", ha="center", color="white", fontsize=10, weight="bold")
            ax.text(x + 0.8, 2.25, "process\n" + ("CPU" if kind == "cpu" else f"cuda:{r}"), ha="center",
                    color="white", fontsize=8)
        link = "gloo over loopback TCP sockets" if kind == "cpu" else "NCCL over NVLink / PCIe (GPU to GPU)"
        ax.annotate("", xy=(nproc * 2.2 - 0.3, 1.5), xytext=(0.3, 1.5),
                    arrowprops=dict(arrowstyle="<->", lw=2, color="black"))
        ax.text(nproc * 1.1, 0.9, link, ha="center", fontsize=9)
        ax.text(nproc * 1.1, 0.3, "same script, same torch.distributed calls", ha="center", fontsize=8,
                style="italic")
    fig.tight_layout()
    return fig


def draw_data_parallel_step(gpus: int = 3):
    """Schematic of one ``nn.DataParallel`` step on ``gpus`` GPUs, one lane per GPU: scatter the batch,
    replicate the module from GPU 0, parallel_apply (one thread per GPU), gather the outputs on GPU 0,
    the loss and backward (gradients summed onto GPU 0's parameters), and the optimizer step on GPU 0.

    Introduced in ``notebooks/02_data_parallel.ipynb`` (section 3).
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.9 * gpus))
    phases = [("scatter\nbatch", 1.3, "#d9d9d9", "all"), ("replicate\nmodule", 1.3, "#c6dbef", "all"),
              ("parallel_apply:\nforward (threads)", 2.0, "#9ecae1", "all"), ("gather\noutputs", 1.2, "#d9d9d9", "all"),
              ("loss", 0.8, "#fdd0a2", "gpu0"), ("backward:\ngrads summed\non GPU 0", 2.0, "#fdae6b", "all"),
              ("optimizer\nstep", 1.2, "#bcbddc", "gpu0")]
    x = 0.0
    for label, w, color, who in phases:
        for g in range(gpus):
            y = gpus - 1 - g
            if who == "gpu0" and g > 0:
                ax.barh(y, w, left=x, height=0.6, color="white", edgecolor="#bbbbbb", hatch="..")
                continue
            ax.barh(y, w, left=x, height=0.6, color=color, edgecolor="k")
            ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=9)
        x += w
    starts = [sum(w for _, w, _, _ in phases[:i]) for i in range(len(phases))]
    top = gpus - 1
    for g in range(1, gpus):                      # scatter, replicate: from GPU 0; gather, grads: to GPU 0
        for i, down in ((0, True), (1, True), (3, False), (5, False)):
            x0 = starts[i] + 0.12 + 0.08 * g
            a, b = (top - 0.3, top - g + 0.3) if down else (top - g + 0.3, top - 0.3)
            ax.annotate("", xy=(x0, b), xytext=(x0, a), arrowprops=dict(arrowstyle="->", color="#333333", lw=1))
    ax.set_yticks(range(gpus))
    ax.set_yticklabels([f"GPU {gpus - 1 - i}" + (" (master)" if i == gpus - 1 else "") for i in range(gpus)],
                       fontsize=10)
    ax.set_xticks([])
    ax.set_xlabel("one step, in one process (schematic; dotted: the GPU waits)")
    ax.set_xlim(0, x + 0.1)
    ax.set_title("nn.DataParallel: the input and the model leave GPU 0 every step; loss and update stay on it")
    fig.tight_layout()
    return fig


def draw_ddp_step(nproc: int = 3, layers: int = 4):
    """Schematic of one DDP step: forward, backward layer by layer, bucketed all-reduce overlapping
    backward, then the same optimizer step on every rank. From 03_ddp."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.9 + 1.0 * nproc))
    fwd, bwd, ar, opt = 2.0, 0.8, 0.9, 0.8
    for r in range(nproc):
        y = nproc - 1 - r
        ax.barh(y + 0.15, fwd, left=0, height=0.35, color="#9ecae1", edgecolor="k")
        ax.text(fwd / 2, y + 0.15, "forward", ha="center", va="center", fontsize=8)
        for i in range(layers):
            x0 = fwd + i * bwd
            ax.barh(y + 0.15, bwd, left=x0, height=0.35, color="#fdae6b", edgecolor="k")
            ax.text(x0 + bwd / 2, y + 0.15, f"bwd L{layers - i}", ha="center", va="center", fontsize=8)
            if i % 2 == 1:  # a bucket is ready every two layers
                ax.barh(y - 0.25, ar, left=x0 + bwd, height=0.3, color="#74c476", edgecolor="k")
                ax.text(x0 + bwd + ar / 2, y - 0.25, f"all-reduce\nbucket {i // 2}", ha="center", va="center",
                        fontsize=8)
        end = fwd + layers * bwd + ar
        ax.barh(y + 0.15, opt, left=end, height=0.35, color="#bcbddc", edgecolor="k")
        ax.text(end + opt / 2, y + 0.15, "step", ha="center", va="center", fontsize=8)
    ax.set_yticks(range(nproc))
    ax.set_yticklabels([f"rank {nproc - 1 - i}" for i in range(nproc)])
    ax.set_xlabel("time (schematic)")
    ax.set_xticks([])
    ax.set_title("One DDP step: gradients are averaged bucket by bucket while backward is still running")
    ax.set_xlim(0, fwd + layers * bwd + ar + opt + 0.2)
    fig.tight_layout()
    return fig


def draw_uneven_join(batches: int = 3, world: int = 3):  # pragma: no mutate block
    """Uneven inputs under DDP (rank r has ``batches + r`` batches), without and with ``Join``: without it
    the ranks with more batches wait in the first all-reduce that rank 0 never calls, until the collective
    timeout; with it the ranks that ran out join every remaining all-reduce with zeros. From 03_ddp."""
    import matplotlib.pyplot as plt

    steps = batches + world - 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.9 + 0.65 * world), sharey=True)
    for ax, join in zip(axes, (False, True)):
        for r in range(world):
            for s in range(steps):
                stuck = not join and s == batches and r > 0      # waits for rank 0, which has left
                if s < batches + r and (join or s <= batches):
                    color, text = rank_color(r), f"batch {s}" + ("\nwaits: timeout" if stuck else "")
                elif join:
                    color, text = "#dddddd", "zeros"
                else:
                    color, text = "white", "other work" if s == batches else ""
                ax.add_patch(plt.Rectangle((s + 0.05, r - 0.35), 0.9, 0.7, facecolor=color,
                                           edgecolor="#c0392b" if stuck else "#888888", lw=2.5 if stuck else 0.6))
                ax.text(s + 0.5, r, text, ha="center", va="center", fontsize=8,
                        color="#333333" if color in ("white", "#dddddd") else "white")
        ax.set(xlim=(0, steps), ylim=(world - 0.5, -0.5), xticks=[s + 0.5 for s in range(steps)],
               xticklabels=[f"step {s}" for s in range(steps)], yticks=range(world),
               yticklabels=[f"rank {r}" for r in range(world)],
               title="with Join: the finished ranks all-reduce zeros" if join else
               "without Join: an all-reduce waits for a rank that left")
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_training(runs: dict):
    """Loss and test accuracy per epoch for one or more runs.

    Args:
        runs: ``{label: result}`` where result has lists ``train_loss`` and ``test_acc`` (fractions),
            as returned by ``launch_scripts/ddp_train.py``.
    """
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, (label, res) in enumerate(runs.items()):
        ep = range(1, len(res["train_loss"]) + 1)
        style = dict(marker="o", ms=4, ls="-" if i == 0 else "--", color=rank_color(i), label=label)
        a1.plot(ep, res["train_loss"], **style)
        a2.plot(ep, [100 * a for a in res["test_acc"]], **style)
    a1.set(xlabel="epoch", ylabel="training loss (cross-entropy)", yscale="log", title="Training loss")
    n_test = next(iter(runs.values())).get("test_size", "the")
    a2.set(xlabel="epoch", ylabel="test accuracy (%)", title=f"Accuracy on the {n_test} held-out digits")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    return fig


def plot_buckets(rows: list, compute_seconds: float):
    """DDP step time and bucket count against ``bucket_cap_mb`` (rows from ddp_internals.py).

    Args:
        rows: dicts with ``bucket_cap_mb`` (MiB, or "default"), ``buckets_per_step``, ``step_seconds``.
        compute_seconds: the same forward+backward without DDP (no communication), seconds.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    def label(r):
        cap, n = r["bucket_cap_mb"], r["buckets_per_step"]
        return f"{cap if isinstance(cap, str) else format(cap, 'g')}\n({n} bucket{'s' if n != 1 else ''})"

    labels = [label(r) for r in rows]
    ms = [1e3 * r["step_seconds"] for r in rows]
    ax.bar(labels, ms, color=[rank_color(i) for i in range(len(rows))])
    ax.axhline(1e3 * compute_seconds, color="k", ls="--", label="same step without communication")
    for i, v in enumerate(ms):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set(xlabel="bucket_cap_mb in MiB (all-reduce calls per step)", ylabel="forward + backward (ms, median)",
           title="DDP step time against gradient bucket size")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def plot_speedup(rows: list, cores: int | None = None):
    """Strong scaling: speed-up and parallel efficiency against world size (rows from ddp_speedup.py).

    Args:
        rows: dicts with ``world_size``, ``step_seconds`` (median seconds per step, same global
            batch in every row) and ``threads_per_rank``; the row with world size 1 is the baseline.
        cores: physical CPU cores; world sizes above it are drawn hatched as oversubscribed.

    Introduced in ``notebooks/03_ddp.ipynb`` (section 5b).
    """
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["world_size"])
    base = next(r["step_seconds"] for r in rows if r["world_size"] == 1)
    n = [r["world_size"] for r in rows]
    speedup = [base / r["step_seconds"] for r in rows]
    eff = [100 * s / k for s, k in zip(speedup, n)]
    over = [cores is not None and k > cores for k in n]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    a1.plot(n, n, "k--", label="ideal (speed-up = ranks)")
    a1.plot(n, speedup, "o-", color=rank_color(0), label="measured")
    for k, s in zip(n, speedup):
        a1.annotate(f"{s:.2f}x", (k, s), textcoords="offset points", xytext=(6, -12), fontsize=10)
    a1.set(xlabel="ranks (same global batch)", ylabel="speed-up over 1 rank", xticks=n,
           title="Strong scaling: speed-up")
    bars = a2.bar([str(k) for k in n], eff, color=[rank_color(1)] * len(n))
    for b, o in zip(bars, over):
        if o:
            b.set_hatch("//")
            b.set_facecolor("#F2C9A9")
    for i, v in enumerate(eff):
        a2.text(i, v, f"{v:.0f}%", ha="center", va="bottom", fontsize=10)
    a2.axhline(100, color="k", ls="--")
    threads = rows[0].get("threads_per_rank")
    a2.set(xlabel="ranks" + (" (hatched: more ranks than physical cores)" if any(over) else ""),
           ylabel="parallel efficiency (%)", ylim=(0, 115),
           title=f"Efficiency = speed-up / ranks ({threads} thread per rank)")
    a1.grid(alpha=0.3)
    a1.legend(loc="upper left")
    fig.tight_layout()
    return fig
