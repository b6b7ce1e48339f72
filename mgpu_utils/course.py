"""The course's notebooks: every lesson's setup call (:func:`start`, lessons 00-12), and running every
notebook in order, headless, into ``build/`` (``make course``).

Writes ``build/NAME.ipynb`` (executed, with outputs) and ``build/NAME.html``, then prints a table
notebook / seconds / status. While a notebook runs, a bar shows which cell of how many. Exits with
status 1 if any notebook failed.

Usage::

    python -m mgpu_utils.course --out build notebooks            # all notebooks
    python -m mgpu_utils.course --out build notebooks/03_ddp.ipynb
    python -m mgpu_utils.course --slides --out build/slides notebooks   # slide decks (make slides)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

#: a terminal colour code, as IPython writes them into tracebacks
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def start() -> None:
    """What every lesson's setup cell calls once ``mgpu_utils`` is importable (lessons 00-12).

    On Colab it moves to the course's ``notebooks/`` folder (as a local kernel runs) and prints what
    differs there (:func:`mgpu_utils.colab.colab_notes`). Then it starts the launcher's warm template
    in the background (:func:`mgpu_utils.launch.launcher.warm_up`), so the lesson's first launch does
    not wait for PyTorch's import. Safe to call again.
    """
    import os

    if "google.colab" in sys.modules:
        from mgpu_utils.colab import colab_notes
        from mgpu_utils.env import REPO_ROOT

        os.chdir(REPO_ROOT / "notebooks")
        print(colab_notes())
    from mgpu_utils.launch.launcher import warm_up

    warm_up()


def run_notebook(path: Path, out_dir: Path, timeout_s: int = 900, progress: bool = True) -> tuple[float, str]:
    """Execute one notebook in a fresh kernel (the current Python environment).

    The kernel talks to this process over local IPC sockets in a temporary folder, not TCP: nothing
    listens on a network port, and ipykernel has no reason to warn about unencrypted TCP.

    Args:
        path: the ``.ipynb`` file; it runs with its own folder as the working directory.
        out_dir: where the executed ``.ipynb`` and its ``.html`` are written.
        timeout_s: seconds allowed per cell.
        progress: show a bar "cell i/n" (tqdm, on stderr) while the notebook runs.

    Returns:
        ``(seconds, status)``; status is "ok" or "FAILED: <first line of the error>".
    """
    import shutil
    import tempfile

    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter
    from tqdm.auto import tqdm

    from mgpu_utils.figures.widget_view import strip_live_views

    nb = nbformat.read(path, as_version=4)
    sockets = tempfile.mkdtemp(prefix="mgpu_kernel_")
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
    client = NotebookClient(nb, km=km, timeout=timeout_s, resources={"metadata": {"path": str(path.parent)}})
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    bar = tqdm(total=n_code, desc=path.name, unit="cell", disable=not progress, leave=False, file=sys.stderr)

    def cell_done(cell, cell_index, execute_reply):
        bar.update(1)

    client.on_cell_executed = cell_done
    t0 = time.perf_counter()
    status = "ok"
    try:
        client.execute()
    except CellExecutionError as e:
        # the error's name and message, without the traceback's terminal colours (issue 58, G8)
        error = ANSI.sub("", f"{e.ename}: {e.evalue}" if e.ename else str(e)).strip()
        status = "FAILED: " + ((error.splitlines() or ["?"])[0])[:120]
    except Exception as e:  # kernel died, timeout
        status = f"FAILED: {type(e).__name__}: {str(e)[:120]}"
    finally:
        bar.close()
        if km.has_kernel:  # a kernel manager passed in is ours to shut down, not nbclient's
            km.shutdown_kernel(now=True)
        shutil.rmtree(sockets, ignore_errors=True)
    seconds = time.perf_counter() - t0
    for cell in nb.cells:  # live output arrives in pieces: store one stdout/stderr block per run
        merged = []
        for out in cell.get("outputs", []):
            if merged and out.output_type == "stream" and merged[-1].output_type == "stream" \
                    and merged[-1].name == out.name:
                merged[-1].text += out.text
            else:
                merged.append(out)
        if cell.cell_type == "code":
            cell.outputs = merged
    strip_live_views(nb)  # stored widget outputs keep their static picture (mgpu_utils.figures.widget_view)
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / path.name)
    html, _ = HTMLExporter().from_notebook_node(nb)
    (out_dir / path.with_suffix(".html").name).write_text(html)
    return seconds, status


def slide_deck(path: Path, out_dir: Path) -> Path:
    """A lesson as a reveal.js slide deck (``make slides``; for instructors): ``out_dir/NAME.slides.html``.

    Made from the notebook as stored (its committed outputs: nothing runs). Each ``#`` or ``##`` heading opens a
    slide, each further text cell and each figure a slide below it; code is left out, and so are code cells
    without a figure (their numbers are in the lesson). The deck loads reveal.js from a CDN when opened.

    Returns:
        the path of the deck.
    """
    import nbformat
    from nbconvert import SlidesExporter

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        figure = cell.cell_type == "code" and any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
        if cell.cell_type == "markdown":
            kind = "slide" if cell.source.startswith(("# ", "## ")) else "subslide"
        else:
            kind = "subslide" if figure else "skip"
        cell.metadata["slideshow"] = {"slide_type": kind}
    exporter = SlidesExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    html, _ = exporter.from_notebook_node(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    deck = out_dir / f"{path.stem}.slides.html"
    deck.write_text(html)
    return deck


#: The course's time budgets on a 2-core CPU machine (docs/testing.md): each lesson, and all of them
LESSON_BUDGET_S, COURSE_BUDGET_S = 60, 300


def budget_table(rows) -> str:
    """The table ``make course`` ends with: each notebook's seconds beside the budget, the ones over it marked.

    Args:
        rows: ``(name, seconds, status)`` per notebook, in the order they ran.
    """
    width = max(len(r[0]) for r in rows)
    lines = [f"\n{'notebook':<{width}}  {'seconds':>8}  {'budget':>6}  status"]
    for name, sec, status in rows:
        over = "  OVER" if sec > LESSON_BUDGET_S else ""
        lines.append(f"{name:<{width}}  {sec:8.1f}  {LESSON_BUDGET_S:6d}  {status}{over}")
    total = sum(r[1] for r in rows)
    over = [r[0] for r in rows if r[1] > LESSON_BUDGET_S]
    whole = "" if len(rows) < 2 else f"  {COURSE_BUDGET_S:6d}  {'OVER' if total > COURSE_BUDGET_S else 'within'}"
    lines.append(f"{'total':<{width}}  {total:8.1f}{whole}")
    if over:
        lines.append(f"over the {LESSON_BUDGET_S} s a lesson may take on 2 cores: {', '.join(over)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute the course notebooks headless.")
    parser.add_argument("paths", nargs="+", help="notebook files or folders")
    parser.add_argument("--out", default="build", help="output folder for executed .ipynb and .html")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    parser.add_argument("--no-progress", action="store_true", help="no per-cell progress bar")
    parser.add_argument("--slides", action="store_true",
                        help="write each lesson's slide deck from its stored outputs instead (nothing runs)")
    args = parser.parse_args(argv)
    notebooks = []
    for p in map(Path, args.paths):
        notebooks += sorted(p.glob("[0-9][0-9]_*.ipynb")) if p.is_dir() else [p]
    if not notebooks:
        print("no notebooks found in", args.paths, file=sys.stderr)
        return 1
    if args.slides:
        for nb in notebooks:
            print(f"slides: {slide_deck(nb, Path(args.out))}")
        return 0
    rows = []
    for nb in notebooks:
        print(f"running {nb} ...", flush=True)
        rows.append((nb.name, *run_notebook(nb, Path(args.out), args.timeout, progress=not args.no_progress)))
    print(budget_table(rows))
    print(f"executed notebooks and HTML in {Path(args.out).resolve()}")
    return 0 if all(r[2] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
