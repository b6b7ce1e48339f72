"""`make course` (mgpu_utils.course): executes notebooks, writes build files, exits non-zero on failure; `make
slides` (slide decks from the stored lessons)."""
import html
import re

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


def test_two_jobs_run_two_notebooks_at_once(tmp_path, capfd, starts_processes):
    """--jobs 2 (make course): each notebook waits until the other has started, which one at a time never
    sees (its cell times out); the rows come back in the course's order, a failure as a failure."""
    src = tmp_path / "nbs"
    src.mkdir()
    meet = tmp_path / "meet"
    meet.mkdir()
    for name, other in (("01_a", "02_b"), ("02_b", "01_a")):
        _nb(src / f"{name}.ipynb", [f"import pathlib, time\n(pathlib.Path({str(meet)!r}) / {name!r}).touch()\n"
                                    f"while not (pathlib.Path({str(meet)!r}) / {other!r}).exists():\n"
                                    f"    time.sleep(0.1)"])
    _nb(src / "02_bad.ipynb", ["raise ValueError('broken lesson')"])
    out = tmp_path / "build"
    assert course.main(["--jobs", "2", "--timeout", "120", "--no-progress", "--out", str(out), str(src)]) == 1
    table = capfd.readouterr().out.split("\nnotebook ", 1)[1]
    assert [ln.split()[0] for ln in table.splitlines()[1:4]] == ["01_a.ipynb", "02_b.ipynb", "02_bad.ipynb"]
    assert "FAILED: ValueError: broken lesson" in table and table.count("  ok") == 2
    assert (out / "01_a.ipynb").exists() and (out / "02_b.html").exists()
    with pytest.raises(SystemExit):
        course.main(["--jobs", "0", "--out", str(out), str(src)])


@pytest.mark.parametrize("name", ["00_setup", "09_sync_vs_async"])
def test_a_lesson_becomes_a_slide_deck_without_running(tmp_path, name):
    """make slides: every heading and every figure of the stored lesson is in the deck, no code, nothing from
    the network (one file that works offline), math drawn as SVG (nothing runs: this test may not start a
    process)."""
    path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    deck = course.slide_deck(path, tmp_path).read_text()
    headings = [c.source.splitlines()[0].lstrip("# ") for c in nb.cells
                if c.cell_type == "markdown" and c.source.startswith(("# ", "## "))]
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert headings and figures
    assert deck.count('src="data:image/png;base64,') == figures
    assert deck.count('<section class="slide"') == figures + sum(c.cell_type == "markdown" for c in nb.cells)
    text = html.unescape(deck)
    assert "from mgpu_utils.course import start" not in text                     # no code shown
    assert all(h.split("`")[0].strip()[:30] in text for h in headings), headings
    assert not re.search(r"""(src|href)=["']https?:""", deck), "a deck loads nothing from the network"
    assert ("$$" in "".join(c.source for c in nb.cells)) == ('<div class="math"><svg' in deck)
    assert course.slide_deck(path, tmp_path).read_text() == deck, "the same lesson gives the same deck"


def _long_lesson(path):
    """A stored lesson with a text-heavy slide (30 paragraphs), a code-heavy one (70 lines, one of them 300
    characters wide) and a wide table: each larger than a slide's frame at full size."""
    code = "\n".join(f"result_{i} = torch.distributed.all_reduce(tensor_{i}, op=ReduceOp.SUM, async_op=True)"
                      for i in range(70))
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A long lesson\n\n" + "\n\n".join(f"Paragraph {i}: " + "words " * 40
                                                                             for i in range(30))),
        nbformat.v4.new_markdown_cell("## Code\n\n```python\n" + code + "\n" + "x" * 300 + "\n```"),
        nbformat.v4.new_markdown_cell("| " + " | ".join(f"column {i}" for i in range(30)) + " |\n|"
                                      + "---|" * 30 + "\n| " + " | ".join("1234567" for _ in range(30)) + " |")])
    nbformat.write(nb, path)
    return path


