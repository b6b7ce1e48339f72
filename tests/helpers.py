"""Helpers that several test files share (one definition each)."""
from pathlib import Path

import psutil


def alive(pids) -> list:
    """The processes among ``pids`` that still exist (a zombie counts as gone: it has ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def rank_pids(folder: Path) -> list:
    """The process ids the ranks of ``tests/scripts/misbehave.py`` wrote into ``folder`` (``rank*.pid``)."""
    return [int(f.read_text()) for f in Path(folder).glob("rank*.pid") if f.read_text()]
