"""Script-side helpers: who am I, which backend, set up and tear down (every launch script;
explained in lessons 00 and 03).

Used by every file in ``launch_scripts/``; introduced in ``notebooks/00_setup.ipynb``
and explained in ``notebooks/03_ddp.ipynb``.

A launch script does::

    from mgpu_utils.dist import distributed, emit_result

    with distributed() as ctx:          # init_process_group, or world size 1 without torchrun
        ...                             # ctx.rank, ctx.world_size, ctx.device, ctx.log(...)
        emit_result({"loss": 0.1})      # rank 0 prints one JSON line the notebook parses

The same file runs under ``torchrun --standalone --nproc-per-node N`` and as plain
``python script.py`` (world size 1, no process group needed).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass

from mgpu_utils.text import LINE_WIDTH, wrap_text

#: Prefix of the one line of JSON that rank 0 prints at the end of a launch script.
RESULT_MARKER = "MGPU_RESULT "
#: Prefix of the one line of JSON a failing rank prints to stderr (rank, error type, message, time).
ERROR_MARKER = "MGPU_ERROR "
#: Environment variable that forces a backend ("gloo" or "nccl"); set by the launcher.
BACKEND_ENV = "MGPU_BACKEND"
#: Environment variable with the collective timeout in seconds (default 120).
TIMEOUT_ENV = "MGPU_COLLECTIVE_TIMEOUT_S"
#: Set by the launcher, with :data:`BACKEND_ENV`, to the reason of the backend it chose for the job: the
#: ranks then take that decision as it is (:func:`choose_backend` runs once, in the launcher).
REASON_ENV = "MGPU_BACKEND_REASON"
#: Environment variable with the width :meth:`DistContext.log` wraps at (default :data:`LINE_WIDTH`); set
#: by :func:`mgpu_utils.launch.nodes.launch_nodes`, which puts ``[node k] `` in front of every line.
LINE_WIDTH_ENV = "MGPU_LINE_WIDTH"
#: What the backend's reason adds when the launcher hides the GPUs from ranks that run on CPU.
HIDDEN_NOTE = ("; the GPU(s) are hidden from the ranks (CUDA_VISIBLE_DEVICES=''), so no library takes a CUDA "
               "path with their CPU tensors")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, as torchrun describes it.

    Attributes:
        rank: global rank, 0 .. world_size-1.
        local_rank: rank on this machine (selects the GPU).
        world_size: number of processes in the job.
        local_world_size: number of processes on this machine.
        under_torchrun: False when the script was started as plain ``python`` (world size 1).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    under_torchrun: bool = False


def srun_without_torchrun(environ=None) -> str | None:
    """The message for a script started by ``srun`` as one of several tasks without torchrun, else None.

    Such a task has Slurm's variables (``SLURM_STEP_NUM_TASKS`` > 1) but not torchrun's (``RANK``): each task
    would train alone as world size 1, N times over. :func:`mgpu_utils.dist.get_dist_env` refuses it.
    """
    env = os.environ if environ is None else environ
    tasks = env.get("SLURM_STEP_NUM_TASKS", "1")
    if "RANK" in env or not tasks.isdigit() or int(tasks) <= 1:
        return None
    return (f"this process is task {env.get('SLURM_PROCID', '?')} of {tasks} started by srun without torchrun: "
            "each task would run alone as world size 1. Start one torchrun agent per node instead: "
            "sbatch --nodes N cluster/slurm/job.sbatch SCRIPT [ARGS] (or srun --ntasks-per-node 1 torchrun "
            "--nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT SCRIPT)")


def get_dist_env(environ: dict | None = None) -> DistEnv:
    """Read rank, local rank and world size from torchrun's environment variables.

    Args:
        environ: mapping to read (default ``os.environ``).

    Returns:
        A :class:`DistEnv`; world size 1 (``under_torchrun=False``) when ``RANK`` is not set.

    Raises:
        ValueError: if the variables are inconsistent (e.g. ``RANK >= WORLD_SIZE``), or the process is one of
            several tasks that ``srun`` started without torchrun (:func:`srun_without_torchrun`).
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env:
        refused = srun_without_torchrun(env)
        if refused:
            raise ValueError(refused)
        return DistEnv()
    try:
        rank = int(env["RANK"])
        world = int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except (KeyError, ValueError) as e:
        raise ValueError(f"RANK is set but torchrun's other variables are missing or not integers ({e}); "
                         "start the script with torchrun or with plain python, not with RANK set by hand") from None
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise ValueError(f"inconsistent torchrun environment: RANK={rank} LOCAL_RANK={local_rank} "
                         f"WORLD_SIZE={world} LOCAL_WORLD_SIZE={local_world}")
    return DistEnv(rank, local_rank, world, local_world, True)


