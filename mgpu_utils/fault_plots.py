"""Figures of notebooks/11_fault_tolerance.ipynb: a restart from a snapshot, and the cost of snapshotting."""

from __future__ import annotations

from mgpu_utils.fault import lost_fraction, young_daly_interval


def draw_restart_timeline(steps: int = 30, every: int = 5, kill_step: int = 13):  # pragma: no mutate block
    """Concept picture: attempt 0 trains and snapshots every ``every`` steps until a rank dies before
    ``kill_step``; torchrun restarts every rank, attempt 1 resumes from the newest snapshot and redoes the
    steps since (the lost work). Returns the Figure."""
    import matplotlib.pyplot as plt

    resume = (kill_step // every) * every
    fig, ax = plt.subplots(figsize=(11, 2.6))
    ax.barh(1, kill_step, left=0, height=0.5, color="#4C72B0", label="training")
    ax.barh(1, kill_step - resume, left=resume, height=0.5, color="#C44E52", hatch="//", alpha=0.6,
            label="lost work (computed again)")
    ax.barh(0, steps - resume, left=resume, height=0.5, color="#4C72B0")
    for s in range(every, steps + 1, every):
        y = 1 if s <= kill_step else 0
        ax.plot([s, s], [y - 0.32, y + 0.32], color="#55A868", lw=3, label="snapshot" if s == every else None)
    ax.plot(kill_step, 1, "X", color="#C44E52", ms=16, mec="white", label="a rank is killed")
    ax.annotate("torchrun restarts every rank;\nall load the newest snapshot", xy=(resume, 0.25),
                xytext=(kill_step + 1.5, 0.95), fontsize=9, arrowprops=dict(arrowstyle="->", color="0.3"))
    ax.set(yticks=[0, 1], yticklabels=["attempt 1", "attempt 0"], xlabel="training step", xlim=(-0.5, steps + 0.5),
           ylim=(-0.5, 1.6), title=f"Snapshot every {every} steps, a rank dies before step {kill_step}: "
                                    f"resume at step {resume}")
    ax.legend(loc="upper left", fontsize=8, ncol=4, frameon=False)
    fig.tight_layout()
    return fig


def plot_lost_work(checkpoint_s: float, mtbfs_s: dict, restart_s: float = 0.0):  # pragma: no mutate block
    """Lost share of the time against the snapshot interval, one curve per cluster (``{label: MTBF s}``),
    each with its Young interval marked. Returns the Figure."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker as mticker
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (label, m) in enumerate(mtbfs_s.items()):
        taus = np.geomspace(checkpoint_s * 1.5, m, 400)
        color = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
        ax.plot(taus / 60, 100 * lost_fraction(taus, checkpoint_s, m, restart_s), color=color, label=label)
        best = young_daly_interval(checkpoint_s, m)
        ax.plot(best / 60, 100 * lost_fraction(best, checkpoint_s, m, restart_s), "o", color=color)
        ax.annotate(f"{best / 60:.0f} min", (best / 60, 100 * lost_fraction(best, checkpoint_s, m, restart_s)),
                    textcoords="offset points", xytext=(0, 7), ha="center", fontsize=9, color=color)
    ax.set(xscale="log", yscale="log", xlabel="minutes of training between snapshots",
           ylabel="time lost (%)", title=f"Snapshot cost C = {checkpoint_s:g} s: lost time C/τ + τ/(2M); "
                                         f"dots at τ* = √(2CM)")
    ax.set_yticks([1, 2, 5, 10, 20, 50])
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(mticker.NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
