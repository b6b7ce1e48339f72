"""Figures of model parallelism (lesson 05): pipeline timelines, the schedule explorer, the layer
split and the tensor-parallel MLP.

Every function returns the matplotlib Figure (end the cell with ``;``); :func:`explorer` is a widget.
"""

from __future__ import annotations

from mgpu_utils.parallel.schedules import (SCHEDULES, bubble_formula, bubble_fraction, peak_in_flight,
                                           schedule_actions, simulate)


_KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452"}


def plot_timeline(timeline: list[list[dict]], title: str = "", ax=None, unit: str = "time (t_f units)",
                  scale: float = 1.0, t0: float | None = None):  # pragma: no mutate block
    """Gantt chart: one row per rank, forwards blue, backwards orange, labelled with the micro-batch
    (and ``.c`` chunk when a rank holds several chunks); white space is the bubble.

    Args:
        timeline: per rank, dicts with kind/mb/stage/start/end (from :func:`simulate` or a run).
        scale: multiply times by this (1e3 for seconds -> ms); ``t0``: time origin (default: earliest start).

    Returns:
        The matplotlib Figure (end the cell with ``;``).
    """
    import matplotlib.pyplot as plt

    p = len(timeline)
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(11, 0.55 * p + 1.2))
    else:
        fig = ax.figure
    t0 = min(a["start"] for acts in timeline for a in acts) if t0 is None else t0
    n_stages = 1 + max(a["stage"] for acts in timeline for a in acts)
    span = max(a["end"] for acts in timeline for a in acts) - t0
    for r, acts in enumerate(timeline):
        bars = {}                                         # (kind, chunk) -> [(x0, width)]: one call each
        for a in acts:
            x0, w = (a["start"] - t0) * scale, (a["end"] - a["start"]) * scale
            chunk = a["stage"] // p
            bars.setdefault((a["kind"], chunk), []).append((x0, w))
            if w > span * scale / 45:                     # label only bars wide enough to read
                label = f"{a['mb']}" + (f".{chunk}" if n_stages > p else "")
                # on a hatched bar (a later chunk) the label sits on a solid patch, not under the hatching
                ax.text(x0 + w / 2, r, label, ha="center", va="center", fontsize=8, color="white",
                        bbox=dict(boxstyle="square,pad=0.15", fc=_KIND_COLORS[a["kind"]], ec="none") if chunk else None)
        for (kind, chunk), xs in bars.items():
            ax.broken_barh(xs, (r - 0.4, 0.8), facecolors=_KIND_COLORS[kind], edgecolors="k", linewidth=0.5,
                           alpha=1.0 if chunk == 0 else 0.6, hatch="//" if chunk else None)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)                            # rank 0 on top
    ax.margins(x=0.01)
    ax.set_xlabel(unit)
    bf = bubble_fraction(timeline)
    ax.set_title(f"{title}  (bubble {bf:.0%})" if title else f"bubble {bf:.0%}", fontsize=10)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=_KIND_COLORS["F"], label="forward"), Patch(color=_KIND_COLORS["B"],
              label="backward")], loc="lower right", fontsize=8)
    if own:
        fig.tight_layout()
    return fig


