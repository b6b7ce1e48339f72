"""The graded coding exercises of lesson 03, your own DDP (notebooks/03_ddp.ipynb): 03.4 averaging the
gradients, 03.5 overlap, 03.6 buckets, 03.7 all of DDP in one class; 03.9 (design), DDP's bucket size chosen for
eight models and links.

03.9's check (:func:`check_bucket_cap`) asks the student's ``choose_bucket_cap_mb`` about :data:`BUCKET_CASES`,
with the bucket simulator of :mod:`mgpu_utils.costs.overlap` switched off while it runs, then scores each cap with
that simulator against the best cap (:func:`~mgpu_utils.costs.overlap.best_bucket_cap`): no timing, so the grade
is the same on a loaded laptop and in CI. A cap passes at most :data:`BUCKET_SLACK` times the best step; the
hint names the case and the mistake (one bucket, one all-reduce per gradient, the same cap for every case, a cap
that ignores the link, ...) with where the step's time goes.

Each check runs the student's code for three SGD steps on this rank's shard against DistributedDataParallel on
the same shards (:func:`against_ddp`), counts the all-reduce calls
(:func:`~mgpu_utils.measure.comm_calls.counted_all_reduce`, however they are reached: a process group's own
``allreduce`` too) against the exercise's rule (one per parameter inside backward, or one per bucket:
:func:`bucket_calls_ok`), checks that they carry this rank's own gradients (not zeros sent for show while the
gradients travel some other way), refuses torch's own DDP built inside the student's code, and names a wrong
gradient (:func:`what_the_gradient_is`). The rule of calls, their waits (each handle waited for before finish()
returns, by wait(), its future or is_completed(); none waited for inside backward, where it stops the overlap,
nor a barrier or a blocking broadcast there), when each bucket's call started (by the time the bucket was full:
how many gradients had been accumulated at each call, against the rule's fill points) and what they carry are
checked in every step, not in the first only; so is any other collective or send/recv made beside the
all-reduces (all-reduces for show while the gradients travel another way), a broadcast excepted unless made during
backward or in finish() (an eighteenth red team's 03.7 x02 all-reduced with ReduceOp.MAX for show and averaged by
broadcasts in finish(): each all-reduce's op must be a sum or AVG, told apart too). What the
wrapper, and the top level of the student's module, hold after each step must not grow (tensors, also in deques
and in attributes set on tensors or slots, Python numbers and bytes: a bucket kept as ``tolist()``), nor what
the whole process made in a step and still keeps after the next (:func:`_leaks`: tensors anywhere, Python objects
the garbage collector tracks; a fourteenth red team's lists on a module object or a class that says it is
another module's), nor the hooks on the model.
In 03.7 every rank but 0 starts from other weights, an integer buffer and a non-persistent one (not in
``state_dict()``) too, which the wrapper must broadcast, as DDP does every parameter and buffer. The
hints of the problems they report, the exercises' records and the step times said on success are here too.

Known limits, of any grader: code that does the work only at the world sizes graded (2 and 3) or only when it sees
the grader (its call stack, its file names) is not told apart: a check sees what it runs (a fifteenth red team's
03.7, 07.5 and 07.6 z01/z02 switch at 4 ranks and more). Known limits (03.7): a callback on an all-reduce's future
that parks the thread running the collectives until finish() (a sixteenth red team's 03.7 v04) never parks under the
grader, whose futures deliver their results at wait(): it is not seen. The exercise asks for models whose trainable
parameters all get a gradient every step (DDP's default), so no model has an unused parameter, and a wrapper that
counts hooks to close the last bucket, or asserts every gradient is there, passes; a hook that sleeps until a flag
says done is not seen as a wait (a wait() or a loop on is_completed() in the hook is, and so is either in another
thread while the hook waits for that thread: joins it, or waits on an event, a future or a queue; so are, since an
eighth red team (2026-12-06), a future's wait() or a loop on its done(), and reading a functional collective's
result there); Python numbers or bytes appended to a
list older than the steps, below the top level of another module, are not told apart from a right solution (a list,
a dict or a ``functools.cache`` at the top level of the student's module, a class attribute of its classes, and what
the parameters' hooks hold in their closures and default arguments are); values hidden in exotic places (mmap,
ctypes, os.environ, thread locals) are not looked for. Writes to the c10d store from Python during a step (set, add,
append, ...: :func:`store_writes`) are a problem of their own (adv5's 037/w2: the buckets' sums dropped, the mean
exchanged through the store): the values the all-reduces deliver are not told apart from the same values that came
another way. A second red team (2026-12-05, 9 wrong files) found more that pass: a functional collective waited
inside the hook, zeros all-reduced on time while the last call carries every gradient, every all-reduce started from
autograd's final callback, a full bucket sent one gradient late (issue 55's note). A third (2026-12-05, adv3) found
7 more, now told: every bucket started from the last gradient's hook, a barrier in the hook, histories in a deque,
on the parameters or as Python floats, hooks registered at every forward, an integer buffer never broadcast. A
Python-level history of strings, or one kept in a container of another module (array, numpy), is still not counted.
A fourth (2026-12-05) found 2 more, now told: a state_dict broadcast (a non-persistent buffer is not in it), and
each all-reduce waited for in a thread that the hook joins. A fifth (adv5) found 4 more: the gradients exchanged
through the c10d store and buckets fixed in registration order, now told; waits in a callback queued for the end of
backward (as torch's DDP waits) and in a worker thread whose futures finish() waits on were judged right (the
statement says so). A ninth (2026-12-06) waited in the hook through names no patch reaches (a future's value()
polled, torch._C.Future.wait or a functional collective's wait captured at import): since then, in step 2 of the
first round, one rank starts 0.4 s late and a rank whose gradients become ready over more than 0.24 s waited,
however it waited (:data:`WAIT_DELAY`; a right backward's span is about 1 ms, at most 11 ms in 25 runs at 3 ranks
beside a busy core and a test suite); and every all-reduce started in a node autograd runs after the last gradient,
``.grad`` filled by nested backwards so that the calls' order looked on time: a gradient accumulated in another
graph task than the loss's is told (``nested_backward``, :func:`_graph_task`). A twenty-eighth (2026-12-07) held
every gradient back until backward had computed them all (03.7 k01 and k03: an autograd Function over every parameter,
or over the whole model), so that each bucket, started on time by the count of gradients, overlapped nothing; a
twenty-ninth did the same with views of the parameters made inside the model's forward (m01 to m04). A thirtieth got past a first count of
layers that finished before any gradient was accumulated (n01 to n06: the output layer's gradients let through
first, each layer's output replaced by a hook, decoy calls on detached copies). Now each layer (leaf module) of the
grader's model notes its calls' output nodes; a layer with trainable parameters must have a call in the loss's graph
that leads to them, and when each such node finishes, as many gradients must have been accumulated as in a plain
backward of the same model: two or more layers with fewer are told (``held_back``, :func:`_held_back`; 03.4 to 03.7).
Holding back one layer's gradients is not told apart. Still passing: tampers that rewrite the
grader's records. """

from __future__ import annotations

import copy
import math
import numbers
import secrets
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.data import load_data
from mgpu_utils.costs import overlap
from mgpu_utils.grading.common import (ROUTE_HINTS, CodingExercise, always, diff, held_bytes, new_objects_only,
                                      note, store_writes, switched_off, young_bytes)
from mgpu_utils.measure.comm_calls import (TORCH_DDP, add_content, built, carries, content_of, counted_all_reduce,
                                           how_differs, named_content, namespaces_of)
from mgpu_utils.models import TiedMLP, make_mlp


def check_average_gradients(fn, ctx, problems):
    """03.4: ``fn(model)`` after backward against DDP: gradients after step 1, parameters after 3 SGD steps."""
    class AfterBackward:
        def __init__(self, model):
            self.model = model

        def finish(self):
            fn(self.model)
    return against_ddp(AfterBackward, ctx, problems, lambda calls, ready, own: None, fn=fn)


def every_rank_gradients(model, x, y, world) -> list[dict]:
    """Each rank's own gradients (name -> tensor) of ``model`` on its shard ``x[r::world]``, computed here on a
    copy: what a rank holds after backward and before any communication. Used to name a wrong result."""
    grads = []
    for r in range(world):
        m = copy.deepcopy(model)
        F.cross_entropy(m(x[r::world]), y[r::world]).backward()
        grads.append({n: q.grad.detach().clone() for n, q in m.named_parameters() if q.grad is not None})
    return grads


def what_the_gradient_is(got, locals_, rank, tol=1e-5) -> dict:
    """Which wrong result ``got`` is, given every rank's own gradient ``locals_``: ``copied_from`` (another
    rank's own gradient, or it divided by the world size: a broadcast), ``max_over_ranks`` (the element-wise
    maximum, or it divided: ReduceOp.MAX), ``own_over_world`` (this rank's own divided: the all-reduce's result
    was not kept). Empty when none fits."""
    world = len(locals_)
    for s, g in enumerate(locals_):
        if s != rank and min(diff(got, g), diff(got, g / world)) < tol:
            return {"copied_from": s}
    top = torch.stack(locals_).amax(0)
    if min(diff(got, top), diff(got, top / world)) < tol:
        return {"max_over_ranks": True}
    if world > 1 and diff(got, locals_[rank] / world) < tol:
        return {"own_over_world": True}
    return {}


