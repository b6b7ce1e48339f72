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
* :func:`live_storages` and :func:`reachable_storages` (every tensor or storage alive in the process, and those
  an object reaches: state kept outside the graded object, in a module-level dict or a registry, 07.4), and
  :class:`OutsideState` (what appeared in the process while a block ran, tensors, storages and Python objects
  such as bytes, BytesIO or numpy arrays, and the files written: 07.5, 07.6); :func:`malloc_bytes` (what the C
  allocator holds: tensors only C++ holds too, 07.6).
* :func:`watching_opens`: every file path Python opens while a block runs, from one audit hook per process
  (07.5 and 07.6: state kept in a file; 12.5: which rank writes its snapshot, and how); :func:`refusing_routes`,
  from the same hook and a few wrappers: mmap, /dev/shm, ctypes, torch.from_file, the store, sockets and
  shared mappings of the student's recorded as a problem (03.7, 07.4 to 07.6).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import gc
import hashlib
import itertools
import operator
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
    collectives_only: bool = False            # data moves by torch.distributed only (:func:`refusing_routes`)


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


@functools.cache
def _slot_descriptors(cls: type) -> tuple:
    """The member descriptors of the ``__slots__`` that ``cls`` and its bases declare (``@dataclass(slots=True)``)."""
    out = []
    for base in cls.__mro__:
        slots = base.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):   # private: stored under its mangled name
                name = f"_{base.__name__.lstrip('_')}{name}"
            descriptor = base.__dict__.get(name)
            if hasattr(descriptor, "__get__") and name not in ("__dict__", "__weakref__"):
                out.append(descriptor)
    return tuple(out)


def attributes(o) -> list:
    """What an object holds in its attributes: its ``__dict__``'s values and its slots' (a slotted object has no
    ``__dict__``: a list of ``@dataclass(slots=True)`` records would hide every tensor in them)."""
    items = list(getattr(o, "__dict__", {}).values())
    for descriptor in _slot_descriptors(type(o)):
        try:
            items.append(descriptor.__get__(o, type(o)))
        except (AttributeError, TypeError):                # a slot never set
            pass
    return items


def graph_saved(o, limit: int = 10_000) -> list:
    """The tensors the autograd graph of tensor ``o`` (its ``grad_fn``), or of the node ``o``, keeps for a backward:
    each node's ``_saved_*`` values, the graph walked through ``next_functions`` (up to ``limit`` nodes); [] for a
    leaf. Saved tensors a backward already freed are skipped. :func:`held_bytes` counts them with the tensor (a
    thirteenth red team's 07.5 x01, 07.6 x01 and 03.7 x01 kept whole states, gathered models and every step's
    gradients as the saved results of ops whose 1-element outputs they held, 2026-12-07)."""
    node = o.grad_fn if isinstance(o, torch.Tensor) else o
    todo, seen, saved = [node], set(), []
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                value = getattr(node, name)
            except (RuntimeError, AttributeError):           # freed by a backward, or not a tensor
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            saved += [v for v in values if isinstance(v, torch.Tensor)]
        todo += [fn for fn, _ in getattr(node, "next_functions", ())]
    return saved


def tensor_storage(t: torch.Tensor):
    """``t``'s storage as torch gives it (``torch.UntypedStorage``): a subclass's own ``untyped_storage()`` is not
    asked (one that answered for a slice of what it holds passed as sharded: an eighth red team's 07.4 w15); a
    sparse tensor's: that of its values (its indices not counted; 07.5 w19's state kept as sparse tensors stopped
    the grader with a traceback)."""
    layout = torch._C.TensorBase.layout.__get__(t)
    if layout == torch.sparse_coo:
        t = torch._C.TensorBase._values(t)
    elif layout != torch.strided:
        t = torch._C.TensorBase.values(t)
    return torch._C.TensorBase.untyped_storage(t)


def held_bytes(obj, exclude=(), depth=8, grads=False, python=False) -> int:
    """Bytes of every tensor reachable from ``obj`` (its attributes, and lists, tuples, deques, dicts, sets and
    objects inside them, ``depth`` levels down, slots too, a Module's attributes, a bound method's object, a
    function's closure cells and default arguments), each storage counted once, a bare ``torch.UntypedStorage``
    or ``TypedStorage`` too, a numpy array's buffer, a sparse tensor's indices (07.5 w17's state as sparse tensors);
    the tensors in ``exclude`` (the model's parameters) and their gradients are not counted, only the room of their storages
    they do not cover (:func:`_spare_room`: state packed in one allocation after the parameters). An optimizer wrapped
    in another object, a Module or a closure, or moments kept in a list or dict, are found. ``grads``: count the ``.grad`` of every
    tensor reached too (a full gradient left on a module's freed parameter, 07.6). A ``functools.cache`` or
    ``lru_cache(maxsize=None)`` is walked into: its results are in a dict the garbage collector sees; a bounded
    ``lru_cache`` keeps them where Python shows nothing, and is not. ``python``: also every Python int, float,
    bytes and bytearray reached (its ``sys.getsizeof``, each object once: a tensor kept as ``tolist()`` or
    ``bytearray(t.numpy())``), for a check of what grows across steps. Always: a memoryview's ``nbytes``. A weak reference
    is followed to what it refers to. Always: the
    attributes set on a tensor reached (``p.history = [...]`` on a parameter; an arena hung on a tensor), and the
    tensors its autograd graph keeps (:func:`graph_saved`; a ``grad_fn`` reached on its own too)."""
    seen_objects, storages, numbers = set(), {}, {}
    skip = _spare_room([t for q in exclude for t in (q, q.grad) if t is not None])

    def walk(o, d):
        if isinstance(o, torch.Tensor):
            ptr = tensor_storage(o).data_ptr()
            storages[ptr] = max(storages.get(ptr, 0), skip.get(ptr, tensor_storage(o).nbytes()))
            if torch._C.TensorBase.layout.__get__(o) == torch.sparse_coo:   # its indices too: int64, ndim
                index = torch._C.TensorBase.untyped_storage(torch._C.TensorBase._indices(o))   # per value
                storages[index.data_ptr()] = index.nbytes()
            if grads and o.grad is not None:
                walk(o.grad, d)
            if d >= 0 and id(o) not in seen_objects:       # the attributes set on it (an arena hung on a
                seen_objects.add(id(o))                    # tensor: a thirteenth red team's 07.5 x03), and
                for item in attributes(o) + graph_saved(o):   # what its autograd graph keeps (07.5 x01)
                    walk(item, d - 1)
            return
        if isinstance(o, torch.autograd.graph.Node):       # a grad_fn kept on its own
            for item in graph_saved(o):
                walk(item, d - 1)
            return
        storage = _bare_storage(o)
        if storage is not None:
            ptr = storage.data_ptr()
            storages[ptr] = max(storages.get(ptr, 0), skip.get(ptr, storage.nbytes()))
            return
        array = _numpy_base(o)
        if array is not None:                              # a numpy array (state kept as .numpy().copy()): its
            ptr = array.__array_interface__["data"][0]     # buffer, once, merged with a tensor sharing it
            storages[ptr] = max(storages.get(ptr, 0), skip.get(ptr, array.nbytes))
            return
        if python and isinstance(o, (int, float, bytes, bytearray)) and not isinstance(o, bool):
            numbers[id(o)] = sys.getsizeof(o)
            return
        if isinstance(o, memoryview):                      # what it views (of a bytes, an array, a tensor's
            numbers[id(o)] = o.nbytes                      # memory: a thirty-second red team's 07.5 q03 and 07.6
            return                                         # q03 kept the whole state behind torch.frombuffer's
                                                           # count, reached through a memoryview of it)
        if python and _is_buffer(o) and not isinstance(o, (dict, list, tuple)):   # an array.array, ctypes array
            numbers[id(o)] = sys.getsizeof(o)
            return
        if d < 0 or id(o) in seen_objects or isinstance(o, (str, bytes, int, float, bool, type(None), type)):
            return
        seen_objects.add(id(o))
        if isinstance(o, dict):
            items = list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, collections.deque)):
            items = list(o)
        elif isinstance(o, types.MethodType):              # a bound method (self.s = opt.step): its object
            items = [o.__self__]
        elif isinstance(o, types.FunctionType):            # a function: what its closure and defaults hold
            items = ([c.cell_contents for c in (o.__closure__ or ())]
                     + list(o.__defaults__ or ()) + list((o.__kwdefaults__ or {}).values()))
        elif isinstance(o, functools._lru_cache_wrapper):  # functools.cache / lru_cache(None): its cache dict too
            items = [r for r in gc.get_referents(o) if isinstance(r, dict)]
        elif isinstance(o, weakref.ReferenceType):         # what a weak reference refers to (an eighteenth red
            items = [o()]                                  # team's 07.5 x01, 07.6 x01: the state reached by weakref)
        elif isinstance(o, (torch._C.Future, torch._C._distributed_c10d.Work)):
            items = attributes(o) + _settled(o)            # a done future's value, a done Work's result: C++ holds
                                                           # them (a twenty-eighth red team's 07.6 k05)
        elif isinstance(o, types.ModuleType) or (callable(o) and not hasattr(o, "__dict__")
                                                 and not type(o).__flags__ & _HEAP_TYPE):
            return                                         # a builtin function (an object of a class with
                                                           # __slots__ and __call__ is walked: a twenty-second
                                                           # red team's 075 b01, 076 b01)
        else:                                              # objects, Modules too (their _parameters, _buffers)
            items = attributes(o)
        for item in items:
            walk(item, d - 1)
    walk(obj, depth)
    return sum(storages.values()) + sum(numbers.values())


