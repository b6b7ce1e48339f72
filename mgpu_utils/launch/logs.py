"""Reading what the ranks of a launch left behind: their logs, the failure's root cause, the fix to print
(used by :mod:`mgpu_utils.launch.launcher` and :mod:`mgpu_utils.launch.nodes`; lessons 00-12).

:func:`diagnose` blames the rank that failed first with its own error, not the ranks that failed
because a peer went away (:data:`SECONDARY`), and says it as the arguments of a
:class:`mgpu_utils.launch.launcher.LaunchError`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
from pathlib import Path

from mgpu_utils.dist import ERROR_MARKER, RESULT_MARKER
from mgpu_utils.text import wrap_text
from mgpu_utils.env import REPO_ROOT

# Errors that a surviving rank sees *because* another rank died: not the root cause.
SECONDARY = re.compile(r"Connection (closed|reset) by peer|Broken pipe|SIGTERM|Socket Timeout|"
                        r"connection refused|recvBytes|Connection was likely closed|remote worker", re.IGNORECASE)


_TORCH_PREFIX = re.compile(r"^\[rank\d+\]:\s?")


#: What NCCL's watchdog logs before it takes a rank down for a collective that waited past its timeout.
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: (\S.*? milliseconds before timing out)")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\w*)(?::\s?(.*))?$")


def _attempt(path: str) -> int:
    """The attempt number N of a torchrun log path ``.../attempt_N/...`` (torchrun counts restarts from 0)."""
    m = re.search(r"attempt_(\d+)", path)
    return int(m.group(1)) if m else -1


def count_restarts(log_dir: str) -> int:
    """How many times torchrun started the workers over: the highest attempt number in ``log_dir``."""
    return max((_attempt(d) for d in glob.glob(os.path.join(log_dir, "*", "attempt_*"))), default=0)


def read_logs(log_dir: str, nproc: int, attempt: int | None = None) -> dict:
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


def attempt_failures(log_dir: str, nproc: int, torchrun_log: str, restarts: int) -> list[str]:
    """One line per attempt that failed before the last one: its root-cause rank and why."""
    agent = _AGENT_FAILURE.findall(torchrun_log)       # torchrun logs the first failed worker of each attempt
    out = []
    for a in range(restarts):
        logs = read_logs(log_dir, nproc, attempt=a)
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
            return (info["time"], bool(SECONDARY.search(msg)), info["type"], msg)
    if "Traceback (most recent call last)" in err:
        tail = err[err.rfind("Traceback (most recent call last)"):].splitlines()
        for line in reversed(tail):
            m = _EXC_LINE.match(line.strip())
            if m:
                msg = display_paths(m.group(2) or "")
                return (entry["stderr_mtime"], bool(SECONDARY.search(line)), m.group(1), msg)
    m = _WATCHDOG.search(err)
    if m:       # NCCL's watchdog aborts a rank that waited past the timeout: SIGABRT, no Python traceback
        return (entry["stderr_mtime"], False, "DistBackendError",
                f"the collective timed out (NCCL's watchdog ended this rank): {m.group(1)}")
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


def format_rank_output(rank: int, entry: dict, streams=("stdout", "stderr"), max_lines: int | None = None) -> str:
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


class Rank0Tail:
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
        text = format_rank_output(0, {"stdout": done.decode(errors="replace")}, streams=("stdout",))
        if text:
            print(text, flush=True)


#: (pattern in the root-cause message, the fix to print): errors whose torch message does not say what to do.
FIX_HINTS = [
    (re.compile(r"busy or unavailable", re.I),
     "the GPU is in exclusive-process compute mode (`nvidia-smi -q | grep -i 'compute mode'`) and another process "
     "holds it, often this notebook's kernel after it used CUDA: restart the kernel and launch before any cell "
     "touches the GPU, or ask for the Default compute mode (`nvidia-smi -c DEFAULT`, needs root)"),
    (re.compile(r"no kernel image is available", re.I),
     "this torch build has no kernels for this GPU's compute capability (docs/gpu-and-cluster.md, "
     "'GPU requirements': install a "
     "wheel built for it, or run on the CPU tier with backend='gloo')"),
    (re.compile(r"\bNCCL\b|nccl[A-Z]\w*Error", re.I),
     "rerun with env={'NCCL_DEBUG': 'INFO'} to see what NCCL tried; in a container give it shared memory "
     "(`--shm-size=1g`) or set NCCL_SHM_DISABLE=1; without peer-to-peer support set NCCL_P2P_DISABLE=1 "
     "(docs/troubleshooting.md, 'NCCL troubleshooting')"),
]


def fix_hint(message: str) -> str | None:
    """The one-line fix for a root-cause message that :data:`FIX_HINTS` knows, else None."""
    return next((hint for pattern, hint in FIX_HINTS if pattern.search(message or "")), None)


def diagnose(logs: dict, torchrun_err: str, returncode: int, codes: dict | None = None) -> dict:
    """Blame the root-cause rank: a rank's own Python error first, then a rank that crashed without a
    traceback (not the agent's SIGTERM), then errors that only say a peer went away.

    Returns:
        The arguments of :class:`mgpu_utils.launch.launcher.LaunchError`: ``{"text", "rank", "exc_type",
        "message"}`` (text: the report, with the fix hint and the rank's last output lines).
    """

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
        text += f"\n--- output of rank {rank} (last lines) ---\n" + format_rank_output(rank, logs[rank], max_lines=40)
    return {"text": text, "rank": rank, "exc_type": exc_type, "message": message}
