"""Colab in one click: the repository's address, the "Open in Colab" badges and the setup cell of every
lesson (00-12), all made from one setting (README, "Colab").

The address is ``[project.urls] Repository`` in ``pyproject.toml``. ``python -m mgpu_utils.colab`` writes
it into the first cell of every notebook (which clones the course when it runs on Colab without it) and
into the Colab column of the README's lesson table; ``--check`` only compares, and
``tests/package/test_colab.py`` runs that check, so a changed address fails the tests until the copies are
regenerated.

Usage::

    python -m mgpu_utils.colab           # after changing [project.urls] Repository
    python -m mgpu_utils.colab --check   # exit status 1 if a notebook or the README differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mgpu_utils.env import REPO_ROOT as ROOT

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: the README defines the badge's image once, as a Markdown reference: ``[colab]: BADGE_IMAGE``
BADGE_REFERENCE = f"[colab]: {BADGE_IMAGE}"
SETUP_END = "from mgpu_utils.course import start; start()"   # how the setup block's last line starts

SETUP_TEMPLATE = '''\
# Setup: make the course importable. In a clone it is this folder or a parent; on Colab the first
# run clones it into /content/course (URL is written here from pyproject.toml). See lesson 00.
import os, pathlib, subprocess, sys
URL = os.environ.get("MGPU_REPO_URL", "{url}")
clone = pathlib.Path(os.environ.get("MGPU_COLAB_ROOT", "/content")) / "course"
if "google.colab" in sys.modules and not (clone / "mgpu_utils/__init__.py").is_file():
    print(f"Colab: cloning {{URL}} into {{clone}} ...")
    subprocess.run(f"rm -rf {{clone}}; git clone -q --depth 1 {{URL}} {{clone}}", shell=True, check=True)
here = pathlib.Path.cwd().resolve()
roots = [r for r in (here, *here.parents, clone) if (r / "mgpu_utils/__init__.py").is_file()]
if roots:
    sys.path.insert(0, str(roots[0]))
from mgpu_utils.course import start; start()  # ImportError? `make lab`, kernel Python (mgpu-course)'''


def repo_url(root: Path = ROOT) -> str:
    """The course repository's address: ``[project.urls] Repository`` of ``root/pyproject.toml``.

    Raises:
        KeyError: the setting is missing (add it under ``[project.urls]``).
    """
    import tomllib

    with open(root / "pyproject.toml", "rb") as f:
        urls = tomllib.load(f)["project"].get("urls", {})
    if "Repository" not in urls:
        raise KeyError("pyproject.toml has no [project.urls] Repository: add the course's GitHub address there")
    return urls["Repository"].rstrip("/")


def colab_link(notebook: str, url: str | None = None, branch: str = "main") -> str:
    """Colab's address that opens ``notebooks/<notebook>`` of the GitHub repository ``url``.

    Raises:
        ValueError: ``url`` is not a ``https://github.com/<owner>/<repo>`` address (Colab opens only those).
    """
    url = url or repo_url()
    m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(\.git)?", url)
    if not m:
        raise ValueError(f"Colab opens GitHub repositories only; {url!r} is not https://github.com/<owner>/<repo>")
    return f"https://colab.research.google.com/github/{m[1]}/{m[2]}/blob/{branch}/notebooks/{notebook}"


def setup_source(url: str | None = None) -> str:
    """The setup block that starts the first code cell of every notebook, for repository ``url``."""
    return SETUP_TEMPLATE.format(url=url or repo_url())


def badge(notebook: str, url: str | None = None) -> str:
    """The "Open in Colab" badge of one notebook, as the last cell of its row in the README's lesson table."""
    return f"[![Open in Colab][colab]]({colab_link(notebook, url)})"


