"""Strong and weak scaling of a compute-bound DDP step, from a terminal (notebooks/11_benchmarking.ipynb).

Launches launch_scripts/ddp_speedup.py at world sizes 1, 2, 4, ... up to --max-nproc, one intra-op thread
per rank: strong scaling (the same --global-batch split over N ranks) and weak scaling (--per-rank-batch
on every rank). Then fits Amdahl's serial fraction to the strong-scaling speed-ups (world sizes up to the
physical cores) and the alpha-beta model to all-reduces timed in the same runs. Writes scaling.csv and
scaling.png to --out and prints one final JSON line:
    {"speedup": {"1": 1.0, "2": ...}, "efficiency": {...}, "weak_speedup": {...}, "weak_efficiency": {...},
     "threads_per_rank": 1, "serial_fraction": f, "alpha_s": ..., "bandwidth_GBps": ..., "csv": ..., "png": ...}

More ranks than physical cores only take turns on them: such points are reported and marked, and are not
a speed-up measurement. With 2 or more GPUs the ranks use the GPUs (NCCL), one per rank, and --max-nproc
must not exceed them; with fewer, or with --backend gloo, every rank runs on the CPU (never a mix of
a GPU world size 1 and CPU world sizes above it).

Run:
    python benchmarks/scaling.py --max-nproc 2
"""
import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mgpu_utils.measure import scaling_study  # noqa: E402
from mgpu_utils.env import machine_report  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-nproc", type=int, default=2, help="largest world size (default 2)")
    p.add_argument("--global-batch", type=int, default=2048, help="strong scaling: samples per step in all")
    p.add_argument("--per-rank-batch", type=int, default=1024, help="weak scaling: samples per step per rank")
    p.add_argument("--steps", type=int, default=12, help="timed steps per run (the median is reported)")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                   help="default: NCCL with 2 or more GPUs (one per rank), else gloo with CPU ranks")
    p.add_argument("--out", default="build/scaling", help="folder for scaling.csv and scaling.png")
    args = p.parse_args(argv)

    import torch

    gpus = torch.cuda.device_count()
    backend = args.backend or ("nccl" if gpus > 1 else "gloo")   # one GPU per rank, or every rank on the CPU
    if backend == "nccl" and args.max_nproc > gpus:
        raise SystemExit(f"--max-nproc {args.max_nproc} needs {args.max_nproc} GPUs for NCCL (one per rank), "
                         f"found {gpus}: use --max-nproc {gpus}, or --backend gloo for CPU ranks")
    cores = (machine_report()["cpu_cores_physical"] or 1) if backend == "gloo" else None
    sizes = scaling_study.world_sizes(args.max_nproc)
    if cores and args.max_nproc > cores:
        print(f"note: {args.max_nproc} ranks on {cores} physical cores: world sizes above {cores} take turns "
              f"on the cores, so their speed-up is not a scaling measurement", file=sys.stderr)
    lcm = math.lcm(*sizes)
    batch = max(lcm, lcm * round(args.global_batch / lcm))   # divisible by every world size
    if batch != args.global_batch:
        print(f"note: global batch {batch} instead of {args.global_batch}, so that every world size {sizes} "
              f"gets the same share", file=sys.stderr)
    strong = scaling_study.scaling_runs(sizes, "strong", batch, steps=args.steps, sweep=True, backend=backend)
    weak = scaling_study.scaling_runs(sizes, "weak", args.per_rank_batch, steps=args.steps, backend=backend)
    res = scaling_study.study(strong, weak, cores=cores)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scaling_study.write_csv(strong + weak, out / "scaling.csv")
    import matplotlib
    matplotlib.use("Agg")
    from mgpu_utils.figures.benchmarking import plot_scaling
    plot_scaling(res, strong, weak, cores=cores).savefig(out / "scaling.png", dpi=120)
    print(scaling_study.report_table(strong + weak))
    ab = res["alpha_beta"] or {}
    print(json.dumps({
        "speedup": {str(n): v["speedup"] for n, v in res["strong"].items()},
        "efficiency": {str(n): v["efficiency"] for n, v in res["strong"].items()},
        "weak_speedup": {str(n): v["speedup"] for n, v in res["weak"].items()},
        "weak_efficiency": {str(n): v["efficiency"] for n, v in res["weak"].items()},
        "threads_per_rank": strong[0]["threads_per_rank"], "backend": backend, "physical_cores": cores,
        "cpu_share": {str(r["world_size"]): r.get("compute_cpu_share") for r in strong},
        "serial_fraction": res["serial_fraction"], "alpha_s": ab.get("alpha_s"),
        "bandwidth_GBps": ab["bandwidth_bps"] / 1e9 if ab else None,
        "csv": str(out / "scaling.csv"), "png": str(out / "scaling.png")}))


if __name__ == "__main__":
    main()
