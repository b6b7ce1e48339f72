"""Colab in one click (README, "Colab"): the badges and every notebook's setup cell come from one setting,
and that first cell, run in a simulated Colab (a stand-in `google.colab` module, a temporary folder for
/content, this repository as the address to clone), clones the course, imports mgpu_utils from the clone
and says what differs on Colab."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mgpu_utils import colab

ROOT = Path(__file__).resolve().parents[2]

RUNNER = """
import os, sys, types
# what Colab's kernel has: google.colab imported; and no mgpu_utils installed (hide this venv's editable one)
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != {root!r}]
if {colab}:
    sys.modules["google"] = types.ModuleType("google")
    sys.modules["google.colab"] = types.ModuleType("google.colab")
src = open({cell!r}).read()
import linecache   # as IPython does for a cell: a traceback shows the cell's lines
linecache.cache["<first cell>"] = (len(src), None, src.splitlines(True), "<first cell>")
try:
    exec(compile(src, "<first cell>", "exec"))
except Exception:
    import traceback
    traceback.print_exc()   # from linecache, as Jupyter shows an error
    sys.exit(1)
import mgpu_utils
print("MGPU_FILE", mgpu_utils.__file__)
print("CWD", os.getcwd())
"""


def _first_cell(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def _run_first_cell(tmp_path: Path, on_colab: bool = True):
    setup = colab.setup_source()                  # the block every notebook starts with (checked below)
    (tmp_path / "cell.py").write_text(setup)
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "runner.py").write_text(RUNNER.format(root=str(ROOT), colab=on_colab, cell=str(tmp_path / "cell.py")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MGPU_COLAB_ROOT=str(tmp_path / "content"), MGPU_REPO_URL=f"file://{ROOT}",
               CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(tmp_path / "runner.py")], cwd=tmp_path / "work", env=env,
                          capture_output=True, text=True, timeout=240)


def test_badges_and_setup_cells_agree_with_the_repository_setting():
    assert colab.sync(check=True) == [], "run `python -m mgpu_utils.colab` after changing [project.urls] Repository"
    setup = colab.setup_source()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert _first_cell(path).startswith(setup), f"{path.name}: the first cell does not start with the setup block"
    readme = (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert colab.colab_link(path.name) in readme
    assert "<owner>" not in readme and "<this repository" not in readme


def test_the_badges_are_a_column_of_the_lesson_table():
    """Issue 61: one badge per lesson row (the README's separate badge list took 29% of its headroom)."""
    row = "| [`00_setup.ipynb`](notebooks/00_setup.ipynb) | setup | 0.3 | 0 | old |"
    readme = f"{row}\n\n{colab.BADGE_REFERENCE}\n"
    fixed = colab.with_badges(readme, ["00_setup.ipynb"], "https://github.com/a/b")
    assert fixed.splitlines()[0] == row.replace("old", colab.badge("00_setup.ipynb", "https://github.com/a/b"))
    assert colab.with_badges(fixed, ["00_setup.ipynb"], "https://github.com/a/b") == fixed
    with pytest.raises(ValueError, match="one row for 01_gpu.ipynb"):
        colab.with_badges(readme, ["00_setup.ipynb", "01_gpu.ipynb"], "https://github.com/a/b")
    with pytest.raises(ValueError, match=r"lacks the line '\[colab\]: "):
        colab.with_badges(row, ["00_setup.ipynb"], "https://github.com/a/b")


def test_links_and_settings_fail_with_the_fix(tmp_path):
    assert colab.colab_link("00_setup.ipynb", "https://github.com/a-b/c.d.git") == \
        "https://colab.research.google.com/github/a-b/c.d/blob/main/notebooks/00_setup.ipynb"
    with pytest.raises(ValueError, match="GitHub repositories only"):
        colab.colab_link("00_setup.ipynb", "https://gitlab.com/a/b")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(KeyError, match=r"\[project.urls\] Repository"):
        colab.repo_url(tmp_path)


def test_first_cell_clones_on_simulated_colab(tmp_path, starts_processes):
    course = tmp_path / "content" / "course"
    first = _run_first_cell(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"Colab: cloning file://{ROOT} into {course}" in first.stdout
    assert (course / "mgpu_utils" / "__init__.py").is_file() and (course / "launch_scripts").is_dir()
    assert f"MGPU_FILE {course / 'mgpu_utils' / '__init__.py'}" in first.stdout
    assert f"CWD {course / 'notebooks'}" in first.stdout
    import torch
    assert f"On Colab: 0 GPUs; torch {torch.__version__}" in first.stdout
    assert "multi-rank launches run as CPU processes over gloo" in first.stdout

    again = _run_first_cell(tmp_path)                # the cell again in the same runtime: nothing to do
    assert again.returncode == 0, again.stdout + again.stderr
    assert "cloning" not in again.stdout
    assert f"MGPU_FILE {course / 'mgpu_utils' / '__init__.py'}" in again.stdout


def test_first_cell_replaces_an_interrupted_clone(tmp_path, starts_processes):
    course = tmp_path / "content" / "course"
    (course / "notebooks").mkdir(parents=True)               # a clone that stopped before mgpu_utils/
    r = _run_first_cell(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Colab: cloning" in r.stdout and (course / "mgpu_utils" / "__init__.py").is_file()


def test_first_cell_outside_colab_without_the_course_says_what_to_do(tmp_path, starts_processes):
    r = _run_first_cell(tmp_path, on_colab=False)
    assert r.returncode != 0 and "No module named 'mgpu_utils'" in r.stderr
    assert "ImportError? `make lab`, kernel Python (mgpu-course)" in r.stderr   # the traceback shows the line
    assert not (tmp_path / "content").exists()
