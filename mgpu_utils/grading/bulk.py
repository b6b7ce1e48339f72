"""Grade a whole class: every student's workspace, every coding exercise of lessons 03-12, one CSV (for
instructors: docs/instructors.md).

    python -m mgpu_utils.grading.bulk SUBMISSIONS --out grades.csv [--exercises 04.4,04.5] [--timeout 300]

``SUBMISSIONS`` holds one folder per student, each with any subset of the exercise files, named as the templates in
``exercises/`` (``04_ring_all_gather.py``, ...): a copy of the student's ``workspace/`` folder. Each (student,
exercise) is graded by :func:`mgpu_utils.grading.runner.grade` in a process of its own, with a time limit: a
crash, a hang, an infinite loop, a syntax error or a missing file becomes that row's hint, and the next row runs.

Before it starts it prints how many files it will grade and about how long that takes (:func:`estimate_s`); a
student folder whose files sit in a nested ``workspace/`` is graded from there, with a warning. The CSV has one row
per student and exercise, sorted by student, then exercise: ``student, exercise, passed, hint, seconds``
(``passed`` is 1 or 0; ``hint`` the grader's hint, or what was checked when it passed); beside it
``<out>_totals.csv`` has one row per student (:func:`totals`: passed, submitted, of), best first. Both tables are
printed at the end: per student, and per exercise (submitted, passed).
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
#: Seconds one graded file takes per world size, for the estimate printed before a class is graded: a right 04.4 at
#: world size 2 took about 8 s on a 2-core CPU machine (tests/grading/test_bulk.py); the running estimate after each
#: row uses the rows' own times.
SECONDS_PER_WORLD_SIZE = 8.0
FIELDS = ("student", "exercise", "passed", "hint", "seconds")
TOTAL_FIELDS = ("student", "passed", "submitted", "of")


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


def submission_folder(student: Path, templates) -> tuple[Path, str]:
    """The folder that holds ``student``'s files: the folder itself, or a nested ``workspace/`` (a copy of the
    whole folder rather than its contents) when the files are only there. Returns ``(folder, warning)``, the
    warning empty unless the nested folder is used."""
    nested = student / "workspace"
    if not any((student / t).is_file() for t in templates) and any((nested / t).is_file() for t in templates):
        return nested, f"{student.name}: the files are in {student.name}/workspace/, graded from there"
    return student, ""


def estimate_s(count: int, world_sizes: tuple[int, ...]) -> float:
    """Seconds to grade ``count`` files at ``world_sizes`` (:data:`SECONDS_PER_WORLD_SIZE` each): a rough
    figure for planning; a file that fails stops at its first world size, one that hangs takes its timeout."""
    return count * len(world_sizes) * SECONDS_PER_WORLD_SIZE


def grade_class(folder, exercises=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                world_sizes: tuple[int, ...] | None = None, progress=None, say=print) -> list[dict]:
    """Grade every student folder in ``folder`` (sorted by name) on ``exercises`` (default: every graded one, in
    lesson order).

    Returns one row per student and exercise (:data:`FIELDS`), sorted by student, then exercise id.
    ``progress(row, done, todo, remaining_s)`` is called after each row (``remaining_s``: the rows' mean time so
    far times the files left); ``say(line)`` gets the warnings (a nested ``workspace/``) and the estimate, before
    anything is graded.

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
    exercises.sort(key=list(EXERCISES).index)                    # lesson order, whatever order they were given in
    templates = [exercise(e).template for e in exercises]
    students = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    work = []                                           # (student name, exercise id, path)
    for student in students:
        where, warning = submission_folder(student, templates)
        if warning:
            say(f"warning: {warning}")
        work += [(student.name, e, where / exercise(e).template) for e in exercises]
    todo = [w for w in work if w[2].is_file()]
    expected = sum(estimate_s(1, world_sizes or exercise(e).world_sizes) for _, e, _ in todo)
    say(f"{len(students)} students, {len(exercises)} exercises: {len(todo)} files to grade, about "
        f"{expected / 60:.0f} min ({SECONDS_PER_WORLD_SIZE:g} s per file and world size; at most "
        f"{timeout_s:g} s per file)")
    rows, spent, done = [], 0.0, 0
    for name, e, path in work:
        row = {"student": name, **grade_one(e, path, timeout_s, world_sizes)}
        rows.append(row)
        if path.is_file():
            done, spent = done + 1, spent + row["seconds"]
        if progress:
            progress(row, done, len(todo), spent / done * (len(todo) - done) if done else expected)
    return rows


def totals(rows: list[dict]) -> list[dict]:
    """One row per student (:data:`TOTAL_FIELDS`): exercises passed, submitted, and graded in all; the most
    passed first, then by name."""
    out = {}
    for r in rows:
        t = out.setdefault(r["student"], {"student": r["student"], "passed": 0, "submitted": 0, "of": 0})
        t["passed"] += bool(r["passed"])
        t["submitted"] += not r["hint"].startswith("not submitted")
        t["of"] += 1
    return sorted(out.values(), key=lambda t: (-t["passed"], t["student"]))


def write_grades(rows: list[dict], path) -> Path:
    """The rows as CSV at ``path`` (:data:`FIELDS`; passed as 1/0), and the per-student :func:`totals` beside it
    (``grades.csv`` -> ``grades_totals.csv``). Returns the totals' path."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: r[k] for k in FIELDS}, "passed": int(r["passed"])})
    total_path = path.with_name(f"{path.stem}_totals{path.suffix or '.csv'}")
    with open(total_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TOTAL_FIELDS)
        w.writeheader()
        w.writerows(totals(rows))
    return total_path


def student_summary(rows: list[dict]) -> str:
    """One line per student (:func:`totals`, the most passed first): passed, submitted, of."""
    lines = [f"{'student':<20} {'passed':>6} {'submitted':>9} {'of':>3}"]
    lines += [f"{t['student']:<20} {t['passed']:>6} {t['submitted']:>9} {t['of']:>3}" for t in totals(rows)]
    return "\n".join(lines)


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

    def progress(r, done, todo, remaining_s):
        print(f"{r['student']:<20} {r['exercise']:<6} {'passed' if r['passed'] else 'not yet'} "
              f"({r['seconds']:.0f} s; {done}/{todo} files, about {remaining_s / 60:.0f} min left)", flush=True)
    rows = grade_class(args.folder, [e for e in args.exercises.split(",") if e], args.timeout, sizes,
                       progress=progress, say=lambda line: print(line, flush=True))
    total_path = write_grades(rows, args.out)
    print(student_summary(rows))
    print(summary(rows))
    print(f"{len(rows)} rows in {args.out}, per-student totals in {total_path}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
