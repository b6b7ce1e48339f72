"""mgpu_utils.grading.common's route guard (refusing_routes) of the collectives-only exercises (03.7, 07.4 to
07.6), in one process, on small student files. What a seventh red team (2026-12-06) used to pass: ctypes (libc's open,
write, malloc), torch.from_file (a file mapped from C++), the c10d store; and a shared mapping however it was made.
What is not a route: the grader's own ctypes (malloc_bytes), torch's store-based barrier, a file only imported."""
import pytest
import torch
import torch.distributed as dist

from mgpu_utils.grading import common


def _run(tmp_path, text: str, call: str = "go"):
    """Load ``text`` as the student's file and call its ``call`` within refusing_routes: the routes found."""
    import importlib.util
    path = tmp_path / "student.py"
    path.write_text(text)
    found = []
    with common.refusing_routes(str(path), found):
        spec = importlib.util.spec_from_file_location("student_routes", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kept = getattr(module, call)()
        common.malloc_bytes()                               # the grader's own ctypes: not a route
    return found, kept


def test_ctypes_from_the_students_file_is_a_route_with_its_line(tmp_path):
    found, _ = _run(tmp_path, "import ctypes\n\ndef go():\n    libc = ctypes.CDLL(None)\n    return libc.getpid()\n")
    routes = [(f["route"], f["line"]) for f in found]
    assert routes and all(line == 4 or line == 5 for _, line in routes), routes
    assert any(r.startswith("ctypes (") for r, _ in routes) and any("getpid through ctypes" in r for r, _ in routes)


def test_the_graders_own_ctypes_is_not_a_route(tmp_path):
    found, _ = _run(tmp_path, "def go():\n    return 1\n")
    assert found == []


def test_from_file_is_a_route_and_torch_is_put_back(tmp_path):
    target = tmp_path / "buffer.bin"
    before = [vars(c).get("from_file") for c in (torch.UntypedStorage, torch.TypedStorage)]
    found, kept = _run(tmp_path, f"import torch\n\ndef go():\n"
                                 f"    return torch.from_file({str(target)!r}, shared=True, size=4)\n")
    assert any(f["route"].startswith("torch.from_file") and f["line"] == 4 for f in found), found
    assert any("memory shared with other processes" in f["route"] for f in found), found    # still mapped
    assert torch.from_file is torch._C._VariableFunctions.from_file
    assert [vars(c).get("from_file") for c in (torch.UntypedStorage, torch.TypedStorage)] == before
    del kept


def test_a_shared_mapping_made_around_the_wrappers_is_a_route(tmp_path):
    target = tmp_path / "buffer.bin"
    found, kept = _run(tmp_path, f"import torch\n\ndef go():\n    return torch._C._VariableFunctions.from_file("
                                 f"{str(target)!r}, shared=True, size=4)\n")
    assert [f["route"] for f in found] == [f"memory shared with other processes ({target})"], found
    del kept


def test_a_store_write_is_a_route_but_not_torchs_store_based_barrier(tmp_path):
    store = dist.HashStore()
    common._ROUTE_TEST_STORE = store
    try:
        found, _ = _run(tmp_path, "from mgpu_utils.grading import common\n\n"
                                  "def _store_based_barrier(store):\n    store.add('barrier', 1)\n\n"
                                  "def go():\n    store = common._ROUTE_TEST_STORE\n"
                                  "    _store_based_barrier(store)\n    store.set('weights', b'x' * 64)\n")
    finally:
        del common._ROUTE_TEST_STORE
    assert [(f["route"], f["line"]) for f in found] == [("the process group's key-value store (store.set)", 9)]
    assert store.get("weights") == b"x" * 64                        # the write itself still happened
    assert "set" not in vars(common._STORE) or common._STORE.set.__name__ == "set"


def test_the_hint_names_the_routes(tmp_path):
    found, _ = _run(tmp_path, "import ctypes\n\ndef go():\n    return ctypes.create_string_buffer(16)\n")
    hint = common.ROUTE_HINTS[0][1].format(rank=0, **found[0])
    assert "ctypes (C functions and C memory" in hint and "line 4 of your file" in hint
    assert "only with torch.distributed collectives" in hint


def test_raw_process_group_methods_kept_at_import_are_refused(tmp_path):
    import importlib.util

    from mgpu_utils.grading.common import raw_collectives_kept

    def load(text):
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    right = load("import torch.distributed as dist\nfrom torch.distributed import ReduceOp, all_reduce\n"
                 "import torch.distributed._functional_collectives as funcol\nAVG = ReduceOp.AVG\n"
                 "class S:\n    op = dist.all_reduce\n    def f(self, t, how=funcol.all_reduce):\n        return how\n")
    assert raw_collectives_kept(right) == []
    wrong = load("import torch\nRAW = torch._C._distributed_c10d.Backend.allreduce\n"
                 "class S:\n    op = staticmethod(torch._C._distributed_c10d.ProcessGroup.allgather)\n"
                 "    def f(self, t, how=torch.ops.c10d.allreduce_):\n        return how\n")
    found = raw_collectives_kept(wrong)
    assert [f["route"].split(" kept as ")[1].split(" ")[0] for f in found] == ["RAW", "op", "f"], found
    assert "method allreduce (torch._C._distributed_c10d)" in found[0]["route"]


def test_integrity_sees_a_grader_class_method_and_a_shadowed_storage_method_and_puts_them_back():
    import torch

    from mgpu_utils.grading.common import integrity_changes, integrity_restore, integrity_snapshot
    from mgpu_utils.measure import comm_calls

    before = integrity_snapshot()
    assert integrity_changes(before, instances=False) == []
    blocked = comm_calls._Handle._blocked
    comm_calls._Handle._blocked = lambda self, how: None            # the grader's record made a no-op
    torch.UntypedStorage.nbytes = lambda self: 0                     # shadows the method inherited from C
    try:
        assert integrity_changes(before, instances=False) == [
            "mgpu_utils.measure.comm_calls._Handle._blocked", "torch.UntypedStorage.nbytes"]
    finally:
        integrity_restore(before)
    assert comm_calls._Handle._blocked is blocked and "nbytes" not in vars(torch.UntypedStorage)
    assert torch.zeros(3).untyped_storage().nbytes() == 12


def test_a_process_of_the_students_own_is_a_route_with_its_line(tmp_path, starts_processes):
    """A forked child (or any process the student's code starts) keeps a copy of the state that no check sees."""
    found, _ = _run(tmp_path, "import os\n\ndef go():\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
                              "    os.waitpid(pid, 0)\n")
    assert [(f["route"].split(" (")[0], f["line"]) for f in found] == [("a process of your own", 4)], found
    found, _ = _run(tmp_path, "import subprocess, sys\n\ndef go():\n    subprocess.run([sys.executable, '-c', ''])\n")
    assert found and all(f["line"] == 4 and f["route"].startswith("a process of your own") for f in found), found
    found, _ = _run(tmp_path, "import _posixsubprocess, os\n\ndef go():\n    try:\n"
                              "        _posixsubprocess.fork_exec()\n    except TypeError:\n        pass\n")
    assert [f["line"] for f in found] == [5] and "fork_exec" in found[0]["route"], found


def test_the_graders_own_process_is_not_a_route(tmp_path, starts_processes):
    import subprocess
    import sys
    found = []
    with common.refusing_routes(str(tmp_path / "student.py"), found):
        subprocess.run([sys.executable, "-c", ""], check=True)
    assert found == []


def test_sqlite_is_a_route(tmp_path):
    found, kept = _run(tmp_path, "import sqlite3\n\ndef go():\n    return sqlite3.connect(':memory:')\n")
    assert [(f["route"].split(" (")[0], f["line"]) for f in found] == [("an sqlite3 database", 4)], found
    kept.close()


def test_a_pipe_or_memfd_left_open_is_a_route_but_not_one_closed_again(tmp_path):
    import os
    found, kept = _run(tmp_path, "import os\n\ndef go():\n    r, w = os.pipe()\n    os.write(w, b'x' * 100)\n"
                                 "    m = os.memfd_create('state')\n    os.write(m, b'y')\n"
                                 "    a, b = os.pipe()\n    os.close(a)\n    os.close(b)\n    return r, w, m\n")
    try:
        kinds = sorted(f["route"].split(" left open")[0] for f in found)
        assert kinds == ["a memfd", "a pipe", "a pipe"], found
        assert all("bytes kept in the kernel" in f["route"] for f in found)
    finally:
        for fd in kept:
            os.close(fd)


def test_gc_freeze_is_a_route_and_gc_and_sys_are_watched(tmp_path):
    """Objects frozen by the student's code are missing from gc.get_objects(), where the checks look for state kept
    outside; gc's functions and sys.getsizeof replaced would blind them (both refused, 2026-12-07)."""
    import gc
    import sys

    from mgpu_utils.grading.common import integrity_changes, integrity_restore, integrity_snapshot
    found, _ = _run(tmp_path, "import gc\n\nkept = []\n\ndef go():\n    kept.append(bytearray(10))\n"
                              "    gc.freeze()\n")
    gc.unfreeze()
    assert [f["route"].split(" (")[0] for f in found] == ["gc.freeze() or gc.unfreeze()"], found
    before = integrity_snapshot()
    real_objects, real_size = gc.get_objects, sys.getsizeof
    gc.get_objects, sys.getsizeof = (lambda *a: []), (lambda *a: 0)
    try:
        assert integrity_changes(before, instances=False) == ["gc.get_objects", "sys.getsizeof"]
    finally:
        integrity_restore(before)
    assert gc.get_objects is real_objects and sys.getsizeof is real_size


def test_made_since_lists_the_new_objects_only():
    """made_since (OutsideState, 03.7's young_bytes): what was made after it, however many objects came before."""
    from mgpu_utils.grading.common import made_since
    old = [object.__new__(type("Old", (), {})) for _ in range(3)]
    since = made_since()
    new = [[k] for k in range(3)]                      # lists: always tracked (a small dict may not be)
    listed = since.objects()
    since.close()
    assert all(any(o is n for o in listed) for n in new) and not any(o is p for o in listed for p in old)


@pytest.fixture
def one_rank_group():
    """A process group of one rank (gloo, an in-memory store) for the test, unless one is already there."""
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if own:
        dist.destroy_process_group()


def test_a_works_boxed_and_unboxed_forms_are_routes(tmp_path, one_rank_group):
    """Work.boxed and Work.unbox called from the student's file are routes: a twenty-seventh red team's 03.7 g01
    waited for its buckets through an unboxed Work, whose wait() no check of when a student waits sees. (That
    file is now told first by the backward it held back, so the route has this test of its own.)"""
    found, _ = _run(tmp_path, "import torch\nimport torch.distributed as dist\n\n\n"
                              "def go():\n    work = dist.all_reduce(torch.ones(2), async_op=True)\n"
                              "    return dist.Work.unbox(work.boxed()).wait()\n")
    routes = sorted({(f["route"].split(":")[0], f["line"]) for f in found})
    assert routes == [("a collective's Work boxed or unboxed (Work.boxed", 7),
                      ("a collective's Work boxed or unboxed (Work.unbox", 7)], routes


def test_a_tensor_subclass_handed_to_a_collective_is_a_route(tmp_path, one_rank_group):
    """A tensor of a subclass handed to a collective from the student's file is a route: its __torch_dispatch__ runs
    the student's Python inside torch's operator, where nothing is counted (a thirty-first red team's 03.7 p01,
    07.5 p03, 07.6 p02); plain tensors and Parameters are not."""
    from mgpu_utils.measure.comm_calls import patched_collectives

    with patched_collectives(lambda name, real: real):
        found, _ = _run(tmp_path, "import torch\nimport torch.distributed as dist\n\n\n"
                                  "class Odd(torch.Tensor):\n    pass\n\n\n"
                                  "def go():\n    dist.all_reduce(torch.ones(2))\n"
                                  "    dist.all_reduce(torch.nn.Parameter(torch.ones(2)))\n"
                                  "    dist.all_reduce(torch.ones(2).as_subclass(Odd))\n")
    routes = sorted({(f["route"].split(" handed")[0], f["line"]) for f in found})
    assert routes == [("a tensor of a subclass of torch.Tensor (Odd)", 12)], routes
