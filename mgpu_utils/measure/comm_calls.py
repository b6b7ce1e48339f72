"""Collectives counted or switched off, however the code reaches them (the graders of lessons 03 to 12, and
lesson 05's ``launch_scripts/vocab_parallel.py``).

Every collective of torch.distributed (:data:`COLLECTIVES`) is replaced for the length of a ``with`` block: in
``torch.distributed``, in ``torch.distributed.distributed_c10d``, and in the module of a given function or class
(where ``from torch.distributed import all_reduce`` put the name). :func:`patched_collectives` is the general
tool; :func:`point_to_point_only` makes every collective raise (04.4, 04.5), :func:`counted_collectives` records
each call's name, and :func:`counted_all_reduce` records each all-reduce and whether its handle was waited for
(03.4 to 03.7).
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_single", "all_reduce", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "all_to_all", "all_to_all_single",
               "gather", "scatter", "reduce", "all_gather_object", "broadcast_object_list")


def namespaces_of(obj) -> list[dict]:
    """The module globals that the student's function or class ``obj`` sees (where ``from torch.distributed
    import all_reduce`` put a name)."""
    if hasattr(obj, "__globals__"):
        return [obj.__globals__]
    funcs = [v for v in vars(obj).values() if hasattr(v, "__globals__")] if isinstance(obj, type) else []
    return [funcs[0].__globals__] if funcs else []


@contextlib.contextmanager
def patched_collectives(replace, fn=None):
    """Within the block every collective of torch.distributed is ``replace(name, original)``, however the
    student's code reaches it: ``dist.all_gather``, ``dist.distributed_c10d.all_gather``, or a name imported into
    the module of ``fn`` (a function or a class: ``from torch.distributed import all_gather``)."""
    import torch.distributed.distributed_c10d as c10d

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
                space[key] = replace(originals[id(value)], value)
    try:
        yield
    finally:
        for space, key, value in reversed(saved):
            space[key] = value


def point_to_point_only(exercise, fn=None):
    """Within the block every collective raises, naming itself (send/recv still work), however it is reached
    (:func:`patched_collectives`)."""
    def forbidden(name, original):
        def call(*args, **kwargs):
            raise RuntimeError(f"exercise {exercise} allows point-to-point only, and dist.{name} was called")
        return call
    return patched_collectives(forbidden, fn)


def counted_collectives(calls: list, fn=None, carried: list | None = None):
    """Within the block every collective still runs, and its name is appended to ``calls``; with ``carried``,
    ``(name, elements)`` too, ``elements`` the element count of its first tensor argument (all_reduce: the
    tensor reduced; the ``*_single`` and ``*_tensor`` forms: the output), so that a check sees what a call
    carries, not only that it was made (07.5: an all-reduce of the whole gradient)."""
    import torch

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
            if carried is not None:
                carried.append((name, first_elements(args, kwargs)))
            return original(*args, **kwargs)
        return call
    return patched_collectives(counting, fn)


class _Handle:
    """A Work handle that records whether the student waited for it (``wait()`` or ``get_future()``). With
    ``into``: the collective works on a copy, and its result reaches the student's tensor ``into`` only when
    wait() returns or the future completes: the only moment the result is promised, so that reading the
    tensor before wait() fails every time, not when the network happens to be slow."""

    def __init__(self, work, call, into=None, copy=None):
        self._work, self._call, self._into, self._copy = work, call, into, copy

    def _deliver(self):
        if self._into is not None:
            if self._into._version != self._call.get("version", self._into._version):
                self._call["touched"] = True               # written (divided?) before the result was promised
            self._into.copy_(self._copy)

    def wait(self, *args, **kwargs):
        self._call["waited"] = True
        out = self._work.wait(*args, **kwargs)
        self._deliver()
        return out

    def get_future(self):
        self._call["waited"] = True
        fut = self._work.get_future()
        if self._into is None:
            return fut

        def delivered(f):
            f.value()                                      # raises what the collective raised
            self._deliver()
            return [self._into]
        return fut.then(delivered)

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def counted_all_reduce(state: dict, fn=None):
    """Within the block, record every all-reduce call (``dist.all_reduce``, or the name imported into ``fn``'s
    module: :func:`patched_collectives`): whether async, whether ``state["backward"]`` was set (the check sets
    it while ``loss.backward()`` runs), the tensor's storage (``storage``, its data pointer: the weights
    all-reduced instead of the gradient?) and ``elements``, and for an async call whether its handle was waited
    for and whether the tensor was written before the result was delivered (``touched``: divided before
    wait()); an async call's result reaches its tensor at wait() (or when its future completes), as promised,
    not before."""
    calls = []

    def replace(name, real):
        if name != "all_reduce":
            return real

        def counting(tensor, *args, **kwargs):
            call = {"async": bool(kwargs.get("async_op")), "in_backward": state["backward"], "waited": False,
                    "storage": tensor.untyped_storage().data_ptr(), "elements": tensor.numel()}
            calls.append(call)
            if not call["async"]:
                return real(tensor, *args, **kwargs)
            call["version"] = tensor._version              # changed before wait()? (``touched`` then)
            copy = tensor.detach().clone()                 # the result lands in ``tensor`` at wait(), not before
            return _Handle(real(copy, *args, **kwargs), call, into=tensor, copy=copy)
        return counting
    with patched_collectives(replace, fn):
        yield calls
