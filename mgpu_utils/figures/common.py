"""What every figure of the course shares: the rank colours, and loss curves (lessons 00-12).

Figure functions return the matplotlib Figure (end the cell with ``;``).
"""

from __future__ import annotations

RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def rank_color(r: int) -> str:
    """The colour of rank ``r`` in every figure of the course (a hex string)."""
    return RANK_COLORS[r % len(RANK_COLORS)]


def plot_losses(curves: dict[str, list[float]], title: str, ylabel: str = "loss"):
    """One line per ``{label: per-step values}`` (lesson 10). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.4))
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(values, color=rank_color(i), label=label, lw=1.2)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
