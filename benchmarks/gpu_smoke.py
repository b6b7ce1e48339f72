"""The checks only a GPU can do (`make gpu-check`), on a bare GPU image, in about 8 minutes on one GPU.

Needs a CUDA build of torch at or above the course's floor (mgpu_utils.compat.OLDEST_TORCH) and nothing else
of the course installed: the course runs from this folder (PYTHONPATH), steps that need pytest, nvidia-ml-py or
torchvision say SKIPPED when it is missing, and notebooks run under nbval when it is there, else cell by cell in
a plain Python process (no Jupyter needed; figures go to matplotlib's Agg backend).

The steps, in order (each with its own time limit; a step that would start past --budget-s is skipped):
  1. the roofline against the datasheet (benchmarks/gpu_check.py: matmul and HBM copy >= 70%);
  2. profile_step.py with CUDA activity, and NVML energy over a 3-second window of matmuls (cheap, GPU-only);
  3. every launch script at world size 1 under torchrun on the GPU, one step each (benchmarks/exit_stress.py's
     small arguments, LAUNCH_S each): a CPU tensor handed to an NCCL collective fails here in seconds;
  4. lessons 01, 03, 07 (the allocator) and 10 top to bottom: their GPU cells assert instead of printing SKIPPED;
  5. the mixed tier (4 ranks on the GPUs there are: DDP, hooks, sync/async tests) and warm launches on the GPU;
  6. with 2 or more GPUs: the NCCL collectives bench, SyncBatchNorm against the whole batch, DCP async_save of
     CUDA tensors, the hang demonstration (reported as the collective timeout, not a crash), the scaling study.
It writes a summary (--summary, Markdown): one row per step, passed / failed / skipped and why, its seconds and
key numbers (a failed step: its exit or time limit and the line naming the error), then each failed step's last
output lines. Commit it under docs/ with the date and the GPU's name: the course's GPU reference.

Without a GPU it prints one SKIPPED line and exits 0. --dry-run plans every step, runs none, and writes the
summary with why each step would be skipped on this machine. Exit status 1 if a step failed.

Run:
    python benchmarks/gpu_smoke.py --summary docs/gpu-check-$(date +%F).md
"""
import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LESSONS = ["01_gpu_architecture", "03_ddp", "07_memory", "11_benchmarking"]
LAUNCH_S = 120          # limit of one launch script's run (a CUDA context and an NCCL communicator included)
TAIL_LINES = 15         # a failed step's last lines of stdout, and of stderr, kept in the summary


@dataclasses.dataclass
class Step:
    """One check: a command run from the course's folder, what it needs, and its time limit (seconds)."""

    name: str
    argv: list
    gpus: int = 1                   # GPUs it needs
    needs: tuple = ()               # Python modules it needs
    timeout_s: int = 120
    ok_codes: tuple = (0,)
    env: dict = dataclasses.field(default_factory=dict)
    skip: str = ""                  # why it never runs here, known when planned


def torchrun(nproc, script, *args):
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            f"launch_scripts/{script}", *map(str, args)]


