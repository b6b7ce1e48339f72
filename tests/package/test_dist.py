"""Unit tests of mgpu_utils.dist (no processes started)."""
import json
import re

import pytest

from mgpu_utils.dist import (RESULT_MARKER, DistContext, DistEnv, choose_backend, emit_result, get_dist_env,
                             parse_result)
from mgpu_utils.text import wrap_text


def test_env_without_torchrun_is_world_size_1():
    assert get_dist_env({}) == DistEnv(0, 0, 1, 1, False)


def test_env_from_torchrun_variables():
    env = get_dist_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.under_torchrun) == (5, 1, 8, 4, True)


@pytest.mark.parametrize("bad", [{"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "2"},
                                 {"RANK": "0"}])
def test_env_inconsistent_is_refused(bad):
    with pytest.raises(ValueError):
        get_dist_env(bad)


@pytest.mark.parametrize("ranks,gpus,expected", [(4, 0, "gloo"), (4, 1, "gloo"), (4, 3, "gloo"),
                                                 (4, 4, "nccl"), (2, 8, "nccl"), (1, 1, "nccl")])
def test_backend_follows_gpus(ranks, gpus, expected):
    backend, reason = choose_backend(ranks, num_gpus=gpus, forced=None)
    assert backend == expected and reason


def test_forced_backend(monkeypatch):
    assert choose_backend(4, num_gpus=0, forced="gloo")[0] == "gloo"
    with pytest.raises(ValueError, match="one GPU per rank"):
        choose_backend(2, num_gpus=1, forced="nccl")
    with pytest.raises(ValueError, match="gloo' or 'nccl"):
        choose_backend(2, num_gpus=0, forced="mpi")
    monkeypatch.setenv("MGPU_BACKEND", "gloo")
    assert choose_backend(2, num_gpus=2)[0] == "gloo"


def test_the_cpu_backend_line_fits_in_100_characters_under_a_node_prefix():
    for ranks in (1, 4, 16):
        assert len(f"[node 0] [rank 0] world size {ranks}, backend {choose_backend(ranks, num_gpus=0)[1]}") <= 100


def test_wrap_text_breaks_long_lines_at_spaces_and_loses_nothing():
    text = "short line\n  " + " ".join(f"word{i}" for i in range(40))
    out = wrap_text(text, 50)
    lines = out.split("\n")
    assert lines[0] == "short line" and lines[1].startswith("  word0 ") and all(len(x) <= 50 for x in lines)
    assert all(x.startswith("    word") for x in lines[2:]) and len(lines) > 3    # its own indent + 2 spaces
    assert re.sub(r"\n +", " ", out) == re.sub(r"\n +", " ", text)
    assert wrap_text("x" * 60 + " y", 50) == "x" * 60 + "\n  y"                   # a long word stays whole
    first = wrap_text("LaunchError text " * 10, 50, first=len("LaunchError: ")).split("\n")
    assert len(first[0]) <= 50 - 13 < len(first[0] + " LaunchError") and first[1].startswith("  ")
    assert wrap_text("a b", 3) == "a b" and wrap_text("", 10) == ""


def test_log_wraps_long_lines_with_the_rank_prefix_on_every_line(capsys, monkeypatch):
    monkeypatch.delenv("MGPU_LINE_WIDTH", raising=False)
    ctx = DistContext(DistEnv(rank=3, world_size=4), "gloo", "", None)
    ctx.log("x " * 80 + "end", all_ranks=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(x.startswith("[rank 3] ") and len(x) <= 100 for x in lines)
    assert lines[1].startswith("[rank 3]   x") and lines[1].endswith("x end")
    monkeypatch.setenv("MGPU_LINE_WIDTH", "60")                     # launch_nodes: "[node k] " in front
    ctx.log("one\n  two " + "y " * 40, all_ranks=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["[rank 3] one", "[rank 3]   two" + " y" * 23]          # 60 characters
    assert all(x.startswith("[rank 3]     y") and len(x) <= 60 for x in lines[2:])
    ctx.log("only rank 0 prints this")
    assert capsys.readouterr().out == ""


def test_result_roundtrip(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    emit_result({"a": 1, "b": [1.5]})
    out = capsys.readouterr().out
    assert out.startswith(RESULT_MARKER)
    assert parse_result("noise\n" + out + "more noise\n") == {"a": 1, "b": [1.5]}
    emit_result({"a": 2}, rank=1)                       # only rank 0 prints
    assert capsys.readouterr().out == ""
    assert parse_result("nothing here") is None
    assert parse_result(RESULT_MARKER + json.dumps({"x": 1}) + "\n" + RESULT_MARKER + '{"x": 2}') == {"x": 2}


def _fake_gpu(monkeypatch, capability, name="simulated GPU", count=1):
    import torch
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("MGPU_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])


def test_a_gpu_older_than_the_build_is_not_used_and_the_reason_says_why(monkeypatch):
    from mgpu_utils.dist import gpu_status
    from mgpu_utils.env import course_tier
    _fake_gpu(monkeypatch, (7, 0), "Tesla V100-SXM2-16GB", count=2)
    visible, usable, note = gpu_status()
    assert (visible, usable) == (2, 0)
    assert "Tesla V100-SXM2-16GB" in note and "compute capability 7.0" in note and "sm_75" in note
    backend, reason = choose_backend(2)
    assert backend == "gloo" and "no usable CUDA GPU" in reason and "V100" in reason
    tier = course_tier(2)
    assert tier["backend"] == "gloo" and "compute capability 7.0" in tier["reason"]
    _fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB", count=2)      # a supported GPU is used
    assert gpu_status() == (2, 2, "") and choose_backend(2)[0] == "nccl"
    _fake_gpu(monkeypatch, (8, 9), "NVIDIA L4")                 # 8.9 runs the sm_86 cubin (same major)
    assert gpu_status() == (1, 1, "")
    _fake_gpu(monkeypatch, (6, 0), "Tesla P100-PCIE-16GB")      # Pascal: nothing in the list runs on it
    assert gpu_status()[1] == 0


@pytest.mark.parametrize("cap,archs,ok", [((7, 5), ["sm_75"], True), ((7, 0), ["sm_75", "sm_80"], False),
                                          ((8, 9), ["sm_86"], True), ((9, 0), ["sm_86"], False),
                                          ((9, 0), ["sm_80", "compute_80"], True), ((7, 5), ["compute_80"], False),
                                          ((12, 0), ["sm_100", "sm_120"], True), ((10, 3), ["sm_100"], True)])
def test_cuda_compatibility_rules(cap, archs, ok):
    from mgpu_utils.dist import _supported
    assert _supported(cap, archs) is ok


def test_an_old_driver_is_named_instead_of_a_silent_cpu_fallback(monkeypatch):
    import torch
    from mgpu_utils import dist
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("MGPU_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "_nvidia_driver_present", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", None)                  # a CPU-only build on a GPU machine
    _, usable, note = dist.gpu_status()
    assert usable == 0 and "CPU-only build" in note and "install a CUDA build" in note
    monkeypatch.setattr(torch.version, "cuda", "13.0")                # a CUDA build, the driver too old
    _, usable, note = dist.gpu_status()
    assert usable == 0 and "driver" in note and "older than CUDA 13.0" in note
    assert "driver" in choose_backend(4)[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")                     # hidden on purpose: nothing to explain
    assert dist.gpu_status() == (0, 0, "")
    monkeypatch.setattr(dist, "_nvidia_driver_present", lambda: False)   # a CPU-only machine
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert dist.gpu_status() == (0, 0, "") and "no CUDA GPU visible" in choose_backend(4)[1]


def test_the_nccl_group_also_serves_cpu_tensors(monkeypatch):
    """Issue 31, item 1. Lesson 12's checkpoint timings and every graded exercise hand CPU tensors to the
    default group. An NCCL-only group refuses them ("No backend type associated with device type cpu"), so on
    the NCCL branch the group is created as torch's device-mapped backend: CPU tensors over gloo, CUDA tensors
    over NCCL, on the rank's own GPU. Checked here by how the group is created (no GPU needed)."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import BackendConfig

    from mgpu_utils import dist as mdist

    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    mdist.init_group("nccl", torch.device("cuda", 1), 5)
    backend, kw = calls[-1]
    assert BackendConfig(backend).get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}
    assert kw == {"device_id": torch.device("cuda", 1), "timeout": datetime.timedelta(seconds=5)}
    mdist.init_group("gloo", torch.device("cpu"), 5)
    assert calls[-1] == ("gloo", {"timeout": datetime.timedelta(seconds=5)})


def test_the_collective_timeout_has_one_home(monkeypatch):
    """Issue 57, item 1: the default group, new_group and device_mesh read the timeout from collective_timeout();
    a bad value is refused with the variable's name."""
    import datetime

    from mgpu_utils.dist import TIMEOUT_ENV, collective_timeout

    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert collective_timeout() == datetime.timedelta(seconds=120)
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert collective_timeout() == datetime.timedelta(seconds=2.5)
    for bad in ("0", "-3", "ten", ""):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{TIMEOUT_ENV}=.*positive number of seconds"):
            collective_timeout()


def test_the_timeout_distributed_chose_is_carried_in_the_context_and_used_by_every_group(monkeypatch):
    """Issue 61: distributed(timeout_s=7) gives the default group 7 s, says so in ctx.timeout_s, and every group
    made inside (new_group, device_mesh, the graders' subgroups) gets 7 s too, not the variable's 120; outside
    the block the variable decides again."""
    import datetime

    import torch.distributed as dist

    import mgpu_utils.dist as md

    seen = {}
    monkeypatch.setattr(md, "init_group", lambda chosen, device, timeout_s: seen.update(default=timeout_s))
    monkeypatch.setattr(dist, "new_group", lambda ranks=None, **kw: seen.update(sub=kw["timeout"]))
    monkeypatch.setattr(md, "shutdown", lambda code: None)
    monkeypatch.setattr(md, "get_dist_env", lambda: DistEnv(rank=0, world_size=2, under_torchrun=True))
    monkeypatch.delenv(md.TIMEOUT_ENV, raising=False)
    with md.distributed(backend="gloo", timeout_s=7, quiet=True) as ctx:
        md.new_group([0, 1])
        assert ctx.timeout_s == 7 and md.collective_timeout() == datetime.timedelta(seconds=7)
    assert seen == {"default": 7, "sub": datetime.timedelta(seconds=7)}
    assert md.collective_timeout() == datetime.timedelta(seconds=120)


#: torch's calls that make a group, and what the course calls instead (mgpu_utils.dist).
GROUP_MAKERS = {"new_group": "mgpu_utils.dist.new_group", "init_device_mesh": "mgpu_utils.dist.device_mesh",
                "DeviceMesh": "mgpu_utils.dist.device_mesh", "split_group": "mgpu_utils.dist.new_group",
                "new_subgroups": "timeout=collective_timeout()",
                "new_subgroups_by_enumeration": "timeout=collective_timeout()"}


def untimed_group_calls(source: str) -> list[str]:
    """Calls in ``source`` that make a process group without the course's timeout: torch's own (``dist.new_group``,
    ``init_device_mesh``, ...) with no ``timeout=`` argument."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        torch_call = isinstance(f, ast.Attribute) or name in ("init_device_mesh", "DeviceMesh", "split_group",
                                                              "new_subgroups", "new_subgroups_by_enumeration")
        if name in GROUP_MAKERS and torch_call and not any(k.arg == "timeout" for k in node.keywords):
            found.append(f"line {node.lineno}: {name}(...) without the course's timeout: use {GROUP_MAKERS[name]}")
    return found


def test_every_subgroup_and_mesh_gets_the_course_timeout():
    """Issue 57, item 1: no launch script, helper or exercise makes a group with torch's default timeout (30
    minutes on gloo): they go through mgpu_utils.dist.new_group / device_mesh (or pass the timeout)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert untimed_group_calls("g = dist.new_group([0, 1])\nm = init_device_mesh('cpu', (2, 2))\n") == [
        "line 1: new_group(...) without the course's timeout: use mgpu_utils.dist.new_group",
        "line 2: init_device_mesh(...) without the course's timeout: use mgpu_utils.dist.device_mesh"]
    assert untimed_group_calls("g = new_group([0, 1])\ns = dist.new_subgroups_by_enumeration(r, timeout=t)\n") == []
    bad = {}
    for path in [*(root / "launch_scripts").glob("*.py"), *(root / "mgpu_utils").rglob("*.py"),
                 *(root / "exercises").rglob("*.py")]:
        if path != root / "mgpu_utils" / "dist.py":
            bad.update({f"{path.relative_to(root)} {c}": 1 for c in untimed_group_calls(path.read_text())})
    assert not bad, "\n".join(bad)


def test_the_error_line_is_one_write(monkeypatch):
    """Ranks of a node share one stderr pipe: the MGPU_ERROR line and its newline must go in one write(),
    or another rank's output can land between them (seen in test_launch_nodes_names_the_failed_rank_and_its_node
    under load)."""
    import sys

    from mgpu_utils import dist

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    dist._report_error(3, RuntimeError("boom"))
    assert len(writes) == 1 and writes[0].startswith(dist.ERROR_MARKER) and writes[0].endswith("\n"), writes
    assert json.loads(writes[0][len(dist.ERROR_MARKER):])["rank"] == 3
