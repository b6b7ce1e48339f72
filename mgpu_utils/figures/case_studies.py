"""Figures of notebooks/10_case_studies.ipynb: one DDP step of each case, the large-batch recipe,
steps and examples to a target per batch size, GAN samples.

Every function draws on a new figure and returns it; nothing is drawn at import.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from mgpu_utils.figures.common import rank_color

#: One training step of each case, in arbitrary time units: (lane, label, start, length, colour index).
#: Lane 0 is the compute of one rank, lane 1 its communication (what DDP or the script sends).
CASE_STEPS: dict[str, list[tuple[int, str, float, float, int]]] = {
    "ResNet\n(DDP)": [
        (1, "BN\nbuffers", 0.0, 0.8, 3), (0, "forward", 0.8, 2.0, 0), (0, "backward", 2.8, 4.0, 1),
        (1, "all-reduce (buckets)", 3.8, 3.6, 2), (0, "SGD", 7.4, 0.9, 4)],
    "GPT-2\n(06: dp x tp)": [
        (0, "fwd", 0.0, 0.9, 0), (1, "tp", 0.9, 0.4, 2), (0, "fwd", 1.3, 0.9, 0), (1, "tp", 2.2, 0.4, 2),
        (0, "bwd", 2.6, 1.5, 1), (1, "tp", 4.1, 0.4, 2), (0, "bwd", 4.5, 1.5, 1), (1, "tp", 6.0, 0.4, 2),
        (1, "dp all-reduce", 6.4, 1.1, 2), (0, "AdamW", 7.5, 0.8, 4)],
    "BERT\n(DDP)": [
        (0, "forward", 0.0, 2.4, 0), (0, "backward", 2.4, 4.4, 1),
        (1, "all-reduce (buckets)", 3.4, 3.8, 2), (0, "AdamW", 7.2, 0.9, 4)],
    "GAN\n(DDP x 2)": [
        (0, "G(z)", 0.0, 0.8, 0), (1, "G's BN\nbuffers", 0.0, 0.8, 3), (0, "D(real)", 0.8, 0.8, 0),
        (0, "D(fake.detach())", 1.6, 1.4, 0), (0, "D bwd", 3.0, 1.0, 1), (1, "D all-reduce", 3.3, 1.0, 2),
        (0, "D step", 4.3, 0.6, 4), (0, "D(fake)", 4.9, 0.8, 0), (0, "bwd: D, then G", 5.7, 1.6, 1),
        (1, "D + G all-reduce", 6.0, 1.6, 2), (0, "G step", 7.6, 0.6, 4)],
}


def draw_case_steps():
    """The picture of lesson 10: what one training step of each case computes and communicates.

    Compute (upper lane) and communication (lower lane) of one rank; lengths are schematic, not measured.
    Overlap is drawn where it happens: DDP's bucket all-reduces run during the backward pass, while
    Megatron's tensor-parallel all-reduces (GPT-2) block the layer that needs their result.
    Returns the figure.
    """
    fig, ax = plt.subplots(figsize=(10, 4.6))
    names = list(CASE_STEPS)
    for row, name in enumerate(names):
        y0 = (len(names) - 1 - row) * 1.6
        for lane, label, start, length, colour in CASE_STEPS[name]:
            y = y0 + (0.75 if lane == 0 else 0.0)
            ax.add_patch(Rectangle((start, y), length, 0.62, facecolor=rank_color(colour), alpha=0.85,
                                   edgecolor="white"))
            ax.text(start + length / 2, y + 0.31, label, ha="center", va="center", fontsize=9, color="white")
        ax.text(-0.15, y0 + 0.7, name, ha="right", va="center", fontsize=10)
    ax.set(xlim=(-2.0, 8.7), ylim=(-0.3, len(names) * 1.6), xticks=[], yticks=[],
           title="One training step per case: compute (upper lane) and communication (lower lane) of one rank")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.text(8.6, -0.25, "time (schematic) →", ha="right", va="bottom", fontsize=9)
    fig.tight_layout()
    return fig


def plot_images(images, titles: list[str]):
    """A row of grey images (each a tensor or array of shape (H, W) or (1, H, W)) with a title each,
    e.g. one digit and its augmented draws (``mgpu_utils.data.AugmentedDigits``). Returns the figure."""
    fig, axes = plt.subplots(1, len(images), figsize=(1.1 * len(images), 1.5), squeeze=False)
    for ax, img, title in zip(axes[0], images, titles):
        img = np.asarray(img, dtype=float)
        ax.imshow(img.reshape(img.shape[-2], img.shape[-1]), cmap="gray_r")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_recipe(runs: list[dict]):
    """The large-batch recipe: test accuracy (left) and training loss per epoch (right) of each run.

    ``runs``: dicts with ``label`` and a case_resnet.py result (``test_accuracy``, ``epoch_losses``).
    Returns the figure.
    """
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [r["label"] for r in runs]
    acc = [100 * r["test_accuracy"] for r in runs]
    a.barh(range(len(runs)), acc, color=[rank_color(i) for i in range(len(runs))])
    for i, v in enumerate(acc):
        a.text(v + 1, i, f"{v:.1f}%", va="center", fontsize=10)
    epochs = sorted({len(r["epoch_losses"]) for r in runs})
    a.set(yticks=range(len(runs)), yticklabels=labels, xlim=(0, 115), xlabel="test accuracy (%)",
          title=f"after {' or '.join(map(str, epochs))} epoch{'s' if epochs != [1] else ''} each")
    a.invert_yaxis()
    for i, r in enumerate(runs):
        losses = r["epoch_losses"]
        b.plot(range(1, len(losses) + 1), losses, "o-", color=rank_color(i), label=r["label"].replace("\n", " "))
    b.set(xlabel="epoch", ylabel="training loss (epoch mean)", title="training loss", xticks=range(1, 1 + max(
        len(r["epoch_losses"]) for r in runs)))
    b.legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_critical_batch(result: dict):
    """Steps (left) and examples (right) to the target accuracy per global batch, log-log, with the fit.

    ``result``: a batch_size_sweep.py result (``rows`` with ``global_batch``, ``steps``, ``examples``;
    ``fit`` with ``s_min``, ``b_crit``; ``target``). Perfect scaling (steps halve when B doubles: the same
    examples) is drawn from the smallest batch. Returns the figure.
    """
    from mgpu_utils.costs.scaling import critical_batch_steps

    b = np.array([r["global_batch"] for r in result["rows"]], dtype=float)
    steps = np.array([r["steps"] for r in result["rows"]], dtype=float)
    fit = result["fit"]
    grid = np.geomspace(b[0], b[-1], 100)
    fitted = critical_batch_steps(grid, fit["s_min"], fit["b_crit"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, y, scale, name in [(axes[0], steps, 1, "steps"), (axes[1], steps * b, grid, "examples")]:
        ax.plot(b, y, "o", color=rank_color(0), markersize=7, label="measured (median of seeds)")
        ax.plot(grid, fitted * scale, "-", color=rank_color(1),
                label=f"fit S_min (1 + B_crit / B), B_crit = {fit['b_crit']:.0f}")
        ax.plot(grid, steps[0] * b[0] / grid * scale, ":", color="gray", label="perfect scaling")
        ax.axvline(fit["b_crit"], color=rank_color(1), lw=1, alpha=0.5)
        ax.text(fit["b_crit"] * 1.08, 0.04, "B_crit", transform=ax.get_xaxis_transform(), fontsize=10,
                color=rank_color(1))
        ax.set(xscale="log", yscale="log", xlabel="global batch B (images per step)",
               ylabel=f"{name} to {result['target']:.0%} test accuracy")
        ax.set_xticks(b, [str(int(v)) for v in b])
        ax.minorticks_off()
    axes[0].set_title("steps fall with B, then stop falling")
    axes[1].set_title("examples grow with B, steeply past B_crit")
    axes[0].legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_gan_samples(samples, real=None):
    """Generated 8x8 digits (``samples``: nested lists or an array of shape (k, 8, 8), values in [0, 1]) in
    one row per 8, with a row of real digits (``real``, same shape) first when given. Returns the figure."""
    fake = np.asarray(samples, dtype=float)
    rows = [("real", np.asarray(real, dtype=float))] if real is not None else []
    rows += [("generated", fake[i:i + 8]) for i in range(0, len(fake), 8)]
    fig, axes = plt.subplots(len(rows), 8, figsize=(8, 1.15 * len(rows)), squeeze=False)
    for r, (name, imgs) in enumerate(rows):
        for k in range(8):
            ax = axes[r][k]
            if k < len(imgs):
                ax.imshow(imgs[k], cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(name, fontsize=9)
    fig.tight_layout()
    return fig

