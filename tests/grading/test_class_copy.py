"""The class copy (mgpu_utils.grading.class_copy, issue 56 item 3): built as make class-copy builds it, from the
files git tracks in the working tree (so it holds what the next commit would), it shows no line of a worked
solution and names exercises/solutions/ only where it says whose they are; a leak planted in a copy, renamed and
reflowed, is found wherever it sits. This file is left out of a class copy itself (tests/grading/), and it reads
the worked solutions at run time: it holds none of their lines."""
import json

import pytest

from helpers import SOLUTIONS
from mgpu_utils.grading.class_copy import LEFT_OUT, build, check_copy, logical_lines, own_shingles, solution_shingles
from mgpu_utils.grading.catalog import EXERCISES
from mgpu_utils.env import REPO_ROOT


def _needs_solutions():
    if not SOLUTIONS.is_dir():
        pytest.skip("exercises/solutions/ is not in this copy of the course (make class-copy leaves it out)")


def test_the_class_copy_shows_no_worked_answer(tmp_path, starts_processes):
    """make class-copy's copy (here of the working tree: git ls-files) leaves out LEFT_OUT and shows nothing."""
    _needs_solutions()
    dest = tmp_path / "students"
    build(REPO_ROOT, dest, from_commit=False)
    assert not [p for p in LEFT_OUT if (dest / p).exists()]
    assert all((dest / "exercises" / e.template).is_file() for e in EXERCISES.values())
    findings = check_copy(dest, REPO_ROOT)
    assert findings == [], "the class copy shows worked answers:\n" + "\n".join(map(str, findings))
    with pytest.raises(FileExistsError, match="is not empty: give a new folder"):
        build(REPO_ROOT, dest, from_commit=False)


def test_every_worked_solution_has_lines_of_its_own_to_look_for():
    """Only 04.6 has none: its fix deletes the rank-0 branch, so the solution adds no line its template lacks."""
    _needs_solutions()
    empty = sorted(name for name, found in solution_shingles(REPO_ROOT).items() if not found)
    assert empty == ["04_fix_the_hang.py"]
    assert {e.template for e in EXERCISES.values()} == {p.name for p in SOLUTIONS.glob("*.py")}


def _renamed_and_reflowed(text: str) -> str:
    """The solution as a student might paste it elsewhere: other names, a comment changed, one call reflowed."""
    for old, new in (("lse1", "a_lse"), ("lse2", "b_lse"), ("out1", "a_out"), ("out2", "b_out"), ("big", "m"),
                     ("# ", "# note: ")):
        text = text.replace(old, new)
    return text.replace("torch.log(", "torch.log(\n        ")


def test_a_planted_leak_is_found_wherever_it_sits(tmp_path):
    """The 08.3 solution, renamed and reflowed, in a module, in a string (as a test's table holds one), in a
    notebook's cell and in a stored output, is found in each; a merge written another way and a sentence that
    says whose the solutions are are not findings; a mention that does not say so is."""
    _needs_solutions()
    planted = _renamed_and_reflowed((SOLUTIONS / "08_merge_attention.py").read_text())
    copy = tmp_path / "copy"
    (copy / "mgpu_utils").mkdir(parents=True)
    (copy / "benchmarks").mkdir()
    (copy / "notebooks").mkdir()
    (copy / "mgpu_utils" / "attention.py").write_text(planted)
    (copy / "benchmarks" / "variants.py").write_text(f"BODY = {planted!r}\n")   # as a test table keeps it
    cells = [{"cell_type": "code", "source": [planted], "outputs": [], "metadata": {}},
             {"cell_type": "code", "source": ["show_code(merge)"], "metadata": {}, "outputs": [
                 {"output_type": "display_data", "data": {"text/markdown": [f"```python\n{planted}```"]}}]},
             {"cell_type": "markdown", "source": ["Worked solution: `exercises/solutions/08_merge_attention.py`."]},
             {"cell_type": "markdown", "source": ["Worked solutions: `exercises/solutions/`, the instructor's."]}]
    (copy / "notebooks" / "99_x.ipynb").write_text(json.dumps({"cells": cells}))
    (copy / "mgpu_utils" / "other.py").write_text(   # the same merge, another formulation: not the solution
        "import torch\n\ndef merge(out1, lse1, out2, lse2):\n"
        "    out = torch.lerp(out2, out1, torch.sigmoid(lse1 - lse2).unsqueeze(-1))\n"
        "    return out, torch.logaddexp(lse1, lse2)\n")
    found = [str(f) for f in check_copy(copy, REPO_ROOT)]
    for where in ("mgpu_utils/attention.py line", "benchmarks/variants.py (its strings) line",
                  "notebooks/99_x.ipynb cell 0 line", "notebooks/99_x.ipynb cell 1 output 0 line"):
        assert any(f.startswith(where) and "08_merge_attention.py" in f for f in found), (where, found)
    assert [f for f in found if "points at" in f] == [
        "notebooks/99_x.ipynb cell 2 line 1: points at the worked solutions: "
        "Worked solution: `exercises/solutions/08_merge_attention.py`."]
    assert not [f for f in found if "other.py" in f]
    (copy / "exercises" / "solutions").mkdir(parents=True)
    assert "exercises/solutions: a class copy leaves this folder out" in [str(f) for f in check_copy(copy, REPO_ROOT)]


def test_lines_are_compared_without_names_comments_and_docstrings():
    lines = logical_lines('"""doc."""\nx = f(a,\n      b)   # c\ny = x.sum()\n')
    assert [line.lineno for line in lines] == [2, 4]
    given = "def f(a):\n    return a\n"
    solution = "def f(a):\n    t = a.cumsum(0)\n    u = t.flip(0) * 2\n    return u\n"
    renamed = "def g(b):\n    s = b.cumsum(0)  # mine\n    w = s.flip(\n        0) * 2\n    return w\n"
    assert own_shingles(solution, given) and own_shingles(solution, given) == own_shingles(renamed, given)
    assert not own_shingles(solution, given) & own_shingles(renamed.replace("* 2", "* 3"), given)
