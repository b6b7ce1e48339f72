"""What the checks of every graded coding exercise share, on the ranks (lessons 03 to 12): the record of an
exercise, and the helpers that compare, report and count.

* :class:`CodingExercise`: one coding exercise (its template, what the grader calls, the world sizes, its check
  and the hints of the problems the check reports), as each module of :mod:`mgpu_utils.grading.coding`
  describes it; :mod:`mgpu_utils.grading.catalog` gathers them.
* :func:`note` (a rank keeps its first problem only), :func:`diff` (max |a - b|), :func:`always` (the
  condition of a kind's last hint).
* :func:`held_bytes` (every tensor an object can reach, each storage once: the state a student's optimizer or
  wrapper holds, 07.4 to 07.6) and :func:`inner_parameters` (the parameters handed to an optimizer inside it).
* :func:`switched_off`: library functions that would answer a design exercise raise while the student's
  function runs (06.4's planner, 03.9's bucket simulator).
* :func:`live_storages` and :func:`reachable_storages` (every tensor alive in the process, and those an object
  reaches: state kept outside the graded object, in a module-level dict or a registry, 07.4 and 07.5).
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CodingExercise:
    """One graded coding exercise.

    ``entry``: the function or class of the student's file that ``launch_scripts/grade_exercise.py`` hands to
    ``check(entry, ctx, problems)`` on every rank (which returns what was measured, or None); None: the
    student's script runs itself under torchrun, and ``judge(result, world, seed)`` reads rank 0's result (a
    hint, or None when it passes). ``hints``: for each ``kind`` of problem the check reports, a list of
    ``(when, hint)``: the first ``when(problem, W)`` that holds picks the hint, formatted with the problem's
    fields and ``W``, the world size (a kind missing prints the problem as it is). ``what``: said on success,
    with the lines of ``on_success(info, world)`` (what was measured).
    """

    id: str                                   # "07.5"
    template: str                             # "07_zero1_any.py", in exercises/
    entry: str | None                         # "ShardedOptimizer"; None: the script runs itself
    world_sizes: tuple[int, ...]
    check: Callable | None                    # rank side: check(fn, ctx, problems) -> info
    hints: dict[str, list[tuple]]             # kind -> [(when, hint)], beside the check that reports the kind
    what: str                                 # said on success
    on_success: Callable | None = None        # (info, world) -> lines to print (step ms against DDP, bytes held)
    judge: Callable | None = None             # script mode: (rank 0's result, world, seed) -> hint or None


def always(p: dict, world: int) -> bool:
    """A hint's condition that always holds: the last hint of a kind, when no more specific one applies."""
    return True


def diff(a, b) -> float:
    """max |a - b| (0 for empty tensors)."""
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def note(problems: list, problem: dict) -> None:
    """Keep this rank's first problem only; every rank still runs every step (no rank leaves the others waiting)."""
    if not problems:
        problems.append(problem)


class SwitchedOff(Exception):
    """A function that :func:`switched_off` turned off was called; the message is its name."""


@contextlib.contextmanager
def switched_off(fn, functions):
    """Inside the block, every function of ``functions`` raises :class:`SwitchedOff` (its name the message),
    however the student's code reaches it: through its module, or imported by name into the module of ``fn``
    (the student's function). Everything is put back on leaving the block. Yields :class:`SwitchedOff`."""
    def off(name):
        def call(*args, **kwargs):
            raise SwitchedOff(name)
        return call
    import sys
    spaces = [vars(sys.modules[f.__module__]) for f in functions]
    spaces += [g for g in [getattr(fn, "__globals__", None)] if g is not None]
    saved = [(sp, k, v) for sp in spaces for k, v in list(sp.items())
             if any(v is f for f in functions)]
    for sp, k, v in saved:
        sp[k] = off(v.__name__)
    try:
        yield SwitchedOff
    finally:
        for sp, k, v in saved:
            sp[k] = v


