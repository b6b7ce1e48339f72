"""The warm launch template: the process that imports PyTorch once and forks the ranks of every launch
(lessons 00-12).

Started by :class:`mgpu_utils.launch.warm.Template` (which explains the whole design) as
``python -m mgpu_utils.launch.warm_template --fd N --owner PID``; it talks to the launching process over
the socket ``N`` (newline-delimited JSON, :class:`mgpu_utils.launch.warm._Lines`):

* ``{"cmd": "launch", "id", "script", "args", "envs", "log_dir", "cwd"}`` forks one child per entry of
  ``envs`` and answers ``{"id", "pids": {rank: pid}}``;
* ``{"cmd": "stop", "id"}`` sends SIGTERM to that job's ranks, SIGKILL :data:`mgpu_utils.launch.warm.GRACE_S` later
  (torchrun's agent waits up to 30 s; the course's scripts do not handle SIGTERM, so both end at once);
* when every rank of a job has ended it sends ``{"id", "done": true, "codes": {rank: exit status}}``;
  when one rank fails, the others are stopped in the same way first, as torchrun's agent does;
* when the socket closes (the launching process ended), every rank is killed and the template exits.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import time

from mgpu_utils.launch.warm import GRACE_S, _Lines

#: What the template imports before it forks (what the launch scripts import, and what that imports).
PREIMPORT = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch.distributed.fsdp",
             "torch.distributed.tensor", "torch.distributed.tensor.parallel", "torch.distributed.checkpoint",
             "torch.distributed.checkpoint.state_dict", "torch.distributed.pipelining", "torch.distributed.optim",
             "torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.elastic.multiprocessing.errors",
             "numpy", "sklearn.datasets")


def _serve(fd: int) -> None:
    import importlib

    t0 = time.perf_counter()
    for name in PREIMPORT:
        try:
            importlib.import_module(name)
        except ImportError:                 # an optional package missing: the ranks import it themselves
            pass
    sys.modules["mgpu_utils"]._template_marker = True   # a rank that sees this got a stale module (a test checks)
    with open("/proc/self/maps") as f:
        cuda_loaded = "libcuda.so" in f.read()
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    lines = _Lines(socket.socket(fileno=fd))
    lines.send({"ready": True, "pid": os.getpid(), "import_seconds": time.perf_counter() - t0,
                "threads": len(os.listdir("/proc/self/task")), "cuda_loaded": cuda_loaded})
    signal.signal(signal.SIGINT, signal.SIG_IGN)           # a Ctrl-C in a terminal is the launcher's to handle
    jobs: dict = {}                                        # id -> {"pids": {pid: rank}, "codes", "term_at"}
    while True:
        _reap(jobs)
        for job_id, job in list(jobs.items()):
            if job["term_at"] is not None and time.monotonic() - job["term_at"] > GRACE_S:
                _signal_ranks(job, signal.SIGKILL)
            if len(job["codes"]) == len(job["pids"]):
                for p in job["pids"]:                     # what a rank left behind in its session (never
                    _signal_group(p, signal.SIGKILL, session_only=True)    # the pid itself: reaped, reusable)
                del jobs[job_id]
                try:
                    lines.send({"id": job_id, "done": True, "codes": job["codes"]})
                except OSError:                            # the launching process has gone: handled below
                    pass
        try:
            msg = lines.get(0.05 if jobs else None)
        except (EOFError, OSError):                        # the launching process ended: so do its ranks
            for job in jobs.values():
                _signal_ranks(job, signal.SIGKILL)
            return
        if not msg:
            continue
        if msg.get("cmd") == "launch":
            pids = _start_ranks(msg, base_path, lines.sock.fileno())
            jobs[msg["id"]] = {"pids": pids, "codes": {}, "term_at": None}
            try:
                lines.send({"id": msg["id"], "pids": {r: p for p, r in pids.items()}})
            except OSError:
                pass
        elif msg.get("cmd") == "stop" and msg.get("id") in jobs and jobs[msg["id"]]["term_at"] is None:
            jobs[msg["id"]]["term_at"] = time.monotonic()
            _signal_ranks(jobs[msg["id"]], signal.SIGTERM)


def _signal_group(pid: int, sig: int, session_only: bool = False) -> None:
    """Signal the session of rank ``pid`` (the rank and what it started: DataLoader workers); a rank not yet
    in its own session gets the signal itself, unless ``session_only``."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        if not session_only:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _signal_ranks(job: dict, sig: int) -> None:
    for p, r in job["pids"].items():
        if r not in job["codes"]:
            _signal_group(p, sig)


