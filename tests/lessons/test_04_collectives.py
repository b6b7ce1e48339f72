"""Lesson 04: from-scratch collectives, the primitives demo, the bandwidth formulas, the error lab."""
import csv
import math

import numpy as np
import pytest
import torch

from mgpu_utils.costs.bandwidth import (algbw_gbps, bus_factor, busbw_gbps, fit_ring_allreduce,
                                        ring_allreduce_model)
from mgpu_utils.launch.launcher import LaunchError, launch


@pytest.mark.parametrize("nproc", [2, 3, 4])
def test_ring_tree_naive_equal_dist_all_reduce(nproc, starts_processes):
    """fp32 and bf16; lengths 1, 3, 7, 64, 1001 (shorter than n, divisible and not divisible by n);
    ring, tree and naive each compared with dist.all_reduce."""
    res = launch("ring_allreduce.py", nproc=nproc, show="none", args=["--sizes-kib", ""])
    assert res["checks_passed"] == 2 * 5 * 3 and res["world_size"] == nproc


def test_ring_timing_rows(starts_processes):
    res = launch("ring_allreduce.py", nproc=2, show="none",
                 args=["--sizes-kib", "4,64", "--repeats", 1, "--check-lengths", "5"])
    assert {(r["algorithm"], r["bytes"]) for r in res["timings"]} == \
        {(a, kib * 1024) for a in ("dist.all_reduce", "ring", "tree", "naive") for kib in (4, 64)}
    assert all(r["seconds"] > 0 for r in res["timings"])


def test_every_primitive_against_a_single_process_reference(starts_processes):
    n = 3
    res = launch("collectives_demo.py", nproc=n, show="none")
    x = [np.arange(2 * n) + 10 * r for r in range(n)]             # what each rank started with
    after = {k: [np.array(v) for v in vals] for k, vals in res["after"].items()}
    total = sum(x)
    assert [list(b) for b in x] == res["before"]
    assert (after["send/recv (0 to 1)"][1] == x[0]).all() and (after["send/recv (0 to 1)"][2] == x[2]).all()
    for r in range(n):
        assert (after["isend/irecv (ring shift)"][r] == x[(r - 1) % n]).all()
        assert (after["broadcast"][r] == x[0]).all()
        assert (after["scatter"][r] == np.split(x[0], n)[r]).all()
        assert (after["all_reduce"][r] == total).all()
        assert (after["all_gather"][r] == np.concatenate(x)).all()
        assert (after["reduce_scatter"][r] == np.split(total, n)[r]).all()
        assert (after["all_to_all"][r] == np.concatenate([np.split(x[s], n)[r] for s in range(n)])).all()
    assert (after["gather"][0] == np.concatenate(x)).all() and (after["reduce"][0] == total).all()
    arrive, leave = zip(*res["barrier_ms"])
    assert min(leave) >= max(arrive) - 1.0, "nobody leaves the barrier before the last rank arrives"
    assert res["fallbacks_equal"] is True
    assert res["probe"]["all_reduce SUM"]["float32"] == "ok"


def test_bus_factors_and_bandwidths_by_hand():
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)          # 2 * 3 / 4
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)        # 7 / 8
    assert bus_factor("reduce_scatter", 3) == pytest.approx(2 / 3)
    assert bus_factor("all_to_all", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 16) == bus_factor("reduce", 5) == 1.0
    assert algbw_gbps(2e9, 0.5) == pytest.approx(4.0)                 # 2 GB in 0.5 s
    assert busbw_gbps("all_reduce", 1e9, 1.0, 8) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        bus_factor("all_reduce_typo", 4)
    with pytest.raises(ValueError):
        algbw_gbps(1.0, 0.0)


def test_alpha_beta_fit_recovers_the_model():
    sizes = np.array([2**k for k in range(10, 27, 2)], dtype=float)
    t = ring_allreduce_model(sizes, 4, alpha_s=20e-6, bandwidth_bps=5e9)
    assert t[0] == pytest.approx(2 * 3 * 20e-6 + 1.5 * 1024 / 5e9)
    alpha, bw = fit_ring_allreduce(sizes, t, 4)
    assert alpha == pytest.approx(20e-6, rel=1e-6) and bw == pytest.approx(5e9, rel=1e-6)
    with pytest.raises(ValueError):
        fit_ring_allreduce([1024, 1024], [1e-3, 1e-3], 4)


