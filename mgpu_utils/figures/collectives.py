"""Figures of collectives (lesson 04): what each collective moves, and the ring all-reduce step by step.

Every function returns the matplotlib Figure (end the cell with ``;``); :func:`ring_stepper` is a widget.
"""

from __future__ import annotations

from mgpu_utils.figures.common import rank_color


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
                ax.add_patch(plt.Rectangle((j, r), 1, 1, fc=rank_color(src) if src is not None else "#BBBBBB",
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

    from mgpu_utils.parallel.ring import ring_schedule, ring_states

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
    a picture (:func:`mgpu_utils.figures.widget_view.with_static_view`); :func:`draw_ring_steps` draws any steps.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from mgpu_utils.figures.widget_view import with_static_view

    def show(step):
        draw_ring_steps(n, [step])
        plt.show()

    slider = widgets.IntSlider(value=0, min=0, max=2 * (n - 1), description="step")
    return with_static_view(widgets.interactive(show, step=slider), draw_ring_steps(n, [0]))
