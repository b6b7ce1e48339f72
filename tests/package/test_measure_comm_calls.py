"""mgpu_utils.measure.comm_calls in one process (gloo, world size 1): a collective counts once however it is
reached (torch.distributed's functions, a process group's or its backend's own methods, a group of new_group,
torch's functional collectives, torch.distributed.nn, DDP's reducer), with what this rank put in; the process
groups' hooks (torch 2.14 has them) and the dispatch mode used without them both; point_to_point_only refuses
every route; built() sees torch's DDP constructed."""
import math
import warnings

import pytest
import torch
import torch.distributed as dist

from mgpu_utils.compat import reduce_scatter_single
from mgpu_utils.measure import comm_calls
from mgpu_utils.measure.comm_calls import (add_content, built, carries, content_of, counted_all_reduce,
                                           counted_collectives, point_to_point_only)


@pytest.fixture(scope="module")
def world_of_one():
    own = not dist.is_initialized()
    if own:                                              # an in-memory store: no port, no environment
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.distributed_c10d._get_default_group()
    if own:
        dist.destroy_process_group()


@pytest.fixture(params=["hooks", "dispatch mode"])
def below_route(request, monkeypatch):
    """Both ways of seeing the C++ collectives: the groups' hooks (where torch has them) and the dispatch mode."""
    if request.param == "hooks" and not comm_calls.USE_GROUP_HOOKS:
        pytest.skip("this torch has no process-group hooks (torch 2.14 has them)")
    monkeypatch.setattr(comm_calls, "USE_GROUP_HOOKS", request.param == "hooks")
    return request.param


def _routes(group):
    """(name, a function making one all-reduce of a 4-element tensor of 1, 2, 3, 4 by that route)."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.nn.functional as dist_nn

    t = lambda: torch.arange(1.0, 5.0)                  # noqa: E731
    return [
        ("dist.all_reduce", lambda: dist.all_reduce(t())),
        ("group.allreduce", lambda: group.allreduce([t()]).wait()),
        ("a new group's allreduce", lambda: dist.new_group([0]).allreduce([t()]).wait()),
        ("the backend's allreduce", lambda: group._get_backend(torch.device("cpu")).allreduce([t()]).wait()),
        ("functional all_reduce", lambda: funcol.all_reduce(t(), "sum", group).wait()),
        ("torch.distributed.nn all_reduce", lambda: _quietly(dist_nn.all_reduce, t())),
    ]


def _quietly(f, *args):
    """f(*args) without its FutureWarning (torch.distributed.nn.functional and funcol's *_tensor names are deprecated
    in torch 2.14)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return f(*args)


def test_an_all_reduce_counts_once_by_every_route(world_of_one, below_route):
    for name, run in _routes(world_of_one):
        calls, carried, content = [], [], []
        with counted_collectives(calls, carried=carried, content=content):
            run()
        assert calls == ["all_reduce"], (name, calls)
        assert carried == [("all_reduce", 4)], (name, carried)
        assert [c[:7] for c in content] == [("all_reduce", 4, 10.0, 30.0, 10.0, 16, 4)], (name, content)
        assert abs(content[0].logs - math.log2(24)) < 1e-12, (name, content)    # log2 of 1, 2, 3 and 4


def test_group_methods_and_functional_collectives_are_named_as_dist_names_them(world_of_one, below_route):
    import torch.distributed._functional_collectives as funcol

    g, x = world_of_one, torch.ones(4)
    calls = []
    with counted_collectives(calls):
        g.allgather([[torch.empty(4)]], [x]).wait()
        g._allgather_base(torch.empty(4), x).wait()
        g.reduce_scatter([torch.empty(4)], [[x]]).wait()
        g._reduce_scatter_base(torch.empty(4), x).wait()
        g.broadcast([x]).wait()
        g.alltoall_base(torch.empty(4), x, [], []).wait()
        _quietly(funcol.all_gather_tensor, x, 0, g).wait()       # all_gather_single from torch 2.14
        _quietly(funcol.reduce_scatter_tensor, x, "sum", 0, g).wait()
    assert calls == ["all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
                     "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor"]


def test_ddp_reducer_counts_and_ddp_is_seen_built(world_of_one, below_route):
    model = torch.nn.Linear(4, 2)
    with built(comm_calls.TORCH_DDP) as used:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    assert used == ["torch's DistributedDataParallel"]
    state = {"backward": True}
    with counted_all_reduce(state) as calls:
        ddp(torch.ones(3, 4)).sum().backward()
    assert [c["elements"] for c in calls] == [10] and calls[0]["below"]
    grads = content_of([p.grad for p in model.parameters()])
    assert carries(calls[0]["content"], grads, world=1)     # the reducer's bucket carried the gradients


