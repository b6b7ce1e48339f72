"""Script-side helpers: who am I, which backend, set up and tear down.

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
import json
import os
import sys
import time
from dataclasses import dataclass

#: Prefix of the one line of JSON that rank 0 prints at the end of a launch script.
RESULT_MARKER = "MGPU_RESULT "
#: Prefix of the one line of JSON a failing rank prints to stderr (rank, error type, message, time).
ERROR_MARKER = "MGPU_ERROR "
#: Environment variable that forces a backend ("gloo" or "nccl"); set by the launcher.
BACKEND_ENV = "MGPU_BACKEND"
#: Environment variable with the collective timeout in seconds (default 120).
TIMEOUT_ENV = "MGPU_COLLECTIVE_TIMEOUT_S"


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


def get_dist_env(environ: dict | None = None) -> DistEnv:
    """Read rank, local rank and world size from torchrun's environment variables.

    Args:
        environ: mapping to read (default ``os.environ``).

    Returns:
        A :class:`DistEnv`; world size 1 (``under_torchrun=False``) when ``RANK`` is not set.

    Raises:
        ValueError: if the variables are inconsistent (e.g. ``RANK >= WORLD_SIZE``).
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env:
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


def choose_backend(local_world_size: int, num_gpus: int | None = None, forced: str | None = None) -> tuple[str, str]:
    """Pick the communication backend for ``local_world_size`` processes on one machine.

    NCCL when every local rank has its own CUDA GPU, gloo otherwise (CPU tier, or fewer GPUs than
    ranks: two ranks on one GPU make NCCL fail with "Duplicate GPU detected").

    Args:
        local_world_size: processes on this machine (>= 1).
        num_gpus: visible CUDA devices (default ``torch.cuda.device_count()``).
        forced: "gloo" or "nccl" to override (default: ``$MGPU_BACKEND`` if set).

    Returns:
        ``(backend, reason)``: backend is "nccl" or "gloo"; reason is one line for a human.

    Raises:
        ValueError: unknown forced backend, or NCCL forced with fewer GPUs than local ranks.
    """
    if num_gpus is None:
        import torch
        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    forced = forced if forced is not None else (os.environ.get(BACKEND_ENV) or None)
    if forced is not None:
        forced = forced.lower()
        if forced not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {forced!r}")
        if forced == "nccl" and num_gpus < local_world_size:
            raise ValueError(f"NCCL needs one GPU per rank: {local_world_size} local ranks but {num_gpus} GPU(s). "
                             f"Use backend='gloo' or at most {num_gpus} processes.")
        return forced, f"{forced} (forced)"
    if num_gpus == 0:
        return "gloo", "gloo on CPU: no CUDA GPU visible, so ranks are simulated as CPU processes"
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
        """Print with a ``[rank r]`` prefix; by default only on rank 0."""
        if all_ranks or self.is_main:
            print(f"[rank {self.rank}]", *args, flush=True)


def _report_error(rank: int, exc: BaseException) -> None:
    """Print one machine-readable error line to stderr (read by the launcher).

    Python prints the traceback itself when the exception leaves the script."""
    info = {"rank": rank, "type": type(exc).__name__, "message": str(exc)[:2000], "time": time.time()}
    print(ERROR_MARKER + json.dumps(info), file=sys.stderr, flush=True)


@contextlib.contextmanager
def distributed(backend: str | None = None, timeout_s: float | None = None, quiet: bool = False):
    """Set up ``torch.distributed`` for a launch script, and always tear it down.

    Under torchrun: chooses the backend (:func:`choose_backend`), calls ``init_process_group``,
    binds the GPU ``cuda:local_rank`` for NCCL, and rank 0 prints one line saying which backend and
    why. Without torchrun: no process group, world size 1, same code path (collectives must be
    guarded by ``dist.is_initialized()`` or skipped when ``world_size == 1``).

    On exit ``destroy_process_group()`` runs, also on error; an error is reported to stderr as a
    traceback plus one ``MGPU_ERROR {...}`` line that :func:`mgpu_utils.launcher.launch` reads.

    Args:
        backend: force "gloo" or "nccl" (default: automatic, or ``$MGPU_BACKEND``).
        timeout_s: collective timeout in seconds (default ``$MGPU_COLLECTIVE_TIMEOUT_S`` or 120):
            short, so a rank waiting for a collective that another rank never calls fails instead of
            waiting for torch's default (30 minutes for gloo, 10 for NCCL).
        quiet: do not print the backend line.

    Yields:
        :class:`DistContext` with ``rank``, ``world_size``, ``device``, ``backend`` ("gloo", "nccl",
        or "none" without torchrun), ``reason``, ``log``.

    Raises:
        ValueError: a forced backend that cannot work (see :func:`choose_backend`).
    """
    import torch
    import torch.distributed as dist

    env = get_dist_env()
    if timeout_s is None:
        timeout_s = float(os.environ.get(TIMEOUT_ENV, "120"))
    try:
        chosen, reason = choose_backend(env.local_world_size, forced=backend)
        if chosen == "nccl":
            torch.cuda.set_device(env.local_rank)
            device = torch.device("cuda", env.local_rank)
        else:
            device = torch.device("cpu")
        if env.under_torchrun:
            kwargs = {"device_id": device} if chosen == "nccl" else {}
            dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        else:
            chosen, reason = "none", "single process (not started by torchrun): world size 1, no process group"
        ctx = DistContext(env, chosen, reason, device)
        if not quiet:
            ctx.log(f"world size {env.world_size}, backend {reason}")
    except Exception as e:  # a setup error is reported like any other, then re-raised
        _report_error(env.rank, e)
        raise
    try:
        yield ctx
    except Exception as e:  # not SystemExit / KeyboardInterrupt: those are not the script's error
        _report_error(env.rank, e)
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


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
