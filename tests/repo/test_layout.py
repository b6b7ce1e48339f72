"""The package's layout (issue 30): rooms by role, one home per idea, nothing at import time, and test
markers that say what a test does."""
import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import ProcessStarted

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "mgpu_utils"
MODULES = sorted(PKG.rglob("*.py"))


def _defs() -> dict[str, list[str]]:
    out = defaultdict(list)
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                out[node.name].append(str(path.relative_to(ROOT)))
    return out


def test_at_most_twelve_modules_at_the_top_and_the_rest_in_rooms():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 12, top
    rooms = sorted(p.parent.name for p in PKG.glob("*/__init__.py"))
    assert rooms == ["costs", "figures", "grading", "launch", "measure", "parallel"]
    init = (PKG / "__init__.py").read_text()
    for room in rooms:                                  # the map names every room, one line each
        assert len(re.findall(rf"^\* ``{room}``", init, re.M)) == 1, room


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_every_module_says_what_it_is_for_and_which_lessons_use_it(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.name} has no docstring"
    first = doc.split("\n\n")[0]
    assert re.search(r"lesson|notebooks/\d\d", first, re.I), f"{path.name}: the first paragraph names no lesson"


def test_one_definition_of_each_public_name():
    twice = {k: v for k, v in _defs().items() if len(v) > 1 and not k.startswith("_") and k != "main"}
    assert not twice, twice
    defs = _defs()
    for name in ("ring_bytes_per_rank", "plot_timeline", "plot_losses", "choose_backend"):
        assert len(defs[name]) == 1, (name, defs[name])


def test_the_ring_all_reduce_bytes_are_written_once():
    """2(n-1)/n: in bandwidth.py's busbw factors and nowhere else in the package or the launch scripts."""
    pattern = re.compile(r"2\s*\*\s*\((\w+)\s*-\s*1\)\s*/\s*\1\b")
    hits = [str(p.relative_to(ROOT)) for p in [*MODULES, *(ROOT / "launch_scripts").glob("*.py")]
            if pattern.search(re.sub(r'""".*?"""|#.*', "", p.read_text(), flags=re.S))]
    assert hits == ["mgpu_utils/costs/bandwidth.py"], hits


def test_no_star_imports_and_no_reexports_in_the_rooms():
    for path in MODULES:
        tree = ast.parse(path.read_text())
        assert not any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
                       for n in ast.walk(tree)), path
        if path.name == "__init__.py":
            assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], path


