"""`make lab` starts quietly: no unencrypted-TCP warning from a kernel, no question about Jupyter news, and
the committed notebooks trusted. The server is started exactly as `make lab` starts it (through make, with
only a port, a token and no browser added), a kernel is started through the REST API, and the server's own
log is read. Everything is shut down through the API, then by signal, even when an assert fails."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbformat.sign import NotebookNotary

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, token: str, path: str, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_make_lab_starts_quiet_and_trusted(tmp_path):
    port, token = _free_port(), "mgpu-test-token"
    log = tmp_path / "lab.log"
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base, kernel = f"http://127.0.0.1:{port}", None
    try:
        _wait(lambda: proc.poll() is None and _api(base, token, "/api/status") is not None, 90,
              f"JupyterLab on port {port} (log: {log.read_text()[-2000:]})")
        sockets = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"mgpu-lab-{os.getuid()}"   # as the Makefile
        before = set(sockets.glob("kernel-*"))
        kernel = _api(base, token, "/api/kernels", "POST", {"name": "python3"})["id"]
        # the kernel binds its IPC sockets right after the point where ipykernel warns about TCP
        _wait(lambda: len(set(sockets.glob("kernel-*")) - before) >= 5 or "without encryption" in log.read_text(), 60,
              f"the kernel's sockets in {sockets}")
        time.sleep(1.0)                                   # the kernel's start-up log lines
        text = log.read_text()
        assert "Kernel started" in text, text[-2000:]
        assert "without encryption" not in text and "eavesdropping" not in text, text[-2000:]
        notification = _api(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
        assert notification["schema"]["properties"]["fetchNews"]["default"] == "false", "no news pop-up"
        notary = NotebookNotary()
        untrusted = [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
                     if not notary.check_signature(nbformat.read(p, as_version=4))]
        assert not untrusted, f"not trusted after `make lab`: {untrusted}"
    finally:
        try:
            if kernel:
                _api(base, token, f"/api/kernels/{kernel}", "DELETE")
            _api(base, token, "/api/shutdown", "POST")
        except OSError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            pytest.fail(f"JupyterLab did not shut down through its API (log: {log.read_text()[-2000:]})")