def test_counted_all_reduce_keeps_its_wait_semantics(world_of_one):
    x = torch.ones(3)
    with counted_all_reduce({"backward": False}) as calls:
        work = dist.all_reduce(x, async_op=True)
        work.wait()
    assert calls[0]["async"] and calls[0]["waited"] and "below" not in calls[0]
    assert calls[0]["content"] == ("all_reduce", 3, 3.0, 3.0, 3.0, 12, 3, 0.0)


def test_counted_all_reduce_sees_each_way_of_waiting(world_of_one):
    """is_completed() once True is a wait (and delivers the result); a process group's own allreduce is waited
    for when its Work is, not before; a wait() in a hook, inside backward, is recorded as such (03.7)."""
    x, y, w = torch.ones(3), torch.ones(2), torch.ones(2, requires_grad=True)

    def blocking(p):
        dist.all_reduce(p.grad, async_op=True).wait()
    w.register_post_accumulate_grad_hook(blocking)
    with counted_all_reduce({"backward": False}) as calls:
        work = dist.all_reduce(x, async_op=True)
        while not work.is_completed():
            pass
        group_work = world_of_one.allreduce([y])
        assert not calls[1]["waited"]
        group_work.wait()
        (w * 2).sum().backward()
    assert calls[0]["waited"] and torch.equal(x, torch.ones(3)) and not calls[0].get("waited_in_backward")
    assert calls[1]["below"] and calls[1]["waited"] and not calls[1].get("waited_in_backward")
    assert calls[2]["waited_in_backward"] and torch.equal(w.grad, torch.full((2,), 2.0))


