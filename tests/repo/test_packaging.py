"""Repository contracts: pins agree, launch scripts follow the style, notebooks follow the lesson shape."""
import ast
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCRIPTS = sorted((ROOT / "launch_scripts").glob("*.py"))


def _pins(lines):
    return {re.split(r"==", s)[0].lower(): s.split("==")[1] for s in lines if "==" in s}


def test_environment_yml_and_pyproject_pin_the_same_packages():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _pins(deps) == _pins(pip_section)
    assert _pins(deps)["torch"] == "2.14.1" and _pins(deps)["torchvision"] == "0.29.1"
    assert all("==" in d for d in deps), "every dependency is pinned"


def test_readme_shows_the_two_commands_and_every_notebook():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme and "make course" in readme
    for nb in NOTEBOOKS:
        assert nb.name in readme, f"{nb.name} missing from the README's notebook table"


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_launch_script_style(script):
    text = script.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert doc, "module docstring"
    last = doc.strip().splitlines()[-1].strip()
    pattern = rf"(\w+=\S+ )*torchrun --standalone --nproc-per-node 4( --[\w-]+ \S+)* launch_scripts/{re.escape(script.name)}( .*)?"
    assert re.fullmatch(pattern, last), f"docstring must end with the torchrun command, got: {last}"
    assert len(text.splitlines()) <= 200
    assert "emit_result(" in text and "distributed(" in text
    assert "MASTER_PORT" not in text and "mp.spawn" not in text


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_launch_script_imports_no_other_launch_script(script):
    """A reader of one script opens at most mgpu_utils: shared code lives there, not in another script."""
    names = {s.stem for s in SCRIPTS}
    imported = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & names, f"{script.name} imports launch script(s) {sorted(imported & names)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_launch_script_ends_through_distributed(script):
    """The ``with distributed()`` block is the last statement of main(), and main() the last call of the
    script: the rank ends through mgpu_utils.dist.shutdown (os._exit), so code after it would never run."""
    tree = ast.parse(script.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    last = main.body[-1]
    assert isinstance(last, ast.With) and any(
        isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", "") == "distributed"
        for i in last.items), f"{script.name}: main() must end with its `with distributed() as ctx:` block"
    guard = tree.body[-1]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "__name__ == '__main__'"
    assert [ast.unparse(s) for s in guard.body] == ["main()"], f"{script.name}: end with `main()` under the guard"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shape_and_clean_outputs(nb_path):
    nb = json.loads(nb_path.read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for part in ("Learning objectives", "Exercises", "Summary"):
        assert part in md, f"{nb_path.name} lacks '{part}'"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert sum('check("' in "".join(c["source"]) for c in code) >= 2, "at least two checked exercises"
    assert any("assert" in "".join(c["source"]) for c in code)
    assert any(c.get("outputs") for c in code), "commit notebooks with outputs from the CPU run"
    for c in code:
        for o in c.get("outputs", []):
            assert o["output_type"] != "error", f"stored error in {nb_path.name}"
            if o.get("name") == "stderr":
                assert "Warning" not in "".join(o["text"]), f"stored warning in {nb_path.name}"
        src = "".join(c["source"]).rstrip()
        if re.search(r"\b(plot|draw)_\w+\(", src.splitlines()[-1] if src else ""):
            assert src.endswith(";"), f"plot cells end with ';' ({nb_path.name})"


_MACHINE_PATH = re.compile("|".join([re.escape(str(ROOT)), r"/home/", r"/root/", r"/tmp/", r"/content/"]))


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_from_one_clean_pass(nb_path):
    """Outputs of a top-to-bottom run in a fresh kernel, readable on any machine: execution counts 1..n,
    no machine's absolute path, no stale '(planned)' for a lesson that exists, and no stderr stream: a
    warning (a FutureWarning, matplotlib's findfont) is something a student should never see."""
    nb = json.loads(nb_path.read_text())
    counts = [c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{nb_path.name}: execution counts {counts}, expected 1..n"
    for i, c in enumerate(nb["cells"]):
        assert "(planned)" not in "".join(c["source"]), f"{nb_path.name} cell {i}: '(planned)'"
        for o in c.get("outputs", []):
            text = json.dumps(o)
            assert "(planned)" not in text, f"{nb_path.name} cell {i}: '(planned)' in an output"
            if o.get("output_type") == "stream" and o.get("name") == "stderr":
                raise AssertionError(f"{nb_path.name} cell {i}: stderr in the output: {''.join(o['text'])[:300]}")
            m = _MACHINE_PATH.search(text)
            assert not m, f"{nb_path.name} cell {i}: machine path in output: ...{text[max(0, m.start() - 80):m.end() + 40]}"


def test_notebooks_compare_enough_outputs_and_none_is_a_fixed_sentence():
    """nbval compares the outputs of the cells marked NBVAL_CHECK_OUTPUT: at least 30 of them, and each
    one's stored output must be computed (a line of it that is also written in the cell's source would
    be a sentence that can never change)."""
    marked = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, c in enumerate(json.loads(nb_path.read_text())["cells"]):
            src = "".join(c["source"])
            if c["cell_type"] == "code" and "NBVAL_CHECK_OUTPUT" in src:
                text = "".join("".join(o.get("text", "")) for o in c.get("outputs", []) if o.get("output_type") == "stream")
                lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
                assert lines, f"{nb_path.name} cell {i}: marked for comparison but prints nothing"
                fixed = [ln for ln in lines if ln in src]
                assert len(fixed) < len(lines), f"{nb_path.name} cell {i}: every printed line is written in the source: {fixed[:2]}"
                marked.append((nb_path.name, i))
    assert len(marked) >= 30, f"only {len(marked)} cells are compared by nbval"


def test_exit_stress_knows_every_launch_script():
    """benchmarks/exit_stress.py launches every script with small arguments: a new script needs its entry."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("exit_stress", ROOT / "benchmarks" / "exit_stress.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert set(mod.CASES) == {p.name for p in SCRIPTS}


def _scratch_left(cells: list[str]) -> list[str]:
    """Names bound to a ``tempfile.mkdtemp`` folder in these code cells that no later ``shutil.rmtree`` removes."""
    made, removed = [], set()
    for src in cells:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Assign) and any(isinstance(c, ast.Call) and getattr(c.func, "attr", "") ==
                                                    "mkdtemp" for c in ast.walk(node.value)):
                made += [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "rmtree" and node.args:
                removed |= {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
    return [m for m in made if m not in removed]


def test_notebooks_remove_their_scratch_folders():
    """A lesson's checkpoints and dumps go to a temporary folder it removes at the end: a student who runs the
    course ten times keeps no ten copies in /tmp (lesson 03 left 9.6 MB per run)."""
    assert _scratch_left(["import tempfile\nW = tempfile.mkdtemp()\n"]) == ["W"]           # the check can fail
    assert _scratch_left(["F = os.path.join(tempfile.mkdtemp(), 'x')", "shutil.rmtree(os.path.dirname(F))"]) == []
    for nb in NOTEBOOKS:
        cells = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
        assert not _scratch_left(cells), f"{nb.name}: add shutil.rmtree({_scratch_left(cells)[0]}) at the end"


def test_exit_stress_scratch_is_removed_when_its_process_exits(tmp_path, starts_processes):
    """The stress run's (and pytest's) checkpoint folders lie in one folder, gone when the process exits."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'benchmarks'); import exit_stress as e; "
            "a, b = e.scratch(), e.scratch(); open(a + '/x', 'w').write('x'); print(a); print(b)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "TMPDIR": str(tmp_path)}, check=True).stdout.split()
    assert len(out) == 2 and out[0] != out[1] and Path(out[0]).parent == Path(out[1]).parent
    assert list(tmp_path.iterdir()) == [], "exit_stress.scratch() left a folder behind"


def test_lesson_00_lists_every_launch_script_in_its_committed_output():
    """Lesson 00 shows launch()'s 'Available:' list in a # NBVAL_CHECK_OUTPUT cell, which the browser test
    compares with a fresh run: a new script makes that list stale (hybrid_3d.py did). Caught here in a second."""
    nb = json.loads((ROOT / "notebooks" / "00_setup.ipynb").read_text())
    text = next("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                for o in c.get("outputs", []) if "Available: " in "".join(o.get("text", "")))
    listed = re.findall(r"[\w]+\.py", " ".join(text.split("Available: ", 1)[1].split()))
    assert sorted(listed) == sorted(p.name for p in SCRIPTS), "re-run notebooks/00_setup.ipynb and commit it"


def test_no_symbolic_link_is_tracked(starts_processes):
    """A link committed by mistake (a `.venv` linked into a worktree) breaks every fresh clone: `make` finds a
    dangling .venv and stops. Found when a fresh clone failed in 1 s; .gitignore now ignores `.venv` itself."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("SKIPPED: not a git checkout (an sdist or a copy): nothing tracked to check")
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=root, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in staged.splitlines() if line.startswith("120000")]
    assert not links, f"symbolic links are tracked: {links}; git rm --cached them"