def against_ddp(make_sync, ctx, problems, check_calls, model_fn=None, perturb=False, fn=None, delay=0.0):
    """Three SGD steps of ``make_sync(model)`` (backward, then ``.finish()``) against DDP on the same shards;
    ``check_calls(calls, ready_bytes, own)`` returns a problem dict or None for a step's all-reduce calls
    (``ready_bytes``: each gradient's bytes, in the order autograd completed them; ``own``: their contents). ``model_fn``: the model
    (default an MLP); ``perturb``: every rank but 0 starts from other weights, as ranks seeded apart do (DDP
    broadcasts rank 0's; so must a wrapper). A wrapper that is a Module runs the forward (``sync(x)``). ``fn``:
    the student's class, whose module's ``all_reduce`` (imported by name) is counted too. Every step, the
    all-reduces together must carry this rank's own gradients (:func:`~mgpu_utils.measure.comm_calls.carries`:
    in any bucketing, divided by the world size first or not; recorded by the hooks that also record the ready
    order, before the student's run); and torch's own DistributedDataParallel built by the student's code is a
    problem of its own (``torch_ddp``). ``delay`` (seconds; 03.7's first round): in step 2 the last rank starts
    its forward that late, and a rank whose gradients became ready over more than :data:`WAITED_SHARE` of it
    (from the first to the last, the grader's hooks timing them) waited in a hook for an all-reduce, whatever the
    way (``waited_in_backward``, ``how="timed"``: a ninth red team's waits through a future's value() polled, a
    functional collective's wait captured at import, torch._C.Future.wait, 2026-12-06); DDP's own wait in the
    final callback of the backward, after the last gradient, is not in that span. A rank where, in two steps, at
    least two, and at least half, of the all-reduces started in hooks finished while the hook that started them
    still ran (``held``: :func:`~mgpu_utils.measure.comm_calls._watch_held`) waited there too (``how="held"``: a
    twentieth red team's 03.7 z03, an Event set by the future's callback, waited 0.04 s at most, under the timed
    probe; none of 648 steps of the worked solution with a core busy; one step in 8 gradings of a right one that
    makes the next bucket's buffer after starting the call: one step is chance, two are not)."""
    world, rank = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    mine = model_fn() if model_fn else make_mlp(32, 2)
    ddp = DDP(copy.deepcopy(mine))
    if perturb:
        with torch.no_grad():
            for q in list(mine.parameters()) + list(mine.buffers()):
                q.add_(0.01 * rank if q.is_floating_point() else rank)   # an integer buffer moved apart too
    ready, own = [], []
    state = {"backward": False, "progress": lambda: len(ready), "stamps": [], "delay": delay,
             "tasks": [], "main_task": None}   # each all-reduce:
                                                          # how many gradients were in; when each was ready
    def accumulated(q):                                   # registered first: fires first, records the order
        state["stamps"].append(time.perf_counter())
        state["tasks"].append(_graph_task())
        ready.append(q.grad.numel() * q.grad.element_size())
        own.append(content_of(q.grad))                    # this rank's own gradient, before the student's hooks
    for q in mine.parameters():
        if q.requires_grad:                               # a frozen parameter has no gradient, and no hook
            q.register_post_accumulate_grad_hook(accumulated)
    with built(TORCH_DDP) as torch_built, new_objects_only():   # torch's DDP built by the student's code (ours
        return _steps(mine, ddp, make_sync, ctx, problems, check_calls, perturb, fn, ready, own, state,
                      torch_built)


def _steps(mine, ddp, make_sync, ctx, problems, check_calls, perturb, fn, ready, own, state, torch_built):
    """against_ddp's three steps, the wrapper built first (see there)."""
    world, rank = ctx.world_size, ctx.rank
    frozen = [n for n, q in mine.named_parameters() if not q.requires_grad]
    x_all, y_all = load_data()[0][:48]
    order = _layer_order(mine, x_all.flatten(1)[ctx.rank::ctx.world_size], y_all[ctx.rank::ctx.world_size])
    layers = _watch_layers(mine, state)                   # each layer call's node, before the student's hooks
    ours = _hook_count(mine)                              # the grader's own hooks (the ready order)
    try:
        sync = make_sync(mine)
    except RuntimeError as e:                             # a hook on a frozen parameter: torch refuses it
        if not frozen or "require" not in str(e):
            raise
        return note(problems, {"rank": rank, "kind": "frozen", "param": frozen[0], "error": str(e).splitlines()[0]})
    if perturb:                                           # after the wrapper: every rank holds rank 0's weights?
        pairs = list(zip(mine.parameters(), ddp.module.parameters())) + list(zip(mine.buffers(),
                                                                                ddp.module.buffers()))
        apart = torch.tensor([float(max(diff(q.detach(), d.detach()) for q, d in pairs) > 0)])
        dist.all_reduce(apart)                            # known on every rank, rank 0 too
        if apart.item():                                  # the same weights on every rank, only not rank 0's?
            flat = torch.cat([q.detach().reshape(-1).double() for q, _ in pairs])
            low, high = flat.clone(), flat.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            names = [n for n, _ in mine.named_parameters()] + [n for n, _ in mine.named_buffers()]
            sizes = [q.numel() for q, _ in pairs]         # which tensors still differ between the ranks
            apart_now = [(n, q) for n, (q, _), a, b in zip(names, pairs, low.split(sizes), high.split(sizes))
                         if diff(a, b) > 0]
            integer = [(n, q) for n, q in apart_now if not q.is_floating_point()]
            saved = set(mine.state_dict())                # a buffer registered with persistent=False is not
            hidden = [n for n, _ in apart_now if n not in saved]
            note(problems, {"rank": rank, "kind": "broadcast", "agree": diff(low, high) == 0,
                            **({"buffer": integer[0][0], "dtype": str(integer[0][1].dtype).replace("torch.", "")}
                               if integer and len(integer) == len(apart_now) else {}),
                            **({"non_persistent": hidden[0]} if hidden and len(hidden) == len(apart_now) else {})})
    x_all, y_all = load_data()[0][:48]
    x, y = x_all.flatten(1)[rank::world], y_all[rank::world]
    shard_grads = every_rank_gradients(mine, x_all.flatten(1), y_all, world)     # before any step
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (mine, ddp)]
    times, held, held_outside, hooked, later = {"yours_ms": [], "ddp_ms": []}, [], [], [], None
    held_process, leaked, held_steps = [], None, []
    spaces = namespaces_of(fn) if fn is not None else []
    outside = [{k: v for k, v in space.items() if not k.startswith("__")}   # the student's module's globals,
               for space in spaces] + [                                     # its classes' attributes
        dict(vars(v)) for space in spaces for v in space.values()
        if isinstance(v, type) and v.__module__ == space.get("__name__")]
    hooks = [h for q in mine.parameters() for h in (getattr(q, "_post_accumulate_grad_hooks", None) or {},
                                                     getattr(q, "_backward_hooks", None) or {})]
    for step in range(3):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        ready.clear()
        own.clear()
        state["stamps"].clear()
        state["tasks"].clear()
        before = content_of(list(mine.parameters()))     # the weights: all-reduced instead of the gradients?
        late = state["delay"] if step == 1 and world > 1 else 0.0
        if late:                                          # the last rank starts late: a hook that waits for its
            dist.barrier()                                # all-reduce holds this rank's backward that long
            if rank == world - 1:
                time.sleep(late)
        t0 = time.perf_counter()
        state["layer_calls"], state["layers"] = [], None
        with counted_all_reduce(state, fn) as calls, store_writes() as stored:
            state["backward"] = True
            loss = F.cross_entropy((sync if isinstance(sync, torch.nn.Module) else mine)(x), y)
            loss.register_hook(lambda g: state.__setitem__("main_task", _graph_task()))
            _watch_layer_nodes(loss, state, mine)
            state["in_loss_backward"] = True
            try:
                loss.backward()
            finally:
                state["in_loss_backward"] = False
            state["backward"] = False
            local = [q.grad.clone() if q.grad is not None else None for q in mine.parameters()]
            state["finishing"] = True                     # a broadcast in finish() moves gradients: "others"
            try:
                sync.finish()
            finally:
                state["finishing"] = False
        t1 = time.perf_counter()
        hooked.append(_hook_count(mine) - ours)           # hooks registered anew every step, never removed?
        held.append(held_bytes([sync, hooks], exclude=list(mine.parameters()), python=True))   # the wrapper, its
        held_outside.append(held_bytes(outside, exclude=list(mine.parameters()), python=True))  # hooks, its module
        held_process.append(young_bytes(held_process))               # and anywhere else in the process
        leaked = leaked or _leaks(held_process)           # (read now: a step's tensors are gone after the next)
        F.cross_entropy(ddp(x), y).backward()
        times["yours_ms"].append(1e3 * (t1 - t0))
        times["ddp_ms"].append(1e3 * (time.perf_counter() - t1))
        carried = _carried(calls, own, before, world, step)
        if carried and later is None:
            later = {"rank": rank, **carried}
        at = ("", " in step 2 of 3, after step 1 passed", " in step 3 of 3, after steps 1 and 2 passed")[step]
        if step == 0 and torch_built:                     # its reducer's all-reduces may leave nothing else wrong
            note(problems, {"rank": rank, "kind": "torch_ddp", "what": torch_built[0]})
        unwaited = sum(c["async"] and not c["waited"] for c in calls)
        if unwaited:                                      # first: unwaited work can also leave a gradient wrong
            note(problems, {"rank": rank, "kind": "unwaited", "started": sum(c["async"] for c in calls),
                            "unwaited": unwaited, "at": at})
        given = [n for n, q in mine.named_parameters() if not q.requires_grad and q.grad is not None]
        if given:                                         # DDP leaves a frozen parameter's .grad None
            note(problems, {"rank": rank, "kind": "frozen_grad", "param": given[0], "at": at})
        if step == 0:
            weights = {q.untyped_storage().data_ptr() for q in mine.parameters()}
            for (name, q), d, g in zip(mine.named_parameters(), ddp.parameters(), local):
                if d.grad is None:                        # frozen: DDP leaves it alone (the weights are compared)
                    continue
                if q.grad is None or diff(q.grad, d.grad) > 1e-6:
                    got = q.grad if q.grad is not None else torch.zeros_like(d.grad)
                    note(problems, {"rank": rank, "kind": "grad", "param": name, "max_diff": diff(got, d.grad),
                                    "summed": diff(got, world * d.grad) < 1e-5,
                                    "local": g is not None and diff(got, g) == 0, "reduces": len(calls),
                                    "async_calls": sum(c["async"] for c in calls),
                                    "touched": any(c.get("touched") for c in calls),
                                    "on_weights": sum(c["storage"] in weights for c in calls),
                                    "carried": sum(c["elements"] for c in calls),
                                    "total": sum(p.numel() for p in mine.parameters() if p.requires_grad),
                                    **what_the_gradient_is(got, [s[name] for s in shard_grads], rank)})
        how = [c["waited_in_backward"] for c in calls if c.get("waited_in_backward")]
        if how:                                           # waited in a hook: backward stopped, nothing overlapped
            note(problems, {"rank": rank, "kind": "waited_in_backward", "blocked": len(how), "at": at,
                            "how": str(how[0]), "started": sum(c["async"] for c in calls)})
        span = state["stamps"][-1] - state["stamps"][0] if len(state["stamps"]) > 1 else 0.0
        if late and rank != world - 1 and span > WAITED_SHARE * late and not how:
            note(problems, {"rank": rank, "kind": "waited_in_backward", "how": "timed", "at": at, "late": late,
                            "span": span, "blocked": 1, "started": sum(c["async"] for c in calls)})
        nested = sum(t != state["main_task"] for t in state["tasks"])
        if nested and state["main_task"] is not None and not how:   # handed to .grad by a backward of its own
            note(problems, {"rank": rank, "kind": "nested_backward", "at": at, "n": nested,
                            "total": len(state["tasks"])})
        held_back = None if how or nested else _held_back(state, order, layers)
        if held_back:                                     # every gradient held back until backward was over
            note(problems, {"rank": rank, "at": at, **held_back})
        if state["blocking"]:                             # a barrier in a hook: as blocking as a wait() there
            note(problems, {"rank": rank, "kind": "blocked_in_backward", "at": at, "n": len(state["blocking"]),
                            "what": ", ".join(sorted(set(state["blocking"])))})
        in_hooks = sum(bool(c["async"] and c["in_backward"]) for c in calls)   # started in a hook, and those
        kept = sum(bool(c.get("held")) for c in calls)                         # that finished before it returned
        if (not how and not state["blocking"] and not (late and span > WAITED_SHARE * late and rank != world - 1)
                and kept >= 2 and 2 * kept >= in_hooks):  # most finished while their hook still ran, however held
            held_steps.append(step)                       # in two steps: a hook that does some work after its
        if len(held_steps) >= 2 and held_steps[-1] == step:       # call may outlive it now and then (1 step
            note(problems, {"rank": rank, "kind": "waited_in_backward", "how": "held", "blocked": kept, "at": at,
                            "started": in_hooks, "steps": len(held_steps)})   # in 8 gradings of a right one)
        bad = check_calls(calls, list(ready), list(own))             # every step: a rule kept in step 1 only is not kept
        if bad:
            note(problems, {"rank": rank, "at": at, **bad})
        if step == 0 and carried:                         # the right gradients and calls, but not through them
            note(problems, {"rank": rank, **carried})
        ops = sorted({c["op"] for c in calls if c.get("op") not in (None, "SUM", "AVG")})
        if ops:                                           # MAX for show, the mean made another way (03.7 x02)
            note(problems, {"rank": rank, "kind": "reduce_op", "at": at, "op": ops[0],
                            "n": sum(c.get("op") == ops[0] for c in calls), "calls": len(calls)})
        if calls and state["others"]:                     # all-reduces for show, the gradients moved another way?
            note(problems, {"rank": rank, "kind": "others", "at": at, "calls": len(calls),
                            "what": ", ".join(sorted(set(state["others"]))), "n": len(state["others"])})
        if stored:                                        # the gradients carried through the c10d store?
            note(problems, {"rank": rank, "kind": "store", "at": at, "keys": len(stored),
                            "bytes": sum(stored.values()), "calls": len(calls)})
        found = torch.tensor([float(bool(problems))])
        dist.all_reduce(found)                            # every rank stops together once any rank found one:
        if found.item():                                  # a wrong solution may not survive more steps
            break
        for opt in opts:
            opt.step()
    worst = max(diff(q, d) for q, d in zip(mine.parameters(), ddp.module.parameters()))
    if worst > 1e-6:
        note(problems, {"rank": rank, "kind": "param", "max_diff": worst})
    elif len(hooked) == 3 and hooked[2] > hooked[1] > hooked[0]:
        note(problems, {"rank": rank, "kind": "hooks_grow", "hooks": hooked})
    elif _grows(held):
        note(problems, {"rank": rank, "kind": "growth", "bytes": held})
    elif _grows(held_outside):
        note(problems, {"rank": rank, "kind": "growth", "bytes": held_outside, "outside": True})
    elif leaked:
        note(problems, {"rank": rank, "kind": "growth", "process": True, "bytes": leaked})
    elif later is not None:                               # a later step's all-reduces carried something else
        note(problems, later)
    return {k: statistics.median(v) for k, v in times.items()}       # forward + backward + communication


