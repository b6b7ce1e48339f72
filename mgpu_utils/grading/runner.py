"""Graded coding exercises: your script, run for real under torchrun, checked against PyTorch.

Each coding exercise has a template in ``exercises/`` (a short file with ``TODO``s; the parts that are not the
point are written). In a notebook::

    from mgpu_utils.grading.runner import check_script, exercise_file
    path = exercise_file("04.4")     # your copy: workspace/04_ring_all_gather.py (git ignores workspace/)
    check_script("04.4")             # edit your copy, run this cell again

``check_script`` launches your code with the course's launcher at the world sizes the exercise needs,
compares it with the library's result (``launch_scripts/grade_exercise.py``) or with the output the
exercise asks for, and answers like :func:`mgpu_utils.grading.quiz.check`: a specific hint, or a
confirmation. A hang is reported as a hint (a short collective timeout), never a stuck cell. Worked
solutions for instructors: ``exercises/solutions/``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from mgpu_utils.dist import wrap_text
from mgpu_utils.launch.launcher import REPO_ROOT, LaunchError, LaunchTimeout, run_torchrun

#: Templates and, in ``solutions/``, the worked solutions.
EXERCISES_DIR = REPO_ROOT / "exercises"
#: Where :func:`exercise_file` puts your copies (ignored by git).
WORKSPACE = REPO_ROOT / "workspace"
#: Collective timeout (seconds) for graded runs: a hang becomes an error this fast.
HANG_TIMEOUT_S = 5
_MEASURED: list = []                  # measurements of the last check_script (times, bytes), printed on success


@dataclass(frozen=True)
class Graded:
    """One coding exercise: its template file, how it is graded, and at which world sizes."""

    template: str
    mode: str                      # "function": grade_exercise.py calls it; "script": run it, check its result
    world_sizes: tuple[int, ...]
    what: str                      # said on success


GRADED = {
    "03.4": Graded("03_my_ddp.py", "function", (2, 3),
                   "gradients after one step and parameters after three SGD steps equal DistributedDataParallel's"),
    "03.5": Graded("03_overlap.py", "function", (2, 3),
                   "DDP's gradients and parameters, with one asynchronous all-reduce per parameter started inside "
                   "backward"),
    "03.6": Graded("03_buckets.py", "function", (2, 3),
                   "DDP's gradients and parameters, with one asynchronous all-reduce per bucket"),
    "04.4": Graded("04_ring_all_gather.py", "function", (2, 3, 4),
                   "equal to dist.all_gather for lengths 1 and 7, with point-to-point messages only"),
    "04.5": Graded("04_ring_reduce_scatter.py", "function", (2, 3, 4),
                   "equal to reduce-scatter for chunks of 1 and 3 elements, with point-to-point messages only"),
    "05.4": Graded("05_one_f_one_b.py", "function", (2, 3, 4),
                   "complete, deadlock-free, the bubble (p-1)/(m+p-1) with at most min(p-r, m) micro-batches in "
                   "flight, and the gradients of one process when run on real ranks"),
    "07.4": Graded("07_zero1.py", "function", (2, 3),
                   "three steps equal torch.optim.Adam in one process, with the moments sharded over the ranks"),
    "04.6": Graded("04_fix_the_hang.py", "script", (2, 3),
                   "every rank ends with the sum, and the job finishes"),
}


def _get(exercise_id: str) -> Graded:
    if exercise_id not in GRADED:
        raise KeyError(f"unknown coding exercise {exercise_id!r}; known: {', '.join(sorted(GRADED))}")
    return GRADED[exercise_id]


def exercise_file(exercise_id: str) -> Path:
    """Your copy of the exercise's template, ``workspace/<template name>``, copied there on the first call.

    Returns:
        The path of your copy (edit it, then run :func:`check_script`).

    Raises:
        KeyError: unknown exercise id (the message lists the known ones).
    """
    g = _get(exercise_id)
    mine = WORKSPACE / g.template
    if not mine.exists():
        WORKSPACE.mkdir(exist_ok=True)
        shutil.copy(EXERCISES_DIR / g.template, mine)
    return mine


def _frames(stderr: str, path: Path) -> list[tuple[int, str]]:
    """(line number, code) of every traceback frame in ``path`` (the student's file), innermost last."""
    out, lines = [], stderr.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r'File "([^"]+)", line (\d+)', line)
        if m and Path(m.group(1)).name == path.name and i + 1 < len(lines):
            out.append((int(m.group(2)), lines[i + 1].strip()))
    return out


def _hang_hint(err: LaunchError, path: Path) -> str:
    """Where each rank was when the collective timed out: the collective it called, and the line."""
    where = []
    for rank, entry in sorted((err.logs or {}).items()):
        frames = _frames(entry.get("stderr", ""), path)
        if frames:
            line, code = frames[-1]
            call = re.search(r"dist\.(\w+)", code)
            where.append(f"rank {rank} waits in {call.group(1) if call else code} (line {line})")
    said = "; ".join(where) if where else "no rank reached the end"
    return (f"the job hung in a collective: {said}. A collective completes only when every rank calls the same one, "
            f"in the same order; a rank that calls a different one, or none, leaves the others waiting")


