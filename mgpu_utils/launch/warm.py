"""Warm launches: a template process that has already imported PyTorch forks the ranks (every launch
of lessons 00-12 on Linux; lesson 00 explains it).

Used by :func:`mgpu_utils.launch.launcher.launch` (``via="warm"``, the default on Linux); explained in
``notebooks/00_setup.ipynb``. ``benchmarks/launch_overhead.py`` measures it against bare torchrun.

Why. A 4-rank job that does nothing takes about 6 s under torchrun on a 2-core machine (about 0.3 s
warm; ``benchmarks/launch_overhead.py``), and almost all of it is every rank importing PyTorch (about 3 s each, plus ``torch._dynamo`` that DDP's
constructor imports). A course launches dozens of jobs, so the same import repeats dozens of times.

How. The first warm launch of a process (a notebook's kernel, a pytest run) starts one *template*,
``python -m mgpu_utils.launch.warm_template``: it imports torch, ``torch.distributed``, DDP, FSDP, DTensor,
checkpointing, pipelining, numpy and scikit-learn's datasets, and then waits. It never initialises
CUDA, starts no thread and imports none of the course's own modules. Each launch, it forks one
child per rank, and the child becomes what torchrun would have started:

* its own session (``setsid``, as torchrun's ``start_new_session``), killed if the template dies;
* exactly the environment torchrun gives a worker: the launcher's, plus ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_*``, ``MASTER_ADDR``, ``MASTER_PORT``
  (a TCPStore the launcher hosts, as torchrun's agent does), ``TORCHELASTIC_*`` and
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING``; ``torch.set_num_threads(OMP_NUM_THREADS)`` and the same limit
  for numpy's BLAS (OpenMP and OpenBLAS read the variable only when they load);
* stdout and stderr in per-rank log files laid out as torchrun's ``--log-dir`` lays them out, the
  current directory of the caller, ``sys.argv``, ``sys.path[0]`` = the script's folder, torch's and
  numpy's global random state reseeded (a fresh process draws new seeds), and the course's modules
  imported afresh from disk (an edited ``mgpu_utils`` file is seen at the next launch);
* the script runs as ``__main__`` (:func:`runpy.run_path`); an uncaught exception prints its
  traceback and exits 1, ``sys.exit(n)`` exits n, a ``KeyboardInterrupt`` ends it by SIGINT, as
  ``python script.py`` would; at the end the atexit callbacks run, then ``os._exit``.

The template watches its children as torchrun's agent does: when one ends with a non-zero status
the others get SIGTERM, and SIGKILL :data:`GRACE_S` = 3 s later (torchrun waits up to 30 s; the
course's scripts do not handle SIGTERM, so both end at once); it reports every rank's exit status.
It ends when the process that started it ends (their socket closes), and its ranks die with it;
:func:`close_template` ends it earlier (it holds the memory of one process that imported torch).

What differs from torchrun, and what the launcher does about it:

* a few environment variables are read when torch, OpenMP or the C library *load* (``TORCH_LOGS``,
  ``LD_PRELOAD``, ``OMP_PROC_BIND``, ``MALLOC_*``, ...). A launch whose environment differs from the
  template's in one of them (:func:`import_time_env`) restarts the template with it;
* what torch and the libraries print while they are imported goes to the template's log
  (:meth:`Template.log_text`), once, not to every rank's stderr;
* Python's string-hash seed (``PYTHONHASHSEED``) is fixed when an interpreter starts: warm ranks share
  the template's, where torchrun's ranks each draw one (set iteration order is the same on every rank);
* ``ps`` shows the ranks as ``python -m mgpu_utils.launch.warm_template``, and ``LaunchResult.command`` is
  the torchrun command the launch stands for, not one that ran;
* an upgraded torch, or an edited file outside ``mgpu_utils``, is seen after a kernel restart;
* a template that is not fork-safe (a thread, or the CUDA driver loaded, after its imports: e.g. on a
  GPU machine without NVML) is reported by :meth:`Template.unsafe`, ended, and that kernel launches
  with torchrun, saying why once.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

#: Seconds between SIGTERM and SIGKILL when the template stops ranks (torchrun's agent: SIGTERM, then SIGKILL).
GRACE_S = 3.0
_IMPORT_PREFIXES = ("TORCH", "PYTORCH", "LD_", "PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_",
                    "NUMEXPR_", "MALLOC_", "GLIBC_TUNABLES", "CUDA_MODULE_LOADING")
_PER_LAUNCH = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONUNBUFFERED",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCH_DISTRIBUTED_DEBUG"}


def import_time_env(env: dict) -> dict:
    """The variables of ``env`` that may matter when torch, OpenMP, BLAS or the C library load (``TORCH*``,
    ``LD_*``, ``PYTHON*``, ``OMP_*``, MKL/OpenBLAS, ``MALLOC_*``), less those a rank applies itself (thread
    counts, ``TORCH_DISTRIBUTED_DEBUG``). A template started with other values of these is replaced."""
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_PREFIXES) and k not in _PER_LAUNCH}


def rank_env(env: dict, rank: int, nproc: int, port: int, run_id: str, error_file: str) -> dict:
    """The environment torchrun ``--standalone --nproc-per-node nproc`` gives worker ``rank`` (torch 2.14).

    Args:
        env: the launcher's environment for every rank (``PYTHONPATH``, ``OMP_NUM_THREADS``, ...).
        port: the rendezvous store's TCP port on localhost (``MASTER_PORT``).
        run_id: ``TORCHELASTIC_RUN_ID``; error_file: ``TORCHELASTIC_ERROR_FILE``.
    """
    out = dict(env)
    out.update({"RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0, "ROLE_RANK": rank, "ROLE_NAME": "default",
                "WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc, "GROUP_WORLD_SIZE": 1, "ROLE_WORLD_SIZE": nproc,
                "MASTER_ADDR": "localhost", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": 0,
                "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
                # torchrun keeps a value the user set, else 1
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", 1),
                "TORCHELASTIC_ERROR_FILE": error_file,
                "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"})
    return {k: str(v) for k, v in out.items()}


class _Lines:
    """Newline-delimited JSON messages over a socket, read with a timeout."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def get(self, timeout: float | None):
        """The next message; None on timeout; ``EOFError`` when the other side has gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                return None
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the other end of the warm template's socket closed")
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


class Template:
    """The template process, seen from the process that launches (one per kernel, started on first use).

    Attributes:
        pid: the template's process id. ready: its ready message (``import_seconds``, ``threads``,
        ``cuda_loaded``), waited for on first use. env: the environment it was started with.
    """

    def __init__(self, env: dict, wait: bool = True):
        ours, theirs = socket.socketpair()
        self.env = dict(env)
        tenv = dict(env, OPENBLAS_NUM_THREADS="1")    # OpenBLAS starts its threads when numpy loads it
        tenv.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")   # is_available() without initialising CUDA
        self.log = tempfile.TemporaryFile("w+")             # what the template prints (import warnings, a crash)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mgpu_utils.launch.warm_template", "--fd", str(theirs.fileno()),
             "--owner", str(os.getpid())],
            pass_fds=(theirs.fileno(),), env=tenv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            start_new_session=True, cwd=os.getcwd())
        theirs.close()
        self.pid, self.sock, self.lines = self.proc.pid, ours, _Lines(ours)
        self._send_lock, self._read_lock, self._mail_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._mail: dict = {}
        self._ready = None
        atexit.register(self.close)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 300.0) -> dict:
        """Its ready message (``import_seconds``, ``threads``, ``cuda_loaded``), waiting for it the first time.

        Raises:
            RuntimeError: it did not start (its output says why); it has then been ended.
        """
        with self._read_lock:
            if self._ready is None:
                try:
                    msg = self.lines.get(timeout)
                except (EOFError, OSError):
                    msg = None
                if not msg or not msg.get("ready"):
                    self.close()
                    raise RuntimeError(f"the warm template did not start: {self.log_text()[-2000:] or 'no output'}")
                self._ready = msg
        return self._ready

    @property
    def ready(self) -> dict:
        return self.wait_ready()

    def log_text(self) -> str:
        """What the template printed (import warnings, a crash)."""
        try:
            self.log.seek(0)
            return self.log.read()
        except ValueError:
            return ""

    def alive(self) -> bool:
        """Whether the template process is still running."""
        return self.proc.poll() is None

    def unsafe(self) -> str | None:
        """Why forking this template would not be safe (threads, the CUDA driver loaded), or None."""
        r = self.ready
        if r["threads"] != 1:
            return f"the template runs {r['threads']} threads after its imports (fork copies only one)"
        if r["cuda_loaded"]:
            return "the CUDA driver was loaded while the template imported torch (CUDA cannot be used after fork)"
        return None

    def send(self, msg: dict) -> None:
        """Send one message to the template (``{"cmd": "launch" | "stop", "id": ...}``); thread-safe."""
        with self._send_lock:
            self.lines.send(msg)

    def receive(self, job_id: str, timeout: float):
        """The next message for job ``job_id``, None after ``timeout`` seconds. Several threads may each wait
        for their own job (``benchmarks/exit_stress.py --jobs 2``): whoever reads files the others' mail.

        Raises:
            EOFError: the template has gone.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._mail_lock:
                if self._mail.get(job_id):
                    return self._mail[job_id].pop(0)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self._read_lock.acquire(timeout=left):
                return None
            try:
                with self._mail_lock:
                    if self._mail.get(job_id):
                        continue
                msg = self.lines.get(min(left, 0.05))
                if msg is not None:
                    with self._mail_lock:
                        self._mail.setdefault(msg["id"], []).append(msg)
            finally:
                self._read_lock.release()

    def start(self, job: dict) -> tuple[str, dict]:
        """Fork the ranks of ``job`` (see :func:`_start_ranks`); returns (job id, ``{rank: pid}``)."""
        job_id = uuid.uuid4().hex
        self.send({"cmd": "launch", "id": job_id, **job})
        try:
            msg = self.receive(job_id, 60.0)
            if not msg or "pids" not in msg:
                raise RuntimeError(f"the warm template did not start the ranks within 60 s: {msg!r}")
        except BaseException:                              # interrupted, or too slow: stop what it started
            try:
                self.send({"cmd": "stop", "id": job_id})
            except OSError:
                pass
            raise
        return job_id, {int(r): p for r, p in msg["pids"].items()}

    def close(self) -> None:
        """End the template (its ranks die with it) and free its socket."""
        atexit.unregister(self.close)
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=GRACE_S + 2)     # it exits on EOF, after stopping any ranks
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.log.close()


