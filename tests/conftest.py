import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The test files live one folder down (tests/lessons/, package/, grading/, repo/: docs/testing.md); what they
# share stays here and is imported by name (`from helpers import ...`, `from lab_server import ...`) from any
# of them, whatever pytest's import mode.
for p in (ROOT, ROOT / "launch_scripts", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def pytest_configure(config):
    config.addinivalue_line("markers", "launches: the test starts processes (torchrun or a subprocess)")
    config.addinivalue_line("markers", "runs_notebooks: the test executes lab_server.browser_notebooks() (in a "
                                       "browser, with nbval's output check): nbval does not run them again")
    config.addinivalue_line("markers", "timing_claims: the test asserts a timing claim where the machine is quiet "
                                       "(mgpu_utils.timing.LoadWatch; given to every test that uses it): make test "
                                       "runs these alone, after the others")
    # a plugin, not a hook of this file: this conftest's hooks are not asked about items under notebooks/
    config.pluginmanager.register(NotebooksRunOnce(), "mgpu-notebooks-run-once")


class NotebooksRunOnce:
    """Each notebook is executed once per `make test`: when the browser test is selected and will run (the
    browser is there, or CI requires it), nbval's items of the notebooks it runs are deselected; otherwise
    (no Chromium or no playwright: the browser test says SKIPPED; `-k "not browser"`; `pytest notebooks/...`
    alone) nbval runs them as before.

    Deselected after collection rather than ignored during it: only then is it known which lessons' browser
    tests are among the selected tests (`-k`, `-m`, explicit paths), and trylast puts this after `-k`/`-m`.
    """

    def __init__(self):
        self.deselected: dict[str, int] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        from lab_server import browser_runs_notebooks

        # the lessons the selected browser tests run (one test per lesson: -k 03_ddp leaves nbval the others)
        in_browser = {item.callspec.params["path"].resolve() for item in items
                      if item.get_closest_marker("runs_notebooks") and hasattr(item, "callspec")}
        if not in_browser or not browser_runs_notebooks():
            return
        drop = [item for item in items if item.path.suffix == ".ipynb" and item.path.resolve() in in_browser]
        if not drop:
            return
        for item in drop:
            self.deselected[item.path.name] = self.deselected.get(item.path.name, 0) + 1
        dropped = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=drop)

    def pytest_report_header(self, config):
        """Under `make test`'s workers (pytest-xdist) each worker collects and deselects for itself, and the
        header below, written after collection, is not shown: this line says what they do."""
        from lab_server import browser_runs_notebooks

        if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") \
                and browser_runs_notebooks():
            return ["notebooks: each runs once; where its browser test (tests/repo/test_browser.py) is selected, "
                    "nbval's cells of that lesson are deselected"]

    def pytest_report_collectionfinish(self, config, start_path, items):
        if self.deselected:
            names = ", ".join(n[:2] for n in sorted(self.deselected))
            return [f"notebooks {names}: run once, in the browser (tests/repo/test_browser.py), so their "
                    f"{sum(self.deselected.values())} nbval cells are deselected"]


def pytest_collection_modifyitems(config, items):
    """Mark by what a test does: a test that starts processes asks for the `starts_processes` fixture (and a
    notebook cell of nbval runs in a kernel process), and gets the `launches` marker. So `-m "not launches"`
    selects the in-process tests (the mutation run of `make mutation` uses it: mutants are visible only
    in-process), and `process_guard` fails an unmarked test that starts a process anyway.

    A test whose code uses mgpu_utils.timing.LoadWatch gets the `timing_claims` marker: its claim is asserted
    only where the machine is quiet, which beside make test's other worker it seldom is, so make test runs
    these tests alone after the others (`-m timing_claims`, one process).

    The lessons in the browser (tests/repo/test_browser.py, about 40 s each) run first: `make test`'s two
    workers (pytest-xdist, `--dist load`) take tests in this order, and short tests last leave no worker
    idle at the end while the other finishes a lesson."""
    for item in items:
        if "starts_processes" in getattr(item, "fixturenames", ()) or item.path.suffix == ".ipynb":
            item.add_marker("launches")
        if _uses_load_watch(getattr(item, "function", None)):
            item.add_marker("timing_claims")
    items.sort(key=lambda item: not item.get_closest_marker("runs_notebooks"))     # stable: the rest keep order


_LOAD_WATCH: dict = {}


def _uses_load_watch(function) -> bool:
    """Whether a test function's own source uses LoadWatch (a timing claim asserted only on a quiet machine)."""
    if function is None:
        return False
    if function not in _LOAD_WATCH:
        import inspect

        try:
            _LOAD_WATCH[function] = "LoadWatch(" in inspect.getsource(function)
        except (OSError, TypeError):
            _LOAD_WATCH[function] = False
    return _LOAD_WATCH[function]