def _nvidia_driver_present() -> bool:
    """True when the NVIDIA kernel driver is loaded (a GPU is there, whatever PyTorch makes of it)."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def _supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a build with ``arch_list`` (``torch.cuda.get_arch_list()``) runs on a GPU of ``capability``.

    CUDA's compatibility rules: a cubin for ``sm_XY`` runs on compute capability X.Z with Z >= Y (same
    major: an ``sm_86`` cubin runs on an L4, 8.9); PTX (``compute_XY``) is compiled by the driver for any
    capability >= X.Y."""
    major, minor = capability
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        digits = "".join(ch for ch in num if ch.isdigit())
        if len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def gpu_status() -> tuple[int, int, str]:
    """How many CUDA GPUs the course can use, and in one line why not the others.

    The pinned PyTorch (a CUDA 13 build) has kernels for compute capability 7.5 and newer only
    (``torch.cuda.get_arch_list()``), and needs a driver recent enough for CUDA 13. An older GPU (V100,
    P100) fails in every kernel with "no kernel image is available"; an older driver makes
    ``torch.cuda.is_available()`` False. Both would otherwise fall back to the CPU tier silently.

    Returns:
        ``(visible, usable, note)``: GPUs CUDA shows, those this build can run (usable GPUs come
        first in CUDA's order, or none: the course then uses none of them), and "" or a one-line
        explanation naming the fix (see docs/gpu-and-cluster.md, GPU requirements).
    """
    import torch

    hide = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hide is not None and hide.strip() in ("", "-1"):
        return 0, 0, ""               # hidden on purpose (by the launcher for ranks on CPU, or by the user)
    if not torch.cuda.is_available():
        if torch.version.cuda and _nvidia_driver_present():
            return 0, 0, (f"an NVIDIA driver is loaded but this PyTorch (CUDA {torch.version.cuda}) cannot use it: "
                          f"the driver is probably older than CUDA {torch.version.cuda} needs. Update the driver, or "
                          "install a PyTorch wheel for an older CUDA (docs/gpu-and-cluster.md, GPU requirements)")
        if not torch.version.cuda and _nvidia_driver_present():
            return 0, 0, (f"an NVIDIA driver is loaded but this PyTorch ({torch.__version__}) is a CPU-only build: "
                          "install a CUDA build to use the GPUs (docs/gpu-and-cluster.md, GPU requirements)")
        return 0, 0, ""
    visible, arch = torch.cuda.device_count(), torch.cuda.get_arch_list()
    for i in range(visible):
        cap = torch.cuda.get_device_capability(i)
        if not _supported(cap, arch):
            name = torch.cuda.get_device_name(i)
            return visible, 0, (f"GPU {i} ({name}, compute capability {cap[0]}.{cap[1]}) is older than this PyTorch "
                                f"build supports ({', '.join(arch)}): its kernels would fail with 'no kernel image is "
                                "available'. Install a PyTorch wheel built for it (docs/gpu-and-cluster.md, GPU "
                                "requirements)")
    return visible, visible, ""