class WarmJob:
    """One launch's ranks, forked by the template; the same interface the launcher uses for torchrun.

    ``wait(timeout)`` returns the job's exit status (0, or 1 when a rank failed, as torchrun) or None while
    it runs; ``codes`` is then ``{rank: exit status}`` (negative: killed by that signal), ``stop()`` ends it.
    """

    def __init__(self, template: Template, store, job_id: str, pids: dict):
        self.template, self.store, self.id, self.pids = template, store, job_id, pids
        self.codes: dict = {}
        self.returncode = None

    def wait(self, timeout: float):
        """The job's exit status once every rank has ended, else None after ``timeout`` seconds.

        Raises:
            RuntimeError: the template ended during the job (its ranks ended with it).
        """
        if self.returncode is not None:
            return self.returncode
        try:
            msg = self.template.receive(self.id, timeout)
        except (EOFError, OSError, ValueError):            # gone, or closed by another thread
            code = self.template.proc.wait()
            self.store = None
            raise RuntimeError(f"the warm template (pid {self.template.pid}) ended during the launch with "
                               f"status {code}; its ranks ended with it. The next launch starts a new one "
                               f"(or use via='torchrun'). Its log:\n{self.template.log_text()[-2000:]}") from None
        if msg and msg.get("done"):
            self.codes = {int(r): c for r, c in msg["codes"].items()}
            self.returncode = 0 if all(c == 0 for c in self.codes.values()) else 1
            self.store = None                       # the rendezvous store closes with the job
        return self.returncode

    def stop(self) -> None:
        """SIGTERM every rank, SIGKILL after :data:`GRACE_S`; returns when all have ended (or the template
        did not answer, and was killed: its ranks die with it)."""
        if self.returncode is not None:
            return
        try:
            self.template.send({"cmd": "stop", "id": self.id})
            deadline = time.monotonic() + GRACE_S + 5
            while self.wait(0.2) is None and time.monotonic() < deadline:
                pass
        except (OSError, RuntimeError):
            pass
        if self.returncode is None:
            self.template.proc.kill()
            self.template.proc.wait()
        self.store = None


