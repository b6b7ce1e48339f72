"""What a notebook shows before anyone runs it (issue 18): widget cells show a picture of their default
settings and one line saying how to get the interactive version, never ipywidgets' text repr."""

import json
import re
from pathlib import Path

import pytest

from mgpu_utils.widget_view import RUN_LINE, WIDGET_VIEW, strip_live_views, with_static_view

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET_REPR = re.compile(r"\b(interactive|[HV]Box|Output|IntSlider)\(children=|\bIntSlider\(value=")
# the calls in the course that build a widget; each one's cell must store a static view
WIDGET_CALLS = re.compile(r"ring_stepper\(|explorer\(|calculator\(|widgets\.interact")
COURSE_WIDGET_CELLS = 5  # 04 ring stepper, 05 schedule explorer, 06 planner, 07 two calculators


def _outputs(nb):
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            for out in cell.get("outputs", []):
                yield i, cell, out


def _text(value):
    return "".join(value) if isinstance(value, list) else value


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_widget_shows_as_text_in_stored_outputs(path):
    nb = json.loads(path.read_text())
    assert "widgets" not in nb["metadata"], "saved widget state: make course strips it (strip_live_views)"
    for i, cell, out in _outputs(nb):
        data = out.get("data", {})
        text = _text(data.get("text/plain", "")) + _text(out.get("text", ""))
        assert not WIDGET_REPR.search(text), f"cell {i} stores a widget's text repr: {text[:80]!r}"
        assert WIDGET_VIEW not in data, f"cell {i} stores a live widget view that no front end can draw"
    widget_cells = [i for i, cell in enumerate(nb["cells"])
                    if cell["cell_type"] == "code" and WIDGET_CALLS.search(_text(cell["source"]))]
    for i in widget_cells:
        outs = [o for o in nb["cells"][i].get("outputs", [])
                if RUN_LINE in _text(o.get("data", {}).get("text/plain", ""))]
        assert outs, f"widget cell {i} stores no static view (wrap the widget in with_static_view)"
        o = outs[-1]["data"]
        assert "image/png" in o or len(_text(o["text/plain"])) > len(RUN_LINE), f"cell {i}: an empty static view"


def test_every_widget_cell_is_found():
    n = sum(1 for p in NOTEBOOKS for c in json.loads(p.read_text())["cells"]
            if c["cell_type"] == "code" and WIDGET_CALLS.search(_text(c["source"])))
    assert n >= COURSE_WIDGET_CELLS


def test_static_view_keeps_the_widget_and_adds_a_picture():
    import ipywidgets as widgets
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    slider = widgets.IntSlider(value=3)
    assert with_static_view(slider, fig) is slider
    data = slider._repr_mimebundle_()
    assert WIDGET_VIEW in data and data["text/plain"] == RUN_LINE
    import base64
    assert base64.b64decode(data["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums(), "the static figure must be closed (else inline shows it twice)"

    box = with_static_view(widgets.VBox([widgets.IntSlider()]), "a table\n")
    data = box._repr_mimebundle_()
    assert data["text/plain"] == "a table\n\n" + RUN_LINE and "image/png" not in data
    with pytest.raises(TypeError, match="Figure or a str"):
        with_static_view(slider, 42)

    import nbformat
    nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    nb.cells.append(nbformat.v4.new_code_cell("box", outputs=[
        nbformat.v4.new_output("display_data", data=data)]))
    assert strip_live_views(nb) == 1
    assert WIDGET_VIEW not in nb.cells[0].outputs[0].data and "widgets" not in nb.metadata
    assert nb.cells[0].outputs[0].data["text/plain"].endswith(RUN_LINE)


def test_course_widgets_have_static_views():
    """The four widgets of the course, built as their notebooks build them."""
    import matplotlib
    matplotlib.use("Agg")
    from mgpu_utils.memory_calc import calculator
    from mgpu_utils.plots import ring_stepper
    from mgpu_utils.schedules import explorer

    for w in (ring_stepper(4), explorer(4, 8, "1f1b"), calculator(layers=4, hidden=256, heads=4)):
        data = w._repr_mimebundle_()
        assert WIDGET_VIEW in data and "image/png" in data and data["text/plain"] == RUN_LINE


def _unclosed_tables(markdown: str) -> list[int]:
    """Line numbers (1-based) where a markdown table is followed directly by a line of prose: the renderer
    takes that line as one more table row."""
    lines, bad, in_code = markdown.splitlines(), [], False
    for n, (line, nxt) in enumerate(zip(lines, lines[1:]), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and line.lstrip().startswith("|") and nxt.strip() and not nxt.lstrip().startswith("|"):
            bad.append(n + 1)
    return bad


def test_markdown_tables_end_with_a_blank_line():
    assert _unclosed_tables("| a | b |\n|---|---|\n| 1 | 2 |\nprose\n") == [4]
    assert _unclosed_tables("| a | b |\n|---|---|\n| 1 | 2 |\n\nprose\n") == []
    assert _unclosed_tables("```\n| not a table\ncode\n```\n") == []
    bad = [f"{p.name} cell {i} line {n}" for p in NOTEBOOKS for i, c in enumerate(json.loads(p.read_text())["cells"])
           if c["cell_type"] == "markdown" for n in _unclosed_tables(_text(c["source"]))]
    bad += [f"README.md line {n}" for n in _unclosed_tables((ROOT / "README.md").read_text())]
    assert not bad, f"a table runs into the next line (add a blank line after it): {bad}"
