"""The course as a student sees it: every notebook run in a real browser (headless Chromium driven by
Playwright) against JupyterLab started as `make lab` starts it, one test per lesson
(test_notebook_runs_in_jupyterlab[03_ddp]); a pytest process starts one lab and one page for all the lessons it
runs (`make test`'s two workers: two labs, two lessons at a time). Each notebook is executed once per `make test`:
where this test runs it, nbval does not (tests/conftest.py deselects nbval's cells of these notebooks), so this
test also makes nbval's checks.

For every notebook, before running: the cells of its deeper sections are hidden under their collapsed headings
and every other cell is shown; widget cells show a picture, never `interactive(children=...`; then (all headings
expanded)
Run All in a fresh kernel: every code cell runs (Run All stops at an unexpected error), no error output (the
kernel's error messages, read on the page's websocket) and no traceback on stderr; every cell marked
`# NBVAL_CHECK_OUTPUT` shows the committed output, compared as `nbval --nbval-lax` compares it, after the same
sanitizers (tests/nbval_sanitize.cfg; see output_diff); every figure the committed notebook has is drawn and
shown at 0.75x its size or larger in a 1280-pixel window; every widget renders as a widget and redraws within
15 s when its first control changes, without an error.
No "Jupyter news" question appears (looked for after each lesson's Run All: its page has been up that long).
Screenshots go to build/browser/. The browser is Debian's Chromium (/usr/bin/chromium, or $MGPU_CHROMIUM);
without it, or without the playwright package, the test says SKIPPED and how to install them, and nbval runs
the notebooks instead (lab_server.browser_missing decides for both).

Run alone: .venv/bin/python -m pytest tests/repo/test_browser.py (about 7 minutes on 2 cores; with -n 2, two
lessons at a time); one lesson: -k 03_ddp (nbval then leaves out only that lesson); MGPU_BROWSER_NOTEBOOKS=00,04
runs only those lessons (in a full `make test`, nbval runs the others).
"""
import difflib
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from helpers import hidden_on_opening
from lab_server import (CHROMIUM, CHROMIUM_ARGS, ROOT, api, browser_missing, browser_notebooks, browser_required,
                        running_lab)
from nbval.plugin import coalesce_streams, find_comment_markers, find_metadata_tags, get_sanitize_patterns

SHOTS = ROOT / "build" / "browser"
NOTEBOOKS = browser_notebooks()
SANITIZE_CFG = ROOT / "tests" / "nbval_sanitize.cfg"    # what `make test` passes to nbval (pyproject.toml)
WIDGET_CALLS = re.compile(r"ring_stepper\(|explorer\(|calculator\(|widgets\.interact")
RUN_ALL_TIMEOUT_S = 420
# One test per lesson (make test's two workers run two at a time, each in its own lab and page). A hang is caught
# by RUN_ALL_TIMEOUT_S; this limit adds the lab's start (the first lesson of a worker) and the checks around it.
NOTEBOOK_TEST_TIMEOUT_S = RUN_ALL_TIMEOUT_S + 180
# a 1280-pixel window with the file browser open: the width the line and figure conventions are made for
# (tests/repo/test_notebook_views.py); every figure must be shown at 0.75x its size or larger
VIEW_WIDTH, MIN_FIGURE_SCALE = 1280, 0.75

# JavaScript run in the page: one record per cell of the open notebook
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"     # the notebook in front
CELLS_JS = """() => [...document.querySelectorAll('""" + PANEL + """ .jp-Cell')]
  .map(c => ({code: c.classList.contains('jp-CodeCell'),
              prompt: (c.querySelector('.jp-InputPrompt') || {}).textContent || '',
              imgs: c.querySelectorAll('.jp-OutputArea-output img').length,
              shown: [...c.querySelectorAll('.jp-OutputArea-output img')].map(i => [i.naturalWidth, i.clientWidth]),
              widget: !!c.querySelector('.jp-OutputArea-output .jupyter-widgets'),
              stderr: [...c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                      .map(e => e.textContent).join('\\n'),
              text: (c.querySelector('.jp-OutputArea') || {}).textContent || ''}))"""
