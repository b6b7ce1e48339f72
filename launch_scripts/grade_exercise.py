"""Grade a coding exercise's function under torchrun against the library (mgpu_utils.grading.runner.check_script).

Loads the student's file (--solution) on every rank and runs the exercise's check (its record in
mgpu_utils.grading.catalog; the check in the lesson's module of mgpu_utils.grading.coding): the student's
function on real inputs against what PyTorch computes (04.4 and 04.5 against dist.all_gather and reduce-scatter,
with the collectives switched off; 03.4 to 03.7 against DistributedDataParallel; 03.9 (design) and 06.4 (design)
through the bucket simulator and the planner against the best choice; 05.4 through the schedule simulator and the
course's executor; 06.3 against the same SGD steps in one process at every dp x tp mesh; 07.4
and 07.5 against torch.optim in one process; 07.6 against SGD in one process, in float32 and computing in
bfloat16; 09.4 against replicas trained and averaged in one process; 10.5 against the GAN's steps in one
process; 10.7 on simulated training tasks whose B_crit the grader knows; 11.5 with a step of known duration and FlopCounterMode; 12.5 against the same job run without a crash;
08.3 on two parts and inside ring attention against full attention). Every rank's findings are gathered to rank
0, whose result is {"exercise", "world_size", "ok", "problems": [...]}; an exercise whose record says
collectives_only (03.7, 07.4 to 07.6) loads and checks the file within mgpu_utils.grading.common.refusing_routes:
an mmap, a file in /dev/shm, ctypes, torch.from_file, a store write, a socket or a shared mapping of the
student's is a problem when the check found none; a function or class of torch.optim or of the grader's modules
replaced by the student's code (mgpu_utils.grading.common.integrity_changes), in any exercise, or (collectives_only) an
optimizer given a step() of its own, comes first. Each problem
names the rank, a kind that mgpu_utils.grading.runner turns into a hint (the hints beside the check, in the exercise's record), and the
numbers behind it.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/grade_exercise.py --exercise 04.4 --solution workspace/04_ring_all_gather.py
"""
import argparse
import contextlib
import faulthandler
import importlib.util
import os
import time

import torch.distributed as dist

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import distributed, emit_result
from mgpu_utils.grading.catalog import EXERCISES
from mgpu_utils.grading.common import (freeze_library, integrity_changes, integrity_restore, integrity_snapshot,
                                       raw_collectives_kept, refusing_routes)


def grade(exercise: str, path: str, ctx) -> dict:
    """One exercise: load the student's file, run its check on every rank, gather the problems (same on all)."""
    spec = importlib.util.spec_from_file_location(f"solution_{exercise.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    name, check = EXERCISES[exercise].entry, EXERCISES[exercise].check
    problems, refused = [], []      # refused: routes around torch.distributed (collectives_only exercises)
    untouched = integrity_snapshot()    # torch.optim and the grader's modules, as the student's file finds them
    with (refusing_routes(path, refused) if EXERCISES[exercise].collectives_only else contextlib.nullcontext()):
        spec.loader.exec_module(module)
        if not callable(getattr(module, name, None)):
            raise AttributeError(f"{path} defines no function {name}(...)")
        if EXERCISES[exercise].collectives_only:
            refused.extend(raw_collectives_kept(module))
        replaced = integrity_changes(untouched, instances=False)
        info = check(getattr(module, name), ctx, problems) or {}
    # an optimizer given a step() of its own (a scan of every object: 0.1 s a rank): the stretch exercises only
    replaced = replaced or integrity_changes(untouched, instances=EXERCISES[exercise].collectives_only)
    if replaced:                    # the check's findings cannot be trusted: this comes first
        problems.insert(0, {"kind": "tampered", "rank": ctx.rank, "what": ", ".join(replaced[:3])})
        integrity_restore(untouched)
    elif refused and not problems:  # what the check found comes first: it names the mistake more closely
        problems.append({**refused[0], "rank": ctx.rank})
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, problems)
    found = [q for rank_problems in everyone for q in rank_problems]
    return {"exercise": exercise, "world_size": ctx.world_size, "ok": not found, "problems": found, "info": info}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    functions = sorted(i for i, e in EXERCISES.items() if e.check)
    p.add_argument("--exercise", required=True, action="append", choices=functions,
                   help="repeat --exercise/--solution to grade several files in one launch (the tests do)")
    p.add_argument("--solution", required=True, action="append", help="the student's file")
    args = p.parse_args()
    if len(args.exercise) != len(args.solution):
        raise SystemExit("give one --solution per --exercise")

    if os.environ.get("MGPU_GRADE_STACKS_AFTER_S"):    # the grader's time limit is near: print where each rank is
        faulthandler.dump_traceback_later(float(os.environ["MGPU_GRADE_STACKS_AFTER_S"]), exit=False)
    # torch's lazy imports, done before any student's file runs: the first optimizer imports torch._dynamo (4 s
    # a cold rank), which probes the temp folder by writing a file there (tempfile.gettempdir), a route the stretch
    # exercises refuse. A warm launch's template has done both; a real torchrun (macOS, MGPU_LAUNCH) has not.
    import tempfile

    import torch._dynamo  # noqa: F401
    tempfile.gettempdir()
    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized():
            raise RuntimeError("grade_exercise.py needs a process group: run it under torchrun")
        results = []
        for e, s in zip(args.exercise, args.solution):
            # what is alive now (torch's, the grader's, earlier files'): later collections and listings skip it
            freeze_library(collect=bool(results), tensors=EXERCISES[e].collectives_only)
            start = time.perf_counter()
            results.append({**grade(e, s, ctx), "seconds": round(time.perf_counter() - start, 3)})
        emit_result(results[0] if len(results) == 1 else {"world_size": ctx.world_size, "results": results})


if __name__ == "__main__":
    main()