def _watch_layers(model: torch.nn.Module, state: dict) -> list:
    """A forward hook on every leaf module of the grader's ``model`` (registered before the student's wrapper sees
    it, so it runs before any hook of theirs) that notes each call's output node in ``state["layer_calls"]``, as
    ``(layer index, node)``, unless the loss's backward is running (a whole-model Function that runs the model
    again inside its backward: not the step's forward). Returns the layers, ``(name, module)``, in that index."""
    layers = [(n, m) for n, m in model.named_modules() if not list(m.children())]
    index = {id(m): k for k, (_, m) in enumerate(layers)}

    def after(module, args, output):
        node = getattr(output, "grad_fn", None) if isinstance(output, torch.Tensor) else None
        if node is not None and not state.get("in_loss_backward") and state.get("layer_calls") is not None:
            state["layer_calls"].append((index[id(module)], node))
    for _, m in layers:
        m.register_forward_hook(after)
    return layers


def _layer_order(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """A plain backward of a copy of the grader's ``model`` (no wrapper, before any student code ran on it): per
    layer index, how many gradients had been accumulated when the layer's output node finished (a layer called
    several times: its first call to finish). What a right DDP's backward also shows, as its hooks add no node."""
    state = {"layer_calls": [], "layers": None}
    ref = copy.deepcopy(model)
    _watch_layers(ref, state)
    ready = []
    for q in ref.parameters():
        if q.requires_grad:
            q.register_post_accumulate_grad_hook(lambda q: ready.append(1))
    state["progress"] = lambda: len(ready)
    loss = F.cross_entropy(ref(x), y)
    _watch_layer_nodes(loss, state, ref)
    loss.backward()
    return dict(state["layers"]["acc"])


def _watch_layer_nodes(loss: torch.Tensor, state: dict, model: torch.nn.Module) -> None:
    """Before the loss's backward: for each layer call (:func:`_watch_layers`) whose output node is in the loss's
    graph and leads (through the graph) to the accumulation of every trainable parameter its layer holds, a hook
    that notes how many gradients had been accumulated when the node finished (``state["progress"]()``). In
    ``state["layers"]``: ``{"acc": {layer: the least such count}, "reaching": {layers with such a call}}``."""
    seen, todo, graph = set(), [loss.grad_fn] if loss.grad_fn is not None else [], {}
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        graph[id(node)] = node
        todo.extend(n for n, _ in node.next_functions)

    def leaves_under(node) -> set:
        """The ids of the parameters whose accumulation ``node`` leads to."""
        found, stack, visited = set(), [node], set()
        while stack:
            n = stack.pop()
            if n is None or id(n) in visited:
                continue
            visited.add(id(n))
            variable = getattr(n, "variable", None)
            if isinstance(variable, torch.Tensor):
                found.add(id(variable))
            stack.extend(m for m, _ in n.next_functions)
        return found
    layers = [m for _, m in (n_m for n_m in model.named_modules() if not list(n_m[1].children()))]
    acc, reaching = {}, set()
    state["layers"] = {"acc": acc, "reaching": reaching}

    def watch(layer):
        def ran(grad_inputs, grad_outputs):
            acc[layer] = min(acc.get(layer, 1 << 30), state["progress"]())
        return ran
    for layer, node in state.get("layer_calls") or []:
        if id(node) not in graph:
            continue
        own = {id(q) for q in layers[layer].parameters(recurse=False) if q.requires_grad}
        if own <= leaves_under(node):
            reaching.add(layer)
            node.register_hook(watch(layer))


def _held_back(state: dict, reference: dict, layers: list) -> dict | None:
    """After a step's backward, against :func:`_layer_order`'s ``reference``: a ``held_back`` problem where a layer
    with trainable parameters has no call in the loss's graph that leads to them (its output replaced by a hook,
    computed on copies, or the forward run without autograd: a twenty-eighth red team's 03.7 k01, a thirtieth's
    n03 and n06), or where two or more layers finished their backward with fewer gradients accumulated than in a
    plain backward (held back until backward was over: an autograd Function, views or a torch.cat over the
    parameters, made before the layers use them; a twenty-eighth red team's 03.7 k03, a twenty-ninth's m01 to m04,
    a thirtieth's n01 and n02, where the output layer's gradients went through first). A right DDP adds no node
    between a layer and its parameters: every layer's count is the plain backward's."""
    got = state.get("layers") or {"acc": {}, "reaching": set()}
    for k, (name, m) in enumerate(layers):
        if any(q.requires_grad for q in m.parameters(recurse=False)) and k not in got["reaching"]:
            return {"kind": "held_back", "how": "unused", "layer": name or "0"}
    lower = [k for k, want in reference.items() if k in got["acc"] and got["acc"][k] < want]
    if len(lower) >= 2:
        k = lower[-1]
        return {"kind": "held_back", "how": "late", "lower": len(lower), "layers": len(reference),
                "layer": layers[k][0], "got": got["acc"][k], "want": reference[k]}
    return None


def _graph_task():
    """The id of the autograd graph task running now (-1 outside one; None where torch lacks the call): a gradient
    accumulated by a backward started inside the step's backward (``torch.autograd.backward`` in a hook or an
    autograd Function) carries another id than the loss's (a ninth red team's 03.7 w01 and w14, 2026-12-06: every
    all-reduce started in a node that runs after the last gradient, the gradients handed to ``.grad`` one at a time
    by nested backwards so that the order of the calls looked on time)."""
    get = getattr(torch._C, "_current_graph_task_id", None)
    return get() if get is not None else None


def _hook_count(model: torch.nn.Module) -> int:
    """The hooks on ``model``'s parameters (post-accumulate-grad and tensor hooks) and on its modules (forward,
    backward and their pre-hooks): a number that stays the same from step to step in a wrapper that registers
    its hooks once."""
    n = sum(len(getattr(q, name, None) or {}) for q in model.parameters()
            for name in ("_post_accumulate_grad_hooks", "_backward_hooks"))
    return n + sum(len(getattr(m, name, None) or {}) for m in model.modules()
                   for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def _grows(held: list) -> bool:
    """Whether the bytes held after each of three steps grow every step, by more than 1 KiB in all."""
    return len(held) == 3 and held[2] > held[1] > held[0] and held[2] - held[0] > 1024


def _leaks(held: list) -> list | None:
    """Whether what the process made and keeps (:func:`~mgpu_utils.grading.common.young_bytes` after each of three
    steps: Python's bytes, and the tensors by weak reference) grows: more than 512 bytes of tensors made in step 2
    still alive after step 3 and more than 512 bytes made in step 3; or Python's bytes up by more than 8 kB in each
    step (a right solution's grow by 4 to 14 kB from step 1 to 2, as torch's DDP beside it settles, then by 2 to
    3.3 kB: the grader's own lists of times and calls). Returns the bytes read after each step when it grows, else
    None; read right after step 3."""
    if len(held) != 3:
        return None
    (p1, t1), (p2, t2), (p3, t3) = held

    def new(now: dict, before: dict) -> dict:               # an id reused by a new object is new
        return {k: v for k, v in now.items() if k not in before or before[k][0]() is not v[0]()}
    kept = sum(n for ref, n in new(t2, t1).values() if ref() is not None)
    made = sum(n for ref, n in new(t3, t2).values() if ref() is not None)
    if kept > 512 and made > 512 or p3 - p2 > 8192 and p2 - p1 > 8192:
        return [p + sum(n for _, n in t.values()) for p, t in held]    # the bytes read after each step
    return None


def _carried(calls: list, own: list, weights, world: int, step: int) -> dict | None:
    """A problem dict when the all-reduces of a step (``calls``, each with its ``content``) did not carry this
    rank's own gradients (``own``: each gradient's :func:`~mgpu_utils.measure.comm_calls.content_of` as it was
    accumulated), in any bucketing and divided by the world size first or not; None when they did, or when no
    all-reduce ran (a rule of calls, or the gradients, tell that). ``weights``: the parameters' content, to name
    an all-reduce of the weights."""
    if not calls:
        return None
    got, want = add_content(c["content"] for c in calls), add_content(own)
    if carries(got, want, world):
        return None
    return {"kind": "carried", "step": step + 1, "calls": len(calls), "elements": got.elements,
            "what": named_content(got, world, weights=weights), "got": got.squares, "want": want.squares,
            "differs": how_differs(got, want, world),
            "zero_calls": sum(c["content"].absolute == 0 for c in calls)}


def check_overlap(cls, ctx, problems):
    """03.5: ``cls(model)`` with ``.finish()``: DDP's result, one async all-reduce per parameter inside backward."""
    def calls_ok(calls, ready, own):
        inside = sum(c["in_backward"] and c["async"] for c in calls)
        if len(calls) != len(ready) or inside != len(ready):
            return {"kind": "overlap", "params": len(ready), "calls": len(calls), "inside_async": inside}
    return against_ddp(cls, ctx, problems, calls_ok, fn=cls)


def expected_buckets(ready_bytes: list, bucket_bytes: int, strict: bool = False) -> int:
    """All-reduce calls under 03.6's rule: gradients join the open bucket in ready order; it is sent when it
    holds at least ``bucket_bytes``; what is left is sent at the end. ``strict``: sent only when it holds more
    than ``bucket_bytes`` (``>``, a mistake: a bucket that reaches it exactly stays open)."""
    calls = held = 0
    for b in ready_bytes:
        held += b
        if held > bucket_bytes or (held == bucket_bytes and not strict):
            calls, held = calls + 1, 0
    return calls + (held > 0)


def bucket_calls_ok(calls: list, ready: list, bucket_bytes: int, own: list | None = None) -> dict | None:
    """03.6's and 03.7's rule for a step's all-reduce ``calls``: one asynchronous call per bucket, each carrying
    the gradients of one of the rule's buckets (with ``own``, each gradient's content in ready order: packed in
    the order the gradients became ready, not in one fixed in advance), and every bucket that fills up during
    backward started there (from the hook, overlapping the rest of backward), not in finish(). A problem dict,
    or None."""
    want = expected_buckets(ready, bucket_bytes)
    if len(calls) != want or not all(c["async"] for c in calls):
        return {"kind": "buckets", "calls": len(calls), "want": want, "bucket_bytes": bucket_bytes,
                "ready_bytes": ready, "all_async": all(c["async"] for c in calls),
                "strict": len(calls) == expected_buckets(ready, bucket_bytes, strict=True) != want,
                "zero_calls": sum(c["content"].absolute == 0 for c in calls if "content" in c)}
    fills = [i for i, _ in _full_buckets(ready, bucket_bytes)]
    inside = sum(c["in_backward"] for c in calls)
    if inside < len(fills):
        return {"kind": "late_buckets", "inside": inside, "full": len(fills), "bucket_bytes": bucket_bytes}
    world = dist.get_world_size()                         # each call one of the rule's buckets, in any order
    if (own is not None and len(own) == len(ready) and all("content" in c for c in calls)    # (the gradients
            and carries(add_content(c["content"] for c in calls), add_content(own), world)):  # all carried)
        bounds = [0] + [i for i, _ in _full_buckets(ready, bucket_bytes)]
        bounds += [len(ready)] if bounds[-1] < len(ready) else []
        left = [add_content(own[a:b]) for a, b in zip(bounds, bounds[1:])]
        for k, c in enumerate(calls):
            match = next((j for j, want in enumerate(left) if carries(c["content"], want, world)), None)
            if match is None:
                return {"kind": "bucket_content", "call": k + 1, "calls": len(calls), "bucket_bytes": bucket_bytes,
                        "ready_bytes": ready}
            left.pop(match)
    started = sorted(c["progress"] for c in calls if c.get("progress") is not None)
    if len(started) == len(calls):                        # each bucket's call started by the time it was full?
        for k, (fill, start) in enumerate(zip(fills, started)):
            if start > fill:
                return {"kind": "bucket_late", "bucket": k + 1, "fill": fill, "start": start,
                        "gradients": len(ready), "bucket_bytes": bucket_bytes}


def _full_buckets(ready_bytes: list, bucket_bytes: int):
    """The buckets that reach ``bucket_bytes`` during backward (03.6's rule), one item each: (how many gradients
    had been accumulated when it filled, the bytes of the gradient that filled it)."""
    held = 0
    for i, b in enumerate(ready_bytes):
        held += b
        if held >= bucket_bytes:
            held = 0
            yield i + 1, b


def check_buckets(cls, ctx, problems, bucket_bytes=(2048, 1 << 20)):
    """03.6: ``cls(model, b)`` with ``.finish()``: DDP's result, one all-reduce per bucket of the rule, each full
    one started during backward, for each bucket size b: 2 KiB gives full buckets only (the last gradient is
    the largest), 1 MiB one bucket that is still open when backward ends (only finish() can send it)."""
    times = [against_ddp(lambda model: cls(model, b), ctx, problems, lambda c, r, o: bucket_calls_ok(c, r, b, o), fn=cls)
             for b in bucket_bytes]
    return times[0]


def frozen_mlp() -> torch.nn.Sequential:
    """03.7's MLP with its first layer's weight frozen (``requires_grad=False``, as in fine-tuning): it has no
    gradient, DDP leaves it out of its buckets (and still broadcasts it), and so must a wrapper."""
    model = make_mlp(32, 2)
    model[0].weight.requires_grad_(False)
    return model


def counted_tied_mlp() -> TiedMLP:
    """03.7's :class:`TiedMLP` (a float buffer, ``centre``) with an integer buffer too (``steps``, int64, as
    BatchNorm's ``num_batches_tracked``), which DDP broadcasts as it does every buffer: a wrapper that broadcasts
    only the floating-point tensors leaves it apart; and a non-persistent one (``inv_freq``, registered with
    ``persistent=False``, as a rotary embedding's inverse frequencies), which DDP broadcasts too
    (``module.buffers()``) but ``state_dict()`` leaves out: a wrapper that broadcasts the state_dict's tensors
    leaves it apart."""
    model = TiedMLP()
    model.register_buffer("steps", torch.arange(3, dtype=torch.int64))
    model.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8), persistent=False)
    return model


