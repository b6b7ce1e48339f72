"""`make course` (mgpu_utils.course): executes notebooks, writes build files, exits non-zero on failure; `make
slides` (slide decks from the stored lessons)."""
import html

import nbformat
import pytest

from mgpu_utils import course
from mgpu_utils.env import REPO_ROOT


def _nb(path, code):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_course_runs_notebooks_and_reports_failures(tmp_path, capfd, starts_processes):
    src = tmp_path / "nbs"
    src.mkdir()
    _nb(src / "01_ok.ipynb", ["x = 6 * 7", "print(x)"])
    _nb(src / "02_bad.ipynb", ["raise ValueError('broken lesson')"])
    out = tmp_path / "build"
    assert course.main(["--out", str(out), str(src)]) == 1
    captured = capfd.readouterr()                      # file descriptors: the kernel's own stderr too
    table = captured.out
    assert "02_bad.ipynb" in captured.err and "/2 [" in captured.err, "a per-cell progress bar on stderr"
    assert "without encryption" not in captured.err and "Parent appears to have exited" not in captured.err
    assert "01_ok.ipynb" in table and "ok" in table and "FAILED: ValueError: broken lesson" in table
    assert "\x1b" not in table, "the status column shows the error, not the traceback's colour codes"
    executed = nbformat.read(out / "01_ok.ipynb", 4)
    assert executed.cells[1].outputs[0]["text"] == "42\n"
    assert (out / "01_ok.html").stat().st_size > 0 and (out / "02_bad.html").exists()
    assert course.main(["--out", str(out), str(src / "01_ok.ipynb")]) == 0


@pytest.mark.parametrize("name", ["00_setup", "12_fault_tolerance"])
def test_a_lesson_becomes_a_slide_deck_without_running(tmp_path, name):
    """make slides: every heading and every figure of the stored lesson is in the deck, no code (nothing runs:
    this test may not start a process)."""
    path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    deck = course.slide_deck(path, tmp_path).read_text()
    headings = [c.source.splitlines()[0].lstrip("# ") for c in nb.cells
                if c.cell_type == "markdown" and c.source.startswith(("# ", "## "))]
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert headings and figures
    assert deck.count('<img alt="No description has been provided for this image" class="" src="data:image/png') == figures
    text = html.unescape(deck)
    assert "Reveal.initialize" in deck and "from mgpu_utils.course import start" not in text   # no code shown
    assert all(h.split("`")[0].strip()[:30] in text for h in headings), headings


def test_the_table_marks_lessons_over_their_budget():
    """Issue 60: each lesson's seconds beside its budget (60 s), the ones over it named; the total against 300 s."""
    table = course.budget_table([("01_a.ipynb", 12.0, "ok"), ("02_b.ipynb", 75.5, "ok")])
    assert "01_a.ipynb      12.0      60  ok\n" in table and "02_b.ipynb      75.5      60  ok  OVER" in table
    assert "total           87.5     300  within" in table and table.endswith("2 cores: 02_b.ipynb")
    assert "OVER" in course.budget_table([("01_a.ipynb", 250.0, "ok"), ("02_b.ipynb", 55.0, "ok")]).splitlines()[-2]