def _settled(o) -> list:
    """What a completed ``torch.futures.Future`` (its value) or c10d ``Work`` (its result tensors) holds, for
    :func:`held_bytes`; [] where it is not done, failed, or the backend keeps no result."""
    try:
        if isinstance(o, torch._C.Future):
            return [o.value()] if o.done() else []
        return list(o.result()) if o.is_completed() else []
    except (RuntimeError, ValueError, TypeError):
        return []


#: Py_TPFLAGS_HEAPTYPE: a class made by a class statement (type(o).__flags__), not one of C's.
_HEAP_TYPE = 1 << 9


def _is_buffer(o) -> bool:
    """Whether ``o`` has the buffer protocol (``memoryview(o)`` works): an ``array.array``, a ctypes array, a
    ``pickle.PickleBuffer``, besides bytes, bytearray and numpy arrays (a nineteenth red team's 07.5 and 07.6 kept
    the whole state in an array.array made at import, 2026-12-07)."""
    if isinstance(o, (str, int, float, type, type(None))):
        return False
    try:
        with memoryview(o):
            return True
    except (TypeError, ValueError, BufferError):
        return False


def _numpy_base(o):
    """The array that owns the memory of numpy array ``o`` (following views' ``.base``), else None (numpy not
    imported, or ``o`` not an array): held_bytes counts its bytes, as a tensor's (a ninth red team's 07.5 w15
    kept Adam's moments as numpy copies between steps, 2026-12-06)."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(o, np.ndarray):
        return None
    while isinstance(o.base, np.ndarray):
        o = o.base
    return o


def _spare_room(tensors: list) -> dict:
    """For each storage under ``tensors`` (the excluded parameters and gradients of :func:`held_bytes`): the bytes
    of it that none of them covers, by data pointer. A parameter whose ``.data`` was made a view of a larger buffer
    (the optimizer's state packed after the parameters in one allocation: a ninth red team's 07.5 w01 and w22,
    2026-12-06) leaves that room counted; a flat buffer the parameters exactly tile leaves none."""
    spans: dict = {}
    sizes: dict = {}
    loose: dict = {}                                       # strided tensors: the bytes of their elements only
    for t in tensors:
        storage = tensor_storage(t)
        ptr = storage.data_ptr()
        sizes[ptr] = storage.nbytes()
        start = t.storage_offset() * t.element_size()
        if t.is_contiguous():
            spans.setdefault(ptr, []).append((start, start + t.numel() * t.element_size()))
        else:                                              # every stride x4: its span is 4 times its elements,
            spans.setdefault(ptr, [])                      # the gaps room for state (a thirty-second red team's
            loose[ptr] = loose.get(ptr, 0) + t.numel() * t.element_size()   # 07.5 q01, 2026-12-08)
    room = {}
    for ptr, pieces in spans.items():
        covered, reach = loose.get(ptr, 0), 0
        for start, end in sorted(pieces):
            start = max(start, reach)
            if end > start:
                covered += end - start
                reach = end
        room[ptr] = max(0, sizes[ptr] - covered)
    return room


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
            o, (list, tuple, set, frozenset)) else [o()] if isinstance(o, weakref.ReferenceType) else attributes(o)
        for item in items:
            walk(item, d - 1)
    walk(obj, depth)
    return found


def _bare_storage(o):
    """The ``torch.UntypedStorage`` of a storage object (an UntypedStorage, or a TypedStorage's), else None."""
    if isinstance(o, torch.UntypedStorage):
        return o
    if isinstance(o, torch.TypedStorage):
        return o._untyped_storage
    return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2():
    try:
        f = ctypes.CDLL(None).mallinfo2                      # glibc 2.33 and later
    except (AttributeError, OSError):
        return None
    f.restype, f.argtypes = _MallInfo2, []
    return f


def malloc_bytes() -> int | None:
    """Bytes the C allocator (glibc's malloc, every thread's arena, and its mmapped chunks) has handed out and
    not taken back: every tensor's storage on the CPU, whoever holds it (Python, or C++ only: a TorchScript
    module's attributes, a Future's value), and ctypes' buffers; not Python's small objects (its own arenas)
    nor an anonymous mmap. None where glibc's mallinfo2 is missing (another C library, macOS)."""
    f = _mallinfo2()
    if f is None:
        return None
    m = f()
    return m.uordblks + m.hblkhd


def live_storages(collect: bool = True) -> dict[int, int]:
    """{storage address: bytes} of every tensor and every storage object (``torch.UntypedStorage``,
    ``TypedStorage``) alive in this process that the garbage collector tracks (a tensor kept in a module-level
    dict, a registry, a closure: state a student's object keeps outside itself, 07.4). Tensors that live
    in C++ only (autograd's saved tensors) are not seen. ``collect``: run the garbage collector first (0.1 s;
    without it, tensors in unreachable cycles count as alive)."""
    if collect:
        gc.collect()
    out, kinds = {}, {}                                    # kinds: type -> 1 tensor, 2 storage, 0 neither
    for o in gc.get_objects():
        kind = kinds.get(type(o))
        if kind is None:
            kind = kinds[type(o)] = (1 if issubclass(type(o), torch.Tensor) else
                                     2 if issubclass(type(o), (torch.UntypedStorage, torch.TypedStorage)) else 0)
        if not kind:
            continue
        try:
            storage = tensor_storage(o) if kind == 1 else _bare_storage(o)
            if storage.device.type == "meta":
                continue
        except (RuntimeError, NotImplementedError):    # a tensor without storage (a functional wrapper)
            continue
        out[storage.data_ptr()] = max(out.get(storage.data_ptr(), 0), storage.nbytes())
    return out


def reachable_storages(*objs, depth=8) -> set[int]:
    """The storage addresses of every tensor and storage object reachable from ``objs`` (walked as
    :func:`held_bytes` walks), their gradients included."""
    found, seen = set(), set()

    def walk(x, d):
        if isinstance(x, torch.Tensor):
            found.add(tensor_storage(x).data_ptr())
            if x.grad is not None:
                found.add(tensor_storage(x.grad).data_ptr())
            return
        if _bare_storage(x) is not None:
            found.add(_bare_storage(x).data_ptr())
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
            items = attributes(x)
        for item in items:
            walk(item, d - 1)
    for o in objs:
        walk(o, depth)
    return found


#: The callbacks of :func:`watching_opens` now watching (the audit hook calls each, in order).
_OPEN_WATCHERS: list[Callable[[str, bool], None]] = []
_AUDIT_HOOKED = False
_IN_WATCHER = threading.local()                            # a watcher's own opens (realpath, stat) are not reported


def opened_path(args: tuple) -> tuple[str, bool] | None:
    """``(path, writes)`` of an "open" audit event's arguments ``(path, mode, flags)``: ``writes`` when the mode
    has w, a, x or + (builtins.open, io.open) or the flags ask to write, create, truncate or append (os.open);
    None when a file descriptor is opened, not a path."""
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return None
    writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
              else bool((flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)))
    return os.fsdecode(path), writes


#: While :func:`refusing_routes` runs: ``{"file": the student's file, "found": [problem, ...]}``; else None.
_REFUSING: dict | None = None
#: The audit events :func:`_refused_route` reads (the others pass at the cost of one set lookup).
_REFUSED_EVENTS = frozenset({"mmap.__new__", "open", "ctypes.dlsym", "socket.bind", "socket.connect",
                             "sqlite3.connect"})
#: Audit events of a process started by the student's code (a forked child keeps a copy of everything, out of
#: every check's sight: a red team's 07.5 kept the optimizer's state in one, 2026-12-06): refused routes too, from
#: the student's file only.
_PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                             "subprocess.Popen"})


def _refused_route(event: str, args: tuple) -> str | None:
    """What an audit event of the routes :func:`refusing_routes` refuses uses, in words; None for the others
    (ctypes: every event, kept by :func:`_audit` only when the student's file called it)."""
    if event == "mmap.__new__":
        return ("an anonymous mmap" if args and args[0] == -1
                else "mmap of a file (POSIX shared memory, multiprocessing.shared_memory, maps one too)")
    if event == "open":
        found = opened_path(args)
        if found and (found[1] and not _python_cache(found[0]) or _in_shared_memory(found[0])):
            return _file_route(found[0])
    if event == "ctypes.dlsym" and len(args) > 1 and isinstance(args[1], str):
        return f"the C function {args[1]} through ctypes"
    if event.startswith("ctypes."):
        return "ctypes (C functions and C memory, which no check can count)"
    if event in ("socket.bind", "socket.connect"):
        return "a socket of your own"
    if event == "sqlite3.connect":
        return "an sqlite3 database (memory or a file that no check counts)"
    if event in _PROCESS_EVENTS:
        return f"a process of your own ({event}: a child holds a copy no check sees)"
    return None


def _in_shared_memory(path: str) -> bool:
    return os.path.abspath(path).startswith("/dev/shm")


def _file_route(path: str, how: str = "") -> str:
    """The route of a file opened in /dev/shm (read or written), or written elsewhere, in words."""
    return f"a file in shared memory ({path}){how}" if _in_shared_memory(path) else f"a file written ({path}){how}"


def _python_cache(path: str) -> bool:
    """A file Python writes when it imports a module (its .pyc): not a route."""
    return path.endswith((".pyc", ".py")) or "__pycache__" in path


def _audit(event: str, args: tuple) -> None:
    """sys.addaudithook's hook (one per process: a hook cannot be removed): every "open" of a path goes to the
    watchers of :func:`watching_opens`; within :func:`refusing_routes`, the routes it refuses are recorded."""
    if (_REFUSING is not None and (event in _REFUSED_EVENTS or event in _PROCESS_EVENTS
                                   or event.startswith("ctypes.")) and not getattr(_IN_WATCHER, "on", False)):
        route = _refused_route(event, args)
        if route is not None:
            # ctypes, files written and processes started only from the student's code: the grader's own
            # (malloc_bytes) are not routes
            _record_route(route, needs_student=(event.startswith("ctypes.") or event in _PROCESS_EVENTS
                                                or route.startswith("a file written")))
    if event != "open" or not _OPEN_WATCHERS or getattr(_IN_WATCHER, "on", False):
        return
    found = opened_path(args)
    if found is None:
        return
    _IN_WATCHER.on = True
    try:
        for watcher in list(_OPEN_WATCHERS):
            watcher(*found)
    finally:
        _IN_WATCHER.on = False


