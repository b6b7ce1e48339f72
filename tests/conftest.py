import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "launch_scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def pytest_configure(config):
    config.addinivalue_line("markers", "launches: the test starts processes (torchrun or a subprocess)")


def pytest_collection_modifyitems(config, items):
    """Mark every test that starts processes, so that `-m "not launches"` selects the pure ones (the
    mutation run of `make mutation` uses it: those tests run in-process, where mutants are visible)."""
    import inspect

    for item in items:
        fn = getattr(item, "function", None)
        if fn is None:
            continue
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        if any(call in src for call in ("launch(", "run_torchrun(", "subprocess.", "_run(")):
            item.add_marker("launches")
