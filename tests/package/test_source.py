"""Lessons show the code they launch (issue 32): mgpu_utils.source, and every notebook checked for it."""
import ast
import json
import sys

import pytest

from mgpu_utils.env import REPO_ROOT, SCRIPTS_DIR
from mgpu_utils.source import WIDTH, Listing, definitions, fit_comments, load_script, read_code, regions, show_code

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAUNCHERS = {"launch", "run_torchrun", "launch_nodes"}


def calls(cell_source: str):
    """(line, function name, script or None, inside a try block) of every call in a code cell.

    The script is the first positional argument or the ``script=`` keyword when it is a string literal, the
    literal ``script=`` values of dicts unpacked with ``**`` in the same cell, else None (not readable here).
    """
    try:
        tree = ast.parse(cell_source)
    except SyntaxError:                       # a cell with IPython magics: none in the course
        raise AssertionError(f"a code cell does not parse:\n{cell_source[:200]}")
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for b in t.body for n in ast.walk(b)}
    dict_scripts = [k.value.value for d in ast.walk(tree) if isinstance(d, ast.Call)
                    and getattr(d.func, "id", "") == "dict" for k in d.keywords
                    if k.arg == "script" and isinstance(k.value, ast.Constant)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "script"), None)
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                scripts = [given.value]
            elif given is None and any(k.arg is None for k in node.keywords):
                scripts = dict_scripts or [None]
            else:
                scripts = [None]
            for script in scripts:
                yield node.lineno, name, script, id(node) in guarded


