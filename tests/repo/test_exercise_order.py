"""No answer before its exercise (issue 54): a lesson shows the code that a graded coding exercise asks for only
after the exercise's cell, never above it, in a cell's source or in its stored output.

Two signs of a reveal, each checked against every cell above the exercise's ``check_script("NN.M")`` cell:
* a line of the worked solution that its template does not have (the student's part), where that line says
  something particular (at least 20 characters, not a comment, not an import or a bare ``with``/``return``);
* the definition (``def NAME(``) of a function or method that the template leaves with a ``TODO``: the lesson
  showing its own version of it, e.g. through ``show_code``.
"""
import ast
import json
import re
from pathlib import Path

import pytest

from mgpu_utils.grading import catalog

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = ROOT / "exercises"
GENERIC = re.compile(r"^(import |from \S+ import |with torch\.no_grad\(\):$|return \w+$|else:$|try:$)")
# a function of the same name that is another function, with the reason
OTHER_FUNCTION = {("06.3", "train_step"): "hybrid_3d.py's train_step is a 3-D GPipe step; 06.3 is a 2-D dp x tp step"}


def _norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def _student_lines(template: str) -> set[str]:
    """Lines of the worked solution that its template lacks, where they say something particular."""
    solution = EXERCISES / "solutions" / template
    if not solution.exists():
        pytest.skip(f"no worked solution for {template} (a class copy): nothing to compare with")
    given = {_norm(line) for line in (EXERCISES / template).read_text().splitlines()}
    lines = {_norm(line) for line in solution.read_text().splitlines()}
    return {line for line in lines - given
            if len(line) >= 20 and not line.startswith("#") and not GENERIC.match(line)}


def _todo_functions(template: str) -> set[str]:
    """Names of the template's functions and methods whose body holds a TODO (what the student writes)."""
    text = (EXERCISES / template).read_text()
    lines = text.splitlines()
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = "\n".join(lines[node.lineno - 1:node.end_lineno])
            if "TODO" in body:
                names.add(node.name)
    return names


def _shown(cell: dict) -> str:
    """A cell's source and the text of its stored outputs (markdown and plain text; HTML tags dropped)."""
    parts = ["".join(cell["source"])]
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/"):
                value = "".join(value)
                parts.append(re.sub(r"<[^>]+>", "", value) if mime == "text/html" else value)
    return "\n".join(parts)


def reveals(cells: list[dict]) -> list[str]:
    """Every reveal above a graded exercise's cell in one notebook, as readable lines (empty: none)."""
    found = []
    for i, cell in enumerate(cells):
        for exercise in re.findall(r'check_script\("(\d\d\.\d)"\)', "".join(cell["source"])):
            template = catalog.EXERCISES[exercise].template
            lines, names = _student_lines(template), _todo_functions(template)
            for j in range(i):
                shown = _shown(cells[j])
                hit = sorted(lines & {_norm(line) for line in shown.splitlines()})
                hit += [f"def {name}(" for name in sorted(names) if re.search(rf"\bdef {name}\(", shown)
                        and (exercise, name) not in OTHER_FUNCTION]
                if hit:
                    found.append(f"exercise {exercise} (cell {i}) is answered above it in cell {j}: {hit[:3]}")
    return found


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_answer_before_its_exercise(nb_path):
    found = reveals(json.loads(nb_path.read_text())["cells"])
    assert not found, ("move the exercise above the code that answers it, or make it a variant the lesson "
                       "does not show:\n" + "\n".join(found))


def test_the_check_sees_a_shown_answer():
    """A notebook that shows 08.3's merge (the worked solution's lines, or a def of the same name) above the
    exercise fails; the same cells with the exercise first pass."""
    solution_path = EXERCISES / "solutions" / "08_merge_attention.py"
    if not solution_path.exists():
        pytest.skip("no worked solution for 08_merge_attention.py (a class copy): nothing to show")
    solution = solution_path.read_text()
    cell = lambda text, outputs=(): {"cell_type": "code", "source": [text], "outputs": list(outputs)}
    exercise = cell('check_script("08.3");')
    shown_source = cell(solution)
    shown_output = cell("show_code(context.merge)", [{"output_type": "display_data", "data": {
        "text/markdown": ["```python\ndef merge(out1, lse1, out2, lse2):\n    return out, lse\n```"]}}])
    for reveal in (shown_source, shown_output):
        assert reveals([reveal, exercise]), reveal["source"]
        assert not reveals([exercise, reveal])