@contextlib.contextmanager
def watching_opens(callback: Callable[[str, bool], None]):
    """Within the block, ``callback(path, writes)`` for every file path that Python opens, in any thread
    (builtins.open, io.open, pathlib, os.open, tempfile, shutil, pickle or numpy.save to a path, torch.load):
    Python's audit hooks see them all. A file that C++ opens (torch.save to a path: its zip writer) is not seen."""
    _hook_audit()
    _OPEN_WATCHERS.append(callback)
    try:
        yield
    finally:
        _OPEN_WATCHERS.remove(callback)


def _hook_audit() -> None:
    global _AUDIT_HOOKED
    if not _AUDIT_HOOKED:
        sys.addaudithook(_audit)
        _AUDIT_HOOKED = True


def _record_route(route: str, needs_student: bool = False, skip: int = 2) -> None:
    """Append ``route`` to the problems of :func:`refusing_routes` with the line of the student's file on the
    calling stack; ``needs_student``: only when that file is on the stack."""
    if _REFUSING is None:
        return
    frame, line = sys._getframe(skip), None
    while frame is not None and line is None:
        line = frame.f_lineno if frame.f_code.co_filename == _REFUSING["file"] else None
        frame = frame.f_back
    if needs_student and line is None:
        return
    _REFUSING["found"].append({"kind": "outside_routes", "route": route, "line": line,
                               "line_said": f" (line {line} of your file)" if line else ""})