def _problem_hint(p: dict, world: int) -> str:
    r, kind = p["rank"], p["kind"]
    if kind == "shape":
        return f"rank {r}: returned {p['got']}, expected {p['want']}"
    if kind == "entry":
        j, same = p["index"], p.get("equals_rank")
        if same is not None:
            return (f"rank {r}: the entry for rank {j} holds rank {same}'s tensor (world size {world}). At step s a "
                    f"rank forwards what it received at step s - 1: the tensor of rank (rank - s) mod W, and "
                    f"receives that of rank (rank - s - 1) mod W")
        return (f"rank {r}: the entry for rank {j} differs from dist.all_gather's by {p['max_diff']:.3g} (world size "
                f"{world}, length {p['length']}): was it received into the right slot, and waited for before use?")
    if kind == "value":
        if p.get("one_rank") == r:
            return (f"rank {r}: returned its own share of chunk {r}, unchanged (world size {world}): nothing from the "
                    f"other ranks was added")
        if p.get("one_rank") is not None:
            return (f"rank {r}: returned rank {p['one_rank']}'s share of chunk {r} alone (world size {world}): the "
                    f"partial sums were replaced on the way, not added to")
        if p.get("equals_chunk") is not None and p["equals_chunk"] != r:
            return (f"rank {r}: returned the complete sum of chunk {p['equals_chunk']}, not chunk {r} (world size "
                    f"{world}): start one chunk earlier, so that after W - 1 steps the chunk completed is rank's own")
        return (f"rank {r}: differs from reduce-scatter's chunk by {p['max_diff']:.3g} (world size {world}, chunks of "
                f"{p['k']}): each step must add the incoming partial sum to this rank's copy of the same chunk")
    if kind == "grad":
        if p["local"]:
            return (f"rank {r}: the gradient of {p['param']} is still this rank's own (world size {world}): "
                    f"all-reduce it over the ranks")
        if p["summed"]:
            return (f"rank {r}: the gradient of {p['param']} is {world} times DDP's (world size {world}): all_reduce "
                    f"sums; DDP averages, so divide by the world size")
        return f"rank {r}: the gradient of {p['param']} differs from DDP's by {p['max_diff']:.3g} (world size {world})"
    if kind == "overlap":
        return (f"rank {r}: {p['calls']} all-reduce call(s) for {p['params']} parameters, {p['inside_async']} of them "
                f"started inside backward with async_op=True: start one per parameter from its hook, wait in finish()")
    if kind == "buckets":
        return (f"rank {r}: {p['calls']} all-reduce call(s); the rule gives {p['want']} for gradients of "
                f"{p['ready_bytes']} bytes in ready order and buckets of {p['bucket_bytes']} bytes"
                + ("" if p["all_async"] else "; and every call must be asynchronous (async_op=True)"))
    if kind == "actions":
        return (f"with p = {p['p']} and m = {p['m']}: return one list per rank, and rank r's list must hold "
                f"('F', i, r) and ('B', i, r) exactly once for every micro-batch i in 0..m-1")
    if kind == "deadlock":
        return f"with p = {p['p']} and m = {p['m']} the schedule deadlocks: {p['detail']}"
    if kind == "bubble":
        return (f"with p = {p['p']} and m = {p['m']} the bubble is {p['bubble']:.3f}, more than 1F1B's (p-1)/(m+p-1) = "
                f"{p['formula']:.3f}: a stage waits for a backward it could have run earlier")
    if kind == "memory":
        return (f"rank {r} holds {p['peak']:g} micro-batches' activations at once (p = {p['p']}, m = {p['m']}); 1F1B "
                f"holds at most min(p - r, m) = {p['limit']}: start the backwards after fewer warm-up forwards")
    if kind == "adam":
        if p["moved_share"] < 1 - 1 / (2 * world):         # about 1/W moved: only this rank's own slice
            return (f"rank {r}: only {p['moved_share']:.0%} of the parameters that Adam updates moved (world size "
                    f"{world}): the other ranks' updated slices never arrived; gather every slice on every rank "
                    f"(step 3)")
        return (f"rank {r}: after three steps the parameters differ from Adam in one process by {p['max_diff']:.3g} "
                f"(world size {world}): is g the mean over the ranks of this rank's slice (step 1)?")
    if kind == "adam_memory":
        return (f"rank {r}: your optimizer holds {p['bytes']:,} bytes of tensors; full Adam's moments are "
                f"{p['full']:,}: keep only this rank's slice of m and v")
    if kind == "param":
        if "grad" in p.get("what", ""):
            return f"rank {r}: gradients differ from one process's by {p['max_diff']:.3g} (world size {world})"
        return (f"rank {r}: after three steps the parameters differ from DDP's by {p['max_diff']:.3g} (world size "
                f"{world}), although the first step's gradients matched")
    return f"rank {r}: {p}"


