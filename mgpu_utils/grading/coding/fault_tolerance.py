"""The graded coding exercise of lesson 12, fault tolerance (notebooks/12_fault_tolerance.ipynb): 12.5, a
snapshot that resumes a killed DDP job exactly, written by rank 0 alone and atomically.

The check runs a job that is killed after step 7 and resumed from the student's snapshot against the same job
uninterrupted, names what a wrong snapshot left out from reference runs without it (:data:`SNAPSHOT_VARIANTS`),
and watches every torch.save and file written (:func:`probed_saves`). The hints of the problems it reports and
the exercise's record are here too.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.grading.common import _PROCESS_EVENTS, CodingExercise, diff, note, watching_opens
from mgpu_utils.measure.comm_calls import namespaces_of


#: Exercise 12.5's job: steps, the steps after which it snapshots, the step after which it is "killed"; the
#: resume (at 5) is not a multiple of the StepLR period (2), so a lost scheduler shows even with a lost optimizer.
SNAPSHOT_PLAN = {"steps": 9, "save_after": (3, 5), "crash_after": 7, "batch": 8, "seed": 11}
#: Seconds rank 0 waits before the first file it writes in its second save_snapshot (after any collective the
#: save starts with): the other ranks' saves must not return before its file is complete (a rank that goes on,
#: and the job crashes, would resume from the snapshot before).
SLOW_START_S = 0.5
#: What a wrong snapshot does, as reference runs (the first whose weights match wins): parts left out of it,
#: every rank given rank 0's random state, a resume one step off, or no resume at all.
SNAPSHOT_VARIANTS = (("right", ()), ("drop", ("optimizer",)), ("drop", ("scheduler",)), ("drop", ("rng",)),
                     ("drop", ("optimizer", "scheduler")), ("drop", ("optimizer", "rng")),
                     ("drop", ("scheduler", "rng")), ("drop", ("optimizer", "scheduler", "rng")),
                     ("rank0_rng", ()), ("step", (1,)), ("step", (-1,)), ("from_scratch", ()))


def _snapshot_job(ctx, save, load, crash: bool = True):
    """12.5's job on this rank: train, ``save(model, opt, sched, step)`` after the planned steps (then a
    barrier), and with ``crash`` start again from scratch after the crash step (the same seeds), ``start =
    load(model, opt, sched)``, and go on. Returns the final weights, flat."""
    plan, world, rank = SNAPSHOT_PLAN, ctx.world_size, ctx.rank
    x, y = load_data()[0][:plan["steps"] * world * plan["batch"]]

    def fresh():
        torch.manual_seed(plan["seed"])                              # the same initial weights on every rank
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.3), torch.nn.Linear(32, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        torch.manual_seed(plan["seed"] + 1000 * (rank + 1))         # then each rank its own dropout stream
        return model, DDP(model), opt, sched

    def steps(model, ddp, opt, sched, first, last, saving):
        for s in range(first, last):
            rows = slice((s * world + rank) * plan["batch"], (s * world + rank + 1) * plan["batch"])
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x[rows]), y[rows]).backward()
            opt.step()
            sched.step()
            if saving and s + 1 in plan["save_after"]:
                save(model, opt, sched, s + 1)
                dist.barrier()
    model, ddp, opt, sched = fresh()
    steps(model, ddp, opt, sched, 0, plan["crash_after"] if crash else plan["steps"], crash)
    if crash:
        model, ddp, opt, sched = fresh()
        start = load(model, opt, sched)
        steps(model, ddp, opt, sched, int(start), plan["steps"], False)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _reference_snapshot(variant: str, arg: tuple, ctx):
    """(save, load) of one of :data:`SNAPSHOT_VARIANTS`, in memory."""
    held = {}

    def save(model, opt, sched, step):
        rngs = [None] * ctx.world_size
        dist.all_gather_object(rngs, torch.get_rng_state())
        held.update(model=copy.deepcopy(model.state_dict()), optimizer=copy.deepcopy(opt.state_dict()),
                    scheduler=sched.state_dict(), step=step, rng=rngs)

    def load(model, opt, sched):
        if variant == "from_scratch":
            return 0
        model.load_state_dict(held["model"])
        if not (variant == "drop" and "optimizer" in arg):
            opt.load_state_dict(held["optimizer"])
        if not (variant == "drop" and "scheduler" in arg):
            sched.load_state_dict(held["scheduler"])
        if not (variant == "drop" and "rng" in arg):
            torch.set_rng_state(held["rng"][0 if variant == "rank0_rng" else ctx.rank])
        return held["step"] + (arg[0] if variant == "step" else 0)
    return save, load


#: What :func:`_opened` reports to while :func:`probed_saves` is open (None: nothing is watched).
_WATCH: dict | None = None


def _opened(path: str, writes: bool) -> None:
    """:func:`~mgpu_utils.grading.common.watching_opens`'s callback: a path opened for writing (builtins.open,
    io.open, pathlib, os.open, tempfile, shutil) while :data:`_WATCH` is set and its ``active`` flag on (the
    student's save_snapshot is running)."""
    seen = _WATCH
    if not writes or seen is None or not seen.get("active"):
        return
    if seen.pop("delay", False):
        time.sleep(SLOW_START_S)
    seen["saves"] += 1
    if os.path.realpath(path) == seen["target"] and isinstance(seen.get("intact"), bytes):
        seen["torn"] = True                                # opened for writing: the previous snapshot is gone


_AUDITED = False


def _audit(event: str, args: tuple) -> None:
    """An audit hook (added once per process, acting while :data:`_WATCH` is set and active): a process started
    within save_snapshot goes to ``seen["process"]`` (a thirteenth red team's ``cp tmp path``: the child's writes
    are not seen, and a copy onto the path is no rename); removing or renaming away the path while the previous
    snapshot is there sets ``seen["torn"]`` (its 12.5 x01 deleted the old snapshot, then renamed the new one:
    a crash in between leaves none)."""
    seen = _WATCH
    if seen is None or not seen.get("active"):
        return
    if event in _PROCESS_EVENTS:
        seen["process"] = seen.get("process") or event
    elif event in ("os.remove", "os.rename") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        try:
            target = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if target == seen["target"] and isinstance(seen.get("intact"), bytes):
            seen["torn"] = True


@contextlib.contextmanager
def probed_saves(path: str, seen: dict, fn=None):
    """Within the block torch.save writes the first half of its bytes, then, while ``seen["intact"]`` is a
    bytes object, checks that ``path`` still holds exactly those bytes (a crash at this moment would leave the
    previous snapshot), then writes the rest. While ``seen["active"]`` is true, ``seen["saves"]`` counts the
    files written: each torch.save to a file (``torch.save`` or the name imported into ``fn``'s module; saves
    into memory pass), and every "open" for writing that Python's audit hooks see (builtins.open, io.open,
    pathlib's write_bytes, os.open, tempfile, shutil.copy); opening ``path`` itself for writing while a
    previous snapshot is there sets ``seen["torn"]``."""
    import io

    global _WATCH
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)) and not hasattr(f, "fileno") or isinstance(f, io.BytesIO):
            return real(obj, f, *args, **kwargs)           # into memory (all_gather_object pickles so)
        buf = io.BytesIO()
        real(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        if seen.get("active") and hasattr(f, "write"):
            seen["saves"] += 1                             # an open file handed in (its open was counted too)
        fh = open(f, "wb") if not hasattr(f, "write") else f
        try:
            fh.write(data[:len(data) // 2])
            fh.flush()
            if isinstance(seen.get("intact"), bytes):
                now = open(path, "rb").read() if os.path.exists(path) else b""
                seen["torn"] = seen.get("torn") or now != seen["intact"]
            fh.write(data[len(data) // 2:])
        finally:
            if fh is not f:
                fh.close()
    global _AUDITED
    seen.setdefault("saves", 0)
    seen["target"] = os.path.realpath(path)
    spaces = [vars(torch), vars(torch.serialization)] + [g for g in namespaces_of(fn) if g.get("save") is real]
    for g in spaces:
        g["save"] = save
    writer = getattr(torch._C, "PyTorchFileWriter", None)  # any other way to torch's zip writer with a path
    if isinstance(writer, type):                           # (torch.serialization._save...): C++ opens the file
        class Writer(writer):
            def __init__(self, f, *args, **kwargs):
                if isinstance(f, (str, bytes, os.PathLike)):
                    _opened(os.fsdecode(f), True)
                super().__init__(f, *args, **kwargs)
        torch._C.PyTorchFileWriter = Writer
    if not _AUDITED:
        sys.addaudithook(_audit)
        _AUDITED = True
    _WATCH = seen
    try:
        with watching_opens(_opened):
            yield
    finally:
        _WATCH = None
        for g in spaces:
            g["save"] = real
        if isinstance(writer, type):
            torch._C.PyTorchFileWriter = writer


def check_snapshot(fn, ctx, problems):
    """12.5: ``save_snapshot(path, model, opt, sched, step)`` and ``load_snapshot(path, model, opt, sched)`` in a
    job that is killed after step 7 and resumed from step 5, against the uninterrupted job; the snapshot's parts named
    from reference runs without them (:data:`SNAPSHOT_VARIANTS`); rank 0 alone writes; and ``path``, halfway
    through each torch.save of the second snapshot, still holds the first one."""
    import shutil
    import tempfile

    import importlib.util

    rank = ctx.rank
    load = None
    if getattr(fn, "__code__", None) is not None:          # a restart is a new process: the module imported anew,
        spec = importlib.util.spec_from_file_location("restarted_snapshot", fn.__code__.co_filename)
        fresh = importlib.util.module_from_spec(spec)      # nothing kept in its globals since the first start
        spec.loader.exec_module(fresh)
        load = getattr(fresh, "load_snapshot", None)
    folder = [tempfile.mkdtemp(prefix="mgpu_grade_") if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    path = os.path.join(folder[0], "snapshot.pt")
    want = _snapshot_job(ctx, None, None, crash=False)
    seen = {"saves": 0}

    def save(model, opt, sched, step):
        second = step == SNAPSHOT_PLAN["save_after"][1]
        if second and rank == 0:
            seen["intact"] = _contents(path)
            seen["delay"] = True                           # rank 0's first write starts late: a rank whose save
        seen["active"] = True                              # returns at once finds the old snapshot at the path
        try:
            fn(path, model, opt, sched, step)
        finally:
            seen["active"] = False
        if second:
            seen["at_return"] = hashlib.sha1(_contents(path)).hexdigest()
    try:
        if not callable(load):
            note(problems, {"rank": rank, "kind": "snapshot", "what": "no_load"})
            return
        with probed_saves(path, seen, fn):
            got = _snapshot_job(ctx, save, lambda m, o, s: load(path, m, o, s))
    finally:
        try:
            dist.barrier()
        finally:
            if rank == 0:
                shutil.rmtree(folder[0], ignore_errors=True)
    saves, at_return = [None] * ctx.world_size, [None] * ctx.world_size
    dist.all_gather_object(saves, (seen["saves"], seen.get("process")))   # who wrote files, who started a process
    saves, started = [n for n, _ in saves], [(r, e) for r, (_, e) in enumerate(saves) if e]
    dist.all_gather_object(at_return, seen.get("at_return"))
    found = {"variant": None, "parts": "", "off": ""}
    for variant, arg in SNAPSHOT_VARIANTS:                  # every rank runs them all, in the same order
        ref = _snapshot_job(ctx, *_reference_snapshot(variant, arg, ctx))
        if found["variant"] is None and got.shape == ref.shape and diff(got, ref) < 1e-6:
            words = [{"optimizer": "the optimizer's state", "scheduler": "the scheduler's",
                      "rng": "every rank's random state"}.get(a, str(a)) for a in arg]
            found = {"variant": variant, "parts": ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1
                     else "".join(words),
                     "off": {(1,): "late", (-1,): "early"}.get(arg, "")}
    if got.shape != want.shape or diff(got, want) > 1e-6:
        note(problems, {"rank": rank, "kind": "snapshot", "what": "resume", **found,
                        "max_diff": diff(got, want) if got.shape == want.shape else float("nan")})
    elif started:
        if rank == started[0][0]:
            note(problems, {"rank": rank, "kind": "snapshot", "what": "process", "event": started[0][1]})
    elif not saves[0]:
        note(problems, {"rank": rank, "kind": "snapshot", "what": "no_file"})
    elif any(saves[1:]):
        if rank == 0:
            note(problems, {"rank": rank, "kind": "snapshot", "what": "ranks",
                            "writers": [r for r, n in enumerate(saves) if r and n]})
    elif rank == 0 and seen.get("torn"):
        note(problems, {"rank": rank, "kind": "snapshot", "what": "torn"})
    elif at_return[rank] != at_return[0]:
        note(problems, {"rank": rank, "kind": "snapshot", "what": "early", "step": SNAPSHOT_PLAN["save_after"][1]})


def _contents(path: str) -> bytes:
    """The bytes at ``path`` (b"" when there is no file)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "snapshot": [
        (lambda p, W: p["what"] == "no_load",
         "rank {rank}: the file defines no load_snapshot(path, model, opt, sched): write it beside save_snapshot"),
        (lambda p, W: p["what"] == "resume" and p["variant"] == "drop",
         "rank {rank}: the resumed job's weights differ from the uninterrupted job's by {max_diff:.3g} (world "
         "size {W}): they are those of a snapshot without {parts}. The optimizer's state holds the momentum "
         "buffers and the learning rate, the scheduler's its position, the random state each rank's dropout "
         "stream"),
        (lambda p, W: p["what"] == "resume" and p["variant"] == "rank0_rng",
         "rank {rank}: the resumed job's weights are those of every rank restoring rank 0's random state (world "
         "size {W}): each rank has its own dropout stream; gather every rank's state "
         "(dist.all_gather_object) into the snapshot and let each rank restore its own"),
        (lambda p, W: p["what"] == "resume" and p["variant"] == "step",
         "rank {rank}: the resumed job's weights are those of a resume one step {off} (world size {W}): "
         "load_snapshot returns the number of steps already done, the index of the next step"),
        (lambda p, W: p["what"] == "resume" and p["variant"] == "from_scratch",
         "rank {rank}: the resumed job trained from step 0 again, from the initial weights (world size {W}): "
         "load the model's state and return the step that the snapshot was taken at"),
        (lambda p, W: p["what"] == "resume",
         "rank {rank}: the resumed job's final weights differ from the uninterrupted job's by {max_diff:.3g} "
         "(world size {W}): save and restore the model, the optimizer, the scheduler, every rank's random "
         "state and the step"),
        (lambda p, W: p["what"] == "no_file",
         "rank {rank}: the job resumed, but rank 0 wrote no file: a restarted job is new processes, and only what "
         "is on disk at the path survives; write the snapshot there"),
        (lambda p, W: p["what"] == "process",
         "rank {rank}: save_snapshot started a process ({event}: cp, rsync, a shell): what another program writes "
         "is out of the job's sight, and a copy onto the path rewrites it in place, which is not atomic. Write the "
         "snapshot from Python on rank 0 (torch.save to a temporary file next to the path, then os.replace() it "
         "onto the path)"),
        (lambda p, W: p["what"] == "ranks",
         "ranks {writers} wrote files too: only rank 0 writes (every rank holds the same DDP "
         "state; on a shared file system the ranks would write over each other)"),
        (lambda p, W: p["what"] == "early",
         "rank {rank}: save_snapshot returned before rank 0's snapshot of step {step} was complete at the path "
         "(rank 0 was slow to start): when the save returns on any rank the snapshot must be on disk, or a crash "
         "right after resumes from the one before; end save_snapshot with dist.barrier() on every rank"),
        (lambda p, W: p["what"] == "torn",
         "rank {rank}: halfway through writing the second snapshot, the path no longer held the first one: a "
         "crash at that moment leaves no complete snapshot. Write to a temporary file next to it, then "
         "os.replace() it onto the path (a rename is atomic)")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="12.5", template="12_snapshot.py", entry="save_snapshot", world_sizes=(2, 3),
        check=check_snapshot, hints=HINTS,
        what="a job killed after step 7 and resumed from your snapshot (step 5) ends with the uninterrupted job's "
             "weights, rank 0 alone writes, and a crash halfway through a write leaves the previous snapshot"),
]