def test_every_slide_fits_its_frame_in_chromium(tmp_path, starts_processes):
    """Issue 56: every slide of every lesson, and a text-heavy, a code-heavy and a wide one, drawn by Chromium in
    two window sizes: no element leaves its slide's frame, the deck shrinks what is too big (and only that), and
    the arrow keys and the address (#3) move between slides."""
    from lab_server import CHROMIUM, CHROMIUM_ARGS, browser_missing, browser_required

    why = browser_missing()
    if why:
        pytest.fail(why) if browser_required() else pytest.skip(why)
    from playwright import sync_api

    decks = [course.slide_deck(p, tmp_path) for p in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    decks.append(course.slide_deck(_long_lesson(tmp_path / "long.ipynb"), tmp_path))
    measure = """() => slides.map((s, i) => {
        show(i);
        const r = s.getBoundingClientRect(), inside = Array.from(s.querySelectorAll('*')).map(e =>
            e.getBoundingClientRect()).filter(b => b.width && b.height);
        const out = inside.filter(b => b.left < r.left - 1 || b.top < r.top - 1 || b.right > r.right + 1
                                       || b.bottom > r.bottom + 1).length;
        return [i + 1, out, parseFloat(s.dataset.k)];
    })"""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for width, height in ((1280, 720), (800, 600)):
                page = browser.new_page(viewport={"width": width, "height": height})
                for deck in decks:
                    page.goto(deck.as_uri())
                    rows = page.evaluate(measure)
                    assert not [r for r in rows if r[1]], (deck.name, width, [r for r in rows if r[1]])
                    if deck.name.startswith("long"):
                        assert [r[2] < 1 for r in rows] == [True, True, True], rows       # shrunk to fit
                    else:
                        assert min(r[2] for r in rows) >= 0.45, (deck.name, rows)          # still readable
                page.goto(decks[3].as_uri() + "#3")
                assert page.evaluate("at") == 2
                page.keyboard.press("ArrowRight")
                assert page.evaluate("at") == 3 and page.url.endswith("#4")
                page.close()
        finally:
            browser.close()


def test_stored_seconds_add_up_the_cells_execution_records(tmp_path):
    """What orders make course's lessons, the longest first: the stored cells' execution records."""
    _nb(tmp_path / "a.ipynb", ["1", "2", "3"])
    nb = nbformat.read(tmp_path / "a.ipynb", 4)
    nb.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-12-06T10:00:00.000000Z",
                                         "shell.execute_reply": "2026-12-06T10:00:02.500000Z"}
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-12-06T10:00:03Z",
                                         "shell.execute_reply": "2026-12-06T10:00:04Z"}
    nbformat.write(nb, tmp_path / "a.ipynb")
    assert course.stored_seconds(tmp_path / "a.ipynb") == 3.5
    # by construction: the committed lesson's stored records are read, nothing is timed here
    assert course.stored_seconds(REPO_ROOT / "notebooks" / "10_case_studies.ipynb") > 10


def test_the_table_marks_lessons_over_their_budget():
    """Issue 60: each lesson's seconds beside its budget (60 s), the ones over it named; the total against 300 s."""
    table = course.budget_table([("01_a.ipynb", 12.0, "ok"), ("02_b.ipynb", 75.5, "ok")])
    assert "01_a.ipynb      12.0      60  ok\n" in table and "02_b.ipynb      75.5      60  ok  OVER" in table
    assert "total           87.5     300  within" in table and table.endswith("2 cores: 02_b.ipynb")
    assert "OVER" in course.budget_table([("01_a.ipynb", 250.0, "ok"), ("02_b.ipynb", 55.0, "ok")]).splitlines()[-2]
    two = course.budget_table([("01_a.ipynb", 250.0, "ok"), ("02_b.ipynb", 55.0, "ok")], wall_s=251.0, jobs=2)
    assert "wall           251.0     300  within" in two and "2 notebooks at a time" in two   # not the sum, 305
