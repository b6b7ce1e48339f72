"""The capstone's whole parity matrix, timed, and stored for lesson 13 (notebooks/13_capstone.ipynb, issue 59).

Runs ``launch_scripts/capstone_train.py`` once per world size of ``mgpu_utils.parallel.layouts.PARITY_MATRIX``
(1, 2, 4, 8 and 32 gloo ranks: every parallelism, 1-D to 5-D), each layout against one process within 1e-5
after 10 SGD steps (the script raises otherwise, and so does this run). Prints each layout's row, each launch's
wall time and the total (goal: under 3 minutes on 2 cores; more ranks than cores take turns on them, so this is
a cost, not a scaling measurement), writes the table to --out (default: the stored table lesson 13 loads for the
layouts it does not run live; tests/lessons/test_13_capstone.py checks it names exactly the matrix's layouts),
and prints one final JSON line: {"total_seconds", "seconds": {world: s}, "layouts": n, "out"}.

Run it again after changing the matrix, the script or the model, and commit the table:
    python benchmarks/capstone_matrix.py
"""
import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mgpu_utils.launch.launcher import launch  # noqa: E402
from mgpu_utils.parallel.layouts import PARITY_ARGS, PARITY_MATRIX, STORED_MATRIX  # noqa: E402

GOAL_S = 180


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", type=int, nargs="+", default=sorted(PARITY_MATRIX),
                   help=f"world sizes to run, of {sorted(PARITY_MATRIX)} (a subset is not stored)")
    p.add_argument("--out", default=str(STORED_MATRIX), help="where the table is written (JSON)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.worlds) - set(PARITY_MATRIX))
    if unknown:
        raise SystemExit(f"--worlds {unknown}: not in the matrix; its world sizes are {sorted(PARITY_MATRIX)}")

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # usable
    rows, seconds = {}, {}
    for world in args.worlds:
        extra = PARITY_ARGS.get(world, [])
        t0 = time.perf_counter()
        res = launch("capstone_train.py", world, args=["--layouts", *PARITY_MATRIX[world], *extra], show="none",
                     timeout_s=600)
        seconds[world] = round(time.perf_counter() - t0, 1)
        for name, r in res["layouts"].items():
            rows[name] = {"world": world, "args": extra, "experts": r["experts"], "loss_first": r["losses"][0],
                          "loss_last": r["losses"][-1], "max_param_diff": r["max_param_diff"],
                          "max_loss_diff": r["max_loss_diff"]}
            print(f"{world:>3} ranks  {name:<30} loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}  "
                  f"max |param diff| {r['max_param_diff']:.1e}  max |loss diff| {r['max_loss_diff']:.1e}")
        print(f"{world:>3} ranks: {len(res['layouts'])} layouts in {seconds[world]} s", flush=True)
    total = round(sum(seconds.values()), 1)
    verdict = "within" if total <= GOAL_S else "OVER"
    print(f"the matrix: {len(rows)} layouts in {len(seconds)} launches, {total} s on {cores} cores "
          f"({verdict} the {GOAL_S} s goal)")
    out = None
    if args.worlds == sorted(PARITY_MATRIX):
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        table = {"command": "python benchmarks/capstone_matrix.py", "torch": torch.__version__.split("+")[0],
                 "python": sys.version.split()[0], "cpu_cores": cores,
                 "date": datetime.date.today().isoformat(), "seconds": seconds, "total_seconds": total,
                 "tolerance": 1e-5, "layouts": rows}
        out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"stored: {out}")
    result = {"total_seconds": total, "seconds": seconds, "layouts": len(rows), "out": str(out) if out else None}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