def test_importing_the_package_and_its_rooms_imports_no_torch(starts_processes):
    code = ("import sys, mgpu_utils, mgpu_utils.launch, mgpu_utils.parallel, mgpu_utils.costs, mgpu_utils.measure, "
            "mgpu_utils.figures, mgpu_utils.grading\nprint('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


CODING = sorted((PKG / "grading" / "coding").glob("[!_]*.py"))


@pytest.mark.parametrize("path", CODING, ids=lambda p: p.stem)
def test_every_problem_a_coding_module_reports_has_its_hint_in_the_same_module(path):
    """Each lesson's checks and the hints of the problems they report sit together, and the catalog has its
    exercises."""
    import importlib

    from mgpu_utils.grading.catalog import EXERCISES

    module = importlib.import_module(f"mgpu_utils.grading.coding.{path.stem}")
    kinds = set(re.findall(r'"kind":\s*"(\w+)"', path.read_text()))
    assert kinds and kinds <= set(module.HINTS), kinds - set(module.HINTS)
    assert module.EXERCISES and all(e.hints is module.HINTS and EXERCISES[e.id] is e for e in module.EXERCISES)


def test_a_problem_gets_the_hint_of_its_exercise():
    """A kind is local to its lesson's module: "param" is one hint in 03 and another in 05."""
    from mgpu_utils.grading.runner import problem_hint

    param = {"rank": 0, "kind": "param", "what": "grad", "max_diff": 0.5}
    assert problem_hint("05.4", param, 2) == "rank 0: gradients differ from one process's by 0.5 (world size 2)"
    assert problem_hint("03.4", param, 2).startswith("rank 0: after three steps the parameters differ from DDP's")
    assert problem_hint("04.4", {"rank": 1, "kind": "shape", "got": "3", "want": "4"}, 2) == \
        "rank 1: returned 3, expected 4"


def test_an_in_process_test_that_starts_a_process_is_stopped():
    """This test is not marked `launches`: the guard refuses every way of starting a process."""
    import os

    from mgpu_utils.launch import warm

    with pytest.raises(ProcessStarted, match="starts_processes"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(ProcessStarted):
        os.fork()
    with pytest.raises(ProcessStarted):
        warm.get_template({}, wait=False)


def test_the_markers_follow_the_fixture(request, starts_processes):
    assert request.node.get_closest_marker("launches")


def _imports(path: Path) -> set[str]:
    """The mgpu_utils modules ``path`` imports, at its top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mgpu_utils"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if (PKG.parent / (sub.replace(".", "/") + ".py")).is_file() else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mgpu_utils")}
    return out


def test_the_import_graph_has_no_circle():
    """A module never needs, even lazily inside a function, a module that needs it: each room can be read
    (and tested) from the bottom up."""
    def name(p):
        return ".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
    graph = {name(p): _imports(p) - {name(p)} for p in MODULES}
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
        if state.get(m) == 2 or m not in graph:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


ROOMS = ("launch", "parallel", "costs", "measure", "figures", "grading")


def _imported(path: Path) -> set[str]:
    """Every mgpu_utils module ``path`` imports, at any depth of its code (a function's import counts)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mgpu_utils"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mgpu_utils")}
    return out


def test_no_import_runs_back_up_from_the_top_modules_into_the_rooms():
    """Issue 61: the modules at the top (the runtime a launch script needs, data, models, clocks, text) import
    no room; only ``course``, every lesson's setup, stands above them. dist.py once imported launch/cluster.py."""
    up = {p.name: sorted(m for m in _imported(p) if m.split(".")[1] in ROOMS)
          for p in PKG.glob("*.py") if p.name not in ("__init__.py", "course.py")}
    assert not any(up.values()), {k: v for k, v in up.items() if v}


def _map_names(init_doc: str, room: str | None) -> set[str]:
    """The ``names`` of the package map in mgpu_utils/__init__.py: of the bullet of ``room``, or (None) of the
    bullets before the rooms."""
    top, rooms = init_doc.split("Subpackages", 1)
    if room is None:
        return set(re.findall(r"``(\w+)``", top))
    bullet = re.search(rf"^\* ``{room}``(.*?)(?=^\* ``|\Z)", rooms, re.S | re.M).group(1)
    return set(re.findall(r"``(\w+)``", bullet))


def _arch_names(arch: str, room: str) -> str:
    return re.search(rf"^\| `mgpu_utils/{room}/` \|(.*)$", arch, re.M).group(1)


def test_the_package_map_and_docs_architecture_name_every_module():
    """Issue 61: every module of mgpu_utils is named in the package map (mgpu_utils/__init__.py) and in
    docs/architecture.md; grading/coding's modules are named as figures' are (one per lesson topic)."""
    init = ast.get_docstring(ast.parse((PKG / "__init__.py").read_text()))
    arch = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if path.name == "__init__.py":
            continue
        name = path.stem
        if len(rel.parts) == 1:
            in_map, in_arch = name in _map_names(init, None), f"`mgpu_utils/{path.name}`" in arch
        else:
            room = rel.parts[0]
            in_map = name in _map_names(init, room) or (rel.parts[1] == "coding" and name in _map_names(init, "figures"))
            row = _arch_names(arch, room)
            in_arch = f"`{name}`" in (row.split("`coding/`")[1] if rel.parts[1] == "coding" else row.split("`coding/`")[0])
        if not in_map:
            missing.append(f"{rel}: not in mgpu_utils/__init__.py's map")
        if not in_arch:
            missing.append(f"{rel}: not in docs/architecture.md")
    assert not missing, missing
    coding = {p.stem for p in (PKG / "grading" / "coding").glob("*.py")} - {"__init__"}
    figures = {p.stem for p in (PKG / "figures").glob("*.py")} - {"__init__"}
    assert coding <= figures, coding - figures