def _shared_mappings() -> set[str]:
    """The lines of /proc/self/maps mapped shared (perms with ``s``): memory another process can see. Empty where
    there is no /proc (the audit events still apply)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    shared = {" ".join(parts[5:]) or "anonymous" for parts in map(str.split, lines)
              if len(parts) > 1 and parts[1].endswith("s")}
    # a GPU driver's device files (/dev/nvidia*, /dev/dri) are mapped shared by CUDA itself
    return {m for m in shared if not m.startswith("/dev/") or m.startswith(("/dev/shm", "/dev/zero"))}


def _kernel_buffers() -> dict[int, str]:
    """This process's open pipes and memfds (/proc/self/fd): ``{fd: "pipe" or "memfd"}``, bytes written to them
    stay in the kernel. Sockets are left out (gloo's own, made in C++ by a new group). Empty without /proc."""
    found = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:                                     # closed meanwhile (listdir's own descriptor)
            continue
        if target.startswith(("pipe:", "/memfd:")):
            found[int(fd)] = "pipe" if target.startswith("pipe:") else "memfd"
    return found


#: The functions that map a file into memory from C++ (no audit event), wrapped within :func:`refusing_routes`.
_FROM_FILE = [(torch, "from_file"), (torch.UntypedStorage, "from_file"), (torch.TypedStorage, "from_file")]
_INHERITED = object()         # an attribute that a class inherits: deleted, not set, when the wrapper is removed
#: The c10d store's writes from Python, wrapped within :func:`refusing_routes`.
_STORE_WRITES = ("set", "compare_set", "multi_set", "append", "queue_push", "add")


def _wrapped_routes() -> dict:
    """Wrap torch's from_file and the store's writes so that a call records its route; returns what to put
    back. A store write from torch's own store-based barrier (TORCH_DIST_INIT_BARRIER=1 in new_group) is not a
    route."""
    saved = {}

    def wrap(owner, name, route, is_store=False, needs_student=False):
        original = getattr(owner, name, None)
        if original is None:
            return
        saved[(owner, name)] = vars(owner).get(name, _INHERITED)

        @functools.wraps(original)
        def recorded(*a, **k):
            caller = sys._getframe(1).f_code.co_name
            if not (is_store and caller == "_store_based_barrier"):
                _record_route(route, needs_student=needs_student)
            return original(*a, **k)
        setattr(owner, name, staticmethod(recorded) if isinstance(vars(owner).get(name), staticmethod) else recorded)

    for owner, name in _FROM_FILE:
        wrap(owner, name, f"{getattr(owner, '__name__', 'torch')}.from_file (a file mapped into memory)")
    writer = getattr(torch._C, "PyTorchFileWriter", None)      # torch.save to a path: C++ opens the file
    if isinstance(writer, type):
        class Writer(writer):
            def __init__(self, f, *args, **kwargs):
                if isinstance(f, (str, bytes, os.PathLike)):
                    _record_route(_file_route(os.fsdecode(f), " by torch.save"), needs_student=True)
                super().__init__(f, *args, **kwargs)
        saved[(torch._C, "PyTorchFileWriter")] = writer
        torch._C.PyTorchFileWriter = Writer
    import _posixsubprocess                                 # subprocess's own start, without its audit event
    wrap(_posixsubprocess, "fork_exec", "a process of your own (_posixsubprocess.fork_exec: a child holds a copy "
                                        "no check sees)", needs_student=True)
    from mgpu_utils.measure.comm_calls import GROUP_METHODS, GROUP_METHODS_OUT_FIRST, P2P_METHODS
    for name in [*GROUP_METHODS, *GROUP_METHODS_OUT_FIRST, *P2P_METHODS, "barrier"]:   # a backend's own methods
        wrap(torch._C._distributed_c10d.Backend, name,        # (wrapped before the file is imported: a method
             f"a process group's backend object directly (Backend.{name}: torch's internals, past the collectives "
             f"the checks count)", needs_student=True)       # bound at import or in __init__ is this one)
    wrap(torch._C._distributed_c10d.ProcessGroup, "boxed", "a process group handed to torch.ops.c10d's operators "
         "(ProcessGroup.boxed: torch's internals, past the collectives the checks count)", needs_student=True)
    for name in ("boxed", "unbox"):                          # a bare Work, whose wait() no check sees (a
        wrap(torch._C._distributed_c10d.Work, name,          # twenty-seventh red team's 03.7 g01)
             f"a collective's Work boxed or unboxed (Work.{name}: torch's internals; its wait() is past the "
             f"checks of when you wait)", needs_student=True)
    if _STORE is not None:
        for name in _STORE_WRITES:
            wrap(_STORE, name, f"the process group's key-value store (store.{name})", is_store=True)
    for owner, name in _TORCHSCRIPT:
        wrap(owner, name, _JIT_ROUTE.format(name=name), needs_student=True)
    for owner, name in [(torch._C, "CompilationUnit"), (torch.jit, "CompilationUnit"), (torch._C, "ScriptModule")]:
        real = vars(owner).get(name)                        # made by hand: a class that records its making
        if isinstance(real, type):
            saved[(owner, name)] = real
            setattr(owner, name, _recording_class(real, _JIT_ROUTE.format(name=name)))
    return saved


def _recording_class(real: type, route: str) -> type:
    """A subclass of ``real`` whose making from the student's file records ``route`` (:func:`_wrapped_routes`)."""
    class Recorded(real):
        def __init__(self, *args, **kwargs):
            _record_route(route, needs_student=True)
            super().__init__(*args, **kwargs)
    Recorded.__name__ = Recorded.__qualname__ = real.__name__
    return Recorded


#: TorchScript's ways in (compiled, traced, loaded): a scripted module's List[Tensor] holds tensors in C++ that no
#: Python tensor object stands for, and that no count of the process's tensors sees (a fifteenth red team's 03.7,
#: 07.5 and 07.6 z01-z03, 2026-12-07: gradients and gathered models kept in a scripted module hung on builtins).
_TORCHSCRIPT = [(torch.jit, "script"), (torch.jit, "trace"), (torch.jit, "trace_module"), (torch.jit, "load"),
                (torch.jit._script, "script"), (torch.jit._trace, "trace"), (torch.jit._trace, "trace_module"),
                (torch.jit._serialization, "load")] + [
    (torch._C, name) for name in ("_jit_script_compile", "_jit_script_class_compile", "_jit_script_interface_compile",
                                  "_create_function_from_trace", "_create_function_from_trace_with_dict",
                                  "import_ir_module", "import_ir_module_from_buffer", "_create_module_with_type")]
_JIT_ROUTE = ("TorchScript (torch.jit: {name}; a scripted object keeps tensors in C++, which no check of this "
              "exercise counts)")
@contextlib.contextmanager
def refusing_routes(path: str, found: list):
    """Within the block (the student's file loaded and checked, exercises whose record says
    ``collectives_only``: 03.7, 07.4 to 07.6), every route around torch.distributed and around the memory the
    checks count that Python's audit hooks see is appended to ``found`` as a problem (kind "outside_routes": the
    route and the line of ``path`` that took it): an mmap (anonymous, or of a file: POSIX shared memory,
    multiprocessing.shared_memory and numpy.memmap map one), a file opened in /dev/shm, any use of ctypes from the
    student's file (libc's open, write, malloc, mmap: C memory and files no check sees), torch.from_file (a file
    mapped from C++), a file written by the student's code (Python's open, os.open, pathlib, numpy, torch.save to
    a path: an eighth red team's 03.7 w06 and w09, weights and gradients passed through files), a write to the
    c10d store from Python, a socket bound or connected, and a shared mapping
    (/proc/self/maps) made within the block and still there at its end, however it was made (a seventh red
    team's, 2026-12-06: libc files, libc-made files mapped by torch.from_file, C-allocated copies, the
    constructor's broadcast through the store). Nothing raises: a rank that failed at once would leave the others
    waiting in a collective; the check runs to its end and the problem is reported after. gloo's and the c10d
    store's sockets are C++ and not seen. Also refused (a twelfth red team's, 2026-12-06): a process the student's
    code starts (fork, spawn, subprocess: a child keeps a copy), an sqlite3 database, and a pipe or memfd still
    open at the block's end (bytes kept in the kernel); and a collective or send of a process group's backend
    object called from the student's file (``group._get_backend(device).allreduce``, bound at import, in a
    closure or in ``__init__``: a thirteenth red team's 07.5 x02 and x04, 2026-12-07); and TorchScript, called
    from the student's file (:data:`_TORCHSCRIPT`, and the classes made by hand: C++ holds a scripted module's
    tensors where no Python object stands for them; a fifteenth red team's, 2026-12-07); and a Python thread started
    within the block and still running at its end (a seventeenth red team's helper thread kept whole gradients in
    zlib objects, bytes held by C, 2026-12-07); and ``gc.freeze()`` or ``gc.unfreeze()`` (more objects frozen at
    the end, or none left: objects frozen are missing from the garbage collector's lists, where the checks look).
    ``gc`` itself and ``sys``' measuring functions are watched by :func:`integrity_snapshot`."""
    global _REFUSING
    from mgpu_utils.measure.comm_calls import GRADER_THREADS    # (the futures it gates: one ends with its hook)
    _hook_audit()
    shared_before, fds_before, threads_before = _shared_mappings(), _kernel_buffers(), set(threading.enumerate())
    frozen_before = gc.get_freeze_count()
    _REFUSING = {"file": os.path.abspath(path), "found": found}
    saved = _wrapped_routes()
    from mgpu_utils.measure.comm_calls import ARG_WATCHERS, GROUP_WATCHERS
    GROUP_WATCHERS.append(_watch_group_route)
    ARG_WATCHERS.append(_watch_tensor_route)
    try:
        yield
        frozen = gc.get_freeze_count()                       # (a frozen object freed lowers the count: not one)
        if frozen > frozen_before or frozen_before and not frozen:   # the student's objects hidden from the lists
            _record_route("gc.freeze() or gc.unfreeze() (objects moved out of the garbage collector's lists, where "
                          "the checks look for state kept outside)")
        for thread in threading.enumerate():            # started in the block, still running at its end
            if thread not in threads_before and thread.is_alive() and thread not in GRADER_THREADS:
                _record_route(f"a thread of your own still running at the end (thread {thread.name!r}: what its "
                              f"frames and C objects hold is kept where no check counts)")
                break
        for mapping in sorted(_shared_mappings() - shared_before):   # kept past the block, however it was made
            _record_route(f"memory shared with other processes ({mapping})")
        for fd, what in sorted(_kernel_buffers().items() - fds_before.items()):   # still open at the block's end
            _record_route(f"a {what} left open (file descriptor {fd}: bytes kept in the kernel, which no check "
                          f"counts)")
    finally:
        GROUP_WATCHERS.remove(_watch_group_route)
        ARG_WATCHERS.remove(_watch_tensor_route)
        for (owner, name), original in saved.items():
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        _REFUSING = None


def _registered(group) -> bool:
    """Whether ``group`` (a ProcessGroup, or a backend object) is one of torch.distributed's registered groups or a
    backend of one."""
    import torch.distributed.distributed_c10d as c10d
    groups = list(c10d._world.pg_map)
    if any(group is g for g in groups):
        return True
    for g in groups:
        for device in ("cpu", "cuda"):
            try:
                if g._get_backend(torch.device(device)) is group:
                    return True
            except (RuntimeError, ValueError, AttributeError):
                pass
    return False


def _watch_group_route(group) -> None:
    """:data:`~mgpu_utils.measure.comm_calls.GROUP_WATCHERS`'s watcher within :func:`refusing_routes`: a collective
    from the student's file on a group of fewer ranks than the world (new_subgroups(group_size=1): counted calls
    that carry the right data and move nothing between the ranks), or on a group made by hand outside
    torch.distributed's registry (a ProcessGroupGloo of its own: its collectives are not counted); a
    twenty-sixth red team's 03.7 f01, 07.5 f01 and 07.6 f04, 2026-12-07."""
    try:
        size, world = group.size(), dist.get_world_size()
    except (RuntimeError, ValueError, AttributeError, TypeError):
        return
    if size < world:
        _record_route(f"a collective on a process group of {size} of the {world} ranks (it moves nothing between "
                      f"the others: new_subgroups, new_group(ranks=...), a group made by hand); these exercises "
                      f"move data among all the ranks, on the default group", needs_student=True)
    elif not _registered(group):
        _record_route(f"a process group made by hand ({type(group).__name__}, outside torch.distributed's "
                      f"registry: its collectives are not counted)", needs_student=True)


def _tensors_in(args, depth: int = 3) -> list:
    """The tensors in a collective's arguments (lists of them, lists of lists: all_gather's outputs)."""
    if isinstance(args, torch.Tensor):
        return [args]
    if depth and isinstance(args, (list, tuple)):
        return [t for a in args for t in _tensors_in(a, depth - 1)]
    return []


def _watch_tensor_route(args) -> None:
    """:data:`~mgpu_utils.measure.comm_calls.ARG_WATCHERS`'s watcher within :func:`refusing_routes`: a tensor of a
    subclass (not torch.Tensor or a Parameter) handed to a collective, from the student's file. Its
    ``__torch_dispatch__`` runs Python inside torch's operator, where nothing is counted: a thirty-first red team's
    03.7 p01 sent a zero in each bucket's call and every gradient in one blocking all-reduce from there, and 07.5
    p03 and 07.6 p02 all-reduced whole gradients in place of the reduce-scatters (2026-12-08)."""
    odd = sorted({type(t).__name__ for t in _tensors_in(args)
                  if type(t) not in (torch.Tensor, torch.nn.Parameter)})
    if odd:
        _record_route(f"a tensor of a subclass of torch.Tensor ({odd[0]}) handed to a collective (its "
                      f"__torch_dispatch__ or __torch_function__ runs inside torch's operator, past the checks); "
                      f"hand the collectives plain tensors", needs_student=True)


#: The modules of torch's own process-group internals: a method of ProcessGroup or Backend (gloo's allreduce) or a
#: c10d op, called directly, goes past torch.distributed's functions and the process group's Python methods that
#: the checks count; kept in a name when the student's file is imported, it escapes the patches made later.
RAW_C10D = ("torch._C._distributed_c10d", "torch._ops.c10d")


def raw_collectives_kept(module) -> list[dict]:
    """The problems (kind "outside_routes") of ``module`` (the student's file, just imported) keeping torch's own
    process-group internals (:data:`RAW_C10D`) in its globals, its classes' attributes or its functions' default
    arguments: a ninth red team's 07.5 w24 bound ``Backend.allreduce`` at import and all-reduced whole gradients
    through it, unseen (2026-12-06). torch.distributed's functions, its functional collectives and ``ReduceOp``
    are not refused."""
    spaces = [vars(module)] + [vars(v) for v in list(vars(module).values())
                               if isinstance(v, type) and v.__module__ == module.__name__]
    found = []
    for space in spaces:
        for key, value in list(space.items()):
            value = getattr(value, "__func__", value)    # a staticmethod or classmethod: what it wraps
            for o in [value] + list(getattr(value, "__defaults__", None) or ()):
                try:
                    where = getattr(o, "__module__", None) or ""
                    raw = (type(o).__name__ in ("instancemethod", "builtin_function_or_method", "method",
                                                "OpOverloadPacket", "OpOverload") and where.startswith(RAW_C10D))
                except Exception:                        # an object whose attributes raise: not torch's
                    continue
                if raw:
                    name = str(getattr(o, "__qualname__", getattr(o, "__name__", "?"))).rsplit(".", 1)[-1]
                    found.append({"kind": "outside_routes", "line": None, "line_said": "",
                                  "route": f"torch's own process-group method {name} ({where}), kept as {key} when "
                                           f"your file was imported, which calls the backend past "
                                           f"torch.distributed's functions (what the checks count)"})
    return found


def routes_refused() -> bool:
    """Whether :func:`refusing_routes` has recorded a route in the block now running (a check skips its last
    rounds: the route is the problem told)."""
    return _REFUSING is not None and bool(_REFUSING["found"])


def _watched_owners() -> list[tuple[str, object]]:
    """The classes and modules a solution must leave as it found them: torch.optim's optimizers (the one-process
    references are trained with them, in the same process), the grader's own modules and their classes (its
    instruments) and ``torch.UntypedStorage`` (whose ``nbytes`` and ``data_ptr`` count the bytes held)."""
    import torch.optim as optim
    owners = [(f"torch.optim.{c.__name__}", c) for c in (optim.Optimizer, optim.SGD, optim.Adam, optim.AdamW,
                                                          optim.RMSprop)]
    owners.append(("torch.optim", optim))
    modules = [(name, module) for name, module in list(sys.modules.items())
               if name.startswith(("mgpu_utils.grading", "mgpu_utils.measure")) and module is not None]
    owners += modules
    owners += [(f"{name}.{cls.__name__}", cls) for name, module in modules for cls in list(vars(module).values())
               if isinstance(cls, type) and cls.__module__ == name]   # their classes' methods (a ninth red
    owners.append(("torch.UntypedStorage", torch.UntypedStorage))      # team's 03.7 w07: comm_calls' handle's
    owners += [("gc", gc), ("sys", sys)]                               # record made a no-op; 07.5 w14: nbytes)
    return owners                                                      # the collector's lists, sizes, frames


def integrity_snapshot() -> dict:
    """The functions and classes of :func:`_watched_owners`, taken before the student's file is loaded
    (:func:`integrity_changes` compares, :func:`integrity_restore` puts them back). A class's methods that it
    inherits (``torch.UntypedStorage.nbytes``, from C) are kept as :data:`_INHERITED`: one set on the class
    itself later shadows them (a ninth red team's 07.5 w14)."""
    snapshot = {}
    for label, owner in _watched_owners():
        own = vars(owner)
        keep = (_STORAGE_KEYS if owner is torch.UntypedStorage else     # the grader wraps from_file itself
                _SYS_KEYS if owner is sys else None)
        for key, value in list(own.items()):
            if callable(value) and not key.startswith("__") and (keep is None or key in keep):
                snapshot[label, owner, key] = value
        if isinstance(owner, type):
            for key in dir(owner):
                if (key not in own and not key.startswith("__") and (keep is None or key in keep)
                        and callable(getattr(owner, key, None))):
                    snapshot[label, owner, key] = _INHERITED
    return snapshot


#: In :func:`integrity_snapshot`: the class had no attribute of that name of its own, only an inherited one.
_INHERITED = object()
#: The methods of ``torch.UntypedStorage`` that count bytes and tell storages apart, watched by
#: :func:`integrity_snapshot` (its ``from_file`` is wrapped by :func:`refusing_routes` while a check runs).
_STORAGE_KEYS = frozenset({"nbytes", "data_ptr", "size", "element_size", "untyped", "device", "resize_", "is_shared",
                           "_new_shared", "share_memory_"})
#: The functions of ``sys`` the checks measure with (every function of ``gc`` is watched too).
_SYS_KEYS = frozenset({"getsizeof", "_getframe", "_current_frames", "getrefcount"})


@functools.cache
def _profile_hook_code():
    """The code of torch's profiler wrapper of an optimizer's step() (None where torch has none)."""
    return (torch.optim.Optimizer.profile_hook_step(lambda: None).__code__
            if hasattr(torch.optim.Optimizer, "profile_hook_step") else None)


def _same_function(old, new) -> bool:
    """``new is old``, once torch's own wrapper is taken off: an optimizer class's first instance wraps its
    class's step() (``Optimizer._patch_step_function``: a profiler hook, functools.wraps of the original)."""
    hook = _profile_hook_code()
    while new is not old and hook is not None and getattr(new, "__code__", None) is hook:
        new = getattr(new, "__wrapped__", None)
    return new is old


def integrity_changes(snapshot: dict, instances: bool = True) -> list[str]:
    """What the student's code replaced since ``snapshot`` (``"torch.optim.SGD.step"``), and with ``instances``
    the optimizers alive given a ``step`` of their own (an instance attribute; one scan of gc's objects): the
    grader's reference trains with torch.optim in this process
    and counts with its own functions, and a solution leaves both as they were (an eighth red team's 07.5
    w22-w24, 07.6 w17, w19, w20: SGD.step made a no-op or made to copy the student's result, comm_calls'
    content_of replaced, at import; 07.5 w23: every other optimizer's step a no-op, found through gc)."""
    changed = [f"{label}.{key}" for (label, owner, key), value in snapshot.items()
               if (key in vars(owner) if value is _INHERITED else not _same_function(value, vars(owner).get(key)))]
    if instances and not changed:
        changed = [f"the step() of an optimizer ({type(o).__name__}: an instance attribute)"
                   for o in _instances_of(gc.get_objects(), torch.optim.Optimizer) if "step" in vars(o)]
    return changed


def _instances_of(objects: list, cls: type) -> list:
    """The objects of ``objects`` whose type is ``cls`` or a subclass, each type sorted out once and the objects
    filtered at C speed (``isinstance`` on each of a rank's 320,000 objects took 0.3 s, and asked deprecated module
    attributes for their ``__class__``, which warns)."""
    types_of = list(map(type, objects))
    kinds = {t: issubclass(t, cls) for t in set(types_of)}
    return list(itertools.compress(objects, map(kinds.__getitem__, types_of)))


def reference_untouched(ref_opt, trained: bool, problems: list, rank: int) -> bool:
    """Whether the grader's one-process reference optimizer ``ref_opt`` is as torch made it (no ``step`` of its
    own) and ``trained`` (its parameters moved); else a problem "tampered" (an eighth red team's 07.5 w23 made
    every other optimizer's step a no-op through gc, at each of its own steps)."""
    if "step" in vars(ref_opt) or not trained:
        note(problems, {"rank": rank, "kind": "tampered",
                        "what": "the step() of the grader's reference optimizer (it did not train)"})
        return False
    return True


def integrity_restore(snapshot: dict) -> None:
    """Put back what :func:`integrity_changes` found replaced (the next file graded in this process finds torch
    and the grader as they were)."""
    for (label, owner, key), value in snapshot.items():
        if value is _INHERITED:
            if key in vars(owner):
                delattr(owner, key)
        elif not _same_function(value, vars(owner).get(key)):
            setattr(owner, key, value)


#: The hints of the problems any exercise may report (:func:`mgpu_utils.grading.runner.problem_hint` looks here
#: when the exercise's own hints lack the kind).
COMMON_HINTS = {"tampered": [(always, "rank {rank}: your code replaced {what}: the grader checks your code against "
                                      "torch.optim in this same process, and counts with its own functions, so a "
                                      "solution must leave torch and the grader as they are: remove the patch")]}

#: The hint of a route that :func:`refusing_routes` refused.
ROUTE_HINTS = [(always, "rank {rank}: your code used {route}{line_said}: this exercise moves data between the ranks "
                "only with torch.distributed collectives and keeps its state in tensors (what is counted). Data "
                "passed or kept around them (shared memory, mmap, files, ctypes, the key-value store, sockets, "
                "processes, pipes, sqlite3) is not allowed: remove it, and "
                "let the collectives' results be what your code uses")]


def _storage_of(o, kind: int):
    """(address, bytes) of a tensor's (``kind`` 1) or a storage object's (2) storage; None on the meta device
    or without a storage."""
    try:
        storage = tensor_storage(o) if kind == 1 else _bare_storage(o)
        if storage.device.type == "meta":
            return None
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):            # a tensor without storage (a functional wrapper)
        return None


