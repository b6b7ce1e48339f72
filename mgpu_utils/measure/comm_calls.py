"""Collectives counted or switched off, however the code reaches them (the graders of lessons 03 to 12, and
lesson 05's ``launch_scripts/vocab_parallel.py``).

Every collective of torch.distributed (:data:`COLLECTIVES`) is replaced for the length of a ``with`` block: in
``torch.distributed``, in ``torch.distributed.distributed_c10d``, and in the module of a given function or class
(where ``from torch.distributed import all_reduce`` put the name). The collectives reached below those functions
are seen too (:class:`LowCall`): a method of a process group or of its backend (``group.allreduce([t])``,
``dist.new_group(...)._allgather_base(...)``), and the C++ operators that torch's functional collectives
(``torch.distributed._functional_collectives``, DTensor) and DistributedDataParallel's reducer call, through the
process groups' pre-collective hooks where torch has them (2.14 does), else a dispatch mode. A call counts once,
where the code made it: ``dist.all_reduce`` calls ``group.allreduce``, which calls the C++ operator, and only the
first is seen.

:func:`patched_collectives` is the general tool; :func:`point_to_point_only` makes every collective raise (04.4,
04.5), :func:`counted_collectives` records each call's name, the elements it carries and what this rank put in
(:func:`content_of`: the float64 sum, sum of squares and sum of absolute values of its input tensors, taken
before the call runs), and :func:`counted_all_reduce` records each all-reduce and whether its handle was waited
for (03.4 to 03.7). :func:`carries` compares what a step's calls put in with what they should have (the rank's
own gradients, 03.4 to 07.6); :func:`built` records the use of torch's own DDP, ZeRO or FSDP in the student's
code (03.4 to 07.6).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import pickle
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_reduce", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "all_to_all", "all_to_all_single",
               "gather", "scatter", "reduce", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list")

#: The object collectives (pickled Python objects: no tensor argument to count): (the argument this rank puts
#: in, the one it receives into), which :func:`counted_collectives` counts by their pickled bytes, 4 to an
#: element (float32's), so that whole gradients sent as objects weigh what they do as tensors.
OBJECT_CALLS = {"all_gather_object": ("obj", "object_list"), "broadcast_object_list": ("object_list", "object_list"),
                "gather_object": ("obj", "object_gather_list"),
                "scatter_object_list": ("scatter_object_input_list", "scatter_object_output_list")}

#: The argument of each collective of torch.distributed that holds what this rank puts in (broadcast: what the
#: source sends; scatter: the source's list, None elsewhere).
DIST_INPUTS = {"all_reduce": "tensor", "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
               "all_gather_single": "input_tensor", "reduce_scatter": "input_list", "reduce_scatter_tensor": "input",
               "reduce_scatter_single": "input", "broadcast": "tensor", "all_to_all": "input_tensor_list",
               "all_to_all_single": "input", "gather": "tensor", "scatter": "scatter_list", "reduce": "tensor"}

#: The collectives among the methods of a process group and of its backend (``ProcessGroup``, ``Backend``),
#: named as torch.distributed's functions are; those of the first set take (tensors, ...), the others
#: (outputs, inputs, ...).
GROUP_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "broadcast": "broadcast",
                 "reduce": "reduce",
                 # a backend's sparse all-reduce takes dense tensors too (an eighth red team's 07.5 w03)
                 "allreduce_sparse": "all_reduce"}
#: A process group's (or its backend's) point-to-point methods, watched with ``p2p``: a backend's own
#: send/recv (``group._get_backend(device).send``) skip the group's hooks (an eighth red team's 07.5 w13).
P2P_METHODS = {"send": "send", "recv": "recv", "recv_anysource": "recv"}
GROUP_METHODS_OUT_FIRST = {
    "allgather": "all_gather", "allgather_coalesced": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor", "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single", "gather": "gather",
    "gather_single": "gather", "gather_into_tensor": "gather", "scatter": "scatter"}

#: The C++ operators (namespaces c10d, _c10d_functional, _c10d_functional_autograd; a trailing ``_`` and ``_out``
#: dropped) that are collectives, named as torch.distributed's functions are (send, recv, barrier, wait_tensor:
#: not collectives here).
OPS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce": "all_reduce",
       "all_reduce_coalesced": "all_reduce", "allgather": "all_gather", "allgather_coalesced": "all_gather",
       "_allgather_base": "all_gather_into_tensor", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
       "all_gather_into_tensor": "all_gather_into_tensor",
       "all_gather_into_tensor_coalesced": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter",
       "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
       "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "alltoall": "all_to_all",
       "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single", "broadcast": "broadcast",
       "reduce": "reduce", "gather": "gather", "gather_into_tensor": "gather", "scatter": "scatter"}
_OP_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")

#: What each name of a process group's pre-collective hook (``HookOpName``) is among torch.distributed's
#: functions; (list form, tensor form) where a call of one tensor is the tensor form.
HOOK_NAMES = {"ALLREDUCE": ("all_reduce", "all_reduce"), "ALLGATHER": ("all_gather", "all_gather_into_tensor"),
              "REDUCE_SCATTER": ("reduce_scatter", "reduce_scatter_tensor"),
              "ALLTOALL": ("all_to_all", "all_to_all_single"), "BROADCAST": ("broadcast", "broadcast"),
              "REDUCE": ("reduce", "reduce"), "GATHER": ("gather", "gather"), "SCATTER": ("scatter", "scatter")}

#: The process groups' pre-collective hooks (torch 2.14 has them) see every collective issued through a group,
#: from Python or C++ (DDP's reducer, the functional collectives), in any thread; without them a dispatch mode
#: sees the C++ operators called in the block's thread. A test switches this off to try the dispatch mode.
USE_GROUP_HOOKS = hasattr(torch._C._distributed_c10d.ProcessGroup, "register_pre_hook")


def _tensors(x) -> list:
    """The tensors in ``x``: a tensor, or lists of them nested (None and anything else: none)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


class Content(NamedTuple):
    """What one collective call carried from this rank: its name, ``elements`` (the element count of its input
    tensors, what this rank puts in: the all-reduced tensor, the all-gathered or reduce-scattered input) and their
    float64 ``total``, ``squares`` (sum of squares) and ``absolute`` (sum of |x|), taken before the call ran;
    ``nbytes``: those tensors' bytes (0 where unknown; 07.5: gradients sent in float64 move twice the bytes);
    ``nonzero``: how many of the elements are not zero, and ``logs``: the sum of log2|x| over them. The three sums
    alone let data scaled by 2**-30 ride beside the right content unseen (within 1e-4 of them, and exactly
    recovered by scaling back: a twenty-first red team's 03.7 a01, 07.5 a02, 07.6 a03); every such element counts
    in ``nonzero`` and adds about -40 to ``logs``. Zeros (padding) count in neither."""
    name: str
    elements: int
    total: float
    squares: float
    absolute: float
    nbytes: int = 0
    nonzero: float = 0
    logs: float = 0.0


