"""The class grader (issue 33): six synthetic students, one CSV row each, right for every kind of submission; a
crash or a hang never stops the others."""
import csv
import shutil

import pytest

from mgpu_utils.env import REPO_ROOT
from mgpu_utils.grading.bulk import FIELDS, grade_class, main, summary, write_grades

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


def test_six_students_one_row_each(tmp_path, starts_processes):
    rows = grade_class(make_class(tmp_path / "class"), ["04.4"], timeout_s=40, world_sizes=(2,))   # margin: a right one takes about 8 s here
    by = {r["student"]: r for r in rows}
    assert list(by) == ["ada_right", "bob_wrong", "cy_crash", "dee_hang", "eve_missing", "fay_syntax"]
    assert all(r["exercise"] == "04.4" for r in rows)
    assert [s for s, r in by.items() if r["passed"]] == ["ada_right"]
    assert "equal to dist.all_gather" in by["ada_right"]["hint"]
    assert "the entry for rank" in by["bob_wrong"]["hint"]
    assert "raised ValueError: boom" in by["cy_crash"]["hint"] and "line 3" in by["cy_crash"]["hint"]
    # margin: stopped at 40 s by construction; killing the process tree takes at most kill_tree's 3 s grace
    assert by["dee_hang"]["hint"].startswith("stopped after 40 s") and by["dee_hang"]["seconds"] < 60
    assert by["eve_missing"]["hint"] == f"not submitted: no {FILE}" and by["eve_missing"]["seconds"] == 0.0
    assert "SyntaxError" in by["fay_syntax"]["hint"]
    out = tmp_path / "grades.csv"
    write_grades(rows, out)
    table = list(csv.DictReader(out.open()))
    assert tuple(table[0]) == FIELDS and [t["passed"] for t in table] == ["1", "0", "0", "0", "0", "0"]
    assert summary(rows).splitlines()[1].split() == ["04.4", "6", "5", "1"]


def test_command_line_and_bad_input(tmp_path, capsys, starts_processes):
    root = tmp_path / "class"
    (root / "ada").mkdir(parents=True)
    make_class(tmp_path / "unused")                    # skips in a class copy, as above
    shutil.copy(EXERCISES / "solutions" / FILE, root / "ada" / FILE)
    assert main([str(root), "--out", str(tmp_path / "g.csv"), "--exercises", "04.4", "--world-sizes", "2"]) == 0
    printed = capsys.readouterr().out
    assert "ada" in printed and "passed" in printed and "1 rows in" in printed
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
