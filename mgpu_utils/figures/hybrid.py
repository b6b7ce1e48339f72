"""Figures of notebooks/06_hybrid_parallel.ipynb. Every function returns the matplotlib Figure
(end the cell with ``;``). ``draw_*`` are schematic; ``plot_*`` draw results of a run or of the planner.
"""

from __future__ import annotations

_DP_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def draw_mesh_2d(dp: int = 2, tp: int = 2, n_heads: int = 4):
    """The (dp, tp) device mesh: rank = d * tp + t. A row is a tp group (one model replica, its blocks split
    by heads and MLP columns; activations all-reduced inside the layer), a column is a dp group (same
    shard of the weights, different data; gradients all-reduced once per step)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(min(11, 2.6 * tp + 4.2), 1.5 * dp + 1.6))
    ax.set_xlim(-0.4, 2.6 * tp + 3.6)
    ax.set_ylim(-0.9, 1.5 * dp + 0.3)
    ax.axis("off")
    hp = n_heads // tp
    for d in range(dp):
        y = 1.5 * (dp - 1 - d)
        for t in range(tp):
            x = 2.6 * t
            ax.add_patch(FancyBboxPatch((x, y), 2.1, 1.0, boxstyle="round,pad=0.04", fc=_DP_COLORS[d % 8],
                                        alpha=0.25 + 0.5 * (t + 1) / tp, ec="k"))
            ax.text(x + 1.05, y + 0.68, f"rank {d * tp + t}", ha="center", weight="bold", fontsize=10)
            ax.text(x + 1.05, y + 0.22, f"heads {t * hp}..{(t + 1) * hp - 1}, MLP cols {t + 1}/{tp}\n"
                    f"batch rows of replica {d}", ha="center", fontsize=8)
        if tp > 1:
            ax.annotate("", xy=(2.6 * tp - 0.45, y + 0.5), xytext=(2.15, y + 0.5),
                        arrowprops=dict(arrowstyle="<->", color="crimson", lw=1.5))
        ax.text(2.6 * tp, y + 0.5, f"tp group {d}: all-reduce of activations,\n2 per layer forward + 2 backward",
                fontsize=8, color="crimson", va="center")
    for t in range(tp):
        ax.annotate("", xy=(2.6 * t + 0.12, -0.05), xytext=(2.6 * t + 0.12, 1.5 * dp - 0.45),
                    arrowprops=dict(arrowstyle="<->", color="green", lw=1.2, ls="--"))
    ax.text(0, -0.6, "dp groups (columns): same weight shard, different data; one gradient all-reduce per step",
            fontsize=8, color="green")
    ax.set_title(f"A {dp} x {tp} device mesh: init_device_mesh(device, ({dp}, {tp}), mesh_dim_names=('dp', 'tp'))",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw_3d(dp: int = 2, tp: int = 4, pp: int = 2, gpus_per_node: int = 8):
    """Ranks of a (dp, tp, pp) layout in Megatron's order (tp fastest, then dp, then pp): one panel per
    pipeline stage, rows = dp replicas, columns = tp shards; colour = node."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, pp, figsize=(min(11, 1.0 * tp * pp + 1.5 * pp), 0.7 * dp + 1.3), squeeze=False)
    for p, ax in enumerate(axes[0]):
        for d in range(dp):
            for t in range(tp):
                r = p * dp * tp + d * tp + t
                ax.add_patch(plt.Rectangle((t, dp - 1 - d), 0.9, 0.8, fc=_DP_COLORS[(r // gpus_per_node) % 8],
                                           alpha=0.6, ec="k"))
                ax.text(t + 0.45, dp - 1 - d + 0.4, str(r), ha="center", va="center", fontsize=8)
        ax.set_xlim(-0.1, tp)
        ax.set_ylim(-0.1, dp)
        ax.set_xticks([t + 0.45 for t in range(tp)], [f"tp {t}" for t in range(tp)], fontsize=8)
        ax.set_yticks([dp - 1 - d + 0.4 for d in range(dp)], [f"dp {d}" for d in range(dp)], fontsize=8)
        ax.set_title(f"pipeline stage {p}\n(layer block {p + 1} of {pp})", fontsize=9)
        for s in ax.spines.values():
            s.set_visible(False)
    where = lambda inside: "inside a node" if inside else "across nodes"
    fig.suptitle(f"dp={dp} x tp={tp} x pp={pp} = {dp * tp * pp} GPUs; colour = node of {gpus_per_node} GPUs: tp groups "
                 f"{where(tp <= gpus_per_node)}, dp groups {where(tp * dp <= gpus_per_node)}, pp groups "
                 f"{where(tp * dp * pp <= gpus_per_node)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_mesh_losses(result: dict, tol: float | None = None):
    """Loss per step of every mesh of a hybrid_gpt2.py run and of the single-process reference (left),
    and each mesh's absolute difference from the reference (right, log scale; ``tol`` drawn as a line)."""
    import matplotlib.pyplot as plt
    import numpy as np

    ref = np.array(result["reference"]["loss"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    steps = np.arange(1, len(ref) + 1)
    a1.plot(steps, ref, "k-", lw=4, alpha=0.3, label="single process (reference)")
    for i, (name, r) in enumerate(result["layouts"].items()):
        loss = np.array(r["loss"])
        a1.plot(steps, loss, "o-" if i == 0 else "--", ms=3, color=_DP_COLORS[i], label=f"mesh dp x tp = {name}")
        a2.semilogy(steps + 0.15 * i, np.maximum(np.abs(loss - ref), 1e-9), "o", ms=4, color=_DP_COLORS[i],
                    label=name)
    a1.set(xlabel="step", ylabel="training loss (nats per byte)",
           title=f"GPT-2 ({result['layers']} layers, h={result['embd']}) on stdlib docstrings")
    a1.legend(fontsize=8)
    if tol is not None:
        a2.axhline(tol, color="crimson", ls="--", label=f"tolerance {tol:g}")
    a2.set(xlabel="step", ylabel="|loss - reference loss| (0 drawn at 1e-9)",
           title="difference from the single-process run")
    a2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_plan(layouts, memory_gb: float, title: str = ""):
    """Planner output: memory per GPU against communication seconds per step, one point per layout
    (feasible: filled and labelled dp/tp/pp; infeasible: grey crosses); the GPU memory as a line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for x in layouts:
        if x.memory is None:
            continue
        comm = sum(x.comm_s.values())
        if x.feasible:
            ax.scatter(comm, x.memory_gb, color="#55A868", s=40, zorder=3)
            ax.annotate(f"{x.dp}/{x.tp}/{x.pp}", (comm, x.memory_gb), fontsize=8, xytext=(3, 3),
                        textcoords="offset points")
        else:
            ax.scatter(comm, x.memory_gb, color="grey", marker="x", s=20, alpha=0.6)
    ax.axhline(memory_gb, color="crimson", ls="--", label=f"GPU memory {memory_gb:g} GB")
    ax.set(xscale="log", yscale="log", xlabel="communication per step, no overlap (s)",
           ylabel="memory per GPU (GB)", title=title or "layouts: dp/tp/pp (green: feasible)")
    ax.text(0.99, 0.02, "grey x: infeasible (memory, tp > node, divisibility)", transform=ax.transAxes,
            ha="right", fontsize=8, color="grey")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plan_explorer(n_gpus: int = 1024, gpu: str = "A100", recompute: str = "selective", zero_stage: int = 0,
                  precision: str = "mixed", global_batch: int = 1536):  # pragma: no mutate block
    """An ipywidgets explorer of the planner (:func:`mgpu_utils.costs.planner.plan`) for GPT-3 175B: menus for the
    cluster size, GPU (A100 with NVLink 3 and InfiniBand HDR, or H100/H200 with NVLink 4 and NDR),
    recomputation, ZeRO stage and precision; prints the feasible (dp, tp, pp) layouts, best first
    (:func:`mgpu_utils.costs.planner.table`; at least 3 rows, so infeasible ones show their reason).

    Returns the widget, whose stored output shows the table for the starting settings where widgets
    cannot run (:func:`mgpu_utils.figures.widget_view.with_static_view`). Introduced in
    ``notebooks/06_hybrid_parallel.ipynb``.
    """
    import ipywidgets as widgets

    from mgpu_utils.costs import planner
    from mgpu_utils.figures.widget_view import with_static_view

    def table(n_gpus, gpu, recompute, zero_stage, precision) -> str:
        hopper = gpu.startswith("H")
        cluster = planner.Cluster(n_gpus=n_gpus, gpu=gpu, gpus_per_node=8,
                                  intra_link="NVLink 4 (H100, 18 links)" if hopper else "NVLink 3 (A100, 12 links)",
                                  inter_link="InfiniBand NDR (400 Gb/s)" if hopper else "InfiniBand HDR (200 Gb/s)")
        layouts = planner.plan(planner.GPT3_175B, cluster, global_batch=global_batch, recompute=recompute,
                               zero_stage=zero_stage, precision=precision)
        return planner.table(layouts, limit=max(3, sum(lay.feasible for lay in layouts)))

    def show(n_gpus, gpu, recompute, zero_stage, precision):
        print(table(n_gpus, gpu, recompute, zero_stage, precision))

    start = dict(n_gpus=n_gpus, gpu=gpu, recompute=recompute, zero_stage=zero_stage, precision=precision)
    box = widgets.interactive(show,
                              n_gpus=widgets.Dropdown(options=[256, 512, 1024, 1536, 2048], value=n_gpus,
                                                      description="n_gpus"),
                              gpu=widgets.Dropdown(options=["A100", "H100", "H200"], value=gpu, description="gpu"),
                              recompute=widgets.Dropdown(options=["none", "selective", "full"], value=recompute,
                                                         description="recompute"),
                              zero_stage=widgets.Dropdown(options=[0, 1, 2, 3], value=zero_stage,
                                                          description="zero_stage"),
                              precision=widgets.Dropdown(options=["mixed", "mixed_fp32_grads"], value=precision,
                                                         description="precision"))
    return with_static_view(box, table(**start))
