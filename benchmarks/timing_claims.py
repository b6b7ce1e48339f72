"""The spread of the lessons' in-process timing claims, quiet and with one core busy (issue 29).

Each claim below is a ratio that a lesson asserts with a fixed bound, measured the way its cell measures it
(the same sizes, repeats and thread count). Run it twice, on a quiet machine and with one core kept busy by
another process, and set every bound outside both ranges:

    .venv/bin/python benchmarks/timing_claims.py --runs 20
    python3 -c "while True: pass" & .venv/bin/python benchmarks/timing_claims.py --runs 20; kill %1

Prints, per claim, the bound and the min / median / max of the ratio over the runs, and one JSON line.
The claims that need the cores to themselves (speed-ups, multi-rank timings) are not here: the lessons
assert those only when :class:`mgpu_utils.timing.LoadWatch` finds the machine quiet.
"""
import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from mgpu_utils.timing import matmul_flops, time_fn

DEFAULT_THREADS = torch.get_num_threads()          # lesson 01 runs with the default; lesson 11 with 1


def clock_pitfall() -> float:
    """Lesson 11, section 1: the clock read after an enqueue / after waiting (asserted < 0.2)."""
    torch.set_num_threads(1)
    a = torch.randn(768, 768)
    pool = ThreadPoolExecutor(max_workers=1, initializer=torch.set_num_threads, initargs=(1,))
    naive, synced = [], []
    for _ in range(15):
        t0 = time.perf_counter(); job = pool.submit(torch.mm, a, a)
        naive.append(time.perf_counter() - t0)
        job.result()
        t0 = time.perf_counter(); job = pool.submit(torch.mm, a, a); job.result()
        synced.append(time.perf_counter() - t0)
    pool.shutdown()
    return statistics.median(naive) / statistics.median(synced)


def roofline() -> tuple[float, float]:
    """Lesson 01, roofline: the triad's intensity 1/6 over the ridge point, and the ridge point over the
    largest fp32 matmul's intensity (both asserted < 1: the triad is memory-bound, the matmul compute-bound).
    The ridge is the best median matmul rate over the best copy/triad bandwidth, measured as the cells do."""
    torch.set_num_threads(DEFAULT_THREADS)
    rates = []
    for n in [32, 64, 128, 256, 512, 1024, 1536]:
        a, b = torch.randn(n, n), torch.randn(n, n)
        rates.append(statistics.median(matmul_flops(n) / s
                                       for s in time_fn(lambda: a @ b, "cpu", iters=7, warmup=2)["all_s"]))
    N = 64 * 2**20 // 4
    x, y, z = (torch.rand(N) for _ in range(3))
    t_copy = time_fn(lambda: z.copy_(x), "cpu", iters=7)["median_s"]
    t_triad = time_fn(lambda: torch.add(x, y, alpha=2.0, out=z), "cpu", iters=7)["median_s"]
    ridge = max(rates) / max(2 * N * 4 / t_copy, 3 * N * 4 / t_triad)
    return (1 / 6) / ridge, ridge / (2 * 1536 / (3 * 4))


def warm_launch() -> float:
    """Lesson 00, warm launches: a warm launch's time over torchrun's (asserted < 1/2)."""
    from mgpu_utils.launch.launcher import run_torchrun
    cold = run_torchrun("hello_dist.py", 4, show="none", via="torchrun").seconds
    run_torchrun("hello_dist.py", 4, show="none", via="warm")
    return run_torchrun("hello_dist.py", 4, show="none", via="warm").seconds / cold


def coalescing() -> float:
    """Lesson 01, section 7: consecutive floats over every 16th float, the same count gathered on one
    thread (the lesson asserts the strided gather takes more than 2x: this ratio < 0.5)."""
    torch.set_num_threads(1)
    n_all = 64 * 2**20 // 4
    src = torch.rand(n_all)
    n = n_all // 16
    out = torch.empty(n)
    t = {s: time_fn(lambda: out.copy_(src[:n * s:s]), "cpu", iters=7)["median_s"] for s in (1, 16)}
    torch.set_num_threads(DEFAULT_THREADS)
    return t[1] / t[16]


CLAIMS = {"10 clock: naive / synced median": (clock_pitfall, 0.2),
          "01 coalescing: consecutive / stride 16": (coalescing, 0.5),
          "01 roofline: triad I / ridge, ridge / matmul I": (roofline, (1.0, 1.0)),
          "00 warm / torchrun launch": (warm_launch, 0.5)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--only", default="", help="measure only the claims whose name contains this text")
    args = p.parse_args()
    values = {}
    for _ in range(args.runs):
        for name, (fn, _) in CLAIMS.items():
            if args.only not in name:
                continue
            v = fn()
            for k, x in enumerate(v if isinstance(v, tuple) else (v,)):
                values.setdefault(f"{name} [{k}]", []).append(x)
    out = {}
    for key, xs in values.items():
        name, k = key.rsplit(" [", 1)
        bound = CLAIMS[name][1]
        bound = bound[int(k[:-1])] if isinstance(bound, tuple) else bound
        out[key] = {"bound": bound, "min": min(xs), "median": statistics.median(xs), "max": max(xs)}
        print(f"{key:<40} bound < {bound:<5}  min {min(xs):.4f}  median {statistics.median(xs):.4f}  "
              f"max {max(xs):.4f}  ({len(xs)} runs)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
