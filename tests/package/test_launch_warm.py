"""Warm launches (mgpu_utils.launch.warm) against real torchrun: the same environment, results and error reports.

What a warm rank must reproduce is the launch path's, not a script's: the environment, argv, sys.path, cwd,
``__main__``, threads and seeds (test_the_environment_is_torchruns, with tests/scripts/env_report.py); exit codes and
error reports (test_failures_are_reported_the_same, test_a_timeout_is_reported_the_same); output, C's included
(test_output_from_c_is_kept); TORCH_DISTRIBUTED_DEBUG (collective_errors.py, both modes). Those are checked with
scripts made for them.

What could still differ per script is listed in mgpu_utils/launch/warm.py's docstring; the end of a rank cannot
(every launch script ends in mgpu_utils.dist.shutdown, os._exit after the atexit callbacks, under torchrun too):

* the template has imported torch's distributed packages, numpy and scikit-learn's datasets before it forks
  (warm_template.PREIMPORT): a script that uses ``torch.distributed.fsdp.X`` without importing the package works
  warm and fails in a fresh process. test_scripts_import_the_packages_they_use checks that for every launch script
  and every module of mgpu_utils, without launching anything;
* the rest is what a script does with the launch path: reads torchrun's variables, writes files, starts threads,
  forms sub-groups, sends point to point. COMPARED launches one script per such feature in both modes (below); their
  result JSON must agree value for value, except measured times (keys named like ``*_s``, ``*_ms``, ``*seconds*``,
  ``*GBps*``, ``*per_s*``) and process ids.

The other launch scripts run warm in their lessons' tests, against one-process references; under real torchrun
(each rank a fresh process) in make test: hello_dist.py (tests/package/test_launch_launcher.py, lesson 00 and
lesson 12's launch_nodes), elastic_train.py (tests/lessons/test_12_fault_tolerance.py: a torchrun restart against a
warm resume), collective_errors.py (test_torch_distributed_debug_is_read_per_launch), ddp_train.py (two Slurm nodes
against one warm launch, tests/repo/test_slurm.py; CI requires Slurm). Every script that runs on one rank runs
under torchrun on a GPU in `make gpu-check` (benchmarks/gpu_smoke.py), and ``benchmarks/exit_stress.py --via
torchrun`` runs them all on any machine. Left to those runs: Python's hash seed (warm ranks share the template's, torchrun's ranks draw one each),
which matters only to ranks that order their collectives by iterating a set of strings (the launch scripts' sets are
for membership and counts).
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mgpu_utils.launch import warm
from mgpu_utils.launch.launcher import LaunchError, LaunchTimeout, choose_via, run_torchrun

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from exit_stress import CASES, args_for  # noqa: E402
from helpers import alive, rank_pids

SCRIPTS = ROOT / "tests" / "scripts"
MISBEHAVE = str(SCRIPTS / "misbehave.py")
# measured times and what follows from them (MFU), and values that differ per run (pids, fresh folders)
TIMING_KEY = re.compile(r"(^|_)(s|ms)$|^ms_|seconds|GBps|per_s|per_call|cpu_share|^pids?$|^(start|end)$|^mfu$|^traces$")


def flat(x, path=()):
    """``{path: value}`` for every leaf of a JSON value; a path is the tuple of keys and list indices."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in flat(val, path + (key,)).items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in flat(val, path + (i,)).items()}
    return {path: x}


def timed(path: tuple) -> bool:
    """A measured time: a key named like one, or the seconds of a (step, seconds, accuracy) curve point."""
    return any(isinstance(k, str) and TIMING_KEY.search(k) for k in path) or \
        (len(path) >= 3 and path[-3] == "curve" and path[-1] == 1)


def untimed(result: dict) -> dict:
    return {p: v for p, v in flat(result).items() if not timed(p)}


def test_untimed_keeps_what_must_agree():
    r = {"loss": [0.5, 0.25], "allreduce_s": {"1": 0.1}, "epoch_seconds": [1.0], "rows": [{"busbw_GBps": 2,
         "bytes": 8}], "pids": [3, 4], "samples_per_s": 9.0, "barrier_ms": [[1.0]], "max_diff": 0.0,
         "curve": [[10, 0.5, 0.9]], "timelines": [{"start": 0.1, "end": 0.2, "op": "F"}], "ms_per_step": 3}
    assert untimed(r) == {("loss", 0): 0.5, ("loss", 1): 0.25, ("rows", 0, "bytes"): 8, ("max_diff",): 0.0,
                          ("curve", 0, 0): 10, ("curve", 0, 2): 0.9, ("timelines", 0, "op"): "F"}