def test_bench_rows_csv_and_factors(tmp_path, starts_processes):
    out = tmp_path / "bench.csv"
    res = launch("collectives_bench.py", nproc=2, show="none",
                 args=["--ops", "all_reduce,all_gather", "--max-mib", 1, "--repeats", 1, "--warmup", 1, "--csv", out])
    rows = res["rows"]
    assert len(rows) == 2 * 6                                          # 1 KiB .. 1 MiB in x4 steps
    by_hand = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": (2 - 1) / 2}     # nccl-tests factors at n = 2
    for r in rows:
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * by_hand[r["op"]])
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
    with open(out) as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert res["copy_GBps"] > 0


# The mismatched collective named with TORCH_DISTRIBUTED_DEBUG=DETAIL: lesson 04's section 5 (the hang-and-error lab)
# makes this exact launch and asserts more (each rank's collective, ALLREDUCE and BROADCAST, read from the message);
# make test runs every notebook once. The missing rank's test below checks the rank too, which the lesson does not.


def test_missing_rank_is_named_within_the_timeout(starts_processes):
    with pytest.raises(LaunchError) as info:
        launch("collective_errors.py", nproc=2, show="none", args=["--case", "missing", "--timeout", 2],
               env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert info.value.rank == 0 and "Ranks 1 failed to pass monitoredBarrier" in info.value.message


def test_error_script_control_run_succeeds(starts_processes):
    res = launch("collective_errors.py", nproc=2, show="none", args=["--case", "ok"])
    assert res["result"] == [3.0] * 4                                 # 1 + 2


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ring_schedule_sums_every_chunk(n):
    """Replay the schedule on numbers: every rank ends with the full sum (the stepper shows this)."""
    from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
    from mgpu_utils.parallel.ring import ring_schedule, ring_states

    steps = ring_schedule(n)
    assert len(steps) == 2 * (n - 1)
    data = [[float(10 * r + c) for c in range(n)] for r in range(n)]     # rank r, chunk c
    for step in steps:
        new = [row[:] for row in data]
        for r in range(n):
            left, c = (r - 1) % n, step["recv"][r]
            assert step["send"][left] == c
            new[r][c] = data[r][c] + data[left][c] if step["phase"] == "reduce-scatter" else data[left][c]
        data = new
    assert data == [[sum(10 * r + c for r in range(n)) for c in range(n)]] * n
    assert all(s == frozenset(range(n)) for row in ring_states(n)[-1] for s in row)
    assert ring_bytes_per_rank(1024, n) == 2 * (n - 1) / n * 1024


def test_ring_stepper_and_static_figure():
    import matplotlib
    matplotlib.use("Agg")
    from mgpu_utils.figures import collectives as plots

    fig = plots.draw_ring_steps(3)
    assert len([a for a in fig.axes if a.patches]) == 2 * (3 - 1) + 1
    widget = plots.ring_stepper(3)
    assert widget.children[0].max == 4


class ThreadDist:
    """A stand-in for torch.distributed inside one process: n threads are the ranks. send copies the
    tensor into the (src, dst) queue; recv waits on it, and a wait past the timeout means the schedule
    deadlocked. isend/irecv inside batch_isend_irecv post the sends first, then the receives."""

    def __init__(self, n):
        import queue
        import threading
        self.n, self.local = n, threading.local()
        self.q = {(s, d): queue.Queue() for s in range(n) for d in range(n)}
        self.P2POp = lambda op, tensor, peer: (op, tensor, peer)

    def get_rank(self):
        return self.local.rank

    def get_world_size(self):
        return self.n

    def send(self, t, dst):
        self.q[self.local.rank, dst].put(t.clone())

    def recv(self, t, src):
        t.copy_(self.q[src, self.local.rank].get(timeout=10))

    def isend(self, t, dst):
        self.send(t, dst)

    def irecv(self, t, src):
        self.recv(t, src)

    def batch_isend_irecv(self, ops):
        for op, t, peer in sorted(ops, key=lambda o: o[0] != self.isend):   # sends first
            op(t, peer)
        return []


class RendezvousDist(ThreadDist):
    """NCCL's point-to-point as its documentation lets it behave: "ncclSend is blocking for the GPU", so a
    send may wait until its peer has posted the receive, and the rank's later operations wait behind it;
    a send and a receive that must progress together are posted as one group (batch_isend_irecv). Here a
    lone send or receive completes before the call returns (the GPU's order), and one that would wait
    forever times out: that schedule hangs on NCCL (gloo's buffered sends do not show it)."""

    class Done:
        def wait(self):
            return True

    def __init__(self, n):
        import threading
        super().__init__(n)
        self.posted = {(s, d): threading.Semaphore(0) for s in range(n) for d in range(n)}

    def _go(self, t, dst):                      # a send leaves once dst has posted the receive
        if not self.posted[self.local.rank, dst].acquire(timeout=5):
            raise TimeoutError(f"rank {self.local.rank}'s send to {dst} waits for a receive nobody posted")
        self.q[self.local.rank, dst].put(t.clone())

    def send(self, t, dst):
        self._go(t, dst)

    def recv(self, t, src):
        self.posted[src, self.local.rank].release()
        t.copy_(self.q[src, self.local.rank].get(timeout=10))

    def isend(self, t, dst):
        self.send(t, dst)
        return self.Done()

    def irecv(self, t, src):
        self.recv(t, src)
        return self.Done()

    def batch_isend_irecv(self, ops):           # one group: receives posted, sends leave, receives complete
        recvs = [(t, peer) for op, t, peer in ops if op == self.irecv]
        for t, peer in recvs:
            self.posted[peer, self.local.rank].release()
        for op, t, peer in ops:
            if op == self.isend:
                self._go(t, peer)
        for t, peer in recvs:
            t.copy_(self.q[peer, self.local.rank].get(timeout=10))
        return [self.Done() for _ in ops]


def in_threads(fake, fn, tensors):
    """fn(tensors[r]) on rank r, one thread per rank of ``fake``: the (rank, error) pairs raised."""
    import threading

    errors = []

    def rank_main(r):
        fake.local.rank = r
        try:
            fn(tensors[r])
        except Exception as e:                       # a timeout: the schedule deadlocked
            errors.append((r, repr(e)))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(fake.n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return errors


def test_the_rendezvous_transport_hangs_a_ring_of_lone_sends():
    """The model catches what it is for: every rank's lone isend first, then its irecv, around a ring."""
    fake = RendezvousDist(3)

    def lone_sends_first(t):
        me = fake.get_rank()
        for req in [fake.isend(t, (me + 1) % 3), fake.irecv(torch.empty_like(t), (me - 1) % 3)]:
            req.wait()

    errors = in_threads(fake, lone_sends_first, [torch.zeros(2)] * 3)
    assert len(errors) == 3 and all("nobody posted" in e for _, e in errors), errors


@pytest.mark.parametrize("n, k", [(2, 1), (2, 2), (4, 2), (4, 1), (6, 3), (6, 2)])
def test_placement_rings_complete_on_a_rendezvous_transport(n, k, monkeypatch):
    """allreduce_placement.py's flat and hierarchical rings (lesson 04, NCCL wherever there is a GPU per rank),
    each rank a thread over NCCL's documented send semantics: both end with the sum on every rank, none waits
    forever. Every rank sends first around each ring, so its send and receive must be one group."""
    import allreduce_placement

    for name, fn in (("flat", lambda t, log: allreduce_placement.flat_all_reduce(t, n, log)),
                     ("hierarchical", lambda t, log: allreduce_placement.hierarchical_all_reduce(t, n, k, log))):
        fake = RendezvousDist(n)
        monkeypatch.setattr(allreduce_placement, "dist", fake)
        tensors = [torch.arange(4 * n, dtype=torch.float64) * 10 ** r for r in range(n)]
        results = {}
        errors = in_threads(fake, lambda t: results.__setitem__(fake.get_rank(), fn(t, [])), tensors)
        assert not errors, f"{name}: {errors}"
        expected = torch.arange(4 * n, dtype=torch.float64) * sum(10 ** r for r in range(n))
        for r in range(n):
            torch.testing.assert_close(results[r], expected, rtol=0, atol=0, msg=f"{name}, n={n}, k={k}, rank {r}")


@pytest.mark.parametrize("transport", [ThreadDist, RendezvousDist], ids=["buffered", "rendezvous"])
@pytest.mark.parametrize("algorithm", ["tree_all_reduce", "naive_all_reduce", "ring_all_reduce"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_from_scratch_all_reduce_in_threads(algorithm, n, transport, monkeypatch):
    """The real functions of ring_allreduce.py, each rank a thread over an in-process transport (non-powers
    of two and lengths not divisible by n included), gloo's buffered sends and NCCL's rendezvous: every rank
    must end with the sum, and no receive may wait forever."""
    import ring_allreduce

    fake = transport(n)
    monkeypatch.setattr(ring_allreduce, "dist", fake)
    fn, length = getattr(ring_allreduce, algorithm), 7
    tensors = [torch.arange(length, dtype=torch.float64) * 10 ** r for r in range(n)]   # distinct per rank
    errors = in_threads(fake, fn, tensors)
    assert not errors, errors
    expected = torch.arange(length, dtype=torch.float64) * sum(10 ** r for r in range(n))
    for r in range(n):
        torch.testing.assert_close(tensors[r], expected, rtol=0, atol=0, msg=f"{algorithm}, n={n}, rank {r}")


def test_allreduce_latency_probe_reports_every_element_count(starts_processes):
    """allreduce_latency.py (lesson 04): element counts 1..2n plus the large ones, all positive times,
    the best call never above the median, and a ping-pong; the script itself asserts the all-reduce of
    ones gives the world size."""
    r = launch("allreduce_latency.py", nproc=3, show="none", args=["--repeats", 3, "--large", "256"])
    assert r["world_size"] == 3
    assert [int(k) for k in r["allreduce_s"]] == [1, 2, 3, 4, 5, 6, 256]
    assert all(v > 0 for v in r["allreduce_s"].values()) and r["pingpong_s"] > 0
    assert list(r["allreduce_best_s"]) == list(r["allreduce_s"])
    assert all(0 < r["allreduce_best_s"][k] <= r["allreduce_s"][k] for k in r["allreduce_s"]), "best <= median"
    assert 0 < r["pingpong_best_s"] <= r["pingpong_s"]


def test_alpha_beta_fit_weights_relative_errors_and_names_bad_input():
    """Noisy data: the fit minimises relative errors (weights 1/T), so a 10% error on the smallest message
    moves alpha as much as a 10% error on the largest; n = 2 is the smallest ring; bad input is named."""
    sizes = np.array([1e3, 1e5, 1e7])
    t = ring_allreduce_model(sizes, 2, alpha_s=50e-6, bandwidth_bps=1e9)
    alpha, bw = fit_ring_allreduce(sizes, t, 2)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and bw == pytest.approx(1e9, rel=1e-6)
    noisy = t * np.array([1.1, 1.0, 1.0])
    weighted = np.polyfit(sizes, noisy, 1, w=1 / noisy)                 # by hand: the weighted least squares
    assert fit_ring_allreduce(sizes, noisy, 2) == pytest.approx((max(weighted[1], 0) / 2, 1 / weighted[0]))
    assert fit_ring_allreduce(sizes, np.array([1e-9, 1e-4, 1e-2]), 2)[0] == 0.0   # negative intercept: clipped
    with pytest.raises(ValueError, match="at least 2 ranks"):
        fit_ring_allreduce(sizes, t, 1)
    with pytest.raises(ValueError, match="2 or more distinct sizes"):
        fit_ring_allreduce([1024, 1024, 1024], [1e-3, 1e-3, 1e-3], 4)


def test_alpha_beta_fit_with_exactly_two_sizes_and_exact_messages():
    sizes = [1e3, 1e7]
    t = ring_allreduce_model(np.array(sizes), 2, alpha_s=50e-6, bandwidth_bps=1e9)
    assert fit_ring_allreduce(sizes, t, 2) == pytest.approx((50e-6, 1e9), rel=1e-6)     # 2 distinct sizes suffice
    with pytest.raises(ValueError, match=r"^the model needs at least 2 ranks$"):
        fit_ring_allreduce(sizes, t, 1)
    with pytest.raises(ValueError, match=r"^need measurements at 2 or more distinct sizes$"):
        fit_ring_allreduce([1e3, 1e3], [1e-3, 1e-3], 2)


@pytest.mark.parametrize("nproc,k", [(2, 2), (2, 1), (4, 2)])
def test_hierarchical_all_reduce_equals_dist_all_reduce(nproc, k, starts_processes):
    """Lesson 04: reduce-scatter in the node, all-reduce between nodes, all-gather in the node (the script
    checks torch.equal against dist.all_reduce for lengths 1 to 1001, padded to k)."""
    res = launch("hierarchical_allreduce.py", nproc=nproc, show="none",
                 args=["--ranks-per-node", k, "--sizes-kib", "64", "--repeats", 1])
    assert res["checks_passed"] == 5 and res["nodes"] == nproc // k
    assert res["timings"][0]["bytes"] == 64 * 1024


def test_hierarchical_all_reduce_needs_whole_nodes(starts_processes):
    with pytest.raises(LaunchError, match="multiple of --ranks-per-node 2"):
        launch("hierarchical_allreduce.py", nproc=3, show="none", args=["--sizes-kib", ""])


def test_hierarchical_model_by_hand():
    """The alpha-beta model per level (mgpu_utils.costs.interconnect.hierarchical_allreduce_seconds)."""
    from mgpu_utils.costs.interconnect import hierarchical_allreduce_seconds, link_alpha_beta

    nv, ib = "NVLink 4 (H100, 18 links)", "InfiniBand NDR (400 Gb/s)"
    (a_nv, b_nv), (a_ib, b_ib) = link_alpha_beta(nv), link_alpha_beta(ib)
    S, k, m = 1e9, 8, 4
    got = hierarchical_allreduce_seconds(S, k, m, nv, ib)
    assert math.isclose(got["intra_s"], 2 * 7 * (a_nv + S / (8 * b_nv)))
    assert math.isclose(got["inter_s"], 2 * 3 * (a_ib + S / 8 / (4 * b_ib)))
    assert math.isclose(got["flat_s"], 2 * 31 * (a_ib + S / (32 * b_ib)))
    # k rail-aligned channels: each ring carries S/k over all 32 ranks, on its own NIC
    assert math.isclose(got["flat_channels_s"], 2 * 31 * (a_ib + S / 8 / (32 * b_ib)))
    # by construction: modelled seconds, not measured. Against a one-NIC flat ring the hierarchy wins at
    # every size; against k channels it wins on latency (small messages) and loses on bandwidth at 1 GB
    assert got["total_s"] < got["flat_s"] and got["flat_channels_s"] < got["total_s"]
    small = hierarchical_allreduce_seconds(1e3, k, m, nv, ib)
    assert small["total_s"] < small["flat_channels_s"]         # by construction, as above
    one_node = hierarchical_allreduce_seconds(S, 8, 1, nv, ib)
    assert one_node["inter_s"] == 0.0 and math.isclose(one_node["flat_s"], one_node["intra_s"])
    with pytest.raises(ValueError):
        hierarchical_allreduce_seconds(S, 0, 4, nv, ib)


@pytest.mark.parametrize("nproc, k", [(2, 1), (4, 2), (4, 1)])
def test_placement_replay_of_the_logged_messages(nproc, k, starts_processes):
    """Lesson 04: the flat and hierarchical rings from send/recv equal dist.all_reduce (the script asserts
    torch.equal); replayed on the block placement their logged messages give exactly the alpha-beta model per
    level, and the bytes crossing nodes are the formulas'; dealt round-robin, the hierarchy loses its advantage."""
    from mgpu_utils.costs.interconnect import hierarchical_allreduce_seconds

    res = launch("allreduce_placement.py", nproc=nproc, show="none",
                 args=["--ranks-per-node", k, "--sizes-kib", "4,64"])
    m = nproc // k
    for row in res["rows"]:
        S = row["bytes"]
        model = hierarchical_allreduce_seconds(S, k, m, res["intra"], res["inter"])
        flat, hier = row["flat"], row["hierarchical"]
        assert flat["messages"] == nproc * 2 * (nproc - 1)
        assert hier["messages"] == nproc * (2 * (k - 1) + 2 * (m - 1))
        assert math.isclose(hier["block"]["emulated_s"], model["total_s"], rel_tol=1e-9)
        assert math.isclose(flat["block"]["emulated_s"], model["flat_s"], rel_tol=1e-9)
        assert hier["block"]["max_cross_node_bytes"] == 2 * (m - 1) * S // (k * m)
        assert flat["block"]["max_cross_node_bytes"] == 2 * (nproc - 1) * S // nproc
        if k > 1:   # by construction: the emulator's seconds are modelled from the log, not measured
            assert hier["interleaved"]["emulated_s"] > hier["block"]["emulated_s"]
            assert hier["interleaved"]["max_cross_node_bytes"] > hier["block"]["max_cross_node_bytes"]


def test_placement_needs_whole_nodes_and_runs_on_one_rank(starts_processes):
    with pytest.raises(LaunchError, match="multiple of --ranks-per-node 2"):
        launch("allreduce_placement.py", nproc=3, show="none", args=["--ranks-per-node", 2])
    one = launch("allreduce_placement.py", nproc=1, show="none", args=["--ranks-per-node", 1, "--sizes-kib", "4"])
    assert one["rows"][0]["hierarchical"]["block"] == {"emulated_s": 0.0, "max_cross_node_bytes": 0}
