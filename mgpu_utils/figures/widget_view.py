"""Widgets that still show something where they cannot run (lessons 04, 05, 06 and 07).

A live ipywidget needs a running kernel. A notebook opened without running it (JupyterLab before
Run All, GitHub, Colab's preview, nbviewer) can only show what the stored output holds. By default that
is ipywidgets' text repr, ``interactive(children=(IntSlider(...``, which a student cannot read.

:func:`with_static_view` adds a static picture of the widget's default settings to what the widget
shows. It also adds one line saying "run this cell for the interactive version". A live front end
still shows the widget. :func:`strip_live_views` then removes the live part from the notebooks that
``make course`` stores, so every front end shows the picture until the cell runs.
"""

from __future__ import annotations

import base64
import io

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RUN_LINE = "A static view of the starting settings: run this cell for the interactive version."


def figure_png(fig, note: str = RUN_LINE) -> str:
    """A matplotlib figure as a base64 PNG with ``note`` (one or more lines) written under it; closes it.

    Args:
        fig: a ``matplotlib.figure.Figure``.
        note: one line drawn below the axes (empty: none).

    Returns:
        The PNG file's bytes, base64-encoded (the form a notebook's ``image/png`` output holds).
    """
    import matplotlib.pyplot as plt

    if note:
        fig.text(0.5, 0, note, ha="center", va="top", fontsize=10, style="italic", color="#444444")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", facecolor="white")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def with_static_view(widget, picture, note: str = ""):
    """Give ``widget`` a static view of its starting settings, for front ends that cannot run it.

    The widget's rich output (``_repr_mimebundle_``) keeps the live view and gains ``image/png``
    (``picture``, a figure) or a text form (``picture``, a string). Its ``text/plain`` becomes the
    static text, or :data:`RUN_LINE`, instead of ``interactive(children=...)``.

    Args:
        widget: an ipywidgets widget (``interactive``, ``VBox``, ...).
        picture: a ``matplotlib.figure.Figure`` of the starting settings (closed here) or a ``str``
            (what the widget prints for them, e.g. a table).
        note: what the widget prints under its figure for those settings (a summary line), shown
            above :data:`RUN_LINE`.

    Returns:
        ``widget`` itself, so ``stepper = with_static_view(...)`` still has ``.children`` etc.

    Raises:
        TypeError: ``picture`` is neither a figure nor a string.
    """
    lines = (note.rstrip("\n") + "\n" if note else "") + RUN_LINE
    if isinstance(picture, str):
        png, text = None, picture.rstrip("\n") + "\n\n" + lines
    elif hasattr(picture, "savefig"):
        png, text = figure_png(picture, lines), lines
    else:
        raise TypeError(f"picture must be a matplotlib Figure or a str, not {type(picture).__name__}")
    live = widget._repr_mimebundle_

    def bundle(**kwargs):
        data = dict(live(**kwargs))
        data["text/plain"] = text
        if png is not None:
            data["image/png"] = png
        return data

    widget._repr_mimebundle_ = bundle  # IPython looks this method up on the instance
    return widget


def strip_live_views(nb) -> int:
    """Remove the live-widget part from a notebook's stored outputs, in place.

    An output that also holds a static view (``image/png`` or text) keeps it; the live view, which
    no front end can draw without the kernel that made it, goes, and so does the saved widget
    state (``metadata.widgets``). ``make course`` (:mod:`mgpu_utils.course`) calls this before
    it writes a notebook.

    Args:
        nb: a ``nbformat`` notebook node.

    Returns:
        How many outputs lost a live view.
    """
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if WIDGET_VIEW in out.get("data", {}):
                del out["data"][WIDGET_VIEW]
                n += 1
    nb.metadata.pop("widgets", None)
    return n
