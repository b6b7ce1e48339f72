"""Graded coding exercises (lessons 03 to 12): your script, run for real under torchrun,
checked against PyTorch.

Each coding exercise has a template in ``exercises/`` (a short file with ``TODO``s; the parts that are not the
point are written). In a notebook::

    from mgpu_utils.grading.runner import check_script, exercise_file
    path = exercise_file("04.4")     # your copy: workspace/04_ring_all_gather.py (git ignores workspace/)
    check_script("04.4")             # edit your copy, run this cell again
    reset_exercise("04.4")           # start over from the template (your copy kept in workspace/old/)
    load_exercise("10.7").find_b_crit(task)   # try your function in a cell before grading it
    passed = check_script("08.3")    # lesson 08 goes on with your merge once it passes, the course's until then:
    merge = yours_or_library("08.3", passed, context.merge)

``check_script`` launches your code with the course's launcher at the world sizes the exercise needs,
compares it with the library's result (``launch_scripts/grade_exercise.py``) or with the output the
exercise asks for, and answers like :func:`mgpu_utils.grading.quiz.check`: a specific hint, or a
confirmation. A hang is reported as a hint (a short collective timeout), never a stuck cell. Worked
solutions: ``exercises/solutions/``, in the instructor's copy only (a class copy leaves them out:
:mod:`mgpu_utils.grading.class_copy`).
"""

from __future__ import annotations

import importlib.util
import random
import re
import shutil
from pathlib import Path

from mgpu_utils.dist import TIMEOUT_ENV
from mgpu_utils.text import wrap_text
from mgpu_utils.grading.catalog import exercise
from mgpu_utils.grading.common import COMMON_HINTS, CodingExercise
from mgpu_utils.launch.launcher import LaunchError, LaunchTimeout, run_torchrun
from mgpu_utils.env import REPO_ROOT

#: The templates (and, in the instructor's copy, the worked solutions in ``solutions/``).
EXERCISES_DIR = REPO_ROOT / "exercises"
#: Where :func:`exercise_file` puts your copies (ignored by git).
WORKSPACE = REPO_ROOT / "workspace"
#: Collective timeout (seconds) for graded runs: a hang becomes an error this fast.
HANG_TIMEOUT_S = 5
#: What gloo says when two ranks' collectives pair up with different sizes (then it aborts the process).
MISMATCH = "Is there a distributed collective mismatch in your code?"
#: Seconds a graded launch may run; a rank prints its Python stack (faulthandler) 5 s before.
GRADE_TIMEOUT_S = 120


def exercise_file(exercise_id: str) -> Path:
    """Your copy of the exercise's template, ``workspace/<template name>``, copied there on the first call.

    Returns:
        The path of your copy (edit it, then run :func:`check_script`).

    Raises:
        KeyError: unknown exercise id (the message lists the known ones).
    """
    g = exercise(exercise_id)
    mine = WORKSPACE / g.template
    if not mine.exists():
        WORKSPACE.mkdir(exist_ok=True)
        shutil.copy(EXERCISES_DIR / g.template, mine)
    return mine


def load_exercise(exercise_id: str):
    """Your copy of an exercise (:func:`exercise_file`, made from the template if missing) as a module, loaded
    afresh at every call so that your latest edits count: to try your function in a cell before
    :func:`check_script` grades it (lesson 10, exercise 10.7).

    Raises:
        KeyError: unknown exercise id. Whatever your file raises while it is loaded.
    """
    path = exercise_file(exercise_id)
    spec = importlib.util.spec_from_file_location(f"workspace_{exercise_id.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reset_exercise(exercise_id: str) -> Path:
    """Start an exercise over: your copy is moved to ``workspace/old/<name>.<n>.py`` (nothing is lost) and a fresh
    copy of the template takes its place. Returns the path of the fresh copy.

    Raises:
        KeyError: unknown exercise id (the message lists the known ones).
    """
    g = exercise(exercise_id)
    mine = WORKSPACE / g.template
    if mine.exists():
        old = WORKSPACE / "old"
        old.mkdir(parents=True, exist_ok=True)
        n = 1 + sum(1 for _ in old.glob(f"{mine.stem}.*.py"))
        shutil.move(mine, old / f"{mine.stem}.{n}.py")
    return exercise_file(exercise_id)


def _frames(stderr: str, path: Path) -> list[tuple[int, str]]:
    """(line number, code) of every traceback frame in ``path`` (the student's file), innermost last."""
    out, lines = [], stderr.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r'File "([^"]+)", line (\d+)', line)
        if m and Path(m.group(1)).name == path.name and i + 1 < len(lines):
            out.append((int(m.group(2)), lines[i + 1].strip()))
    return out


