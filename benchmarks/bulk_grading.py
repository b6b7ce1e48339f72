"""Grade a class of 30 synthetic students (five of each kind: right, wrong, crashing, hanging, missing, a syntax
error) on exercise 04.4 with the class grader, and print the time (docs/instructors.md#grading-a-class).

    .venv/bin/python benchmarks/bulk_grading.py [--students 30] [--timeout 40] [--world-sizes 2]
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mgpu_utils.env import REPO_ROOT  # noqa: E402
from mgpu_utils.grading.bulk import grade_class, summary, write_grades  # noqa: E402

FILE = "04_ring_all_gather.py"
RIGHT = REPO_ROOT / "exercises" / "solutions" / FILE
if not RIGHT.is_file():
    raise SystemExit(f"no {RIGHT.relative_to(REPO_ROOT)}: the right students hand in the worked solution, which a "
                     "class copy leaves out; run this benchmark in the instructor's copy of the course")
SIGNATURE = "def ring_all_gather(x):\n"
KINDS = {
    "right": RIGHT.read_text(),
    "wrong": (REPO_ROOT / "exercises" / FILE).read_text(),
    "crash": SIGNATURE + "    raise ValueError('boom')\n",
    "hang": "import time\n" + SIGNATURE + "    while True:\n        time.sleep(1)\n",
    "missing": None,
    "syntax": SIGNATURE + "    return [x for x in\n",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--students", type=int, default=30)
    p.add_argument("--timeout", type=float, default=40, help="seconds per student (the hanging ones use it all)")
    p.add_argument("--world-sizes", default="2", help="comma-separated world sizes")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mgpu_class_"))
    kinds = list(KINDS)
    for i in range(args.students):
        kind = kinds[i % len(kinds)]
        (root / f"student{i:02d}_{kind}").mkdir()
        if KINDS[kind] is not None:
            (root / f"student{i:02d}_{kind}" / FILE).write_text(KINDS[kind])
    t0 = time.perf_counter()
    rows = grade_class(root, ["04.4"], args.timeout, tuple(int(w) for w in args.world_sizes.split(",")))
    seconds = time.perf_counter() - t0
    write_grades(rows, root / "grades.csv")
    print(summary(rows))
    wrong = [r["student"] for r in rows if r["passed"] != r["student"].endswith("_right")]
    print(f"{len(rows)} students graded in {seconds:.0f} s ({seconds / len(rows):.1f} s each; the hanging ones "
          f"{args.timeout:g} s each); CSV: {root / 'grades.csv'}; graded wrongly: {wrong or 'none'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
