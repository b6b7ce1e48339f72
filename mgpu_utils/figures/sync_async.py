"""Figures of notebooks/09_sync_vs_async.ipynb. Every function returns the matplotlib Figure (end the
cell with ``;``). ``draw_*`` are schematic; ``plot_*`` draw the measured results of lesson 09's launch
scripts (``sync_async.py``, ``local_sgd.py``, ``comm_hooks.py``)."""

from __future__ import annotations

import collections


def draw_sync_vs_async(workers: int = 3, slow: float = 1.8, horizon: float = 7.0):
    """Timelines of 3 workers, one of them ``slow`` times slower: synchronous all-reduce (everyone waits
    for the slowest every step) against an asynchronous parameter server (nobody waits; updates arrive
    with staleness). Schematic, from the same event rules as :func:`mgpu_utils.parallel.staleness.simulate_ps`."""
    import matplotlib.pyplot as plt

    times = [1.0] * (workers - 1) + [slow]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 4.6), sharex=True)
    t, ar = 0.0, 0.25
    while t + slow + ar <= horizon:                     # sync: compute, wait, all-reduce, repeat
        for w, c in enumerate(times):
            ax1.barh(w, c, left=t, color="#9ecae1", edgecolor="k")
            if c < slow:
                ax1.barh(w, slow - c, left=t + c, color="#eeeeee", edgecolor="#bbbbbb", hatch="//")
            ax1.barh(w, ar, left=t + slow, color="#74c476", edgecolor="k")
        t += slow + ar
    ax1.set_title("synchronous: every step waits for the slowest worker (grey), then all-reduce (green)")
    version, base, nxt = 0, [0] * workers, list(times)
    while min(nxt) <= horizon:                          # async: push when done, pull, go on
        w = min(range(workers), key=lambda i: (nxt[i], i))
        start = nxt[w] - times[w]
        ax2.barh(w, times[w], left=start, color="#9ecae1", edgecolor="k")
        ax2.text(start + times[w] / 2, w, f"v{base[w]} \u2192 stale {version - base[w]}", ha="center",
                 va="center", fontsize=8)
        version += 1
        base[w] = version
        nxt[w] += times[w]
    ax2.set_title("asynchronous parameter server: no waiting; a gradient computed on version v is applied "
                  "after others (staleness)")
    for ax in (ax1, ax2):
        ax.set_yticks(range(workers))
        ax.set_yticklabels([f"worker {w + 1}" + (" (slow)" if times[w] == slow else "") for w in range(workers)])
        ax.invert_yaxis()
    ax2.set_xlabel("time (schematic)")
    ax2.set_xlim(0, horizon)
    fig.tight_layout()
    return fig


def plot_sync_async(result: dict):
    """Test accuracy against gradients computed and against wall-clock seconds, for every run of
    ``sync_async.py`` (sync / async, with and without the straggler)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    style = {"sync": ("#4C72B0", "-"), "async": ("#DD8452", "-"),
             "sync + straggler": ("#4C72B0", "--"), "async + straggler": ("#DD8452", "--")}
    for name, run in result["runs"].items():
        g, s, acc = zip(*run["curve"])
        color, ls = style.get(name, (None, "-"))
        axes[0].plot(g, acc, ls, color=color, marker=".", label=name)
        axes[1].plot(s, acc, ls, color=color, marker=".", label=name)
    axes[0].set_xlabel(f"gradients computed (batches of {result['per_rank_batch']})")
    axes[1].set_xlabel("wall-clock seconds (measured)")
    for ax in axes:
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['workers']} workers; straggler: rank {result['straggler']} sleeps "
                 f"{result['delay_ms']:g} ms per step")
    fig.tight_layout()
    return fig


def plot_staleness(result: dict, simulated: dict | None = None):
    """Histogram of the staleness of every applied gradient (left), and per worker (right) for the
    straggler run; ``simulated``: ``{run name: [(worker index, staleness)]}`` from
    :func:`mgpu_utils.parallel.staleness.simulate_ps`, drawn as outlines."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, run in result["runs"].items():
        if run["mode"] != "async":
            continue
        s, c = zip(*run["staleness_hist"])
        axes[0].bar([x + (0.2 if "straggler" in name else -0.2) for x in s], c, width=0.4, label=name)
    axes[0].set_xlabel("staleness (versions behind when applied)")
    axes[0].set_ylabel("gradients (log scale)")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    run = result["runs"].get("async + straggler") or result["runs"]["async"]
    ranks = sorted(run["staleness_by_rank"], key=int)
    means = [sum(v) / max(1, len(v)) for v in (run["staleness_by_rank"][r] for r in ranks)]
    counts = [len(run["staleness_by_rank"][r]) for r in ranks]
    x = range(len(ranks))
    axes[1].bar(x, means, color="#DD8452", label="measured mean staleness")
    for i, n in zip(x, counts):
        axes[1].text(i, means[i], f"{n} pushes", ha="center", va="bottom", fontsize=8)
    sim = (simulated or {}).get("async + straggler" if "async + straggler" in result["runs"] else "async")
    if sim:
        by = collections.defaultdict(list)
        for w, st in sim:
            by[w].append(st)
        axes[1].plot(x, [sum(by[i]) / max(1, len(by[i])) for i in x], "k_", markersize=30, mew=2,
                     label="event simulation")
    axes[1].set_xticks(list(x))
    axes[1].set_xticklabels([f"rank {r}" + (" (straggler)" if int(r) == result["straggler"] else "") for r in ranks])
    axes[1].set_ylabel("mean staleness")
    axes[1].set_title(run["mode"] + (" + straggler" if run["delay_s"] else "") + ": who is stale")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_local_sgd(result: dict):
    """Local SGD: test accuracy against local steps for each H (left), final accuracy against the bytes
    each rank sent in ring all-reduces (right, log scale)."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in result["runs"].items():
        steps, _, acc = zip(*run["curve"])
        axes[0].plot(steps, acc, marker=".", label=f"{name} ({run['allreduce_calls']} all-reduces)")
        axes[1].scatter(run["ring_bytes_per_rank"] / 1e6, run["final_acc"], s=60)
        axes[1].annotate(name, (run["ring_bytes_per_rank"] / 1e6, run["final_acc"]), textcoords="offset points",
                         xytext=(6, 4))
    axes[0].set_xlabel("local steps")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    axes[1].set_xscale("log")
    axes[1].xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axes[1].xaxis.set_minor_formatter(ticker.NullFormatter())
    axes[1].set_ylim(0, 1)
    axes[1].set_xlabel("MB sent per rank (ring all-reduce, 2(n-1)/n x payload)")
    axes[1].set_ylabel(f"test accuracy after {result['steps']} steps")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_hooks(result: dict):
    """DDP communication hooks: accuracy curves (left), bytes per all-reduce after compression (right)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(result["hooks"])
    for name in names:
        steps, acc = zip(*result["hooks"][name]["curve"])
        axes[0].plot(steps, acc, marker=".", label=name)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    per = [result["hooks"][n]["payload_bytes_per_step"][-1] / 1e3 for n in names]
    axes[1].bar(names, per, color=["#4C72B0", "#DD8452", "#55A868", "#C44E52"][:len(names)])
    for i, v in enumerate(per):
        axes[1].text(i, v, f"{v:.1f} kB", ha="center", va="bottom", fontsize=8)
    axes[1].set_ylabel("kB per all-reduce (last step)")
    fig.tight_layout()
    return fig


