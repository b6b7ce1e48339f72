"""Timing that is correct on CPU and GPU (introduced in notebooks/01_gpu_architecture.ipynb).

CUDA kernels run asynchronously: ``time.perf_counter()`` around ``a @ b`` on a GPU measures only the
launch. :func:`time_fn` synchronises (CUDA events on GPU) and reports the best and median of repeats.
"""

from __future__ import annotations

import os
import statistics
import sys
import time


def time_fn(fn, device="cpu", iters: int = 5, warmup: int = 1) -> dict:
    """Time ``fn()`` on ``device``.

    Args:
        fn: a callable with no arguments.
        device: "cpu", "cuda", or a torch.device; on CUDA the time is measured with CUDA events.
        iters: timed calls (>= 1); warmup: untimed calls first (allocations, kernel selection, caches).

    Returns:
        ``{"best_s", "median_s", "all_s"}`` in seconds.

    Raises:
        ValueError: iters < 1.
    """
    import torch

    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return {"best_s": min(times), "median_s": statistics.median(times), "all_s": times}


def matmul_flops(n: int) -> int:
    """FLOP of an (n x n) @ (n x n) matmul: n^2 outputs x n multiply-adds x 2 = 2 n^3."""
    return 2 * n ** 3


def matmul_intensity(n: int, bytes_per_element: int) -> float:
    """Arithmetic intensity (FLOP per byte of memory traffic) of an n x n x n matmul, counting the
    minimum traffic: read A and B, write C, 3 n^2 elements. = 2n^3 / (3 n^2 b) = 2n / (3b)."""
    return matmul_flops(n) / (3 * n * n * bytes_per_element)


