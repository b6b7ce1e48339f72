"""Figures of notebooks/13_capstone.ipynb: a layout drawn as its mesh of ranks, and the loss curves of the
layouts on top of one process's.

Every function returns the matplotlib Figure (end the cell with ``;``).
"""

from __future__ import annotations

from mgpu_utils.figures.common import rank_color


def draw_layout(sizes: dict, title: str = ""):  # pragma: no mutate block
    """The ranks of a layout's mesh: ``sizes`` ``{dim: size}`` in mesh order, slowest first (e.g. ``{"pp": 2,
    "dp": 2, "tp": 2}``; :func:`mgpu_utils.parallel.layouts.parse_layout` gives them in the order of its DIMS).
    The first dimension's groups are panels side by side, the last dimension's ranks a row (the fastest: neighbours
    in rank), the dimensions between them rows; a box is a rank, coloured by its row (one replica of the last
    dimension's group), labelled with its rank and coordinates."""
    import matplotlib.pyplot as plt
    import numpy as np

    names = [d for d, n in sizes.items() if n > 1] or ["dp"]
    shape = [sizes.get(d, 1) for d in names]
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    if len(shape) == 1:
        ranks, names = ranks[None, None, :], ["", "", names[0]]
    elif len(shape) == 2:
        ranks, names = ranks[None], ["", *names]
    panels, cols = ranks.shape[0], ranks.shape[-1]
    rows = ranks.reshape(panels, -1, cols)
    fig, axes = plt.subplots(1, panels, figsize=(min(12, 1.6 + 2.4 * panels * cols / 2), 0.9 + 0.75 * rows.shape[1]),
                             squeeze=False)
    for p, ax in enumerate(axes[0]):
        for i in range(rows.shape[1]):
            for j in range(cols):
                r = int(rows[p, i, j])
                ax.add_patch(plt.Rectangle((j, -i), 0.9, 0.8, color=rank_color(i), alpha=0.85))
                coord = ",".join(str(c) for c in np.unravel_index(r, shape))
                ax.text(j + 0.45, -i + 0.4, f"rank {r}\n({coord})", ha="center", va="center", fontsize=10,
                        color="white")
        ax.set(xlim=(-0.1, cols), ylim=(-rows.shape[1] + 0.7, 0.9), xticks=[], yticks=[])
        ax.set_xlabel((f"a row: a {names[-1]} group" + (f"; a column: a {names[-2]} group" if names[-2] else ""))
                      if names[-1] else "")
        ax.set_title(f"{names[0]} = {p}" if names[0] else "", fontsize=11)
        ax.axis("off") if not names[0] else [s.set_visible(False) for s in ax.spines.values()]
    fig.suptitle(title or " x ".join(f"{d}{n}" for d, n in zip(names, ranks.shape) if d), fontsize=12)
    fig.tight_layout()
    return fig


def plot_parity(reference: list[float], curves: dict[str, list[float]]):  # pragma: no mutate block
    """Left: one process's loss per step (thick, grey) and every layout's on top of it. Right: each layout's
    |loss - one process's| per step, log scale (0 drawn at 1e-9). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    steps = range(1, len(reference) + 1)
    ax.plot(steps, reference, color="0.6", lw=6, label="one process")
    for i, (name, losses) in enumerate(curves.items()):
        ax.plot(steps, losses, color=rank_color(i), lw=1.4, ls=(0, (3, 2)) if i % 2 else "-", label=name)
        ax2.semilogy(steps, [max(abs(a - b), 1e-9) for a, b in zip(losses, reference)], "o-", color=rank_color(i),
                     lw=1.2, label=name)
    ax.set(xlabel="step", ylabel="loss", title="the loss curves, on top of each other")
    ax2.axhline(1e-5, color="0.3", ls="--", lw=1)
    ax2.text(1, 1.3e-5, "allowed: 1e-5", fontsize=10)
    ax2.text(1, 1.4e-9, "equal (drawn at 1e-9)", fontsize=10)
    ax2.set(xlabel="step", ylabel="|loss - one process|", title="their distance from one process", ylim=(5e-10, 1e-3))
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