def explorer(p: int = 4, m: int = 8, schedule: str = "1f1b"):  # pragma: no mutate block
    """ipywidgets explorer: sliders for p and m, a schedule menu; draws the predicted timeline
    (:func:`simulate`) with its bubble and peak in-flight micro-batches. Returns the widget box, whose
    stored output shows the starting settings as a picture where widgets cannot run
    (:func:`mgpu_utils.figures.widget_view.with_static_view`)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from mgpu_utils.text import wrap_text
    from mgpu_utils.figures.widget_view import with_static_view

    ps = w.IntSlider(value=p, min=1, max=8, description="stages p")
    ms = w.IntSlider(value=m, min=1, max=32, description="micro m")
    sc = w.Dropdown(options=list(SCHEDULES), value=schedule, description="schedule")
    out = w.Output()

    def figure(pp, mm, name):
        """The timeline figure and its one-line summary for these settings."""
        note = ""
        if name == "interleaved" and mm % pp:
            note = f"interleaved needs m divisible by p: using m = {mm - mm % pp or pp}\n"
            mm = mm - mm % pp or pp
        v = 2 if name == "interleaved" else 1
        tl = simulate(schedule_actions(name, pp, mm))
        m_eff = 1 if name == "naive" else mm
        return plot_timeline(tl, f"{name}, p={pp}, m={mm}"), (
            f"{note}bubble {bubble_fraction(tl):.3f} (formula {bubble_formula(pp, m_eff, v):.3f}); "
            f"peak in-flight micro-batches per rank: {peak_in_flight(tl)}")

    def draw(*_):
        with out:
            out.clear_output(wait=True)
            fig, summary = figure(ps.value, ms.value, sc.value)
            plt.show()
            print(wrap_text(summary))
            plt.close(fig)

    for wd in (ps, ms, sc):
        wd.observe(draw, names="value")
    draw()
    return with_static_view(w.VBox([w.HBox([ps, ms, sc]), out]), *figure(p, m, schedule))


def draw_layer_split(p: int = 4, layers: int = 8):  # pragma: no mutate block
    """Concept picture: a stack of ``layers`` layers cut into ``p`` stages, stage r on rank r;
    activations travel down the pipeline in forward, gradients back up in backward. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.set_xlim(-0.5, p * 3)
    ax.set_ylim(-0.9, 3.2)
    ax.axis("off")
    per = layers // p
    for r in range(p):
        x0 = r * 3
        ax.add_patch(FancyBboxPatch((x0, 0.4), 2.0, 2.3, boxstyle="round,pad=0.05", fc=colors[r % 8], alpha=0.25))
        ax.text(x0 + 1.0, 2.85, f"rank {r}: stage {r}", ha="center", fontsize=9, weight="bold")
        for j in range(per):
            y0 = 0.6 + (per - 1 - j) * 1.9 / per           # first layer of the stage on top
            ax.add_patch(FancyBboxPatch((x0 + 0.2, y0), 1.6, 1.6 / per, boxstyle="round,pad=0.02",
                                        fc=colors[r % 8], alpha=0.85))
            ax.text(x0 + 1.0, y0 + 0.8 / per, f"layer {r * per + j}", ha="center", va="center",
                    color="white", fontsize=8)
        if r < p - 1:
            ax.annotate("", xy=(x0 + 3.0, 1.9), xytext=(x0 + 2.05, 1.9), arrowprops=dict(arrowstyle="->", lw=1.8))
            ax.annotate("", xy=(x0 + 2.05, 1.1), xytext=(x0 + 3.0, 1.1),
                        arrowprops=dict(arrowstyle="->", lw=1.8, color="#C44E52"))
            ax.text(x0 + 2.52, 2.05, "activation", ha="center", fontsize=8)
            ax.text(x0 + 2.52, 0.8, "gradient", ha="center", fontsize=8, color="#C44E52")
    ax.text(p * 1.5 - 0.5, -0.5, "forward: rank r waits for rank r-1 (send/recv of activations);  backward: rank r "
            "waits for rank r+1 (gradients)", ha="center", fontsize=9, style="italic")
    ax.set_title(f"Layer split: {layers} layers on {p} ranks; each rank stores only its own layers", fontsize=11)
    fig.tight_layout()
    return fig


def draw_tp_mlp(t: int = 2):
    """Concept picture of the Megatron MLP on ``t`` ranks: fc1's weight split by output columns,
    fc2's by input rows, f before and g after (one all-reduce each way). Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.6, 4.2)
    ax.axis("off")
    ax.add_patch(Rectangle((0.2, 1.0), 1.0, 2.0, fc="#bbbbbb", ec="k"))
    ax.text(0.7, 2.0, "X\n(b·s, h)\nsame on\nevery rank", ha="center", va="center", fontsize=8)
    ax.text(1.75, 3.45, "f", fontsize=14, weight="bold", ha="center")
    ax.text(1.75, 0.5, "fwd: identity\nbwd: all-reduce", fontsize=8, ha="center")
    for r in range(t):                                   # A = [A_1 .. A_t]: columns
        ax.add_patch(Rectangle((2.4 + r * 2.0 / t, 1.0), 2.0 / t, 2.0, fc=colors[r % 8], ec="k", alpha=0.8))
        ax.text(2.4 + (r + 0.5) * 2.0 / t, 2.0, f"A{r}", ha="center", va="center", color="white", fontsize=8)
    ax.text(3.4, 3.3, "fc1: A split by columns\n(column parallel)", ha="center", fontsize=8)
    ax.text(5.2, 2.0, "gelu\n(local)", ha="center", va="center", fontsize=8)
    for r in range(t):                                   # B = [B_1; ..; B_t]: rows
        ax.add_patch(Rectangle((6.2, 3.0 - (r + 1) * 2.0 / t), 2.0, 2.0 / t, fc=colors[r % 8], ec="k", alpha=0.8))
        ax.text(7.2, 3.0 - (r + 0.5) * 2.0 / t, f"B{r}", ha="center", va="center", color="white", fontsize=8)
    ax.text(7.2, 3.3, "fc2: B split by rows\n(row parallel)", ha="center", fontsize=8)
    ax.text(8.9, 3.45, "g", fontsize=14, weight="bold", ha="center")
    ax.text(8.9, 0.5, "fwd: all-reduce\nbwd: identity", fontsize=8, ha="center")
    ax.add_patch(Rectangle((9.8, 1.0), 1.0, 2.0, fc="#bbbbbb", ec="k"))
    ax.text(10.3, 2.0, "Z = Σ_r\ngelu(X A_r)\n· B_r", ha="center", va="center", fontsize=8)
    for x0, x1 in ((1.25, 2.35), (4.45, 4.75), (5.65, 6.15), (8.25, 9.75)):
        ax.annotate("", xy=(x1, 2.0), xytext=(x0, 2.0), arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.set_title(f"Tensor-parallel MLP on {t} ranks: rank r holds A_r and B_r; one all-reduce forward, "
                 "one backward", fontsize=10)
    ax.text(6, -0.4, "attention: the same with heads split across ranks (rows of W_q, W_k, W_v; columns of W_o)",
            ha="center", fontsize=8, style="italic")
    fig.tight_layout()
    return fig