def _tensors_and_storages(objects) -> list:
    """``[(object, kind), ...]`` of the tensors (kind 1) and storage objects (2) among ``objects`` (each type
    sorted out once, the objects filtered at C speed)."""
    types_of = list(map(type, objects))
    kinds = {t: 1 if issubclass(t, torch.Tensor) else 2 if issubclass(t, (torch.UntypedStorage, torch.TypedStorage))
             else 0 for t in set(types_of)}
    picked = list(itertools.compress(objects, map(kinds.__getitem__, types_of)))
    return [(o, kinds[type(o)]) for o in picked]


def _digest(storage) -> bytes | torch.Tensor:
    """What a storage holds, in short: a blake2b digest of its bytes on the CPU (about 1 GB/s), a copy elsewhere."""
    content = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    if storage.device.type != "cpu":
        return content.clone()
    return hashlib.blake2b(memoryview(content.numpy()), digest_size=16).digest()


def _fingerprints(objects) -> dict:
    """{storage address: (object, kind, bytes, :func:`_digest`)} of the tensors and storage objects among
    ``objects`` (one object per storage): :class:`OutsideState` takes them of every object alive before its block,
    and :func:`_changed` tells those written or swapped within it. State kept in a buffer made before the block
    (at import, or in an earlier round) hides wherever it is hung (a fourteenth red team's arenas on a
    ``types.ModuleType``, on a class that says it is another module's, on ``torch.distributed``, in a paused
    generator's frame, in an eval'd lambda's globals): a buffer that holds state is written in the block."""
    out = {}
    for o, kind in _tensors_and_storages(objects):
        key = _storage_of(o, kind)
        if key is None or key[0] in out or not key[1]:
            continue
        try:
            out[key[0]] = (o, kind, key[1], _digest(tensor_storage(o) if kind == 1 else _bare_storage(o)))
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            continue
    return out


#: Where CPython keeps a dict's version tag (PEP 509: ``ma_version_tag``, after the object's header and
#: ``ma_used``), which changes at every change of the dict: :func:`_namespaces` compares only the dicts whose
#: tag changed, where :func:`_dict_tags_work` says the tag does (else every dict's items, 30 ms more).
_TAG_OFFSET = 3 * ctypes.sizeof(ctypes.c_ssize_t)


def _dict_tag(d: dict) -> int:
    return ctypes.c_uint64.from_address(id(d) + _TAG_OFFSET).value


@functools.cache
def _dict_tags_work() -> bool:
    """Whether :func:`_dict_tag` changes when a dict gets a key and when a value is replaced (CPython 3.11 to
    3.13; a Python without the tag, or another layout, compares every dict)."""
    d = {"x": 1}
    first = _dict_tag(d)
    d["x"] = 2
    second = _dict_tag(d)
    d["y"] = 3
    return first != second != _dict_tag(d) != first


#: :func:`_namespace_holders`' list: ``[number of modules, holders]`` (emptied by :func:`freeze_library`).
_HOLDERS: list = []


def _namespace_holders() -> list:
    """The namespaces of every imported module, the dicts of the classes each defines, and the dicts, lists and
    sets each holds at its top level, found once for a student's file (07.6's second round reuses the first's:
    0.1 to 0.2 s a rank) and again when more modules were imported since."""
    if _HOLDERS and _HOLDERS[0] == len(sys.modules):
        return _HOLDERS[1]
    holders, seen, wanted = [], set(), {dict: 2, list: 2, set: 2}
    for module in list(sys.modules.values()):
        space = getattr(module, "__dict__", None) if type(module) is types.ModuleType else None
        if type(space) is not dict or id(space) in seen:
            continue
        seen.add(id(space))
        holders.append(space)
        name, values = space.get("__name__"), list(space.values())
        kinds = list(map(type, values))
        for kind in set(kinds).difference(wanted):         # classes (any metaclass) and containers, picked
            wanted[kind] = int(issubclass(kind, type))     # out at C speed
        for value in itertools.compress(values, map(wanted.__getitem__, kinds)):
            if type(value) in (dict, list, set):
                holder = value
            elif vars(value).get("__module__") == name:    # a class this module defines (no __class__ asked of
                inner = gc.get_referents(vars(value))      # anything: some warn): its own dict
                holder = inner[0] if len(inner) == 1 and type(inner[0]) is dict else None
            else:
                continue
            if holder is not None and id(holder) not in seen:
                seen.add(id(holder))
                holders.append(holder)
    _HOLDERS[:] = [len(sys.modules), holders]
    return holders


