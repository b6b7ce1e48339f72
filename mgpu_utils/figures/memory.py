"""The memory calculator of notebooks/07_memory.ipynb: formulas in, a stacked bar per GPU out.

:func:`calculate` wraps :mod:`mgpu_utils.costs.memory_model` (ZeRO model states, Korthikanti activations)
behind one call; :func:`plot_memory` draws one stacked bar (parameters, gradients, optimizer
states, activations) per configuration; :func:`calculator` is the ipywidgets front end, with a
static figure of the default configuration for notebooks whose widgets do not render.
"""

from __future__ import annotations

from mgpu_utils.costs.memory_model import MemoryBreakdown, calculate, transformer_params

KINDS = ("params", "grads", "optimizer", "activations")
COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52"}


def _as_dict(m) -> dict:  # pragma: no mutate block
    return {k: float(getattr(m, k) if isinstance(m, MemoryBreakdown) else m.get(k, 0.0)) for k in KINDS}


def plot_memory(rows: dict, unit: float = 1e9, unit_name: str = "GB", title: str = "memory per GPU",
                capacity: float | None = None, ax=None):  # pragma: no mutate block
    """Stacked bars: one per entry of ``rows`` ({label: MemoryBreakdown or dict of KINDS in bytes}).

    Each bar's total is written on top; ``capacity`` (bytes, e.g. 80e9) draws a dashed line.
    Returns the matplotlib Figure (end the cell with ``;``).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(min(11, max(5.0, 1.3 * len(rows) + 2)), 3.6))
    else:
        fig = ax.figure
    labels = list(rows)
    bottoms = [0.0] * len(labels)
    for kind in KINDS:
        vals = [_as_dict(rows[k])[kind] / unit for k in labels]
        if any(vals):
            ax.bar(labels, vals, bottom=bottoms, color=COLORS[kind], label=kind, edgecolor="k", linewidth=0.5)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, b in enumerate(bottoms):
        ax.text(i, b, f"{b:.3g}", ha="center", va="bottom", fontsize=8)
    if capacity:
        ax.axhline(capacity / unit, ls="--", color="gray")
        ax.text(len(labels) - 0.5, capacity / unit, f"{capacity / unit:.0f} {unit_name}", ha="right",
                va="bottom", fontsize=8, color="gray")
    ax.set_ylabel(unit_name)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


DEFAULTS = dict(n_params=0, layers=32, hidden=4096, heads=32, seq_len=2048, micro_batch=1, vocab=50257,
                precision="mixed", optimizer="adam", zero_stage=0, dp=8, tp=1, pp=1, recompute="none")


def calculator(show_static: bool = False, **defaults):  # pragma: no mutate block
    """An ipywidgets memory calculator: a parameter count and/or a GPT shape, precision, optimizer, ZeRO stage, dp/tp/pp,
    recomputation -> a stacked bar of the memory per GPU for ZeRO stages 0-3 (the chosen one marked).
    ``n_params`` 0 means the GPT count of the shape; ``layers`` 0 means model states of ``n_params``
    only (no activations).

    Where widgets cannot run (a notebook opened without running it, GitHub), the widget's stored
    output shows the figure for ``defaults`` (:func:`mgpu_utils.figures.widget_view.with_static_view`).
    ``show_static``: also draw that figure once outside the widget, with plain matplotlib. Returns the widget box,
    or None (with a printed SKIPPED line) when ipywidgets is not installed.
    """
    cfg = {**DEFAULTS, **defaults}

    def draw(show=True, **kw):
        import matplotlib.pyplot as plt
        kw["n_params"] = kw["n_params"] or None
        rows = {f"ZeRO-{z}" + (" *" if z == kw["zero_stage"] else ""): calculate(**{**kw, "zero_stage": z})
                for z in (0, 1, 2, 3)}
        top = max(m.total for m in rows.values())
        unit, unit_name = (1e9, "GB") if top >= 1e9 else (1e6, "MB")
        if kw["layers"]:
            n = kw["n_params"] or transformer_params(kw["layers"], kw["hidden"], kw["vocab"], kw["seq_len"])
            shape = (f"{n / 1e9:.2f}B params, {kw['layers']} layers, h={kw['hidden']}, "
                     f"s={kw['seq_len']}, b={kw['micro_batch']}, recompute={kw['recompute']}")
        else:
            shape = f"{kw['n_params']:,.0f} params (model states only)"
        fig = plot_memory(rows, unit=unit, unit_name=unit_name,
                          title=f"{shape}\ndp={kw['dp']} tp={kw['tp']} pp={kw['pp']}, {kw['precision']} {kw['optimizer']}",
                          capacity=80e9 if top >= 8e9 else None)  # the 80 GB line only where it is in range
        if show:
            plt.show()
        return fig

    if show_static:
        draw(**cfg)
    try:
        import ipywidgets as w
    except ImportError:
        print("SKIPPED: interactive calculator needs ipywidgets (pip install ipywidgets)")
        return None
    from mgpu_utils.text import wrap_text
    from mgpu_utils.costs.memory_model import BYTES_PER_PARAM, RECOMPUTE
    from mgpu_utils.figures.widget_view import with_static_view

    ints = {k: w.IntText(value=cfg[k], description=k, layout=w.Layout(width="180px"))
            for k in ("layers", "hidden", "heads", "seq_len", "micro_batch", "vocab")}
    ints["n_params"] = w.FloatText(value=cfg["n_params"], description="params", layout=w.Layout(width="220px"))
    degs = {k: w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], value=cfg[k], description=k,
                          layout=w.Layout(width="160px")) for k in ("dp", "tp", "pp")}
    prec = w.Dropdown(options=sorted({p for p, _ in BYTES_PER_PARAM}), value=cfg["precision"], description="precision")
    opt = w.Dropdown(options=sorted({o for _, o in BYTES_PER_PARAM}), value=cfg["optimizer"], description="optimizer")
    zero = w.Dropdown(options=[0, 1, 2, 3], value=cfg["zero_stage"], description="ZeRO stage")
    rec = w.Dropdown(options=list(RECOMPUTE), value=cfg["recompute"], description="recompute")
    out = w.Output()
    controls = {**ints, **degs, "precision": prec, "optimizer": opt, "zero_stage": zero, "recompute": rec}

    def update(_=None):
        out.clear_output(wait=True)
        with out:
            try:
                draw(**{k: c.value for k, c in controls.items()})
            except ValueError as e:  # e.g. layers not divisible by pp: say why, keep the widget alive
                print(wrap_text(f"not a valid configuration: {e}"))

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = w.VBox([w.HBox(list(ints.values())[:4]), w.HBox(list(ints.values())[4:]), w.HBox(list(degs.values())),
                  w.HBox([prec, opt]), w.HBox([zero, rec]), out])
    return with_static_view(box, draw(show=False, **cfg))


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


def draw_prefetch_timeline(lines: dict[str, list[str]]):
    """One rank's FSDP2 step as the order of its events, one row per setting (e.g. default and explicit
    forward prefetching): ``AG`` all-gather, ``RS`` reduce-scatter, ``F<i>`` / ``B<i>`` block i's forward
    / backward starting. Each all-gather is labelled with the unit it brings (counted: the root first,
    then the blocks in forward order, then in backward order), each reduce-scatter with the unit it
    reduces (the blocks in backward order, the root last), so "AG 1" before "F0" reads as block 1
    prefetched while block 0 computes. Positions are issue order, not time.

    Introduced in ``notebooks/07_memory.ipynb`` (section 5c, from ``fsdp2_scale.py``).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colors = {"A": "#4C72B0", "R": "#DD8452", "F": "#55A868", "B": "#8172B2"}
    width = max(len(v) for v in lines.values())
    fig, ax = plt.subplots(figsize=(min(11, 1.0 + 0.45 * width), 0.9 + 0.8 * len(lines)))
    for row, (name, events) in enumerate(lines.items()):
        y, blocks = len(lines) - 1 - row, sum(e.startswith("F") for e in events)
        order = ["root"] + [str(i) for i in range(blocks)] + [str(i) for i in reversed(range(blocks))]
        gathered, reduced = iter(order), iter([str(i) for i in reversed(range(blocks))] + ["root"])
        for x, e in enumerate(events):
            unit = {"AG": gathered, "RS": reduced}.get(e)
            label = f"{e}\n{next(unit, '?')}" if unit else e
            ax.add_patch(Rectangle((x, y), 0.92, 0.7, fc=colors[e[0]], ec="#333333", lw=0.5))
            ax.text(x + 0.46, y + 0.35, label, ha="center", va="center", color="white", fontsize=7)
    ax.set_xlim(-0.1, width)
    ax.set_ylim(-0.2, len(lines))
    ax.set_yticks([len(lines) - 1 - r + 0.35 for r in range(len(lines))])
    ax.set_yticklabels(list(lines))
    ax.set_xticks([])
    ax.set_xlabel("issue order on one rank →  (AG all-gather of a unit, RS reduce-scatter, "
                  "F/B a block's forward/backward)")
    for s in ("top", "right", "bottom"):
        ax.spines[s].set_visible(False)
    fig.tight_layout()
    return fig
