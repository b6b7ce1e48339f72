"""Exercise 12.5's grader (mgpu_utils.grading.coding.fault_tolerance), round 2 of issue 55: however a file is
written (torch.save, pathlib, io.open, os.open, tempfile), rank 0's writes are seen and the other ranks' too;
a save must be complete on every rank when it returns. Right variants pass; wrong ones get the hint that names
them. Each list is graded in one launch at 3 ranks."""
import re

import pytest

from mgpu_utils.grading.runner import grade_many
from helpers import wrong

SAVE = "        torch.save(state, tmp)                           # a crash here leaves the old snapshot at path\n"
RENAME = "        os.replace(tmp, path)                            # atomic: path is the old file or the new one\n"
BARRIER = "    dist.barrier()                                       # no rank reads or writes ahead of the snapshot\n"
IMPORTS = "import os\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "pathlib write_bytes, then os.replace": (
        [IMPORTS, SAVE], ["import io\nimport os\nfrom pathlib import Path\n",
                          "        buf = io.BytesIO()\n        torch.save(state, buf)\n"
                          "        Path(tmp).write_bytes(buf.getvalue())\n"]),
    "io.open handle, then Path.replace": (
        [IMPORTS, SAVE, RENAME], ["import io\nimport os\nfrom pathlib import Path\n",
                                  "        with io.open(tmp, 'wb') as f:\n            torch.save(state, f)\n",
                                  "        Path(tmp).replace(path)\n"]),
    "tempfile beside the path, then os.rename": (
        [IMPORTS, SAVE, RENAME], ["import os\nimport tempfile\n",
                                  "        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))\n"
                                  "        with os.fdopen(fd, 'wb') as f:\n            torch.save(state, f)\n",
                                  "        os.rename(tmp, path)\n"]),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "no barrier: the other ranks return at once": (
        BARRIER, "", r"rank [12]: save_snapshot returned before rank 0's snapshot of step 5 was complete"),
    "every rank writes through pathlib": (
        ["    if dist.get_rank() == 0:\n", SAVE, IMPORTS],
        ["    if True:\n", "        tmp = Path(f'{path}.{dist.get_rank()}')\n        buf = io.BytesIO()\n"
                         "        torch.save(state, buf)\n        tmp.write_bytes(buf.getvalue())\n"
                         "        if dist.get_rank():\n            return dist.barrier()\n",
         "import io\nimport os\nfrom pathlib import Path\n"],
        r"ranks \[1, 2\] wrote files too: only rank 0 writes"),
    "written in place through io.open": (
        [IMPORTS, SAVE, RENAME], ["import io\nimport os\n",
                                  "        with io.open(path, 'wb') as f:\n            torch.save(state, f)\n", ""],
        r"halfway through writing the second snapshot, the path no longer held the first"),
    "written in place through pathlib": (
        [IMPORTS, SAVE, RENAME], ["import io\nimport os\nfrom pathlib import Path\n",
                                  "        buf = io.BytesIO()\n        torch.save(state, buf)\n"
                                  "        Path(path).write_bytes(buf.getvalue())\n", ""],
        r"halfway through writing the second snapshot, the path no longer held the first"),
    "written in place through os.open": (
        [IMPORTS, SAVE, RENAME], ["import io\nimport os\n",
                                  "        buf = io.BytesIO()\n        torch.save(state, buf)\n"
                                  "        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
                                  "        os.write(fd, buf.getvalue())\n        os.close(fd)\n", ""],
        r"halfway through writing the second snapshot, the path no longer held the first"),
    "the old snapshot deleted, then the new one renamed onto the path (a thirteenth red team's 12.5 x01)": (
        RENAME, "        if os.path.exists(path):\n            os.remove(path)                              # none now\n"
                "        os.rename(tmp, path)\n",
        r"halfway through writing the second snapshot, the path no longer held the first"),
    "the temporary file copied onto the path by cp in a subprocess (12.5 x02)": (
        [IMPORTS, RENAME], ["import os\nimport subprocess\n",
                            "        subprocess.run(['cp', tmp, path], check=True)    # rewrites path in place\n"],
        r"rank 0: save_snapshot started a process \(subprocess\.Popen"),
    "every rank writes a copy through torch.serialization.save (12.5 x03)": (
        "    if dist.get_rank() == 0:\n",
        "    torch.serialization.save({'step': step}, f'{path}.rank{dist.get_rank()}')\n    if dist.get_rank() == 0:\n",
        r"ranks \[1, 2\] wrote files too: only rank 0 writes"),
}


def _files(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / str(k)
        folder.mkdir()
        out.append(("12.5", wrong(folder, "12.5", old, new)))
    return out


def test_right_snapshots_pass_however_they_write(tmp_path, starts_processes):
    hints = grade_many(_files(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_snapshots_get_their_hints_however_they_write(tmp_path, starts_processes):
    hints = grade_many(_files(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


@pytest.mark.parametrize("mode, flags, counted", [("wb", None, True), ("rb", None, False), ("r+b", None, True),
                                                  (None, 0o1101, True), (None, 0, False)])
def test_the_audit_hook_counts_opens_for_writing_only(tmp_path, mode, flags, counted):
    from mgpu_utils.grading import common
    from mgpu_utils.grading.coding import fault_tolerance as ft

    seen = {"saves": 0, "active": True, "target": str(tmp_path / "snapshot.pt")}
    ft._WATCH = seen
    try:
        with common.watching_opens(ft._opened):            # the audit event, as Python raises it
            common._audit("open", (str(tmp_path / "x"), mode, flags))
    finally:
        ft._WATCH = None
    assert seen["saves"] == int(counted)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"12.5": (len(RIGHT), len(WRONG))}