class Float64MLP(torch.nn.Module):
    """03.7's MLP in float64 (its input cast in, its output cast back to float32): gradients of 8 bytes per
    element, where a bucket counted as 4 bytes per element (right only for float32) holds twice what it should."""

    def __init__(self):
        super().__init__()
        self.mlp = make_mlp(32, 2).double()

    def forward(self, x):
        return self.mlp(x.double()).float()


class ReorderedMLP(torch.nn.Module):
    """03.7's MLP with its layers registered in another order than its forward uses them (registered ``a``,
    ``c``, ``b``; used ``c``, ``a``, ``b``): backward makes ``b``'s gradients first, then ``a``'s, then ``c``'s,
    not the reverse of the registration order (``b``, ``c``, ``a``). With buckets of 1,448 bytes, buckets laid
    out in advance from the registration order (DDP's first guess, which it rebuilds from the order it saw) are
    b's gradients with c's bias, c's weight, a's: other buckets than 03.6's rule gives (b's with a's bias, a's
    weight, c's), which packs the gradients in the order they become ready."""

    def __init__(self):
        super().__init__()
        self.a, self.c, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(64, 32), torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(torch.relu(self.c(x)))))


#: 03.7's rounds: (model, bucket_bytes; None: make_mlp(32, 2)). 1,448 bytes is the MLP's first three gradients
#: exactly (40 + 1,280 + 128, in ready order): that bucket is full (at least bucket_bytes), sent then, not with the
#: next gradient; 1 MiB leaves one bucket open when backward ends (only finish() can send it). In float64, 2,896
#: bytes is again the first three gradients: 3 buckets, where 4 bytes per element gives 2.
#: Seconds the last rank starts step 2's forward late in 03.7's first round (:func:`against_ddp`), and the share
#: of it over which a rank's gradients may become ready before its hooks count as waiting: a right backward of
#: the MLP takes milliseconds (under 0.05 s with a core busy), a hook that waits takes the whole delay.
WAIT_DELAY, WAITED_SHARE = 0.4, 0.6

