"""What a notebook shows before anyone runs it (issue 18): widget cells show a picture of their default
settings and one line saying how to get the interactive version, never ipywidgets' text repr."""

import json
import re
from pathlib import Path

import pytest

from mgpu_utils.figures.widget_view import RUN_LINE, WIDGET_VIEW, strip_live_views, with_static_view

ROOT = Path(__file__).resolve().parents[2]
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
    assert not plt.fignum_exists(fig.number), "the static figure must be closed (else inline shows it twice)"

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
    from mgpu_utils.figures.hybrid import plan_explorer
    from mgpu_utils.figures.memory import calculator
    from mgpu_utils.figures.collectives import ring_stepper
    from mgpu_utils.figures.model_parallel import explorer

    for w in (ring_stepper(4), explorer(4, 8, "1f1b"), calculator(layers=4, hidden=256, heads=4)):
        data = w._repr_mimebundle_()
        assert WIDGET_VIEW in data and "image/png" in data and data["text/plain"].endswith(RUN_LINE)
    assert "bubble 0.273 (formula 0.273)" in explorer(4, 8, "1f1b")._repr_mimebundle_()["text/plain"]
    planner_box = plan_explorer(n_gpus=256)
    data = planner_box._repr_mimebundle_()
    assert WIDGET_VIEW in data and "image/png" not in data
    assert data["text/plain"].splitlines()[0].split()[:3] == ["dp", "tp", "pp"] and data["text/plain"].endswith(RUN_LINE)
    planner_box.children[1].value = "H100"                    # a control changes: the planner reruns


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


# ---- readable at the displayed width ------------------------------------------------------------------
# Measured in JupyterLab 4.6 (tests/repo/test_browser.py's page): in a 1280-pixel-wide window with the file
# browser open, the output area is 848 px wide and holds 108 monospace characters. So: code and output
# lines at most 100 characters; figures at most 11 inches at 100 dpi (1,100 px, shown at 0.77x or more);
# text in figures at least 8 pt (11 px at 100 dpi, 8.5 px or more as shown).
MAX_LINE = 100
MAX_FIG_IN, MAX_FIG_PX, MIN_FONT_PT = 11, 1100, 8
SIZE_KEYWORDS = {"fontsize", "labelsize", "size"}


def _figure_lint(source: str, where: str) -> list[str]:
    """Literal font sizes under MIN_FONT_PT and literal figure widths over MAX_FIG_IN in ``source``."""
    import ast
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        for kw in node.keywords:
            v = kw.value
            if kw.arg in SIZE_KEYWORDS and isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) \
                    and (kw.arg != "size" or name in {"text", "annotate", "set_title", "suptitle", "legend"}) \
                    and v.value < MIN_FONT_PT:
                bad.append(f"{where} line {node.lineno}: {kw.arg}={v.value} (at least {MIN_FONT_PT})")
            if kw.arg == "figsize" and isinstance(v, ast.Tuple) and isinstance(v.elts[0], ast.Constant) \
                    and v.elts[0].value > MAX_FIG_IN:
                bad.append(f"{where} line {node.lineno}: figsize width {v.elts[0].value} (at most {MAX_FIG_IN})")
    return bad


def _code_cells(nb):
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "code":
            yield i, "\n".join(line for line in _text(c["source"]).splitlines()
                               if not line.lstrip().startswith(("!", "%")))


def test_figures_follow_the_size_convention():
    assert _figure_lint("plt.text(0, 0, 's', fontsize=7)\nplt.subplots(figsize=(12, 3))", "x") == [
        "x line 1: fontsize=7 (at least 8)", "x line 2: figsize width 12 (at most 11)"]
    bad = []
    for path in sorted((ROOT / "mgpu_utils").glob("*.py")):
        bad += _figure_lint(path.read_text(), f"mgpu_utils/{path.name}")
    for path in NOTEBOOKS:
        for i, src in _code_cells(json.loads(path.read_text())):
            bad += _figure_lint(src, f"{path.name} cell {i}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_figures_fit_the_page(path):
    import base64
    import struct
    for i, cell, out in _outputs(json.loads(path.read_text())):
        png = out.get("data", {}).get("image/png")
        if png:
            width = struct.unpack(">I", base64.b64decode(_text(png))[16:20])[0]
            assert width <= MAX_FIG_PX, f"cell {i}: a figure {width} px wide (at most {MAX_FIG_PX}: 11 in at 100 dpi)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_and_output_lines_fit_the_page(path):
    nb, bad = json.loads(path.read_text()), []
    for i, src in _code_cells(nb):
        bad += [f"cell {i} code ({len(line)}): {line}" for line in src.splitlines() if len(line) > MAX_LINE]
    for i, cell, out in _outputs(nb):
        text = _text(out.get("text", "")) + _text(out.get("data", {}).get("text/plain", ""))
        bad += [f"cell {i} output ({len(line)}): {line}" for line in text.splitlines() if len(line) > MAX_LINE]
    assert not bad, f"{len(bad)} lines over {MAX_LINE} characters:\n" + "\n".join(bad[:20])
