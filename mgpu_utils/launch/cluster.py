"""What a launch script needs on a cluster: a folder every rank sees, and a clean stop before the time limit
(lesson 12; cluster/slurm/job.sbatch).

On one machine every rank sees the same files. Across nodes a folder is shared only on shared storage
(NFS, Lustre, GPFS, a home directory mounted everywhere); node-local paths such as ``/tmp`` differ per node,
and a script whose ranks read rank 0's files would then read nothing, or stale files, and diverge.
:func:`shared_folder` checks it at start and names the rank that cannot see rank 0's marker.

Slurm ends a job at its time limit. ``job.sbatch`` asks for a signal shortly before (``--signal``) and then
creates ``STOP`` in the job's checkpoint folder; a script that calls :func:`stop_requested` after each step
stops on every rank after the same step, saves a snapshot and calls :func:`mark_stopped`; the job then
requeues itself and its next run resumes from the snapshot.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

#: Created by job.sbatch when Slurm's time-limit signal arrives: "save a snapshot and stop".
STOP = "STOP"
#: Created by rank 0 when the script did stop at a snapshot: job.sbatch requeues the job only then.
STOPPED = "STOPPED"


def shared_folder(folder, rank: int, world_size: int) -> Path:
    """Create ``folder`` on rank 0 and check that every rank sees it as rank 0 wrote it (call on every rank,
    after ``init_process_group``; lesson 12: checkpoints, traces).

    Rank 0 writes a marker file with a fresh token and broadcasts the token; every rank reads the marker.

    Returns:
        ``folder`` as a :class:`~pathlib.Path`.

    Raises:
        RuntimeError: on each rank that does not see rank 0's marker (a node-local folder on a multi-node
            job), naming the rank, its host and the fix: a folder on shared storage.
    """
    import torch.distributed as dist

    folder = Path(folder)
    marker = folder / ".mgpu-shared"
    token = [uuid.uuid4().hex]
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(token[0])
    if world_size > 1 and dist.is_initialized():
        dist.broadcast_object_list(token, src=0)
    try:
        seen = marker.read_text()
    except OSError:
        seen = None
    mine, ok = seen == token[0], [True]
    if world_size > 1 and dist.is_initialized():
        ok = [None] * world_size
        dist.all_gather_object(ok, mine)
    if not mine:
        raise RuntimeError(f"rank {rank} on {socket.gethostname()} does not see {folder} as rank 0 wrote it "
                           f"({'no marker file' if seen is None else 'another marker'}): the ranks need one "
                           "folder on storage every node shares (NFS, Lustre, a shared home), not a node-local "
                           "path such as /tmp; on Slurm set CKPT_ROOT for job.sbatch")
    if not all(ok):
        raise RuntimeError(f"ranks {[r for r, good in enumerate(ok) if not good]} do not see {folder} as rank 0 "
                           "wrote it: use a folder on shared storage (their own errors name their hosts)")
    return folder


def stop_requested(folder) -> bool:
    """True on every rank once rank 0 sees ``folder/STOP`` (job.sbatch creates it on Slurm's signal before the
    time limit): call it on every rank after each step, so that all ranks stop after the same step.

    One broadcast of a one-element CPU tensor (gloo; beside NCCL too, with the course's process group).
    """
    import torch
    import torch.distributed as dist

    flag = torch.tensor([float((Path(folder) / STOP).exists())])
    if dist.is_initialized():
        dist.broadcast(flag, src=0)
    return bool(flag.item())


def mark_stopped(folder, rank: int) -> None:
    """Rank 0 writes ``folder/STOPPED``: the script stopped at a snapshot, and job.sbatch may requeue the job."""
    if rank == 0:
        (Path(folder) / STOPPED).touch()
