"""Locked predictions in every lesson (issue 56): at least two numbers the student commits to before a run.

A prediction is two code cells tagged ``predict`` (``mgpu_utils.grading.predict``): ``ask("NN.name", question,
stored=...)`` before the cell whose run answers it, and later ``reveal("NN.name", measured, why=...)`` with
a value the lesson computed. Checked here, without running anything:

* the source: every lesson has ``MIN_PREDICTIONS`` or more, at most ``MAX_PREDICT_CELLS`` tagged cells (they
  stay out of the core path's cell count, ``tests/repo/test_lesson_shape.py``), each key asked once with a
  stored guess and revealed once in a later cell, the measured value not a literal;
* the stored output (what a student sees before running, and what ``make course`` writes): each question
  shows the stored guess, each reveal shows it against the measured value with their ratio and a reason, and
  the stored guess is not the answer.
"""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MIN_PREDICTIONS, MAX_PREDICT_CELLS = 2, 6
RATIO = re.compile(r"measured / predicted (?:= (?P<r>[-\d.]+)|: undefined)")


def _calls(source: str, name: str) -> list[ast.Call]:
    """The calls ``name(...)`` in a cell's source (IPython's ``%`` lines left out)."""
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    return [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id == name]


def _text(cell) -> str:
    return "".join("".join(o.get("text", "")) if o.get("output_type") == "stream"
                   else "".join(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def predictions(cells):
    """{key: {"ask": (cell index, call), "reveal": [(cell index, call), ...]}} and the predict-tagged cells."""
    found, tagged = {}, []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        if "predict" in cell.get("metadata", {}).get("tags", []):
            tagged.append(i)
        source = "".join(cell["source"])
        for kind in ("ask", "reveal"):
            for call in _calls(source, kind):
                key = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
                entry = found.setdefault(key, {"ask": [], "reveal": []})
                entry[kind].append((i, call))
    return found, tagged


def source_problems(cells, lesson: str) -> list[str]:
    """What is wrong with a lesson's prediction cells, read from their source."""
    found, tagged = predictions(cells)
    problems = []
    if len(found) < MIN_PREDICTIONS:
        problems.append(f"{len(found)} predictions (ask/reveal pairs), at least {MIN_PREDICTIONS}")
    if len(tagged) > MAX_PREDICT_CELLS:
        problems.append(f"{len(tagged)} cells tagged predict, at most {MAX_PREDICT_CELLS}")
    for key, calls in found.items():
        if key is None or not key.startswith(f"{lesson}."):
            problems.append(f"a prediction key must be a string 'NN.name' of this lesson ({lesson}.), got {key!r}")
            continue
        if len(calls["ask"]) != 1 or len(calls["reveal"]) != 1:
            problems.append(f"{key}: asked {len(calls['ask'])} and revealed {len(calls['reveal'])} times "
                            "(once each)")
            continue
        (i_ask, ask), (i_rev, rev) = calls["ask"][0], calls["reveal"][0]
        if i_ask not in tagged:
            problems.append(f"{key}: cell {i_ask} asks it but is not tagged predict")
        if i_rev <= i_ask:
            problems.append(f"{key}: revealed in cell {i_rev}, not after the question (cell {i_ask})")
        if not any(k.arg == "stored" for k in ask.keywords):
            problems.append(f"{key}: ask() without stored=..., the guess a run nobody answers uses")
        measured = rev.args[1] if len(rev.args) > 1 else None
        if measured is None or isinstance(measured, ast.Constant):
            problems.append(f"{key}: reveal() needs the measured value as an expression the lesson computed")
        if not any(k.arg == "why" for k in rev.keywords):
            problems.append(f"{key}: reveal() without why=..., the reason for the gap")
    return problems


def output_problems(cells) -> list[str]:
    """What the stored outputs of a lesson's prediction cells fail to show."""
    found, _ = predictions(cells)
    problems = []
    for key, calls in found.items():
        if len(calls["ask"]) != 1 or len(calls["reveal"]) != 1:
            continue                                    # the test above names it
        asked, shown = _text(cells[calls["ask"][0][0]]), _text(cells[calls["reveal"][0][0]])
        if f"[{key}]" not in asked or "the stored guess:" not in asked:
            problems.append(f"{key}: the question's stored output does not show the stored guess "
                            "(run the lesson, make course, and keep its outputs)")
        ratio = RATIO.search(shown)
        if f"[{key}]" not in shown or "measured:" not in shown or not ratio or "why:" not in shown:
            problems.append(f"{key}: the reveal's stored output does not show the prediction against the "
                            "measured value, the ratio and why (run the lesson and keep its outputs)")
        elif ratio.group("r") and abs(float(ratio.group("r")) - 1) < 0.05:
            problems.append(f"{key}: the stored guess is the answer (measured / predicted = "
                            f"{ratio.group('r')}): store a plausible wrong guess")
        if any(o.get("output_type") == "error" for c in (cells[calls["ask"][0][0]], cells[calls["reveal"][0][0]])
               for o in c.get("outputs", [])):
            problems.append(f"{key}: an error in the stored output")
    return problems


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_asks_for_predictions_and_reveals_them(nb_path):
    problems = source_problems(json.loads(nb_path.read_text())["cells"], nb_path.name[:2])
    assert not problems, f"{nb_path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_show_each_prediction_against_its_result(nb_path):
    problems = output_problems(json.loads(nb_path.read_text())["cells"])
    assert not problems, f"{nb_path.name}:\n" + "\n".join(problems)


def _code(source: str, text: str = "", tagged: bool = True) -> dict:
    return {"cell_type": "code", "source": [source], "metadata": {"tags": ["predict"] if tagged else []},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}] if text else []}


ASKED = "[99.a] Q?\n  the stored guess: 2x (a run nobody can answer)\n"
SHOWN = "[99.a] Q?\n  the stored guess: 2x\n  measured: 1x;  measured / predicted = {r}\n  why: w\n"


def test_the_checks_catch_a_broken_prediction():
    ask, rev = 'ask("99.a", "Q?", unit="x", stored=2)', 'reveal("99.a", t1 / t0, why="w")'
    good = [_code(ask, ASKED), _code("t0, t1 = 2.0, 1.0"), _code(rev, SHOWN.format(r="0.50"))]
    good += [_code(ask.replace("99.a", "99.b"), ASKED.replace("99.a", "99.b")),
             _code(rev.replace("99.a", "99.b"), SHOWN.format(r="0.50").replace("99.a", "99.b"))]
    assert source_problems(good, "99") == [] and output_problems(good) == []
    other, between = good[3:], good[1]
    broken = {   # what the message names: the cells (the question, a cell between, the reveal)
        "without stored=": [_code(ask.replace(", stored=2", "")), between, good[2]],
        "the measured value as an expression": [good[0], between, _code(rev.replace("t1 / t0", "0.5"))],
        "not after the question": [good[2], between, good[0]],
        "not tagged predict": [_code(ask, tagged=False), between, good[2]],
        "without why=": [good[0], between, _code(rev.replace(', why="w"', ""))],
        "of this lesson": [_code(ask.replace("99.a", "98.a")), between, _code(rev.replace("99.a", "98.a"))],
        "and revealed 2 times": [good[0], good[2], good[2]],
    }
    for what, cells in broken.items():
        problems = source_problems(cells + other, "99")
        assert any(what in p for p in problems), (what, problems)
    assert any("at least 2" in p for p in source_problems(good[:3], "99"))
    assert any("is the answer" in p for p in output_problems([good[0], _code(rev, SHOWN.format(r="1.00"))]))
    assert any("does not show" in p for p in output_problems([good[0], _code(rev)]))