#: One launch script per feature of the launch path that a script's own code meets; each of them in both modes.
COMPARED = {
    "preflight.py": "reads torchrun's variables (GROUP_RANK, CUDA_VISIBLE_DEVICES) and reports the environment",
    "grade_exercise.py": "the grader: the solution imported from a path, faulthandler, the grading variables",
    "checkpoint_formats.py": "writes files (distributed checkpoint, state_dict), FSDP2, ZeRO-1, DDP, a DeviceMesh "
                             "and new_group sub-groups, scikit-learn's digits",
    "capstone_train.py": "DTensor layouts on a DeviceMesh and torch's pipeline schedules (point to point)",
    "sync_async.py": "a parameter server: send/recv between ranks of a new_group, ranks with different roles",
    "comm_hooks.py": "Python code on gloo's threads (DDP communication hooks, PowerSGD)",
}


def test_compared_scripts_exist():
    assert set(COMPARED) <= set(CASES), "COMPARED names scripts of benchmarks/exit_stress.py's CASES"


@pytest.mark.parametrize("script", sorted(COMPARED))
def test_launch_scripts_give_the_same_result_in_both_modes(script, starts_processes):
    args = args_for(script, 2)
    ref = run_torchrun(script, 2, args() if callable(args) else args, show="none", via="torchrun")
    args = args_for(script, 2)
    got = run_torchrun(script, 2, args, show="none", via="warm")
    assert (ref.via, got.via) == ("torchrun", "warm")
    assert ref.returncode == got.returncode == 0
    a, b = untimed(ref.result), untimed(got.result)
    assert a == b, f"{script}: values that differ: {sorted(set(a.items()) ^ set(b.items()), key=str)[:10]}"
    assert len(a) >= 2, "the comparison must cover something"


