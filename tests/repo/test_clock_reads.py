"""Host clocks around GPU work (review M1, M2): on CUDA, kernels and NCCL collectives are queued and the host
goes on, so a `time.perf_counter()` read right after `dist.all_reduce` or a training step reads when the work
was queued, not done (mgpu_utils.timing.synced_clock). No GPU here: the launch scripts are read, and every
interval they time must end right after something that waits for the device (`synced_clock`,
`torch.cuda.synchronize`, a CUDA event's `synchronize`, a copy to the host: `.cpu()`, `.item()`, `.tolist()`),
or be one of the intervals below, on the CPU by construction."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "launch_scripts").glob("*.py"))
WAITS = re.compile(r"\b(synced_clock|synchronize|sync)\(|\.(cpu|item|tolist)\(\)")

# (script, function): why its host-clock intervals need no device sync
ON_THE_HOST = {
    ("checkpoint_formats.py", "timed"): "it times what a checkpoint call blocks the host for (async_save's point); "
                                        "the saves copy the state to the host",
    ("collectives_bench.py", "time_once"): "the CPU branch; on CUDA the same function times with CUDA events",
    ("collectives_bench.py", "copy_bandwidth"): "the CPU branch, as time_once",
    ("grade_exercise.py", "main"): "each file's grading seconds, a report for the tests (the grading's collectives "
                                   "end in all_gather_object, which waits for every rank)",
    ("elastic_train.py", "train"): "the snapshot: torch.save on rank 0 copies the state to the host",
    ("sync_async.py", "run_ps"): "the parameter server holds its parameters and messages on the CPU",
    ("sync_async.py", "run_worker"): "the interval ends after a blocking receive on the CPU, which follows g.cpu()",
}


def unsynced_intervals(path: Path) -> list[tuple[str, int, str]]:
    """(function, line, code) of every `time.perf_counter() - t0` in ``path`` whose statement does not follow
    one that waits for the device."""
    tree = ast.parse(path.read_text())
    found = []
    for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for block in [getattr(n, f) for n in ast.walk(func) for f in ("body", "orelse", "finalbody")
                      if isinstance(getattr(n, f, None), list)]:
            for i, stmt in enumerate(block):
                heads = [stmt] if not hasattr(stmt, "body") else [stmt.test] if hasattr(stmt, "test") else []
                ends = [e for h in heads for e in ast.walk(h) if isinstance(e, ast.BinOp)
                        and isinstance(e.op, ast.Sub) and isinstance(e.left, ast.Call)
                        and isinstance(e.left.func, ast.Attribute) and e.left.func.attr == "perf_counter"]
                if ends and not (i and WAITS.search(ast.unparse(block[i - 1]))):
                    found.append((func.name, stmt.lineno, ast.unparse(stmt)[:100]))
    return sorted(set(found))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_timed_interval_waits_for_the_device(path):
    bad = [f"{path.name}:{line} in {func}(): {code}" for func, line, code in unsynced_intervals(path)
           if (path.name, func) not in ON_THE_HOST]
    assert not bad, ("a host clock read right after queued GPU work times the enqueue (use "
                     "mgpu_utils.timing.synced_clock at both ends):\n" + "\n".join(bad))


def test_the_check_finds_an_unsynced_interval_and_knows_every_exception(tmp_path):
    """The check catches the pattern (a step timed without a sync) and each listed exception still exists."""
    script = tmp_path / "x.py"
    script.write_text("import time\ndef f(step, device):\n    t0 = time.perf_counter()\n    step()\n"
                      "    return time.perf_counter() - t0\n"
                      "def g(step, device):\n    t0 = synced_clock(device)\n    step()\n"
                      "    torch.cuda.synchronize()\n    return time.perf_counter() - t0\n")
    assert [(f, line) for f, line, _ in unsynced_intervals(script)] == [("f", 5)]
    for name, func in ON_THE_HOST:
        assert func in [f for f, _, _ in unsynced_intervals(ROOT / "launch_scripts" / name)], (name, func)