def _stuck_hint(err: LaunchError, path: Path) -> str | None:
    """The launch ran past its time limit though no collective timed out (a waiting collective fails after
    HANG_TIMEOUT_S): where each rank was, from the stacks it printed (faulthandler, most recent call first), or
    None when none is in the student's file."""
    where = []
    for rank, entry in sorted((err.logs or {}).items()):
        m = re.search(r'File "([^"]+)", line (\d+) in (\w+)', "\n".join(
            ln for ln in entry.get("stderr", "").splitlines() if path.name in ln))
        if m:
            lines = path.read_text().splitlines()
            code = lines[int(m.group(2)) - 1].strip() if int(m.group(2)) <= len(lines) else ""
            where.append(f"rank {rank} at line {m.group(2)} ({m.group(3)}): {code}")
    if not where:
        return None
    return (f"the job ran past {GRADE_TIMEOUT_S} s, and no rank was waiting in a collective (one that waits fails "
            f"after {HANG_TIMEOUT_S} s): {'; '.join(where)}. A loop that never ends?")


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


def problem_hint(exercise_id: str, p: dict, world: int) -> str:
    """The hint for one problem a rank reported in exercise ``exercise_id``, at world size ``world``, from the
    exercise's own hints (:class:`~mgpu_utils.grading.common.CodingExercise`: they sit beside its check)."""
    hints = exercise(exercise_id).hints.get(p.get("kind")) or COMMON_HINTS.get(p.get("kind"), [])
    for when, hint in hints:
        if when(p, world):
            return hint.format(**p, W=world) + (
                " (on a model that uses one weight twice: its gradient is the sum of both uses and is ready once, "
                "after both, when its hook fires (a tensor hook, p.register_hook, once too, with the sum): "
                "model.parameters() lists it once; one hook per module that holds it fires twice)"
                if p.get("tied") else "")
    return f"rank {p.get('rank')}: {p}"


def telling(problems: list[dict]) -> dict:
    """The problem to hint at: torch or the grader patched (the rest cannot be trusted then), else the first one
    that names another rank's data (a broadcast shows as "rank 1
    holds rank 0's gradient" on the other ranks, while the source rank's own result only looks unreduced),
    else the first about the first step (a gradient divided on rank 0 only is wrong on rank 1 at once; rank 0
    only drifts later), else the first reported."""
    return next((p for p in problems if p.get("kind") == "tampered"), None) \
        or next((p for p in problems if p.get("copied_from") is not None), None) \
        or next((p for p in problems if p.get("kind") != "param"), problems[0])


def grade_many(cases: list[tuple[str, Path]], world: int) -> list[str | None]:
    """Grade several function-mode exercises in one launch at world size ``world`` (used by the tests: one
    torchrun start instead of one per file). ``cases``: ``[(exercise_id, path), ...]``; returns each case's hint,
    or None where it passes. Raises :class:`LaunchError` if any file raises (check_script reports those)."""
    args = [a for exercise_id, path in cases for a in ("--exercise", exercise_id, "--solution", Path(path).resolve())]
    res = run_torchrun("grade_exercise.py", world, args, show="none", timeout_s=300,
                       env={TIMEOUT_ENV: HANG_TIMEOUT_S}).result
    results = res["results"] if "results" in res else [res]
    return [None if r["ok"] else problem_hint(exercise_id, telling(r["problems"]), world)
            for (exercise_id, _), r in zip(cases, results)]


def _grade_once(exercise_id: str, g: CodingExercise, path: Path, world: int) -> tuple[str | None, list[str]]:
    """Run once at world size ``world``: (None when it passes, else the hint; what was measured, to print on
    success)."""
    seed = random.randrange(1, 10**6)                   # 04.6: new numbers every run (collectives.start_values)
    env = {TIMEOUT_ENV: HANG_TIMEOUT_S, "MGPU_GRADE_SEED": seed}
    try:
        if g.entry is not None:
            run = run_torchrun("grade_exercise.py", world, ["--exercise", exercise_id, "--solution", path],
                               show="none", env={**env, "MGPU_GRADE_STACKS_AFTER_S": GRADE_TIMEOUT_S - 5},
                               timeout_s=GRADE_TIMEOUT_S)
        else:
            run = run_torchrun(path, world, show="none", env=env, timeout_s=GRADE_TIMEOUT_S)
    except LaunchTimeout as e:
        return _stuck_hint(e, path) or _hang_hint(e, path), []
    except LaunchError as e:
        message = e.message or str(e).splitlines()[0]
        if re.search(r"timed out|Timeout", message, re.IGNORECASE):
            return _hang_hint(e, path), []
        if "point-to-point only" in message:
            return f"{message}: send and receive with your neighbours instead (dist.isend/dist.irecv)", []
        stderr = "\n".join(v.get("stderr", "") for v in (e.logs or {}).values())
        frames = _frames(stderr, path)
        at = f" at line {frames[-1][0]} of {path.name}: {frames[-1][1]}" if frames else ""
        if MISMATCH in stderr:                          # gloo's own words, whichever rank died first
            return (f"the ranks' collectives did not match (gloo: \"{MISMATCH}\"){at}. Every rank must call the "
                    f"same collectives in the same order, on tensors of the same size: one called on some ranks "
                    f"only (under `if rank == 0`) meets another collective on the others"), []
        return f"rank {e.rank} raised {e.exc_type or 'an error'}: {message}{at}", []
    res = run.result or {}
    if g.entry is not None:
        ok = res.get("ok")
        measured = g.on_success(res.get("info", {}), world) if ok and g.on_success else []
        return (None if ok else problem_hint(exercise_id, telling(res["problems"]), world)), measured
    return g.judge(res, world, seed), []


