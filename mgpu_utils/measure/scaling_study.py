"""Running a scaling study and writing it down (notebooks/11_benchmarking.ipynb, benchmarks/scaling.py).

:func:`scaling_runs` launches ``launch_scripts/ddp_speedup.py`` once per world size (strong: the same
global batch split over N ranks; weak: the same batch on every rank), one intra-op thread per rank;
:func:`world_sizes` picks the sizes; :func:`study` adds the speed-ups and the Amdahl and alpha-beta fits;
:func:`write_csv` and :func:`report_table` write the scaling report.
"""

from __future__ import annotations

import csv

from mgpu_utils.costs import scaling
from mgpu_utils.costs.bandwidth import fit_ring_allreduce, ring_allreduce_model

#: All-reduce sizes timed at each world size above 1, for the alpha-beta fit (bytes: 64 KiB .. 8 MiB).
SWEEP_BYTES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23)

#: The columns of the CSV and of :func:`report_table`.
COLUMNS = ("mode", "world_size", "threads_per_rank", "global_batch", "local_batch", "step_s", "compute_s",
           "samples_per_s", "speedup", "efficiency", "mfu", "joules_per_sample")


def world_sizes(max_nproc: int) -> list[int]:
    """1, 2, 4, ... up to ``max_nproc``, and ``max_nproc`` itself (e.g. 6 -> [1, 2, 4, 6]).

    Raises:
        ValueError: max_nproc < 1.
    """
    if max_nproc < 1:
        raise ValueError(f"--max-nproc must be >= 1, got {max_nproc}")
    sizes, n = [], 1
    while n < max_nproc:
        sizes.append(n)
        n *= 2
    return sizes + [max_nproc]


def scaling_runs(sizes, mode: str = "strong", batch: int = 2048, *, steps: int = 12, warmup: int = 3,
                 sweep: bool = False, backend: str | None = None, extra_args=()) -> list[dict]:
    """Launch ``ddp_speedup.py`` at each world size with one thread per rank; its result dicts, in order.

    Args:
        sizes: world sizes; mode: "strong" (``batch`` is the global batch, split over the ranks; it must
            be divisible by every size) or "weak" (``batch`` samples on every rank).
        steps, warmup: timed and untimed steps per run (the step time is rank 0's median).
        sweep: also time all-reduces of :data:`SWEEP_BYTES` at world sizes above 1 (``result["allreduce_s"]``).
        backend: None chooses as every lesson does (NCCL with a GPU per rank, else gloo).

    Raises:
        ValueError: an unknown mode, or a global batch not divisible by a world size.
        mgpu_utils.launch.launcher.LaunchError: a run failed (the rank's error, as the launcher reports it).
    """
    from mgpu_utils.launch.launcher import launch

    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if mode == "strong" and any(batch % n for n in sizes):
        raise ValueError(f"global batch {batch} is not divisible by every world size {list(sizes)}")
    flag = "--global-batch" if mode == "strong" else "--per-rank-batch"
    rows = []
    for n in sizes:
        args = [flag, batch, "--threads", 1, "--steps", steps, "--warmup", warmup, *extra_args]
        if sweep and n > 1:
            args += ["--sweep-bytes", ",".join(map(str, SWEEP_BYTES))]
        rows.append(launch("ddp_speedup.py", nproc=n, args=args, backend=backend, threads_per_rank=1,
                           show="none") | {"mode": mode})
    return rows


def study(strong: list[dict], weak: list[dict] | None = None, cores: int | None = None) -> dict:
    """Speed-ups, efficiencies and the two fitted models of a scaling study.

    Args:
        strong, weak: results of :func:`scaling_runs` (each with world size 1).
        cores: physical cores; world sizes above it are left out of the Amdahl fit (ranks take turns).

    Returns:
        ``{"strong": {N: {"speedup", "efficiency"}}, "weak": {...} or None, "serial_fraction",
        "alpha_beta": {"world_size", "alpha_s", "bandwidth_bps", "max_rel_error"} or None}``: Amdahl's
        serial fraction over the world sizes up to ``cores``, and the alpha-beta constants fitted
        (lesson 04's ``fit_ring_allreduce``) to the all-reduce sweep of the largest of those world sizes.
        ``speedup`` and ``efficiency`` are also stored in each row.

    Raises:
        ValueError: a run list without world size 1, or with a world size twice (:func:`scaling.speedups`).
    """
    out = {"strong": scaling.speedups(strong), "weak": scaling.speedups(weak) if weak else None}
    for rows, table in ((strong, out["strong"]), (weak or [], out["weak"])):
        for r in rows:
            r.update(table[r["world_size"]])
    fit_n = [n for n in out["strong"] if cores is None or n <= cores]
    out["serial_fraction"] = (scaling.fit_amdahl(fit_n, [out["strong"][n]["speedup"] for n in fit_n])
                              if max(fit_n) > 1 else None)
    swept = [r for r in strong if len(r.get("allreduce_s") or []) >= 2 and r["world_size"] in fit_n]
    out["alpha_beta"] = None
    if swept:                                     # the largest world size that has one core per rank
        r = max(swept, key=lambda r: r["world_size"])
        sizes, secs = zip(*r["allreduce_s"])
        alpha, bw = fit_ring_allreduce(sizes, secs, r["world_size"])
        model = ring_allreduce_model(sizes, r["world_size"], alpha, bw)
        out["alpha_beta"] = {"world_size": r["world_size"], "alpha_s": alpha, "bandwidth_bps": bw,
                             "max_rel_error": float(max(abs(m - t) / t for m, t in zip(model, secs)))}
    return out


def write_csv(rows: list[dict], path) -> None:
    """Write the scaling rows as CSV with :data:`COLUMNS` (missing values empty; seconds, samples/s, J)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({"step_s": r.get("step_seconds"), "compute_s": r.get("compute_seconds")} | r)


def report_table(rows: list[dict]) -> str:
    """The scaling report as aligned text: one line per run (blank cells where a value is unavailable)."""
    head = (f"{'mode':<6} {'ranks':>5} {'thr/rank':>8} {'batch/rank':>10} {'step ms':>8} {'samples/s':>9} "
            f"{'speed-up':>8} {'effic.':>6} {'MFU':>6} {'J/sample':>9}")
    lines = [head]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        jps = f"{r['joules_per_sample']:.3g}" if r.get("joules_per_sample") is not None else "n/a"
        lines.append(f"{r['mode']:<6} {r['world_size']:>5} {r['threads_per_rank']:>8} {r['local_batch']:>10} "
                     f"{1e3 * r['step_seconds']:>8.1f} {r['samples_per_s']:>9.0f} {r['speedup']:>7.2f}x "
                     f"{100 * r['efficiency']:>5.0f}% {mfu:>6} {jps:>9}")
    return "\n".join(lines)
