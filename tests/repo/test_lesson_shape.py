"""The shape of a lesson a student can walk (issue 54): a short core path, the depth in optional sections.

A **deeper** section starts at a markdown heading cell tagged ``deeper`` whose heading reads "Deeper: ..." (or
"4. Deeper: ...")
and is collapsed when the notebook opens in JupyterLab (cell metadata ``jp-MarkdownHeadingCollapsed``); it
runs to the next heading of the same or a higher level. Its cells still run (``make course``, nbval, the
browser test). The **core path** is every other cell.

A code cell tagged ``predict`` (a locked prediction, ``mgpu_utils.grading.predict``: one question asked before a run,
its answer shown after it) is not counted among the core path's cells when it is at most ``MAX_PREDICT_LINES``
lines: it is a pause for the student, not more to read (``tests/repo/test_predictions.py`` checks them).

For every lesson: each ``deeper`` cell is such a heading, collapsed, and (``REWORKED``: every lesson) the core path holds at most ``MAX_CORE_CELLS`` cells and about
``MAX_CORE_WORDS`` words of prose, no code cell runs over ``MAX_CODE_LINES`` lines and no markdown cell over
``MAX_MD_WORDS`` words, and the summary has at most ``MAX_SUMMARY_BULLETS`` bullets.
"""
import json
import re
from pathlib import Path

import pytest
from helpers import HEADING, core_and_deeper, heading_level, hidden_on_opening

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REWORKED = {p.name[:2] for p in NOTEBOOKS}            # every lesson now
MAX_CORE_CELLS, MAX_CORE_WORDS, MAX_CODE_LINES, MAX_MD_WORDS, MAX_SUMMARY_BULLETS = 35, 2500, 40, 300, 5
MAX_PREDICT_LINES = 8                                   # a predict cell this short is not counted in the core
DEEPER = re.compile(r"^(\d+[a-z]?\.\s+)?Deeper: ")      # "Deeper: ..." or "4. Deeper: ..."
COLLAPSED = "jp-MarkdownHeadingCollapsed"


def _source(cell) -> str:
    return "".join(cell["source"])


def words(text: str) -> int:
    """Words of prose: tokens with a letter or a digit (a table's pipes and rules, a bullet's star are not)."""
    return sum(1 for token in text.split() if re.search(r"\w", token))


def raw_words(text: str) -> int:
    """Every whitespace-separated token, a table's pipes included: what a reader scrolls past."""
    return len(text.split())


def _inner_headings(text: str) -> list[str]:
    """Heading lines after a markdown cell's first line (outside code fences)."""
    found, fenced = [], False
    for k, line in enumerate(text.splitlines()):
        fenced ^= line.startswith("```")
        if k and not fenced and HEADING.match(line):
            found.append(line)
    return found


def is_prediction(cell) -> bool:
    """A short code cell tagged ``predict``: a locked prediction's question or its reveal."""
    return cell["cell_type"] == "code" and "predict" in cell.get("metadata", {}).get("tags", []) \
        and len(_source(cell).splitlines()) <= MAX_PREDICT_LINES


def shape(cells: list[dict]) -> dict:
    core, _ = core_and_deeper(cells)
    prose = sum(words(_source(cells[i])) for i in core if cells[i]["cell_type"] == "markdown")
    summary = next((_source(c) for c in cells if _source(c).lstrip().startswith("## Summary")), "")
    return {"core_cells": sum(not is_prediction(cells[i]) for i in core), "core_words": prose,
            "summary_bullets": sum(1 for line in summary.splitlines() if line.startswith("* "))}


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_deeper_sections_are_headed_and_collapsed(nb_path):
    cells = json.loads(nb_path.read_text())["cells"]
    bad = []
    for i, cell in enumerate(cells):
        if "deeper" not in cell.get("metadata", {}).get("tags", []):
            continue
        level = heading_level(cell)
        title = HEADING.match(_source(cell).lstrip()).group(2) if level else ""
        if level is None or not DEEPER.match(title):
            bad.append(f"cell {i}: a deeper section starts with a heading 'Deeper: ...', not {_source(cell)[:60]!r}")
        elif cell["metadata"].get(COLLAPSED) is not True:
            bad.append(f"cell {i}: {title!r} is not collapsed (cell metadata {COLLAPSED}: true)")
    for i, cell in enumerate(cells):
        level = heading_level(cell)
        if level and DEEPER.match(HEADING.match(_source(cell).lstrip()).group(2)) \
                and "deeper" not in cell.get("metadata", {}).get("tags", []):
            bad.append(f"cell {i}: a 'Deeper:' heading without the cell tag deeper")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("nb_path", [p for p in NOTEBOOKS if p.name[:2] in REWORKED], ids=lambda p: p.name)