# Run All has ended: every code cell's prompt shows its execution count ([12]), or none is running ([*]) ``arg`` ms
# after Run All was clicked (window.__runAllSince; Run All stopped at an error). It reads only the prompts: cheap to
# ask 5 times a second, so the test goes on within 0.2 s of the last cell (it looked once a second, at every output)
RUN_ALL_ENDED_JS = """(quiet_ms) => {
  const prompts = [...document.querySelectorAll('""" + PANEL + """ .jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent);
  if (prompts.every(p => /\\[\\d+\\]/.test(p))) return true;
  return !prompts.some(p => p.includes('*')) && Date.now() - window.__runAllSince > quiet_ms;
}"""
# per cell: hidden (under a collapsed heading: JupyterLab sets display none), as the page shows it
HIDDEN_JS = "() => [...document.querySelectorAll('" + PANEL + " .jp-Cell')].map(c => c.offsetParent === null)"
# per cell, its own outputs (not those inside a widget): [data-mime-type, textContent] each
OUTPUTS_JS = """() => [...document.querySelectorAll('""" + PANEL + """ .jp-Cell')].map(c => {
  const area = c.querySelector('.jp-Cell-outputArea');
  return area ? [...area.querySelectorAll(':scope > .jp-OutputArea-child > .jp-OutputArea-output')]
                  .map(e => [e.getAttribute('data-mime-type') || '', e.textContent]) : []; })"""

# nbval's output check, made on the page
STDOUT, STDERR = "application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr"
# what the browser changes: it shows ANSI colour codes as colours (its text has none); nothing else (a stream's
# and an execute_result's textContent keep every space and the final newline)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def sanitize_patterns(cfg: Path = SANITIZE_CFG) -> dict[str, str]:
    """nbval's sanitizers as nbval keeps them (an ordered dict regex -> replacement, applied in order)."""
    return dict(get_sanitize_patterns(cfg.read_text()))


def checks_output(cell) -> bool:
    """nbval --nbval-lax compares this cell's outputs: a run code cell marked `# NBVAL_CHECK_OUTPUT` (or tagged
    nbval-check-output), nbval's own parsing of the markers."""
    if cell["cell_type"] != "code" or cell.get("execution_count") is None:
        return False
    options = dict(find_metadata_tags(cell.get("metadata", {})))
    options.update(find_comment_markers(_text(cell["source"])))
    return bool(options.get("check", False))


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _sanitized(s: str, patterns: dict[str, str]) -> str:
    s = ANSI.sub("", s)
    for regex, replace in patterns.items():
        s = re.sub(regex, replace, s)
    return s


def _compared(outputs, patterns: dict[str, str]) -> dict:
    """What nbval compares of a list of outputs (nbformat dicts), in what the page can show: the stdout and stderr
    texts (every output of a stream together, carriage returns and backspaces applied: nbval's coalesce_streams),
    the text/plain of each output that has no richer type, and the number of outputs shown as something richer."""
    streams = [nbformat.from_dict({"output_type": "stream", "name": o["name"], "text": _text(o["text"])})
               for o in outputs if o["output_type"] == "stream"]
    texts = {o.name: o.text for o in coalesce_streams(streams)}
    data = [o.get("data", {}) for o in outputs if o["output_type"] in ("display_data", "execute_result")]
    return {"stdout": _sanitized(texts["stdout"], patterns) if "stdout" in texts else None,
            "stderr": _sanitized(texts["stderr"], patterns) if "stderr" in texts else None,
            "text/plain": [_sanitized(_text(d["text/plain"]), patterns) for d in data if set(d) == {"text/plain"}],
            "richer outputs (figures, widgets)": sum(set(d) != {"text/plain"} for d in data)}