def choose_backend(local_world_size: int, num_gpus: int | None = None, forced: str | None = None) -> tuple[str, str]:
    """The course's backend rule, for ``local_world_size`` processes on one machine (lessons 00 and 03).

    NCCL when every local rank has its own CUDA GPU, gloo otherwise (CPU tier, or fewer GPUs than
    ranks: two ranks on one GPU make NCCL fail with "Duplicate GPU detected"). It is applied once per
    job: the launcher (:func:`mgpu_utils.launch.launcher.run_torchrun`) calls it before it starts the
    ranks and passes the decision on in :data:`BACKEND_ENV` and :data:`REASON_ENV`, which each rank
    then takes as it is. Under plain ``torchrun`` each rank applies the rule itself (they all see the
    same machine, so they agree).

    Args:
        local_world_size: processes on this machine (>= 1).
        num_gpus: usable CUDA devices (default: :func:`gpu_status`, which leaves out GPUs this PyTorch
            build cannot run and says why in the reason).
        forced: "gloo" or "nccl" to override (default: ``$MGPU_BACKEND`` if set).

    Returns:
        ``(backend, reason)``: backend is "nccl" or "gloo"; reason is one line for a human.

    Raises:
        ValueError: unknown forced backend, or NCCL forced with fewer usable GPUs than local ranks.
    """
    decided = os.environ.get(REASON_ENV)
    if decided and num_gpus is None and forced is None and os.environ.get(BACKEND_ENV):
        return os.environ[BACKEND_ENV], decided                      # the launcher chose for this job
    note = ""
    if num_gpus is None:
        _, num_gpus, note = gpu_status()
        note = f" ({note})" if note else ""
    forced = forced if forced is not None else (os.environ.get(BACKEND_ENV) or None)
    if forced is not None:
        forced = forced.lower() if isinstance(forced, str) else forced
        if forced not in ("gloo", "nccl"):
            raise ValueError(f"backend must be None (automatic), 'gloo' or 'nccl', got {forced!r}")
        if forced == "nccl" and num_gpus < local_world_size:
            raise ValueError(f"NCCL needs one GPU per rank: {local_world_size} local rank(s) but {num_gpus} usable "
                             f"GPU(s){note} (two ranks on one GPU fail with 'Duplicate GPU detected'). Use "
                             f"backend='gloo' (or None for automatic) or at most {num_gpus} processes.")
        return forced, f"{forced} (forced)"
    if num_gpus == 0:
        if note:
            return "gloo", "gloo on CPU (no usable CUDA GPU): ranks are CPU processes" + note
        return "gloo", "gloo on CPU (no CUDA GPU visible): ranks are CPU processes"
    if num_gpus >= local_world_size:
        return "nccl", f"nccl: {num_gpus} GPU(s) for {local_world_size} local rank(s), one GPU per rank"
    return "gloo", (f"gloo on CPU: {local_world_size} local ranks but only {num_gpus} GPU(s); "
                    "NCCL would need one GPU per rank")


