"""The launch machinery's process handling: a launch script's path, the ranks' environment, and
stopping a process tree with nothing left behind (every launch of lessons 00-12).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from mgpu_utils.env import REPO_ROOT, SCRIPTS_DIR
from mgpu_utils.text import wrap_text
from mgpu_utils.timing import usable_cores

def resolve_script(script) -> Path:
    """Return the path of ``script``: as given, or by file name inside ``launch_scripts/``.

    Raises:
        FileNotFoundError: with the list of available launch scripts.
    """
    p = Path(script)
    for cand in (p, SCRIPTS_DIR / p, SCRIPTS_DIR / p.name):
        if cand.is_file():
            return cand.resolve()
    avail = ", ".join(sorted(x.name for x in SCRIPTS_DIR.glob("*.py"))) or "none"
    raise FileNotFoundError(wrap_text(f"launch script {str(script)!r} not found (looked in the current directory "
                                      f"and in launch_scripts/ of the repository).", first=len("FileNotFoundError: "))
                            + "\n" + wrap_text(f"  Available: {avail}"))


def kill_tree(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM torchrun and all its descendants, then SIGKILL whatever is left after ``grace_s``."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def pythonpath(env: dict) -> str:
    """``PYTHONPATH`` for the ranks: the repository first (``import mgpu_utils`` works without installing)."""
    return os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])


def rank_environment(env: dict | None, ranks: int, threads_per_rank: int | None = None) -> dict:
    """The environment of the processes of a job of ``ranks`` ranks on this machine.

    This process's environment, updated with ``env`` (values made ``str``); the repository first on
    ``PYTHONPATH`` (``import mgpu_utils`` works without installing), unbuffered output, and
    ``OMP_NUM_THREADS``: ``threads_per_rank``, else ``$OMP_NUM_THREADS`` if set, else the CPU cores this
    process may use (:func:`mgpu_utils.timing.usable_cores`) shared out, at least 1 per rank.
    """
    child = dict(os.environ)
    child.update({k: str(v) for k, v in (env or {}).items()})
    child["PYTHONPATH"] = pythonpath(child)
    child["PYTHONUNBUFFERED"] = "1"
    if threads_per_rank or "OMP_NUM_THREADS" not in child:
        child["OMP_NUM_THREADS"] = str(threads_per_rank or max(1, usable_cores() // ranks))
    return child


def process_tree(pid: int) -> list:
    """``psutil.Process`` objects of ``pid`` and all its descendants (empty if it is gone)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_all(procs: list, timeout_s: float = 5.0) -> None:
    """SIGKILL every process of ``procs`` (``psutil.Process``) and wait up to ``timeout_s`` for them."""
    import psutil

    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)
