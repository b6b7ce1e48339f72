"""Helpers that several test files share (one definition each)."""
import re
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


HEADING = re.compile(r"^(#{1,6})\s+(.*)")


def heading_level(cell) -> int | None:
    """The level of the heading a markdown cell opens with (1 for '#'), or None."""
    if cell["cell_type"] != "markdown":
        return None
    m = HEADING.match("".join(cell["source"]).lstrip())
    return len(m.group(1)) if m else None


def core_and_deeper(cells: list[dict]) -> tuple[list[int], list[int]]:
    """Indices of the core path's cells and of the deeper sections' cells."""
    core, deeper, _ = _walk_deeper(cells)
    return core, deeper


def hidden_on_opening(cells: list[dict]) -> list[int]:
    """The cells JupyterLab hides when the notebook opens: every cell of a deeper section but the heading that
    opens it (a deeper heading inside another deeper section is hidden with it)."""
    _, deeper, outer = _walk_deeper(cells)
    return [i for i in deeper if i not in outer]


def _walk_deeper(cells):
    core, deeper, outer, inside = [], [], [], None      # inside: the level of the deeper heading we are under
    for i, cell in enumerate(cells):
        level = heading_level(cell)
        if inside is not None and level is not None and level <= inside:
            inside = None
        if inside is None and "deeper" in cell.get("metadata", {}).get("tags", []):
            inside = level if level is not None else 99
            outer.append(i)
        (deeper if inside is not None else core).append(i)
    return core, deeper, outer


#: The worked solutions of the coding exercises (not in a class copy).
SOLUTIONS = Path(__file__).resolve().parents[1] / "exercises" / "solutions"


def solution(exercise_id):
    """The worked solution's path; the test says SKIPPED in a class copy, which has none (make class-copy)."""
    import pytest

    from mgpu_utils.grading.catalog import EXERCISES

    if not SOLUTIONS.is_dir():
        pytest.skip("exercises/solutions/ is not in this copy of the course (make class-copy leaves it out)")
    return SOLUTIONS / EXERCISES[exercise_id].template


def solution_module(exercise_id):
    """The worked solution imported as a module (SKIPPED in a class copy, as :func:`solution`): the tests that
    check a library function against the exercise that asks for it (lessons 05 and 08) call its entry."""
    import importlib.util

    path = solution(exercise_id)
    spec = importlib.util.spec_from_file_location(f"solution_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wrong(tmp_path, exercise_id, old, new):
    """The worked solution with ``old`` replaced by ``new`` (strings, or lists of them), as a file in tmp_path."""
    from mgpu_utils.grading.catalog import EXERCISES

    text = solution(exercise_id).read_text()
    for o, n in zip(*((old, new) if isinstance(old, list) else ([old], [new]))):
        assert o in text, o
        text = text.replace(o, n)
    path = tmp_path / f"wrong_{EXERCISES[exercise_id].template}"
    path.write_text(text)
    return path


RED_TEAM = Path(__file__).parent / "grading" / "red_team"


def red_team(name: str) -> str:
    """The text of a red team's solution kept in tests/grading/red_team/ (``name`` without .py): wrong, or right
    where its name has r and a digit after the round (037_r8r03)."""
    return (RED_TEAM / f"{name}.py").read_text()


def remove_red_team_shm() -> None:
    """Remove what the red teams' files left in /dev/shm and /tmp (their segments and files are named mgpu_red_*)."""
    for folder in ("/dev/shm", "/tmp"):
        for f in Path(folder).glob("mgpu_red_*"):
            f.unlink(missing_ok=True)