def launched_and_shown(path):
    """{script: index of the first cell that launches it}, {script: index of the first cell that shows it},
    and the cells with a launch whose script cannot be read (not in a try block: a deliberate error)."""
    launched, shown, unknown = {}, {}, []
    cells = json.loads(path.read_text())["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        for _, name, first, in_try in sorted(calls("".join(cell["source"])), key=lambda c: c[0]):
            if name in LAUNCHERS and first is None and not in_try:
                unknown.append(i)
            if name in LAUNCHERS and isinstance(first, str) and (SCRIPTS_DIR / first).is_file():
                launched.setdefault(first, i)     # a missing one (an error demonstrated) has no code
            if name == "show_code" and isinstance(first, str):
                shown.setdefault(first if first.endswith(".py") else first + ".py", i)
    return launched, shown, unknown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_launch_is_preceded_by_its_code(path):
    launched, shown, unknown = launched_and_shown(path)
    assert not unknown, (f"{path.name}: cells {unknown} launch a script this check cannot read (a variable): "
                         "name the script as a string literal, so a reader sees which code runs")
    missing = {s: i for s, i in launched.items() if s not in shown or shown[s] > i}
    assert not missing, (f"{path.name}: these scripts are launched (cell index) before any show_code of them: "
                         f"{missing}; add show_code('SCRIPT', 'function', region='NAME') before the launch")


def test_the_notebook_check_finds_launches():
    """The check above reads real launches (it would pass vacuously if it found none)."""
    found = {p.stem: launched_and_shown(p)[0] for p in NOTEBOOKS}
    assert "hello_dist.py" in found["00_setup"] and "elastic_train.py" in found["12_fault_tolerance"]
    assert sum(map(len, found.values())) >= 25


def test_the_notebook_check_reads_every_way_a_script_is_named(tmp_path):
    """Positional, keyword and **dict launches are read; a launch through a variable is reported."""
    cells = ['show_code("hello_dist.py", region="hello")',
             'launch("case_gan.py", nproc=2)',
             'launch(script="case_bert.py", nproc=2)',
             'for bad in [dict(script="sync_async.py", nproc=0)]:\n    try:\n        launch(**bad)\n'
             '    except ValueError:\n        pass',
             'name = "zero_memory.py"\nlaunch(name, nproc=2)',
             'try:\n    launch(some_name, nproc=2)\nexcept FileNotFoundError:\n    pass']
    nb = tmp_path / "99_x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}))
    launched, shown, unknown = launched_and_shown(nb)
    assert launched == {"case_gan.py": 1, "case_bert.py": 2, "sync_async.py": 3} and shown == {"hello_dist.py": 0}
    assert unknown == [4]


def test_one_way_to_reach_a_script():
    """Notebooks reach a script's functions through load_script only, and print no source themselves."""
    for path in NOTEBOOKS:
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        for banned in ("spec_from_file_location", "inspect.getsource", "sys.path.insert(0, str(SCRIPTS_DIR))"):
            assert banned not in code, f"{path.name} uses {banned}: use mgpu_utils.source (load_script, show_code)"


def test_every_region_in_the_scripts_parses_and_is_shown():
    """A region marked in a script is shown by some lesson (no dead markers), and every shown part exists."""
    marked = {(p.name, r) for p in SCRIPTS_DIR.glob("*.py") for r in regions(p.read_text())}
    assert len(marked) >= 10
    shown = set()
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "show_code":
                    args = [ast.literal_eval(a) for a in node.args if isinstance(a, ast.Constant)]
                    kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                    if args and isinstance(args[0], str):
                        text = read_code(args[0], *args[1:], **kw)   # raises if a name or region is gone
                        long = [line for line in text.splitlines() if len(line) > WIDTH]
                        assert not long, f"{path.name}: shown lines over {WIDTH} characters: {long}"
                        script = args[0] if args[0].endswith(".py") else args[0] + ".py"
                        reg = kw.get("region", ())
                        shown |= {(script, r) for r in ([reg] if isinstance(reg, str) else reg)}
    assert marked <= shown, f"regions no lesson shows: {sorted(marked - shown)}"


def test_read_code_parts_and_header():
    text = read_code("hello_dist.py", region="hello")
    first = text.splitlines()[0]
    assert first.startswith("# launch_scripts/hello_dist.py, lines ")
    a, b = map(int, first.split("lines ")[1].split("-"))
    source = (SCRIPTS_DIR / "hello_dist.py").read_text().splitlines()
    assert "# region hello" in source[a - 2] and "# endregion" in source[b]
    assert "dist.all_reduce(t)" in text and "# region" not in text and not text.splitlines()[1].startswith(" ")
    two = read_code("sync_async.py", "run_ps", "run_worker")
    assert two.index("def run_ps") < two.index("def run_worker") and two.count("# launch_scripts/sync_async.py") == 2


def test_read_code_of_an_object():
    from mgpu_utils.parallel.ring import ring_schedule

    text = read_code(ring_schedule)
    assert text.startswith("# mgpu_utils/parallel/ring.py, lines 12-") and "def ring_schedule" in text


@pytest.mark.parametrize("args, kw, error, words", [
    (("nope.py",), {}, FileNotFoundError, "no launch script nope.py"),
    (("sync_async.py", "nope"), {}, ValueError, "has no function or class 'nope': it has functions flat_grad"),
    (("sync_async.py",), {"region": "nope"}, ValueError, "has no region 'nope'"),
    (("sync_async.py",), {}, ValueError, "say which part of sync_async.py to show"),
])
def test_read_code_errors_name_the_fix(args, kw, error, words):
    with pytest.raises(error, match=words):
        read_code(*args, **kw)


@pytest.mark.parametrize("text, words", [
    ("# region a\nx = 1\n", "has no '# endregion'"),
    ("# region a\n# region b\n# endregion\n", "opens inside region 'a'"),
    ("x = 1\n# endregion\n", "without a '# region NAME'"),
    ("# region a\n# endregion\n# region a\n# endregion\n", "defined twice"),
])
def test_bad_regions(text, words):
    with pytest.raises(ValueError, match=words):
        regions(text)


def test_definitions_include_methods_and_decorators():
    text = "import x\n\n@dec\ndef f():\n    pass\n\n\nclass C:\n    def m(self):\n        return 1\n"
    assert definitions(text) == {"f": (3, 5), "C": (8, 10), "C.m": (9, 10)}


def test_show_code_prints_outside_a_notebook(capsys):
    assert show_code("hello_dist.py", region="hello") is None
    assert "dist.all_reduce(t)" in capsys.readouterr().out
    listing = Listing("x = 1")
    assert listing._repr_markdown_() == "```python\nx = 1\n```" and repr(listing) == "x = 1"


def test_load_script_runs_no_main_and_is_cached():
    module = load_script("sync_async.py")
    assert module.__name__ == "sync_async" and callable(module.flat_grad)
    assert load_script("sync_async") is module and sys.modules["sync_async"] is module
    with pytest.raises(FileNotFoundError, match="one of allreduce_latency.py"):
        load_script("nope.py")


def test_fit_comments_moves_only_long_lines_comments():
    code = "x = 1  # short\nif x:\n    y = compute(x, x, x)  # " + "a long comment " * 6 + "\ns = '# not a comment'"
    out = fit_comments(code, width=60)
    assert out.splitlines() == ["x = 1  # short", "if x:", "    # " + ("a long comment " * 6).strip(),
                                "    y = compute(x, x, x)", "s = '# not a comment'"]
    assert fit_comments("f(1,  # cut mid-call", width=5) == "f(1,  # cut mid-call"   # does not tokenize: as is
    # a comment continued on the lines below, aligned under it, moves up whole (lesson 04's ring)
    code = "ops = post(send, recv)   # posted together: no\n                         # cycle of waiting sends\nwait(ops)"
    assert fit_comments(code, width=40).splitlines() == [
        "# posted together: no", "# cycle of waiting sends", "ops = post(send, recv)", "wait(ops)"]


def test_show_code_of_several_objects_shows_each():
    """Lesson 08 shows two functions in one call: both appear, in order (before, only the first did)."""
    from mgpu_utils.parallel import context

    text = read_code(context.ulysses_attention, context.merge)
    assert "def ulysses_attention(" in text and "def merge(" in text
    assert text.index("def ulysses_attention(") < text.index("def merge(")
    with pytest.raises(ValueError, match="as objects"):
        read_code(context.ulysses_attention, "merge")


def test_a_shell_file_of_the_course_is_shown_by_region(capsys):
    """Lesson 12 shows parts of cluster/slurm/job.sbatch: regions in a bash file, highlighted as bash."""
    text = read_code("cluster/slurm/job.sbatch", region="requeue")
    assert text.startswith("# cluster/slurm/job.sbatch, lines ") and "scontrol requeue" in text
    with pytest.raises(ValueError, match="has no region 'nope'.*regions signal, agents, requeue"):
        read_code("cluster/slurm/job.sbatch", region="nope")
    with pytest.raises(ValueError, match="say which part"):
        read_code("cluster/slurm/job.sbatch")
    assert Listing(text, "bash")._repr_markdown_().startswith("```bash\n")
    show_code("cluster/slurm/job.sbatch", region="signal")
    assert "trap stop_requested USR1" in capsys.readouterr().out