def _sizes_note(sizes) -> str:
    """" (world sizes 2, 3)" after a pass; nothing for an exercise graded in one process (06.4, a design)."""
    return "" if tuple(sizes) == (1,) else f" (world sizes {', '.join(map(str, sizes))})"


def grade(exercise_id: str, path: str | Path, *, world_sizes: tuple[int, ...] | None = None) -> tuple[bool, str]:
    """Grade one file, print nothing: (True, what was checked) when it passes at every world size, else (False,
    the hint of the first world size where it fails). Used by :func:`check_script` and the class grader
    (:mod:`mgpu_utils.grading.bulk`).

    Raises:
        KeyError: unknown exercise id. FileNotFoundError: ``path`` does not exist.
    """
    g = exercise(exercise_id)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: exercise_file({exercise_id!r}) makes your copy")
    sizes = tuple(world_sizes or g.world_sizes)
    for world in sizes:
        hint, _ = _grade_once(exercise_id, g, path.resolve(), world)
        if hint:
            return False, hint
    return True, g.what + _sizes_note(sizes)


def check_script(exercise_id: str, path: str | Path | None = None, *, quiet: bool = False,
                 world_sizes: tuple[int, ...] | None = None) -> bool:
    """Grade your solution of a coding exercise under torchrun; print a hint or a confirmation.

    Args:
        exercise_id: e.g. "04.4" (see :data:`mgpu_utils.grading.catalog.EXERCISES`).
        path: your file (default: your copy from :func:`exercise_file`, made from the template if missing).
        quiet: print nothing.
        world_sizes: grade at these world sizes instead of the exercise's (the tests use fewer).

    Returns:
        True when the solution passes at every world size the exercise uses.

    Raises:
        KeyError: unknown exercise id.
        FileNotFoundError: ``path`` does not exist.
    """
    g = exercise(exercise_id)
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
    measured = []
    for world in sizes:
        hint, lines = _grade_once(exercise_id, g, path.resolve(), world)
        measured += lines
        if hint:
            if not quiet:
                print(wrap_text(f"[{exercise_id}] not yet: {hint}"))
            return False
    if not quiet:
        print(wrap_text(f"[{exercise_id}] correct: {g.what}{_sizes_note(sizes)}"))
        for line in measured:
            print(wrap_text(f"    {line}"))
    return True


def yours_or_library(exercise_id: str, passed: bool, library):
    """The function a lesson goes on with after a graded exercise: the student's (the exercise's entry, loaded
    from their copy in ``workspace/``) once it has passed, ``library`` (the course's equivalent) until then.
    Prints which one, in one line. Lesson 08 uses it for 08.3's merge.

    Args:
        exercise_id: e.g. "08.3"; its entry is a function (not a script).
        passed: what :func:`check_script` returned for it.
        library: the course's function with the same signature.

    Raises:
        KeyError: unknown exercise id. ValueError: the exercise is graded as a whole script (no entry).
    """
    g = exercise(exercise_id)
    if g.entry is None:
        raise ValueError(f"exercise {exercise_id} is a script, not a function: a lesson cannot call it")
    name = f"{getattr(library, '__module__', '')}.{getattr(library, '__name__', library)}".strip(".")
    if not passed:
        print(wrap_text(f"[{exercise_id}] the lesson goes on with the course's {name} until yours passes"))
        return library
    mine = WORKSPACE / g.template
    module = load_exercise(exercise_id)
    shown = mine.relative_to(REPO_ROOT) if mine.is_relative_to(REPO_ROOT) else mine
    print(wrap_text(f"[{exercise_id}] the lesson goes on with your {g.entry} ({shown})"))
    return getattr(module, g.entry)
