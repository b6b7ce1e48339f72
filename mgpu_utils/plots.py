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


def draw_zero_stages(ranks: int = 4):
    """Which rank holds which part of the model states under ZeRO stages 0-3 (mixed-precision Adam).

    One panel per stage, one row per rank; each row is the model states of one parameter in bytes:
    2 (16-bit weights), 2 (16-bit gradients), 12 (fp32 master weights and Adam's two moments). A
    sharded kind is cut into ``ranks`` slices and rank r keeps slice r (coloured); the rest is held by
    the other ranks (white). Titles give the bytes per parameter each rank keeps (ZeRO paper, fig. 1).

    Introduced in ``notebooks/07_memory.ipynb`` (section 5).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    kinds = [("weights (2 B)", 2, "#4C72B0"), ("grads (2 B)", 2, "#DD8452"), ("optimizer states (12 B)", 12, "#55A868")]
    sharded = {0: set(), 1: {2}, 2: {1, 2}, 3: {0, 1, 2}}      # stage -> indices of the sharded kinds
    fig, axes = plt.subplots(1, 4, figsize=(10.7, 1.3 + 0.55 * ranks), sharey=True)
    for stage, ax in enumerate(axes):
        per_rank = sum(b / ranks if i in sharded[stage] else b for i, (_, b, _) in enumerate(kinds))
        for r in range(ranks):
            y, x = ranks - 1 - r, 0.0
            for i, (_, b, color) in enumerate(kinds):
                if i in sharded[stage]:
                    w = b / ranks
                    for q in range(ranks):
                        ax.add_patch(Rectangle((x + q * w, y), w, 0.7, fc=color if q == r else "white",
                                               ec="#444444", lw=0.6))
                else:
                    ax.add_patch(Rectangle((x, y), b, 0.7, fc=color, ec="#444444", lw=0.6))
                x += b
        ax.set_xlim(0, 16)
        ax.set_ylim(-0.2, ranks)
        ax.set_xticks([0, 2, 4, 16])
        ax.set_xlabel("bytes per parameter")
        names = [kinds[i][0].split(" (")[0] for i in sorted(sharded[stage])]
        shards = ("plain data parallel" if not names else         # the last kind on its own line: no overlap
                  "shards " + (", ".join(names[:-1]) + ",\n" if len(names) > 1 else "") + names[-1])
        ax.set_title(f"stage {stage}: {per_rank:g} B per rank\n{shards}", fontsize=10)
    axes[0].set_yticks([ranks - 1 - r + 0.35 for r in range(ranks)])
    axes[0].set_yticklabels([f"rank {r}" for r in range(ranks)])
    handles = [Rectangle((0, 0), 1, 1, fc=c, ec="#444444") for _, _, c in kinds]
    handles.append(Rectangle((0, 0), 1, 1, fc="white", ec="#444444"))
    fig.legend(handles, [k for k, _, _ in kinds] + ["held by another rank"], loc="lower center", ncol=4,
               fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
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
    a1.plot(n, speedup, "o-", color=_color(0), label="measured")
    for k, s in zip(n, speedup):
        a1.annotate(f"{s:.2f}x", (k, s), textcoords="offset points", xytext=(6, -12), fontsize=10)
    a1.set(xlabel="ranks (same global batch)", ylabel="speed-up over 1 rank", xticks=n,
           title="Strong scaling: speed-up")
    bars = a2.bar([str(k) for k in n], eff, color=[_color(1)] * len(n))
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


def plot_collective(name: str, before: list, after: list, rule: str = "", base: int = 10, reduced: bool = False):
    """Every rank's tensor before and after one operation, as two small tables (data from a real run).

    Values are coloured by the rank they came from (rank r starts with base*r, base*r+1, ...); sums are grey.

    Args:
        name: the operation, used as the title.
        before, after: one list of numbers per rank (an empty list where the result is undefined).
        rule: one sentence printed under the title.
        base: rank r's values are base*r + j (collectives_demo.py); used to colour a value by its rank.
        reduced: the results are sums (reduce, all-reduce, reduce-scatter): drawn grey.
    """
    import matplotlib.pyplot as plt

    width = max(len(r) for r in before + after)
    fig, axes = plt.subplots(1, 2, figsize=(min(11, 3 + 0.42 * (len(before[0]) + width)), 0.55 * len(before) + 1.1),
                             gridspec_kw={"width_ratios": [len(before[0]), max(width, 1)]})
    for ax, rows, label in ((axes[0], before, "before"), (axes[1], after, "after")):
        ax.set_xlim(0, max(len(r) for r in rows) or 1)
        ax.set_ylim(len(rows), 0)
        ax.axis("off")
        ax.set_title(label, fontsize=9)
        for r, row in enumerate(rows):
            if not row:
                ax.text(0.1, r + 0.5, "(undefined)", va="center", fontsize=8, color="gray")
            for j, v in enumerate(row):
                src = None if (reduced and rows is after) else int(v) // base   # rank r starts with base*r + j
                ax.add_patch(plt.Rectangle((j, r), 1, 1, fc=_color(src) if src is not None else "#BBBBBB",
                                           alpha=0.35, ec="white"))
                ax.text(j + 0.5, r + 0.5, f"{v:g}", ha="center", va="center", fontsize=8)
    for r in range(len(before)):
        axes[0].text(-0.2, r + 0.5, f"rank {r}", ha="right", va="center", fontsize=8)
    fig.suptitle(f"{name}" + (f": {rule}" if rule else ""), fontsize=10, x=0.02, ha="left")
    fig.tight_layout()
    return fig


def draw_ring_steps(n: int = 4, steps=None):
    """Ring all-reduce on n ranks, one panel per state: which chunk each rank holds and sends.

    Cell (rank r, chunk c) is shaded by how many ranks' data it already contains (white: only its
    own, dark: all n); an arrow marks the chunk each rank sends in the next step. ``steps``: the
    states to draw (default: all 2(n-1)+1). Static form of :func:`ring_stepper`.
    """
    import matplotlib.pyplot as plt

    from mgpu_utils.ring import ring_schedule, ring_states

    states, sched = ring_states(n), ring_schedule(n)
    steps = list(range(len(states))) if steps is None else list(steps)
    cols = min(len(steps), 4)
    rows = (len(steps) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.75 * cols, 0.6 * n * rows + 0.9 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, k in zip(axes.flat, steps):
        for r in range(n):
            for c in range(n):
                frac = len(states[k][r][c]) / n
                ax.add_patch(plt.Rectangle((c, r), 1, 1, fc=plt.cm.Blues(0.1 + 0.85 * frac), ec="white"))
                ax.text(c + 0.5, r + 0.5, f"{len(states[k][r][c])}/{n}", ha="center", va="center", fontsize=8,
                        color="white" if frac > 0.6 else "black")
            if k < len(sched):
                c = sched[k]["send"][r]
                ax.annotate("", xy=(c + 0.5, r + 0.98), xytext=(c + 0.5, r + 0.55),
                            arrowprops=dict(arrowstyle="->", color="#C44E52", lw=1.6))
        ax.set_xlim(-0.9, n)
        ax.set_ylim(n, -0.3)
        for r in range(n):
            ax.text(-0.1, r + 0.5, f"r{r}", ha="right", va="center", fontsize=8)
        title = "start" if k == 0 else f"after step {k}: {sched[k - 1]['phase']}"
        ax.set_title(title, fontsize=8)
    fig.suptitle(f"Ring all-reduce, {n} ranks x {n} chunks: fraction of ranks summed into each chunk "
                 "(red arrow: chunk sent to the next rank)", fontsize=9)
    fig.tight_layout()
    return fig


def ring_stepper(n: int = 4):
    """An ipywidgets slider over the 2(n-1) steps of ring all-reduce, drawing one state at a time.

    Returns the widget (display it, or let it be the cell's value). Where widgets do not render
    (a notebook opened without running it, GitHub, a static HTML export) its output shows step 0 as
    a picture (:func:`mgpu_utils.widget_view.with_static_view`); :func:`draw_ring_steps` draws any steps.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from mgpu_utils.widget_view import with_static_view

    def show(step):
        draw_ring_steps(n, [step])
        plt.show()

    slider = widgets.IntSlider(value=0, min=0, max=2 * (n - 1), description="step")
    return with_static_view(widgets.interactive(show, step=slider), draw_ring_steps(n, [0]))
