"""Lesson 09: parameter server, async vs sync SGD, local SGD, and the interconnect emulator.

The launch-script tests run under real torchrun and compare with single-process references computed
here; the emulator is tested in this process on a real DDP GradBucket (a 1-rank gloo group)."""
import collections
import math
import time
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from mgpu_utils.data import load_data, shard_batches
from mgpu_utils.models import SmallCNN, make_mlp
from mgpu_utils.costs.hardware import LINKS
from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
from mgpu_utils.costs.interconnect import emulated_link_hook, ring_allreduce_seconds
from mgpu_utils.dist import powersgd_bucket_cap_mb
from mgpu_utils.launch.launcher import launch, run_torchrun


def _by_hand(size_bytes, n, link):
    """2(n-1)(alpha + S/(nB)) from the LINKS table, written out independently of the module."""
    alpha = LINKS[link]["latency_us"] / 1e6
    bandwidth = LINKS[link]["gbps"] * 1e9
    return 2 * (n - 1) * (alpha + size_bytes / (n * bandwidth))


@pytest.mark.parametrize("link", list(LINKS))
def test_ring_allreduce_seconds_is_the_alpha_beta_formula(link):
    for n, size in [(2, 1), (4, 168_000), (8, 1e9)]:
        assert math.isclose(ring_allreduce_seconds(size, n, link), _by_hand(size, n, link), rel_tol=1e-12)
    assert ring_allreduce_seconds(1e6, 1, link) == 0.0
    assert ring_bytes_per_rank(400, 4) == 600


def test_unknown_link_is_refused_with_the_list():
    with pytest.raises(KeyError, match="Ethernet 10 GbE"):
        ring_allreduce_seconds(1, 2, "carrier pigeon")
    with pytest.raises(KeyError, match="known"):
        emulated_link_hook(lambda s, b: None, None, "carrier pigeon", 2)


def _powersgd_elements(model, rank=1, min_rate=2):
    """Elements PowerSGD all-reduces per step, from the layer shapes (its paper's rule, written here):
    a (n, m) matrix is sent as P (n x r) and Q (m x r) when (n + m) r x min_rate < n m, else whole."""
    total = 0
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return total


def test_emulator_adds_the_modelled_delay_for_the_bytes_sent(gloo_group_of_one, monkeypatch):
    # CPU tensors on purpose; on a machine with a GPU, torch's PowerSGD hook would synchronise CUDA
    # (it checks torch.cuda.is_available(), not the tensors' device): hide the GPU, as the launcher does.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    n, link, scale = 4, "Ethernet 10 GbE", 20.0     # model 4 ranks on 10 GbE, a 20x bigger gradient
    for name, inner, state_fn, elem_bytes in [
            ("fp32", default_hooks.allreduce_hook, lambda: None, 4),
            ("fp16", default_hooks.fp16_compress_hook, lambda: None, 2),
            ("powersgd", powerSGD_hook, lambda: PowerSGDState(None, matrix_approximation_rank=1,
                                                              start_powerSGD_iter=2), 4)]:
        torch.manual_seed(0)
        model = SmallCNN()
        P = sum(p.numel() for p in model.parameters())
        ddp = DDP(model)
        stats, hook = emulated_link_hook(inner, state_fn(), link, n, scale=scale)
        ddp.register_comm_hook(stats, hook)
        step_s = []
        for _ in range(3):
            t0 = time.perf_counter()
            F.cross_entropy(ddp(x), y).backward()
            step_s.append(time.perf_counter() - t0)
        assert stats.calls == 3                                  # one bucket per step
        expected = [P * elem_bytes] * 3
        if name == "powersgd":                                   # 2 vanilla steps, then P and Q factors
            expected[2] = _powersgd_elements(model) * 4
            assert expected[2] < P * 4 / 10
        for (size, modelled, slept), want, s in zip(stats.per_call, expected, step_s):
            assert size == want
            assert math.isclose(modelled, _by_hand(want * scale, n, link), rel_tol=1e-9)
            # by construction: the hook sleeps the modelled time, so the step really took that long
            assert slept >= modelled * 0.999 and s >= modelled * 0.999
        assert math.isclose(stats.modelled_s, sum(m for _, m, _ in stats.per_call))