def _namespaces() -> dict:
    """What every imported module's namespace, the classes it defines (their dicts), and the dicts, lists and
    sets it holds at its top level hold now: ``{"holders": [...], "tags": [each dict's tag, or None], "flat":
    [their values, one holder after another, in one list the garbage collector does not track], "ends": [where
    each holder's values end]}``: a few objects (10,000 copies made every later listing of the young objects go
    through them, 07.6's grading took 2 s longer; a set of the values' ids took 0.2 s to build on a grading
    rank, an array of them 0.15 s). :func:`_namespace_news` compares. What is hung there later is not reached from the student's module, and a bytes object is not
    listed by the garbage collector (a twentieth red team's 07.5 z04 and z06: the whole optimizer state as one
    bytes object set on ``builtins``, then on ``torch.optim.lr_scheduler``)."""
    on = getattr(_IN_WATCHER, "on", False)
    holders = _namespace_holders()
    flat, ends, tags = [], [], []
    _IN_WATCHER.on = True                                  # the grader's own reads of C memory: not routes
    try:
        with_tags = _dict_tags_work()
        for holder in holders:
            is_dict = type(holder) is dict
            tags.append(_dict_tag(holder) if with_tags and is_dict else None)
            flat.extend(holder.values() if is_dict else holder)
            ends.append(len(flat))
        _gc_untrack(flat)                                  # every full collection would go through it
    finally:
        _IN_WATCHER.on = on
    return {"holders": holders, "tags": tags, "flat": flat, "ends": ends}


@functools.cache
def _untrack_function():
    """CPython's PyObject_GC_UnTrack (None elsewhere)."""
    try:
        function = ctypes.pythonapi.PyObject_GC_UnTrack
    except (AttributeError, OSError):
        return None
    function.argtypes, function.restype = [ctypes.py_object], None
    return function


def _gc_untrack(container) -> None:
    """``container`` (a list the grader made, in no cycle) no longer gone through by the garbage collector: a
    full collection went through the 320,000 values of :func:`_namespaces`' list, 7 ms each time (more on a
    grading rank). Its values are kept alive as before; freeing it is unchanged."""
    function = _untrack_function()
    if function is not None and gc.is_tracked(container):
        function(container)


def _namespace_news(old: dict) -> list:
    """The objects that the namespaces and containers of :func:`_namespaces` hold now and did not hold then,
    and that the garbage collector does not track (those it tracks and that were made since are listed with the
    young objects); one level down, not deeper. A dict whose tag is unchanged is not read."""
    if not old:
        return []
    news, flat, start, on = [], old["flat"], 0, getattr(_IN_WATCHER, "on", False)
    _IN_WATCHER.on = True
    try:
        for holder, tag, end in zip(old["holders"], old["tags"], old["ends"]):
            if tag is not None and _dict_tag(holder) == tag:  # unchanged
                start = end
                continue
            was, start = flat[start:end], end
            now = list(holder.values() if type(holder) is dict else holder)
            if len(now) == len(was) and all(map(operator.is_, now, was)):
                continue
            ids = set(map(id, was))
            news += [v for v in now if id(v) not in ids and not gc.is_tracked(v)]
    finally:
        _IN_WATCHER.on = on
    return news


def _changed(old: dict) -> list:
    """``[(object, kind), ...]`` of :func:`_fingerprints`' objects whose storage is not the one it was (another
    address or size) or holds other bytes now."""
    out = []
    for ptr, (o, kind, nbytes, digest) in old.items():
        key = _storage_of(o, kind)
        if key is None:
            continue
        try:
            same = key == (ptr, nbytes) and OutsideState._same(
                digest, _digest(tensor_storage(o) if kind == 1 else _bare_storage(o)))
        except (RuntimeError, TypeError, ValueError, NotImplementedError):
            continue
        if not same:
            out.append((o, kind))
    return out


#: The tensors and storage objects alive when :func:`freeze_library` froze the process's objects (weak references
#: where the type allows): :class:`OutsideState` fingerprints them with the others, since gc.get_objects() no
#: longer lists them.
_LIBRARY_TENSORS: list = []


def freeze_library(collect: bool = True, tensors: bool = True) -> None:
    """A grading rank's objects so far (torch's, the grader's modules': about 320,000) frozen for the rest of the
    process (``gc.freeze``): every later collection, and :func:`made_since`'s listing, goes through the objects
    made after it only (a full collection of every object took 0.15 to 0.6 s a rank on 2 cores, and 07.5 and
    07.6 make two after their last round: :func:`~mgpu_utils.grading.coding.memory._malloc_settled`).
    grade_exercise.py calls it before loading each student's file, so everything of the student's is made after
    it and collected as before; in a launch that grades several files (the tests' tables) each freeze also keeps
    a block's listing from growing with every file graded before it. Frozen before the files of every exercise,
    not only the checks that count what the process keeps: with 03.4 to 03.6's files unfrozen, 03.x's tables took
    2 to 3 times as long (cause not found; 2026-12-07). ``collect``: a collection first (young objects only after
    the first freeze, a few ms), so that an earlier file's garbage is not frozen for good; grade_exercise.py
    leaves it out before its first file (a full collection, 0.3 s a rank: the little garbage of the imports
    stays). ``tensors``: the tensors and storages alive at the freeze are kept (weakly) for
    :class:`OutsideState`'s fingerprints, so that a library buffer written within a check still counts (a scan of
    every object, 0.08 s a rank: grade_exercise.py asks for it before the files of the exercises whose record says
    ``collectives_only``, the checks that count what the process keeps; gc.freeze itself takes no time). Without
    it (tests in one process) everything works the same, slower."""
    if collect:
        gc.collect()
    refs = []
    for o, _ in _tensors_and_storages(gc.get_objects()) if tensors else ():
        try:
            refs.append(weakref.ref(o))
        except TypeError:
            refs.append(lambda o=o: o)
    _LIBRARY_TENSORS[:] = [ref for ref in _LIBRARY_TENSORS if ref() is not None] + refs
    _HOLDERS.clear()                                       # the next file's: found again
    gc.freeze()


def _library_tensors() -> list:
    """The tensors and storages of :func:`freeze_library` still alive."""
    return [o for o in (ref() for ref in _LIBRARY_TENSORS) if o is not None]


class made_since:
    """The objects the garbage collector lists that were made after this one (``objects()``): those alive at its
    making are kept (a strong reference each, so that no new object takes one's id) until ``close()``. Replaces
    ``gc.freeze()`` at a block's start, which :func:`freeze_library`'s frozen objects would join: ``gc.unfreeze()``
    at the end would bring back every object of the library to every later collection."""

    def __init__(self):
        self.before = {id(o): o for o in gc.get_objects()}
        self.before[id(self.before)] = self.before

    def objects(self) -> list:
        before = self.before
        return [o for o in gc.get_objects() if id(o) not in before]

    def close(self) -> None:
        self.before = {}


#: Within :func:`new_objects_only`: its :class:`made_since` (for :func:`young_bytes`).
_SINCE: list = []


@contextlib.contextmanager
def new_objects_only():
    """Within the block :func:`young_bytes` lists only the objects made in it (:class:`made_since`). No
    collection first: garbage older than the block is not counted."""
    since = made_since()
    _SINCE.append(since)
    try:
        yield
    finally:
        _SINCE.remove(since)
        since.close()


def young_bytes(earlier: list = ()) -> tuple[int, dict]:
    """Within :func:`new_objects_only`: (Python, tensors): bytes of the Python objects made in the block and still
    alive, with what they hold (bytes, floats, numpy arrays); and {id: (weak reference, bytes)} of one tensor or
    storage object per storage made in the block and still alive (wherever it is kept: a list on a
    ``types.ModuleType``, a class that says it is another module's, an attribute of ``torch.distributed``; a
    fourteenth red team's 03.7 y03 and y11), the tensors autograd keeps for the nodes Python holds too. 03.7 reads
    it after every step (:func:`~mgpu_utils.grading.coding.data_parallel._leaks`): what a step made must not stay.
    A collective's output can outlive its step by a moment (gloo's worker thread lets go of it late: a 249 kB
    bucket, there after one step and gone after the next), so a step's tensors count as kept only while the next
    step's are read. ``earlier``: what it returned before (its objects are not counted)."""
    gc.collect()                                             # the objects made since freeze_library only
    mine = {id(earlier)} | {id(o) for read in earlier for o in (read, read[1])} | {
        id(o) for _, refs in earlier for entry in refs.values() for o in entry}
    mine.add(id(mine))
    young = [o for o in (_SINCE[-1].objects() if _SINCE else gc.get_objects()) if id(o) not in mine]
    tensors: dict = {}
    ptrs: set = set()
    for o, kind in _tensors_and_storages(young) + _node_saved_tensors(young):
        key = _storage_of(o, kind)
        if key is None or key[0] in ptrs:
            continue
        try:
            tensors[id(o)] = (weakref.ref(o), key[1])
        except TypeError:
            continue
        ptrs.add(key[0])
    return OutsideState._python_bytes(None, young, set()), tensors