def held_bytes(obj, exclude=(), depth=8, grads=False) -> int:
    """Bytes of every tensor reachable from ``obj`` (its attributes, and lists, tuples, dicts, sets and objects
    inside them, ``depth`` levels down, a Module's attributes, a bound method's object, a closure's cells), each
    storage counted once; the tensors in ``exclude`` (the model's parameters) and their gradients are not
    counted. An optimizer wrapped in another object, a Module or a closure, or moments kept in a list or dict,
    are found. ``grads``: count the ``.grad`` of every tensor reached too (a full gradient left on a module's
    freed parameter, 07.6)."""
    seen_objects, storages = set(), {}
    skip = {t.untyped_storage().data_ptr() for q in exclude for t in (q, q.grad) if t is not None}

    def walk(o, d):
        if isinstance(o, torch.Tensor):
            ptr = o.untyped_storage().data_ptr()
            if ptr not in skip:
                storages[ptr] = max(storages.get(ptr, 0), o.untyped_storage().nbytes())
            if grads and o.grad is not None:
                walk(o.grad, d)
            return
        if d < 0 or id(o) in seen_objects or isinstance(o, (str, bytes, int, float, bool, type(None), type)):
            return
        seen_objects.add(id(o))
        if isinstance(o, dict):
            items = list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            items = list(o)
        elif isinstance(o, types.MethodType):              # a bound method (self.s = opt.step): its object
            items = [o.__self__]
        elif isinstance(o, types.FunctionType):            # a function: what its closure holds
            items = [c.cell_contents for c in (o.__closure__ or ())]
        elif isinstance(o, types.ModuleType) or callable(o) and not hasattr(o, "__dict__"):
            return
        else:                                              # objects, Modules too (their _parameters, _buffers)
            items = list(getattr(o, "__dict__", {}).values())
        for item in items:
            walk(item, d - 1)
    walk(obj, depth)
    return sum(storages.values())


def inner_parameters(obj, depth=8) -> list:
    """The parameters (and so their gradients) of every torch.optim.Optimizer reachable from ``obj``: the
    tensors a sharded wrapper hands its inner optimizer, which are not its state."""
    found, seen = [], set()

    def walk(o, d):
        if d < 0 or id(o) in seen or isinstance(o, (str, bytes, int, float, bool, type(None), type, torch.Tensor)):
            return
        seen.add(id(o))
        if isinstance(o, torch.optim.Optimizer):
            found.extend(p for g in o.param_groups for p in g["params"])
            return
        items = list(o.keys()) + list(o.values()) if isinstance(o, dict) else list(o) if isinstance(
            o, (list, tuple, set, frozenset)) else list(getattr(o, "__dict__", {}).values())
        for item in items:
            walk(item, d - 1)
    walk(obj, depth)
    return found


def live_storages(collect: bool = True) -> dict[int, int]:
    """{storage address: bytes} of every tensor alive in this process that the garbage collector tracks (a
    tensor kept in a module-level dict, a registry, a closure: state a student's object keeps outside itself,
    07.5). Tensors that live in C++ only (autograd's saved tensors) are not seen. ``collect``: run the garbage
    collector first (0.1 s; without it, tensors in unreachable cycles count as alive)."""
    if collect:
        gc.collect()
    out = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor) and o.device.type != "meta":
            try:
                storage = o.untyped_storage()
            except (RuntimeError, NotImplementedError):    # a tensor without storage (a functional wrapper)
                continue
            out[storage.data_ptr()] = max(out.get(storage.data_ptr(), 0), storage.nbytes())
    return out


def reachable_storages(*objs, depth=8) -> set[int]:
    """The storage addresses of every tensor reachable from ``objs`` (walked as :func:`held_bytes` walks),
    their gradients included."""
    found, seen = set(), set()

    def walk(x, d):
        if isinstance(x, torch.Tensor):
            found.add(x.untyped_storage().data_ptr())
            if x.grad is not None:
                found.add(x.grad.untyped_storage().data_ptr())
            return
        if d < 0 or id(x) in seen or isinstance(x, (str, bytes, int, float, bool, type(None), type)):
            return
        seen.add(id(x))
        if isinstance(x, dict):
            items = list(x.keys()) + list(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            items = list(x)
        elif isinstance(x, types.MethodType):
            items = [x.__self__]
        elif isinstance(x, types.FunctionType):
            items = [c.cell_contents for c in (x.__closure__ or ())]
        elif isinstance(x, types.ModuleType):
            return
        else:
            items = list(getattr(x, "__dict__", {}).values())
        for item in items:
            walk(item, d - 1)
    for o in objs:
        walk(o, depth)
    return found