def test_reworked_lesson_has_a_short_core(nb_path):
    cells = json.loads(nb_path.read_text())["cells"]
    s = shape(cells)
    problems = []
    if s["core_cells"] > MAX_CORE_CELLS:
        problems.append(f"core path: {s['core_cells']} cells (at most {MAX_CORE_CELLS}: move depth into a "
                        "'Deeper: ...' section)")
    if s["core_words"] > MAX_CORE_WORDS * 1.1:
        problems.append(f"core path: {s['core_words']} words of prose (about {MAX_CORE_WORDS})")
    if s["summary_bullets"] > MAX_SUMMARY_BULLETS:
        problems.append(f"summary: {s['summary_bullets']} bullets (at most {MAX_SUMMARY_BULLETS})")
    for i, cell in enumerate(cells):
        text = _source(cell)
        if cell["cell_type"] == "code" and len(text.splitlines()) > MAX_CODE_LINES:
            problems.append(f"cell {i}: {len(text.splitlines())} lines of code (at most {MAX_CODE_LINES})")
        if cell["cell_type"] == "markdown" and raw_words(text) > MAX_MD_WORDS:
            problems.append(f"cell {i}: {raw_words(text)} words, table rules included (at most {MAX_MD_WORDS})")
        if cell["cell_type"] == "markdown" and (inner := _inner_headings(text)):
            problems.append(f"cell {i}: a heading inside the cell ({inner[0]!r}): a heading opens its own cell, "
                            "so that JupyterLab collapses what the core path leaves out")
    assert not problems, f"{nb_path.name}:\n" + "\n".join(problems)


def test_the_core_path_leaves_out_deeper_sections():
    md = lambda text, tags=(): {"cell_type": "markdown", "source": [text], "metadata": {"tags": list(tags)}}
    code = {"cell_type": "code", "source": ["x = 1"], "metadata": {}}
    cells = [md("# Lesson"), md("## 1. Core"), code, md("### Deeper: more", ["deeper"]), code,
             md("#### a sub-heading inside"), code, md("### Back in the core"), code, md("## Summary\n\n* one")]
    core, deeper = core_and_deeper(cells)
    assert deeper == [3, 4, 5, 6] and core == [0, 1, 2, 7, 8, 9]
    assert hidden_on_opening(cells) == [4, 5, 6]
    # a deeper section inside another is hidden with it, its heading too
    nested = [md("## Deeper: outer", ["deeper"]), code, md("### Deeper: inner", ["deeper"]), code, md("## Core")]
    assert hidden_on_opening(nested) == [1, 2, 3] and core_and_deeper(nested)[0] == [4]
    assert shape(cells)["summary_bullets"] == 1
    # a short predict cell is not counted; a long one is
    tagged = lambda n: {"cell_type": "code", "source": ["x = 1\n"] * n, "metadata": {"tags": ["predict"]}}
    assert shape(cells + [tagged(MAX_PREDICT_LINES)])["core_cells"] == shape(cells)["core_cells"]
    assert shape(cells + [tagged(MAX_PREDICT_LINES + 1)])["core_cells"] == shape(cells)["core_cells"] + 1