def grade_many(cases: list[tuple[str, Path]], world: int) -> list[str | None]:
    """Grade several function-mode exercises in one launch at world size ``world`` (used by the tests: one
    torchrun start instead of one per file). ``cases``: ``[(exercise_id, path), ...]``; returns each case's hint,
    or None where it passes. Raises :class:`LaunchError` if any file raises (check_script reports those)."""
    args = [a for exercise_id, path in cases for a in ("--exercise", exercise_id, "--solution", Path(path).resolve())]
    res = run_torchrun("grade_exercise.py", world, args, show="none", timeout_s=300,
                       env={"MGPU_COLLECTIVE_TIMEOUT_S": HANG_TIMEOUT_S}).result
    results = res["results"] if "results" in res else [res]
    return [None if r["ok"] else _problem_hint(r["problems"][0], world) for r in results]


def _grade_once(exercise_id: str, g: Graded, path: Path, world: int) -> str | None:
    """Run once at world size ``world``; None when it passes, else the hint."""
    env = {"MGPU_COLLECTIVE_TIMEOUT_S": HANG_TIMEOUT_S}
    try:
        if g.mode == "function":
            run = run_torchrun("grade_exercise.py", world, ["--exercise", exercise_id, "--solution", path],
                               show="none", env=env, timeout_s=120)
        else:
            run = run_torchrun(path, world, show="none", env=env, timeout_s=120)
    except LaunchTimeout as e:
        return _hang_hint(e, path)
    except LaunchError as e:
        message = e.message or str(e).splitlines()[0]
        if re.search(r"timed out|Timeout", message, re.IGNORECASE):
            return _hang_hint(e, path)
        if "point-to-point only" in message:
            return f"{message}: send and receive with your neighbours instead (dist.isend/dist.irecv)"
        frames = _frames("\n".join(v.get("stderr", "") for v in (e.logs or {}).values()), path)
        at = f" at line {frames[-1][0]} of {path.name}: {frames[-1][1]}" if frames else ""
        return f"rank {e.rank} raised {e.exc_type or 'an error'}: {message}{at}"
    res = run.result or {}
    if g.mode == "function":
        info = res.get("info", {})
        if res.get("ok") and "yours_ms" in info:
            _MEASURED.append(f"world size {world}: one step (forward, backward, communication) {info['yours_ms']:.1f} ms "
                          f"with yours, {info['ddp_ms']:.1f} ms with DDP (rank 0, median of 3; a tiny model on CPU: "
                          f"latency, not bandwidth)")
        if res.get("ok") and "optimizer_bytes" in info:
            _MEASURED.append(f"world size {world}: your optimizer holds {info['optimizer_bytes']:,} bytes on rank 0; "
                          f"Adam's moments for the whole model are {info['full_adam_bytes']:,}")
        return None if res.get("ok") else _problem_hint(res["problems"][0], world)
    want = 4 * world * (world + 1) / 2
    if res.get("total") != want:
        got = res.get("total")
        return (f"rank 0's total is {got:g}, expected {want:g} = 4 x (1 + ... + {world}) at world size {world}"
                if isinstance(got, (int, float)) else f"rank 0 printed no total (its result: {res})")
    return None


def check_script(exercise_id: str, path: str | Path | None = None, *, quiet: bool = False,
                 world_sizes: tuple[int, ...] | None = None) -> bool:
    """Grade your solution of a coding exercise under torchrun; print a hint or a confirmation.

    Args:
        exercise_id: e.g. "04.4" (see :data:`GRADED`).
        path: your file (default: your copy from :func:`exercise_file`, made from the template if missing).
        quiet: print nothing.
        world_sizes: grade at these world sizes instead of the exercise's (the tests use fewer).

    Returns:
        True when the solution passes at every world size the exercise uses.

    Raises:
        KeyError: unknown exercise id.
        FileNotFoundError: ``path`` does not exist.
    """
    g = _get(exercise_id)
    if path is None:
        new = not (WORKSPACE / g.template).exists()
        path = exercise_file(exercise_id)
        if not quiet:
            made = f", your copy of exercises/{g.template} (made now):\n  edit it, then run this cell again"
            print(wrap_text(f"[{exercise_id}] grading {path.relative_to(REPO_ROOT)}" + (made if new else "")))
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: exercise_file({exercise_id!r}) makes your copy")
    sizes = tuple(world_sizes or g.world_sizes)
    _MEASURED.clear()
    for world in sizes:
        hint = _grade_once(exercise_id, g, path.resolve(), world)
        if hint:
            if not quiet:
                print(wrap_text(f"[{exercise_id}] not yet: {hint}"))
            return False
    if not quiet:
        print(wrap_text(f"[{exercise_id}] correct: {g.what} (world sizes {', '.join(map(str, sizes))})"))
        for line in _MEASURED:
            print(wrap_text(f"    {line}"))
    return True