def _page_outputs(shown: list) -> list[dict]:
    """The page's outputs of a cell, (data-mime-type, textContent) each, as nbformat outputs: a stream element
    is that stream, a text/plain element an output with only text/plain, anything else something richer."""
    outs = []
    for mime, text in shown:
        if mime in (STDOUT, STDERR):
            outs.append({"output_type": "stream", "name": "stdout" if mime == STDOUT else "stderr", "text": text})
        else:
            outs.append({"output_type": "display_data", "data": {mime: text}})
    return outs


def output_diff(cell, shown: list, patterns: dict[str, str]) -> str:
    """nbval's lax check of one `# NBVAL_CHECK_OUTPUT` cell, made on what the page shows.

    ``cell``: the committed cell; ``shown``: [data-mime-type, textContent] of each of the cell's outputs in the
    page; ``patterns``: sanitize_patterns(). Both sides sanitized as nbval sanitizes, then compared exactly:
    the stdout text (all stdout outputs together), the stderr text, the text/plain of each output that has
    nothing richer (an execute_result), and how many outputs are richer (a figure shows its image, not its
    "<Figure ...>" text: the figure check looks at it). Returns "" when they agree, else a short unified diff
    (committed -> page)."""
    committed, page = _compared(cell.get("outputs", []), patterns), _compared(_page_outputs(shown), patterns)
    if committed == page:
        return ""

    def lines(side):
        out = []
        for key, value in side.items():
            for v in (value if isinstance(value, list) else [] if value is None else [value]):
                out += [f"[{key}]"] + str(v).split("\n")
        return out

    diff = list(difflib.unified_diff(lines(committed), lines(page), "committed", "page", n=1, lineterm=""))
    return "\n".join(diff[:40] + (["..."] if len(diff) > 40 else []))


def kernel_message(payload) -> tuple[str, str, dict] | None:
    """(channel, msg_type, content) of a frame of a kernel's websocket, or None for anything else. JupyterLab
    speaks the binary protocol v1.kernel.websocket.jupyter.org (the number of offsets, the offsets, then
    channel, header, parent header, metadata, content, buffers) or the older JSON text; content is decoded
    only for error messages."""
    try:
        if isinstance(payload, str):
            msg = json.loads(payload)
            channel, msg_type, content = msg["channel"], msg["header"]["msg_type"], msg.get("content", {})
        else:
            n = int.from_bytes(payload[:8], "little")
            offsets = [int.from_bytes(payload[8 + 8 * i:16 + 8 * i], "little") for i in range(n)]
            parts = [payload[a:b] for a, b in zip(offsets, offsets[1:] + [len(payload)])]
            channel, msg_type = parts[0].decode(), json.loads(parts[1])["msg_type"]
            content = json.loads(parts[4]) if msg_type == "error" else {}
        return channel, msg_type, content
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def _cells(path: Path):
    """The committed notebook's cells."""
    return nbformat.read(path, as_version=4).cells


def _stored(cells):
    """Per cell of the committed notebook: (is code, images stored, builds a widget)."""
    return [(c["cell_type"] == "code",
             sum("image/png" in o.get("data", {}) for o in c.get("outputs", [])),
             c["cell_type"] == "code" and bool(WIDGET_CALLS.search("".join(c["source"])))) for c in cells]


def _open(page, base: str, path: Path, n_cells: int):
    """Open a notebook in its own fresh workspace and wait until all its cells are in the page."""
    page.goto(f"{base}/lab/workspaces/test-{path.stem}/tree/{path.name}?reset")
    page.wait_for_function(f"() => document.querySelectorAll('{PANEL} .jp-Cell').length === {n_cells}",
                           timeout=60_000)


