"""The course's figures. Every function returns the matplotlib Figure (end the cell with ``;``).

Concept pictures (``draw_*``) are schematic; data plots (``plot_*``) draw measured results that a
launch script returned.
"""

from __future__ import annotations

_RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def _color(r: int) -> str:
    return _RANK_COLORS[r % len(_RANK_COLORS)]


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
            ax.add_patch(FancyBboxPatch((x, 1.9), 1.6, 1.3, boxstyle="round,pad=0.05", fc=_color(r), alpha=0.85))
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
            ax.text(x0 + bwd / 2, y + 0.15, f"bwd L{layers - i}", ha="center", va="center", fontsize=7)
            if i % 2 == 1:  # a bucket is ready every two layers
                ax.barh(y - 0.25, ar, left=x0 + bwd, height=0.3, color="#74c476", edgecolor="k")
                ax.text(x0 + bwd + ar / 2, y - 0.25, f"all-reduce\nbucket {i // 2}", ha="center", va="center",
                        fontsize=6.5)
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
        style = dict(marker="o", ms=4, ls="-" if i == 0 else "--", color=_color(i), label=label)
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
    ax.bar(labels, ms, color=[_color(i) for i in range(len(rows))])
    ax.axhline(1e3 * compute_seconds, color="k", ls="--", label="same step without communication")
    for i, v in enumerate(ms):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
    ax.set(xlabel="bucket_cap_mb in MiB (all-reduce calls per step)", ylabel="forward + backward (ms, median)",
           title="DDP step time against gradient bucket size")
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig
