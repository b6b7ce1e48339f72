"""`make lab` starts quietly: no unencrypted-TCP warning from a kernel, no question about Jupyter news, and
the committed notebooks trusted. The server is started exactly as `make lab` starts it (through make, with
only a port, a token and no browser added), a kernel is started through the REST API, and the server's own
log is read. Everything is shut down through the API, then by signal, even when an assert fails."""
import os
import time
from pathlib import Path

import nbformat
from lab_server import ROOT, api, running_lab, wait
from nbformat.sign import NotebookNotary


def test_make_lab_starts_quiet_and_trusted(tmp_path, starts_processes):
    with running_lab(tmp_path) as (base, token, log, _):
        sockets = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / f"mgpu-lab-{os.getuid()}"   # as the Makefile
        before = set(sockets.glob("kernel-*"))
        api(base, token, "/api/kernels", "POST", {"name": "python3"})
        # the kernel binds its IPC sockets right after the point where ipykernel warns about TCP
        wait(lambda: len(set(sockets.glob("kernel-*")) - before) >= 5 or "without encryption" in log.read_text(), 60,
             f"the kernel's sockets in {sockets}")
        time.sleep(1.0)                                   # the kernel's start-up log lines
        text = log.read_text()
        assert "Kernel started" in text, text[-2000:]
        assert "without encryption" not in text and "eavesdropping" not in text, text[-2000:]
        notification = api(base, token, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
        assert notification["schema"]["properties"]["fetchNews"]["default"] == "false", "no news pop-up"
        notary = NotebookNotary()
        untrusted = [p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
                     if not notary.check_signature(nbformat.read(p, as_version=4))]
        assert not untrusted, f"not trusted after `make lab`: {untrusted}"
