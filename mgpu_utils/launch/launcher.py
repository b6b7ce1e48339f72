"""Run a launch script under torchrun from a notebook cell (or a test) and get rank 0's result.

Introduced in ``notebooks/00_setup.ipynb``; every later lesson uses it::

    from mgpu_utils.launch.launcher import launch
    result = launch("ddp_train.py", nproc=4, args=["--epochs", "8"])   # dict from rank 0

Why not ``mp.spawn`` of a function from a cell: the child processes cannot unpickle functions
defined in ``__main__`` (the notebook), so the launcher always runs a script file, exactly as an
engineer would with ``torchrun --standalone --nproc-per-node N script.py``.

What it adds over typing torchrun in a terminal:

* a free rendezvous port (``--standalone`` binds port 0, so a process on 29500 does not matter);
* each rank's output, prefixed ``[rank r]`` and grouped rank by rank (deterministic order);
* when a rank fails, a :class:`LaunchError` naming that rank with its exception and message
  (torchrun stops the other ranks within a fraction of a second: no 30-minute collective timeout);
* on timeout or kernel interrupt every child process is killed (no orphans, the port is freed);
* bad input is refused with a message that names the fix;
* on Linux, by default, the ranks are forked from a warm template process that has already imported
  torch (:mod:`mgpu_utils.launch.warm`): the same processes, environment and reports as torchrun's, in well
  under a second instead of several. ``via="torchrun"`` runs real torchrun.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_utils.compat import check_torch_version
from mgpu_utils.dist import BACKEND_ENV, ERROR_MARKER, HIDDEN_GPUS_ENV, RESULT_MARKER, parse_result, wrap_text

#: The repository root (parent of ``mgpu_utils/``); added to the children's ``PYTHONPATH``.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Where :func:`launch` looks for a script given by bare file name.
SCRIPTS_DIR = REPO_ROOT / "launch_scripts"

# Errors that a surviving rank sees *because* another rank died: not the root cause.
_SECONDARY = re.compile(r"Connection (closed|reset) by peer|Broken pipe|SIGTERM|Socket Timeout|"
                        r"connection refused|recvBytes|Connection was likely closed|remote worker", re.IGNORECASE)
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\w*)(?::\s?(.*))?$")


class LaunchError(RuntimeError):
    """A launched job failed. ``rank``, ``exc_type``, ``message`` name the root cause.

    Attributes:
        rank: the rank that failed first (None if no rank could be blamed, e.g. a timeout).
        exc_type: the Python exception type name in that rank ("ValueError"), or "exit code N".
        message: the exception message.
        logs: ``{rank: {"stdout": str, "stderr": str}}`` for every rank.
    """

    def __init__(self, text: str, rank=None, exc_type="", message="", logs=None):
        super().__init__(text)
        self.rank, self.exc_type, self.message, self.logs = rank, exc_type, message, logs or {}


class LaunchTimeout(LaunchError):
    """The job ran past ``timeout_s``; every child process was killed."""


@dataclass
class LaunchResult:
    """Everything a launch produced.

    Attributes:
        result: rank 0's ``MGPU_RESULT`` JSON as a dict (None if it printed none).
        logs: ``{rank: {"stdout": str, "stderr": str}}``.
        seconds: wall-clock time of the whole launch, in seconds.
        returncode: torchrun's exit status (warm: the same, 0 or 1).
        command: the torchrun command line that was run (warm: the one the launch stands for).
        restarts: how many times torchrun started the workers over (0 without ``max_restarts``).
        attempt_failures: one line per restarted attempt, naming the rank that failed and why.
        via: how the ranks were started: "warm" (forked from :mod:`mgpu_utils.launch.warm`'s template) or "torchrun".
    """

    result: dict | None
    logs: dict = field(default_factory=dict)
    seconds: float = 0.0
    returncode: int = 0
    command: list = field(default_factory=list)
    restarts: int = 0
    attempt_failures: list = field(default_factory=list)
    via: str = "torchrun"


def resolve_script(script) -> Path:
    """Return the path of ``script``: as given, or by file name inside ``launch_scripts/``.

    Raises:
        FileNotFoundError: with the list of available launch scripts.
    """
    p = Path(script)
    for cand in (p, SCRIPTS_DIR / p, SCRIPTS_DIR / p.name):
        if cand.is_file():
            return cand.resolve()
    avail = ", ".join(sorted(x.name for x in SCRIPTS_DIR.glob("*.py"))) or "none"
    raise FileNotFoundError(wrap_text(f"launch script {str(script)!r} not found (looked in the current directory "
                                      f"and in launch_scripts/ of the repository).", first=len("FileNotFoundError: "))
                            + "\n" + wrap_text(f"  Available: {avail}"))


def _validate(nproc, backend) -> str | None:
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be an int (number of processes), got {nproc!r}")
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1 (number of ranks to start), got {nproc}")
    backend = backend.lower() if isinstance(backend, str) else backend
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be None (automatic), 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        from mgpu_utils.dist import gpu_status
        _, gpus, note = gpu_status()
        if note:
            raise ValueError(f"backend='nccl' cannot use the GPUs: {note}")
        if gpus < nproc:
            raise ValueError(f"backend='nccl' needs one GPU per rank: nproc={nproc} but {gpus} GPU(s) visible "
                             f"(two ranks on one GPU fail with 'Duplicate GPU detected'). Use backend='gloo' "
                             f"(or None for automatic) or nproc<={gpus}.")
    return backend


def _visible_gpus() -> tuple[int, int]:
    """(CUDA GPUs this process sees, those this PyTorch build can run): whether ranks get the GPUs hidden."""
    from mgpu_utils.dist import gpu_status

    visible, usable, _ = gpu_status()
    return visible, usable


def _kill_tree(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM torchrun and all its descendants, then SIGKILL whatever is left after ``grace_s``."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _attempt(path: str) -> int:
    """The attempt number N of a torchrun log path ``.../attempt_N/...`` (torchrun counts restarts from 0)."""
    m = re.search(r"attempt_(\d+)", path)
    return int(m.group(1)) if m else -1


def _restarts(log_dir: str) -> int:
    """How many times torchrun started the workers over: the highest attempt number in ``log_dir``."""
    return max((_attempt(d) for d in glob.glob(os.path.join(log_dir, "*", "attempt_*"))), default=0)


def _read_logs(log_dir: str, nproc: int, attempt: int | None = None) -> dict:
    """Every rank's stdout and stderr of one attempt (default: the last, which finished or failed for good)."""
    logs = {}
    for r in range(nproc):
        entry = {}
        for stream in ("stdout", "stderr"):
            files = glob.glob(os.path.join(log_dir, "*", f"attempt_{'*' if attempt is None else attempt}", str(r),
                                           f"{stream}.log"))
            last = max(files, key=_attempt) if files else None
            entry[stream] = Path(last).read_text(errors="replace") if last else ""
            entry[stream + "_mtime"] = os.path.getmtime(last) if last else float("inf")
        logs[r] = entry
    return logs


_AGENT_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def _attempt_failures(log_dir: str, nproc: int, torchrun_log: str, restarts: int) -> list[str]:
    """One line per attempt that failed before the last one: its root-cause rank and why."""
    agent = _AGENT_FAILURE.findall(torchrun_log)       # torchrun logs the first failed worker of each attempt
    out = []
    for a in range(restarts):
        logs = _read_logs(log_dir, nproc, attempt=a)
        failures = {r: f for r, e in logs.items() if (f := _rank_failure(r, e)) is not None}
        primary = {r: f for r, f in failures.items() if not f[1]}
        silent = [r for r in logs if r not in failures]     # no error of its own, and no peer's either: killed
        codes = {int(r): int(c) for c, r in agent}
        if primary:
            r = min(primary, key=lambda r: (primary[r][0], r))
            out.append(f"attempt {a}: rank {r} failed with {primary[r][2]}: {primary[r][3]}")
        elif silent:
            # torchrun logs only the first exit it sees in an attempt; ranks it stopped with SIGTERM are silent
            # too, so a rank is named only when the log proves it (a signal other than SIGTERM)
            signalled = [r for r in silent if codes.get(r, 0) < 0 and codes[r] != -signal.SIGTERM]
            if signalled or len(silent) == 1:
                r = (signalled or silent)[0]
                code = codes.get(r, 0)
                how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 and -code in \
                    signal.valid_signals() else "ended"
                out.append(f"attempt {a}: rank {r} {how} without a Python traceback (the others failed as a "
                           f"consequence)")
            else:
                out.append(f"attempt {a}: ranks {silent} ended without a Python traceback: one died first (killed, "
                           f"out of memory or a native crash), torchrun stopped the others")
        else:
            out.append(f"attempt {a}: failed (no rank reported why)")
    return out


def _rank_failure(rank: int, entry: dict):
    """(time, secondary, type, message) for a rank whose stderr shows an error, else None."""
    err = "\n".join(_TORCH_PREFIX.sub("", line) for line in entry["stderr"].splitlines())
    for line in reversed(err.splitlines()):
        if line.startswith(ERROR_MARKER):
            info = json.loads(line[len(ERROR_MARKER):])
            msg = display_paths(info["message"])
            return (info["time"], bool(_SECONDARY.search(msg)), info["type"], msg)
    if "Traceback (most recent call last)" in err:
        tail = err[err.rfind("Traceback (most recent call last)"):].splitlines()
        for line in reversed(tail):
            m = _EXC_LINE.match(line.strip())
            if m:
                msg = display_paths(m.group(2) or "")
                return (entry["stderr_mtime"], bool(_SECONDARY.search(line)), m.group(1), msg)
    return None


def _exit_codes(torchrun_err: str) -> dict:
    """``{rank: exitcode}`` from torchrun's failure summary."""
    codes = {}
    for m in re.finditer(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", torchrun_err):
        codes[int(m.group(1))] = int(m.group(2))
    return codes


def display_paths(text: str) -> str:
    """``text`` with this machine's absolute paths shortened: the repository root is dropped
    (``launch_scripts/hello_dist.py``) and the installed packages read ``site-packages/torch/...``.

    Rank output and error reports go through it, so stored notebook outputs and error messages read the
    same on every machine."""
    import sysconfig

    for prefix, short in ((sysconfig.get_paths()["purelib"], "site-packages"), (str(REPO_ROOT), "")):
        text = text.replace(prefix + os.sep, short + os.sep if short else "")
    return text


def _format_rank_output(rank: int, entry: dict, streams=("stdout", "stderr"), max_lines: int | None = None) -> str:
    out = []
    for stream in streams:
        for line in display_paths(entry[stream]).splitlines():
            if line.startswith(RESULT_MARKER) or line.startswith(ERROR_MARKER):
                continue
            line = _TORCH_PREFIX.sub("", line)  # torch's own "[rank1]: " prefix on tracebacks
            out.append(line if line.startswith(f"[rank {rank}]") else f"[rank {rank}] {line}")
    if max_lines is not None and len(out) > max_lines:
        out = [f"[rank {rank}] ... ({len(out) - max_lines} earlier lines omitted)"] + out[-max_lines:]
    return "\n".join(out)


class _Rank0Tail:
    """Prints rank 0's stdout while the job runs: complete lines, formatted as in the final output."""

    def __init__(self, log_dir: str):
        self.log_dir, self.path, self.pos, self.buf = log_dir, None, 0, b""

    def poll(self, final: bool = False) -> None:
        files = glob.glob(os.path.join(self.log_dir, "*", "attempt_*", "0", "stdout.log"))
        newest = max(files, key=_attempt) if files else None
        if newest != self.path and newest is not None:     # the first attempt, or a restart
            if self.path is not None:
                self.poll_file(final=True)
                print(f"[launcher] restart {_attempt(newest)}: torchrun started the workers again", flush=True)
            self.path, self.pos, self.buf = newest, 0, b""
        if self.path is None:
            return
        self.poll_file(final)

    def poll_file(self, final: bool = False) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            self.buf += f.read()
            self.pos = f.tell()
        done, _, self.buf = self.buf.rpartition(b"\n")
        if final and self.buf:
            done, self.buf = done + b"\n" + self.buf, b""
        text = _format_rank_output(0, {"stdout": done.decode(errors="replace")}, streams=("stdout",))
        if text:
            print(text, flush=True)


#: (pattern in the root-cause message, the fix to print): errors whose torch message does not say what to do.
FIX_HINTS = [
    (re.compile(r"busy or unavailable", re.I),
     "the GPU is in exclusive-process compute mode (`nvidia-smi -q | grep -i 'compute mode'`) and another process "
     "holds it, often this notebook's kernel after it used CUDA: restart the kernel and launch before any cell "
     "touches the GPU, or ask for the Default compute mode (`nvidia-smi -c DEFAULT`, needs root)"),
    (re.compile(r"no kernel image is available", re.I),
     "this torch build has no kernels for this GPU's compute capability (README, 'GPU requirements': install a "
     "wheel built for it, or run on the CPU tier with backend='gloo')"),
    (re.compile(r"\bNCCL\b|nccl[A-Z]\w*Error", re.I),
     "rerun with env={'NCCL_DEBUG': 'INFO'} to see what NCCL tried; in a container give it shared memory "
     "(`--shm-size=1g`) or set NCCL_SHM_DISABLE=1; without peer-to-peer support set NCCL_P2P_DISABLE=1 "
     "(README, 'NCCL troubleshooting')"),
]


def fix_hint(message: str) -> str | None:
    """The one-line fix for a root-cause message that :data:`FIX_HINTS` knows, else None."""
    return next((hint for pattern, hint in FIX_HINTS if pattern.search(message or "")), None)


def _diagnose(logs: dict, torchrun_err: str, returncode: int, codes: dict | None = None) -> LaunchError:
    """Blame the root-cause rank: a rank's own Python error first, then a rank that crashed without a
    traceback (not the agent's SIGTERM), then errors that only say a peer went away."""
    failures = {r: f for r, e in logs.items() if (f := _rank_failure(r, e)) is not None}
    primary = {r: f for r, f in failures.items() if not f[1]}
    codes = _exit_codes(torchrun_err) if codes is None else {r: c for r, c in codes.items() if c != 0}
    crashed = {r: c for r, c in codes.items() if c not in (0, -signal.SIGTERM) and r not in failures}
    if primary or (failures and not crashed):
        pool = primary or failures
        rank = min(pool, key=lambda r: (pool[r][0], r))          # the earliest report
        _, _, exc_type, message = failures[rank]
        text = wrap_text(f"rank {rank} failed with {exc_type}: {message}", first=len("LaunchError: "))
    elif crashed or codes:
        bad = crashed or {r: c for r, c in codes.items() if c != 0} or codes
        rank = min(bad)
        code = bad[rank]
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
            else f"exit code {code}"
        exc_type, message = f"exit code {code}", f"rank {rank} {how} without a Python traceback"
        text = f"rank {rank} failed: {how}, no Python traceback\n  (out of memory, os._exit or a native crash?)"
    else:
        rank, exc_type, message = None, f"exit code {returncode}", display_paths(torchrun_err.strip()[-2000:])
        text = wrap_text(f"torchrun exited with code {returncode} before any rank reported an error:\n{message}",
                         first=len("LaunchError: "))
    hint = fix_hint(message)
    if hint:
        text += "\n" + wrap_text(f"hint: {hint}")
    others = sorted(set(failures) - {rank})
    if others:
        text += f"\n(ranks {others} failed afterwards, as a consequence)"
    if rank is not None:
        text += f"\n--- output of rank {rank} (last lines) ---\n" + _format_rank_output(rank, logs[rank], max_lines=40)
    return LaunchError(text, rank=rank, exc_type=exc_type, message=message, logs=logs)


def run_torchrun(script, nproc: int = 4, args=(), *, timeout_s: float = 300.0, backend: str | None = None,
                 env: dict | None = None, show: str = "all", threads_per_rank: int | None = None,
                 max_restarts: int = 0, via: str | None = None) -> LaunchResult:
    """Run ``torchrun --standalone --nproc-per-node nproc script args`` (or its warm equivalent) and
    collect everything.

    Args:
        script: path, or file name inside ``launch_scripts/``.
        nproc: number of processes (ranks) on this machine, >= 1.
        args: extra command-line arguments for the script (converted with ``str``).
        timeout_s: wall-clock limit in seconds; past it every child is killed.
        backend: None (automatic: NCCL with one GPU per rank, else gloo), "gloo" or "nccl". When the
            ranks run on gloo on a machine with GPUs (fewer GPUs than ranks, or gloo forced), they get
            ``CUDA_VISIBLE_DEVICES=''``: they run on CPU, and library code must not take CUDA paths.
        env: extra environment variables for the ranks.
        show: "all" prints every rank's output (rank 0 first), "rank0" only rank 0's, "none" nothing.
            Rank 0's output appears while the job runs; the other ranks' when it ends, grouped by
            rank, so the output reads the same on every run.
        threads_per_rank: ``OMP_NUM_THREADS`` for each rank (default: ``$OMP_NUM_THREADS`` if set, else
            the CPU cores this process may use // nproc, at least 1).
        max_restarts: passed to torchrun's ``--max-restarts``: when a rank fails, torchrun stops every
            rank and starts them all again, up to this many times (``TORCHELASTIC_RESTART_COUNT`` tells a
            script which attempt it is; notebooks/11_fault_tolerance.ipynb). The error, if the last
            attempt fails too, names that attempt's failed rank.
        via: how the ranks start (:func:`choose_via`). "warm": forked from a template process that has
            already imported torch (:mod:`mgpu_utils.launch.warm`; a 4-rank no-op job on 2 cores: about 0.3 s
            instead of about 6), with the environment, logs, failure handling and result torchrun gives;
            "torchrun": real torchrun. None: warm on Linux, torchrun with ``max_restarts`` or elsewhere,
            ``$MGPU_LAUNCH`` overrides.

    Returns:
        :class:`LaunchResult` (``.result`` is rank 0's JSON dict, ``.restarts`` the restarts).

    Raises:
        ValueError / TypeError: bad ``nproc`` or ``backend`` (message names the fix).
        FileNotFoundError: the script does not exist.
        LaunchError: a rank failed; names the rank, its exception type and message.
        LaunchTimeout: the job ran past ``timeout_s``.
        KeyboardInterrupt: re-raised after every child has been killed.
        RuntimeError: the loaded torch is older than :data:`mgpu_utils.compat.OLDEST_TORCH`.
    """
    check_torch_version()
    backend = _validate(nproc, backend)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    if show not in ("all", "rank0", "none"):
        raise ValueError(f"show must be 'all', 'rank0' or 'none', got {show!r}")
    via = choose_via(via, max_restarts)
    path = resolve_script(script)
    child_env = dict(os.environ)
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env["PYTHONPATH"] = _pythonpath(child_env)
    child_env["PYTHONUNBUFFERED"] = "1"
    if threads_per_rank or "OMP_NUM_THREADS" not in child_env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        child_env["OMP_NUM_THREADS"] = str(threads_per_rank or max(1, cores // nproc))
    if backend:
        child_env[BACKEND_ENV] = backend
    gpus, usable = _visible_gpus()
    wanted = (child_env.get(BACKEND_ENV) or "").lower() or None   # forced here or by $MGPU_BACKEND
    if gpus and (wanted == "gloo" or (wanted is None and usable < nproc)):
        child_env["CUDA_VISIBLE_DEVICES"] = ""                        # ranks on CPU must not see the GPUs
        child_env[HIDDEN_GPUS_ENV] = str(gpus)
    if max_restarts:
        # torchrun shares its rendezvous store with the workers' init_process_group by default, and a restarted
        # group can then read the previous attempt's addresses and hang or fail to connect (pytorch/pytorch#135712;
        # measured here: 2 of 5 restarts finished without this variable, 20 of 20 with it)
        child_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    log_dir = tempfile.mkdtemp(prefix="mgpu_launch_")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--log-dir={log_dir}", "--redirects=3", f"--max-restarts={max_restarts}", str(path), *map(str, args)]
    t0 = time.perf_counter()
    agent_out = open(os.path.join(log_dir, "torchrun.log"), "w+")
    job = None
    try:
        if via == "warm":
            job = _start_warm(path, args, nproc, child_env, log_dir, timeout_s)
            if job is None:
                via = "torchrun"
        if job is None:
            job = _TorchrunJob(subprocess.Popen(cmd, stdout=agent_out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=child_env, cwd=os.getcwd(),
                                                start_new_session=True))
        tail = _Rank0Tail(log_dir) if show != "none" else None
        returncode = None
        try:
            while returncode is None and time.perf_counter() - t0 < timeout_s:
                returncode = job.wait(0.2)
                if returncode is None and tail:
                    tail.poll()
        except RuntimeError as e:    # the warm template ended under the job
            raise LaunchError(str(e), logs=_read_logs(log_dir, nproc)) from None
        except BaseException:  # KeyboardInterrupt from the notebook's stop button, or anything else
            job.stop()
            raise
        if tail:
            tail.poll(final=True)
        if returncode is None:
            job.stop()
            logs = _read_logs(log_dir, nproc)
            tails = "\n".join(_format_rank_output(r, logs[r], max_lines=10) for r in logs)
            raise LaunchTimeout(wrap_text(f"{path.name} with {nproc} rank(s) ran past timeout_s={timeout_s:g} s; all "
                                          f"processes were killed. A rank waiting in a collective that another rank "
                                          f"never called hangs like this. Last output:", first=len("LaunchTimeout: "))
                                + f"\n{tails}", logs=logs)
        seconds = time.perf_counter() - t0
        agent_out.seek(0)
        torchrun_log = agent_out.read()
        logs = _read_logs(log_dir, nproc)
        if returncode != 0:
            raise _diagnose(logs, torchrun_log, returncode, job.codes)
        if show != "none":  # rank 0's stdout was printed live; now its stderr, then the other ranks
            ranks = [0] if show == "rank0" else sorted(logs)
            parts = [_format_rank_output(r, logs[r], ("stderr",) if r == 0 else ("stdout", "stderr")) for r in ranks]
            text = "\n".join(t for t in parts if t)
            if text:
                print(text, flush=True)
        result = parse_result(logs[0]["stdout"]) if logs else None
        restarts = _restarts(log_dir)
        failed = _attempt_failures(log_dir, nproc, torchrun_log, restarts)
        if show != "none" and failed:
            print("\n".join(wrap_text("[launcher] " + f) for f in failed), flush=True)
        return LaunchResult(result, {r: {"stdout": e["stdout"], "stderr": e["stderr"]} for r, e in logs.items()},
                            seconds, returncode, cmd, restarts, failed, via)
    finally:
        agent_out.close()
        shutil.rmtree(log_dir, ignore_errors=True)


class _TorchrunJob:
    """A torchrun process, behind the interface of :class:`mgpu_utils.launch.warm.WarmJob`."""

    codes = None                      # torchrun's failure summary in its log names the exit codes

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def wait(self, timeout: float):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        _kill_tree(self.proc)


_WARM_UNSAFE_SAID = set()


def _start_warm(path: Path, args, nproc: int, child_env: dict, log_dir: str, timeout_s: float):
    """The ranks forked from the warm template (:mod:`mgpu_utils.launch.warm`); None, after saying why once, where
    the template is not fork-safe (the caller then uses torchrun)."""
    from mgpu_utils.launch import warm

    try:
        return warm.start_job(str(path), [str(a) for a in args], nproc, child_env, log_dir, os.getcwd(),
                              timeout_s=timeout_s)
    except RuntimeError as e:
        if "not safe" not in str(e):
            text = wrap_text(f"the warm launch could not start: {e}", first=len("LaunchError: "))
            raise LaunchError(f"{text}\nhint: launch(..., via='torchrun') starts the ranks without the "
                              f"template") from None
        if str(e) not in _WARM_UNSAFE_SAID:
            _WARM_UNSAFE_SAID.add(str(e))
            print(wrap_text(f"[launcher] {e}; this kernel launches with torchrun instead"), flush=True)
        return None


def _pythonpath(env: dict) -> str:
    """``PYTHONPATH`` for the ranks: the repository first (``import mgpu_utils`` works without installing)."""
    return os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])


def warm_up() -> None:
    """Start this kernel's warm template now, in the background, and return at once.

    It imports PyTorch (a few seconds) while the notebook goes on, so the first launch does not wait for
    it. The setup cell of every lesson that launches calls it. Nothing happens where launches use
    torchrun (:func:`choose_via`), or when the template is already running.
    """
    if choose_via(None) != "warm":
        return
    from mgpu_utils.launch import warm

    warm.get_template(dict(os.environ, PYTHONPATH=_pythonpath(os.environ)), wait=False)


def choose_via(via: str | None = None, max_restarts: int = 0) -> str:
    """How :func:`launch` starts the ranks: "warm" or "torchrun".

    None (automatic): ``$MGPU_LAUNCH`` if set, else "warm" on Linux (where fork is safe) without
    restarts, else "torchrun". Restarts are torchrun's agent's job, so ``max_restarts > 0`` needs it.

    Raises:
        ValueError: an unknown mode, "warm" off Linux, or "warm" with ``max_restarts``.
    """
    chosen = via or os.environ.get("MGPU_LAUNCH") or None
    if chosen not in (None, "warm", "torchrun"):
        raise ValueError(f"via must be None (automatic), 'warm' or 'torchrun', got {chosen!r}"
                         + ("" if via else " (from $MGPU_LAUNCH)"))
    if chosen is None:
        return "warm" if sys.platform.startswith("linux") and not max_restarts else "torchrun"
    if chosen == "warm" and not sys.platform.startswith("linux"):
        raise ValueError(f"via='warm' forks the ranks from a template process, which is safe only on Linux "
                         f"(this is {sys.platform}); use via='torchrun'")
    if chosen == "warm" and max_restarts and via:
        raise ValueError("max_restarts needs torchrun's agent (it restarts the ranks): use via='torchrun' "
                         "(or leave via=None)")
    return "torchrun" if max_restarts else chosen


def launch(script, nproc: int = 4, args=(), **kwargs) -> dict | None:
    """Run a launch script under torchrun with ``nproc`` ranks; print their output; return rank 0's result.

    The notebook-facing form of :func:`run_torchrun` (same arguments). Example, from
    ``notebooks/00_setup.ipynb``::

        result = launch("hello_dist.py", nproc=4)
        result["sum_of_ranks"]   # 6

    Returns:
        The dict rank 0 printed with :func:`mgpu_utils.dist.emit_result`, or None if it printed none.
    """
    return run_torchrun(script, nproc, args, **kwargs).result