@dataclass
class DistContext:
    """What :func:`distributed` yields: the environment plus the chosen backend and device."""

    env: DistEnv
    backend: str
    reason: str
    device: "torch.device"  # cuda:local_rank with NCCL, else cpu
    timeout_s: float = 120.0  # the collective timeout of the default group, and of every group made after it

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that prints summaries and writes files."""
        return self.env.rank == 0

    def log(self, *args, all_ranks: bool = False) -> None:
        """Print with a ``[rank r]`` prefix; by default only on rank 0. A line longer than
        ``$MGPU_LINE_WIDTH`` (default :data:`LINE_WIDTH`) wraps at spaces (:func:`wrap_text`): every line
        has the prefix, continuation lines two more spaces. One write per call, so that ranks sharing one
        output (several workers of a torchrun agent) do not interleave within a line."""
        if all_ranks or self.is_main:
            prefix = f"[rank {self.rank}] "
            width = int(os.environ.get(LINE_WIDTH_ENV) or LINE_WIDTH) - len(prefix)
            text = wrap_text(" ".join(map(str, args)), width)
            sys.stdout.write("".join(prefix + line + "\n" for line in text.split("\n")))
            sys.stdout.flush()


def _report_error(rank: int, exc: BaseException) -> None:
    """Print one machine-readable error line to stderr (read by the launcher), and under torchrun write the
    rank's error file (``$TORCHELASTIC_ERROR_FILE``, as ``@record`` does): torchrun's failure summary then shows
    the exception and its traceback, and keeps them under ``--log-dir`` (cluster/README.md).

    Python prints the traceback itself when the exception leaves the script."""
    info = {"rank": rank, "type": type(exc).__name__, "message": str(exc)[:2000], "time": time.time()}
    # one write(): ranks of a node share one pipe, and print() writes the line and its "\n" separately, so
    # another rank's output could land between them (a write under PIPE_BUF bytes is not split)
    sys.stderr.write(ERROR_MARKER + json.dumps(info) + "\n")
    sys.stderr.flush()
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        try:
            ErrorHandler().record_exception(exc)
        except OSError:                  # the report above still stands
            pass


#: The default process group's backend for each choice, per device type. With NCCL the group also
#: serves CPU tensors over gloo: a checkpoint's metadata, a grader's reference, a small timing
#: all-reduce are CPU tensors, and an NCCL-only group refuses them ("No backend type associated with
#: device type cpu").
GROUP_BACKENDS = {"nccl": "cpu:gloo,cuda:nccl", "gloo": "gloo"}


#: The collective timeout :func:`distributed` gave the default group (seconds), while it is open; None outside.
_CHOSEN_TIMEOUT_S: float | None = None


def collective_timeout() -> datetime.timedelta:
    """The course's collective timeout: inside :func:`distributed`, the one it gave the default group (also
    ``ctx.timeout_s``); else ``$MGPU_COLLECTIVE_TIMEOUT_S`` seconds (:data:`TIMEOUT_ENV`), 120 when unset
    (lessons 03 and 12). The one place that decides it: the default group (:func:`distributed`), every
    subgroup (:func:`new_group`), every device mesh (:func:`device_mesh`) and the graders' subgroups use it.

    Short on purpose: a rank waiting for a collective that another rank never calls fails within it, instead
    of torch's default for groups made without a timeout (30 minutes on gloo, 10 on NCCL).

    Raises:
        ValueError: the variable is not a positive number (the message names it).
    """
    if _CHOSEN_TIMEOUT_S is not None:                  # distributed(timeout_s=...) decided it for this process
        return datetime.timedelta(seconds=_CHOSEN_TIMEOUT_S)
    text = os.environ.get(TIMEOUT_ENV, "120")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={text!r}: the collective timeout must be a positive number of seconds "
                         f"(unset it for the default, 120)")
    return datetime.timedelta(seconds=seconds)


def new_group(ranks=None, **kwargs):
    """``dist.new_group(ranks, **kwargs)`` with the course's collective timeout (:func:`collective_timeout`).

    torch gives a group made without ``timeout=`` its backend's default (30 minutes on gloo, 10 on NCCL),
    not the default group's: a subgroup collective that one rank never joins would wait that long
    (lessons 04, 06). Like ``dist.new_group`` it is a collective over the default group: every rank creates
    every group, in the same order. Returns the group (``GroupMember.NON_GROUP_MEMBER`` on ranks outside it).
    """
    import torch.distributed as dist

    kwargs.setdefault("timeout", collective_timeout())
    return dist.new_group(ranks, **kwargs)


def device_mesh(device_type: str, mesh_shape: tuple, mesh_dim_names: tuple | None = None):
    """``init_device_mesh(device_type, mesh_shape, mesh_dim_names=...)`` whose every dimension's group has the
    course's collective timeout (:func:`collective_timeout`; lessons 05-08, 12).

    ``init_device_mesh`` takes no timeout: a dimension smaller than the world gets a new group (or an NCCL
    split) with the backend's default (30 minutes on gloo, 10 on NCCL), so the timeout is set on each
    dimension's group afterwards (:func:`mgpu_utils.compat.set_group_timeout`). Returns the ``DeviceMesh``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from mgpu_utils.compat import set_group_timeout

    mesh = init_device_mesh(device_type, tuple(mesh_shape), mesh_dim_names=mesh_dim_names)
    timeout = collective_timeout()
    for dim in range(mesh.ndim):
        set_group_timeout(timeout, mesh.get_group(dim))
    return mesh


#: Reasons :func:`powersgd_bucket_cap_mb` already printed in this process (each is said once).
_POWERSGD_SAID: set = set()


