"""How often to snapshot a training job (notebooks/12_fault_tolerance.ipynb).

A job that writes a snapshot every ``tau`` seconds of training, each costing ``C`` seconds, on a
cluster whose mean time between failures is ``M`` seconds, loses two things (first-order model,
Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006,
"A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3)):

* the snapshots themselves: ``C / tau`` of the time;
* the work since the last snapshot when a failure strikes: on average ``tau / 2`` per failure, one
  failure every ``M`` seconds, so ``tau / (2 M)`` of the time.

Their sum, ``C / tau + tau / (2 M)``, is smallest at ``tau* = sqrt(2 C M)`` (Young's interval,
:func:`young_interval`), where both terms are equal and the overhead is ``sqrt(2 C / M)``. The model
holds when ``C << tau << M``; the restart time ``R`` (requeue, start-up, loading the snapshot) adds
``R / M`` whatever ``tau`` is, which at scale is often the largest part.

Daly's model (:func:`daly_lost_fraction`) drops the first-order assumptions: failures arrive as a Poisson
process and may strike during a snapshot or a restart too, so the expected wall-clock time per second of
useful work is ``M e^(R/M) (e^((tau + C)/M) - 1) / tau``; its optimum is close to
:func:`daly_interval` (Daly 2006, eq. 37), a little shorter than Young's when ``C`` is not ``<< M``.
"""

from __future__ import annotations

import math


def _positive(**values) -> None:
    for name, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ValueError(f"{name} must be a number > 0 (seconds), got {v!r}")


def young_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's optimal snapshot interval ``sqrt(2 C M)``, in seconds of training between snapshots.

    Args:
        checkpoint_s: C, the time one snapshot costs the job (seconds, > 0).
        mtbf_s: M, the job's mean time between failures (seconds, > 0); for n GPUs that each fail
            independently every m seconds on average, M = m / n.

    Raises:
        ValueError: a value that is not a positive number.
    """
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimal snapshot interval (Daly 2006, eq. 37), in seconds of training between
    snapshots: ``sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` for ``C < 2M``, else ``M``.
    It minimises :func:`daly_lost_fraction` to within about 1% while ``C < M / 10``; the restart time
    does not move the optimum (it multiplies the wall time by ``e^(R/M)``).

    Args, Raises: as :func:`young_interval`.
    """
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if checkpoint_s >= 2 * mtbf_s:
        return float(mtbf_s)
    x = checkpoint_s / (2 * mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def daly_lost_fraction(interval_s, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0):
    """Expected share of the wall-clock time lost in Daly's model (Poisson failures that can also strike
    during a snapshot or a restart): ``1 - tau / (M e^(R/M) (e^((tau + C)/M) - 1))``.

    Args: as :func:`lost_fraction` (``interval_s`` a number or a numpy array).

    Returns:
        The fraction, same shape as ``interval_s``; for ``C, tau, R << M`` it approaches
        :func:`lost_fraction`'s first-order ``C / tau + tau / (2 M) + R / M``.

    Raises:
        ValueError: checkpoint_s or mtbf_s not positive, or restart_s negative.
    """
    import numpy as np

    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if restart_s < 0:
        raise ValueError(f"restart_s must be >= 0 seconds, got {restart_s!r}")
    tau = np.asarray(interval_s, dtype=float)
    wall = mtbf_s * np.exp(restart_s / mtbf_s) * np.expm1((tau + checkpoint_s) / mtbf_s) / tau
    out = 1 - 1 / wall
    return float(out) if out.ndim == 0 else out


def lost_fraction(interval_s, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0):
    """Expected share of the time lost: ``C / tau + tau / (2 M) + R / M``.

    Args:
        interval_s: tau, seconds of training between snapshots (a number or a numpy array, > 0).
        checkpoint_s: C, seconds one snapshot costs; mtbf_s: M, mean time between failures (seconds).
        restart_s: R, seconds from a failure to training again (restart, load), default 0.

    Returns:
        The fraction (0.1 = 10% of the wall-clock time), same shape as ``interval_s``.

    Raises:
        ValueError: checkpoint_s or mtbf_s not positive, or restart_s negative.
    """
    _positive(checkpoint_s=checkpoint_s, mtbf_s=mtbf_s)
    if restart_s < 0:
        raise ValueError(f"restart_s must be >= 0 seconds, got {restart_s!r}")
    return checkpoint_s / interval_s + interval_s / (2 * mtbf_s) + restart_s / mtbf_s


def job_mtbf_s(gpu_mtbf_hours: float, n_gpus: int) -> float:
    """The mean time between failures of a job on ``n_gpus`` GPUs, in seconds, when each GPU (with its
    share of host, network and power) fails independently every ``gpu_mtbf_hours`` on average: any
    one failure stops a synchronous job, so the job's MTBF is the GPU's divided by n.

    Raises:
        ValueError: a non-positive MTBF or GPU count.
    """
    _positive(gpu_mtbf_hours=gpu_mtbf_hours, n_gpus=n_gpus)
    return gpu_mtbf_hours * 3600 / n_gpus
