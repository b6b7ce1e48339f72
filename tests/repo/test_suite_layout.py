"""Where a test goes (issue 61, docs/testing.md "Where a test goes"): every test file lives in one of four
folders of tests/ and is named after what it tests there, so that the name says where to look.

* ``tests/lessons/test_NN_<name>[_<part>].py``: one lesson, ``notebooks/NN_<name>.ipynb``;
* ``tests/package/test_<module>[_<part>].py``: one module of mgpu_utils outside grading/, its path under
  ``mgpu_utils/`` with ``_`` for ``/`` (``test_launch_warm.py``);
* ``tests/grading/test_<module>[_<part>].py``: a module of ``mgpu_utils/grading/`` (``test_runner.py``) or a
  topic of ``mgpu_utils/grading/coding/`` (``test_memory.py``), and every topic has its file;
* ``tests/repo/test_<rule or tool>.py``: the repository as a whole, never named like a lesson or a module.

A base name is used once across the folders: pytest imports a test file by its base name (no
``__init__.py``), and two files of one name stop the collection. Every ``tests/...`` path that a file of the
repository names exists.
"""
import os
import re
from pathlib import Path

import pytest

from mgpu_utils.grading.class_copy import LEFT_OUT, SOLUTIONS

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PKG = ROOT / "mgpu_utils"
FOLDERS = ("lessons", "package", "grading", "repo")
#: A class copy (make class-copy) has no worked solutions and leaves the graders' tests out with them.
CLASS_COPY = not (ROOT / SOLUTIONS).is_dir()

# `make mutation` runs the in-process tests in mutmut's copy of the repository: these tests check where files
# are and what they are called, not the mutated code, so they stand aside there (as tests/repo/test_docs.py does).
pytestmark = pytest.mark.skipif("MUTANT_UNDER_TEST" in os.environ or ROOT.name == "mutants",
                                reason="mutmut's copy of the repository: the files do not move")


#: Lessons whose tests come before their notebook, with why: their tests are named as the notebook will be.
PLANNED_LESSONS: dict[str, str] = {}


def lesson_names() -> set[str]:
    """``NN_<name>`` of every lesson notebook, and of the lessons planned (:data:`PLANNED_LESSONS`)."""
    return {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} | set(PLANNED_LESSONS)


def module_names(under: Path, skip: tuple[str, ...] = ()) -> set[str]:
    """Every module and room (a folder with ``__init__.py``) below ``under``, as its path with ``_`` for ``/``:
    ``launch/warm.py`` -> ``launch_warm``; the rooms in ``skip`` (and what they hold) left out."""
    names = set()
    for path in under.rglob("*.py"):
        parts = path.relative_to(under).with_suffix("").parts
        if "__pycache__" in parts or parts[0] in skip:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.add("_".join(parts))
    return names


def coding_topics() -> set[str]:
    return {p.stem for p in (PKG / "grading" / "coding").glob("*.py") if p.stem != "__init__"}


def allowed_names() -> dict[str, set[str]]:
    """Per folder, the names a test file's stem may start with (after ``test_``); tests/repo/ has no list (its
    files are named after a rule or a tool), only names it must not take (``repo_names_taken``)."""
    return {"lessons": lesson_names(),
            "package": module_names(PKG, skip=("grading",)),
            "grading": {n for n in module_names(PKG / "grading") if not n.startswith("coding")} | coding_topics(),
            "repo": set()}


def repo_names_taken(allowed: dict[str, set[str]]) -> set[str]:
    """What a file of tests/repo/ must not be called: a lesson's, a module's or a grader's name."""
    return allowed["lessons"] | allowed["package"] | allowed["grading"] | module_names(PKG)


def _named_after(name: str, heads: set[str]) -> bool:
    """Whether ``name`` is one of ``heads``, or one of them followed by ``_<part>``."""
    return any(name == h or name.startswith(h + "_") for h in heads)


def misplaced(paths: list[str], allowed: dict[str, set[str]]) -> list[str]:
    """The test files among ``paths`` (posix, relative to tests/) that break the rule, each with the reason."""
    bad, seen = [], {}
    for rel in sorted(paths):
        parts = rel.split("/")
        name = parts[-1]
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        seen.setdefault(name, []).append(rel)
        what = name[len("test_"):-len(".py")]
        if len(parts) != 2 or parts[0] not in FOLDERS:
            bad.append(f"{rel}: a test file lives in one of tests/{', tests/'.join(FOLDERS)}")
        elif parts[0] == "lessons" and not _named_after(what, allowed["lessons"]):
            bad.append(f"{rel}: a lesson's tests are named test_NN_<name>[_<part>].py after notebooks/NN_<name>.ipynb")
        elif parts[0] == "package" and not _named_after(what, allowed["package"]):
            bad.append(f"{rel}: a module's tests are named after its path under mgpu_utils/, '_' for '/' "
                       f"(test_launch_warm.py), and the graders' tests go to tests/grading/")
        elif parts[0] == "grading" and not _named_after(what, allowed["grading"]):
            bad.append(f"{rel}: a grader's tests are named after a module of mgpu_utils/grading/ (test_runner.py) or "
                       f"a topic of mgpu_utils/grading/coding/ (test_memory.py)")
        elif parts[0] == "repo" and (re.match(r"\d\d_", what) or what in repo_names_taken(allowed)):
            bad.append(f"{rel}: named like a lesson or a module: it goes to tests/lessons/ or tests/package/")
    bad += [f"{name}: one base name in {', '.join(rels)}" for name, rels in seen.items() if len(rels) > 1]
    return bad