def _reap(jobs: dict) -> None:
    """Collect the exit status of every rank that ended; when one failed, SIGTERM the others of its job
    (torchrun's agent does the same)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for job in jobs.values():
            if pid in job["pids"]:
                code = job["codes"][job["pids"][pid]] = os.waitstatus_to_exitcode(status)
                if code != 0 and job["term_at"] is None:
                    job["term_at"] = time.monotonic()
                    _signal_ranks(job, signal.SIGTERM)


def _start_ranks(job: dict, base_path: list, ctl_fd: int) -> dict:
    """Fork one child per rank of ``job``; returns ``{pid: rank}``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for rank, env in enumerate(job["envs"]):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _become_rank(job, rank, env, base_path, ctl_fd)
            except BaseException:                          # noqa: BLE001 - e.g. the cwd is gone: say so
                import traceback

                traceback.print_exc()                      # to the rank's stderr.log (or the template's log)
                sys.stderr.flush()
            finally:
                os._exit(code)
        pids[pid] = rank
    return pids


def _become_rank(job: dict, rank: int, env: dict, base_path: list, ctl_fd: int) -> int:
    """In the forked child: become rank ``rank`` of ``job`` as torchrun would have started it, run the
    script, return its exit status."""
    import ctypes
    import io
    import runpy

    parent = os.getppid()
    os.setsid()
    try:                                                   # PR_SET_PDEATHSIG: die with the template
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        return 1
    os.close(ctl_fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    folder = os.path.join(job["log_dir"], str(rank))
    os.makedirs(folder, exist_ok=True)
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, os.path.join(folder, "stdout.log"), 0),
                            (2, os.path.join(folder, "stderr.log"), 0)):
        new = os.open(name, flags or (os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 0o644)
        os.dup2(new, fd)
        os.close(new)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                   write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(env)
    script = job["script"]
    python_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = list(dict.fromkeys([os.path.dirname(script)] + python_path + base_path))
    for name in [m for m in sys.modules if m == "mgpu_utils" or m.startswith("mgpu_utils.")]:
        del sys.modules[name]                              # the course's modules: fresh from disk
    import importlib

    importlib.invalidate_caches()
    _set_threads(env)
    import torch.distributed as dist

    if dist.is_available():                                # read when torch.distributed is imported: again
        dist.set_debug_level_from_env()                    # for this rank's TORCH_DISTRIBUTED_DEBUG
    sys.argv = [script, *job["args"]]
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = (e.code & 0xFF) if isinstance(e.code, int) else (0 if e.code is None else 1)   # as exit(3) does
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:                             # noqa: BLE001 - printed as Python prints it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next                                 # from the script's frame on, as `python script.py`
        e.__traceback__ = tb or e.__traceback__            # the built-in hook prints e.__traceback__
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
        if isinstance(e, KeyboardInterrupt):
            return _finish(code, by_sigint=True)
    return _finish(code)


def _set_threads(env: dict) -> None:
    import torch

    n = max(1, int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    torch.set_num_threads(n)
    torch.seed()                                           # a fresh process draws its own seeds (torch, numpy)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(int(env.get("OPENBLAS_NUM_THREADS") or n), user_api="blas")
    except ImportError:
        pass


def _finish(code: int, by_sigint: bool = False) -> int:
    """What the interpreter does at exit, without finalization (see :func:`mgpu_utils.dist.shutdown`):
    join non-daemon threads, run the atexit callbacks, flush Python's and the C library's buffers; after an
    uncaught KeyboardInterrupt the process ends by SIGINT, as Python's does."""
    import ctypes
    import threading

    try:
        threading._shutdown()
    except Exception:                                      # noqa: BLE001 - exit anyway
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)                     # printf from C/C++ code: os._exit would drop it
    except (OSError, AttributeError):
        pass
    if by_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def main(argv=None) -> None:
    """Entry point of the template process: ``python -m mgpu_utils.launch.warm_template --fd N --owner PID``."""
    import argparse

    p = argparse.ArgumentParser(description="the warm launch template (started by mgpu_utils.launch.launcher)")
    p.add_argument("--fd", type=int, required=True, help="the socket to the launching process")
    p.add_argument("--owner", type=int, default=0, help="the launching process's pid (for ps and tests)")
    _serve(p.parse_args(argv).fd)


if __name__ == "__main__":
    main()