def wide_mlp() -> torch.nn.Sequential:
    """03.7's MLP made wide: two hidden layers of a width drawn anew each grading run, 640 to 1,279 (rank 0 draws
    it with :mod:`secrets`, every rank gets it by broadcast): 0.5 to 1.7 million parameters, 2 to 7 MB of float32
    gradients in several 1 MiB buckets, where the other rounds' models have under 10,000 parameters. A wrapper that
    does DDP's work only below some size (a twelfth red team's: below 100,000 elements) fails here, wherever its
    switch sits below this one."""
    width = torch.tensor([640 + secrets.randbelow(640) if dist.get_rank() == 0 else 0])
    dist.broadcast(width, src=0)
    return make_mlp(int(width), 2)


MY_DDP_ROUNDS = ((None, 1448), (frozen_mlp, 1 << 20), (counted_tied_mlp, 2048), (TiedMLP, 1 << 20),
                 (Float64MLP, 2896), (wide_mlp, 1 << 20), (ReorderedMLP, 1448))


def check_my_ddp(cls, ctx, problems, rounds=MY_DDP_ROUNDS):
    """03.7: ``cls(model, b)``, a Module wrapping ``model``, with ``.finish()``: 03.6's rule and DDP's result
    for each round of :data:`MY_DDP_ROUNDS` (an MLP, one with a frozen weight, :class:`TiedMLP`, once with an
    integer buffer and a non-persistent one, an MLP in float64, a wide MLP of a width drawn each run), with every
    rank but 0 starting from other weights (those buffers too)."""
    for model_fn, b in rounds:
        found = torch.tensor([float(bool(problems))])
        dist.all_reduce(found)                            # every rank stops together once any rank found one
        if found.item():
            return
        times = against_ddp(lambda model: cls(model, b), ctx, problems, lambda c, r, o: bucket_calls_ok(c, r, b, o),
                            model_fn=model_fn, perturb=True, fn=cls, delay=WAIT_DELAY if model_fn is None else 0.0)
        if problems and model_fn in (TiedMLP, counted_tied_mlp) and problems[0].get("kind") != "broadcast":
            problems[0]["tied"] = True
        if problems and model_fn is Float64MLP:
            problems[0]["float64"] = True
        if problems and model_fn is ReorderedMLP:
            problems[0]["reordered"] = True
        if problems and model_fn is wide_mlp:
            problems[0]["wide"] = True
    return times


def _bucket_cases():
    """03.9's cases: (name, choose_bucket_cap_mb's arguments). The first four are named in the template; the
    last four are of the same kind, not named (a cap written down per case does not pass them)."""
    from mgpu_utils.costs.hardware import GPUS
    from mgpu_utils.costs.interconnect import link_alpha_beta
    from mgpu_utils.costs.overlap import resnet_gradients, transformer_gradients

    def case(model, n, link):
        (grad_bytes, backward_s), (alpha_s, bandwidth_bps) = model, link if isinstance(link, tuple) \
            else link_alpha_beta(link)
        return {"grad_bytes": grad_bytes, "backward_s": backward_s, "n": n, "alpha_s": alpha_s,
                "bandwidth_bps": bandwidth_bps}
    a100, h100, l4 = (GPUS[g]["bf16_tflops"] * 1e12 * 0.4 for g in ("A100", "H100", "L4"))
    ndr = "InfiniBand NDR (400 Gb/s)"
    return (
        ("ResNet-50, 64 images per GPU, 8 A100 over PCIe 4.0", case(resnet_gradients(64, a100), 8, "PCIe 4.0 x16")),
        ("ResNet-50, 32 images per GPU, 32 L4 over 100 GbE", case(resnet_gradients(32, l4), 32, "Ethernet 100 GbE")),
        ("GPT-2 small (124M), 8 x 1024 tokens per GPU, 8 A100 over NVLink",
         case(transformer_gradients(12, 768, 50257, 8 * 1024, a100), 8, "NVLink 3 (A100, 12 links)")),
        ("GPT-2 medium (untied head, bf16 gradients), 8 x 1024 tokens per GPU, 64 H100 over InfiniBand",
         case(transformer_gradients(24, 1024, 50257, 8 * 1024, h100, bytes_per_grad=2, tied=False), 64, ndr)),
        ("an unnamed case: a 1.3B decoder (bf16 gradients), 4 x 2048 tokens per GPU, 256 H100 over InfiniBand",
         case(transformer_gradients(24, 2048, 50257, 4 * 2048, h100, bytes_per_grad=2, tied=False), 256, ndr)),
        ("an unnamed case: a small ResNet (widths 16 to 128), 32 images per GPU, 16 L4 over 10 GbE",
         case(resnet_gradients(32, l4, widths=(16, 32, 64, 128)), 16, "Ethernet 10 GbE")),
        ("an unnamed case: ResNet-50, 8 images per rank, 4 CPU ranks on gloo (1 TFLOP/s, alpha 50 us, 2 GB/s)",
         case(resnet_gradients(8, 1e12), 4, (50e-6, 2e9))),
        ("an unnamed case: ResNet-101, 64 images per GPU, 16 H100 over InfiniBand",
         case(resnet_gradients(64, h100, blocks=(3, 4, 23, 3)), 16, ndr)),
    )


BUCKET_CASES = _bucket_cases()
#: 03.9 accepts a cap whose step (backward plus exposed communication) is at most this many times the best cap's.
BUCKET_SLACK = 1.10
#: choose_bucket_cap_mb's arguments, in order.
BUCKET_ARGS = ("grad_bytes", "backward_s", "n", "alpha_s", "bandwidth_bps")


def _ask(fn, case: dict, problems, rank, name):
    """The student's cap for ``case`` with the simulator off: a float, or None after noting the problem."""
    with switched_off(fn, (overlap.bucket_timeline, overlap.best_bucket_cap, overlap.distinct_caps)) as off:
        try:
            got = fn(*(case[k] for k in BUCKET_ARGS))
        except off as e:
            return note(problems, {"rank": rank, "kind": "bucket_cap", "what": "simulator", "name": str(e)})
    if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got) or got <= 0:
        return note(problems, {"rank": rank, "kind": "bucket_cap", "what": "form", "case": name,
                               "got": repr(got)[:80]})
    return float(got)