@pytest.fixture
def starts_processes():
    """Ask for this fixture in a test that starts processes (torchrun, the launcher, a kernel, a subprocess):
    the test is then marked `launches`, and `process_guard` lets it."""
    yield


class ProcessStarted(RuntimeError):
    """An in-process test (not marked `launches`) started a process."""


@pytest.fixture(autouse=True)
def process_guard(request, monkeypatch):
    """A test not marked `launches` must not start a process: subprocess, fork, multiprocessing, and the
    warm template (which forks ranks in another process) all raise :class:`ProcessStarted` here."""
    if request.node.get_closest_marker("launches"):
        yield
        return
    import torch  # noqa: F401  (its first import probes the CUDA libraries in a subprocess: not the test's)
    # matplotlib's first import on a machine without its font cache (a fresh CI machine) builds the cache by
    # running fontconfig's fc-list: not the test's either (refused, the import failed and every plotting test
    # after it in the process failed with it: 10 tests in a fresh clone's make test).
    import matplotlib.font_manager  # noqa: F401
    import multiprocessing.util
    import os
    import subprocess

    from mgpu_utils.launch import warm

    def refuse(*args, **kwargs):
        raise ProcessStarted(f"{request.node.nodeid} starts a process but is not marked `launches`: give it the "
                             f"`starts_processes` fixture")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse)
    monkeypatch.setattr(warm, "start_job", refuse)
    monkeypatch.setattr(warm, "get_template", refuse)
    yield


@pytest.fixture
def gloo_group_of_one(tmp_path):
    """A gloo process group of one rank inside the pytest process, torn down without a native abort.

    Seen once in a full `make test` (after the emulator test, during the next test): "terminate called after
    throwing an instance of 'std::system_error': Resource deadlock avoided" from a thread with no Python
    frame. That is what std::thread::join raises when a thread joins itself: most likely a gloo thread on
    which the last reference to its process group died (the same family as the exit abort of the launch
    scripts, mgpu_utils.dist.shutdown). It did not reproduce in 30 runs of the test alone. DDP models hold
    the group and sit in reference cycles; comm hooks run Python callbacks on gloo's threads, where the
    garbage collector can run and free such a cycle. So, for the test's duration, the collector is off;
    the cycles are freed here, in the main thread, while the group is still registered; then the group
    is destroyed, and its last reference goes away in the main thread.
    """
    import gc

    import torch.distributed as dist

    gc.disable()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'gloo_store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        gc.enable()


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    """After every test, the warm template (if this pytest process started one) has no child left: every rank
    of every launch has ended and been reaped (issue 19's "no process is left behind after any test")."""
    yield
    import time

    from mgpu_utils.launch import warm

    t = warm._TEMPLATE
    if t is None or not t.alive():
        return
    import psutil

    deadline = time.monotonic() + 5
    while True:
        try:
            left = psutil.Process(t.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes of the warm template left after the test: {[p.pid for p in left]}"



_AS_FOUND = pytest.StashKey[tuple]()
#: set by a library on its first import in a process (scikit-learn: the KMP pair; torch._inductor: its cache),
#: whichever test happens to import it first: kept, not counted as the test's change
_SET_ON_IMPORT = {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """Note os.environ and the working directory before the test's fixtures are set up."""
    import os

    item.stash[_AS_FOUND] = dict(os.environ), os.getcwd()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A test leaves os.environ and the working directory as it found them, once its fixtures (and
    monkeypatch's undo) are torn down: the tests after it, and the kernels that nbval starts from this process
    (they inherit its environment), must not see its changes. Seen once: a test that ran a notebook in-process
    left ``MPLBACKEND=Agg`` behind, nbval's kernels then drew no figures, and three stored outputs differed
    (where nbval runs the lessons: no browser). The process is put back, and the test fails."""
    import os

    result = yield
    env, cwd = item.stash[_AS_FOUND]
    changed = sorted(k for k in (env.keys() | os.environ.keys()) - _SET_ON_IMPORT if env.get(k) != os.environ.get(k))
    moved = os.getcwd() != cwd
    for k in changed:
        if k in env:
            os.environ[k] = env[k]
        else:
            del os.environ[k]
    os.chdir(cwd)
    if changed or moved:
        raise AssertionError(f"{item.nodeid} left the process changed (use monkeypatch.setenv or .chdir): "
                             f"environment {changed}, working directory {'moved' if moved else 'kept'}")
    return result
