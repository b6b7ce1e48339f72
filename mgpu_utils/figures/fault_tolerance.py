"""Figures of notebooks/12_fault_tolerance.ipynb: a restart from a snapshot, and the cost of snapshotting."""

from __future__ import annotations

from mgpu_utils.costs.fault import lost_fraction, young_interval


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


def draw_requeue_timeline(steps: int = 30, every: int = 5, signal_step: int = 13):  # pragma: no mutate block
    """Concept picture of section 9: run 0 of a Slurm job trains and snapshots every ``every`` steps; the
    signal before the time limit arrives during step ``signal_step``; every rank stops after it with a snapshot,
    and the job requeues itself; run 1 (the same job id) resumes from that snapshot: no step is lost.
    Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 2.6))
    stop = signal_step + 1
    ax.barh(1, stop, left=0, height=0.5, color="#4C72B0", label="training")
    ax.barh(0, steps - stop, left=stop, height=0.5, color="#4C72B0")
    marks = [s for s in range(every, steps + 1, every) if s != stop] + [stop]
    for s in marks:
        y = 1 if s <= stop else 0
        ax.plot([s, s], [y - 0.32, y + 0.32], color="#55A868", lw=3, label="snapshot" if s == every else None)
    ax.plot(signal_step + 0.5, 1.45, "v", color="#DD8452", ms=12, label="Slurm's signal (--signal=B:USR1@120)")
    ax.annotate("STOP: all ranks stop after this step, with a snapshot;\nthe job requeues itself, run 1 resumes",
                xy=(stop, 0.25), xytext=(stop + 1.5, 0.95), fontsize=9, arrowprops=dict(arrowstyle="->", color="0.3"))
    ax.set(yticks=[0, 1], yticklabels=["run 1", "run 0"], xlabel="training step", xlim=(-0.5, steps + 0.5),
           ylim=(-0.5, 1.8), title=f"A job at its time limit: snapshot on the signal, requeue, resume at step {stop}"
                                   " (nothing lost)")
    ax.legend(loc="upper left", fontsize=8, ncol=3, frameon=False)
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
        best = young_interval(checkpoint_s, m)
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


def draw_elastic_nodes(nproc_per_node: int = 2):  # pragma: no mutate block
    """Concept picture of section 8: two torchrun agents ("nodes") meet at a rendezvous store that outlives them
    (here in the launcher) and start one job (global ranks node-major); after node 1 is lost, node 0's agent
    meets the store again alone and restarts its workers with half the world size. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    P, red = nproc_per_node, "#C44E52"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, lost in zip(axes, (False, True)):
        world = P if lost else 2 * P
        ax.add_patch(FancyBboxPatch((3.3, 3.65), 3.6, 0.6, boxstyle="round,pad=0.03", fc="#FCEBD2", ec="#DD8452"))
        ax.text(5.1, 3.95, "rendezvous store (c10d)\nin the launcher", ha="center", va="center", fontsize=9)
        for node in (0, 1):
            x0, gone = 0.3 + node * 5.2, lost and node == 1
            edge, text = (red, red) if gone else ("0.3", "0.1")
            ax.add_patch(FancyBboxPatch((x0, 0.3), 4.4, 2.9, boxstyle="round,pad=0.05", fc="1.0" if gone else "0.96",
                                        ec=edge, ls="--" if gone else "-", lw=1.5))
            ax.text(x0 + 0.15, 3.0, f"node {node}", fontsize=11, weight="bold", va="top", color=text)
            ax.add_patch(FancyBboxPatch((x0 + 1.2, 1.9), 2.0, 0.6, boxstyle="round,pad=0.03",
                                        fc="1.0" if gone else "#DDE6F3", ec=red if gone else "#4C72B0"))
            ax.text(x0 + 2.2, 2.2, "torchrun agent", ha="center", va="center", fontsize=9, color=text)
            for j in range(P):
                xw, w = x0 + 0.25 + j * (4.0 / P), 4.0 / P - 0.3
                ax.add_patch(FancyBboxPatch((xw, 0.5), w, 0.9, boxstyle="round,pad=0.03",
                                            fc="1.0" if gone else "#E3F1E6", ec=red if gone else "#55A868"))
                ax.text(xw + w / 2, 0.95, "lost" if gone else f"rank {node * P + j}\nlocal rank {j}", ha="center",
                        va="center", fontsize=9, color=text)
            if gone:
                ax.plot([x0 + 0.3, x0 + 4.1], [0.5, 3.0], color=red, lw=2)
                ax.plot([x0 + 0.3, x0 + 4.1], [3.0, 0.5], color=red, lw=2)
            else:
                ax.annotate("", xy=(4.0 if node == 0 else 6.2, 3.62), xytext=(x0 + 2.2, 2.53),
                            arrowprops=dict(arrowstyle="->", color="#DD8452", lw=1.5))
        ax.set(xlim=(0, 10.2), ylim=(0, 4.4), xticks=[], yticks=[])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"node 1 lost: node 0 meets the store alone, world size {world}\n(resume from the snapshot, "
                     f"same global batch)" if lost else f"--nnodes 1:2: two agents meet at the store,\n"
                     f"one job of world size {world}", fontsize=10)
    fig.tight_layout()
    return fig