def _expand_all_headings(page, n_cells: int):
    """JupyterLab's "Expand All Headings" (its shortcut in command mode), then wait until every cell is shown."""
    page.locator(f"{PANEL} .jp-Cell").first.click()             # the notebook has the focus
    page.keyboard.press("Escape")                                 # command mode
    page.keyboard.press("Control+Shift+ArrowRight")               # notebook:expand-all-headings
    page.wait_for_function(f"() => [...document.querySelectorAll('{PANEL} .jp-Cell')]"
                           f".filter(c => c.offsetParent !== null).length === {n_cells}", timeout=10_000)


def _menu(page, menu: str, item: str):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{item}$")).first.click()


def _interact(cell):
    """Change the first control of a widget: a slider one step right, else a menu to its next option.
    Returns a short description of what was changed."""
    handle = cell.locator(".noUi-handle")
    if handle.count():
        at_max = handle.first.get_attribute("aria-valuenow") == handle.first.get_attribute("aria-valuemax")
        handle.first.focus()
        handle.first.press("ArrowLeft" if at_max else "ArrowRight")
        return "slider -1" if at_max else "slider +1"
    select = cell.locator(".widget-dropdown select").first
    options = select.locator("option").all_inner_texts()
    current = select.evaluate("s => s.selectedIndex")
    select.select_option(index=(current + 1) % len(options))
    return f"menu -> {options[(current + 1) % len(options)]}"


def _missing(why: str):
    """Skip with the fix, or fail where the browser is required (.ci/run sets MGPU_REQUIRE_BROWSER=1)."""
    if browser_required():
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    why = browser_missing()
    if why:
        _missing(why)
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def patterns(pytestconfig):
    """nbval's sanitizers: the file given to nbval (`make test`: tests/nbval_sanitize.cfg)."""
    cfg = pytestconfig.getoption("nbval_sanitize_with", default=None)
    return sanitize_patterns(pytestconfig.invocation_params.dir / cfg if cfg else SANITIZE_CFG)


