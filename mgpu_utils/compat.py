"""One place for the torch.distributed names that changed between PyTorch releases (lessons 04 and 05,
and the torch version check of every launch).

The course pins torch 2.14.1, but Colab (and many clusters) keep their own, older torch. Scripts and
helpers call these wrappers instead of the newest names, so the same code runs on both:

* ``all_gather_single`` (2.13 and newer) was ``all_gather_into_tensor`` (1.13 - 2.12; deprecated with a
  FutureWarning since);
* ``reduce_scatter_single`` (2.13 and newer) was ``reduce_scatter_tensor`` (the same releases);
* ``set_group_timeout``: ``dist.set_timeout`` where it exists, ``distributed_c10d._set_pg_timeout`` before.

The course runs on 2.10 and newer: the whole test suite and every notebook pass on 2.10.0 through these
wrappers (measured 2026-12-04, docs/testing.md). On 2.9.1 the library's pipeline schedules abort in gloo (a
message size mismatch), DTensor prints a partial placement as ``P`` and ``CommDebugMode`` also counts
plain ``dist.all_reduce`` calls (6 launches of tests/lessons/test_05_model_parallel.py fail). So
:func:`mgpu_utils.launch.launcher.launch` refuses a torch older than :data:`OLDEST_TORCH` with the fix; the
wrappers still let the collective scripts run on an older release when started by hand with torchrun.

Each wrapper looks the name up when it is called (not at import), so it follows whatever torch is
loaded. :data:`OLDEST_TORCH` is the oldest release the course supports (docs/gpu-and-cluster.md, "Colab").
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: The oldest torch release the course runs on: its tests and notebooks pass on 2.10.0, not on 2.9.1
#: (docs/testing.md, "The oldest PyTorch"; `make test-floor` keeps checking it).
OLDEST_TORCH = (2, 10)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the loaded torch, e.g. ``(2, 14)`` for ``"2.14.1+cu130"``."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_torch_version() -> None:
    """Raise ``RuntimeError`` naming the fix when the loaded torch is older than :data:`OLDEST_TORCH`."""
    if torch_version() < OLDEST_TORCH:
        raise RuntimeError(f"this course needs torch >= {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}, found "
                           f"{torch.__version__}: pip install 'torch>={OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}' "
                           f"(the course pins 2.14.1; see docs/gpu-and-cluster.md, 'Colab')")


def _pick(new: str, old: str):
    fn = getattr(dist, new, None) or getattr(dist, old, None)
    if fn is None:
        raise RuntimeError(f"torch.distributed has neither {new} nor {old} (torch {torch.__version__}); "
                           f"this course needs torch >= {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}")
    return fn


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group=None, async_op: bool = False):
    """All-gather into one tensor: ``output`` (``world_size * input.numel()`` elements, same dtype and
    device) receives every rank's ``input`` in rank order.

    ``dist.all_gather_single`` where it exists (torch >= 2.13), ``dist.all_gather_into_tensor`` before. Returns the
    work handle when ``async_op`` is true, else None. Raises what the collective raises (size mismatch:
    ``ValueError``/``RuntimeError`` from torch), and ``RuntimeError`` when torch has neither name.
    """
    return _pick("all_gather_single", "all_gather_into_tensor")(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group=None,
                          async_op: bool = False):
    """Reduce-scatter from one tensor: ``input`` (``world_size * output.numel()`` elements) is reduced
    with ``op`` over the ranks and rank r keeps chunk r in ``output``.

    ``dist.reduce_scatter_single`` where it exists (torch >= 2.13), ``dist.reduce_scatter_tensor`` before. Returns the
    work handle when ``async_op`` is true, else None; ``RuntimeError`` when torch has neither name.
    """
    return _pick("reduce_scatter_single", "reduce_scatter_tensor")(output, input, op=op, group=group,
                                                                   async_op=async_op)


def set_group_timeout(timeout, group=None) -> None:
    """Set the collective timeout (a ``datetime.timedelta``) of ``group`` (default: the default group), for
    every backend of the group (gloo and NCCL of a ``cpu:gloo,cuda:nccl`` group): what
    :func:`mgpu_utils.dist.device_mesh` uses, as ``init_device_mesh`` has no ``timeout`` argument.

    ``dist.set_timeout`` where it exists, torch's older ``distributed_c10d._set_pg_timeout`` before.
    Raises ``ValueError`` when this rank is not in ``group``."""
    from torch.distributed import distributed_c10d

    fn = getattr(dist, "set_timeout", None) or getattr(distributed_c10d, "_set_pg_timeout", None)
    if fn is None:
        raise RuntimeError(f"torch.distributed has neither set_timeout nor _set_pg_timeout (torch "
                           f"{torch.__version__}); this course needs torch >= {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]}")
    fn(timeout, group)
