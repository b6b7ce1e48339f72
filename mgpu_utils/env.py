"""What this machine has, which tier of the course it runs, and where the course is (lesson 00; every
lesson uses it).

Three tiers, one code path:

* ``cpu``        - no CUDA GPU: ranks are CPU processes talking over gloo ("simulated ranks").
* ``single-gpu`` - one GPU (Colab): single-device lessons use it; multi-rank launches run on CPU/gloo.
* ``multi-gpu``  - at least as many GPUs as ranks: one GPU per rank, NCCL.
"""

from __future__ import annotations

import os
import platform

from pathlib import Path

from mgpu_utils.dist import choose_backend, gpu_status

#: The course's folder: the clone (the parent of ``mgpu_utils/``); the ranks get it on ``PYTHONPATH``.
REPO_ROOT = Path(__file__).resolve().parent.parent
#: The launch scripts; :func:`mgpu_utils.launch.launcher.launch` finds a script given by file name here.
SCRIPTS_DIR = REPO_ROOT / "launch_scripts"


def _cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else the architecture (e.g. "x86_64")."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_vector_extensions() -> list[str]:
    """SIMD extensions this CPU reports in /proc/cpuinfo (Linux x86: sse4_2, avx, avx2, fma, avx512f,
    avx512_bf16, amx_tile, ...; ARM: asimd, sve). Empty list where the file is missing."""
    wanted = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
              "asimd", "sve"]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def machine_report() -> dict:
    """Describe this machine.

    Returns:
        dict with ``python``, ``torch``, ``cuda`` (CUDA version or None), ``cpu_cores_logical``,
        ``cpu_cores_physical``, ``memory_gb`` (total RAM, GB = 1e9 bytes), ``cpu`` (model string) and
        ``gpus``: a list of ``{"name", "memory_gb", "capability", "sms"}`` (empty without CUDA),
        ``gloo_available`` / ``nccl_available``: whether this PyTorch build includes the backend
        (a CUDA build includes NCCL even on a machine without a GPU).
    """
    import psutil
    import torch

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory_gb": round(p.total_memory / 1e9, 1),
                         "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count})
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "cpu": _cpu_model(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "gpus": gpus,
        "gloo_available": torch.distributed.is_gloo_available(),
        "nccl_available": torch.distributed.is_nccl_available(),
    }


def course_tier(nproc: int = 4, num_gpus: int | None = None) -> dict:
    """Which tier the course runs on for launches with ``nproc`` ranks, and why.

    Args:
        nproc: ranks per launch (the notebooks' ``NPROC``, default 4; ``make course`` sets ``MGPU_NPROC``).
        num_gpus: usable GPUs (default: :func:`mgpu_utils.dist.gpu_status`: GPUs that this PyTorch
            build cannot run, or an NVIDIA driver too old for it, give 0 and a reason that says so).

    The tier describes the machine (how many GPUs); backend and device describe what a launch with
    ``nproc`` ranks uses: with 2 GPUs and 4 ranks the tier is "multi-gpu" but the ranks run on CPU
    over gloo, and ``reason`` says so.

    Returns:
        ``{"tier": "cpu" | "single-gpu" | "multi-gpu", "backend": "gloo" | "nccl",
        "device": "cpu" | "cuda:<local_rank>", "reason": str, "gpus": int}``.

    Raises:
        ValueError: ``nproc < 1``.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    note = ""
    if num_gpus is None:
        _, num_gpus, note = gpu_status()             # GPUs this PyTorch build can run, and why not others
    backend, reason = choose_backend(nproc, num_gpus=num_gpus, forced=None)
    if note:
        reason += f" ({note})"
    tier = "cpu" if num_gpus == 0 else ("single-gpu" if num_gpus == 1 else "multi-gpu")
    device = "cuda:<local_rank>" if backend == "nccl" else "cpu"
    return {"tier": tier, "backend": backend, "device": device, "reason": reason, "gpus": num_gpus}


def default_nproc() -> int:
    """Ranks per launch in the notebooks: ``$MGPU_NPROC`` if set, else 4 (the default CPU tier)."""
    raw = os.environ.get("MGPU_NPROC", "4")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"MGPU_NPROC must be a whole number of ranks (e.g. 4), got {raw!r}") from None
    if n < 1:
        raise ValueError(f"MGPU_NPROC must be at least 1, got {n}")
    return n


def usable_physical_cores() -> int:
    """The physical cores this process can use: the machine's physical cores, at most the CPUs its
    affinity and CPU quota allow (:func:`mgpu_utils.timing.usable_cores`: taskset, Slurm's
    ``--cpus-per-task``, a container). What CPU ranks that compute at once are limited by (lessons 03,
    10 and 11)."""
    from mgpu_utils.timing import usable_cores

    return max(1, min(machine_report()["cpu_cores_physical"] or 1, usable_cores()))


def cpu_ranks(asked: int, gpus: int, cores: int, minimum: int = 2) -> int:
    """How many ranks a lesson launches: ``asked`` when there is one GPU per rank; on CPU one rank per
    core (more only take turns), but at least ``minimum`` (a data-parallel job needs 2 ranks: on one
    core, as on Colab, they take turns; this wins over ``asked``), else at most ``asked`` (lessons 10
    and 12).

    Raises:
        ValueError: ``asked``, ``cores`` or ``minimum`` below 1.
    """
    if asked < 1 or cores < 1 or minimum < 1:
        raise ValueError(f"asked, cores and minimum must be at least 1, got {asked}, {cores}, {minimum}")
    if gpus >= asked:
        return asked
    return max(minimum, min(asked, cores))


def usable_gpus() -> int:
    """The CUDA GPUs the course can use in this process: those this PyTorch build runs on
    (:func:`mgpu_utils.dist.gpu_status`; a GPU too old for the build, or a driver too old, counts 0)."""
    return gpu_status()[1]


def kernel_device():
    """The device of a lesson's single-process cells: ``cuda:0`` when the course can use a GPU
    (:func:`usable_gpus`), else the CPU (lessons 01, 07, 10 and 11). A torch ``device``."""
    import torch

    return torch.device("cuda", 0) if usable_gpus() else torch.device("cpu")
