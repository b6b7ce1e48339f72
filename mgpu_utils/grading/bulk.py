"""Grade a whole class: every student's workspace, every coding exercise of lessons 03-12, one CSV (for
instructors: docs/instructors.md).

    python -m mgpu_utils.grading.bulk SUBMISSIONS --out grades.csv [--exercises 04.4,04.5] [--timeout 300]

``SUBMISSIONS`` holds one folder per student, each with any subset of the exercise files, named as the templates in
``exercises/`` (``04_ring_all_gather.py``, ...): a copy of the student's ``workspace/`` folder. Each (student,
exercise) is graded by :func:`mgpu_utils.grading.runner.grade` in a process of its own, with a time limit: a
crash, a hang, an infinite loop, a syntax error or a missing file becomes that row's hint, and the next row runs.

The CSV has one row per student and exercise: ``student, exercise, passed, hint, seconds`` (``passed`` is 1 or 0;
``hint`` the grader's hint, or what was checked when it passed). A summary table, one line per exercise (submitted,
passed), is printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

#: Seconds one (student, exercise) may take in all, at every world size, before it is stopped.
DEFAULT_TIMEOUT_S = 300.0
FIELDS = ("student", "exercise", "passed", "hint", "seconds")


def grade_one(exercise_id: str, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S,
              world_sizes: tuple[int, ...] | None = None) -> dict:
    """Grade one file in a child process (``python -m mgpu_utils.grading.bulk --one``) with a time limit.

    Returns:
        ``{"exercise", "passed" (bool), "hint" (str), "seconds" (float)}``; a missing file, a time limit passed
        or a grader that could not run are rows too, with their hint.
    """
    from mgpu_utils.grading.catalog import exercise
    from mgpu_utils.launch.processes import kill_tree

    t0 = time.perf_counter()
    row = {"exercise": exercise_id, "passed": False, "hint": "", "seconds": 0.0}
    if not path.is_file():
        row["hint"] = f"not submitted: no {exercise(exercise_id).template}"
        return row
    cmd = [sys.executable, "-m", "mgpu_utils.grading.bulk", "--one", exercise_id, str(path.resolve())]
    if world_sizes:
        cmd += ["--world-sizes", ",".join(map(str, world_sizes))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        got = json.loads(lines[-1]) if lines else {"passed": False,
                                                    "hint": f"the grader did not finish: {err.strip()[-300:]}"}
        row.update(passed=bool(got["passed"]), hint=got["hint"])
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        proc.communicate()
        row["hint"] = (f"stopped after {timeout_s:g} s: the code runs too long or waits forever (a loop that never "
                       f"ends, a receive nobody sends)")
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def grade_class(folder, exercises=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                world_sizes: tuple[int, ...] | None = None, progress=None) -> list[dict]:
    """Grade every student folder in ``folder`` (sorted by name) on ``exercises`` (default: every graded one).

    Returns one row per student and exercise (:data:`FIELDS`). ``progress(row)`` is called after each row.

    Raises:
        FileNotFoundError: ``folder`` is not a folder. KeyError: an unknown exercise id (the message lists them).
    """
    from mgpu_utils.grading.catalog import EXERCISES, exercise

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: give the folder that holds one folder per student")
    exercises = list(exercises or EXERCISES)
    for e in exercises:
        exercise(e)
    rows = []
    for student in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for e in exercises:
            row = {"student": student.name, **grade_one(e, student / exercise(e).template, timeout_s, world_sizes)}
            rows.append(row)
            if progress:
                progress(row)
    return rows


def write_grades(rows: list[dict], path) -> None:
    """The rows as CSV (:data:`FIELDS`; passed as 1/0)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: r[k] for k in FIELDS}, "passed": int(r["passed"])})


def summary(rows: list[dict]) -> str:
    """One line per exercise: students, submitted (a file was there), passed."""
    lines = [f"{'exercise':<9} {'students':>8} {'submitted':>9} {'passed':>6}"]
    for e in dict.fromkeys(r["exercise"] for r in rows):
        mine = [r for r in rows if r["exercise"] == e]
        sub = sum(not r["hint"].startswith("not submitted") for r in mine)
        lines.append(f"{e:<9} {len(mine):>8} {sub:>9} {sum(r['passed'] for r in mine):>6}")
    return "\n".join(lines)


def _one(exercise_id: str, path: str, world_sizes) -> None:
    """The child: grade, print one JSON line."""
    import contextlib
    import io

    from mgpu_utils.grading.runner import grade

    with contextlib.redirect_stdout(io.StringIO()):
        passed, hint = grade(exercise_id, path, world_sizes=world_sizes)
    print(json.dumps({"passed": passed, "hint": hint}), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", help="one folder per student")
    p.add_argument("--out", default="grades.csv", help="the CSV to write")
    p.add_argument("--exercises", default="", help="comma-separated ids (default: every graded exercise)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per student and exercise")
    p.add_argument("--world-sizes", default="", help="grade at these world sizes (default: each exercise's)")
    p.add_argument("--one", nargs=2, metavar=("EXERCISE", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = tuple(int(w) for w in args.world_sizes.split(",") if w) or None
    if args.one:
        _one(*args.one, sizes)
        return 0
    if not args.folder:
        p.error("give the folder of student workspaces")
    t0 = time.perf_counter()
    rows = grade_class(args.folder, [e for e in args.exercises.split(",") if e], args.timeout, sizes,
                       progress=lambda r: print(f"{r['student']:<20} {r['exercise']:<6} "
                                                f"{'passed' if r['passed'] else 'not yet'} ({r['seconds']:.0f} s)",
                                                flush=True))
    write_grades(rows, args.out)
    print(summary(rows))
    print(f"{len(rows)} rows in {args.out}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