def _node_saved_tensors(objects) -> list:
    """The tensors autograd keeps for a backward (:func:`graph_saved`) of the autograd nodes among ``objects`` that
    Python holds as objects (a ``grad_fn`` kept in a dict, a list, a registry): memory that no tensor object holds
    (an eighth red team's 07.5 w14/w15 and 07.6 w13 kept whole optimizer states and gathered models as the saved
    results of ops, holding only their nodes), each as ``(tensor, 1)``. The graphs of all the block's tensors are
    not walked: a right solution's tensors have graphs too (a view of a parameter, the last step's loss), and
    walking them once flagged three right solutions; those the student's module or object reaches are."""
    return [(t, 1) for node in _instances_of(objects, torch.autograd.graph.Node) for t in graph_saved(node)]


def _outside_graphs(found: list, knew: set) -> list:
    """The tensors autograd keeps for a backward (:func:`graph_saved`, each graph walked once) of the tensors among
    ``found`` (``(object, kind)``: :func:`_tensors_and_storages`) whose own storage is not in ``knew`` (held
    outside the student's and the grader's objects), as ``(tensor, 1)``: a twenty-third red team's 07.5 c01 and
    07.6 c01 kept whole gathered models as the saved output of a relu whose 0-d sum, hung on the ``torch``
    module, was all that Python held (8 bytes)."""
    roots = []
    for o, kind in found:
        key = _storage_of(o, kind) if kind == 1 and torch._C.TensorBase.grad_fn.__get__(o) is not None else None
        if key is not None and key[0] not in knew:
            roots.append(torch._C.TensorBase.grad_fn.__get__(o))
    seen, saved = set(), []
    for node in roots:
        if id(node) not in seen:
            seen.add(id(node))
            saved += [(t, 1) for t in graph_saved(node)]
    return saved


def _module_space(owner) -> dict:
    """The globals of the module that defines ``owner`` (a function, or a class with a method)."""
    if hasattr(owner, "__globals__"):
        return owner.__globals__
    funcs = [v for v in vars(owner).values() if hasattr(v, "__globals__")] if isinstance(owner, type) else []
    return funcs[0].__globals__ if funcs else {}


_STORE = torch._C._distributed_c10d.Store if hasattr(torch._C, "_distributed_c10d") else None


def _watch_store(stored: dict) -> dict:
    """Patch the c10d store's writes (``set``, ``compare_set``, ``multi_set``, ``append``, ``queue_push``: every
    Store class, TCPStore, HashStore, PrefixStore, inherits them) so that the bytes of each value written from
    Python go to ``stored`` (key -> bytes: the last value of a key set, the sum of what was appended); returns
    the original methods, for :class:`OutsideState` to put back. The store lives in torchrun's agent, outside
    the rank's process: whole parameters kept there are memory all the same."""
    if _STORE is None:
        return {}
    saved = {name: getattr(_STORE, name) for name in ("set", "compare_set", "multi_set", "append", "queue_push")}

    def size(v) -> int:
        return len(v.encode() if isinstance(v, str) else v) if isinstance(v, (str, bytes, bytearray)) else 0

    def set_(store, key, value, *a, **k):
        stored[key] = size(value)
        return saved["set"](store, key, value, *a, **k)

    def compare_set(store, key, expected, desired, *a, **k):
        stored[key] = size(desired)
        return saved["compare_set"](store, key, expected, desired, *a, **k)

    def multi_set(store, keys, values, *a, **k):
        for key, value in zip(keys, values):
            stored[key] = size(value)
        return saved["multi_set"](store, keys, values, *a, **k)

    def append(store, key, value, *a, **k):
        stored[key] = stored.get(key, 0) + size(value)
        return saved["append"](store, key, value, *a, **k)

    def queue_push(store, key, value, *a, **k):
        stored[key] = stored.get(key, 0) + size(value)
        return saved["queue_push"](store, key, value, *a, **k)

    for name, method in (("set", set_), ("compare_set", compare_set), ("multi_set", multi_set),
                         ("append", append), ("queue_push", queue_push)):
        setattr(_STORE, name, method)
    return saved


@contextlib.contextmanager
def store_writes():
    """Within the block, the c10d store's writes from Python (:func:`_watch_store`'s ``set``, ``compare_set``,
    ``multi_set``, ``append``, ``queue_push``, and ``add``, whose counter sums integers over the ranks as an
    all-reduce would): the block yields a dict, key -> the bytes written (8 for an ``add``). 03.7: a step whose
    gradients travel through the store rather than in its all-reduces."""
    stored: dict = {}
    saved = _watch_store(stored)
    add = getattr(_STORE, "add", None) if _STORE is not None else None
    if add is not None:
        def add_(store, key, value, *a, **k):
            stored[key] = stored.get(key, 0) + 8
            return add(store, key, value, *a, **k)
        _STORE.add = add_
    try:
        yield stored
    finally:
        for name, method in saved.items():
            setattr(_STORE, name, method)
        if add is not None:
            _STORE.add = add