def _as_floats(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` itself if floating-point; else its bytes read as float32 (a whole number of 4-byte words, what is not
    a finite number read as 0): float32 data sent as an int32, int16 or uint8 view is its own numbers again (a
    twenty-fifth red team's 07.5 e10 all-gathered the reduced gradient slices as int32 bit patterns, which counted
    as nothing, and 07.6 e01 gathered float32 shards so under bfloat16). None without a byte view (sparse)."""
    if t.is_floating_point():
        return t.detach()
    try:
        raw = t.detach().contiguous().view(torch.uint8).reshape(-1)
    except (RuntimeError, TypeError):
        return None
    return torch.nan_to_num(raw[:raw.numel() // 4 * 4].view(torch.float32), nan=0.0, posinf=0.0, neginf=0.0)


def content_of(tensors, name: str = "") -> Content:
    """:class:`Content` of ``tensors`` (a tensor or a list, nested; one that is not floating-point counts as its
    bytes read as float32: :func:`_as_floats`)."""
    n, s, q, a, b, z, g = 0, 0.0, 0.0, 0.0, 0, 0, 0.0
    for t in _tensors(tensors):
        if t.numel() == 0:
            continue
        f = _as_floats(t)
        if f is None or f.numel() == 0:
            continue
        d = f.to(torch.float64)
        n += f.numel()
        b += t.numel() * t.element_size()
        s += d.sum().item()
        q += (d * d).sum().item()
        m = d.abs()
        a += m.sum().item()
        m = m[m != 0]
        z += m.numel()
        g += m.log2().sum().item()
    return Content(name, n, s, q, a, b, z, g)


def add_content(parts, name: str = "") -> Content:
    """The :class:`Content` of several calls (or tensors' contents) together."""
    parts = list(parts)
    return Content(name, sum(p.elements for p in parts), math.fsum(p.total for p in parts),
                   math.fsum(p.squares for p in parts), math.fsum(p.absolute for p in parts),
                   nonzero=sum(p.nonzero for p in parts), logs=math.fsum(p.logs for p in parts))


def scaled_content(c: Content, f: float, name: str = "") -> Content:
    """``c`` as if each element were multiplied by ``f`` (> 0; 0: nothing): the sums scale by f, f**2 and f, the
    non-zero elements stay and each one's log2 moves by log2(f)."""
    if f == 0:
        return Content(name, 0, 0.0, 0.0, 0.0)
    return Content(name, c.elements, f * c.total, f * f * c.squares, f * abs(c.absolute), c.nbytes,
                   c.nonzero, c.logs + c.nonzero * math.log2(f))


def times_content(c: Content, k: float, name: str = "") -> Content:
    """``c`` carried ``k`` times (every sum and count times k)."""
    return Content(name, round(k * c.elements), k * c.total, k * c.squares, k * c.absolute, round(k * c.nbytes),
                   k * c.nonzero, k * c.logs)


def carries(got: Content, want: Content, world: int, rtol: float = 1e-4) -> bool:
    """Whether ``got`` (what a step's collectives carried from this rank, :func:`add_content`) is ``want`` (this
    rank's own gradients, say), in any layout, order or bucketing and padded with zeros, as it is or divided by
    the world size beforehand: the sums of |x|, of x and of x**2 agree to ``rtol`` (of the sum of |x|, for the
    sum), and so do the count of non-zero elements (to ``rtol``, 1e-3 at most: 07.6's 5e-2 in bfloat16 is for
    values from weights a little apart, not for elements added) and the sum of their log2|x| (to 20 ``rtol`` per
    element): nothing else rides along, however small."""
    for f in (1.0, 1.0 / world):
        a, q = f * want.absolute, f * f * want.squares
        logs = want.logs + want.nonzero * math.log2(f)
        if (abs(got.absolute - a) <= rtol * a + 1e-30 and abs(got.squares - q) <= 2 * rtol * q + 1e-30
                and abs(got.total - f * want.total) <= rtol * a + 1e-30
                and abs(got.nonzero - want.nonzero) <= min(rtol, 1e-3) * want.nonzero + 1e-9
                and abs(got.logs - logs) <= 20 * rtol * want.nonzero + 1e-6):
            return True
    return False


def how_differs(got: Content, want: Content, world: int, rtol: float = 1e-4, of: str = "the gradients'") -> str:
    """Where ``got`` is not ``want`` (:func:`carries` said False), said in a hint: "their sum of squares is ...,
    the gradients' ..." (or how many of their elements are not zero, or their sizes, when those alone differ);
    ``of``: what ``want`` is, with its possessive."""
    f = min((1.0, 1.0 / world), key=lambda f: abs(got.squares - f * f * want.squares))
    q = f * f * want.squares
    if abs(got.squares - q) > 2 * rtol * q + 1e-30:
        return f"their sum of squares is {got.squares:.4g}, {of} {q:.4g}"
    if abs(got.nonzero - want.nonzero) > min(rtol, 1e-3) * want.nonzero + 1e-9:
        return (f"{got.nonzero:,.0f} of their elements are not zero, against {want.nonzero:,.0f} of {of}: "
                f"something rides along with them, however small (or is the padding not zeros?)")
    mean = (want.logs + want.nonzero * math.log2(f)) / max(1, want.nonzero)
    if abs(got.logs - mean * want.nonzero) > 20 * rtol * want.nonzero + 1e-6:
        return (f"their sums agree with {of}, but not the sizes of their elements: their mean log2|x| is "
                f"{got.logs / max(1, got.nonzero):.4g}, against {mean:.4g}: something rides along, however small")
    return f"their sum is {got.total:.4g} and their sum of |x| {got.absolute:.4g}, {of} {f * want.total:.4g} and " \
           f"{f * want.absolute:.4g}"


def carries_some(got: Content, pieces: list, required: list, rtol: float = 1e-4, most: int | list = 2,
                 limit: int = 4096) -> bool:
    """Whether ``got`` is the sum of ``pieces`` (:class:`Content` each, e.g. this rank's parameter shards), each
    carried 0 to ``most`` times (an int, or one per piece), at least once where ``required`` (a bool per piece)
    says so (07.6: every shard used in the step all-gathered, once or again for the backward; a weight used by
    two layers, gathered for each use: up to 4 times). More than ``limit`` combinations: every piece the same
    number of times, 1 to the largest ``most``."""
    most = [most] * len(pieces) if isinstance(most, int) else list(most)
    ranges = [range(1 if r else 0, m + 1) for r, m in zip(required, most)]
    combos = (itertools.product(*ranges) if math.prod(len(r) for r in ranges) <= limit
              else ((k,) * len(pieces) for k in range(1, max(most) + 1)))
    for counts in combos:
        want = add_content([times_content(p, c) for c, p in zip(counts, pieces)])
        if carries(got, want, 1, rtol):
            return True
    return False


def named_content(got: Content, world: int, rtol: float = 1e-4, **candidates) -> str:
    """What ``got`` is, to say in a hint: "zeros" (nothing but zeros, or nothing), the name of the first of
    ``candidates`` (name: :class:`Content`, e.g. ``weights=``) that it :func:`carries`, or "other"."""
    if got.absolute == 0:
        return "zeros"
    return next((name for name, c in candidates.items() if c.absolute and carries(got, c, world, rtol)), "other")


@dataclass
class LowCall:
    """A collective reached below torch.distributed's functions: ``name`` as theirs (:data:`COLLECTIVES`),
    ``inputs`` (the tensors this rank puts in) and ``outputs``, ``group`` (the ProcessGroup, or None: a backend,
    or an operator whose group is not known), ``what`` (how it was reached, said in a message), ``async_op``;
    ``first``: the tensor torch.distributed's function would name first (all_reduce: the tensor reduced; the
    others: the output; several: one flattened copy of them all); ``returns_work``: a method called from Python,
    whose Work the block may replace (what ``below`` returns, a function of the Work, is given it); ``root``: a
    broadcast's source rank in its group, where known (a process group's own broadcast(t, root): 07.5 reads what
    an owner sends, a twenty-second red team's 075 b01)."""
    name: str
    inputs: list
    outputs: list
    group: Any
    what: str
    async_op: bool = True
    first: Any = field(default=None)
    returns_work: bool = False
    root: int | None = None

    def __post_init__(self):
        if self.first is None:                 # the tensor torch.distributed's function names first
            tensors = self.outputs if self.name != "all_reduce" and self.outputs else self.inputs
            self.first = (tensors[0] if len(tensors) == 1 else
                          torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.empty(0))

    @property
    def elements(self) -> int:
        """The element count of the tensor(s) the function would name first (all_reduce: the tensor reduced;
        the others: the output), as :func:`counted_collectives` counts a call of torch.distributed's."""
        return self.first.numel()


def namespaces_of(obj) -> list[dict]:
    """The module globals that the student's function or class ``obj`` sees (where ``from torch.distributed
    import all_reduce`` put a name)."""
    if hasattr(obj, "__globals__"):
        return [obj.__globals__]
    funcs = [v for v in vars(obj).values() if hasattr(v, "__globals__")] if isinstance(obj, type) else []
    return [funcs[0].__globals__] if funcs else []


#: The signatures of torch.distributed's collectives, read before any block replaces them (a wrapper's own
#: signature, ``(*args, **kwargs)``, names nothing).
_SIGNATURES = {name: inspect.signature(getattr(dist, name)) for name in [*DIST_INPUTS, *OBJECT_CALLS]
               if hasattr(dist, name)}


def pickled_elements(obj) -> int:
    """The bytes of ``obj`` pickled (tensors with their data, as the object collectives send them), over 4:
    float32 elements' worth; 0 for None or what does not pickle."""
    if obj is None:
        return 0
    try:
        return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)) // 4
    except Exception:                                   # a lock, a lambda: not what an object collective sends
        return 0


def dist_inputs(name: str, args, kwargs) -> list:
    """The tensors this rank puts into torch.distributed's collective ``name`` called with ``args``, ``kwargs``."""
    key, signature = DIST_INPUTS.get(name), _SIGNATURES.get(name)
    if key is None or signature is None:
        return []
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return []
    return _tensors(bound.get(key))


def _group_call(name: str, method: str, obj, args, kwargs) -> LowCall:
    """A process group's (or its backend's) collective method ``method`` called with ``args``, ``kwargs``."""
    named = list(kwargs.values())
    if method in GROUP_METHODS_OUT_FIRST:
        outputs = args[0] if args else next((v for k, v in kwargs.items() if k.startswith("output")), None)
        inputs = args[1] if len(args) > 1 else next((v for k, v in kwargs.items() if k.startswith("input")), None)
    else:
        outputs, inputs = None, args[0] if args else (named[0] if named else None)
    group = obj if isinstance(obj, dist.ProcessGroup) else None
    root = None
    if name == "broadcast":                            # broadcast(tensor, root) or (tensors, BroadcastOptions)
        given = args[1] if len(args) > 1 else kwargs.get("root", kwargs.get("opts"))
        root = given if isinstance(given, int) else getattr(given, "rootRank", None)
    return LowCall(name, _tensors(inputs), _tensors(outputs), group, f"{type(obj).__name__}.{method}",
                   returns_work=True, root=root)


def _op_call(func, args, kwargs, p2p: bool = False) -> LowCall | None:
    """A collective C++ operator (``torch.ops.c10d.allreduce_``, ``torch.ops._c10d_functional.all_reduce``), or
    None for anything else; with ``p2p``, send and recv too (named ``send``, ``recv``)."""
    schema = func._schema
    namespace, _, op = schema.name.partition("::")
    if namespace not in _OP_NAMESPACES:
        return None
    base = op[:-1] if op.endswith("_") else op
    base = base[:-4] if base.endswith("_out") else base
    name = OPS.get(base) or (base if p2p and base in ("send", "recv") else None)
    if name is None:
        return None
    values = {a.name: v for a, v in zip(schema.arguments, args)}
    values.update(kwargs)
    inputs = next((values[k] for k in ("input_tensors", "input_tensor", "input", "inputs", "input_list")
                   if k in values), values.get("tensors", values.get("tensor")))
    outputs = next((values[k] for k in ("output_tensors", "output_tensor", "output", "outputs", "output_lists",
                                        "out") if k in values), None)
    return LowCall(name, _tensors(inputs), _tensors(outputs), None, f"torch.ops.{namespace}.{op}")


class _Depth(threading.local):
    """Per block and per thread: how many of the block's wrappers are running (only the outermost records)."""
    n = 0


class _BelowMode(TorchDispatchMode):
    """Sees the collective C++ operators called in this thread (torch without the groups' hooks)."""

    def __init__(self, seen: Callable, depth: _Depth, p2p: bool = False):
        super().__init__()
        self.seen, self.depth, self.p2p = seen, depth, p2p

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        call = _op_call(func, args, kwargs, self.p2p) if self.depth.n == 0 else None
        if call is None:
            return func(*args, **kwargs)
        self.depth.n += 1
        try:
            self.seen(call)
            return func(*args, **kwargs)
        finally:
            self.depth.n -= 1


def _hook_call(pre, group, p2p: bool = False) -> LowCall | None:
    """A process group's pre-collective hook's arguments ``pre`` as a :class:`LowCall` (None: not a collective;
    with ``p2p``, a send or recv is one, named ``send``, ``recv``)."""
    names = HOOK_NAMES.get(pre.name.name) or (
        (pre.name.name.lower(),) * 2 if p2p and pre.name.name in ("SEND", "RECV") else None)
    if names is None:
        return None
    inputs, outputs = list(pre.input_tensors), list(pre.output_tensors)
    single = len(inputs) <= 1 and len(outputs) <= 1
    return LowCall(names[single], inputs, outputs, group, f"a collective of the process group ({names[single]})",
                   async_op=pre.async_op, root=getattr(pre, "root", None) if names[single] == "broadcast" else None)


_hook_ids = itertools.count(1 << 40)


#: Called with the process group (or backend object) of every collective or point-to-point call that
#: :func:`patched_collectives` sees through a group's own method or pre-hook, however deep (torch.distributed's
#: functions call the methods too): the route checks of grading (a group of fewer ranks than the world, that moves
#: nothing between them; a group made by hand, outside torch.distributed's registry: a twenty-sixth red team's).
GROUP_WATCHERS: list[Callable[[Any], None]] = []


def _watch_group(group, args=()) -> None:
    for watcher in list(GROUP_WATCHERS):
        watcher(group)
    for watcher in list(ARG_WATCHERS):
        watcher(args)


#: Called, beside :data:`GROUP_WATCHERS`, with the arguments of each of those calls: grading's check that no tensor
#: handed to a collective is of a subclass (whose ``__torch_dispatch__`` runs the student's Python inside torch's
#: operator, where nothing is counted: a thirty-first red team's 03.7 p01, 07.5 p03, 07.6 p02).
ARG_WATCHERS: list[Callable[[tuple], None]] = []


@contextlib.contextmanager
def patched_collectives(replace, fn=None, below: Callable | None = None, p2p: bool = False):
    """Within the block every collective of torch.distributed is ``replace(name, original)``, however the
    student's code reaches it: ``dist.all_gather``, ``dist.distributed_c10d.all_gather``, or a name imported into
    the module of ``fn`` (a function or a class: ``from torch.distributed import all_gather``). A collective
    reached below those functions (a process group's or its backend's method, torch's functional collectives, DDP's
    reducer: :class:`LowCall`) goes to ``below(call)`` before it runs (which may raise; for a method, what it
    returns, if callable, is given the method's Work and returned in its place); without ``below``, to
    ``replace(name, a no-op)`` called with the tensor torch.distributed's function would name first and
    ``group=``. Each call is seen once, by the outermost of these ways (a thread-local depth per block). With
    ``p2p``, ``below`` also sees point-to-point calls (``send``, ``recv``: isend, irecv, batch_isend_irecv too),
    through the groups' hooks or the dispatch mode."""
    import torch.distributed.distributed_c10d as c10d

    depth = _Depth()

    def outermost(record, original):
        def call(*args, **kwargs):
            if depth.n:
                return original(*args, **kwargs)
            depth.n += 1
            try:
                return record(*args, **kwargs)
            finally:
                depth.n -= 1
        return call

    if below is None:
        def below(call: LowCall):
            replace(call.name, lambda *a, **k: None)(call.first, group=call.group)
    seen = below

    originals = {}
    for module in (dist, c10d):
        for name in COLLECTIVES:
            if hasattr(module, name):
                originals.setdefault(id(getattr(module, name)), name)
    saved = []                                          # (namespace dict, key, original)
    for space in [vars(dist), vars(c10d)] + (namespaces_of(fn) if fn is not None else []):
        for key, value in list(space.items()):
            if callable(value) and id(value) in originals:
                saved.append((space, key, value))
                space[key] = outermost(replace(originals[id(value)], value), value)

    classes = [torch._C._distributed_c10d.ProcessGroup, torch._C._distributed_c10d.Backend]
    for cls in classes:
        for method, name in {**GROUP_METHODS, **GROUP_METHODS_OUT_FIRST, **(P2P_METHODS if p2p else {})}.items():
            original = cls.__dict__.get(method)
            if original is None:
                continue

            def record(obj, *args, _m=method, _n=name, _o=original, **kwargs):
                wrap = seen(_group_call(_n, _m, obj, args, kwargs))
                work = _o(obj, *args, **kwargs)
                return wrap(work) if callable(wrap) else work

            def watched(obj, *args, _call=outermost(record, original), **kwargs):
                _watch_group(obj, args)                 # at any depth: dist.all_reduce(group=g) calls it too
                return _call(obj, *args, **kwargs)
            saved.append((cls, method, original))
            setattr(cls, method, watched)

    hooked, hook_id = [], next(_hook_ids)
    mode = None
    if USE_GROUP_HOOKS:
        def hook_on(group):
            def pre(args, group=group):
                _watch_group(group, args)
                if depth.n:
                    return
                call = _hook_call(args, group, p2p)
                if call is not None:
                    depth.n += 1
                    try:
                        seen(call)
                    finally:
                        depth.n -= 1
            try:
                group.register_pre_hook(hook_id, pre)
                hooked.append(group)
            except Exception:                           # a group of another kind (a fake one, a wrapper)
                pass
        for group in list(c10d._world.pg_map):
            hook_on(group)
        register = vars(c10d).get("_register_process_group")
        if register is not None:                        # a group made inside the block is hooked too
            def registered(name, pg, _register=register):
                _register(name, pg)
                hook_on(pg)
            saved.append((vars(c10d), "_register_process_group", register))
            vars(c10d)["_register_process_group"] = registered
    else:
        mode = _BelowMode(seen, depth, p2p)
    try:
        if mode is not None:
            with mode:
                yield
        else:
            yield
    finally:
        for group in hooked:
            try:
                group.unregister_pre_hook(hook_id)
            except Exception:                           # destroyed inside the block
                pass
        for space, key, value in reversed(saved):
            if isinstance(space, dict):
                space[key] = value
            else:
                setattr(space, key, value)


def point_to_point_only(exercise, fn=None):
    """Within the block every collective raises, naming itself (send/recv still work), however it is reached
    (:func:`patched_collectives`: a process group's own method and torch's functional collectives too)."""
    def forbidden(name, original):
        def call(*args, **kwargs):
            raise RuntimeError(f"exercise {exercise} allows point-to-point only, and dist.{name} was called")
        return call

    def below(call: LowCall):
        raise RuntimeError(f"exercise {exercise} allows point-to-point only, and {call.what} was called "
                           f"(dist.{call.name})")
    return patched_collectives(forbidden, fn, below)


def counted_collectives(calls: list, fn=None, carried: list | None = None, content: list | None = None,
                        p2p: bool = False, nodes: list | None = None):
    """Within the block every collective still runs, and its name is appended to ``calls``; with ``carried``,
    ``(name, elements)`` too, ``elements`` the element count of its first tensor argument (all_reduce: the
    tensor reduced; the ``*_single`` and ``*_tensor`` forms: the output), so that a check sees what a call
    carries, not only that it was made (07.5: an all-reduce of the whole gradient); with ``content``, the
    :class:`Content` of what this rank put in, taken before the call ran (07.4 to 07.6: the gradients, or zeros
    sent for show while the work happens elsewhere). Collectives reached below torch.distributed's functions
    count too (:func:`patched_collectives`); with ``p2p``, point-to-point calls too (``send``, ``recv``: isend,
    irecv and batch_isend_irecv reach them; 07.5's bound on a step's traffic counts what they move); with
    ``nodes``, whether each call started while autograd ran a node in its thread (:func:`_in_backward`: a hook or
    an autograd.Function's backward, not a final callback queued for the end of backward; 07.6)."""
    def first_elements(args, kwargs) -> int:
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                return a.numel()
            if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
                return sum(t.numel() for t in a)
        return 0

    def counting(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            if nodes is not None:
                nodes.append(_in_backward())
            if name in OBJECT_CALLS:                     # pickled: its bytes, float32's worth, in and out
                bound = _SIGNATURES[name].bind_partial(*args, **kwargs).arguments
                put = pickled_elements(bound.get(OBJECT_CALLS[name][0]))
                result = original(*args, **kwargs)
                if carried is not None:
                    carried.append((name, pickled_elements(bound.get(OBJECT_CALLS[name][1]))))
                if content is not None:
                    content.append(Content(name, put, 0.0, 0.0, 0.0))
                return result
            if carried is not None:
                carried.append((name, first_elements(args, kwargs)))
            if content is not None:
                content.append(content_of(dist_inputs(name, args, kwargs), name))
            return original(*args, **kwargs)
        return call

    def below(call: LowCall):
        calls.append(call.name)
        if nodes is not None:
            nodes.append(_in_backward())
        raw = call.name in ("send", "recv") and not any(t.is_floating_point() for t in call.inputs + call.outputs)
        if carried is not None:                         # send/recv_object_list's bytes: float32's worth
            carried.append((call.name, call.first.nbytes // 4 if raw else call.elements))
        if content is not None:
            content.append(Content(call.name, sum(t.nbytes for t in call.inputs) // 4, 0.0, 0.0, 0.0) if raw else
                           content_of(call.inputs, call.name))
    return patched_collectives(counting, fn, below, p2p=p2p)


class _Handle:
    """A Work handle that records whether the student waited for it (``wait()``, ``get_future()``, or
    ``is_completed()`` once it says True) and whether it was waited for inside backward (``waited_in_backward``:
    ``"wait"``, a wait() from a hook, while autograd runs a node, where it stops backward until the bucket has
    travelled; ``"poll"``, is_completed() called again and again in one hook, a loop until done; ``"thread"``, a
    wait() or a completed is_completed() in another thread while the hook sits blocked on it, ``blocks()``
    saying so; ``"engine"``, the same while backward sleeps inside autograd's engine in a hook that is C code:
    :func:`_engine_sleeps`). Inside a hook the first :data:`POLLS_SAID_FALSE` is_completed() calls say False (an all-reduce
    may always be still running then), so that a loop until done polls more often than that whatever the
    network's speed. With ``into``: the collective works on a copy, and its result reaches the student's tensor
    ``into`` only when wait() returns, the future completes or is_completed() says True: the only moments the
    result is promised, so that reading the tensor before fails every time, not when the network happens to be
    slow."""

    def __init__(self, work, call, into=None, copy=None, blocks=None):
        self._work, self._call, self._into, self._copy, self._blocks = work, call, into, copy, blocks
        self._delivered = False
        self._polled, self._polls = None, 0               # the node it was last polled in, and how often there
        self._hooked = _watch_held(work, call)            # the thread whose hook started it, or None
        self._waiting = None                               # (thread, future) of :meth:`_gated`, asked in a hook

    def _deliver(self):
        if self._into is not None and not self._delivered:
            self._delivered = True
            if self._into._version != self._call.get("version", self._into._version):
                self._call["touched"] = True               # written (divided?) before the result was promised
            self._into.copy_(self._copy)

    def _blocked(self, how: str):
        if not self._call.get("waited_in_backward"):
            self._call["waited_in_backward"] = how

    def wait(self, *args, **kwargs):
        self._call["waited"] = True
        if _in_backward():
            self._blocked("wait")
        out = self._work.wait(*args, **kwargs)
        kind = self._blocks() if self._blocks is not None else False
        if kind:                                           # in a thread that the hook waits for
            self._blocked("engine" if kind == "engine" else "thread")
        self._deliver()
        return out

    def is_completed(self):
        node = _current_node()
        if node is not None:                               # in a hook: polled how often in this one?
            self._polls = self._polls + 1 if node is self._polled else 1
            self._polled = node
            if self._polls > POLLS_SAID_FALSE:             # a loop until done: the hook blocks as wait() does
                self._blocked("poll")
            else:
                return False
        done = self._work.is_completed()
        if done:                                           # polled until done: as good as wait()
            self._call["waited"] = True
            kind = self._blocks() if node is None and self._blocks is not None else False
            if kind:
                self._blocked("engine" if kind == "engine" else "thread")
            self._deliver()
        return done

    def get_future(self):
        self._call["waited"] = True
        fut = self._work.get_future()
        if self._into is None and self._hooked is None:
            return fut

        def delivered(value):
            self._deliver()
            return [self._into] if self._into is not None else value
        return self._gated(fut, delivered)

    def get_future_result(self):
        self._call["waited"] = True
        fut = self._work.get_future_result()
        return fut if self._hooked is None else self._gated(fut, lambda value: value)

    def _gated(self, fut, value):
        """``fut`` chained: it completes with ``value(its value)`` (raises what the collective raised) once no
        hook that runs at the completion is still running (:func:`_after_hooks`); asked for in a hook when
        already complete, from a thread of the grader's that waits for the hook to return."""
        hooked, call = self._hooked, self._call

        def finish(f):
            got = f.value()
            _after_hooks(hooked, call)
            return value(got)
        if hooked == threading.get_ident() and fut.done() and _in_hook(sys._getframe())[0] is not None:
            if self._waiting is not None and not self._waiting[1].done():
                return self._waiting[1]                    # asked again and again: one thread, one future
            visible = torch.futures.Future()

            def later():
                try:
                    visible.set_result(finish(fut))
                except Exception as e:                     # what the collective raised
                    visible.set_exception(e)
            waiter = threading.Thread(target=later, daemon=True, name="grader: a future after its hook")
            GRADER_THREADS.add(waiter)
            self._waiting = (waiter, visible)
            waiter.start()
            return visible
        return fut.then(finish)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _watch_held(work, call: dict) -> None:
    """For an all-reduce started in a hook of backward: ``call["held"] = True`` when it completes while that
    same hook (the same frame: :func:`_in_hook`) still runs in the thread that started it. The hook waited for
    it, whatever the way (a threading.Event set by a callback of its future, a sleep until a flag changes, a
    lock: a twentieth red team's 03.7 z03, an Event waited 0.04 s at most); a hook that returns at once has
    left by then (the future's callback needs the GIL, which the hook holds until it returns to autograd).
    The check asks for most of a step's all-reduces held (one can finish while its hook returns)."""
    if _current_node() is None:
        return None
    hook, _ = _in_hook(sys._getframe())
    if hook is None:
        return None
    thread, box = _note_native_id(), [hook]               # the hook's frame, let go of at completion

    def completed(_future):
        frame = box.pop() if box else None
        if frame is not None and threading.get_ident() != thread:   # not run at once: already complete
            now = sys._current_frames().get(thread)
            if _in_hook(now)[0] is frame and not _starting_thread(now, frame):
                call["held"] = True
    try:
        work.get_future().then(completed)
    except (RuntimeError, AttributeError):                 # a Work without a future
        box.clear()
    return thread


#: The threads :class:`_Handle` starts (a check refuses a thread of the student's still running at its end).
GRADER_THREADS = weakref.WeakSet()

#: How long a future of an all-reduce started in a hook waits for the hook running at its completion to return.
HOOK_LIMIT_S = 0.5


def _after_hooks(thread, call: dict) -> None:
    """Called where the future the student holds (get_future(), get_future_result() of an all-reduce a hook of
    ``thread`` started) completes: while ``thread`` runs a hook of backward, wait until that hook returns, so
    that no hook learns of the completion (a callback that sets an Event, releases a Lock or sets a flag) before
    it lets backward go on: a hook waiting for it waits in vain. After :data:`HOOK_LIMIT_S` in the same hook,
    ``call["held"]`` (it waited for it) and go on. A twenty-second red team's 03.7 b01: the next hook blocked on
    a Lock that the previous bucket's future released, so backward stopped until each bucket had travelled; a
    right hook returns within microseconds. A thread asleep inside autograd's engine with no hook's frame (a
    builtin registered as a hook: :func:`_engine_sleeps`) is waited for the same way."""
    if thread is None or thread == threading.get_ident():
        return
    hook = _in_hook(sys._current_frames().get(thread))[0]
    deadline = time.monotonic() + HOOK_LIMIT_S
    if hook is None:                                       # a hook that is C code, sleeping under the engine
        while _engine_sleeps(thread):
            if time.monotonic() > deadline:
                call["held"] = True
                return
        return
    while _in_hook(sys._current_frames().get(thread))[0] is hook:
        if time.monotonic() > deadline:
            call["held"] = True
            return
        time.sleep(0.0002)


#: Inside a hook, :class:`_Handle`'s is_completed() says False this many times before it asks the Work.
POLLS_SAID_FALSE = 2


#: torch's own function, bound at import (before a student's file is loaded): code that replaces
#: ``torch._C._current_autograd_node`` later does not change what the checks see (an eighth red team's 03.7 w07).
_CURRENT_AUTOGRAD_NODE = getattr(torch._C, "_current_autograd_node", None)


def _current_node():
    """The autograd node this thread is running (in a hook of backward, not in its final callbacks), or None."""
    return _CURRENT_AUTOGRAD_NODE() if _CURRENT_AUTOGRAD_NODE is not None else None


def _in_backward() -> bool:
    """Whether autograd is running a node in this thread (a hook of backward, not its final callbacks)."""
    return _current_node() is not None


def _final_callback(callback):
    """``callback`` queued for the end of backward, run by a function whose frame says so (:func:`_in_hook`)."""
    def final_callback():
        return callback()
    return final_callback


_FINAL_CODE = _final_callback(None).__code__


class _Engine:
    """Autograd's engine (``Variable._execution_engine``) whose queue_callback marks each final callback."""

    def __init__(self, engine):
        self._engine = engine

    def queue_callback(self, callback):
        return self._engine.queue_callback(_final_callback(callback))

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _codes(*functions) -> set:
    return {f.__code__ for f in functions if f is not None}


#: The frames that call autograd's engine, above which the hooks it runs sit (a frame's f_back is one of them).
_ENGINE_CODES = _codes(getattr(torch.autograd.graph, "_engine_run_backward", None)) or _codes(
    torch.autograd.backward, torch.autograd.grad)
#: A thread whose innermost frame is one of these sits blocked on another thread: joining it, or waiting on a
#: condition (an Event, a Future's result, a Queue's get, a Semaphore and a Barrier wait on one).
_BLOCKED_CODES = _codes(threading.Thread.join, getattr(threading.Thread, "_wait_for_tstate_lock", None),
                        threading.Condition.wait)
#: ... unless it is starting a thread (Thread.start waits until the new thread runs, not until it ends).
_STARTING_CODES = _codes(threading.Thread.start)


def _starting_thread(frame, hook) -> bool:
    """Whether the thread whose innermost frame is ``frame`` is inside threading.Thread.start, below ``hook``:
    start() waits until the new thread runs, and an all-reduce may complete meanwhile, in a right 03.7 that
    starts a thread to wait for each bucket (a thread whose start its own code steers is not counted so)."""
    while frame is not None and frame is not hook:
        if frame.f_code in _STARTING_CODES:
            cls = type(frame.f_locals.get("self"))
            return all(getattr(cls, name, None) is getattr(threading.Thread, name)
                       for name in ("start", "_bootstrap", "_bootstrap_inner"))
        frame = frame.f_back
    return False


def _in_hook(frame):
    """For a thread whose innermost frame is ``frame``: (the frame of the hook autograd's engine runs in it, or
    None where it runs none, or a final callback; whether it sits blocked on another thread there)."""
    top, starting = frame, False
    while frame is not None:
        starting = starting or frame.f_code in _STARTING_CODES
        back = frame.f_back
        if back is not None and back.f_code in _ENGINE_CODES:
            if frame.f_code is _FINAL_CODE:
                return None, False
            return frame, top.f_code in _BLOCKED_CODES and not starting
        frame = back
    return None, False


#: ``threading.get_ident()`` -> ``threading.get_native_id()`` of the threads that ran backward or a hook, noted in
#: them: a Thread object's native_id can be its parent's after a fork (a warm launch's rank).
_NATIVE_IDS: dict[int, int] = {}


def _note_native_id() -> int:
    """Note this thread's kernel id (:data:`_NATIVE_IDS`); returns its ``threading.get_ident()``."""
    ident = threading.get_ident()
    _NATIVE_IDS[ident] = threading.get_native_id()
    return ident


def _native_id(thread_id: int) -> int | None:
    """The kernel's id of the Python thread ``thread_id`` (``threading.get_ident()``), as noted by
    :func:`_note_native_id`, or None."""
    return _NATIVE_IDS.get(thread_id)


#: How long a thread inside autograd's engine, with no hook's frame, must sleep to count as blocked there.
ENGINE_SLEEP_S = 0.02


def _engine_sleeps(thread_id: int, frame=None, span: float = ENGINE_SLEEP_S) -> bool:
    """Whether the thread ``thread_id`` (innermost frame ``frame``) sits inside autograd's engine with no frame of
    a hook (C code under the engine: a hook that is a builtin) and sleeps there (the kernel says S or D, Linux's
    /proc) at every look for ``span`` seconds, this thread letting go of the GIL between looks: blocked on
    something, where a node computing runs (R), and a thread that waits for the GIL gets it meanwhile. A
    twenty-fourth red team's 03.7 d01: ``queue.SimpleQueue().get`` registered as a pre-hook on every node still
    to run, fed by a thread once each bucket's wait() returned: backward stood still until each bucket had
    travelled, and no Python frame sat under the engine. False where /proc cannot be read."""
    frame = sys._current_frames().get(thread_id) if frame is None else frame
    native = _native_id(thread_id)
    if frame is None or frame.f_code not in _ENGINE_CODES or native is None:
        return False
    deadline = time.monotonic() + span
    while True:
        try:
            with open(f"/proc/self/task/{native}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        if state not in (b"S", b"D"):
            return False
        now = sys._current_frames().get(thread_id)
        if now is None or now.f_code not in _ENGINE_CODES:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.001)


def _hook_blocks(thread_id: int, backward: Callable[[], bool], timeout: float = 0.5) -> bool | str:
    """Whether the thread ``thread_id``, the one that runs backward, sits blocked on another thread (joins it,
    waits on an event, a future, a queue) in a hook of backward, not a final callback, or in a hook that is C
    code (:func:`_engine_sleeps`): polled while ``backward()`` until it does, or it has left the hook it was first
    seen in, or ``timeout`` seconds passed. Called from another thread, once it has waited for a collective: the
    hook was waiting for that thread. Returns ``"engine"`` (truthy) for the second kind."""
    deadline, first = time.monotonic() + timeout, None
    while backward():
        frame = sys._current_frames().get(thread_id)
        hook, blocked = _in_hook(frame)
        if hook is None and first is None and _engine_sleeps(thread_id, frame):
            return "engine"
        if hook is None or (first is not None and hook is not first):
            return False
        if blocked:
            return True
        if time.monotonic() > deadline:
            return False
        first = hook
        time.sleep(2e-4)
    return False


@contextlib.contextmanager
def counted_all_reduce(state: dict, fn=None):
    """Within the block, record every all-reduce call (``dist.all_reduce``, or the name imported into ``fn``'s
    module, or one reached below torch.distributed's functions: :func:`patched_collectives`): whether async,
    whether it started during backward (``in_backward``: ``state["backward"]`` set, which the check does while
    ``loss.backward()`` runs, and autograd running a node: from a hook, not from a final callback queued to run
    once backward is over, which overlaps nothing), the tensor's
    storage (``storage``, its data pointer: the weights all-reduced instead of the gradient?), ``elements`` and
    ``content`` (:func:`content_of` the tensor before the call: the gradients, or zeros sent for show?), and for
    an async call whether its handle was waited for and whether the tensor was written before the result was
    delivered (``touched``: divided before wait()) and whether it was waited for inside backward
    (``waited_in_backward``: in a hook, by a loop on is_completed() there, or in another thread while a hook
    waits for that thread: no overlap; see :class:`_Handle`; a final callback's waits are not); an async call's result reaches its tensor at wait() (or when
    its future completes), as promised, not before. A call reached below (``below``: True) counts as
    asynchronous; a process group's ``allreduce`` called from Python returns a Work whose waits are recorded
    the same way, while one issued from C++ (DDP's reducer, the functional collectives) counts as waited for.
    ``state["others"]`` becomes the names of the block's other collectives and point-to-point calls (``send``,
    ``recv``), a broadcast excepted (DDP broadcasts buffers at every forward) unless made during backward or while
    ``state["finishing"]`` is set (the check's finish()): the gradients moved some other way while the
    all-reduces carried them for show? Each all-reduce records its ``op`` too (``"SUM"``, ``"MAX"``; None: the
    default, a sum). ``state["blocking"]`` becomes the names of the blocking calls
    that ran during backward (a barrier waited for, a broadcast without async_op, the Work of another collective
    than an all-reduce waited for): like a wait() in a hook, they stop backward until every rank is there.
    With ``state["progress"]`` (a function, e.g. how many gradients were accumulated so far), each all-reduce
    records its value when it started (``progress``)."""
    calls, others, blocking = [], [], []
    state["others"], state["blocking"] = others, blocking
    unseen = ("all_reduce", "broadcast", "broadcast_object_list")
    progress = state.get("progress") or (lambda: None)

    def in_backward() -> bool:
        return bool(state["backward"]) and _in_backward()

    autograd_thread = _note_native_id()                   # the thread that runs backward (on CPU)

    def blocks() -> bool:
        """In another thread than backward's: whether a hook of backward sits blocked on this thread."""
        return (threading.get_ident() != autograd_thread and bool(state["backward"])
                and _hook_blocks(autograd_thread, lambda: bool(state["backward"])))

    def watched(name, work):
        """An async call's Work, whose wait() during backward goes to ``blocking`` (a hidden barrier there)."""
        return _Waited(work, in_backward, blocking, name, blocks) if callable(getattr(work, "wait", None)) else work

    def moved_late() -> bool:
        """During backward or in finish() (``state["finishing"]``): a broadcast there moves what the all-reduces
        should (an eighteenth red team's 03.7 x02: every gradient broadcast by each rank in finish())."""
        return in_backward() or bool(state.get("finishing"))

    def replace(name, real):
        if name in unseen[1:]:
            def blocking_call(*args, **kwargs):
                sync = name == "broadcast_object_list" or not kwargs.get("async_op")
                if moved_late():
                    others.append(name)
                if in_backward() and sync:
                    blocking.append(name)
                out = real(*args, **kwargs)
                if sync and not in_backward() and blocks():
                    blocking.append(name)
                return watched(name, out)
            return blocking_call
        if name != "all_reduce":
            def other(*args, **kwargs):
                others.append(name)
                return watched(name, real(*args, **kwargs))
            return other

        def counting(tensor, *args, **kwargs):
            op = kwargs.get("op", args[0] if args else None)
            call = {"async": bool(kwargs.get("async_op")), "in_backward": in_backward(),
                    "op": None if op is None else str(getattr(op, "name", op)).split(".")[-1],
                    "waited": False, "progress": progress(),
                    "storage": tensor.untyped_storage().data_ptr(), "elements": tensor.numel(),
                    "content": content_of(tensor, name)}
            calls.append(call)
            if not call["async"]:
                return real(tensor, *args, **kwargs)
            call["version"] = tensor._version              # changed before wait()? (``touched`` then)
            copy = tensor.detach().clone()                 # the result lands in ``tensor`` at wait(), not before
            return _Handle(real(copy, *args, **kwargs), call, into=tensor, copy=copy, blocks=blocks)
        return counting

    def below(call: LowCall):
        if call.name == "all_reduce":
            first = call.inputs[0] if call.inputs else None
            record = {"async": True, "in_backward": in_backward(), "progress": progress(),
                      "waited": not call.returns_work,
                      "below": True, "storage": first.untyped_storage().data_ptr() if first is not None else 0,
                      "elements": call.elements, "content": content_of(call.inputs, call.name)}
            calls.append(record)
            if call.returns_work:                          # its Work, to see whether it is waited for
                return lambda work: _Handle(work, record, blocks=blocks)
        else:
            if call.name not in unseen or moved_late():
                others.append(call.name)
            if call.returns_work:                          # a wait() on its Work in a hook blocks backward too
                return lambda work: watched(call.name, work)
    engine = torch.autograd.variable.Variable._execution_engine
    torch.autograd.variable.Variable._execution_engine = _Engine(engine)     # final callbacks marked
    try:
        with (patched_collectives(replace, fn, below, p2p=True), _barriers_watched(in_backward, blocking, blocks),
              _result_waits_watched(in_backward, blocking, blocks)):
            yield calls
    finally:
        torch.autograd.variable.Variable._execution_engine = engine


class _Waited:
    """A barrier's (or another collective's) Work that records ``name`` in ``blocking`` when it is waited for
    while ``in_backward()``, or in another thread while a hook of backward sits blocked on it (``blocks()``)."""

    def __init__(self, work, in_backward, blocking, name="barrier", blocks=None):
        self._work, self._in_backward, self._blocking, self._name = work, in_backward, blocking, name
        self._blocks = blocks

    def wait(self, *args, **kwargs):
        inside = self._in_backward()
        if inside:
            self._blocking.append(self._name)
        out = self._work.wait(*args, **kwargs)
        if not inside and self._blocks is not None and self._blocks():
            self._blocking.append(self._name)
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


class _InCallback(threading.local):
    """Per thread: how many callbacks of a future (``then``, ``add_done_callback``) are running."""
    n = 0


_IN_CALLBACK = _InCallback()

#: What :func:`_result_waits_watched` calls each wait it records in ``blocking``.
FUTURE_WAIT = "a future's wait()"
FUTURE_POLL = "a future's done(), polled in a loop"
FUNCTIONAL_WAIT = "wait_tensor (a functional collective's result read)"


class _WatchedOp:
    """An operator (``torch.ops._c10d_functional.wait_tensor``, its ``.default`` too) that calls ``note()`` first."""

    def __init__(self, op, note):
        self._op, self._note = op, note

    def __call__(self, *args, **kwargs):
        self._note()
        return self._op(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._op, name)
        return _WatchedOp(attr, self._note) if name == "default" else attr


@contextlib.contextmanager
def _result_waits_watched(in_backward, blocking, blocks=None):
    """Within the block, the waits for a collective's result that do not go through a Work's wait(): a future's
    wait() (``work.get_future().wait()``, ``torch.futures.wait_all``) and ``wait_tensor``, which reading a
    functional collective's result calls (``funcol.all_reduce(...)`` then used in the hook), go to ``blocking``
    when made while ``in_backward()`` or in a thread a hook waits for (``blocks()``); a future's callbacks
    (``then``, ``add_done_callback``: they run once the result is there, or at once if it already is) may read
    it (an eighth red team's 03.7 w03 and w04: each bucket waited for in its hook, by its future or by reading the
    functional all-reduce's result, so nothing overlapped backward)."""
    future = torch._C.Future
    originals = {name: future.__dict__[name] for name in ("wait", "done", "then", "add_done_callback")
                 if name in future.__dict__}
    polls: dict = {}                                       # (future, hook's node) -> done() calls there

    def wait(fut, *args, **kwargs):
        inside = in_backward() and not _IN_CALLBACK.n
        if inside:
            blocking.append(FUTURE_WAIT)
        out = originals["wait"](fut, *args, **kwargs)
        if not inside and not _IN_CALLBACK.n and blocks is not None and blocks():
            blocking.append(FUTURE_WAIT)
        return out

    def done(fut):
        """In a hook, the first POLLS_SAID_FALSE calls on a future say False (as :class:`_Handle`'s
        is_completed()), so that a loop until done polls more often than that whatever the network's speed."""
        node = _current_node()
        if node is not None and in_backward() and not _IN_CALLBACK.n:
            key = (id(fut), id(node))
            polls[key] = polls.get(key, 0) + 1
            if polls[key] <= POLLS_SAID_FALSE:
                return False
            if polls[key] == POLLS_SAID_FALSE + 1:
                blocking.append(FUTURE_POLL)
        return originals["done"](fut)

    def marked(callback):
        def run(*args, **kwargs):
            _IN_CALLBACK.n += 1
            try:
                return callback(*args, **kwargs)
            finally:
                _IN_CALLBACK.n -= 1
        return run

    def then(fut, callback, *args, **kwargs):
        return originals["then"](fut, marked(callback), *args, **kwargs)

    def add_done_callback(fut, callback, *args, **kwargs):
        return originals["add_done_callback"](fut, marked(callback), *args, **kwargs)

    def functional_wait():
        if in_backward() or blocks is not None and blocks():
            blocking.append(FUNCTIONAL_WAIT)

    ops = getattr(torch.ops, "_c10d_functional", None)
    op = getattr(ops, "wait_tensor", None) if ops is not None else None
    replaced = {"wait": wait, "done": done, "then": then, "add_done_callback": add_done_callback}
    for name in originals:
        setattr(future, name, replaced[name])
    if op is not None:
        setattr(ops, "wait_tensor", _WatchedOp(op, functional_wait))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(future, name, original)
        if op is not None:
            setattr(ops, "wait_tensor", op)


@contextlib.contextmanager
def _barriers_watched(in_backward, blocking, blocks=None):
    """Within the block, a process group's (or its backend's) barrier waited for while ``in_backward()``
    (``dist.barrier()`` waits for it; so may the student), or in a thread a hook waits for (``blocks()``), and a
    monitored barrier called in a hook go to ``blocking``."""
    saved = []
    for cls in (torch._C._distributed_c10d.ProcessGroup, torch._C._distributed_c10d.Backend):
        original = cls.__dict__.get("barrier")
        if original is not None:
            def barrier(obj, *args, _o=original, **kwargs):
                return _Waited(_o(obj, *args, **kwargs), in_backward, blocking, blocks=blocks)
            saved.append((cls, "barrier", original))
            setattr(cls, "barrier", barrier)
        original = cls.__dict__.get("monitored_barrier")
        if original is not None:
            def monitored(obj, *args, _o=original, **kwargs):
                if in_backward():
                    blocking.append("monitored_barrier")
                return _o(obj, *args, **kwargs)
            saved.append((cls, "monitored_barrier", original))
            setattr(cls, "monitored_barrier", monitored)
    try:
        yield
    finally:
        for cls, name, original in reversed(saved):
            setattr(cls, name, original)


#: torch's own parallel wrappers an exercise asks the student to write (module, class, what the hint calls it):
#: DistributedDataParallel and its C++ engine, the Reducer (03.4 to 03.7), ZeroRedundancyOptimizer (07.4, 07.5),
#: FSDP and fully_shard (07.6).
TORCH_DDP = (("torch.nn.parallel.distributed", "DistributedDataParallel", "torch's DistributedDataParallel"),
             ("torch.distributed", "Reducer", "torch's DDP Reducer (DistributedDataParallel's C++ engine)"))
TORCH_ZERO = (("torch.distributed.optim.zero_redundancy_optimizer", "ZeroRedundancyOptimizer",
               "torch's ZeroRedundancyOptimizer"),)
TORCH_FSDP = (("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel",
               "torch's FullyShardedDataParallel"),
              ("torch.distributed.fsdp._fully_shard._fsdp_state", "FSDPState", "torch's fully_shard"))


@contextlib.contextmanager
def built(wrappers):
    """Within the block, the name (the third field) of each of ``wrappers`` (:data:`TORCH_DDP`, ...) whose class
    is constructed goes to the list the block yields (one built inside another's constructor, DDP's Reducer, is
    not). Only modules already imported are watched (importing
    torch.distributed.optim costs 2 s); a module first imported inside the block is searched instead, at the
    end, for instances that are alive (gc)."""
    used, saved, watched, inside = [], [], set(), [0]
    for module, cls_name, label in wrappers:
        cls = getattr(sys.modules.get(module), cls_name, None)
        if cls is None:
            continue
        watched.add(module)
        original = cls.__dict__["__init__"]

        def init(self, *args, _o=original, _label=label, **kwargs):
            if _label not in used and not inside[0]:      # DDP's own Reducer is DDP's, not a second finding
                used.append(_label)
            inside[0] += 1
            try:
                return _o(self, *args, **kwargs)
            finally:
                inside[0] -= 1
        saved.append((cls, original))
        cls.__init__ = init
    try:
        yield used
    finally:
        for cls, original in saved:
            cls.__init__ = original
        late = [(getattr(sys.modules.get(m), c, None), label) for m, c, label in wrappers if m not in watched]
        late = [(cls, label) for cls, label in late if cls is not None]
        if late:
            import gc
            for obj in gc.get_objects():
                for cls, label in late:
                    if isinstance(obj, cls) and label not in used:
                        used.append(label)