def synced_clock(device=None) -> float:
    """``time.perf_counter()`` (seconds) read after the device has finished its queued work.

    CUDA kernels, and NCCL collectives, run asynchronously: a host clock read right after
    ``dist.all_reduce`` or ``loss.backward()`` returns when the work is *queued*, not done, and
    undercounts it (on NCCL even ``work.wait()`` does not block the host). On a CUDA ``device`` this
    calls ``torch.cuda.synchronize(device)`` first; on the CPU (gloo) it is just the clock. Every
    host-timed interval in the launch scripts starts and ends with it.

    Args:
        device: a ``torch.device`` or string ("cpu", "cuda", "cuda:1"); None means the CPU.
    """
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def conv_autotune_times(device="cpu", iters: int = 5, shape: tuple = (16, 64, 56, 56)) -> dict:
    """A 3x3 convolution timed with ``torch.backends.cudnn.benchmark`` off and on (lesson 01, section 7).

    cuDNN is NVIDIA's library of tuned kernels for convolutions (and normalisation, RNNs, attention).
    For one convolution it has several algorithms; with ``benchmark`` on, the *first* call for each
    new input shape runs them all, times them and caches the fastest, so that call is slow and the
    later ones can be faster. On a CPU PyTorch uses oneDNN and the flag changes nothing.

    Args:
        device: where to run; shape: ``(batch, channels, height, width)`` of the input (fp32); each
            setting gets its own width, so the second does not find the first's choice in the cache, and
            one untimed call of a third width first loads the library (its set-up is not the tuning).

    Returns:
        ``{False: {"first_s", "median_s"}, True: {...}}``: the first call (host clock, synchronised)
        and the median of ``iters`` later calls (:func:`time_fn`), in seconds. The flag is restored.
    """
    import torch

    before = torch.backends.cudnn.benchmark
    conv = torch.nn.Conv2d(shape[1], shape[1], 3, padding=1).to(device)
    out = {}
    try:
        with torch.no_grad():
            torch.backends.cudnn.benchmark = False
            conv(torch.randn(*shape[:3], shape[3] + 2, device=device))   # load the library, untimed
            for bench in (False, True):
                torch.backends.cudnn.benchmark = bench
                x = torch.randn(*shape[:3], shape[3] + int(bench), device=device)
                t0 = synced_clock(device)
                conv(x)
                first = synced_clock(device) - t0
                out[bench] = {"first_s": first, "median_s": time_fn(lambda: conv(x), device, iters)["median_s"]}
    finally:
        torch.backends.cudnn.benchmark = before
    return out


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask (``taskset``, Slurm's ``--cpus-per-task``),
    capped by a cgroup v2 CPU quota (``docker --cpus``); ``os.cpu_count()`` where neither is known."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def _tree_cpu_s() -> float | None:
    """CPU seconds used by this process and every descendant (the ranks of a launch, the warm template,
    torchrun), including descendants that have ended and been reaped inside the tree. None where the
    children's times cannot be read (only Linux reports them)."""
    import psutil

    if not psutil.LINUX:
        return None
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot, summed over cores (``/proc/stat``), with the
    time a hypervisor gave to other machines (steal) counted as busy: it is capacity this machine lost."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


#: The least share of a core (CPU time / wall time of a one-thread step) that counts as the rank having its
#: core (LoadWatch.ranks_got): quiet 2-rank runs measured 0.995-1.005; one other busy core gave 0.65.
MIN_CPU_SHARE = 0.85


class LoadWatch:
    """The precondition of a timing claim that needs a quiet machine: how much CPU *other* processes took
    while the measurement ran.

    A speed-up of 2 ranks on 2 cores, or "workers on other cores overlap loading and training", is true
    on a quiet machine and false on one where a browser, a compile or another job holds a core. Such a
    claim is asserted only when the machine was quiet during its measurement; otherwise
    :meth:`claim` prints one plain line saying what was measured and that the claim is not asserted on
    this run (never a silent skip). The goals themselves are measured by ``benchmarks/``.

    Other load = machine busy time (``/proc/stat``, all cores, steal included) minus the CPU time of this
    process and its descendants, divided by the wall time: in cores, on average. Used by lessons 03, 04,
    05, 09, 10, 11 and 12 (``with LoadWatch(cores=2) as machine: ...`` around the runs, then
    ``machine.claim(ok, "what")``), and by tests/lessons/test_11_benchmarking.py.

    Args:
        cores: cores the claim needs to itself (e.g. 2 for a 2-rank speed-up on one thread per rank).
        max_other_cores: the most other processes may use, on average over the window, for the machine
            to count as quiet. The default 0.25 core is well above what an idle desktop, JupyterLab and
            Chromium polling a page take here (0.02-0.10 core measured on the 2-core machine) and well
            below one busy core (0.9-1.0 measured with ``python3 -c "while True: pass" &``).

        own: whose CPU time is the claim's own: "tree" (this process and its descendants: the ranks of a
            launch, DataLoader workers) or "process" (this process only: an in-process measurement, where
            even an idle launch template's work would be interference).

    Attributes (after the ``with`` block): ``wall_s``, ``other_cores`` (None where it cannot be
    measured: not Linux), ``usable_cores`` (:func:`usable_cores`), ``cpu_share`` (see :meth:`ranks_got`).

    A virtual machine's cores can be busy with another machine's work on the same host, which no count of
    this machine's processes shows (and not every hypervisor reports it as steal): measured once, a quiet
    run's 2-rank speed-up of 1.14 where quiet runs give 1.6-1.8. The ranks' own CPU time tells:
    :meth:`ranks_got` takes the share of a core the ranks' compute got (CPU time / wall time of one thread,
    e.g. ``compute_cpu_share`` of launch_scripts/ddp_speedup.py), and below :data:`MIN_CPU_SHARE` the
    claim is not asserted either.
    """

    def __init__(self, cores: int = 1, max_other_cores: float = 0.25, own: str = "tree"):
        if cores < 1:
            raise ValueError(f"cores must be at least 1, got {cores}")
        if own not in ("tree", "process"):
            raise ValueError(f"own must be 'tree' (this process and its descendants) or 'process', got {own!r}")
        self.cores, self.max_other_cores, self.own = cores, max_other_cores, own
        self.wall_s = self.other_cores = self.cpu_share = None
        self.usable_cores = usable_cores()

    def ranks_got(self, share) -> "LoadWatch":
        """Record the share of a core the claim's ranks got for their compute (the least over ranks and
        runs: CPU time / wall time of a one-thread step; about 1.0 when each rank had its core): a number,
        or several (any iterable). None is ignored (not measured, e.g. on a GPU)."""
        shares = [share] if share is None or isinstance(share, (int, float)) else list(share)
        for s in (s for s in shares if s is not None):
            self.cpu_share = s if self.cpu_share is None else min(self.cpu_share, s)
        return self

    def _own_cpu_s(self) -> float | None:
        if self.own == "process":
            t = os.times()
            return t.user + t.system
        return _tree_cpu_s()

    def start(self) -> "LoadWatch":
        """Start watching (what ``with`` does); for a measurement that spans several notebook cells.

        A warm-launch template that is still importing PyTorch in the background is waited for first
        (:func:`mgpu_utils.launch.warm.settle`): the course's own start-up is not the load of others."""
        warm = sys.modules.get("mgpu_utils.launch.warm")      # only where this kernel launches
        if warm is not None:
            warm.settle()
        self._t0, self._busy0, self._own0 = time.perf_counter(), _machine_busy_s(), self._own_cpu_s()
        return self

    def stop(self) -> "LoadWatch":
        """Stop watching and compute ``wall_s`` and ``other_cores`` (what the end of ``with`` does)."""
        self.wall_s = time.perf_counter() - self._t0
        own = self._own_cpu_s()
        if own is not None and self._own0 is not None and self.wall_s > 0:
            other = (_machine_busy_s() - self._busy0) - (own - self._own0)
            self.other_cores = max(0.0, other / self.wall_s)
        return self

    def __enter__(self) -> "LoadWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def quiet(self) -> bool:
        """True when the claim's cores were free: enough usable cores and little other load."""
        return self.why_not() is None

    def _short_why(self) -> str | None:
        """:meth:`why_not` in a few words, for the one line :meth:`claim` prints."""
        if self.why_not() is None:
            return None
        if self.usable_cores < self.cores:
            return f"{self.usable_cores} usable core(s), the claim needs {self.cores}"
        if self.other_cores is None:
            return "the load of other processes cannot be measured here"
        if self.other_cores > self.max_other_cores:
            return f"busy machine: others used {self.other_cores:.2f} cores"
        return f"busy host: ranks got {self.cpu_share:.0%} of a core"

    def why_not(self) -> str | None:
        """Why the machine did not count as quiet (one phrase), or None when it did."""
        if self.wall_s is None:
            raise RuntimeError("LoadWatch: use it as `with LoadWatch(...) as machine:` around the measurement")
        if self.usable_cores < self.cores:
            return f"this process may use {self.usable_cores} core(s) and the claim needs {self.cores}"
        if self.other_cores is None:
            return "the CPU time of other processes cannot be measured on this system"
        if self.other_cores > self.max_other_cores:
            return (f"other processes used {self.other_cores:.2f} core(s) on average during the "
                    f"{self.wall_s:.0f} s measurement (quiet: at most {self.max_other_cores})")
        if self.cpu_share is not None and self.cpu_share < MIN_CPU_SHARE:
            return (f"the ranks' compute got {self.cpu_share:.0%} of a core each (at least "
                    f"{MIN_CPU_SHARE:.0%} when the cores are theirs): the cores were busy with work this "
                    f"machine cannot see (another virtual machine on the host?)")
        return None

    def claim(self, ok: bool, what: str, unless: str | None = None) -> bool:
        """Assert the timing claim ``what`` (``ok``: whether the measurement shows it) on a quiet machine;
        on a busy one print one line saying why it is not asserted on this run. Returns whether it was
        asserted.

        ``unless``: a reason the caller measured why this run cannot show the claim although the
        machine's average load was low (one phrase, e.g. lesson 05's "rank 0's forward 5 took 112 ms,
        96 ms over the median: stage times unequal"); printed instead of asserting. None: no such reason.

        Raises:
            AssertionError: the machine was quiet and the measurement does not show ``what``.
        """
        from mgpu_utils.text import wrap_text

        why = unless if self.why_not() is None else self._short_why()
        if why is None:
            assert ok, f"{what}: not shown by this run, on a quiet machine ({self.other_cores:.2f} other cores)"
            print(wrap_text(f"checked (quiet machine): {what}"))
            return True
        print(wrap_text(f"not asserted ({why}): {what}"))
        return False