_TEMPLATE: Template | None = None
_TEMPLATE_LOCK = threading.Lock()
_UNSAFE: str | None = None                                 # why this process's templates cannot fork safely


def get_template(env: dict, wait: bool = True, timeout_s: float = 300.0) -> Template:
    """The kernel's template, started now if there is none, it died, or ``env`` differs from its
    environment in a variable read at import time (:func:`import_time_env`). ``wait=False`` returns
    while it still imports (:func:`mgpu_utils.launch.launcher.warm_up`); else it waits up to ``timeout_s``.

    Raises:
        RuntimeError: the template did not start (with its output).
    """
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        t = _TEMPLATE
        if t is not None and (not t.alive() or import_time_env(t.env) != import_time_env(env)):
            t.close()
            t = _TEMPLATE = None
        if t is None:
            t = _TEMPLATE = Template(env, wait=False)
    if wait:
        try:
            t.wait_ready(timeout_s)
        except RuntimeError:
            with _TEMPLATE_LOCK:
                if _TEMPLATE is t:
                    _TEMPLATE = None
            raise
    return t


def settle(timeout_s: float = 120.0) -> None:
    """Return once this kernel's template, if one is still importing PyTorch (:func:`mgpu_utils.course.start`
    starts it in the background), is ready: a measurement that needs a quiet machine
    (:class:`mgpu_utils.timing.LoadWatch`) then does not measure the course's own start-up. A template
    that fails to start is left to the next launch to report."""
    t = _TEMPLATE
    if t is not None and t._ready is None and t.alive():
        try:
            t.wait_ready(timeout_s)
        except RuntimeError:
            pass


