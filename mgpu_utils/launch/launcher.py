"""Run a launch script under torchrun from a notebook cell (or a test) and get rank 0's result
(lessons 00-12).

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

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mgpu_utils.compat import check_torch_version
from mgpu_utils.launch.logs import (Rank0Tail, attempt_failures, count_restarts, diagnose, format_rank_output,
                                    read_logs)
from mgpu_utils.launch.processes import kill_tree, pythonpath, rank_environment, resolve_script
from mgpu_utils.dist import BACKEND_ENV, HIDDEN_NOTE, REASON_ENV, choose_backend, gpu_status, parse_result
from mgpu_utils.text import wrap_text


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


def _check_nproc(nproc) -> None:
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be an int (number of processes), got {nproc!r}")
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1 (number of ranks to start), got {nproc}")


def decide_backend(nproc: int, backend: str | None, env: dict) -> dict:
    """The backend of a job of ``nproc`` ranks on this machine, decided once (:func:`mgpu_utils.dist.choose_backend`),
    as the environment variables that pass it on to the ranks.

    ``backend`` None takes ``$MGPU_BACKEND`` from ``env`` if set. Ranks that run on gloo on a machine with
    GPUs get ``CUDA_VISIBLE_DEVICES=''``, so that no library takes a CUDA path with their CPU tensors.

    Returns:
        The variables to add to the ranks' environment (:data:`~mgpu_utils.dist.BACKEND_ENV`,
        :data:`~mgpu_utils.dist.REASON_ENV`, and ``CUDA_VISIBLE_DEVICES`` when the GPUs are hidden).

    Raises:
        ValueError: a backend the machine cannot run (the message names the fix).
    """
    visible, usable, _ = gpu_status()
    chosen, reason = choose_backend(nproc, forced=backend or env.get(BACKEND_ENV) or None)
    out = {BACKEND_ENV: chosen, REASON_ENV: reason}
    if chosen == "gloo" and visible:
        out["CUDA_VISIBLE_DEVICES"] = ""                        # ranks on CPU must not see the GPUs
        out[REASON_ENV] = reason + HIDDEN_NOTE
    return out


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
            script which attempt it is; notebooks/12_fault_tolerance.ipynb). The error, if the last
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
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    if show not in ("all", "rank0", "none"):
        raise ValueError(f"show must be 'all', 'rank0' or 'none', got {show!r}")
    _check_nproc(nproc)
    child_env = rank_environment(env, nproc, threads_per_rank)
    child_env.update(decide_backend(nproc, backend, child_env))     # the backend rule, once for the job
    via = choose_via(via, max_restarts)
    path = resolve_script(script)
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
        tail = Rank0Tail(log_dir) if show != "none" else None
        returncode = None
        try:
            while returncode is None and time.perf_counter() - t0 < timeout_s:
                returncode = job.wait(0.2)
                if returncode is None and tail:
                    tail.poll()
        except RuntimeError as e:    # the warm template ended under the job
            raise LaunchError(str(e), logs=read_logs(log_dir, nproc)) from None
        except BaseException:  # KeyboardInterrupt from the notebook's stop button, or anything else
            job.stop()
            raise
        if tail:
            tail.poll(final=True)
        if returncode is None:
            job.stop()
            logs = read_logs(log_dir, nproc)
            tails = "\n".join(format_rank_output(r, logs[r], max_lines=10) for r in logs)
            raise LaunchTimeout(wrap_text(f"{path.name} with {nproc} rank(s) ran past timeout_s={timeout_s:g} s; all "
                                          f"processes were killed. A rank waiting in a collective that another rank "
                                          f"never called hangs like this. Last output:", first=len("LaunchTimeout: "))
                                + f"\n{tails}", logs=logs)
        seconds = time.perf_counter() - t0
        agent_out.seek(0)
        torchrun_log = agent_out.read()
        logs = read_logs(log_dir, nproc)
        if returncode != 0:
            raise LaunchError(**diagnose(logs, torchrun_log, returncode, job.codes), logs=logs)
        if show != "none":  # rank 0's stdout was printed live; now its stderr, then the other ranks
            ranks = [0] if show == "rank0" else sorted(logs)
            parts = [format_rank_output(r, logs[r], ("stderr",) if r == 0 else ("stdout", "stderr")) for r in ranks]
            text = "\n".join(t for t in parts if t)
            if text:
                print(text, flush=True)
        result = parse_result(logs[0]["stdout"]) if logs else None
        restarts = count_restarts(log_dir)
        failed = attempt_failures(log_dir, nproc, torchrun_log, restarts)
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
        kill_tree(self.proc)


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


def warm_up() -> None:
    """Start this kernel's warm template now, in the background, and return at once.

    It imports PyTorch (a few seconds) while the notebook goes on, so the first launch does not wait for
    it. The setup cell of every lesson that launches calls it. Nothing happens where launches use
    torchrun (:func:`choose_via`), or when the template is already running.
    """
    if choose_via(None) != "warm":
        return
    from mgpu_utils.launch import warm

    warm.get_template(dict(os.environ, PYTHONPATH=pythonpath(os.environ)), wait=False)


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
