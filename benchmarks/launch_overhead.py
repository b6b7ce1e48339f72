"""Launcher overhead: mgpu_utils.launcher.launch() against bare `torchrun --standalone`, same no-op job.

Each repeat runs both, alternating (bare first, then the launcher), and times from the call until
rank 0's result is available. Prints both medians and their ratio (target: at most 1.25).

Run:
    python benchmarks/launch_overhead.py --nproc 4 --repeats 5
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mgpu_utils.dist import parse_result  # noqa: E402
from mgpu_utils.launcher import launch  # noqa: E402

NOOP = ROOT / "benchmarks" / "noop_dist.py"


def bare(nproc: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                          str(NOOP)], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}).stdout
    assert parse_result(out)["world_size"] == nproc
    return time.perf_counter() - t0


def ours(nproc: int) -> float:
    t0 = time.perf_counter()
    assert launch(NOOP, nproc=nproc, show="none", threads_per_rank=1)["world_size"] == nproc
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    times = {"torchrun": [], "launch": []}
    for _ in range(args.repeats):
        times["torchrun"].append(bare(args.nproc))
        times["launch"].append(ours(args.nproc))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["launch"] / med["torchrun"]
    print(f"nproc={args.nproc}, {args.repeats} repeats: bare torchrun {med['torchrun']:.2f} s, "
          f"launch() {med['launch']:.2f} s (medians); ratio {ratio:.3f} (target <= 1.25)")
    print("MGPU_RESULT " + json.dumps({"nproc": args.nproc, "median_seconds": med, "ratio": ratio, "all": times}))


if __name__ == "__main__":
    main()