def close_template() -> None:
    """End the kernel's template now (the next warm launch starts a new one)."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        t, _TEMPLATE = _TEMPLATE, None
    if t is not None:
        t.close()


def start_job(script: str, args, nproc: int, env: dict, log_dir: str, cwd: str,
              timeout_s: float = 300.0) -> WarmJob:
    """Start ``nproc`` ranks of ``script`` from the template, torchrun's way (see the module docstring).

    Args:
        script: absolute path of the script; args: its command-line arguments (strings).
        env: the launcher's environment for every rank; log_dir: where ``<run>/attempt_0/<rank>/std*.log`` go.
        timeout_s: how long a template that is still starting may take (the launch's own limit).

    Returns:
        A :class:`WarmJob` (poll it with ``wait``).

    Raises:
        RuntimeError: the template could not start, or is not fork-safe (the message says why).
    """
    from torch.distributed import TCPStore

    global _UNSAFE
    if _UNSAFE:
        raise RuntimeError(_UNSAFE)
    template = get_template(env, timeout_s=timeout_s)
    why = template.unsafe()
    if why:                                                # said once by the launcher; this process now
        _UNSAFE = f"warm launches are not safe here: {why}"   # launches with torchrun
        close_template()
        raise RuntimeError(_UNSAFE)
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)   # torchrun's agent hosts it too
    run_id = uuid.uuid4().hex
    base = os.path.join(log_dir, run_id, "attempt_0")
    ranks = [rank_env(env, r, nproc, store.port, run_id, os.path.join(base, str(r), "error.json"))
             for r in range(nproc)]
    job_id, pids = template.start({"script": script, "args": list(args), "envs": ranks, "log_dir": base,
                                   "cwd": cwd})
    return WarmJob(template, store, job_id, pids)
