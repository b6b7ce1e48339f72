"""The course's notebooks: every lesson's setup call (:func:`start`, lessons 00-13), and running every
notebook in order, headless, into ``build/`` (``make course``).

Writes ``build/NAME.ipynb`` (executed, with outputs) and ``build/NAME.html``, then prints a table
notebook / seconds / status. While a notebook runs, a bar shows which cell of how many. Exits with
status 1 if any notebook failed. ``--jobs 2`` (``make course``) runs two notebooks at a time, each in its own
process and kernel: a lesson spends most of its time waiting on the ranks it launches (a third of two cores
busy, measured), so a second lesson fills the idle core; each lesson's seconds are then its own wall time
beside another lesson, no less than it takes alone.

Usage::

    python -m mgpu_utils.course --out build notebooks            # all notebooks, one at a time
    python -m mgpu_utils.course --jobs 2 --out build notebooks   # two at a time (make course)
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
    """What every lesson's setup cell calls once ``mgpu_utils`` is importable (lessons 00-13).

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


def stored_seconds(path: Path) -> float:
    """How long a notebook's stored outputs took to compute: the sum of its code cells' execution records
    (``metadata.execution``, which nbclient writes), 0.0 where there are none. An estimate, for ordering."""
    from datetime import datetime

    import nbformat

    total = 0.0
    for cell in nbformat.read(path, as_version=4).cells:
        e = cell.get("metadata", {}).get("execution", {})
        if cell.cell_type == "code" and "iopub.execute_input" in e and "shell.execute_reply" in e:
            start, end = (datetime.fromisoformat(e[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            total += max(0.0, (end - start).total_seconds())
    return total


def run_notebooks(notebooks: list[Path], out_dir: Path, timeout_s: int = 900, jobs: int = 1,
                  progress: bool = True) -> list[tuple[str, float, str]]:
    """Execute notebooks with :func:`run_notebook`, ``jobs`` at a time.

    With ``jobs`` > 1 each notebook runs in a process of its own (started with "spawn": nothing of this
    process is shared), the longest first (:func:`stored_seconds`), a new one as soon as one ends; a line
    is printed as each one ends, and the per-cell bars are off (they would overwrite each other).

    Returns:
        ``(name, seconds, status)`` per notebook, in the order given (what :func:`budget_table` takes).
    """
    if jobs == 1 or len(notebooks) == 1:
        rows = []
        for nb in notebooks:
            print(f"running {nb} ...", flush=True)
            rows.append((nb.name, *run_notebook(nb, out_dir, timeout_s, progress=progress)))
        return rows
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        started = {}
        # the longest first (as their stored outputs took), so that no long lesson starts last while the
        # other jobs have nothing left to do
        for nb in sorted(notebooks, key=stored_seconds, reverse=True):
            started[pool.submit(run_notebook, nb, out_dir, timeout_s, False)] = nb
        print(f"running {len(notebooks)} notebooks, {jobs} at a time ...", flush=True)
        for done in as_completed(started):
            nb = started[done]
            try:
                results[nb] = done.result()
            except Exception as e:  # the worker process died
                results[nb] = (0.0, f"FAILED: {type(e).__name__}: {str(e)[:120]}")
            print(f"  {nb.name}: {results[nb][0]:.1f} s, {results[nb][1]}", flush=True)
    return [(nb.name, *results[nb]) for nb in notebooks]


#: A slide's frame in CSS pixels (16:9); the deck scales it to the window, and a slide's content to the frame.
SLIDE_W, SLIDE_H = 1280, 720

_DECK_CSS = """
html, body { margin: 0; height: 100%; background: #2b2b2b; }
body { font-family: "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; color: #1d1d1d; }
.slide { display: none; position: absolute; left: 50%; top: 50%; width: WIDTHpx; height: HEIGHTpx;
         margin: -HALF_Hpx 0 0 -HALF_Wpx; background: #fff; box-sizing: border-box; padding: 40px 56px;
         overflow: hidden; }
.slide.current { display: block; }
.fit { --k: 1; font-size: calc(28px * var(--k)); line-height: 1.35; }
.fit h1 { font-size: 1.75em; margin: 0 0 0.4em; } .fit h2 { font-size: 1.5em; margin: 0 0 0.4em; }
.fit h3, .fit h4 { font-size: 1.2em; margin: 0.3em 0; } .fit p, .fit ul, .fit ol { margin: 0.35em 0; }
.crumb { font-size: 18px; color: #777; margin-bottom: 8px; }
.fit pre { font-size: 0.7em; background: #f4f4f4; padding: 0.5em 0.7em; margin: 0.4em 0; white-space: pre-wrap; }
.fit code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.9em; }
.fit table { border-collapse: collapse; font-size: 0.75em; margin: 0.4em 0; }
.fit th, .fit td { border: 1px solid #bbb; padding: 0.15em 0.5em; }
.fit img { display: block; max-width: 100%; max-height: calc(560px * var(--k)); margin: 0 auto; }
.fit svg.math { vertical-align: middle; height: 1.2em; width: auto; } .fit div.math svg { height: 2.4em; }
.number { position: absolute; right: 20px; bottom: 10px; font-size: 16px; color: #999; }
@media print { body { background: #fff; } .slide { display: block; position: relative; left: 0; top: 0;
               margin: 0; page-break-after: always; transform: none !important; } }
"""

# Shows one slide at a time (arrow keys, space, Page Up/Down, Home/End, a click; the slide's number in the
# address: #5), scales the frame to the window, and shrinks a slide's text until it fits its frame (--k, down to
# 0.45), then the whole content if it still does not: nothing leaves the frame. data-k records the scale.
_DECK_JS = """
const slides = Array.from(document.querySelectorAll('.slide'));
function fits(fit, box) { return fit.scrollHeight <= box.h + 1 && fit.scrollWidth <= box.w + 1; }
function fitContent(slide) {
  if (slide.dataset.k) return;
  const fit = slide.querySelector('.fit'), cs = getComputedStyle(slide);
  const box = { w: slide.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),
                h: slide.clientHeight - parseFloat(cs.paddingTop) - parseFloat(cs.paddingBottom)
                   - slide.querySelector('.crumb').offsetHeight - 8 };
  fit.style.width = box.w + 'px';
  let k = 1;
  while (!fits(fit, box) && k > 0.45) { k = Math.round((k - 0.05) * 100) / 100; fit.style.setProperty('--k', k); }
  if (!fits(fit, box)) {
    const s = Math.min(box.h / fit.scrollHeight, box.w / fit.scrollWidth);
    fit.style.transformOrigin = 'top left'; fit.style.transform = 'scale(' + s + ')'; k = k * s;
  }
  slide.dataset.k = k.toFixed(2);
}
function frame() {
  const s = Math.min(innerWidth / WIDTH, innerHeight / HEIGHT);
  slides.forEach(x => x.style.transform = 'scale(' + s + ')');
}
let at = 0;
function show(i) {
  at = Math.max(0, Math.min(slides.length - 1, i));
  slides.forEach((x, j) => x.classList.toggle('current', j === at));
  fitContent(slides[at]);
  history.replaceState(null, '', '#' + (at + 1));
}
document.addEventListener('keydown', e => {
  if (['ArrowRight', 'ArrowDown', 'PageDown', ' '].includes(e.key)) show(at + 1);
  else if (['ArrowLeft', 'ArrowUp', 'PageUp'].includes(e.key)) show(at - 1);
  else if (e.key === 'Home') show(0); else if (e.key === 'End') show(slides.length - 1); else return;
  e.preventDefault();
});
document.addEventListener('click', e => show(at + (e.clientX > innerWidth / 3 ? 1 : -1)));
addEventListener('resize', frame);
addEventListener('beforeprint', () => slides.forEach(x => { x.classList.add('current'); fitContent(x); }));
addEventListener('afterprint', () => show(at));
frame();
show((parseInt(location.hash.slice(1)) || 1) - 1);
"""


def _math_svg(tex: str, display: bool) -> str:
    """``tex`` (a TeX formula without its dollars) as an inline SVG drawn by matplotlib's mathtext (no MathJax,
    no network); a formula mathtext cannot draw stays as code."""
    import html
    import io

    from matplotlib import mathtext

    buf = io.BytesIO()
    try:
        mathtext.math_to_image(f"${html.unescape(tex)}$", buf, format="svg", dpi=100)
    except (ValueError, RuntimeError):
        return f"<code>{tex}</code>"
    svg = buf.getvalue().decode()
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg"):], flags=re.S)   # no date: a stable deck
    svg = svg.replace("<svg ", '<svg class="math" ', 1)
    return f'<div class="math">{svg}</div>' if display else svg


def _slide_html(markdown: str) -> str:
    """One markdown cell as HTML: nbconvert's renderer (tables, highlighted code), math as SVG."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    body = re.sub(r'<a class="anchor-link"[^>]*>.*?</a>', "", markdown2html_mistune(markdown))   # no ¶ links
    parts = re.split(r"(<pre.*?</pre>|<code>.*?</code>)", body, flags=re.S)
    for i in range(0, len(parts), 2):                  # the text between code: a $ in code is not math
        parts[i] = re.sub(r"\$\$(.+?)\$\$", lambda m: _math_svg(m.group(1), True), parts[i], flags=re.S)
        parts[i] = re.sub(r"(?<![\\$])\$([^$\n]+?)\$", lambda m: _math_svg(m.group(1), False), parts[i])
    return "".join(parts)


def slide_deck(path: Path, out_dir: Path) -> Path:
    """A lesson as a slide deck (``make slides``; for instructors): ``out_dir/NAME.slides.html``, one
    self-contained file that works offline (no reveal.js, MathJax or fonts from a CDN).

    Made from the notebook as stored (its committed outputs: nothing runs). Each ``#`` or ``##`` heading opens a
    slide, each further text cell and each figure is a slide of its own, under its section's title; code cells
    are left out, and so are code cells without a figure (their numbers are in the lesson). Each slide is a
    ``SLIDE_W`` x ``SLIDE_H`` frame scaled to the window; a long text or code slide is shrunk to fit it (the test
    renders every slide in Chromium and checks that nothing leaves the frame). Keys: arrows, space, Page Up/Down,
    Home/End; a click; ``#5`` in the address opens slide 5; printing gives one slide per page.

    Returns:
        the path of the deck.
    """
    import html

    import nbformat

    nb = nbformat.read(path, as_version=4)
    slides, section = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = cell.source.startswith(("# ", "## "))
            if heading:
                section = cell.source.splitlines()[0].lstrip("# ").strip()
            slides.append(("" if heading else section, _slide_html(cell.source)))   # a title slide has no crumb
        elif cell.cell_type == "code":
            for out in cell.get("outputs", []):
                png = out.get("data", {}).get("image/png")
                if png:
                    slides.append((section, f'<img alt="a figure of the lesson" src="data:image/png;base64,'
                                            f'{png.strip()}">'))
    from pygments.formatters import HtmlFormatter

    title = next((ln.lstrip("# ").strip() for c in nb.cells if c.cell_type == "markdown"
                  for ln in c.source.splitlines()[:1] if ln.startswith("# ")), path.stem)
    css = (_DECK_CSS.replace("HALF_W", str(SLIDE_W // 2)).replace("HALF_H", str(SLIDE_H // 2))
           .replace("WIDTH", str(SLIDE_W)).replace("HEIGHT", str(SLIDE_H))
           + HtmlFormatter().get_style_defs(".highlight"))
    sections = "\n".join(
        f'<section class="slide" id="s{i}"><div class="crumb">{html.escape(sec)}</div><div class="fit">{body}'
        f'</div><div class="number">{i} / {len(slides)}</div></section>' for i, (sec, body) in enumerate(slides, 1))
    js = _DECK_JS.replace("WIDTH", str(SLIDE_W)).replace("HEIGHT", str(SLIDE_H))
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{css}</style></head>\n<body>\n{sections}\n<script>{js}</script></body></html>\n')
    out_dir.mkdir(parents=True, exist_ok=True)
    deck = out_dir / f"{path.stem}.slides.html"
    deck.write_text(page)
    return deck


#: The course's time budgets on a 2-core CPU machine (docs/testing.md): each lesson, and all of them
LESSON_BUDGET_S, COURSE_BUDGET_S = 60, 300


def budget_table(rows, wall_s: float | None = None, jobs: int = 1) -> str:
    """The table ``make course`` ends with: each notebook's seconds beside the budget, the ones over it marked.

    Args:
        rows: ``(name, seconds, status)`` per notebook, in the order they ran.
        wall_s: with ``jobs`` > 1, the seconds the whole run took (the total row; the lessons' own seconds
            overlap, so their sum is not the course's time).
        jobs: notebooks run at a time; above 1 each lesson's seconds were measured beside another lesson,
            which the table says (alone a lesson takes no longer).
    """
    width = max(len(r[0]) for r in rows)
    lines = [f"\n{'notebook':<{width}}  {'seconds':>8}  {'budget':>6}  status"]
    for name, sec, status in rows:
        over = "  OVER" if sec > LESSON_BUDGET_S else ""
        lines.append(f"{name:<{width}}  {sec:8.1f}  {LESSON_BUDGET_S:6d}  {status}{over}")
    total = sum(r[1] for r in rows) if jobs == 1 or wall_s is None else wall_s
    over = [r[0] for r in rows if r[1] > LESSON_BUDGET_S]
    whole = "" if len(rows) < 2 else f"  {COURSE_BUDGET_S:6d}  {'OVER' if total > COURSE_BUDGET_S else 'within'}"
    lines.append(f"{'total' if jobs == 1 else 'wall':<{width}}  {total:8.1f}{whole}")
    if jobs > 1:
        lines.append(f"{jobs} notebooks at a time: each lesson's seconds beside another one (alone it takes no "
                     f"longer: COURSE_JOBS=1 times them one at a time); the course's time is the wall time")
    if over:
        lines.append(f"over the {LESSON_BUDGET_S} s a lesson may take on 2 cores: {', '.join(over)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Execute the course notebooks headless.")
    parser.add_argument("paths", nargs="+", help="notebook files or folders")
    parser.add_argument("--out", default="build", help="output folder for executed .ipynb and .html")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell")
    parser.add_argument("--no-progress", action="store_true", help="no per-cell progress bar")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at a time, each in its own process (make course: 2)")
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
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 (one notebook at a time) or more")
    t0 = time.perf_counter()
    rows = run_notebooks(notebooks, Path(args.out), args.timeout, args.jobs, progress=not args.no_progress)
    print(budget_table(rows, time.perf_counter() - t0, min(args.jobs, len(notebooks))))
    print(f"executed notebooks and HTML in {Path(args.out).resolve()}")
    return 0 if all(r[2] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