def check_bucket_cap(fn, ctx, problems):
    """03.9: ``fn(grad_bytes, backward_s, n, alpha_s, bandwidth_bps)``, a ``bucket_cap_mb`` in MiB, for every case
    of :data:`BUCKET_CASES` (simulator off), each scored by :func:`~mgpu_utils.costs.overlap.bucket_timeline`
    against :func:`~mgpu_utils.costs.overlap.best_bucket_cap`: at most :data:`BUCKET_SLACK` times the best step.
    The first case that fails is reported with what the cap did (one bucket, about one per gradient, latency,
    the last bucket's exposed all-reduce) and whether the answer moves with the model and the link (the case
    asked again with alpha x 10, and with bandwidth / 10). Returns the worst ratio."""
    caps = []
    for name, case in BUCKET_CASES:
        got = _ask(fn, case, problems, ctx.rank, name)
        if got is None:
            return None
        caps.append(got)
    worst = 0.0
    for (name, case), cap_mib in zip(BUCKET_CASES, caps):
        mine = overlap.bucket_timeline(**case, cap_bytes=cap_mib * overlap.MIB)
        _, best = overlap.best_bucket_cap(**case)
        ratio = mine.step_s / best.step_s
        worst = max(worst, ratio)
        if ratio <= BUCKET_SLACK:
            continue
        moved = [_ask(fn, {**case, **change}, problems, ctx.rank, name)       # the same case on slower links
                 for change in ({"alpha_s": case["alpha_s"] * 10}, {"bandwidth_bps": case["bandwidth_bps"] / 10})]
        if None in moved:
            return None
        n = case["n"]
        last = mine.end_s[-1] - mine.start_s[-1]
        return note(problems, {
            "rank": ctx.rank, "kind": "bucket_cap", "what": "slow", "case": name, "cap": cap_mib,
            "total_mib": sum(case["grad_bytes"]) / overlap.MIB, "buckets": len(mine.buckets),
            "gradients": len(case["grad_bytes"]), "best_buckets": len(best.buckets), "ratio": ratio,
            "step_ms": 1e3 * mine.step_s, "backward_ms": 1e3 * mine.backward_s, "exposed_ms": 1e3 * mine.exposed_s,
            "latency_ms": 1e3 * mine.latency_s, "per_call_us": 1e6 * 2 * (n - 1) * case["alpha_s"],
            "last_mib": mine.bucket_bytes[-1] / overlap.MIB, "last_ms": 1e3 * last,
            "comm_ms": 1e3 * mine.comm_s, "best_ms": 1e3 * best.step_s, "best_exposed_ms": 1e3 * best.exposed_s,
            "slack": BUCKET_SLACK, "fixed": len(set(caps)) == 1, "same_for_link": moved == [cap_mib, cap_mib],
            "bytes": _pass_as_bytes(caps),
            "latency_bound": len(mine.buckets) > len(best.buckets)
            and mine.latency_s - best.latency_s >= (mine.step_s - best.step_s) / 2})
    return {"cases": len(BUCKET_CASES), "worst": worst}


def _pass_as_bytes(caps: list) -> bool:
    """Whether the caps, read as bytes (divided by 2**20), would pass every case: a cap returned in bytes."""
    return all(overlap.bucket_timeline(**case, cap_bytes=cap).step_s
               <= BUCKET_SLACK * overlap.best_bucket_cap(**case)[1].step_s
               for (_, case), cap in zip(BUCKET_CASES, caps))


def _bucket_lines(info: dict, world: int) -> list[str]:
    """03.9's success line: the cases and the slowest step against the best cap's."""
    return [f"{info['cases']} cases; your slowest step is {info['worst']:.2f}x the best cap's (at most "
            f"{BUCKET_SLACK:.2f}x passes)"] if info else []


_WHERE = ("Your step: backward {backward_ms:.2f} ms + {exposed_ms:.2f} ms of communication exposed after it; "
          "{buckets} all-reduce(s), {latency_ms:.2f} ms of them latency ({per_call_us:.0f} us a call), the last "
          "({last_mib:.2f} MiB) taking {last_ms:.2f} ms. The best cap's step: backward + {best_exposed_ms:.2f} ms "
          "exposed")
_SLOW = ("for {case} your cap of {cap:.3g} MiB gives a step of {step_ms:.2f} ms, {ratio:.2f}x the best cap's "
         "{best_ms:.2f} ms (at most {slack:.2f}x passes). ")
