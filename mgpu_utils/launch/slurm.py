"""A real Slurm cluster of one host, run as this process's own children (lesson 12, tests/repo/test_slurm.py).

Debian's packages (``apt-get install slurm-wlm munge``) hold the real daemons: ``munged`` (authentication),
``slurmctld`` (the controller, which schedules) and ``slurmd`` (the node daemon, which starts job steps).
:class:`LocalSlurm` writes a private configuration and state folder, a fresh munge key, starts the three
daemons in the foreground as child processes on free ports, and stops them (and every job process) on exit.
Nothing outside its folder is touched: no system service, no ``/etc/slurm``. The one node declares more
CPUs than the machine may have (``SlurmdParameters=config_overrides``), so a job can ask for two tasks
that stand for two nodes: ``cluster/slurm/job.sbatch`` starts one torchrun agent per task either way.

    with LocalSlurm(tmp_path) as slurm:
        job = slurm.submit(["--ntasks", "2", "cluster/slurm/job.sbatch", "launch_scripts/ddp_train.py"])
        info = slurm.wait(job)            # scontrol's fields: JobState, ExitCode, Restarts, ...

It runs as root (a container, CI): :func:`missing_programs` says so elsewhere.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
INSTALL = "apt-get install -y slurm-wlm munge"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}


def missing_programs() -> str | None:
    """None when Slurm and munge are installed and this process runs as root, else a message naming what is
    missing and the fix (the install command; or root: slurmd starts job steps as their user, which takes root,
    so the one-host cluster runs where the course runs as root, in a container or CI)."""
    gone = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if gone:
        return f"not installed: {', '.join(gone)}; install with: {INSTALL}"
    if hasattr(os, "getuid") and os.getuid() != 0:
        return ("the one-host Slurm runs its daemons as root (slurmd starts job steps as their user): run this "
                "as root, e.g. in a container, or submit cluster/slurm/job.sbatch on a real cluster")
    return None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_job_id() -> int:
    """A first job id for a new local cluster whose default rendezvous ports (cluster/slurm/job.sbatch: 20000 +
    job id % 10000, and one more for the preflight) are free now, for its first 4 jobs: every new cluster
    starting at job 1 made two on one machine (two students, a lesson beside the test suite) both take port
    20001 (EADDRINUSE)."""
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True
    rng = random.Random()
    for _ in range(50):
        first = rng.randrange(1000, 9000)
        if all(free(20000 + first + k) for k in range(5)):
            return first
    return rng.randrange(1000, 9000)


class SlurmError(RuntimeError):
    """The local cluster did not start, or a job did not reach the expected state; the message holds the logs."""


class LocalSlurm:
    """A one-node Slurm cluster in ``folder`` (see the module docstring).

    Args:
        folder: a new or empty folder for the configuration, state, logs and munge key.
        cpus: CPUs the node declares (may exceed the machine's: tasks only stand for nodes).
        requeue_delay_s: how long a requeued job waits before it may start again (Slurm's ``cred_expire``;
            120 s by default on real clusters), at least 5 (Slurm's minimum: below it slurmctld logs "invalid" and
            takes the 120 s default). Slurm holds a requeued job this long plus 1 s;
            :meth:`start_requeued_now` lets it start 2 s after the requeue. The scheduler looks at pending jobs every 1 s (60 s
            by default).

    Attributes:
        env: the environment for Slurm's commands (``SLURM_CONF`` points at this cluster).
        node: the node's name; ``conf``: the path of slurm.conf.

    Raises:
        ValueError: ``requeue_delay_s`` below 5 or not an integer.
    """

    def __init__(self, folder, cpus: int = 8, requeue_delay_s: int = 5):
        if isinstance(requeue_delay_s, bool) or not isinstance(requeue_delay_s, int) or requeue_delay_s < 5:
            raise ValueError(f"requeue_delay_s must be an integer >= 5 (Slurm's minimum cred_expire; below it Slurm "
                             f"waits its default 120 s), got {requeue_delay_s!r}")
        self.folder = Path(folder).resolve()
        self.cpus, self.requeue_delay_s = cpus, requeue_delay_s
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def _write_config(self) -> None:
        f = self.folder
        for sub in ("state", "spool", "munge", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(f / "munge", 0o700)
        key = f / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        user = "root"
        sock = f / "munge" / "munge.socket"
        self.conf.write_text(f"""ClusterName=mgpu
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
FirstJobId={_first_job_id()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire={self.requeue_delay_s}
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={f}/log/jobcomp.txt
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._munge = ["--socket", str(sock), "--key-file", str(key), "--pid-file", str(f / "munge" / "munged.pid"),
                       "--log-file", str(f / "log" / "munged.log"), "--seed-file", str(f / "munge" / "seed")]

    def _start(self, argv: list[str], name: str) -> None:
        log = open(self.folder / "log" / f"{name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))

    def logs(self) -> str:
        """The daemons' logs, the last 40 lines of each (for error messages)."""
        out = []
        for p in sorted((self.folder / "log").glob("*")):
            lines = p.read_text(errors="replace").splitlines()[-40:]
            out.append(f"--- {p.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def start(self, timeout_s: float = 60) -> "LocalSlurm":
        """Start munged, slurmctld and slurmd; return once the node is idle.

        Raises:
            SlurmError: a program is missing (with the install command), or the node is not idle within
                ``timeout_s`` (with the daemons' logs).
        """
        gone = missing_programs()
        if gone:
            raise SlurmError(gone)
        self._write_config()
        self._start([_program("munged"), "--foreground", "--force", *self._munge], "munged")
        deadline = time.monotonic() + timeout_s
        while not (self.folder / "munge" / "munge.socket").exists():
            self._check_alive(deadline)
        self._start([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._start([_program("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)], "slurmd")
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if state.returncode == 0 and state.stdout.strip() == "idle":
                return self
            self._check_alive(deadline)

    def _check_alive(self, deadline: float) -> None:
        dead = [p.args[0] for p in self.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            self.stop()
            what = f"{', '.join(map(os.path.basename, dead))} exited" if dead else "the node is not idle in time"
            raise SlurmError(f"the local Slurm cluster did not start: {what}\n{self.logs()}")
        time.sleep(0.2)

    def submit(self, args: list, cwd=None, env: dict | None = None) -> str:
        """``sbatch --parsable ARGS`` from ``cwd``; returns the job id. Raises SlurmError if sbatch refuses."""
        r = subprocess.run(["sbatch", "--parsable", *map(str, args)], cwd=cwd, env={**self.env, **(env or {})},
                           capture_output=True, text=True)
        if r.returncode:
            raise SlurmError(f"sbatch refused the job: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """scontrol's record of the job as a dict (``JobState``, ``ExitCode``, ``Restarts``, ``StdOut``, ...)."""
        r = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env, capture_output=True, text=True)
        fields = {}
        for item in r.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, timeout_s: float = 150, states=FINAL) -> dict:
        """Poll until the job's state is one of ``states``; returns :meth:`job`'s dict.

        Raises:
            SlurmError: past ``timeout_s`` (the job is cancelled; the message holds its record and the logs).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env)
                raise SlurmError(f"job {job_id} not in {sorted(states)} after {timeout_s:g} s: {info}\n{self.logs()}")
            time.sleep(0.2)                       # as wait_for_output (0.5 s made a job end seen up to 0.3 s later)

    def wait_for_output(self, job_id: str, path, text: str, timeout_s: float = 120) -> None:
        """Wait until the job's output file ``path`` contains ``text``.

        Raises:
            SlurmError: the job ended first, or ``timeout_s`` passed (with the output and the daemons' logs).
        """
        path, deadline = Path(path), time.monotonic() + timeout_s
        while text not in (path.read_text(errors="replace") if path.exists() else ""):
            info = self.job(job_id)
            if info.get("JobState") in FINAL or time.monotonic() > deadline:
                output = path.read_text(errors="replace") if path.exists() else "(no output file)"
                raise SlurmError(f"job {job_id}: {text!r} not in its output ({info.get('JobState')}):\n"
                                 f"{output}\n{self.logs()}")
            time.sleep(0.2)

    def start_requeued_now(self, job_id: str, timeout_s: float = 120) -> dict:
        """Wait until the job has been requeued (pending again, ``Restarts`` > 0), then let it start in 2 s:
        ``scontrol update JobId=ID StartTime=now+2``. Slurm holds a requeued job ``cred_expire`` + 1 s (here
        ``requeue_delay_s`` + 1, 6 s by default; 121 s on a cluster with Slurm's defaults), so that the old run's
        credential has expired. The 2 s are what it takes here: slurmd refuses to launch a job within the second it
        was requeued in ("Job ... already killed, do not launch batch job", times in whole seconds; measured: 1 of 3
        runs failed so with StartTime=now). Returns :meth:`job`'s dict; a job that ended without being requeued (a
        final state) is returned as it is, for the caller's checks.

        Raises:
            SlurmError: not requeued within ``timeout_s`` (the job is cancelled; with its record and the logs), or
                scontrol refused the update.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.job(job_id)
            if info.get("JobState") in FINAL:
                return info
            if info.get("JobState") == "PENDING" and info.get("Restarts", "0") not in ("", "0"):
                r = subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+2"], env=self.env,
                                   capture_output=True, text=True)
                if r.returncode:
                    raise SlurmError(f"scontrol refused to start requeued job {job_id} now: {r.stderr.strip()}")
                return self.job(job_id)
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env)
                raise SlurmError(f"job {job_id} not requeued after {timeout_s:g} s: {info}\n{self.logs()}")
            time.sleep(0.2)

    def completions(self) -> list[dict]:
        """The job-completion log (``JobCompType=jobcomp/filetxt``), one dict per finished run of a job, in
        order: ``JobId``, ``JobState``, ``StartTime``, ``EndTime``, ``NodeCnt``, ``ProcCnt``, ... ``sacct`` would
        need Slurm's accounting database (slurmdbd), which this cluster does not run."""
        path = self.folder / "log" / "jobcomp.txt"
        lines = path.read_text().splitlines() if path.exists() else []
        return [dict(item.partition("=")[::2] for item in line.split()) for line in lines]

    def signal_batch(self, job_id: str, sig: str = "USR1") -> None:
        """Send ``sig`` to the job's batch shell now: what ``--signal=B:USR1@T`` sends T s before the time limit."""
        subprocess.run(["scancel", "-b", "-s", sig, job_id], env=self.env, check=True)   # -b: the batch shell only

    def steps(self) -> list:
        """This cluster's ``slurmstepd`` processes (``psutil.Process``), one per job step: slurmd starts them detached
        (their parent is init), so they are found by the slurmd log they keep open, this cluster's own."""
        import psutil

        log = str(self.folder / "log" / "slurmd.log")
        found = []
        for q in psutil.process_iter(["name"]):
            try:
                if q.info["name"] == "slurmstepd" and any(f.path == log for f in q.open_files()):
                    found.append(q)
            except (psutil.Error, OSError):
                pass
        return found

    def stop(self) -> None:
        """Stop the daemons and every process they started, by pid: the daemons' process trees and those of this
        cluster's job steps (:meth:`steps`: every job process runs under one). Nothing else is touched, even a
        process that has this cluster's ``SLURM_CONF`` in its environment (a user's shell)."""
        from mgpu_utils.launch.processes import kill_all, process_tree

        steps = self.steps()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        time.sleep(0.5)
        kill_all([q for pid in [p.pid for p in self.procs] + [q.pid for q in steps] for q in process_tree(pid)])
        self.procs.clear()

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


#: srun writes a task's output in pieces of at most this many bytes, each with its ``--label`` (``0: ``): a longer
#: line arrives as several lines (measured with Slurm 22.05: 1,024 bytes, then ``0: `` and the next 1,024).
SRUN_PIECE_BYTES = 1024


def job_results(text: str) -> list[dict]:
    """Every ``MGPU_RESULT`` JSON in a job's output, in order: lines may carry srun's ``--label`` prefix
    (``0: ``) and torchrun's ``--tee`` prefix (``[default0]:``). A result line longer than srun's pieces
    (:data:`SRUN_PIECE_BYTES`) is joined again from the next lines of the same task.

    Raises:
        ValueError: a result line that is not whole JSON (the job's output was cut), with its task and length.
    """
    import json
    import re

    from mgpu_utils.dist import RESULT_MARKER

    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*\d+: )?(\[\w+\]:)?" + re.escape(RESULT_MARKER) + "(.*)$", line)
        if not m:
            continue
        label, payload, piece, j = m.group(1), m.group(3), line[len(m.group(1) or ""):], i
        while label and len(piece.encode()) >= SRUN_PIECE_BYTES:      # srun cut it: the rest comes with its label
            j = next((k for k in range(j + 1, len(lines)) if lines[k].startswith(label)), None)
            if j is None:
                break
            piece = lines[j][len(label):]
            payload += piece
        try:
            found.append(json.loads(payload))
        except json.JSONDecodeError as e:
            task = f"task {label.strip(' :')}'s" if label else "a"
            raise ValueError(f"{task} result line ({len(payload)} characters) is not whole JSON ({e}): the job's "
                             "output was cut (the job killed while printing, or a pipe that splits lines)") from None
    return found