def test_powersgd_on_gloo_gets_one_bucket_and_says_why_once():
    lines = []
    big = torch.nn.Linear(1024, 1024)                            # 4.2 MB of fp32 parameters: 5 MiB rounded up
    assert powersgd_bucket_cap_mb(big, "nccl", None, lines.append) is None     # NCCL: left as asked
    assert powersgd_bucket_cap_mb(big, "nccl", 0.5, lines.append) == 0.5 and lines == []
    assert powersgd_bucket_cap_mb(big, "gloo", 8.0, lines.append) == 8.0 and lines == []   # already one bucket
    assert powersgd_bucket_cap_mb(big, "gloo", 0.5, lines.append) == 5
    assert powersgd_bucket_cap_mb(big, "gloo", 0.5, lines.append) == 5
    assert len(lines) == 1 and "one 5 MiB bucket, not 0.5 MiB ones" in lines[0]   # said once
    assert powersgd_bucket_cap_mb(big, "gloo", None, lines.append) == 5                 # 25 MiB, first 1 MiB
    assert len(lines) == 2 and "not DDP's 1 + 25 MiB" in lines[1] and "hang gloo" in lines[1]
    assert powersgd_bucket_cap_mb(SmallCNN(), "gloo", None, lines.append) == 1 and len(lines) == 2  # fits 1 MiB
    mixed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).half())
    with pytest.raises(ValueError, match=r"torch.float16 on cpu, torch.float32 on cpu.*model.to\(dtype\)"):
        powersgd_bucket_cap_mb(mixed, "gloo")


def test_powersgd_with_two_buckets_on_gloo_trains_instead_of_hanging(starts_processes):
    """torch's powerSGD_hook waits on its P and Q all-reduces inside a future's callback, which gloo runs on
    its own thread while backward launches the next bucket: with two buckets the ranks' collectives cross and
    the job hangs (past timeout_s here) or aborts in gloo, varying run to run. Measured with --bucket-cap-mb
    passed to DDP as it is (the script without the helper): a rank killed by SIGABRT after 8 s twice, past
    the 90 s timeout once, in 3 runs. comm_hooks.py now gives PowerSGD's DDP one bucket on gloo
    (mgpu_utils.dist.powersgd_bucket_cap_mb) and says so once: about 4 s on 2 cores."""
    r = run_torchrun("comm_hooks.py", nproc=2, backend="gloo", show="none", timeout_s=90,
                     args=["--steps", "8", "--eval-every", "8", "--powersgd-start", "2", "--links",
                           "--bucket-cap-mb", "0.05"])
    hooks = r.result["hooks"]
    assert hooks["fp32 (default)"]["calls"] > 8 * 1.5      # the cap did split SmallCNN (0.15 MB) elsewhere
    assert hooks["PowerSGD"]["calls"] == 8                  # PowerSGD: one bucket per step
    said = [line for line in r.logs[0]["stdout"].splitlines() if "PowerSGD on gloo" in line]
    assert len(said) == 1 and "one 1 MiB bucket, not 0.05 MiB ones" in said[0]


def _reference_sgd(steps, lr, n_workers, batch_size=16, seed=0):
    """One process: plain SGD on the mean gradient of the workers' batches (as the scripts draw them)."""
    train, _ = load_data()
    X, Y = train.tensors
    streams = []
    for w in range(n_workers):
        idx, epoch = [], 0
        while len(idx) < steps:
            idx += shard_batches(train, n_workers, w, epoch, batch_size, seed)
            epoch += 1
        streams.append(idx)
    torch.manual_seed(seed)
    model = make_mlp(128, 1, flatten=True)
    for step in range(steps):
        grads = []
        for w in range(n_workers):
            model.zero_grad()
            F.cross_entropy(model(X[streams[w][step]]), Y[streams[w][step]]).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        with torch.no_grad():
            theta = parameters_to_vector(model.parameters()) - lr * torch.stack(grads).mean(0)
            torch.nn.utils.vector_to_parameters(theta, model.parameters())
    return parameters_to_vector(model.parameters()).detach()


def test_async_with_one_worker_and_no_delay_equals_sync_sgd(tmp_path, starts_processes):
    dump = tmp_path / "finals.pt"
    r = launch("sync_async.py", nproc=2, show="none",
               args=["--steps", "12", "--delay-ms", "0", "--lr", "0.1", "--dump", str(dump)])
    assert set(r["runs"]) == {"sync", "async"} and r["workers"] == 1
    finals = torch.load(dump)
    ref = _reference_sgd(12, 0.1, 1)
    torch.testing.assert_close(finals["sync"], ref)
    torch.testing.assert_close(finals["async"], ref)
    a = r["runs"]["async"]
    assert a["updates"] == 12 and a["staleness_hist"] == [[0, 12]]   # one worker: never stale