BUCKET_HINTS = [
    (lambda p, W: p["what"] == "simulator",
     "03.9 asks you to choose: {name} is switched off while choose_bucket_cap_mb runs (it would choose for you; "
     "the grader scores your answer with it afterwards). Write the timeline yourself, or a rule from what a "
     "bucket costs (mgpu_utils.costs.bandwidth.ring_allreduce_model may be used)"),
    (lambda p, W: p["what"] == "form",
     "for {case} choose_bucket_cap_mb returned {got}: return one positive number, the cap in MiB (2**20 bytes) "
     "as DDP's bucket_cap_mb counts it, e.g. 25.0"),
    (lambda p, W: p["bytes"],
     _SLOW + "Read as bytes, your numbers would pass every case: bucket_cap_mb counts MiB (2**20 bytes), so "
     "divide a number of bytes by 2**20"),
    (lambda p, W: p["buckets"] == 1,
     _SLOW + "It holds the whole model ({total_mib:.1f} MiB) in one bucket, whose all-reduce ({comm_ms:.2f} ms) "
     "can only start when backward ends: none of it overlaps. Smaller buckets start sending while backward "
     "still runs"),
    (lambda p, W: p["buckets"] >= p["gradients"] / 2,
     _SLOW + "That is {buckets} buckets for {gradients} gradients, about one all-reduce per gradient, and every "
     "call pays the latency 2(n-1) alpha = {per_call_us:.0f} us: {latency_ms:.2f} ms in all, against a backward "
     "of {backward_ms:.2f} ms. Bigger buckets pay it fewer times"),
    (lambda p, W: p["fixed"],
     _SLOW + "You return {cap:.3g} MiB for every model and link: the best size depends on the gradients' sizes, "
     "on how long backward takes to produce them and on the link. " + _WHERE),
    (lambda p, W: p["same_for_link"],
     _SLOW + "Your cap stayed the same when this case's link was made slower (alpha x 10; bandwidth / 10): "
     "how many buckets pay off depends on the link, each call's latency against the time its bytes take. "
     + _WHERE),
    (lambda p, W: p["latency_bound"],
     _SLOW + "Too many buckets for this link: each pays the latency. " + _WHERE),
    (lambda p, W: p["buckets"] < p["best_buckets"],
     _SLOW + "Too few buckets: the last can only be sent when backward ends, and nothing hides its "
     "all-reduce. " + _WHERE),
    (always, _SLOW + _WHERE),
]


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "outside_routes": ROUTE_HINTS,
    "grad": [
        (lambda p, W: p.get("wide"),
         "rank {rank}: on a wide MLP ({total:,} parameters; the other models graded have under 10,000) the gradient "
         "of {param} is not DDP's (largest difference {max_diff:.3g}; world size {W}): a wrapper must average every "
         "gradient at every model size, with the same buckets and overlap as on a small one"),
        (lambda p, W: p["local"] and p.get("on_weights"),
         "rank {rank}: the gradient of {param} is still this rank's own: {on_weights} of the {reduces} all-reduce(s) "
         "were of the parameters themselves (their weights), not of p.grad (world size {W}): DDP averages the "
         "gradients, and every rank then takes the same step from the same weights"),
        (lambda p, W: p["local"] and p.get("reduces") and p["carried"] < p["total"],
         "rank {rank}: the gradient of {param} is still this rank's own: your all-reduces carried {carried:,} of the "
         "model's {total:,} gradient elements (world size {W}), not this one: every gradient must be all-reduced "
         "(with buckets: the one still open when backward ends too, sent by finish())"),
        (lambda p, W: p["local"] and p.get("reduces"),
         "rank {rank}: the gradient of {param} is still this rank's own, though {reduces} all-reduce(s) ran and "
         "carried {carried:,} elements, every gradient's (world size {W}): the means never came back: after wait(), "
         "copy each parameter's slice of the averaged bucket back into p.grad"),
        (lambda p, W: p["local"],
         "rank {rank}: the gradient of {param} is still this rank's own (world size {W}): all-reduce it over the "
         "ranks"),
        (lambda p, W: p["summed"] and p.get("touched"),
         "rank {rank}: the gradient of {param} is {W} times DDP's: it was changed (divided?) before its all-reduce's "
         "wait() returned, and the sum, which an async all-reduce writes into its tensor by the time wait() "
         "returns, replaced that (world size {W}): wait first, then divide"),
        (lambda p, W: p["summed"],
         "rank {rank}: the gradient of {param} is {W} times DDP's (world size {W}): all_reduce sums; DDP averages, "
         "so divide by the world size"),
        (lambda p, W: p.get("copied_from") is not None,
         "rank {rank}: the gradient of {param} is rank {copied_from}'s own gradient (or it divided by {W}), not the "
         "mean over the ranks: a broadcast copies one rank's gradient; all_reduce adds every rank's"),
        (lambda p, W: p.get("max_over_ranks"),
         "rank {rank}: the gradient of {param} is the element-wise maximum over the ranks (world size {W}): use "
         "all_reduce's default operation, a sum (dist.ReduceOp.SUM), then divide by the world size"),
        (lambda p, W: p.get("own_over_world") and not p.get("reduces"),
         "rank {rank}: the gradient of {param} is this rank's own divided by {W}, and no all-reduce ran: dividing "
         "is the second half; first dist.all_reduce(p.grad), which sums every rank's gradient into p.grad"),
        (lambda p, W: p.get("own_over_world") and p.get("async_calls") and not p.get("touched"),
         "rank {rank}: the gradient of {param} is this rank's own divided by {W}: the all-reduce ran on a copy, and "
         "its result never came back into p.grad: all-reduce p.grad itself, or copy the result back once wait() "
         "has returned (an async all-reduce fills its tensor only by then)"),
        (lambda p, W: p.get("own_over_world") and p.get("async_calls"),
         "rank {rank}: the gradient of {param} is this rank's own divided by {W}: the all-reduced values never "
         "reached p.grad. An async all-reduce fills its tensor only by the time wait() returns: wait for each "
         "handle first, then divide the bucket and copy it back into the gradients"),
        (lambda p, W: p.get("own_over_world"),
         "rank {rank}: the gradient of {param} is this rank's own divided by {W}: the all-reduce's result was not "
         "kept. all_reduce writes the sum into the tensor it is given: pass p.grad itself, not a copy"),
        (always, "rank {rank}: the gradient of {param} differs from DDP's by {max_diff:.3g} (world size {W})")],
    "growth": [(lambda p, W: p.get("process"),
                "rank {rank}: the result is right, but what this process keeps from the steps grows: "
                "{bytes[0]:,}, {bytes[1]:,}, {bytes[2]:,} bytes of tensors and Python objects made since your "
                "wrapper was built and still alive after steps 1, 2 and 3 (the grader looks at every object the "
                "garbage collector tracks, wherever it is kept). Something is kept from every step: in a long run "
                "it fills the memory"),
               (lambda p, W: p.get("outside"),
                "rank {rank}: the result is right, but what your module holds at its top level (outside the "
                "wrapper) grows: {bytes[0]:,}, {bytes[1]:,}, {bytes[2]:,} bytes after steps 1, 2 and 3. Something "
                "is kept from every step in a global (a list of buckets kept for debugging, a functools cache "
                "whose key changes every step?): in a long run it fills the memory"),
               (always, "rank {rank}: the result is right, but what your wrapper holds after each step grows: "
                        "{bytes[0]:,}, {bytes[1]:,}, {bytes[2]:,} bytes after steps 1, 2 and 3. Something is kept from "
                        "every step (a list of pending work never cleared, a history of buckets, as tensors, as "
                        "Python numbers or as bytes?): in a long run it fills the memory")],
    "broadcast": [(lambda p, W: p.get("non_persistent"),
                   "after your wrapper was built the ranks' buffer {non_persistent} still differed, though every "
                   "tensor of the state_dict was rank 0's (world size {W}): a buffer registered with "
                   "persistent=False is not in state_dict(). DDP broadcasts every parameter and every buffer "
                   "(module.buffers(), non-persistent ones too): broadcast those, not the state_dict's tensors"),
                  (lambda p, W: p.get("buffer"),
                   "after your wrapper was built the ranks' integer buffer {buffer} ({dtype}) still differed, though "
                   "every floating-point tensor was rank 0's (world size {W}): DDP broadcasts every buffer, integer "
                   "ones too (BatchNorm's num_batches_tracked, a step counter); broadcast each of them, in its own "
                   "dtype, not only the floating-point tensors"),
                  (lambda p, W: p.get("agree"),
                   "after your wrapper was built every rank held the same weights, but not rank 0's (world size "
                   "{W}): DDP starts every replica from rank 0's parameters and buffers, broadcast from src=0, not "
                   "from their mean or from anything else the ranks agree on"),
                  (always, "after your wrapper was built the ranks' weights still differed (world size {W}): ranks "
                           "seeded apart start apart, so DDP broadcasts rank 0's parameters (and buffers) when it "
                           "wraps the model; do the same in __init__")],
    "store": [
        (always, "rank {rank}{at}: besides your {calls} all-reduce(s), the step wrote {bytes:,} bytes under {keys} "
                 "key(s) to the process group's key-value store (store.set/add/append): the gradients must travel "
                 "in the all-reduces, whose results (the sums that wait() leaves in each bucket) become the mean "
                 "gradients; the store is for rendezvous, not data")],
    "unwaited": [(always, "rank {rank}{at}: {unwaited} of the {started} asynchronous all-reduces were never waited for "
                          "(work.wait()) before finish() returned: on NCCL the optimizer would read gradients the "
                          "all-reduce has not written yet; keep each handle and wait for it in finish()")],
    "reduce_op": [
        (always, "rank {rank}{at}: {n} of your {calls} all-reduce(s) used op=ReduceOp.{op}: DDP's mean over the ranks "
                 "is a sum (the default, ReduceOp.SUM) divided by the world size, or ReduceOp.AVG; use the result of "
                 "that all-reduce as the gradient")],
    "others": [
        (always, "rank {rank}{at}: besides your {calls} all-reduce(s), the step made {n} call(s) of {what}: DDP "
                 "moves the gradients by all-reduce alone. All-reduce each bucket and use its result, the sum over "
                 "the ranks that wait() leaves in the tensor you gave it (not in a copy sent for show)")],
    "nested_backward": [(always, "rank {rank}{at}: {n} of the {total} gradients reached .grad through a backward "
                                 "your code started inside the step's backward (torch.autograd.backward or .backward() "
                                 "in a hook or an autograd Function), not through the step's own backward: the "
                                 "all-reduces then start after the last gradient is computed, and nothing overlaps "
                                 "them. Let autograd fill .grad, start each bucket's all-reduce from the hooks as its "
                                 "gradients become ready, and wait for them in finish()")],
    "waited_in_backward": [
        (lambda p, W: p.get("how") == "thread",
         "rank {rank}{at}: {blocked} of the {started} asynchronous all-reduces were waited for during backward in "
         "another thread while the hook that started them waited for that thread (join(), a future's result()): "
         "the hook returns only when the all-reduce is done, so backward stops there and nothing overlaps it, as "
         "with a wait() in the hook; start the bucket's all-reduce, keep the handle and return, and wait for them "
         "all in finish(), after backward"),
        (lambda p, W: p.get("how") == "engine",
         "rank {rank}{at}: {blocked} of the {started} asynchronous all-reduces were waited for during backward in "
         "another thread while backward stood still inside autograd, in a hook that is not Python code (a builtin "
         "registered as a hook: a queue's get, a lock's acquire): backward went on only once the all-reduce was "
         "done, so nothing overlaps it, as with a wait() in the hook; start the bucket's all-reduce, keep the handle "
         "and return, and wait for them all in finish(), after backward"),
        (lambda p, W: p.get("how") == "timed",
         "rank {rank}{at}: another rank started its backward {late:.1f} s late, and this rank's gradients became "
         "ready over {span:.2f} s, where its backward alone takes milliseconds: a hook waited for its all-reduce "
         "(a wait(), a future's value() or result(), a functional collective's wait, however reached), so backward "
         "stopped there until the late rank joined, and nothing overlapped it; start the bucket's all-reduce, keep "
         "the handle and return, and wait for them all in finish(), after backward"),
        (lambda p, W: p.get("how") == "held",
         "rank {rank}{at}: in {steps} steps, most of the asynchronous all-reduces started in hooks finished while "
         "the hook that started them was still running ({blocked} of {started} in this one): the hook held backward until its bucket had travelled (an "
         "event set by the future's callback, a sleep until a flag changes, a lock), so nothing overlaps it, as "
         "with a wait() in the hook; start the bucket's all-reduce, keep the handle and return at once, and wait "
         "for them all in finish(), after backward"),
        (lambda p, W: p.get("how") == "poll",
         "rank {rank}{at}: {blocked} of the {started} asynchronous all-reduces were polled with is_completed() in "
         "a loop during backward, in a hook, until done: the hook returns only when the all-reduce is done, so "
         "backward stops there and nothing overlaps it, as with a wait() in the hook; keep each handle and wait "
         "for them all in finish(), after backward"),
        (always, "rank {rank}{at}: {blocked} of the {started} asynchronous all-reduces were waited for (wait()) "
                 "during backward, in a hook: wait() blocks until the all-reduce is done, so backward stops there "
                 "and nothing overlaps it, as with a blocking all-reduce; keep each handle and wait for them all in "
                 "finish(), after backward")],
    "hooks_grow": [(always, "rank {rank}: the result is right, but the model carries {hooks[0]}, {hooks[1]}, "
                            "{hooks[2]} hooks after steps 1, 2 and 3: hooks registered again at every step (in "
                            "forward?) and never removed pile up, and each backward runs them all. Register each "
                            "parameter's hook once, when the wrapper is built (or remove it with the handle that "
                            "registering returns)")],
    "blocked_in_backward": [
        (lambda p, W: "future" in p["what"] or "functional" in p["what"],
         "rank {rank}{at}: your code waited for an all-reduce's result during backward, in a hook ({n} time(s): "
         "{what}): the hook returns only when that all-reduce is done, so backward stops there and nothing overlaps "
         "it, as with a wait() in the hook; keep the future (or the functional collective's tensor) and wait for it, "
         "or read the tensor, only in finish(), after backward (a callback given to then() may read it)"),
        (always, "rank {rank}{at}: your code made {n} blocking call(s) of {what} during backward, in a hook: it "
                 "returns only when every rank has reached it (on gloo, once the all-reduces queued before it are "
                 "done), so backward stops there and nothing overlaps it, as with a wait() in the hook; start the "
                 "bucket's asynchronous all-reduce and return, and wait for the handles only in finish()")],
    "frozen": [(always, "rank {rank}: your wrapper raised \"{error}\" on a model whose {param} is frozen "
                        "(requires_grad=False, as in fine-tuning): a frozen parameter has no gradient and takes no "
                        "hook. DDP leaves it out of its buckets (and still broadcasts it): hook only the parameters "
                        "with p.requires_grad")],
    "overlap": [(always, "rank {rank}{at}: {calls} all-reduce call(s) for {params} parameters, {inside_async} of them "
                         "started inside backward with async_op=True: start one per parameter from its hook, wait in "
                         "finish()")],
    "held_back": [
        (lambda p, W: p["how"] == "unused",
         "rank {rank}{at}: no call of the model's layer {layer} in your loss's autograd graph leads to the layer's own "
         "parameters (its output replaced by a hook, computed on copies, or the forward run without autograd?): the "
         "gradients reached .grad some other way, past the layers' backward, and nothing overlapped it. Call the "
         "model itself in forward and let autograd accumulate each gradient as backward computes it, starting each "
         "all-reduce from its hook"),
        (always, "rank {rank}{at}: {lower} of the model's {layers} layers finished their backward with fewer "
                 "gradients in .grad than a plain backward has by then (layer {layer}: {got} accumulated, {want} in "
                 "a plain backward): gradients were held back until later (an autograd Function or views over the "
                 "parameters, made before the layers use them?), so the all-reduces overlapped less of backward "
                 "than they can. Use the parameters themselves in the forward, so that each gradient is accumulated "
                 "as soon as backward computes it, and start each all-reduce from its hook")],
    "buckets": [
        (lambda p, W: p.get("zero_calls"),
         "rank {rank}{at}: {calls} all-reduce call(s), {zero_calls} of them carrying nothing but zeros; the rule gives "
         "{want} for gradients of {ready_bytes} bytes in ready order and buckets of {bucket_bytes} bytes: all-reduce "
         "each bucket's gradients once, and nothing for show"),
        (lambda p, W: p["all_async"] and p.get("float64"),
         "rank {rank}{at}: on a float64 model, {calls} all-reduce call(s); the rule gives {want} for gradients of "
         "{ready_bytes} bytes in ready order and buckets of {bucket_bytes} bytes: a float64 gradient takes 8 bytes "
         "per element, not 4; count each gradient's bytes as numel() * element_size()"),
        (lambda p, W: p["all_async"] and p.get("strict"),
         "rank {rank}{at}: {calls} all-reduce call(s); the rule gives {want} for gradients of {ready_bytes} bytes in "
         "ready order and buckets of {bucket_bytes} bytes: a bucket is full when it holds at least bucket_bytes "
         "(>=, not >), so one that reaches exactly {bucket_bytes} bytes is sent then, not after the next gradient"),
        (lambda p, W: p["all_async"],
         "rank {rank}{at}: {calls} all-reduce call(s); the rule gives {want} for gradients of {ready_bytes} bytes in "
         "ready order and buckets of {bucket_bytes} bytes"),
        (always, "rank {rank}{at}: {calls} all-reduce call(s); the rule gives {want} for gradients of {ready_bytes} "
                 "bytes in ready order and buckets of {bucket_bytes} bytes; and every call must be asynchronous "
                 "(async_op=True)")],
    "frozen_grad": [(always, "rank {rank}{at}: the frozen parameter {param} (requires_grad=False) has a .grad after "
                             "finish(); DDP leaves it None, so that the optimizer skips it (no momentum, no weight "
                             "decay): give a frozen parameter no gradient and no place in a bucket")],
    "torch_ddp": [(always, "rank {rank}: your code built {what} (world size {W}): its reducer all-reduces the "
                           "gradients for you, and the exercise is to write that yourself; average the gradients "
                           "with your own all-reduces, without DDP")],
    "carried": [
        (lambda p, W: p["what"] == "zeros",
         "rank {rank}: the gradients are right, but in step {step} your all-reduces ({calls} call(s), {elements:,} "
         "elements) carried zeros, not rank {rank}'s gradients (world size {W}): the gradients reached the other "
         "ranks some other way (send/recv?). All-reduce the gradients themselves, the calls the exercise counts"),
        (lambda p, W: p["what"] == "weights",
         "rank {rank}: the gradients are right, but in step {step} your all-reduces ({calls} call(s)) carried the "
         "weights, not rank {rank}'s gradients (world size {W}): all-reduce the gradients themselves"),
        (always, "rank {rank}: the gradients are right, but in step {step} your all-reduces ({calls} call(s), "
                 "{elements:,} elements) did not carry rank {rank}'s gradients: {differs} (world size {W}). "
                 "Each all-reduce must carry gradients (divided by the world size or not), every gradient once, and "
                 "nothing else")],
    "bucket_content": [
        (lambda p, W: p.get("reordered"),
         "rank {rank}{at}: on a model whose forward uses its layers in another order than it registers them "
         "(registered a, c, b; used c, a, b), your all-reduce {call} of {calls} carried other gradients than a "
         "bucket of the rule (gradients of {ready_bytes} bytes in ready order, buckets of {bucket_bytes} bytes): "
         "backward makes b's gradients first, then a's, then c's, not the reverse of the registration order. Pack "
         "each gradient into the open bucket when its hook fires, in the order they become ready, not into "
         "buckets laid out in advance from model.parameters()"),
        (always, "rank {rank}{at}: your all-reduce {call} of {calls} carried other gradients than a bucket of the "
                 "rule (gradients of {ready_bytes} bytes in ready order, buckets of {bucket_bytes} bytes): each "
                 "bucket holds the gradients in the order they become ready, from the one after the last full "
                 "bucket to the one that fills it")],
    "late_buckets": [(always, "rank {rank}{at}: {full} bucket(s) of {bucket_bytes} bytes fill up during backward, but "
                              "{inside} all-reduce(s) started there: start each bucket's asynchronous all-reduce as "
                              "soon as it is full, from the hook, so that it overlaps the rest of backward; finish() "
                              "only sends the bucket still open at the end")],
    "bucket_late": [(always, "rank {rank}{at}: bucket {bucket} ({bucket_bytes} bytes) was full once {fill} of the "
                             "{gradients} gradients had been accumulated, but its all-reduce started only after "
                             "{start}: a bucket sent later than when it fills overlaps less of backward (sent at the "
                             "last gradient, none of it); start each bucket's asynchronous all-reduce as soon as it "
                             "is full, from the hook of the gradient that fills it")],
    "bucket_cap": BUCKET_HINTS,
    "param": [
        (always, "rank {rank}: after three steps the parameters differ from DDP's by {max_diff:.3g} (world size {W}), "
                 "although the first step's gradients matched: does something carry over from one step to the next "
                 "(a list of pending work never cleared, a bucket never emptied)?")],
}


