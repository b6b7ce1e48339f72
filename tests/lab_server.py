"""JupyterLab started exactly as `make lab` starts it, for the tests that talk to it (test_lab.py, test_browser.py).

Only a free port, a token and ``--no-browser`` are added (through ``LAB_ARGS``), plus the environment the
caller passes (a runtime folder, user settings). The server is shut down through its API, then by signal,
even when the test fails.

Also the one place that decides whether tests/repo/test_browser.py can drive a browser here and which notebooks it
runs: tests/conftest.py asks the same functions, so that each notebook is executed once per `make test`, in the
browser when there is one (or when CI requires one), else under nbval.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Debian's Chromium (Ubuntu's chromium package is a snap stub that does not run in containers)
CHROMIUM = os.environ.get("MGPU_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# as the probe of this machine starts it: no sandbox as root, no network a closed machine refuses anyway
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


def browser_missing() -> str | None:
    """Why tests/repo/test_browser.py cannot drive a browser on this machine (its SKIPPED line, with the fix), or
    None when it can: the playwright package imports and Chromium is at ``CHROMIUM``."""
    try:
        from playwright import sync_api  # noqa: F401
    except ImportError:
        return "SKIPPED: no playwright package: .venv/bin/pip install playwright (make setup installs it)"
    if not Path(CHROMIUM).exists():
        return f"SKIPPED: no Chromium at {CHROMIUM}: apt-get install chromium (or set MGPU_CHROMIUM)"
    return None


def browser_required() -> bool:
    """CI (.ci/run) sets MGPU_REQUIRE_BROWSER=1: a missing browser fails the browser test instead of skipping it."""
    return os.environ.get("MGPU_REQUIRE_BROWSER") == "1"


def browser_runs_notebooks() -> bool:
    """The browser test runs its notebooks here (or fails because it cannot, where the browser is required)."""
    return browser_required() or browser_missing() is None


def browser_notebooks() -> list[Path]:
    """The lessons the browser test runs: all of notebooks/NN_*.ipynb, or those MGPU_BROWSER_NOTEBOOKS names
    (e.g. "00,04"); the others are left to nbval."""
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    only = os.environ.get("MGPU_BROWSER_NOTEBOOKS")
    if only:
        wanted = {n.strip() for n in only.split(",")}
        paths = [p for p in paths if p.name[:2] in wanted]
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, token: str, path: str, method: str = "GET", body: dict | None = None):
    """One call of Jupyter's REST API; returns the decoded JSON (None for an empty body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def wait(predicate, timeout_s: float, what: str, every_s: float = 0.5):
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextlib.contextmanager
def running_lab(tmp_path: Path, env: dict | None = None, token: str = "mgpu-test-token"):
    """Start `make lab` on a free port; yields ``(base_url, token, log_path, process)``."""
    port = free_port()
    log = tmp_path / "lab.log"
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), **(env or {}))
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base, failed = f"http://127.0.0.1:{port}", False
    try:
        wait(lambda: proc.poll() is None and api(base, token, "/api/status") is not None, 90,
             f"JupyterLab on port {port} (log: {log.read_text()[-2000:]})")
        yield base, token, log, proc
    except BaseException:
        failed = True                                   # the test's own error is the one to report
        raise
    finally:
        with contextlib.suppress(OSError):
            for k in api(base, token, "/api/kernels") or []:
                api(base, token, f"/api/kernels/{k['id']}", "DELETE")
        with contextlib.suppress(OSError):
            api(base, token, "/api/shutdown", "POST")
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            if not failed:
                raise AssertionError(f"JupyterLab did not shut down through its API (log: {log.read_text()[-2000:]})")