class OutsideState:
    """State a student's object keeps outside what :func:`held_bytes` reaches, from the block's start to
    :meth:`count` (07.5, 07.6), in three places:

    * tensors and storage objects (``torch.UntypedStorage``, ``TypedStorage``) made within the block that no
      object handed to :meth:`count` reaches (a module-level dict, a registry, a closure, a default argument,
      another module's attribute), and those the student's module reaches that changed within the block (a
      buffer made at import, then written), and the tensors autograd keeps for the nodes (``grad_fn``
      objects) made within the block and held as Python objects (:func:`_node_saved_tensors`); and every tensor
      and storage alive before the block (made at import, or in an earlier round) whose storage was written or
      swapped within it, wherever it is hung (:func:`_fingerprints`: a digest of each one's bytes at the start,
      about 30 ms for a 32 MB arena);
    * Python objects made within the block and still alive, with what they hold (:meth:`_python_bytes`: bytes
      or BytesIO of a torch.save, numpy arrays, lists of floats, strings; inside the object or not), and the
      buffers the student's module reaches that were made or changed within the block (bytes, bytearray,
      BytesIO, numpy arrays), and the objects it reaches that were not there at the start and that the garbage
      collector does not track (gc.collect untracks a tuple of floats and a dict of only such tuples, so
      gc.get_objects() does not list them; a str, an int, a float: an old list's new floats). The Python
      objects of the student's object and of the grader's are counted too, 10 to 20 kB: the limits allow for
      them. And the objects the collector does not track (bytes, str) hung within the block on a module's
      namespace, a class a module defines, or a dict, list or set a module holds (:func:`_namespace_news`:
      ``builtins.x = some_bytes``). Not seen: such a buffer hung deeper in an object older than the block that
      the student's module does not reach (a library's dict inside a dict);
    * files: every path opened for writing (``files``: ``("wrote", path)``: :func:`watching_opens`, and
      torch.save to a path, whose zip writer ``torch._C.PyTorchFileWriter`` is watched within the block), and
      every path read that was modified since the block began (``("read", path)``: written by C++ that neither
      sees). Python's own .py and .pyc files, /proc, /sys and /dev (but /dev/shm) are not counted;
    * the c10d store: the bytes of the values written to it from Python within the block (:func:`_watch_store`),
      counted with the Python objects.

    ``owner``: the student's class or function (its module is walked). The objects alive at the start are
    noted (:class:`made_since`) until :meth:`count`, which lists the block's objects only; in a grading rank
    (:func:`freeze_library`) the library's objects are frozen, so each listing and collection takes a few ms,
    where two scans of every object (:func:`live_storages`) took 0.4 s on a rank's 390,000 objects. No tracemalloc: on Python before 3.12.9, tracemalloc.stop() while gloo's worker
    thread makes a thread state (it lets go of a finished collective's Python objects) crashes the process.
    The block should hold nothing but the student's object, the steps and the grader's own objects, and open
    no file of the grader's."""

    def __init__(self, owner=None):
        self.files: list[tuple[str, str]] = []
        self.space = _module_space(owner) if owner is not None else {}
        self._watch = None
        self.old: dict = {}
        self.namespaces: dict = {}

    def __enter__(self):
        return self.begin()

    def begin(self) -> "OutsideState":
        """Start watching (what :meth:`__enter__` does): from here on, what appears counts."""
        self.start = time.time() - 0.05                      # a file's mtime is the kernel's coarse clock
        self.reached = {}                                    # id -> (object, kind, its content now)
        walked: list = []
        for o, kind in self._module_reach(visited=walked):
            try:
                self.reached[id(o)] = (o, kind, self._content(o, kind))
            except (TypeError, ValueError, RuntimeError, BufferError):
                pass
        self.walked = {id(o): o for o in walked}             # kept alive: a new object cannot take their ids
        del walked
        self.old = _fingerprints(gc.get_objects() + _library_tensors())   # every tensor and storage alive before
        self.namespaces = _namespaces()                      # modules' and classes' attributes
        self.stored = {}                                     # the c10d store's writes (made before the freeze:
        self._store_methods = _watch_store(self.stored)      # the grader's own objects, not counted)
        self._since = made_since()                           # from now on self._young() lists new objects only
        self._watch = watching_opens(self._opened)
        self._watch.__enter__()
        self._writer = getattr(torch._C, "PyTorchFileWriter", None)   # torch.save to a path: C++ opens the file
        if isinstance(self._writer, type):
            files, real = self.files, self._writer

            class Writer(real):
                def __init__(self, f, *args, **kwargs):
                    if isinstance(f, (str, bytes, os.PathLike)):
                        files.append(("wrote", os.fsdecode(f)))
                    super().__init__(f, *args, **kwargs)
            torch._C.PyTorchFileWriter = Writer
        return self

    def __exit__(self, *exc):
        self.stop()

    def _young(self) -> list:
        """The objects the garbage collector lists that were made within the block."""
        return self._since.objects()

    def stop(self):
        """Stop watching (again: nothing happens): the objects noted at the start let go of, the files no longer
        watched."""
        if self._watch is None:
            return
        self._watch.__exit__(None, None, None)
        self._watch = None
        if isinstance(self._writer, type):
            torch._C.PyTorchFileWriter = self._writer
        for name, method in self._store_methods.items():
            setattr(_STORE, name, method)
        self._store_methods = {}
        self._since.close()
        self.reached, self.walked, self.old, self.namespaces = {}, {}, {}, {}

    def _opened(self, path: str, writes: bool) -> None:
        """:func:`watching_opens`'s callback: note a path written, or read after a change within the block."""
        if (path.endswith((".pyc", ".py")) or "__pycache__" in path or path.startswith(("/proc/", "/sys/"))
                or path.startswith("/dev/") and not path.startswith("/dev/shm/")):
            return
        if writes:
            self.files.append(("wrote", path))
            return
        try:
            if os.stat(path).st_mtime >= self.start:
                self.files.append(("read", path))
        except OSError:
            pass

    def _module_reach(self, depth: int = 8, visited: list | None = None) -> list:
        """``[(object, kind), ...]``: the tensors (kind 1), storage objects (2) and Python buffers (3: bytes,
        bytearray, memoryview, BytesIO, numpy arrays) that the student's module reaches: its globals, its classes'
        attributes, its functions' defaults and closures, and what they hold (``depth`` levels down). Every
        object walked goes to ``visited`` too (strings and numbers included): :meth:`count` counts those made
        within the block that the garbage collector does not track (a tuple of floats, a str)."""
        name, found, seen = self.space.get("__name__"), [], set()

        def walk(o, d):
            if id(o) in seen or d < 0:
                return
            seen.add(id(o))
            if visited is not None:
                visited.append(o)
            if isinstance(o, (str, int, float, bool, type(None), types.ModuleType)):
                return
            if isinstance(o, torch.Tensor):
                found.append((o, 1))
                if o.grad is not None:
                    found.append((o.grad, 1))
                for item in attributes(o) + graph_saved(o):     # hung on it, or kept by its graph
                    walk(item, d - 1)
                return
            if _bare_storage(o) is not None:
                found.append((o, 2))
                return
            if isinstance(o, (bytes, bytearray, memoryview)) or hasattr(type(o), "__array_interface__") or \
                    callable(getattr(type(o), "getbuffer", None)) or _is_buffer(o):
                found.append((o, 3))
                return
            if isinstance(o, dict):
                items = list(o.values())
            elif isinstance(o, (list, tuple, set, frozenset)):
                items = list(o)
            elif isinstance(o, type):                          # a class of the student's module: its attributes
                items = list(vars(o).values()) if o.__module__ == name else []
            elif isinstance(o, types.MethodType):
                items = [o.__self__, o.__func__]
            elif isinstance(o, types.FunctionType):            # the student's: defaults and closure cells
                items = (list(o.__defaults__ or ()) + list((o.__kwdefaults__ or {}).values()) +
                         [c.cell_contents for c in (o.__closure__ or ()) if c.cell_contents is not None]
                         if o.__module__ == name else [])
            else:
                items = attributes(o)
            for item in items:
                walk(item, d - 1)
        for key, value in list(self.space.items()):
            if not key.startswith("__"):
                walk(value, depth)
        return found

    @staticmethod
    def _content(o, kind: int):
        """A copy of what a tensor's or storage's storage (as bytes, a uint8 tensor) or a Python buffer holds."""
        if kind == 3 and not callable(getattr(type(o), "getbuffer", None)) and not hasattr(o, "tobytes") and \
                not isinstance(o, (bytes, bytearray, memoryview)):
            with memoryview(o) as view:                      # any other object with the buffer protocol
                return view.tobytes()
        return OutsideState._content_of(o, kind)

    @staticmethod
    def _content_of(o, kind: int):
        """A copy of what a tensor's or storage's storage (as bytes, a uint8 tensor) or a Python buffer holds."""
        if kind == 3:
            if callable(getattr(type(o), "getbuffer", None)):
                with o.getbuffer() as view:
                    return bytes(view)
            return o.tobytes() if hasattr(o, "tobytes") else bytes(o)
        storage = tensor_storage(o) if kind == 1 else _bare_storage(o)
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).clone()

    @staticmethod
    def _same(a, b) -> bool:
        """Two contents of :meth:`_content` are equal."""
        return torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b

    def _python_bytes(self, young: list, counted: set, referents: bool = True) -> int:
        """Bytes of the Python objects in ``young`` (the objects the garbage collector tracks that were made within
        the block) and, with ``referents``, of the objects they hold that it does not track (bytes, str, numpy
        arrays, floats), each once (ids go to ``counted``); tensors and storages are counted apart."""
        total = 0

        def add(o):
            nonlocal total
            if id(o) in counted or isinstance(o, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
                return
            counted.add(id(o))
            try:
                total += sys.getsizeof(o)                    # a BytesIO, a list or a numpy array with its buffer
            except (TypeError, ValueError):
                return
            inner = (o.obj if isinstance(o, memoryview) else           # what a view looks at: numpy's base
                     o.base if hasattr(type(o), "__array_interface__") else None)
            if inner is not None:
                add(inner)
            if type(o) in (dict, tuple, list) and not gc.is_tracked(o):    # a dict of str to bytes, a tuple of
                for item in [*o.keys(), *o.values()] if type(o) is dict else o:   # bytes: the collector does not
                    add(item)                                  # list it, nor what it holds (a sixteenth red team's
                                                               # 07.5 v03, 07.6 v02, 03.7 v02: pickled state)
        for o in young:
            add(o)
        for o in gc.get_referents(*young) if referents else ():
            if not gc.is_tracked(o):
                add(o)
        return total

    def _thread_locals(self, depth: int = 4) -> list:
        """The objects held by the locals of the student's frames in the process's other threads (a helper thread
        that keeps state in its locals: a sixteenth red team's 07.5 v01 and 07.6 v01, pickled state, 2026-12-07), and
        what the containers among them hold, ``depth`` levels down; tensors are counted apart."""
        me, file, out, seen = threading.get_ident(), self.space.get("__file__"), [], set()

        def walk(o, d):
            if id(o) in seen or d < 0 or isinstance(o, (torch.Tensor, type, types.ModuleType, types.FunctionType)):
                return
            seen.add(id(o))
            out.append(o)
            if type(o) in (dict, list, tuple, set, frozenset, collections.deque):
                for item in [*o.keys(), *o.values()] if type(o) is dict else list(o):
                    walk(item, d - 1)
        for ident, frame in sys._current_frames().items():
            while ident != me and file and frame is not None:
                if frame.f_code.co_filename == file:
                    for value in list(frame.f_locals.values()):
                        walk(value, depth)
                frame = frame.f_back
        return out

    def count(self, *known, limit: float, tries: int = 5) -> dict:
        """{"tensors": bytes of the tensors and storages of the kinds above that no object of ``known`` reaches
        (the grader's own and the student's object: what it holds is counted apart, by :func:`held_bytes`),
        "python": bytes of the Python objects of the kinds above, "files": the files seen, "optimizers": the
        torch.optim optimizers made within the block, wherever they are kept}, after the garbage collector. Ends
        the watch. A total over ``limit`` has its tensors counted again after a pause, up to ``tries`` times, and
        the smallest count is kept: a collective's tensors can outlive the call by a moment (gloo's worker thread
        lets go of them after the caller has returned: 07.4's all-to-all output, 7,248 bytes, on one rank of
        three in one launch of three). They are recounted when the Python objects alone are over ``limit`` too,
        so that the hint says where the bytes are (07.6's gathered parameters kept as numpy arrays were once
        told that part of them were tensors: 1 run in 12 under load)."""
        counts = []
        try:
            gc.collect()                                     # cheap where freeze_library froze the library
            counted: set = set()
            young = self._young()
            python = self._python_bytes(young, counted)
            optimizers = _instances_of(young, torch.optim.Optimizer)
            del young
            knew = reachable_storages(*known)
            reach, walked = [], []                           # what the module holds, made or changed within
            for o, kind in self._module_reach(visited=walked):
                was = self.reached.get(id(o))
                try:
                    if was is not None and was[0] is o and self._same(was[2], self._content(o, kind)):
                        continue
                except (TypeError, ValueError, RuntimeError, BufferError):
                    continue
                if kind != 3:
                    reach.append((o, kind))
                elif id(o) not in counted:
                    counted.add(id(o))
                    python += sys.getsizeof(o)
            reach += _changed(self.old)                      # older than the block, written within it
            new = [o for o in walked if id(o) not in self.walked and not gc.is_tracked(o)
                   and not isinstance(o, (bool, type(None)))]   # untracked by gc.collect: a tuple of floats, a str
            python += self._python_bytes(new, counted, referents=False)
            python += self._python_bytes(self._thread_locals(), counted, referents=False)
            python += self._python_bytes(_namespace_news(self.namespaces), counted, referents=False)
            del walked, new
            for k in range(tries):
                if k:
                    gc.collect()
                outside = {}
                young = self._young()                        # made within the block
                found = _tensors_and_storages(young)
                for o, kind in found + _node_saved_tensors(young) + _outside_graphs(found, knew) + reach:
                    key = _storage_of(o, kind)
                    if key is not None and key[0] not in knew:
                        outside[key[0]] = max(outside.get(key[0], 0), key[1])
                del young
                counts.append(sum(outside.values()))
                if counts[-1] + python <= limit or python > limit and not counts[-1]:
                    break                                    # over on Python alone: its tensors still recounted
                time.sleep(0.05 * (k + 1))
        finally:
            self.stop()
        return {"tensors": min(counts), "python": python + sum(self.stored.values()), "files": list(self.files),
                "optimizers": optimizers}