def test_counted_all_reduce_sees_a_hook_blocked_on_another_thread_or_a_poll_loop(world_of_one):
    """A wait() in a thread that the hook joins, or in a pool whose future the hook waits for, and a loop on
    is_completed() in the hook, are waits in backward (03.7: the hook returns only once the all-reduce is done);
    a waiting thread the hook starts and leaves running, one polled once from a hook, and waits in threads that
    a final callback joins, are not."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    pool, kept = ThreadPoolExecutor(1), []

    def joined(p):
        work = dist.all_reduce(p.grad, async_op=True)
        t = threading.Thread(target=work.wait)
        t.start()
        t.join()

    def pooled(p):
        work = dist.all_reduce(p.grad, async_op=True)
        pool.submit(work.wait).result()

    def polled(p):
        work = dist.all_reduce(p.grad, async_op=True)
        while not work.is_completed():
            pass

    def left_running(p):
        work = dist.all_reduce(p.grad, async_op=True)
        t = threading.Thread(target=work.wait)
        t.start()
        kept.append((work, t))

    def polled_once(p):
        kept.append(dist.all_reduce(p.grad, async_op=True))
        assert not kept[0].is_completed()                 # said False in a hook: it may still be running

    def settled_at_the_end(p):
        kept.append(dist.all_reduce(p.grad, async_op=True))

        def settle():
            t = threading.Thread(target=kept[-1].wait)
            t.start()
            t.join()
        torch.autograd.Variable._execution_engine.queue_callback(settle)

    seen = {}
    for hook in (joined, pooled, polled, left_running, polled_once, settled_at_the_end):
        w, kept[:] = torch.ones(2, requires_grad=True), []
        w.register_post_accumulate_grad_hook(hook)
        state = {"backward": True}
        with counted_all_reduce(state) as calls:
            (w * 2).sum().backward()
            state["backward"] = False
            for k in kept:
                (k[1].join() if isinstance(k, tuple) else k.wait())
        seen[hook.__name__] = calls[0].get("waited_in_backward")
    pool.shutdown()
    assert seen == {"joined": "thread", "pooled": "thread", "polled": "poll", "left_running": None,
                    "polled_once": None, "settled_at_the_end": None}


def test_counted_all_reduce_names_blocking_calls_in_backward_and_records_progress(world_of_one):
    """A barrier waited for, a broadcast without async_op, or an async broadcast's Work waited for, in a hook
    during backward is as blocking as a wait() there (03.7); outside backward, or waited for after it, it is
    not. Each all-reduce records the value of
    state["progress"] when it started (how many gradients were accumulated, in 03.7)."""
    w, x, seen = torch.ones(2, requires_grad=True), torch.ones(2), []

    def hook(p):
        seen.append(p)
        dist.all_reduce(p.grad, async_op=True).wait()
        dist.barrier()
        dist.broadcast(x, src=0)
        dist.broadcast(x, src=0, async_op=True).wait()
        later.append(dist.broadcast(x, src=0, async_op=True))
    later = []
    w.register_post_accumulate_grad_hook(hook)
    state = {"backward": False, "progress": lambda: len(seen)}
    with counted_all_reduce(state) as calls:
        dist.barrier()
        dist.all_reduce(x, async_op=True).wait()
        state["backward"] = True
        (w * 2).sum().backward()
        state["backward"] = False
        later[0].wait()
    assert state["blocking"] == ["barrier", "broadcast", "broadcast"]
    assert [c["progress"] for c in calls] == [0, 1]

def test_counted_all_reduce_names_the_other_collectives(world_of_one, below_route):
    """Besides the all-reduces, the block's other collectives are named in state["others"], however reached (a
    broadcast excepted: DDP broadcasts buffers at every forward); 03.7 asks why the gradients needed them."""
    import torch.distributed._functional_collectives as funcol

    state, x = {"backward": False}, torch.ones(2)
    with counted_all_reduce(state) as calls:
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.all_gather([torch.empty(2)], x)
        world_of_one._allgather_base(torch.empty(2), x).wait()
        _quietly(funcol.reduce_scatter_tensor, x, "sum", 0, world_of_one).wait()
    assert len(calls) == 1
    assert state["others"] == ["all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"]


def test_point_to_point_only_refuses_every_route(world_of_one, below_route):
    for name, run in _routes(world_of_one):
        with point_to_point_only("04.4"), pytest.raises(RuntimeError, match="allows point-to-point only"):
            run()
    dist.all_reduce(torch.ones(2))                       # after the block: allowed again


def test_nested_blocks_each_count_once(world_of_one, below_route):
    outer, inner, outer_content, inner_content = [], [], [], []
    with counted_collectives(outer, content=outer_content):
        with counted_collectives(inner, content=inner_content):
            world_of_one.allreduce([torch.ones(2)]).wait()
            dist.all_reduce(torch.full((3,), 2.0))
    assert outer == inner == ["all_reduce", "all_reduce"]
    assert outer_content == inner_content == [("all_reduce", 2, 2.0, 2.0, 2.0, 8, 2, 0.0),
                                                  ("all_reduce", 3, 6.0, 12.0, 6.0, 12, 3, 3.0)]


def test_what_each_dist_collective_puts_in(world_of_one):
    """The input of each form (keyword or positional): the tensor reduced, the one gathered, the list scattered."""
    x, content = torch.arange(1.0, 5.0), []
    with counted_collectives([], content=content):
        dist.all_gather([torch.empty(4)], tensor=x)
        reduce_scatter_single(torch.empty(4), x)          # dist's name of this torch (compat)
        dist.all_to_all_single(torch.empty(4), input=x)
        dist.scatter(torch.empty(4), [x], src=0)
        dist.gather(x, [torch.empty(4)], dst=0)
    assert [c.elements for c in content] == [4] * 5 and {c.total for c in content} == {10.0}


def test_carries_allows_layout_padding_and_division():
    g = [torch.randn(5, 3), torch.randn(7)]
    want = content_of(g)
    flat = torch.cat([t.reshape(-1) for t in g] + [torch.zeros(2)])
    assert carries(content_of(flat), want, world=3)
    assert carries(add_content([content_of(flat[:10] / 3), content_of(flat[10:] / 3)]), want, world=3)
    assert not carries(content_of(torch.zeros(24)), want, world=3)
    assert not carries(content_of(flat * 2), want, world=3)
    assert not carries(content_of(flat[:20]), want, world=3)



def test_carries_sees_small_riders_and_how_differs_says_so():
    """Data scaled by 2**-30 beside the right content moves the three sums by about 1e-9 of them, under the 1e-4
    tolerance, and is recovered exactly (a twenty-first red team's 03.7 a01, 07.5 a02, 07.6 a03): the count of
    non-zero elements and the sum of their log2|x| see it, and the hint names the count; the same elements
    replacing as many small gradients (the count kept) move the log2 sizes."""
    from mgpu_utils.measure.comm_calls import how_differs, scaled_content

    torch.manual_seed(0)
    g = torch.randn(3000)
    want = content_of(g)
    riders = torch.randn(200) * 2.0 ** -30
    got = content_of(torch.cat([g, riders]))
    assert abs(got.squares - want.squares) < 1e-9 * want.squares      # the three sums cannot tell
    assert not carries(got, want, world=3)
    assert how_differs(got, want, 3).startswith("3,200 of their elements are not zero, against 3,000")
    swapped = g.clone()
    small = swapped.abs().argsort()[:5]                               # the 5 smallest gradients given up
    swapped[small] = torch.randn(5) * 2.0 ** -30
    assert not carries(content_of(swapped), want, world=3)
    assert "sizes of their elements" in how_differs(content_of(swapped), want, 3)
    assert carries(content_of(g / 3), want, world=3)                  # divided first: the log2 sizes move too
    assert carries(scaled_content(want, 1 / 3), want, world=3)
    assert how_differs(content_of(g * 2), want, 3).startswith("their sum of squares is")


def test_carries_some_counts_a_tied_weight_once_per_use():
    """07.6: a weight two layers share may be all-gathered once per use, forward and backward (4 times); with
    ``most`` 2 for every piece that sum is 'something else', with 4 for the tied piece it is recognised."""
    from mgpu_utils.measure.comm_calls import add_content, carries_some, content_of

    torch.manual_seed(0)
    tied, other = torch.randn(12), torch.randn(5)
    pieces = [content_of(tied), content_of(other)]
    got = add_content([content_of(tied)] * 4 + [content_of(other)] * 2)
    assert not carries_some(got, pieces, [True, True])
    assert carries_some(got, pieces, [True, True], most=[4, 2])
    assert not carries_some(add_content([content_of(tied)] * 5), pieces, [True, False], most=[4, 2])


def test_a_broadcast_method_says_its_root(world_of_one, below_route):
    """A process group's own broadcast(tensor, root) and broadcast([tensor], BroadcastOptions) reached below
    torch.distributed's function say their root (07.5 reads what an owner sends that way: a twenty-second red
    team's 075 b01); dist.broadcast is read where it is called."""
    from mgpu_utils.measure.comm_calls import patched_collectives

    seen = []
    with patched_collectives(lambda name, original: original, None, lambda call: seen.append((call.name, call.root))):
        world_of_one.broadcast(torch.ones(3), 0).wait()
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        world_of_one.broadcast([torch.ones(2)], opts).wait()
    assert seen == [("broadcast", 0), ("broadcast", 0)]


def _backward_in_a_thread(loss, seen):
    """Run ``loss.backward()`` in a new thread that notes its kernel id first (as the grader's backward does)."""
    import threading

    def run():
        seen["ident"] = comm_calls._note_native_id()
        loss.backward()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_engine_sleeps_sees_backward_blocked_in_a_builtin_hook():
    """A twenty-fourth red team's 03.7 d01: a builtin (queue.SimpleQueue.get) registered as a node's pre-hook
    blocks backward with no Python frame under autograd's engine; _engine_sleeps sees the thread asleep there."""
    import queue
    import time

    gate = queue.SimpleQueue()
    x = torch.ones(3, requires_grad=True)
    loss = (x * 2).sum()
    loss.grad_fn.register_prehook(gate.get)
    seen = {}
    thread = _backward_in_a_thread(loss, seen)
    deadline = time.monotonic() + 10
    while not ("ident" in seen and comm_calls._engine_sleeps(seen["ident"])):
        # margin: the thread blocks in its first node at once; 10 s covers its start on a busy machine
        assert time.monotonic() < deadline, "backward never seen asleep in the engine"
    gate.put(None)
    thread.join(10)
    assert not thread.is_alive() and torch.equal(x.grad, torch.full((3,), 2.0))
    assert not comm_calls._engine_sleeps(seen["ident"])                     # the thread is gone


def test_engine_sleeps_is_false_while_backward_computes():
    """A backward that computes (a chain of matrix products, single-threaded here) runs: never asleep for 20 ms."""
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = torch.randn(400, 400, requires_grad=True)
        h = torch.randn(400, 400)
        for _ in range(300):
            h = torch.tanh(h @ w)
        seen = {}
        thread = _backward_in_a_thread(h.sum(), seen)
        looks = 0
        while thread.is_alive():
            if "ident" in seen:
                assert not comm_calls._engine_sleeps(seen["ident"])
                looks += 1
            time.sleep(0.005)
        assert looks > 3, "the backward ended before it was looked at"
    finally:
        torch.set_num_threads(threads)


def test_content_of_reads_an_integer_view_as_its_floats():
    """A twenty-fifth red team's 07.5 e10 and 07.6 e01 moved float32 data as int32 views, which counted as nothing:
    a tensor that is not floating-point counts as its bytes read as float32, whatever integer type views them."""
    x = torch.randn(1000)
    want = content_of(x)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        got = content_of(x.view(dtype))
        assert (got.elements, got.nbytes, got.nonzero) == (want.elements, want.nbytes, want.nonzero), dtype
        assert math.isclose(got.squares, want.squares) and math.isclose(got.logs, want.logs), dtype
    odd = content_of(torch.arange(7, dtype=torch.uint8))          # 7 bytes: one float32 word, 3 bytes left out
    assert (odd.elements, odd.nbytes) == (1, 7)
    nan = content_of(torch.full((4,), -1, dtype=torch.int32))     # all bits set: NaN, read as 0
    assert nan.elements == 4 and nan.squares == 0.0 and nan.nonzero == 0
