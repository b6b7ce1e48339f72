"""Launch overhead: bare `torchrun --standalone`, launch(via="torchrun") and launch(via="warm"), same no-op job.

Each repeat runs the three in turn and times from the call until rank 0's result is available. The
warm template (mgpu_utils.launch.warm) is started once before the repeats, as a notebook's first launch
does; its start-up time is printed separately. Prints the medians and their ratios to bare torchrun
(targets: launch <= 1.25, warm <= 0.3), then one JSON line.

Run:
    python benchmarks/launch_overhead.py --nproc 4 --repeats 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mgpu_utils.dist import parse_result  # noqa: E402
from mgpu_utils.launch.launcher import run_torchrun  # noqa: E402

NOOP = ROOT / "benchmarks" / "noop_dist.py"


def bare(nproc: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                          str(NOOP)], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    assert parse_result(out)["world_size"] == nproc
    return time.perf_counter() - t0


def ours(nproc: int, via: str) -> float:
    t0 = time.perf_counter()
    res = run_torchrun(NOOP, nproc, show="none", threads_per_rank=1, via=via)
    assert res.via == via and res.result["world_size"] == nproc
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    template_start = ours(args.nproc, "warm")            # the first warm launch starts the template
    times = {"torchrun": [], "launch": [], "warm": []}
    for _ in range(args.repeats):
        times["torchrun"].append(bare(args.nproc))
        times["launch"].append(ours(args.nproc, "torchrun"))
        times["warm"].append(ours(args.nproc, "warm"))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: med[k] / med["torchrun"] for k in ("launch", "warm")}
    print(f"nproc={args.nproc}, {args.repeats} repeats, medians: bare torchrun {med['torchrun']:.2f} s, "
          f"launch(via='torchrun') {med['launch']:.2f} s ({ratio['launch']:.2f}x, target <= 1.25), "
          f"launch(via='warm') {med['warm']:.2f} s ({ratio['warm']:.3f}x, target <= 0.3); the first warm "
          f"launch, which started the template: {template_start:.2f} s")
    print("MGPU_RESULT " + json.dumps({"nproc": args.nproc, "median_seconds": med, "ratio": ratio,
                                       "first_warm_seconds": template_start, "all": times}))


if __name__ == "__main__":
    main()