def test_parameter_server_applies_every_pushed_gradient_exactly_once(starts_processes):
    r = launch("sync_async.py", nproc=3, show="none",
               args=["--steps", "15", "--delay-ms", "15", "--straggler", "2", "--eval-every", "5"])
    W = r["workers"]
    assert W == 2 and set(r["runs"]) == {"sync", "async", "sync + straggler", "async + straggler"}
    for name in ("async", "async + straggler"):
        a = r["runs"][name]
        sent, applied = a["pushes_sent"], a["pushes_applied"]
        assert sent == applied                                 # same (rank, seq, checksum) multiset
        assert len({(x[0], x[1]) for x in applied}) == len(applied)
        for rank in (1, 2):                                     # every worker's seq 0, 1, 2, ... once
            seqs = sorted(x[1] for x in applied if x[0] == rank)  # (a slow worker may have none: the
            assert seqs == list(range(len(seqs)))                 # others can use up the budget first)
        assert 15 * W <= a["updates"] == len(applied) <= 15 * W + W - 1
        assert sum(c for _, c in a["staleness_hist"]) == a["updates"]
        assert min(s for s, _ in a["staleness_hist"]) >= 0
        assert set(a["start_s"]) == {"1", "2"} and min(a["start_s"].values()) == 0   # each worker's start
        # each gradient was added to the parameters once: r.(theta0 - theta_final)/lr = sum of r.g
        assert math.isclose(a["projection_displacement"], a["projection_sum_applied"],
                            rel_tol=1e-3, abs_tol=1e-3 * sum(abs(x[2]) for x in applied))
    for name in ("sync", "sync + straggler"):
        assert r["runs"][name]["updates"] == 15 and r["runs"][name]["gradients"] == 15 * W
    # by construction: every step waits for the straggler's sleep (less start skew), however busy the machine
    assert r["runs"]["sync + straggler"]["seconds"] >= 0.9 * 15 * 0.015


def test_modes_runs_only_the_asked_trainings_and_one_worker_is_never_stale(starts_processes):
    """The staleness sweep of lesson 09 runs ``--modes async``: only async runs, and one worker's
    gradients are all fresh (staleness exactly 0). Two workers' usually are not, but that depends on how the
    OS schedules them: on a busy machine the two workers' steps can take turns without overlapping (measured:
    all 16 gradients fresh in 3 of 20 runs with one core kept busy, and in 1 of 843 tests of a busy make
    test), so it is claimed only on a quiet machine (mgpu_utils.timing.LoadWatch)."""
    from mgpu_utils.timing import LoadWatch

    one = launch("sync_async.py", nproc=2, show="none",
                 args=["--modes", "async", "--steps", "8", "--delay-ms", "0", "--eval-every", "4"])
    assert set(one["runs"]) == {"async"}
    assert one["runs"]["async"]["staleness_hist"] == [[0, 8]]
    with LoadWatch() as machine:
        two = launch("sync_async.py", nproc=3, show="none",
                     args=["--modes", "async", "--steps", "8", "--delay-ms", "0", "--eval-every", "4"])
    hist = two["runs"]["async"]["staleness_hist"]
    assert set(two["runs"]) == {"async"} and sum(c for _, c in hist) == two["runs"]["async"]["updates"]
    machine.claim(max(s for s, _ in hist) >= 1, f"two workers: some gradient was stale (histogram {hist})")


def test_local_sgd_with_H1_equals_synchronous_averaging(tmp_path, starts_processes):
    dump = tmp_path / "finals.pt"
    steps, lr = 8, 0.3
    r = launch("local_sgd.py", nproc=2, show="none",
               args=["--H", "1", "2", "--with-sync", "--steps", str(steps), "--eval-every", "2",
                     "--lr", str(lr), "--dump", str(dump)])
    finals = torch.load(dump)
    ref = _reference_sgd(steps, lr, 2)
    torch.testing.assert_close(finals["sync"], ref)
    torch.testing.assert_close(finals["H=1"], ref)
    assert (finals["H=2"] - ref).abs().max() > 1e-4               # averaging less often is not the same
    P = (64 * 128 + 128) + (128 * 10 + 10)                       # make_mlp(128, 1): 64 -> 128 -> 10, by hand
    assert r["params"] == P
    for name, calls in [("H=1", 8), ("H=2", 4), ("sync", 8)]:
        run = r["runs"][name]
        assert run["allreduce_calls"] == calls and run["payload_bytes"] == calls * 4 * P
        assert run["ring_bytes_per_rank"] == calls * 4 * P       # 2(n-1)/n = 1 for n = 2
    assert collections.Counter(s for s, _, _ in r["runs"]["H=2"]["curve"]) == collections.Counter([0, 2, 4, 6, 8])


