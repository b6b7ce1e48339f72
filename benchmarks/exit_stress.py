"""Exit stress test: every launch script, K times at each world size, counting native aborts at exit.

A rank that has printed its result can still die at interpreter exit ("terminate called without an
active exception", SIGABRT, exit code -6): see mgpu_utils.dist.shutdown for the cause and the fix. Such a
race shows up in a few percent of runs, so one green run proves little. This launches each script in
launch_scripts/ through mgpu_utils.launch.launcher (exactly as notebooks and tests do, with the small arguments
the tests use) K times per world size and prints, per script and world size: runs, native aborts (a rank
killed by SIGABRT or printing "terminate called"), and non-zero exits of any kind. Target: 0 and 0.

--jobs 2 runs two launches at once: more processes than cores, the condition that widens the race.
Exit status 1 if any run aborted or failed.

Run:
    python benchmarks/exit_stress.py -k 10 --nproc 2 4 [--via torchrun]
"""
import argparse
import atexit
import collections
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mgpu_utils.launch.launcher import LaunchError, run_torchrun  # noqa: E402

_SCRATCH: list[str] = []


def scratch() -> str:
    """A fresh folder for one run's checkpoints or traces; all of them lie in one folder that is removed when
    this process (the stress run, or pytest) exits."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="mgpu_stress_"))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return tempfile.mkdtemp(dir=_SCRATCH[0])


# The arguments the tests use (small and quick); per world size where the script needs it; a function of a
# folder for arguments that must differ per run (a fresh folder: two runs at once must not share a snapshot).
CASES = {
    "allreduce_placement.py": {1: ["--ranks-per-node", 1, "--sizes-kib", "4"], 2: ["--sizes-kib", "4"],
                               4: ["--sizes-kib", "4"]},
    "allreduce_latency.py": ["--repeats", 3, "--large", "256"],
    "capstone_train.py": ["--steps", 2, "--layouts", "dp", "pp2"],
    "batch_size_sweep.py": ["--global-batches", 8, 64, "--lrs", 0.4, "--seeds", 1, "--target", 0.8],
    "case_bert.py": ["--steps", 2, "--check-grads", "--vocab", 500],
    "dp_tp_step.py": [],
    "case_gan.py": ["--steps", 10, "--check-grads"],
    "case_resnet.py": ["--epochs", 1, "--size", 8, "--per-rank-batch", 4, "--check-grads", "--max-steps", 3],
    "checkpoint_formats.py": lambda d: ["--phase", "save", "--ckpt-dir", d, "--repeats", 1, "--width", 64],
    "collective_errors.py": ["--case", "ok"],
    "collectives_bench.py": ["--ops", "all_reduce,all_gather", "--max-mib", 1, "--repeats", 1, "--warmup", 1],
    "collectives_demo.py": [],
    "comm_hooks.py": ["--steps", 12, "--eval-every", 6, "--powersgd-start", 2, "--emu-steps", 1,
                      "--links", "PCIe 4.0 x16", "--emu-hooks", "fp32 (default)", "PowerSGD"],
    # without PyTorch's own context_parallel: its sharding search costs ~13 CPU-s a rank and adds no exit path
    "context_parallel.py": ["--repeats", 1, "--time-seq", 64, "--sweep-seq", "", "--modes", "ring,zigzag,ulysses"],
    "ddp_internals.py": ["--global-batch", 48, "--width", 32, "--layers", 3, "--micro-batches", 2, "--caps", ""],
    "ddp_pitfalls.py": ["--repeats", 2],
    "ddp_speedup.py": ["--global-batch", 64, "--width", 32, "--layers", 2, "--steps", 2, "--warmup", 1],
    "ddp_train.py": ["--epochs", 1, "--per-rank-batch", 16],
    "expert_parallel.py": ["--steps", 3, "--capacity-factors", "1"],
    "ddp_uneven.py": [],
    "elastic_train.py": lambda d: ["--ckpt-dir", d, "--steps", 10],
    "fsdp2_practice.py": ["--layers", 2, "--steps", 2],
    "fsdp2_scale.py": ["--layers", 2, "--steps", 2, "--case", "meta", "prefetch", "tp"],
    "grad_accumulation.py": ["--micro-batches", 4, "--global-batch", 64],
    "grade_exercise.py": ["--exercise", "04.4", "--solution", ROOT / "exercises" / "solutions" / "04_ring_all_gather.py"],
    "hello_dist.py": [],
    "hierarchical_allreduce.py": {1: ["--ranks-per-node", 1, "--sizes-kib", ""],
                                  2: ["--sizes-kib", ""], 4: ["--sizes-kib", ""]},
    "hybrid_gpt2.py": {1: ["--layouts", "1x1", "--steps", 2, "--global-batch", 8, "--no-reference"],
                       2: ["--layouts", "1x2,2x1", "--steps", 2, "--global-batch", 8, "--no-reference"],
                       4: ["--layouts", "2x2,1x4", "--steps", 2, "--global-batch", 8, "--no-reference"]},
    "hybrid_3d.py": ["--steps", 1],
    "local_sgd.py": ["--H", 1, 2, "--with-sync", "--steps", 8, "--eval-every", 2],
    "pipeline_parallel.py": ["--stage-ms", 0],
    "preflight.py": ["--max-mib", 1, "--repeats", 2],
    "profile_step.py": lambda d: ["--layers", 1, "--width", 32, "--heads", 2, "--seq", 16, "--per-rank-batch", 2,
                                  "--warmup", 1, "--steps", 1, "--traced-steps", 1, "--trace-dir", d],
    "ring_allreduce.py": ["--sizes-kib", ""],
    "sparsify.py": ["--steps", 4, "--check-steps", 2, "--eval-every", 2],
    "sync_async.py": ["--steps", 12, "--delay-ms", 0],
    "tensor_parallel.py": [],
    "vocab_parallel.py": ["--vocab", 4096, "--steps", 1],
    "zero_fsdp.py": [],
}


#: Scripts that refuse fewer ranks, by design and with a message naming the fix (a collective needs two
#: ranks; the parameter server needs a server and a worker): not run below this world size.
MIN_RANKS = {"collectives_demo.py": 2, "collective_errors.py": 2, "sync_async.py": 2, "sparsify.py": 2}


def args_for(script: str, nproc: int, folder: str | None = None) -> list:
    """The command-line arguments of ``script`` at world size ``nproc`` (KeyError: not in CASES); a script that
    writes files writes them under ``folder`` (default: a fresh :func:`scratch` folder)."""
    a = CASES[script]
    return a[nproc] if isinstance(a, dict) else a(folder or scratch()) if callable(a) else a


def one_run(script: str, nproc: int, via: str | None = None) -> tuple[str, float, str]:
    """Launch once; returns (outcome, seconds, detail). outcome: "ok", "abort" or "fail"."""
    t0 = time.perf_counter()
    try:
        run_torchrun(script, nproc, args_for(script, nproc), show="none", timeout_s=600, via=via)
        return "ok", time.perf_counter() - t0, ""
    except LaunchError as e:
        stderr = "\n".join(v["stderr"] for v in e.logs.values())
        native = "terminate called" in stderr or "SIGABRT" in str(e) or e.exc_type == "exit code -6"
        return ("abort" if native else "fail"), time.perf_counter() - t0, str(e).splitlines()[0][:160]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-k", type=int, default=10, help="runs per script and world size")
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4], help="world sizes")
    p.add_argument("--scripts", nargs="*", default=sorted(CASES), help="file names in launch_scripts/")
    p.add_argument("--jobs", type=int, default=1, help="launches at once (2 oversubscribes a 2-core machine)")
    p.add_argument("--via", choices=["warm", "torchrun"], default=None, help="how to start the ranks "
                   "(default: the launcher's choice, warm on Linux)")
    a = p.parse_args()
    missing = sorted({x.name for x in (ROOT / "launch_scripts").glob("*.py")} - set(CASES))
    if missing:
        print(f"warning: no arguments known for {missing}; add them to CASES", file=sys.stderr)
    unknown = sorted(set(a.scripts) - set(CASES))
    if unknown:
        p.error(f"unknown scripts {unknown}; choose from {sorted(CASES)}")
    below = sorted({(s, n) for s in a.scripts for n in a.nproc if n < MIN_RANKS.get(s, 1)})
    for s, n in below:
        print(f"skipped: {s} at world size {n} (it needs {MIN_RANKS[s]} ranks and says so)")
    jobs = [(s, n) for s in a.scripts for n in a.nproc for _ in range(a.k) if (s, n) not in below]
    stats = collections.defaultdict(collections.Counter)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        outcomes = pool.map(lambda j: one_run(*j, a.via), jobs)
        for i, ((s, n), (outcome, sec, detail)) in enumerate(zip(jobs, outcomes), 1):
            stats[(s, n)][outcome] += 1
            stats[(s, n)]["seconds"] += sec
            print(f"[{i}/{len(jobs)}] {s} x{n}: {outcome} ({sec:.1f} s) {detail}", flush=True)
    width = max(len(s) for s in a.scripts)
    print(f"\n{'script':<{width}}  ranks  runs  native aborts  non-zero exits  s/run")
    for (s, n), c in sorted(stats.items()):
        runs = c["ok"] + c["abort"] + c["fail"]
        print(f"{s:<{width}}  {n:5d}  {runs:4d}  {c['abort']:13d}  {c['abort'] + c['fail']:14d}  {c['seconds'] / runs:5.1f}")
    aborts = sum(c["abort"] for c in stats.values())
    bad = sum(c["abort"] + c["fail"] for c in stats.values())
    print(f"total: {len(jobs)} runs in {time.perf_counter() - t0:.0f} s, {aborts} native aborts, {bad} non-zero exits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
