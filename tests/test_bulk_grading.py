"""The class grader (issue 33): six synthetic students, one CSV row each, right for every kind of submission; a
crash or a hang never stops the others."""
import csv
import shutil

import pytest

from mgpu_utils.env import REPO_ROOT
from mgpu_utils.grading.bulk import FIELDS, grade_class, main, summary, write_csv

EXERCISES = REPO_ROOT / "exercises"
FILE = "04_ring_all_gather.py"
SIGNATURE = "def ring_all_gather(x):\n"


def make_class(root):
    """Six students for exercise 04.4: each kind of submission an instructor meets."""
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
    assert by["dee_hang"]["hint"].startswith("stopped after 40 s") and by["dee_hang"]["seconds"] < 60
    assert by["eve_missing"]["hint"] == f"not submitted: no {FILE}" and by["eve_missing"]["seconds"] == 0.0
    assert "SyntaxError" in by["fay_syntax"]["hint"]
    out = tmp_path / "grades.csv"
    write_csv(rows, out)
    table = list(csv.DictReader(out.open()))
    assert tuple(table[0]) == FIELDS and [t["passed"] for t in table] == ["1", "0", "0", "0", "0", "0"]
    assert summary(rows).splitlines()[1].split() == ["04.4", "6", "5", "1"]


def test_command_line_and_bad_input(tmp_path, capsys, starts_processes):
    root = tmp_path / "class"
    (root / "ada").mkdir(parents=True)
    shutil.copy(EXERCISES / "solutions" / FILE, root / "ada" / FILE)
    assert main([str(root), "--out", str(tmp_path / "g.csv"), "--exercises", "04.4", "--world-sizes", "2"]) == 0
    printed = capsys.readouterr().out
    assert "ada" in printed and "passed" in printed and "1 rows in" in printed
    with pytest.raises(FileNotFoundError, match="one folder per student"):
        grade_class(tmp_path / "nope")
    with pytest.raises(KeyError):
        grade_class(root, ["99.9"])