def test_simulated_staleness_obeys_littles_law():
    from mgpu_utils.parallel.staleness import simulate_ps

    equal = simulate_ps([1.0, 1.0, 1.0], 30)               # round robin: 0, 1, 2, then always W-1 = 2
    assert [w for w, _ in equal[:6]] == [0, 1, 2, 0, 1, 2]
    assert [s for _, s in equal] == [0, 1, 2] + [2] * 27
    skewed = simulate_ps([1.0, 1.0, 3.0], 300)             # a straggler: 3x slower
    mean = sum(s for _, s in skewed) / len(skewed)
    assert 1.9 <= mean <= 2.0                              # at most W-1, whatever the speeds
    per = {w: [s for v, s in skewed if v == w] for w in range(3)}
    assert len(per[2]) < len(per[0]) and sum(per[2]) / len(per[2]) > sum(per[0]) / len(per[0])
    with pytest.raises(ValueError):
        simulate_ps([1.0, 0.0], 5)


def test_a_worker_that_starts_late_is_simulated_from_its_start():
    """On a busy machine one worker can start tens of milliseconds late (the CI run of lesson 09 whose
    claim failed); the simulation takes the measured starts. Worker 1 starts at 2.5: worker 0 pushes alone
    at 1, 2 (fresh), 3; worker 1 pulls version 2 and pushes at 3.5, after one update; then both see one."""
    from mgpu_utils.parallel.staleness import simulate_ps

    assert simulate_ps([1.0, 1.0], 6, start_seconds=[0.0, 2.5]) == [(0, 0), (0, 0), (0, 0), (1, 1), (0, 1), (1, 1)]
    assert simulate_ps([1.0, 1.0], 6, start_seconds=[0.0, 0.0]) == simulate_ps([1.0, 1.0], 6)
    for bad in ([0.0], [0.0, -1.0]):
        with pytest.raises(ValueError, match="starts"):
            simulate_ps([1.0, 1.0], 4, start_seconds=bad)


def test_a_worker_that_finished_no_step_is_simulated_as_never_pushing():
    """A busy-core make test: the third worker started 0.117 s late, after the other two had made all 241
    updates at about 1 ms a step, so it measured no step (its mean was reported as 0.0 and simulate_ps
    refused it: lesson 09 failed). The script now reports None and the simulation lets that worker pull
    at its start and never push."""
    from mgpu_utils.parallel.staleness import simulate_ps

    with_idle = simulate_ps([1.0, 1.0, None], 6, start_seconds=[0.0, 0.0, 0.5])
    assert [w for w, _ in with_idle] == [0, 1] * 3 and with_idle == simulate_ps([1.0, 1.0], 6)
    with pytest.raises(ValueError, match="no worker pushes"):
        simulate_ps([None, None], 3)
    assert simulate_ps([None], 0) == []
    from mgpu_utils.source import load_script

    summarize = load_script("sync_async.py").summarize
    parts = [{"rank": 0, "applied": [(1, 0, 0, 0, 1.5)], "hello": {1: 0.0, 2: 0.1}, "curve": [(1, 0.1, 0.5)],
              "projection": 1.5, "final": None},                 # (rank, push, staleness, _, checksum)
             {"rank": 1, "pushes": [(1, 0, 1.5)], "step_s": [0.002, 0.004]}, {"rank": 2, "pushes": [], "step_s": []}]
    res, _ = summarize(parts, "async", 2, 10, types.SimpleNamespace(steps=1), 0.0)
    assert res["mean_step_s"] == {"1": 0.003, "2": None}


