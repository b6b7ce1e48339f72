"""Figures of lesson 08 (context and expert parallelism): who computes which attention scores under ring
attention, the ring's steps, and a mixture-of-experts layer's load and capacity.

Every function returns the matplotlib Figure (end the cell with ``;``).
"""

from __future__ import annotations

from mgpu_utils.figures.common import rank_color
from mgpu_utils.parallel.context import chunk_ranges


def attention_owner(world: int, seq_len: int, layout: str, causal: bool = True):
    """``[S, S]`` int array: the rank that computes score (query i, key j), -1 where the causal mask hides it
    (the score is never computed), from :func:`mgpu_utils.parallel.context.chunk_ranges`."""
    import numpy as np

    owner = np.full((seq_len, seq_len), -1)
    for r in range(world):
        for a, b in chunk_ranges(r, world, seq_len, layout):
            owner[a:b, :] = r
    if causal:
        owner[np.triu_indices(seq_len, 1)] = -1
    return owner


def draw_ring_attention(world: int = 4, seq_len: int = 16):  # pragma: no mutate block
    """Left and middle: the causal attention matrix (queries down, keys across), each score coloured by the
    rank that computes it, for contiguous shards and the zig-zag split; right: the unmasked scores of each
    rank (a block-wise kernel also computes the masked half of its diagonal blocks)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#f2f2f2"] + [rank_color(r) for r in range(world)])
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 1, 1.15]})
    work = {}
    for ax, layout in zip(axes, ("contiguous", "zigzag")):
        owner = attention_owner(world, seq_len, layout)
        ax.imshow(owner + 1, cmap=cmap, vmin=0, vmax=world, interpolation="nearest")
        ax.set(title=f"{layout}: who computes each score", xlabel="key position", ylabel="query position",
               xticks=[], yticks=[])
        work[layout] = [int((owner == r).sum()) for r in range(world)]
    x = np.arange(world)
    for k, layout in enumerate(("contiguous", "zigzag")):
        axes[2].bar(x + (k - 0.5) * 0.38, work[layout], 0.38, label=layout,
                    color=[rank_color(r) for r in range(world)], alpha=1.0 if k == 0 else 0.55,
                    edgecolor="black", linewidth=0.6)
    axes[2].set(xticks=x, xticklabels=[f"rank {r}" for r in range(world)], ylabel="unmasked scores",
                title="scores each rank needs (solid: contiguous)")
    axes[2].legend(fontsize=9)
    fig.tight_layout()
    return fig


def draw_kv_ring(world: int = 4):  # pragma: no mutate block
    """The ring's schedule: at step s rank r holds the key/value block of rank (r - s) mod n; each arrow is
    one block passed to the right neighbour."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.9))
    for s in range(world):
        for r in range(world):
            owner = (r - s) % world
            ax.add_patch(plt.Rectangle((s - 0.35, r - 0.35), 0.7, 0.7, color=rank_color(owner), alpha=0.85))
            ax.text(s, r, f"K,V\nof {owner}", ha="center", va="center", fontsize=9, color="white")
            if s < world - 1:
                ax.annotate("", xy=(s + 0.62, (r + 1) % world), xytext=(s + 0.38, r),
                            arrowprops=dict(arrowstyle="->", color="#555555", lw=0.9))
    ax.set(xlim=(-0.6, world - 0.4), ylim=(world - 0.5, -0.5), xticks=range(world),
           xticklabels=[f"step {s}" for s in range(world)], yticks=range(world),
           yticklabels=[f"rank {r} (queries {r})" for r in range(world)],
           title="ring attention: queries stay, keys and values travel (n - 1 sends in forward)")
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_moe_run(result: dict):  # pragma: no mutate block
    """Left: busiest expert / mean load per training step, with and without the balancing loss; right: the
    capacity factor against dropped assignments and the bytes the all-to-alls carried (expert_parallel.py)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, (coef, values) in enumerate(result["imbalance"].items()):
        label = "no balancing loss" if float(coef) == 0 else f"balancing loss x {float(coef):g}"
        a.plot(values, color=rank_color(i), label=label)
    e, k = result["experts"], result["top_k"]
    a.axhline(1.0, color="black", lw=0.8, ls=":")
    a.text(0, 1.05, "uniform", fontsize=9)
    a.axhline(e / k, color="black", lw=0.8, ls="--")
    a.text(0, e / k + 0.12, f"collapsed: every token on the same {k} experts", fontsize=9)
    a.set(xlabel="training step", ylabel="busiest expert / mean", title="load of the busiest expert",
          ylim=(0, e / k + 0.7))
    a.legend(fontsize=9, loc="lower right")
    cap = result["capacity"]
    x = range(len(cap))
    b.bar([i - 0.2 for i in x], [c["dropped"] / c["assignments"] * 100 for c in cap], 0.4, color=rank_color(3),
          label="assignments dropped (%)")
    b.set(xticks=list(x), xticklabels=[f"{c['capacity_factor']:g}" for c in cap], xlabel="capacity factor",
          ylabel="dropped (%)", title="capacity: dropped tokens against traffic")
    b2 = b.twinx()
    b2.bar([i + 0.2 for i in x], [c["bytes_sent"] / 1e3 for c in cap], 0.4, color=rank_color(0),
           label="all-to-all kB (all ranks)")
    b2.set_ylabel("kB sent")
    lines = [h for ax in (b, b2) for h in ax.get_legend_handles_labels()[0]]
    b.legend(lines, [h.get_label() for h in lines], fontsize=9, loc="upper center")
    fig.tight_layout()
    return fig
