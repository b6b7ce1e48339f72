"""The class grader (issue 33): six synthetic students, one CSV row each, right for every kind of submission; a
crash or a hang never stops the others."""
import csv
import shutil

import pytest

from mgpu_utils.env import REPO_ROOT
from mgpu_utils.grading.bulk import (FIELDS, TOTAL_FIELDS, estimate_s, grade_class, main, student_summary, summary,
                                     submission_folder, totals, write_grades)

EXERCISES = REPO_ROOT / "exercises"
FILE = "04_ring_all_gather.py"
SIGNATURE = "def ring_all_gather(x):\n"


def make_class(root):
    """Six students for exercise 04.4: each kind of submission an instructor meets."""
    if not (EXERCISES / "solutions").is_dir():
        pytest.skip("exercises/solutions/ is not in this copy of the course (make class-copy leaves it out)")
    kinds = {
        "ada_right": (EXERCISES / "solutions" / FILE).read_text(),
        "bob_wrong": (EXERCISES / FILE).read_text(),                       # the template, TODOs left as they are
        "cy_crash": "import torch.distributed as dist\n" + SIGNATURE + "    raise ValueError('boom')\n",
        "dee_hang": "import time\n" + SIGNATURE + "    while True:\n        time.sleep(1)\n",
        "eve_missing": None,
        "fay_syntax": SIGNATURE + "    return [x for x in\n",
    }
    for student, text in kinds.items():
        (root / student).mkdir(parents=True)
        if text is not None:
            (root / student / FILE).write_text(text)
    return root


#: The hanging student's limit: a hang is stopped at whatever limit it is given, so a short one shows the same; the
#: others keep the class's 40 s (margin: a right one takes about 8 s here, more with a core busy).
HANG_LIMIT_S = 5


def test_six_students_one_row_each(tmp_path, monkeypatch, starts_processes):
    import mgpu_utils.grading.bulk as bulk

    real, limits = bulk.grade_one, []

    def grade_one(exercise_id, path, timeout_s, world_sizes):      # as grade_class calls it
        limits.append(timeout_s)
        return real(exercise_id, path, HANG_LIMIT_S if path.parent.name == "dee_hang" else timeout_s, world_sizes)

    monkeypatch.setattr(bulk, "grade_one", grade_one)
    rows = grade_class(make_class(tmp_path / "class"), ["04.4"], timeout_s=40, world_sizes=(2,))
    assert limits == [40] * 6, "every file gets the class's limit"
    by = {r["student"]: r for r in rows}
    assert list(by) == ["ada_right", "bob_wrong", "cy_crash", "dee_hang", "eve_missing", "fay_syntax"]
    assert all(r["exercise"] == "04.4" for r in rows)
    assert [s for s, r in by.items() if r["passed"]] == ["ada_right"], {s: (r["hint"][:150], r["seconds"])
                                                                        for s, r in by.items()}
    assert "equal to dist.all_gather" in by["ada_right"]["hint"]
    assert "the entry for rank" in by["bob_wrong"]["hint"]
    assert "raised ValueError: boom" in by["cy_crash"]["hint"] and "line 3" in by["cy_crash"]["hint"]
    # margin: stopped at HANG_LIMIT_S by construction; killing the process tree takes at most kill_tree's 3 s grace
    assert by["dee_hang"]["hint"].startswith(f"stopped after {HANG_LIMIT_S} s") and by["dee_hang"]["seconds"] < 20
    assert by["eve_missing"]["hint"] == f"not submitted: no {FILE}" and by["eve_missing"]["seconds"] == 0.0
    assert "SyntaxError" in by["fay_syntax"]["hint"]
    out = tmp_path / "grades.csv"
    write_grades(rows, out)
    table = list(csv.DictReader(out.open()))
    assert tuple(table[0]) == FIELDS and [t["passed"] for t in table] == ["1", "0", "0", "0", "0", "0"]
    assert summary(rows).splitlines()[1].split() == ["04.4", "6", "5", "1"]
    per_student = list(csv.DictReader((tmp_path / "grades_totals.csv").open()))
    assert tuple(per_student[0]) == TOTAL_FIELDS
    assert [(t["student"], t["passed"], t["submitted"]) for t in per_student][:2] == [("ada_right", "1", "1"),
                                                                                     ("bob_wrong", "0", "1")]
    assert ("eve_missing", "0", "0") in [(t["student"], t["passed"], t["submitted"]) for t in per_student]