def plot_staleness_sweep(runs: dict, lr: float):
    """Test accuracy against gradients applied for asynchronous runs with different numbers of workers.

    Args:
        runs: ``{workers: run}`` where run is ``sync_async.py``'s ``runs["async"]`` (``--modes async``),
            with ``curve`` [(gradients, seconds, accuracy)] and ``staleness_hist`` [(staleness, count)].
        lr: the learning rate per gradient that every run used (for the title).

    Introduced in ``notebooks/09_sync_vs_async.ipynb`` (where staleness hurts).
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, (w, run) in enumerate(sorted(runs.items())):
        g, _, acc = zip(*run["curve"])
        mean = sum(k * c for k, c in run["staleness_hist"]) / run["updates"]
        ax.plot(g, acc, marker=".", color=["#55A868", "#DD8452", "#C44E52", "#8172B3"][i % 4],
                label=f"{w} worker{'s' if w > 1 else ''}: mean staleness {mean:.1f}")
    ax.set(xlabel="gradients applied by the parameter server", ylabel="test accuracy", ylim=(0, 1),
           title=f"Asynchronous SGD, lr {lr:g} per gradient: only the staleness changes")
    ax.grid(alpha=0.3)
    ax.legend(loc="center right")
    fig.tight_layout()
    return fig


def plot_emulator(result: dict):
    """Modelled step time per emulated link and hook: the hook's median step on loopback (measured,
    the compute and the real all-reduce) with the modelled link time of its bytes stacked on top.

    Args:
        result: ``comm_hooks.py``'s JSON: ``hooks[h]["median_step_s"]`` (seconds, median over the
            accuracy run's steps) and ``emulator`` rows with ``link``, ``hook``, ``modelled_s`` (seconds of
            one step's ring all-reduce of the bytes sent, charged ``scale`` times).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    links = list(dict.fromkeys(e["link"] for e in result["emulator"]))
    hooks = list(dict.fromkeys(e["hook"] for e in result["emulator"]))
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    fig, ax = plt.subplots(figsize=(11, 4))
    w = 0.8 / len(hooks)
    for j, h in enumerate(hooks):
        rows = {e["link"]: e for e in result["emulator"] if e["hook"] == h}
        x = np.arange(len(links)) + (j - (len(hooks) - 1) / 2) * w
        base = 1e3 * result["hooks"][h]["median_step_s"]
        link_ms = [1e3 * rows[k]["modelled_s"] for k in links]
        ax.bar(x, [base] * len(links), w, color=colors[j % 4], alpha=0.45,
               label=f"{h}: median step on loopback (measured)")
        ax.bar(x, link_ms, w, bottom=base, color=colors[j % 4], label=f"{h}: + modelled link time")
    ax.set_xticks(range(len(links)))
    ax.set_xticklabels([k.replace(" (", "\n(") for k in links], fontsize=9)
    ax.set_ylabel("ms per step (model: measured + modelled)")
    ax.set_title(f"emulated links: gradient charged as {result['scale']:g} x this model's "
                 f"({result['params'] * result['scale'] / 1e6:.0f} M parameters), {result['world_size']} ranks")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