def imports_and_uses(source: str) -> tuple[set, list]:
    """The modules a file imports (``import a.b`` imports a and a.b; ``from a.b import c`` a, a.b and a.b.c if c is a
    module), and the dotted module paths it reaches through attributes: ``[(line, "torch.distributed.fsdp.X"), ...]``
    for ``torch.distributed.fsdp.X`` or ``dist.fsdp.X`` after ``import torch.distributed as dist``."""
    import ast

    tree = ast.parse(source)
    names, imported = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                imported |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
                names[a.asname or parts[0]] = a.name if a.asname else parts[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            imported |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
                imported.add(f"{node.module}.{a.name}")
    used = []
    for node in ast.walk(tree):
        chain, n = [], node
        while isinstance(n, ast.Attribute):
            chain.append(n.attr)
            n = n.value
        if chain and isinstance(n, ast.Name) and n.id in names:
            used.append((node.lineno, ".".join([names[n.id], *reversed(chain)])))
    return imported, used


def test_imports_and_uses_reads_aliases_and_from_imports():
    imported, used = imports_and_uses("import torch.distributed as dist\nfrom torch.distributed import fsdp\n"
                                      "import numpy\ndist.checkpoint.save(x)\nfsdp.fully_shard(m)\n"
                                      "numpy.linalg.norm(v)\n")
    assert {"torch", "torch.distributed", "torch.distributed.fsdp", "numpy"} <= imported
    assert "torch.distributed.checkpoint" not in imported
    assert (4, "torch.distributed.checkpoint.save") in used and (5, "torch.distributed.fsdp.fully_shard") in used


def test_scripts_import_the_packages_they_use(starts_processes):
    """Every launch script and every module of mgpu_utils imports the template's packages it reaches through an
    attribute (warm_template.PREIMPORT: imported in a warm rank before the script starts, not in a fresh process),
    unless a fresh ``import torch, numpy`` makes them reachable anyway (torch.distributed; torch._dynamo, which torch
    imports on first use). Checked on the source, so for every script, without a launch."""
    import json

    from mgpu_utils.launch.warm_template import PREIMPORT

    code = ("import json, sys, torch, numpy\n"
            "pre = json.loads(sys.argv[1])\n"
            "lazy = getattr(torch, '_lazy_modules', ())\n"
            "print(json.dumps([m for m in pre if m in sys.modules or (m.count('.') == 1 and m.startswith('torch.') "
            "and m.split('.')[1] in lazy)]))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(PREIMPORT)], capture_output=True, text=True,
                         timeout=300, check=True)
    reachable = set(json.loads(out.stdout.splitlines()[-1]))
    assert {"torch", "numpy", "torch.distributed"} <= reachable
    must_import = [m for m in PREIMPORT if m not in reachable]
    assert "torch.distributed.fsdp" in must_import and "sklearn.datasets" in must_import
    missing = []
    files = sorted((ROOT / "launch_scripts").glob("*.py")) + sorted((ROOT / "mgpu_utils").rglob("*.py"))
    for f in files:
        imported, used = imports_and_uses(f.read_text())
        missing += sorted({f"{f.relative_to(ROOT)}:{line}: {m}" for line, dotted in used for m in must_import
                           if (dotted == m or dotted.startswith(m + ".")) and m not in imported})
    assert not missing, ("reached through an attribute without importing it (works in a warm rank, AttributeError "
                         "in a fresh process under torchrun): " + "; ".join(missing))


def test_the_environment_is_torchruns(starts_processes):
    """Environment, argv, sys.path, cwd, __main__, threads (torch and BLAS), seeds: as torchrun sets them."""
    args = ["--flag", "value with spaces"]
    ref = run_torchrun(SCRIPTS / "env_report.py", 2, args, show="none", via="torchrun", threads_per_rank=1)
    got = run_torchrun(SCRIPTS / "env_report.py", 2, args, show="none", via="warm", threads_per_rank=1)
    per_run = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
    for r in (0, 1):
        a, b = ref.result["ranks"][r], got.result["ranks"][r]
        assert {k: v for k, v in a["env"].items() if k not in per_run} == \
               {k: v for k, v in b["env"].items() if k not in per_run}
        assert b["env"]["RANK"] == str(r) and b["env"]["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{r}/error.json")
        for key in ("argv", "path", "cwd", "name", "file", "threads", "blas_threads", "stdout_is_file"):
            assert a[key] == b[key], key
        assert b["argv"][1:] == args and b["name"] == "__main__" and b["threads"] == 1
        assert b["fresh_mgpu_utils"], "the course's modules must be imported afresh in each rank"
    # torch's and numpy's global random state: a fresh process draws its own, so the ranks differ (both modes)
    for res in (ref, got):
        for key in ("numpy_draw", "torch_seed"):
            assert res.result["ranks"][0][key] != res.result["ranks"][1][key], key


FAILURES = {
    "an exception in a rank": ("hello_dist.py", 3, ["--fail-rank", "1"]),
    "a plain script's traceback": (MISBEHAVE, 2, ["--mode", "raise", "--rank", "1"]),
    "an exit code without traceback": (MISBEHAVE, 2, ["--mode", "exit", "--rank", "0"]),
    "SIGKILL": (MISBEHAVE, 2, ["--mode", "kill", "--rank", "1"]),
    "sys.exit(4)": (SCRIPTS / "exit_paths.py", 2, ["--mode", "sysexit", "--rank", "0", "--code", "4"]),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failures_are_reported_the_same(case, starts_processes):
    script, nproc, args = FAILURES[case]
    errors = {}
    for via in ("torchrun", "warm"):
        t0 = time.perf_counter()
        with pytest.raises(LaunchError) as info:
            run_torchrun(script, nproc, args, show="none", via=via, timeout_s=120)
        # margin: 1-6 s when the other ranks are stopped, against the 120 s they would wait
        assert time.perf_counter() - t0 < 30, "the other ranks are stopped, not left to time out"
        e = info.value
        errors[via] = (type(e), e.rank, e.exc_type, e.message, str(e).splitlines()[0])
    assert errors["warm"] == errors["torchrun"]
    assert errors["warm"][1] is not None, "a root-cause rank is named"


def test_a_timeout_is_reported_the_same(starts_processes):
    firsts = {}
    for via in ("torchrun", "warm"):
        with pytest.raises(LaunchTimeout) as info:
            run_torchrun(MISBEHAVE, 2, ["--mode", "sleep"], show="none", via=via, timeout_s=4)
        firsts[via] = str(info.value).splitlines()[0]
    assert firsts["warm"] == firsts["torchrun"]


def template_children():
    t = warm._TEMPLATE
    return [] if t is None or not t.alive() else psutil.Process(t.pid).children(recursive=True)


def test_the_template_is_restarted_after_it_dies_and_leaves_no_process(starts_processes):
    assert run_torchrun("hello_dist.py", 2, show="none", via="warm").result["sum_of_ranks"] == 1
    first = warm._TEMPLATE
    assert first.ready["threads"] == 1 and not first.ready["cuda_loaded"] and first.unsafe() is None
    assert template_children() == [], "no rank outlives its launch"
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait()
    assert run_torchrun("hello_dist.py", 2, show="none", via="warm").result["sum_of_ranks"] == 1
    assert warm._TEMPLATE is not first and warm._TEMPLATE.alive()


def test_the_template_dying_during_a_launch_is_an_error_and_kills_the_ranks(tmp_path, starts_processes):
    import threading

    def kill_template_when_started():
        deadline = time.time() + 60
        while len(rank_pids(tmp_path)) < 2 and time.time() < deadline:
            time.sleep(0.1)
        os.kill(warm._TEMPLATE.pid, signal.SIGKILL)

    run_torchrun("hello_dist.py", 2, show="none", via="warm")            # a template is running
    killer = threading.Thread(target=kill_template_when_started)
    killer.start()
    with pytest.raises(LaunchError, match="warm template .* ended during the launch"):
        run_torchrun(MISBEHAVE, 2, ["--mode", "sleep", "--pid-dir", tmp_path], show="none", via="warm",
                     timeout_s=60)
    killer.join()
    time.sleep(0.5)
    assert len(rank_pids(tmp_path)) == 2 and alive(rank_pids(tmp_path)) == [], "the ranks die with the template"


def test_an_import_time_variable_restarts_the_template(starts_processes):
    run_torchrun("hello_dist.py", 2, show="none", via="warm")
    first = warm._TEMPLATE.pid
    run_torchrun("hello_dist.py", 2, show="none", via="warm", env={"MGPU_COLLECTIVE_TIMEOUT_S": 30})
    assert warm._TEMPLATE.pid == first, "a variable read at run time keeps the template"
    run_torchrun("hello_dist.py", 2, show="none", via="warm", env={"TORCH_LOGS": "-all"})
    assert warm._TEMPLATE.pid != first, "TORCH_LOGS is read when torch is imported: a new template"


def test_an_unsafe_template_falls_back_to_torchrun_and_says_so(monkeypatch, capsys, starts_processes):
    from mgpu_utils.launch import launcher

    monkeypatch.setattr(warm.Template, "unsafe", lambda self: "a simulated reason")
    monkeypatch.setattr(launcher, "_WARM_UNSAFE_SAID", set())
    monkeypatch.setattr(warm, "_UNSAFE", None)                 # restored after the test
    res = run_torchrun("hello_dist.py", 2, show="none", via="warm")
    assert res.via == "torchrun" and res.result["sum_of_ranks"] == 1
    said = re.sub(r"\n +", " ", capsys.readouterr().out)          # the launcher wraps at 100 characters
    assert "a simulated reason; this kernel launches with torchrun instead" in said
    assert warm._TEMPLATE is None, "the unsafe template was ended"
    again = run_torchrun("hello_dist.py", 2, show="none", via="warm")
    assert again.via == "torchrun" and warm._TEMPLATE is None, "no new template is tried"
    assert capsys.readouterr().out == "", "said once"


def test_concurrent_launches_share_one_template(starts_processes):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        sums = list(pool.map(lambda n: run_torchrun("hello_dist.py", n, show="none", via="warm").result
                             ["sum_of_ranks"], [2, 3, 4, 2, 3, 4]))
    assert sums == [1, 3, 6, 1, 3, 6]


def test_choosing_the_mode(monkeypatch):
    monkeypatch.delenv("MGPU_LAUNCH", raising=False)
    assert choose_via(None) == ("warm" if sys.platform.startswith("linux") else "torchrun")
    assert choose_via(None, max_restarts=1) == "torchrun"
    assert choose_via("torchrun") == "torchrun"
    with pytest.raises(ValueError, match="via='torchrun'"):
        choose_via("warm", max_restarts=1)
    with pytest.raises(ValueError, match="'warm' or 'torchrun'"):
        choose_via("fork")
    monkeypatch.setenv("MGPU_LAUNCH", "torchrun")
    assert choose_via(None) == "torchrun"
    monkeypatch.setenv("MGPU_LAUNCH", "spawn")
    with pytest.raises(ValueError, match=r"\$MGPU_LAUNCH"):
        choose_via(None)


def test_the_template_ends_with_its_process(starts_processes):
    code = ("from mgpu_utils.launch.launcher import launch\n"
            "assert launch('hello_dist.py', 2, show='none', via='warm')['sum_of_ranks'] == 1\n"
            "import mgpu_utils.launch.warm as w; print(w._TEMPLATE.pid)\n"
            "import os; os._exit(0)\n")                                # no atexit: as if the kernel was killed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.time() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_torch_distributed_debug_is_read_per_launch(starts_processes):
    """TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported; each warm rank reads it again, so
    the template is kept, DETAIL reports the mismatch as torchrun's ranks do, and a launch without it is plain."""
    detail, errors = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, {}
    run_torchrun("hello_dist.py", 2, show="none", via="warm")
    pid = warm._TEMPLATE.pid
    for via, env in (("torchrun", detail), ("warm", detail), ("warm", {})):
        with pytest.raises(LaunchError) as info:
            run_torchrun("collective_errors.py", 2, ["--case", "mismatch", "--timeout", 2], env=env, show="none",
                         via=via)
        errors[via, bool(env)] = info.value
    for e in (errors["torchrun", True], errors["warm", True]):     # both ranks see it; either may report first
        assert e.exc_type == "RuntimeError" and "Detected mismatch between collectives" in e.message
    assert "mismatch between collectives" not in errors["warm", False].message
    assert warm._TEMPLATE.pid == pid


def test_warm_up_starts_the_template_in_the_background(monkeypatch, starts_processes):
    from mgpu_utils.launch.launcher import warm_up

    monkeypatch.delenv("MGPU_LAUNCH", raising=False)
    warm.close_template()
    t0 = time.perf_counter()
    warm_up()
    # margin: returning takes a process start (milliseconds); importing torch takes seconds
    assert time.perf_counter() - t0 < 1.0, "warm_up returns while the template imports"
    t = warm._TEMPLATE
    assert t is not None and t.alive()
    assert run_torchrun("hello_dist.py", 2, show="none").via == "warm" and warm._TEMPLATE is t, "the launch uses it"
    warm_up()
    assert warm._TEMPLATE is t, "a second call changes nothing"
    monkeypatch.setenv("MGPU_LAUNCH", "torchrun")
    warm.close_template()
    warm_up()
    assert warm._TEMPLATE is None, "no template where launches use torchrun"


def test_gpu_ranks_in_both_modes(starts_processes):
    """On a GPU machine: ranks forked from the template initialise CUDA and NCCL themselves (the template never
    did), and train as torchrun's ranks do. Part of `make gpu-check` (benchmarks/gpu_smoke.py)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        pytest.skip("SKIPPED: needs a CUDA GPU, found 0")
    nproc = min(2, gpus)
    args = ["--epochs", 1, "--per-rank-batch", 16]
    ref = run_torchrun("ddp_train.py", nproc, args, show="none", via="torchrun")
    got = run_torchrun("ddp_train.py", nproc, args, show="none", via="warm")
    assert got.via == "warm" and got.result["backend"] == ref.result["backend"] == "nccl"
    assert untimed(ref.result) == untimed(got.result)


def test_output_from_c_is_kept(starts_processes):
    """printf from C code sits in the C library's buffer (stdout is a file); a warm rank flushes it before
    os._exit, as a normal interpreter exit does."""
    for via in ("torchrun", "warm"):
        res = run_torchrun(SCRIPTS / "c_print.py", 2, show="none", via=via)
        for r in (0, 1):
            assert f"printed by C in rank {r}" in res.logs[r]["stdout"], via


def test_a_warm_rank_keeps_the_users_nccl_error_handling(monkeypatch):
    """Issue 31 (misleading on GPUs): torchrun sets TORCH_NCCL_ASYNC_ERROR_HANDLING=1 only where the user set
    nothing; a warm rank does the same instead of forcing 1."""
    assert warm.rank_env({}, 0, 2, 1234, "r", "e")["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    mine = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    assert warm.rank_env(mine, 1, 2, 1234, "r", "e")["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