def pytest_argv(*args):
    """``python -m pytest`` on ``args`` without the project's ``addopts`` (pyproject.toml): those name nbval's and
    pytest-timeout's options, which pytest refuses ("unrecognized arguments", exit 4) where the plugins are
    missing, as on a bare GPU image. Each step has its own time limit instead of --timeout."""
    return [PY, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-o", "addopts=", *args]


def snippet(code):
    """A step that runs Python code with the course importable."""
    return [PY, "-c", "import sys; sys.path.insert(0, '.')\n" + code]


ENERGY = """import time, torch
from mgpu_utils.measure.energy import EnergyMeter
x = torch.randn(4096, 4096, device="cuda")
with EnergyMeter(source="nvml", gpus=[str(torch.cuda.get_device_properties(0).uuid)]) as m:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 3:
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
print(f"NVML: {m.joules} J in {m.seconds:.1f} s ({m.watts if m.joules else 0:.0f} W) {m.reason}")
sys.exit(0 if m.joules and m.joules > 0 else 1)"""

SYNC_BN = """from mgpu_utils.launch.launcher import run_torchrun
r = run_torchrun("case_resnet.py", 2, ["--sync-bn", "--check-grads", "--max-steps", 2, "--per-rank-batch", 8],
                 show="none").result
print(f"sync_bn {r['sync_bn']}; max |DDP - whole batch| {r['grad_vs_global_batch']:.2e} (scale {r['grad_scale']:.2e})")
assert r["sync_bn"] == "on" and r["grad_vs_global_batch"] <= 1e-4 * r["grad_scale"]"""

HANG = """from mgpu_utils.launch.launcher import LaunchError, run_torchrun
try:
    run_torchrun("collective_errors.py", 2, ["--case", "missing"], show="none", timeout_s=120,
                 env={"MGPU_COLLECTIVE_TIMEOUT_S": 10})
    sys.exit("the missing collective did not hang")
except LaunchError as e:
    text = str(e)
    print(text.splitlines()[0][:200])
    assert "timed out" in text and "native crash" not in text, text[:2000]"""


def every_script(scratch: str) -> list[Step]:
    """One step per launch script: once at world size 1 under torchrun, with exit_stress.py's small arguments
    (files under ``scratch``/<script>), each with its own limit and its own row in the summary."""
    spec = importlib.util.spec_from_file_location("exit_stress", ROOT / "benchmarks" / "exit_stress.py")
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    steps = []
    for script in sorted(stress.CASES):
        need = stress.MIN_RANKS.get(script, 1)
        steps.append(Step(f"{script} at world size 1 on the GPU", [] if need > 1 else torchrun(
            1, script, *stress.args_for(script, 1, folder=f"{scratch}/{Path(script).stem}")), timeout_s=LAUNCH_S,
            skip=f"needs {need} ranks (at world size 1 it says so)" if need > 1 else ""))
    return steps


def plan(ngpu: int, scratch: str) -> list[Step]:
    """Every step, in order; ``ngpu`` sizes the multi-GPU ones; traces and checkpoints go under ``scratch``."""
    n, trace = max(ngpu, 2), scratch
    steps = [
        Step("roofline vs datasheet (gpu_check.py; exit 4: no datasheet, measured not judged)",
             [PY, "benchmarks/gpu_check.py"], ok_codes=(0, 4)),
        Step("profile_step.py with CUDA activity",
             torchrun(1, "profile_step.py", "--layers", 2, "--steps", 2, "--traced-steps", 1, "--trace-dir", trace)),
        Step("NVML energy over 3 s of matmuls", snippet(ENERGY), needs=("pynvml",)),
        *every_script(scratch),
    ]
    for lesson in LESSONS:
        steps.append(Step(f"lesson {lesson} top to bottom", [PY, "benchmarks/gpu_smoke.py", "--notebook",
                                                             f"notebooks/{lesson}.ipynb"],
                          timeout_s=300, env={"MGPU_NPROC": "4"}))
    steps += [
        Step("mixed tier, 4 ranks on the GPUs there are: DDP, hooks, sync/async",
             pytest_argv("tests/lessons/test_03_ddp.py", "tests/lessons/test_09_sync_vs_async.py",
                         "tests/package/test_checks.py"),
             needs=("pytest",), timeout_s=300, env={"MGPU_NPROC": "4"}),
        Step("warm launches on the GPU, against torchrun",
             pytest_argv("tests/package/test_launch_warm.py", "-k", "gpu_ranks or environment"), needs=("pytest",)),
        Step(f"NCCL collectives bench on {n} GPUs", torchrun(n, "collectives_bench.py", "--max-mib", 256), gpus=2,
             timeout_s=180),
        Step("SyncBatchNorm on 2 GPUs against the whole batch", snippet(SYNC_BN), gpus=2, needs=("torchvision",)),
        Step("DCP async_save of CUDA tensors on 2 GPUs",
             torchrun(2, "checkpoint_formats.py", "--phase", "save", "--ckpt-dir", trace + "/ckpt", "--repeats", 1),
             gpus=2),
        Step("a hang on NCCL reported as the collective timeout", snippet(HANG), gpus=2),
        Step(f"scaling study on {n} GPUs (NCCL)",
             [PY, "benchmarks/scaling.py", "--max-nproc", str(n), "--out", "build/scaling_gpu"], gpus=2,
             timeout_s=240),
    ]
    return steps


def why_not(step: Step, ngpu: int) -> str:
    """Why ``step`` cannot run on this machine: every reason, "; "-joined ("" when it can)."""
    why = [f"needs {step.gpus} GPU(s), found {ngpu}"] if ngpu < step.gpus else []
    why += [step.skip] if step.skip else []
    missing = [m for m in step.needs if importlib.util.find_spec(m) is None]
    if missing:
        why.append(f"needs {', '.join(missing)} (pip install {' '.join(missing).replace('pynvml', 'nvidia-ml-py')})")
    return "; ".join(why)


def key_numbers(out: str) -> str:
    """The step's last result line (MGPU_RESULT, or its last printed line), shortened for the summary."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    results = [ln for ln in lines if ln.startswith("MGPU_RESULT ")]
    text = results[-1] if results else (lines[-1] if lines else "")
    return text.replace("|", "/")[:240]


def error_line(out: str) -> str:
    """The last line that names an exception (torchrun's own ChildFailedError left out: it names none of the
    script's), else the last line; shortened for the summary."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    named = [ln for ln in lines if re.search(r"\w*(Error|Exception|Interrupt)\b:", ln) and "ChildFailed" not in ln]
    return (named or lines or [""])[-1].replace("|", "/")[:240]


def run_captured(argv: list, env: dict, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status, or None past ``timeout_s``; stdout; stderr) of ``argv`` run from the course's folder in a
    session of its own. Past its limit the session gets SIGTERM (torchrun then stops its workers, which it
    starts in sessions of their own), SIGKILL after 15 s; the output up to then is kept."""
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    code, out, err = None, b"", b""
    try:
        out, err = p.communicate(timeout=timeout_s)
        code = p.returncode
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = p.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired as e:   # a worker of another session may still hold the pipes
                out, err = e.output or b"", e.stderr or b""
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def run_step(step: Step) -> tuple[str, float, str, str]:
    """(status, seconds, detail, and when it failed the last TAIL_LINES lines of its stdout and of its stderr)
    of one step."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **step.env}
    t0 = time.perf_counter()
    code, stdout, stderr = run_captured(step.argv, env, step.timeout_s)
    sec = time.perf_counter() - t0
    out = stdout + stderr
    print(out[-3000:], flush=True)
    if code in step.ok_codes:
        return "passed", sec, key_numbers(stdout), ""
    tail = "\n".join(stdout.rstrip().splitlines()[-TAIL_LINES:] + ["--- stderr:"]
                     + stderr.rstrip().splitlines()[-TAIL_LINES:])
    if code is None:                # the error is our signal: what it last printed says where it was
        return "failed", sec, f"over its limit of {step.timeout_s} s; last printed: {key_numbers(stdout)}", tail
    return "failed", sec, f"exit {code}: {error_line(out)}", tail


def run_cells(path: Path) -> int:
    """Run a notebook's code cells in order in this process, as a kernel would (no Jupyter): 0 when all pass.
    The backend, folder and import path it sets for the cells are put back afterwards."""
    saved = os.environ.get("MPLBACKEND"), os.getcwd(), list(sys.path)
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(path.parent)
    sys.path.insert(0, str(ROOT))
    try:
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        scope = {"__name__": "__main__"}
        for i, cell in enumerate(cells, 1):
            print(f"-- {path.name}: code cell {i}/{len(cells)}", flush=True)
            exec(compile("".join(cell["source"]), f"{path.name}[{i}]", "exec"), scope)
    finally:
        if saved[0] is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = saved[0]
        os.chdir(saved[1])
        sys.path[:] = saved[2]
    print(f"{path.name}: {len(cells)} code cells ran")
    return 0


def run_notebook(path: Path) -> int:
    """Under nbval when it is installed (stored outputs compared as `make test` does, with its options named
    here: pytest-timeout need not be there), else (or with MGPU_PLAIN_CELLS=1) cell by cell."""
    jupyter = all(importlib.util.find_spec(m) for m in ("nbval", "ipykernel", "pytest"))
    if jupyter and not os.environ.get("MGPU_PLAIN_CELLS"):
        nbval = ["--nbval-lax", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
        return subprocess.call(pytest_argv(*nbval, str(path)), cwd=ROOT)
    print("nbval or ipykernel missing: running the code cells in a plain Python process")
    return run_cells(path.resolve())


def write_summary(path: Path, rows: list, header: str) -> None:
    """The table, one row per (name, status, seconds, detail, tail); then each failed step's output tail."""
    lines = [f"# GPU check: {header}", "", "| step | status | seconds | key numbers, or why not |",
             "|---|---|---|---|"] + [f"| {n} | {s} | {sec:.0f} | {d} |" for n, s, sec, d, _ in rows]
    failed = [(n, tail) for n, s, _, _, tail in rows if s == "failed"]
    if failed:
        lines += ["", f"## The failed steps' last {TAIL_LINES} lines of stdout and of stderr"]
    for n, tail in failed:
        lines += ["", f"### {n}", "", "~~~", tail, "~~~"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"summary: {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="plan every step, run none, write the summary")
    p.add_argument("--summary", default="build/gpu_check.md", help="where the summary goes (Markdown)")
    p.add_argument("--budget-s", type=float, default=480, help="start no step after this many seconds")
    p.add_argument("--notebook", help=argparse.SUPPRESS)           # one step: run a notebook
    a = p.parse_args()
    if a.notebook:
        return run_notebook(Path(a.notebook))
    try:
        import torch
    except ImportError as e:
        print(f"the GPU check needs PyTorch: {e} (pip install torch)")
        return 2
    sys.path.insert(0, str(ROOT))
    from mgpu_utils.compat import check_torch_version

    try:
        check_torch_version()
    except RuntimeError as e:
        print(e)
        return 2
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ngpu == 0 and not a.dry_run:
        print("SKIPPED: needs a CUDA GPU, found 0 (make gpu-check runs the checks that only a GPU can do; "
              "--dry-run lists them)")
        return 0
    name = torch.cuda.get_device_name(0) if ngpu else "no GPU"
    header = f"{time.strftime('%Y-%m-%d')}, {name} x {ngpu}, torch {torch.__version__}" + \
        (" (dry run: nothing ran)" if a.dry_run else "")
    print(header, flush=True)
    rows, t0 = [], time.perf_counter()
    scratch = "SCRATCH" if a.dry_run else tempfile.mkdtemp(prefix="mgpu_gpu_check_")
    try:
        for step in plan(ngpu, scratch):
            why = why_not(step, ngpu)
            if not why and time.perf_counter() - t0 > a.budget_s:
                why = f"over the time budget ({a.budget_s:.0f} s)"
            if why or a.dry_run:
                rows.append((step.name, "skipped", 0.0, why or "dry run: would run here", ""))
                print(f"== skipped: {step.name}: {rows[-1][3]}")
                continue
            print(f"== {step.name}", flush=True)
            status, sec, detail, tail = run_step(step)
            rows.append((step.name, status, sec, detail, tail))
            print(f"== {status}: {step.name} ({sec:.0f} s) {detail}", flush=True)
    finally:
        if not a.dry_run:
            shutil.rmtree(scratch, ignore_errors=True)   # traces and checkpoints; the summary keeps the numbers
    write_summary(Path(a.summary), rows, header)
    failed = [r[0] for r in rows if r[1] == "failed"]
    print(f"{len(rows) - len(failed)} of {len(rows)} steps passed or skipped"
          + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