def test_every_test_file_is_in_its_folder_and_named_after_what_it_tests():
    paths = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts]
    assert len(paths) > 40
    bad = misplaced(paths, allowed_names())
    assert not bad, "test files against the rule of docs/testing.md (\"Where a test goes\"):\n" + "\n".join(bad)


def test_every_coding_topic_has_its_file_of_right_and_wrong_solutions():
    if CLASS_COPY:
        pytest.skip("a class copy: make class-copy leaves tests/grading/ out with the worked solutions")
    missing = [t for t in sorted(coding_topics()) if not (TESTS / "grading" / f"test_{t}.py").is_file()]
    assert missing == [], f"add tests/grading/test_<topic>.py with RIGHT and WRONG tables for {missing}"


def test_the_rule_is_written_where_docs_testing_md_says():
    text = (ROOT / "docs" / "testing.md").read_text()
    assert "## Where a test goes" in text
    assert all(f"`tests/{folder}/`" in text for folder in FOLDERS)


def texts():
    """(path, text) of the repository's text files, this one left out (its examples name paths on purpose)."""
    paths = [ROOT / n for n in ("README.md", "Makefile", "pyproject.toml", "environment.yml")]
    for folder in ("docs", "notebooks", "exercises", "mgpu_utils", "launch_scripts", "benchmarks", "cluster", "tests",
                   ".ci", "jupyter"):
        paths += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and ".ipynb_checkpoints" not in p.parts)
    for path in paths:
        if path.suffix not in (".md", ".py", ".ipynb", ".sh", ".sbatch", ".toml", ".yml", ".cfg", ".txt", "") \
                or path.resolve() == Path(__file__).resolve():
            continue
        try:
            yield path.relative_to(ROOT).as_posix(), path.read_text()
        except UnicodeDecodeError:
            continue


#: a path under tests/ (``tests/repo/test_docs.py``, ``tests/scripts``, a glob ``tests/*/test_*.py``); one that
#: runs on into a placeholder (``tests/grading/test_<topic>.py``) is a pattern, not a path, and not matched
TESTS_PATH = re.compile(r"(?<![\w./-])tests/[\w./*-]*[\w*](?![\w./*<{-])")


def missing_test_paths(where: str, text: str) -> list[str]:
    """The paths under tests/ that ``text`` names and the tree lacks (a glob: that matches nothing)."""
    bad = []
    for m in TESTS_PATH.finditer(text):
        path = m.group(0)
        if CLASS_COPY and any(path.startswith(f"{folder.as_posix()}/") for folder in LEFT_OUT):
            continue                                      # left out of a class copy on purpose
        if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
            bad.append(f"{where}: {path}")
    return bad


def test_every_tests_path_named_in_the_repository_exists():
    """A moved or renamed test file leaves no stale name behind: in the Makefile, CI, docs, docstrings,
    comments or notebooks."""
    bad = [b for where, text in texts() for b in missing_test_paths(where, text)]
    assert bad == [], "\n".join(bad)


# ---- the checks themselves: each must fail on what it is there to catch -------------------------------------

def test_the_checks_catch_what_they_are_for():
    allowed = allowed_names()
    assert {"03_ddp", "12_fault_tolerance"} <= allowed["lessons"]
    assert {"dist", "launch_warm", "launch", "costs_memory_model"} <= allowed["package"]
    assert not {"grading", "grading_runner", "warm"} & allowed["package"]
    assert {"dist", "runner", "memory", "03_ddp", "grading_runner"} <= repo_names_taken(allowed)
    assert {"runner", "quiz", "bulk", "memory", "collectives"} <= allowed["grading"]
    good = ["lessons/test_03_ddp.py", "lessons/test_03_ddp_wild.py", "package/test_launch_warm.py",
            "package/test_dist.py", "grading/test_runner.py", "grading/test_memory_zero1.py", "repo/test_docs.py",
            "conftest.py", "helpers.py", "scripts/misbehave.py"]
    assert misplaced(good, allowed) == []
    wrong = ["test_ddp.py",                         # left at the top
             "misc/test_x.py",                      # a folder that is not one of the four
             "lessons/sub/test_03_ddp.py",          # one folder too deep
             "lessons/test_dp.py",                  # no lesson number
             "lessons/test_13_ddp.py",              # no such lesson
             "lessons/test_03_dd.py",               # not the lesson's name
             "lessons/test_03_ddpwild.py",          # the part not set off by '_'
             "package/test_warm.py",                # the module is launch/warm.py
             "package/test_grading_runner.py",      # a grader: tests/grading/
             "grading/test_zero1.py",               # no such grading module or topic
             "grading/test_coding_memory.py",       # a topic is named by itself
             "repo/test_dist.py",                   # a module's tests: tests/package/
             "repo/test_runner.py",                 # a grader's tests: tests/grading/
             "repo/test_03_ddp_again.py"]           # a lesson's tests: tests/lessons/
    assert [b.split(":")[0] for b in misplaced(wrong, allowed)] == sorted(wrong)
    assert misplaced(["lessons/test_timing.py", "package/test_timing.py"], allowed) == [
        "lessons/test_timing.py: a lesson's tests are named test_NN_<name>[_<part>].py after notebooks/NN_<name>.ipynb",
        "test_timing.py: one base name in lessons/test_timing.py, package/test_timing.py"]
    assert missing_test_paths("x", "see tests/helpers.py, tests/scripts/ and `tests/repo/test_docs.py`, "
                                   "tests/grading/test_<topic>.py, tests/*/test_*.py.") == []
    assert missing_test_paths("x", "(tests/test_docs.py), tests/lessons/test_99_x.py::test_y, "
                                   "tests/test_grading_*.py") == [
        "x: tests/test_docs.py", "x: tests/lessons/test_99_x.py", "x: tests/test_grading_*.py"]