def with_badges(readme: str, notebooks: list[str], url: str | None = None) -> str:
    """``readme`` with the last cell of every notebook's row of the lesson table (the row that starts with
    ``| [`NN_name.ipynb`]``) set to that notebook's badge.

    Raises:
        ValueError: a notebook has no row, or more than one, or the README lacks :data:`BADGE_REFERENCE`.
    """
    if BADGE_REFERENCE not in readme.splitlines():
        raise ValueError(f"README.md lacks the line {BADGE_REFERENCE!r} (the badge's image, defined once)")
    for name in notebooks:
        row = re.compile(r"^(\| \[`" + re.escape(name) + r"`\].*\| )[^|]*( \|)$", re.M)
        if len(row.findall(readme)) != 1:
            raise ValueError(f"README.md: the lesson table needs one row for {name} ending with a Colab column")
        readme = row.sub(lambda m: m.group(1) + badge(name, url) + m.group(2), readme)
    return readme


def pinned_torch(root: Path = ROOT) -> str:
    """The torch release ``root/pyproject.toml`` pins (``"torch==X"``), e.g. ``"2.14.1"``; ``"?"`` if none."""
    import tomllib

    with open(root / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"].get("dependencies", [])
    return next((d.split("==", 1)[1] for d in deps if d.replace(" ", "").startswith("torch==")), "?")


def colab_notes() -> str:
    """What differs on Colab: its GPUs, its torch against the pinned one, and where the multi-rank
    launches run (gloo on CPU unless there is one GPU per rank). Printed by every notebook's setup cell
    on Colab.

    Returns:
        Three lines of text, each at most 100 characters (four where Colab's torch is older than
        :data:`mgpu_utils.compat.OLDEST_TORCH`, with the command that fixes it).
    """
    import torch

    from mgpu_utils.compat import OLDEST_TORCH
    n = torch.cuda.device_count()
    gpus = f"{n} GPU ({torch.cuda.get_device_name(0)})" if n == 1 else f"{n} GPUs"
    old = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < OLDEST_TORCH
    oldest = ".".join(map(str, OLDEST_TORCH))
    return "\n".join([
        f"On Colab: {gpus}; torch {torch.__version__} (Colab's own; the course pins {pinned_torch()})",
        *([f"  the course needs torch {oldest} or newer: !pip install 'torch>={oldest}',"
           " then Runtime > Restart session"] if old else []),
        "  multi-rank launches run as CPU processes over gloo (NCCL needs one GPU per rank)",
        "  a launch with nproc=1 uses the GPU" if n else "  no GPU here: Runtime > Change runtime type adds one",
    ])


def _notebooks(root: Path) -> list[Path]:
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def sync(root: Path = ROOT, check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) the setup block of every notebook and the README's Colab column.

    Returns:
        The files that differ (``check``) or were rewritten.

    Raises:
        ValueError: a notebook's first code cell is not a setup block (it must end with
            :data:`SETUP_END` on its last line, as :data:`SETUP_TEMPLATE` does); the README's lesson table
            lacks a notebook's row (:func:`with_badges`).
    """
    import nbformat

    url, changed = repo_url(root), []
    block = setup_source(url)
    for path in _notebooks(root):
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if c.cell_type == "code")
        if SETUP_END not in cell.source.rsplit("\n", 1)[-1]:
            raise ValueError(f"{path.name}: the first code cell is not the setup block (its last line starts with {SETUP_END!r})")
        if cell.source != block:
            changed.append(path.name)
            if not check:
                cell.source = block
                nbformat.write(nb, path)
    readme = root / "README.md"
    text = readme.read_text()
    new_text = with_badges(text, [p.name for p in _notebooks(root)], url)
    if new_text != text:
        changed.append("README.md")
        if not check:
            readme.write_text(new_text)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the repository address into the notebooks and README.")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if something differs")
    args = parser.parse_args(argv)
    changed = sync(check=args.check)
    verb = "differ from" if args.check else "rewritten from"
    print(f"{len(changed)} file(s) {verb} pyproject.toml's Repository ({repo_url()}): {changed}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
