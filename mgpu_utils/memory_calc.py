"""The memory calculator of notebooks/07_memory.ipynb: formulas in, a stacked bar per GPU out.

:func:`calculate` wraps :mod:`mgpu_utils.memory_model` (ZeRO model states, Korthikanti activations)
behind one call; :func:`plot_memory` draws one stacked bar (parameters, gradients, optimizer
states, activations) per configuration; :func:`calculator` is the ipywidgets front end, with a
static figure of the default configuration for notebooks whose widgets do not render.
"""

from __future__ import annotations

from mgpu_utils.memory_model import MemoryBreakdown, memory_per_gpu, model_state_bytes, transformer_params

KINDS = ("params", "grads", "optimizer", "activations")
COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52"}


def calculate(n_params: float | None = None, *, layers: int = 0, hidden: int = 0, heads: int = 1,
              seq_len: int = 1, micro_batch: int = 1, vocab: int = 50257, precision: str = "mixed",
              optimizer: str = "adam", zero_stage: int = 0, dp: int = 1, tp: int = 1, pp: int = 1,
              recompute: str = "none", sequence_parallel: bool = False) -> MemoryBreakdown:
    """Bytes per GPU of a training configuration.

    Either ``n_params`` alone (model states only, no activations: any model, e.g. an MLP) or a GPT
    shape (``layers``, ``hidden``, ``heads``, ``seq_len``, ``micro_batch``, ``vocab``; ``n_params``
    then defaults to the GPT count) for model states plus Korthikanti activations (1F1B with one
    micro-batch per stage in flight times ``pp``). ``precision``/``optimizer`` pick the bytes per
    parameter (:data:`mgpu_utils.memory_model.BYTES_PER_PARAM`), ``zero_stage`` 0-3 shards over ``dp``.
    Activation values take 4 bytes with ``precision="fp32"`` and 2 otherwise, as in the planner
    (:mod:`mgpu_utils.planner`); dropout masks 1 byte.

    Returns:
        :class:`~mgpu_utils.memory_model.MemoryBreakdown` in bytes.

    Raises:
        ValueError: neither ``n_params`` nor ``layers``/``hidden`` given, or any error of memory_model.
    """
    if layers and hidden:
        return memory_per_gpu(layers, hidden, heads, vocab, seq_len, micro_batch, n_params=n_params,
                              precision=precision, optimizer=optimizer, zero_stage=zero_stage, dp=dp,
                              tp=tp, pp=pp, recompute=recompute, sequence_parallel=sequence_parallel,
                              schedule="1f1b", n_micro=pp, act_bytes=4 if precision == "fp32" else 2)
    if n_params is None:
        raise ValueError("give n_params, or a transformer shape with layers and hidden")
    return model_state_bytes(n_params, precision=precision, optimizer=optimizer, zero_stage=zero_stage,
                             dp=dp, tp=tp, pp=pp)


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
    output shows the figure for ``defaults`` (:func:`mgpu_utils.widget_view.with_static_view`).
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
    from mgpu_utils.dist import wrap_text
    from mgpu_utils.memory_model import BYTES_PER_PARAM, RECOMPUTE
    from mgpu_utils.widget_view import with_static_view

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