@pytest.mark.parametrize("nproc", [2, 4])
def test_topk_hook_equals_ddp_at_100_percent_and_error_feedback_matters(nproc, starts_processes):
    """Lesson 09's top-k hook (mgpu_utils.parallel.sparsify): sending every entry equals DDP's all-reduce (asserted in
    the script); at 1% each rank sends 2 numbers (index, value) per kept entry, gathered by n - 1 ring steps; and error
    feedback ends far more accurate than dropping the rest (measured, seeds 0-3: 0.82-0.88 against 0.24-0.40 at
    4 ranks, 0.76-0.89 against 0.18-0.29 at 2)."""
    res = launch("sparsify.py", nproc=nproc, show="none")
    runs, params, n = res["runs"], res["params"], nproc
    assert math.isclose(runs["dense"]["bytes_per_step"], 2 * (n - 1) / n * params * 4)
    ef, no_ef = runs["top-k 1% + EF"], runs["top-k 1%, no EF"]
    assert ef["bytes_per_step"] == no_ef["bytes_per_step"] < runs["dense"]["bytes_per_step"] / 10
    calls_per_step = ef["calls"] // res["steps"]              # one call per gradient bucket
    assert ef["bytes_per_step"] <= (n - 1) * 2 * 4 * (0.01 * params + calls_per_step)
    assert ef["final_acc"] > no_ef["final_acc"] + 0.1


def test_diloco_with_outer_lr_1_and_no_momentum_is_local_sgd(tmp_path, starts_processes):
    """DiLoCo's outer step on the averaged change (launch_scripts/local_sgd.py --diloco): with outer lr 1 and
    momentum 0 it takes exactly the average, so it equals local SGD; with its defaults it takes other steps on the
    same communication (one all-reduce every H steps)."""
    dump = tmp_path / "finals.pt"
    r = launch("local_sgd.py", nproc=2, show="none",
               args=["--H", "4", "--diloco", "4", "--outer-lr", "1", "--outer-momentum", "0", "--steps", "16",
                     "--eval-every", "8", "--dump", dump])
    finals = torch.load(dump)
    assert (finals["H=4"] - finals["DiLoCo H=4"]).abs().max().item() < 1e-6
    assert r["runs"]["DiLoCo H=4"]["allreduce_calls"] == r["runs"]["H=4"]["allreduce_calls"] == 4
    r = launch("local_sgd.py", nproc=2, show="none",
               args=["--H", "4", "--diloco", "4", "--steps", "16", "--eval-every", "8", "--dump", dump])
    finals = torch.load(dump)
    assert (finals["H=4"] - finals["DiLoCo H=4"]).abs().max().item() > 1e-3
    assert r["runs"]["DiLoCo H=4"]["outer"] == [0.7, 0.9]


def test_topk_pairs_are_added_rank_by_rank_without_repeated_indices(monkeypatch):
    """Review M5. On CUDA, index_add_ adds repeated indices with atomics in no fixed order, so two runs of one
    GPU job could differ in the last bits (tests/package/test_launch_warm.py compares results exactly). The ranks' top-k
    sets overlap; each rank's own indices are distinct, so adding rank by rank repeats none within a call.
    Simulated: 2 ranks whose pairs share every index (rank 1 sends twice rank 0's values)."""
    import types

    from mgpu_utils.parallel import sparsify

    calls, real = [], torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_",
                        lambda self, dim, index, source, **kw: calls.append(index.tolist()) or real(
                            self, dim, index, source, **kw))
    monkeypatch.setattr(sparsify, "dist", types.SimpleNamespace(get_world_size=lambda: 2))

    def all_gather_single(out, mine, async_op):
        k = mine.numel() // 2
        out.copy_(torch.cat([mine, mine[:k], 2 * mine[k:]]))
        done = torch.futures.Future()
        done.set_result([out])
        return types.SimpleNamespace(get_future=lambda: done)
    monkeypatch.setattr(sparsify, "all_gather_single", all_gather_single)
    grad = torch.arange(1.0, 9.0)
    bucket = types.SimpleNamespace(buffer=lambda: grad, index=lambda: 0)
    dense = sparsify.topk_hook(sparsify.TopKState(ratio=0.5, error_feedback=False), bucket).wait()
    torch.testing.assert_close(dense, torch.tensor([0, 0, 0, 0, 5, 6, 7, 8]) * 1.5)    # (v + 2v) / 2
    assert calls and all(len(set(c)) == len(c) for c in calls), f"an index added twice in one call: {calls}"