def test_totals_sort_and_a_nested_workspace_is_found(tmp_path):
    """Per-student totals, the most passed first; rows by student, then exercise in lesson order (not as given);
    a student who handed in the whole workspace/ folder is graded from it, with a warning, not "not submitted"."""
    rows = [{"student": s, "exercise": e, "passed": p, "hint": h, "seconds": 1.0} for s, e, p, h in [
        ("zoe", "04.4", True, "ok"), ("zoe", "03.4", True, "ok"), ("al", "03.4", False, "not submitted: no f"),
        ("al", "04.4", True, "ok"), ("bo", "03.4", False, "wrong"), ("bo", "04.4", False, "wrong")]]
    assert [(t["student"], t["passed"], t["submitted"], t["of"]) for t in totals(rows)] == [
        ("zoe", 2, 2, 2), ("al", 1, 1, 2), ("bo", 0, 2, 2)]
    assert student_summary(rows).splitlines()[1].split() == ["zoe", "2", "2", "2"]
    nested = tmp_path / "class" / "cy" / "workspace"
    nested.mkdir(parents=True)
    (nested / FILE).write_text(SIGNATURE)
    (tmp_path / "class" / "dee").mkdir()
    assert submission_folder(tmp_path / "class" / "cy", [FILE]) == (nested, "cy: the files are in cy/workspace/, "
                                                                             "graded from there")
    assert submission_folder(tmp_path / "class" / "dee", [FILE]) == (tmp_path / "class" / "dee", "")
    said = []
    with pytest.raises(KeyError):                       # checked before anything is graded or said
        grade_class(tmp_path / "class", ["04.4", "99.9"], say=said.append)
    with pytest.raises(KeyError, match="known: 03.4"):
        grade_class(tmp_path / "class", ["ring"], say=said.append)
    assert said == []
    assert estimate_s(30, (2, 3)) == 60 * estimate_s(1, (2,)) > 0


def test_command_line_and_bad_input(tmp_path, capsys, starts_processes):
    """The command line: the estimate first, then a line per row with the time left, then both tables; exercises
    asked in any order come back in lesson order; ada handed in her whole workspace/ folder: graded from it."""
    root = tmp_path / "class"
    (root / "ada" / "workspace").mkdir(parents=True)
    make_class(tmp_path / "unused")                    # skips in a class copy, as above
    shutil.copy(EXERCISES / "solutions" / FILE, root / "ada" / "workspace" / FILE)
    assert main([str(root), "--out", str(tmp_path / "g.csv"), "--exercises", "04.4,03.4", "--world-sizes", "2"]) == 0
    printed = capsys.readouterr().out
    assert "warning: ada: the files are in ada/workspace/, graded from there" in printed
    assert printed.index("1 students, 2 exercises: 1 files to grade, about") < printed.index("1/1 files")
    assert "2 rows in" in printed and "g_totals.csv" in printed
    rows = list(csv.DictReader((tmp_path / "g.csv").open()))
    assert [(r["exercise"], r["passed"]) for r in rows] == [("03.4", "0"), ("04.4", "1")]
    assert [ln.split() for ln in printed.splitlines() if ln.startswith("ada ")][-1] == ["ada", "1", "1", "2"]
    with pytest.raises(FileNotFoundError, match="one folder per student"):
        grade_class(tmp_path / "nope")
    with pytest.raises(KeyError):
        grade_class(root, ["99.9"])


def test_a_class_copy_has_no_solutions_and_still_grades(tmp_path, starts_processes):
    """make class-copy: the course without exercises/solutions/; the grader there passes a right answer (it compares
    with PyTorch, not with the worked solution)."""
    import subprocess
    import sys

    if subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git clone: make class-copy copies the last commit")
    right = make_class(tmp_path / "class") / "ada_right" / FILE
    dest = tmp_path / "students"
    r = subprocess.run(["make", "-s", "class-copy", f"DEST={dest}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (dest / "exercises" / FILE).is_file() and not (dest / "exercises" / "solutions").exists()
    code = ("from mgpu_utils.grading.runner import grade; import sys\n"
            "print(grade('04.4', sys.argv[1], world_sizes=(2,)))")
    r = subprocess.run([sys.executable, "-c", code, str(right)], cwd=dest, env={"PATH": "/usr/bin:/bin",
                       "PYTHONPATH": str(dest), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.startswith("(True,"), r.stdout + r.stderr
    r = subprocess.run(["make", "-s", "class-copy", f"DEST={dest}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "not empty" in r.stdout