def _step_times(info: dict, world: int) -> list[str]:
    """03.4 to 03.7, on success: one step with the student's code and with DDP."""
    if "yours_ms" not in info:
        return []
    return [f"world size {world}: one step (forward, backward, communication) {info['yours_ms']:.1f} ms "
            f"with yours, {info['ddp_ms']:.1f} ms with DDP (rank 0, median of 3; a tiny model on CPU: "
            f"latency, not bandwidth)"]


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="03.4", template="03_my_ddp.py", entry="average_gradients", world_sizes=(2, 3),
        check=check_average_gradients, hints=HINTS, on_success=_step_times,
        what="gradients after one step and parameters after three SGD steps equal DistributedDataParallel's"),
    CodingExercise(
        id="03.5", template="03_overlap.py", entry="OverlappedGradients", world_sizes=(2, 3),
        check=check_overlap, hints=HINTS, on_success=_step_times,
        what="DDP's gradients and parameters, with one asynchronous all-reduce per parameter started inside "
             "backward"),
    CodingExercise(
        id="03.6", template="03_buckets.py", entry="BucketedGradients", world_sizes=(2, 3),
        check=check_buckets, hints=HINTS, on_success=_step_times,
        what="DDP's gradients and parameters, with one asynchronous all-reduce per bucket"),
    CodingExercise(
        id="03.7", template="03_my_ddp_stretch.py", entry="MyDDP", world_sizes=(2, 3),
        check=check_my_ddp, hints=HINTS, collectives_only=True, on_success=_step_times,
        what="DDP's gradients and parameters with one asynchronous all-reduce per bucket, on an MLP and on a "
             "model that uses one weight twice, also one that uses its layers out of registration order and a wide one "
             "(over half a million parameters), from ranks that started apart"),
    CodingExercise(
        id="03.9", template="03_bucket_cap.py", entry="choose_bucket_cap_mb", world_sizes=(1,),
        check=check_bucket_cap, hints=HINTS, on_success=_bucket_lines,
        what=f"a bucket_cap_mb for each of the {len(BUCKET_CASES)} models and links whose simulated step (backward "
             f"plus exposed communication) is at most {BUCKET_SLACK:.2f}x the best cap's, chosen without the "
             "simulator"),
]