def powersgd_bucket_cap_mb(model, backend: str, bucket_cap_mb: float | None = None, log=print) -> float | None:
    """DDP's ``bucket_cap_mb`` (MiB) for ``model`` when its gradients go through torch's ``powerSGD_hook``
    (lesson 09, ``comm_hooks.py``): on gloo, one bucket for the whole model.

    Why: the hook launches its second and third all-reduce (the P and Q factors) from inside a future's
    callback and waits there. gloo runs that callback on its own thread while the backward pass launches the
    next bucket's all-reduce, so with two buckets the ranks can issue their collectives in different orders:
    the job hangs, times out, or aborts in gloo, varying from run to run (torch 2.14, 2 ranks: SmallCNN with
    ``bucket_cap_mb=0.05`` hung once and aborted once; six ``Linear(256, 256)``, 1.6 MB, with DDP's default
    buckets hung twice). Any model over 1 MiB has two buckets by default. On NCCL, what the hook is written
    for, the cap is left as asked (not checked here: it needs two GPUs).

    Args:
        model: the module about to be wrapped in DDP (parameters on their device).
        backend: the process group's backend ("gloo" or "nccl", ``ctx.backend``).
        bucket_cap_mb: the cap asked for (None: DDP's default, 25 MiB after a first bucket of 1 MiB).
        log: where the one line goes when the cap is raised (``ctx.log`` in a launch script); said once per
            process.

    Returns:
        The cap to pass to ``DDP(..., bucket_cap_mb=...)``: on gloo, ``bucket_cap_mb`` if it already holds every
        parameter, else the parameters' size in MiB rounded up; otherwise ``bucket_cap_mb`` as given.

    Raises:
        ValueError: on gloo, parameters of several dtypes or devices (DDP gives each its own bucket, whatever
            the cap): cast the model to one dtype on one device first.
    """
    if backend != "gloo":
        return bucket_cap_mb
    params = [p for p in model.parameters() if p.requires_grad]
    kinds = sorted({f"{p.dtype} on {p.device}" for p in params})
    if len(kinds) > 1:
        raise ValueError(f"PowerSGD on gloo needs one DDP bucket, but the parameters are {', '.join(kinds)}: DDP "
                         "buckets each kind apart, and torch's powerSGD_hook can hang gloo with two buckets. Cast "
                         "the model to one dtype on one device (model.to(dtype)) before DDP")
    need = sum(p.numel() * p.element_size() for p in params)
    if bucket_cap_mb is not None and bucket_cap_mb * 2**20 >= need:
        return bucket_cap_mb
    cap = max(1, -(-need // 2**20))                    # MiB, rounded up
    first = 1.0 if bucket_cap_mb is None else bucket_cap_mb   # DDP's default starts with a 1 MiB bucket
    if need > first * 2**20:
        asked = "DDP's 1 + 25 MiB" if bucket_cap_mb is None else f"{bucket_cap_mb:g} MiB ones"
        why = f"PowerSGD on gloo: one {cap} MiB bucket, not {asked}: its hook can hang gloo with two"
        if why not in _POWERSGD_SAID:
            _POWERSGD_SAID.add(why)
            log(why)
    return cap


def init_group(chosen: str, device, timeout_s: float) -> None:
    """Create the default process group for backend ``chosen`` ("nccl" or "gloo"; lessons 00 and 03).

    With NCCL the group is bound to ``device`` (``device_id``: the communicator is created at once, on
    the GPU this rank owns) and maps CPU tensors to gloo (:data:`GROUP_BACKENDS`). ``timeout_s`` is the
    collective timeout in seconds.
    """
    import torch.distributed as dist

    kwargs = {"device_id": device} if chosen == "nccl" else {}
    dist.init_process_group(GROUP_BACKENDS[chosen], timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


@contextlib.contextmanager
def distributed(backend: str | None = None, timeout_s: float | None = None, quiet: bool = False):
    """Set up ``torch.distributed`` for a launch script, and always tear it down.

    Under torchrun: chooses the backend (:func:`choose_backend`), calls ``init_process_group``,
    binds the GPU ``cuda:local_rank`` for NCCL, and rank 0 prints one line saying which backend and
    why. Without torchrun: no process group, world size 1, same code path (collectives must be
    guarded by ``dist.is_initialized()`` or skipped when ``world_size == 1``).

    SIGUSR2 makes the process print every thread's Python stack to stderr and go on (``faulthandler``;
    unless the script handles SIGUSR2 itself): ``pkill -USR2 -f SCRIPT`` on each node shows where every rank
    of a hung job waits (cluster/README.md).

    At the end of the ``with`` block, under torchrun, the rank ends through :func:`shutdown`: barrier
    (on success), ``destroy_process_group()``, flush, and ``os._exit`` with the true exit status, so no
    native abort at interpreter exit can turn a finished job into a failed one (the cause is written
    in :func:`shutdown`). Code after the ``with`` block does not run: make it the last thing the script
    does. An error is reported to stderr as a traceback plus one ``MGPU_ERROR {...}`` line that
    :func:`mgpu_utils.launch.launcher.launch` reads, and the rank exits with status 1 (``sys.exit(n)``: n).
    Without torchrun the block exits as any ``with`` block does and exceptions propagate.

    Args:
        backend: force "gloo" or "nccl" (default: automatic, or ``$MGPU_BACKEND``).
        timeout_s: collective timeout in seconds (default :func:`collective_timeout`:
            ``$MGPU_COLLECTIVE_TIMEOUT_S`` or 120): short, so a rank waiting for a collective that another
            rank never calls fails instead of waiting for torch's default (30 minutes for gloo, 10 for NCCL).
        quiet: do not print the backend line.

    Yields:
        :class:`DistContext` with ``rank``, ``world_size``, ``device``, ``backend`` ("gloo", "nccl",
        or "none" without torchrun), ``reason``, ``log``.

    Raises:
        ValueError: a forced backend that cannot work (see :func:`choose_backend`).
    """
    import torch

    global _CHOSEN_TIMEOUT_S
    env = get_dist_env()
    if hasattr(signal, "SIGUSR2") and signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
        faulthandler.register(signal.SIGUSR2, all_threads=True)   # `pkill -USR2 -f SCRIPT`: every rank's stack
    try:
        if timeout_s is None:
            timeout_s = collective_timeout().total_seconds()
        chosen, reason = choose_backend(env.local_world_size, forced=backend)
        if chosen == "nccl":
            torch.cuda.set_device(env.local_rank)
            device = torch.device("cuda", env.local_rank)
        else:
            device = torch.device("cpu")
        if env.under_torchrun:
            init_group(chosen, device, timeout_s)
        else:
            chosen, reason = "none", "single process (not started by torchrun): world size 1, no process group"
        ctx = DistContext(env, chosen, reason, device, float(timeout_s))
        _CHOSEN_TIMEOUT_S = float(timeout_s)              # every subgroup and mesh made from now on uses it
        if not quiet:
            ctx.log(f"world size {env.world_size}, backend {reason}")
    except Exception as e:  # a setup error is reported like any other, then re-raised
        _report_error(env.rank, e)
        raise
    try:
        yield ctx
    except BaseException as e:
        code = _exit_code(e)
        if isinstance(e, Exception):  # not SystemExit / KeyboardInterrupt: those are not the script's error
            _report_error(env.rank, e)
        if ctx.backend == "none":
            raise                     # plain python: no process group, Python exits as usual
        if not isinstance(e, SystemExit):  # what Python prints for an uncaught exception, from the script's frames
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next          # this context manager's own frame is not where the error is
            traceback.print_exception(type(e), e, tb)
        elif e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        shutdown(code)
    else:
        if ctx.backend != "none":
            shutdown(0)
    finally:
        _CHOSEN_TIMEOUT_S = None


def _exit_code(exc: BaseException) -> int:
    """The status a Python process ends with when ``exc`` leaves the script (as ``python`` itself sets it)."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + 2  # the shell's convention for "stopped by SIGINT"
    return 1


def shutdown(exit_code: int = 0) -> None:
    """End a rank of a launch script: tear down ``torch.distributed``, flush, and exit with ``exit_code``.

    Every launch script reaches this through :func:`distributed` (at the end of its ``with`` block), so
    nothing after that block runs. The steps, in order:

    1. on success, a barrier: no rank tears down its connections while a peer still talks to it;
    2. on success, ``destroy_process_group()``: every group, sub-groups (DeviceMesh, ``new_group``)
       included; for gloo this stops and joins the worker threads of groups nothing else references.
       After an error neither 1 nor 2 runs (see the comment in the code: no waiting on dead peers);
    3. the ``atexit`` callbacks and a flush of stdout/stderr (the result line is out);
    4. ``os._exit(exit_code)``: the process ends *without* interpreter finalization and without C++
       static destructors.

    Why step 4. The abort it prevents ("terminate called without an active exception", SIGABRT,
    exit code -6, after the result line was printed) was found in a core dump of
    ``tensor_parallel.py``: the main thread was in ``Py_FinalizeEx``, and a gloo worker thread
    (``ProcessGroupGloo::runLoop``) was destroying a finished ``AsyncAllreduceWork``. That work owns the
    collective's tensors; releasing a tensor that has a Python object needs the GIL; CPython ends any
    thread that asks for the GIL during finalization with ``pthread_exit``, whose forced unwind
    crosses the work's ``noexcept`` destructor, and libstdc++ calls ``std::terminate``. Two facts make
    it possible:

    * the worker drops its reference to a work *after* the work is marked complete, and the main
      thread, woken by the completion, may already be printing and exiting: a window of microseconds
      on an idle machine, tens of milliseconds when 4 ranks share 2 cores (hence a few percent of runs);
    * ``destroy_process_group()`` stops the gloo threads only when nothing else references the
      process group. A DDP model, a DeviceMesh or DTensor (and its sharding caches) keep it, and its
      threads, alive until the interpreter clears them at exit (measured: 4 threads before and after
      ``destroy_process_group()`` with a DDP model or a DeviceMesh alive, 1 without).

    So the fix cannot be a ``del model; gc.collect()`` in each script (references inside torch are out
    of reach, and differ between torch versions): after step 2 nothing is destroyed at all. ``os._exit``
    ends the process while the main thread still holds the GIL; the operating system reclaims memory,
    threads and sockets. All communication has finished in steps 1-2, so no peer loses data.

    Args:
        exit_code: the process's exit status: 0 success, 1 a Python error (already reported by
            :func:`distributed`), or the code passed to ``sys.exit``.

    Never returns. Not for notebooks or tests: it ends the calling process.
    """
    import atexit

    try:
        import torch.distributed as dist

        # On an error, no teardown at all: a peer may wait in a collective this rank will never join,
        # and a teardown that talks to peers (NCCL's) would wait for it until the timeout. os._exit
        # closes every connection at once; the peers fail fast and torchrun stops them.
        if exit_code == 0 and dist.is_available() and dist.is_initialized():
            if dist.get_world_size() > 1:
                dist.barrier()
            dist.destroy_process_group()
    except BaseException as e:  # a failing teardown is an error of this rank too: say so, exit non-zero
        print(f"teardown failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        exit_code = exit_code or 1
    try:
        atexit._run_exitfuncs()  # what a normal exit runs first (logging flush, temporary files)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken pipe: nothing more can be written anyway
                pass
        os._exit(exit_code)


def emit_result(result: dict, rank: int | None = None) -> None:
    """Print rank 0's final result as one line ``MGPU_RESULT {json}`` (other ranks print nothing).

    Args:
        result: JSON-serialisable dict (numbers, strings, lists).
        rank: this process's rank (default: from the environment).

    Raises:
        TypeError: a value JSON cannot encode (convert tensors with ``.item()`` / ``.tolist()``).
    """
    rank = get_dist_env().rank if rank is None else rank
    if rank == 0:
        print(RESULT_MARKER + json.dumps(result), flush=True)


def parse_result(text: str) -> dict | None:
    """Return the last ``MGPU_RESULT`` JSON found in ``text``, or None if there is none."""
    found = None
    for line in text.splitlines():
        if line.startswith(RESULT_MARKER):
            found = json.loads(line[len(RESULT_MARKER):])
    return found
