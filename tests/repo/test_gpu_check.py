"""`make gpu-check` and lesson 01's roofline on a GPU: benchmarks/gpu_check.py (its verdicts, its SKIPPED line
without a GPU) and benchmarks/gpu_smoke.py (its plan, its dry run, its steps where pytest has no plugins or
there is no Jupyter)."""
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from mgpu_utils.costs.hardware import match_gpu

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_skips_without_a_gpu_and_measures_with_one(starts_processes):
    """No GPU: exit 3 with a SKIPPED line. A GPU: it measures for real, reports a result line, and a GPU
    whose datasheet is on file must reach the 70% the lesson states (exit 0)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=300)
    if not torch.cuda.is_available():
        assert proc.returncode == 3 and "SKIPPED: needs a CUDA GPU, found 0" in proc.stdout
        return
    assert "MGPU_RESULT " in proc.stdout, proc.stdout + proc.stderr
    on_file = match_gpu(torch.cuda.get_device_name(0)) is not None
    assert proc.returncode == (0 if on_file else proc.returncode), proc.stdout


def gpu_smoke():
    """benchmarks/gpu_smoke.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "benchmarks" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_skips_visibly_without_a_gpu_and_its_dry_run_lists_every_step(tmp_path, starts_processes):
    """`make gpu-check` on a machine without a GPU: one SKIPPED line, exit 0. Its dry run writes the summary
    with every step and why it would be skipped here, without a traceback."""
    script = ROOT / "benchmarks" / "gpu_smoke.py"
    if not torch.cuda.is_available():
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.splitlines() == [
            "SKIPPED: needs a CUDA GPU, found 0 (make gpu-check runs the checks that only a GPU can do; "
            "--dry-run lists them)"], proc.stdout + proc.stderr
    summary = tmp_path / "summary.md"
    proc = subprocess.run([sys.executable, str(script), "--dry-run", "--summary", str(summary)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    rows = [ln for ln in summary.read_text().splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    names = [s.name for s in gpu_smoke().plan(2, "X")]
    assert [r.split(" | ")[0][2:] for r in rows] == names
    assert all(" | skipped | 0 | " in r for r in rows)
    if not torch.cuda.is_available():
        assert all("GPU(s), found 0" in r for r in rows)


class FakeProcesses:
    """gpu_smoke's ``subprocess`` with no process started: ``behave(argv)`` gives (exit status, or None for a
    run past its limit; stdout; stderr). Serves ``run`` (with its timeout) and ``Popen``/``communicate``/
    ``os.killpg``, so a test holds for either way of running a step."""

    PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
    TimeoutExpired, CompletedProcess = subprocess.TimeoutExpired, subprocess.CompletedProcess

    def __init__(self, behave):
        self.behave, self.ran, self.procs, self.signals = behave, [], {}, []

    def run(self, argv, timeout=None, text=False, **kw):
        self.ran.append(argv)
        code, out, err = self.behave(argv)
        if code is None:
            raise subprocess.TimeoutExpired(argv, timeout, output=out.encode(), stderr=err.encode())
        return subprocess.CompletedProcess(argv, code, *((out, err) if text else (out.encode(), err.encode())))

    def Popen(self, argv, **kw):
        self.ran.append(argv)
        proc = FakeProcess(argv, *self.behave(argv), pid=1000 + len(self.ran))
        self.procs[proc.pid] = proc
        return proc

    def killpg(self, pid, sig):
        self.signals.append(sig)
        self.procs[pid].killed = True


class FakeProcess:
    def __init__(self, argv, code, out, err, pid):
        self.argv, self.code, self.out, self.err, self.pid = argv, code, out.encode(), err.encode(), pid
        self.killed, self.returncode = False, None

    def communicate(self, timeout=None):
        if self.code is None and not self.killed:        # runs on until its session is signalled
            raise subprocess.TimeoutExpired(self.argv, timeout, output=self.out, stderr=self.err)
        self.returncode = -15 if self.code is None else self.code
        return self.out, self.err


def simulated_gpus(monkeypatch, smoke, n, behave, summary):
    """gpu_smoke.main() on a machine with ``n`` simulated H100s, its steps answered by ``behave``: (exit status
    of main, the FakeProcesses, the summary's text)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    fake = FakeProcesses(behave)
    monkeypatch.setattr(smoke, "subprocess", fake)
    monkeypatch.setattr(smoke.os, "killpg", fake.killpg)
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "--summary", str(summary)])
    monkeypatch.setattr(smoke.tempfile, "tempdir", str(summary.parent / "tmp"))
    (summary.parent / "tmp").mkdir()
    code = smoke.main()
    assert list((summary.parent / "tmp").iterdir()) == [], "the check's scratch folder (traces, checkpoints) was left"
    return code, fake, summary.read_text()


def test_gpu_check_on_a_simulated_two_gpu_machine(tmp_path, monkeypatch, capsys):
    """The steps' commands faked: every step runs in order, a failing one is reported with its exit code and
    makes the check fail, a missing module is a skip that names the pip package, and the key numbers of a
    passing step come from its result line."""
    import importlib.util

    smoke = gpu_smoke()
    real_find = importlib.util.find_spec
    monkeypatch.setattr(smoke.importlib.util, "find_spec", lambda m, *a: None if m == "pynvml" else real_find(m, *a))

    def behave(argv):
        bad = "collective_errors" in " ".join(map(str, argv))
        return (1 if bad else 0), 'MGPU_RESULT {"busbw_GBps": 1.0}\n', ""
    code, fake, text = simulated_gpus(monkeypatch, smoke, 2, behave, tmp_path / "s.md")
    assert code == 1
    assert "NVIDIA H100 80GB HBM3 x 2" in text
    assert "| a hang on NCCL reported as the collective timeout | failed |" in text and "exit 1" in text
    assert "| NVML energy over 3 s of matmuls | skipped | 0 | needs pynvml (pip install nvidia-ml-py) |" in text
    assert '| NCCL collectives bench on 2 GPUs | passed |' in text and 'MGPU_RESULT {"busbw_GBps": 1.0}' in text
    assert len(fake.ran) == sum(not smoke.why_not(s, 2) for s in smoke.plan(2, "X"))     # all but the skipped
    assert len(fake.ran) >= len(smoke.plan(2, "X")) - 6     # NVML, SyncBN without torchvision, 4 scripts at 1 rank


def test_gpu_check_names_the_launch_script_that_hangs_and_keeps_its_output(tmp_path, monkeypatch, capsys):
    """One GPU, simulated; pipeline_parallel.py hangs at world size 1 (it did fail there on gloo, G8). Every
    launch script has its own limit and row: the others pass, the hung one is named with its limit, and the
    summary keeps its last output lines (the whole-folder step of old lost them with its one 300 s cap)."""
    smoke = gpu_smoke()
    hung = ("[rank 0] lib_1f1b         loss err 0.0e+00\n", "[rank 0] waiting in lib_interleaved's send\n")

    def behave(argv):
        command = " ".join(map(str, argv))
        if "exit_stress.py" in command:     # all the scripts in one run: it prints each as it ends
            return None, "[1/33] allreduce_latency.py x1: ok (5.0 s)\n[2/33] ...\n" + hung[0], hung[1]
        if "pipeline_parallel.py" in command:
            return None, hung[0], hung[1]
        return 0, 'MGPU_RESULT {"ok": 1}\n', ""
    code, fake, text = simulated_gpus(monkeypatch, smoke, 1, behave, tmp_path / "s.md")
    assert code == 1
    row = next((ln for ln in text.splitlines() if ln.startswith("| pipeline_parallel.py")), "no row of its own")
    assert "| failed |" in row and f"over its limit of {smoke.LAUNCH_S} s" in row, row
    assert "| hello_dist.py at world size 1 on the GPU | passed |" in text
    assert "waiting in lib_interleaved's send" in text.split(row)[1], "the hung script's output is not kept"
    assert smoke.LAUNCH_S <= 120 and fake.signals and fake.signals[0] == signal.SIGTERM    # torchrun stops its ranks


def test_a_step_past_its_limit_is_stopped_with_its_ranks_and_its_output_kept(tmp_path, starts_processes):
    """A real torchrun of 2 ranks that never end, run as a step with a 10 s limit: the step fails naming its
    limit and what it last printed, both ranks are gone (torchrun starts them in sessions of their own: they
    stop when torchrun gets SIGTERM), and their lines are in the output kept."""
    import psutil

    smoke = gpu_smoke()
    script = tmp_path / "sleepy.py"
    # one write per line: two ranks share torchrun's stdout pipe, and print() under PYTHONUNBUFFERED writes a line
    # and its newline apart (quietK, 2026-12-06: "rank 0 pid 12915rank 1 pid 12916")
    script.write_text("import os, time\nos.write(1, f'rank {os.environ[\"RANK\"]} pid {os.getpid()}\\n'.encode())\n"
                      "time.sleep(300)\n")
    step = smoke.Step("sleepy", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", str(script)], timeout_s=10)
    status, sec, detail, tail = smoke.run_step(step)
    assert status == "failed" and detail.startswith("over its limit of 10 s; last printed: rank "), detail
    pids = [int(p) for p in re.findall(r"rank \d pid (\d+)", tail)]
    assert len(pids) == 2, tail
    time.sleep(1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"ranks {alive} outlived their step"
    assert sec < 40     # margin: 10 s, SIGTERM and torchrun's stop of its ranks (2-3 s measured on 2 busy cores)


def without_plugins(*only):
    """The environment of a bare GPU image's pytest: no plugin installed but ``only`` (module names); not
    inside this pytest's test (the inner conftest would see our PYTEST_CURRENT_TEST go)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": ",".join(only)}


def test_gpu_checks_pytest_steps_run_where_pytest_has_no_plugins(starts_processes):
    """A GPU image with pytest but not nbval or pytest-timeout (simulated: pytest's plugin autoload off).
    The project's addopts name their options; a step that passed them on would exit 4, "unrecognized
    arguments", and read failed instead of running. Each pytest step's options, on one in-process test."""
    smoke = gpu_smoke()
    steps = [s for s in smoke.plan(2, "X") if s.argv[1:3] == ["-m", "pytest"]]
    assert len(steps) == 2
    for opts in {tuple(s.argv[:next(i for i, a in enumerate(s.argv) if a.startswith("tests/"))]) for s in steps}:
        p = subprocess.run([*opts, "tests/repo/test_gpu_check.py::test_gpu_check_verdicts"], cwd=ROOT, timeout=120,
                           env=without_plugins(), capture_output=True, text=True)
        assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr


def test_gpu_checks_lessons_run_under_nbval_without_pytest_timeout(monkeypatch, starts_processes):
    """nbval there, pytest-timeout not (simulated as above, nbval's plugin named): the lesson step's pytest
    collects the notebook's cells instead of refusing the project's --timeout."""
    smoke = gpu_smoke()
    called = []
    monkeypatch.delenv("MGPU_PLAIN_CELLS", raising=False)
    monkeypatch.setattr(smoke.subprocess, "call", lambda argv, **kw: called.append(argv) or 0)
    assert smoke.run_notebook(Path("notebooks/00_setup.ipynb")) == 0
    p = subprocess.run([*called[0], "--collect-only"], cwd=ROOT, timeout=120,
                       env=without_plugins("nbval.plugin"), capture_output=True, text=True)
    assert p.returncode == 0 and "00_setup.ipynb::Cell 0" in p.stdout, p.stdout + p.stderr


def test_a_notebook_runs_cell_by_cell_without_jupyter(tmp_path, monkeypatch):
    """On a GPU image without Jupyter the lessons run as plain Python: cells share one scope, in order, and a
    failing cell stops the run with its traceback naming the cell."""
    import nbformat

    smoke = gpu_smoke()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), nbformat.v4.new_code_cell("a = 2"),
                                         nbformat.v4.new_code_cell("b = a * 3\nprint('b', b)")])
    path = tmp_path / "ok.ipynb"
    nbformat.write(nb, path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MGPU_PLAIN_CELLS", "1")
    assert smoke.run_notebook(path) == 0
    nb.cells.append(nbformat.v4.new_code_cell("assert b == 7, 'the third cell fails'"))
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="the third cell fails") as e:
        smoke.run_notebook(path)
    assert any(f.filename == "ok.ipynb[3]" for f in traceback.extract_tb(e.tb))

def test_gpu_check_verdicts():
    """gpu_check.py's exit status: 4 without a datasheet; a T4 or L4 (70-72 W) is judged on its copy only, its
    matmul reported (its peak assumes a boost clock it cannot hold under that cap); other GPUs on both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    slow_matmul = {"matmul_fraction": 0.45, "copy_fraction": 0.85}
    assert check.verdict(slow_matmul, None, 0.7)[0] == 4
    code, line = check.verdict(slow_matmul, "T4", 0.7)
    assert code == 0 and "70 W part" in line and "not judged" in line
    assert check.verdict({"matmul_fraction": 0.45, "copy_fraction": 0.5}, "L4", 0.7)[0] == 1
    code, line = check.verdict(slow_matmul, "H100", 0.7)
    assert code == 1 and "matmul_fraction below 70%" in line
    assert check.verdict({"matmul_fraction": 0.75, "copy_fraction": 0.9}, "H100", 0.7) == (
        0, "ok: copy_fraction and matmul_fraction at least 70% of the datasheet")