class Lab:
    """One JupyterLab (started as `make lab` starts it) and one browser page on it, for the lessons this pytest
    process runs (under `make test`'s two workers, each worker has its own)."""

    def __init__(self, base: str, token: str, log: Path, page):
        self.base, self.token, self.log, self.page = base, token, log, page
        self.errors, self.connected = [], []        # the kernel's error messages; its kernel_info replies

        def on_frame(payload):
            msg = kernel_message(payload)
            if msg and msg[:2] == ("iopub", "error"):
                self.errors.append(msg[2])
            elif msg and msg[:2] == ("shell", "kernel_info_reply"):
                self.connected.append(True)

        page.on("websocket", lambda ws: ws.on("framereceived", on_frame) if "/channels" in ws.url else None)


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    SHOTS.mkdir(parents=True, exist_ok=True)
    tmp_path = tmp_path_factory.mktemp("lab")
    # the test's own user settings: autosave off, so a run in the browser never rewrites the committed files;
    # every cell in the page (JupyterLab otherwise renders only the cells near the view, to be fast)
    for plugin, values in {"docmanager-extension/plugin": {"autosave": False},
                           "notebook-extension/tracker": {"windowingMode": "none"}}.items():
        f = tmp_path / "user-settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    # the kernels' sockets in a folder of this lab's own (`make lab` puts them under $XDG_RUNTIME_DIR): two labs
    # started at once (make test's two workers) never pick the same socket name; short, for the 107-byte limit
    sockets = tempfile.mkdtemp(prefix="mgpu-xdg-")
    env = {"JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "XDG_RUNTIME_DIR": sockets}
    try:
        with running_lab(tmp_path, env=env) as (base, token, log, _):
            context = browser.new_context(viewport={"width": VIEW_WIDTH, "height": 800})
            try:
                page = context.new_page()
                page.goto(f"{base}/lab?token={token}")
                page.wait_for_selector(".jp-LauncherCard, .jp-Launcher", timeout=90_000)
                page.screenshot(path=str(SHOTS / "00_start.png"))
                yield Lab(base, token, log, page)
            finally:
                context.close()                     # its open websockets would hold the server up
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.mark.runs_notebooks                             # nbval does not run these notebooks again (conftest.py)
@pytest.mark.timeout(NOTEBOOK_TEST_TIMEOUT_S)           # not make test's 600 s: the lab's start, then Run All
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(lab, patterns, path, starts_processes):
    try:
        row = _run_notebook(lab, path, patterns)
    finally:                                            # the next lesson gets a fresh kernel, also after a failure
        for session in api(lab.base, lab.token, "/api/sessions") or []:
            api(lab.base, lab.token, f"/api/sessions/{session['id']}", "DELETE")
    (SHOTS / f"{path.stem}.json").write_text(json.dumps(row))
    name, seconds, checked, widgets, scale = row
    print(f"{name:<28} {seconds:6.1f} s  outputs compared: {checked:2d}  "
          f"smallest figure shown at {scale:.2f}x  widgets: {widgets}")
    # JupyterLab asks about news a few seconds after a page loads; this page has been up for a whole Run All
    assert "Jupyter news" not in lab.page.inner_text("body"), "the news pop-up appeared"
    assert "without encryption" not in lab.log.read_text(), lab.log.read_text()[-2000:]


def _run_notebook(lab: Lab, path: Path, patterns) -> tuple:
    """Open, check, Run All, check and screenshot one notebook; returns its row (name, seconds of Run All,
    outputs compared, widgets changed, the smallest figure's scale)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page, base, errors, connected = lab.page, lab.base, lab.errors, lab.connected
    committed = _cells(path)
    stored, scales = _stored(committed), []
    connected.clear()
    _open(page, base, path, len(stored))
    cells = page.locator(f"{PANEL} .jp-Cell")
    before = page.evaluate(CELLS_JS)
    assert len(before) == len(stored), f"{path.name}: {len(before)} cells shown, {len(stored)} stored"
    # the deeper sections open collapsed (tests/repo/test_lesson_shape.py): their cells hidden, the rest shown
    expect_hidden = hidden_on_opening(committed)
    deadline = time.monotonic() + 15            # JupyterLab collapses a heading once it has rendered it
    while (hidden := [i for i, h in enumerate(page.evaluate(HIDDEN_JS)) if h]) != expect_hidden:
        # margin: collapsing takes well under a second, on a busy machine too; 15 s means not collapsed
        assert time.monotonic() < deadline, \
            f"{path.name}: cells {hidden} hidden on opening, expected {expect_hidden}"
        page.wait_for_timeout(200)
    if hidden:                                  # Run All runs them too; their figures are checked shown
        _expand_all_headings(page, len(stored))
    for i, (is_code, n_img, is_widget) in enumerate(stored):
        if is_widget:                           # opened without running: a picture, not a repr
            assert "children=" not in before[i]["text"], f"{path.name} cell {i}: {before[i]['text'][:80]}"
            assert before[i]["imgs"] >= 1 or "run this cell" in before[i]["text"], \
                f"{path.name} cell {i}: no static view before running"
            cells.nth(i).screenshot(path=str(SHOTS / f"{path.stem}_cell{i}_unrun.png"))
    # Run All before the page has its connection to the new kernel can be lost (the prompts stay [ ], the
    # kernel idle; seen when a notebook opened quickly after another): wait for the kernel's first reply
    deadline = time.monotonic() + 90
    while not connected:     # margin: a kernel connects in seconds, on a busy machine too; 90 s is a hang
        assert time.monotonic() < deadline, f"{path.name}: no connection to a kernel after 90 s"
        page.wait_for_timeout(200)              # (Playwright hands over websocket frames while it waits)
    _menu(page, "Edit", "Clear Outputs of All Cells")   # stored prompts [n] would look finished
    page.wait_for_function(f"() => [...document.querySelectorAll('{PANEL} .jp-CodeCell .jp-InputPrompt')]"
                           ".every(p => !/\\d/.test(p.textContent))", timeout=10_000)
    errors.clear()
    t0 = time.monotonic()
    page.evaluate("() => { window.__runAllSince = Date.now(); }")
    _menu(page, "Run", "Run All Cells")
    try:                                        # finished, or stopped by an error (nothing running after 10 s)
        # margin: the slowest lesson takes about 100 s on a quiet 2-core machine; 420 s is a hang
        page.wait_for_function(RUN_ALL_ENDED_JS, arg=10_000, polling=200, timeout=RUN_ALL_TIMEOUT_S * 1000)
    except PlaywrightTimeout:
        running = [i for i, c in enumerate(page.evaluate(CELLS_JS)) if c["code"] and "*" in c["prompt"]]
        raise AssertionError(f"{path.name}: Run All still running cell {running}") from None
    seconds = time.monotonic() - t0
    now = page.evaluate(CELLS_JS)
    outputs = page.evaluate(OUTPUTS_JS)         # also lets Playwright hand over the last websocket frames
    _assert_no_error(path, errors, outputs, "in Run All")
    not_run = [i for i, c in enumerate(now) if c["code"] and not re.search(r"\[\d+\]", c["prompt"])]
    assert not not_run, f"{path.name}: cells {not_run} did not run (an error stopped Run All)"
    checked = [i for i, cell in enumerate(committed) if checks_output(cell)]
    differ = [f"{path.name} cell {i}: the output differs from the committed one (nbval's check of a "
              f"# NBVAL_CHECK_OUTPUT cell, after nbval's sanitizers):\n{d}"
              for i in checked for d in [output_diff(committed[i], outputs[i], patterns)] if d]
    assert not differ, "\n".join(differ)
    for i, c in enumerate(now):
        assert "Traceback" not in c["stderr"], f"{path.name} cell {i}: {c['stderr'][-1500:]}"
        assert c["imgs"] >= stored[i][1], f"{path.name} cell {i}: {c['imgs']} figures, stored {stored[i][1]}"
        for natural, shown in c["shown"]:
            assert shown >= MIN_FIGURE_SCALE * natural, \
                f"{path.name} cell {i}: a figure {natural} px wide is shown {shown} px wide (too small to read)"
            scales.append(shown / natural)
    widgets = []
    for i, (_, _, is_widget) in enumerate(stored):
        if not is_widget:
            continue
        assert now[i]["widget"], f"{path.name} cell {i}: the widget did not render as a widget"
        cell = cells.nth(i)
        cell.scroll_into_view_if_needed()
        out = cell.locator(".widget-output").first
        old = out.inner_html()
        what, t1 = _interact(cell), time.monotonic()
        page.wait_for_function("([el, old]) => el.innerHTML !== old && el.querySelector('img, pre')",
                               arg=[out.element_handle(), old], timeout=15_000)
        widgets.append((i, what, round(time.monotonic() - t1, 2)))
        cell.screenshot(path=str(SHOTS / f"{path.stem}_cell{i}_widget.png"))
    _assert_no_error(path, errors, page.evaluate(OUTPUTS_JS), "when its widgets changed")
    page.screenshot(path=str(SHOTS / f"{path.stem}.png"))
    return path.name, round(seconds, 1), len(checked), widgets, round(min(scales, default=1.0), 2)


def _assert_no_error(path: Path, errors: list, shown: list, when: str):
    """No error output: the kernel sent no error message (what nbval fails a cell for, even one whose traceback
    has no "Traceback" line, such as a SyntaxError)."""
    if errors:
        found = [f"{e.get('ename')}: {e.get('evalue')}"
                 + f" (cells {[i for i, outs in enumerate(shown) if any(e.get('ename', '?') in t for _, t in outs)]})"
                 for e in errors]
        raise AssertionError(f"{path.name}: error output {when}: " + "; ".join(found))


def test_output_diff_is_nbvals_check_on_the_page():
    """output_diff, without a browser: a committed cell against what a page shows. Only what the sanitizers
    replace (a duration, a pid, a temporary path) may differ; a number, a missing or extra output, stderr, a
    missing final newline may not."""
    p = sanitize_patterns()
    cell = nbformat.from_dict({
        "cell_type": "code", "execution_count": 4, "metadata": {},
        "source": "# NBVAL_CHECK_OUTPUT\nrun()",
        "outputs": [
            {"output_type": "stream", "name": "stdout",
             "text": ["loss 0.4213 after 1.2 s (pid 4711)\n", "saved to /tmp/mgpu_ab12/ckpt.pt\n"]},
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": "iVBORw0KGgo=", "text/plain": ["<Figure size 640x480 with 1 Axes>"]}},
            {"output_type": "stream", "name": "stdout", "text": ["\x1b[32mdone\x1b[0m  \n"]},
            {"output_type": "execute_result", "execution_count": 4, "metadata": {},
             "data": {"text/plain": ["<All keys matched successfully>"]}}]})
    assert checks_output(cell)
    assert not checks_output(nbformat.from_dict({**cell, "source": "run()  # NBVAL_CHECK_OUTPUT later"}))
    assert not checks_output(nbformat.from_dict({**cell, "source": "# NBVAL_IGNORE_OUTPUT\nrun()"}))
    # the page: one stdout element per run of stdout (here split by the figure), colours without codes
    page = [[STDOUT, "loss 0.4213 after 870 ms (pid 99)\nsaved to /tmp/mgpu_zz9/ckpt.pt\n"],
            ["image/png", ""], [STDOUT, "done  \n"], ["text/plain", "<All keys matched successfully>"]]
    assert output_diff(cell, page, p) == ""
    # the stdout outputs may be split differently: nbval compares them together
    assert output_diff(cell, [[STDOUT, page[0][1] + page[2][1]], *page[1:2], page[3]], p) == ""

    def changed(i, text):
        return [[m, text if j == i else t] for j, (m, t) in enumerate(page)]

    d = output_diff(cell, changed(0, page[0][1].replace("0.4213", "0.4214")), p)
    assert "-loss 0.4213 after DURATION (pid PID)" in d and "+loss 0.4214 after DURATION (pid PID)" in d, d
    assert d.startswith("--- committed\n+++ page"), d
    assert output_diff(cell, changed(2, "done  "), p), "a missing final newline"
    assert output_diff(cell, changed(2, "done\n"), p), "trailing spaces: the page keeps them"
    assert output_diff(cell, changed(3, "<All keys matched>"), p), "an execute_result's text"
    assert output_diff(cell, page + [[STDERR, "careful\n"]], p), "an unexpected stderr"
    assert output_diff(cell, [o for o in page if o[0] != "image/png"], p), "a figure not shown"
    assert output_diff(cell, page[:3], p), "no execute_result"


def test_kernel_message_reads_jupyterlabs_websocket_frames():
    def frame(channel, header, content):
        parts = [channel.encode(), json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]
        offsets, at = [], 8 * (1 + len(parts) + 1)
        for part in parts:
            offsets.append(at)
            at += len(part)
        offsets.append(at)
        return (len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
                + b"".join(parts))

    err = {"ename": "ValueError", "evalue": "boom", "traceback": []}
    assert kernel_message(frame("iopub", {"msg_type": "error"}, err)) == ("iopub", "error", err)
    assert kernel_message(frame("iopub", {"msg_type": "stream"}, {"text": "x"})) == ("iopub", "stream", {})
    legacy = {"channel": "iopub", "header": {"msg_type": "error"}, "content": err}
    assert kernel_message(json.dumps(legacy)) == ("iopub", "error", err)
    assert kernel_message('{"schema_id": "https://events.jupyter.org/x"}') is None
    assert kernel_message(b"\x00") is None
