"""JupyterLab started exactly as `make lab` starts it, for the tests that talk to it (test_lab.py, test_browser.py).

Only a free port, a token and ``--no-browser`` are added (through ``LAB_ARGS``), plus the environment the
caller passes (a runtime folder, user settings). The server is shut down through its API, then by signal,
even when the test fails.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
