"""Lesson 05: pipeline schedules (pure Python and under torchrun) and tensor-parallel layers."""
import os
import subprocess
import sys

import pytest

from mgpu_utils.launch.launcher import LaunchError, launch
from mgpu_utils.env import REPO_ROOT
from mgpu_utils.costs.memory_model import in_flight_micro_batches
from mgpu_utils.parallel.schedules import (SCHEDULES, bubble_formula, bubble_fraction, check_p2p_deadlock_free,
                                           stall_reason, stalled_actions,
                                           gpipe_actions, interleaved_actions, measured_durations, one_f_one_b_actions,
                                           p2p_plan, peak_in_flight, schedule_actions, simulate)

TOL = 1e-5


def test_1f1b_and_gpipe_lists_by_hand():
    F = lambda i, s: ("F", i, s)  # noqa: E731
    B = lambda i, s: ("B", i, s)  # noqa: E731
    assert one_f_one_b_actions(2, 3) == [[F(0, 0), F(1, 0), B(0, 0), F(2, 0), B(1, 0), B(2, 0)],
                                         [F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 1), B(2, 1)]]
    assert gpipe_actions(2, 2) == [[F(0, 0), F(1, 0), B(0, 0), B(1, 0)], [F(0, 1), F(1, 1), B(0, 1), B(1, 1)]]
    assert interleaved_actions(2, 2, 2)[0][:4] == [F(0, 0), F(1, 0), F(0, 2), F(1, 2)]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (3, 6), (4, 8), (4, 4), (4, 12)])
def test_every_stage_runs_every_micro_batch_once(name, p, m):
    v = 2 if name == "interleaved" else 1
    acts = schedule_actions(name, p, m, v)
    mbs = 1 if name == "naive" else m
    for r, lst in enumerate(acts):
        stages = {s for _, _, s in lst}
        assert stages == set(range(r, p * v, p))
        assert sorted(lst) == sorted((k, i, s) for k in "FB" for i in range(mbs) for s in stages)
        for i in range(mbs):
            for s in stages:
                assert lst.index(("F", i, s)) < lst.index(("B", i, s))


@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (2, 8), (3, 5), (4, 8), (4, 16), (8, 8)])
def test_simulated_bubble_matches_the_formula(p, m):
    for name in ("gpipe", "1f1b"):
        tl = simulate(schedule_actions(name, p, m))
        assert bubble_fraction(tl) == pytest.approx((p - 1) / (m + p - 1))
        assert max(a["end"] for acts in tl for a in acts) == pytest.approx((m + p - 1) * 3.0)   # t_f + t_b = 3
    if m % p == 0:
        tl = simulate(interleaved_actions(p, m, 2))
        assert bubble_fraction(tl) == pytest.approx(bubble_formula(p, m, 2))
    assert simulate(gpipe_actions(p, 1)) == simulate(schedule_actions("naive", p, m))


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (4, 2), (8, 16)])
def test_peak_in_flight_matches_memory_model(p, m):
    assert peak_in_flight(simulate(gpipe_actions(p, m))) == [m] * p
    assert peak_in_flight(one_f_one_b_actions(p, m)) == [min(p - r, m) for r in range(p)]
    assert peak_in_flight(gpipe_actions(p, m))[0] == in_flight_micro_batches("gpipe", p, m)
    assert peak_in_flight(one_f_one_b_actions(p, m))[0] == in_flight_micro_batches("1f1b", p, m)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_peak_in_flight_formula(p, v):
    """Rank r: 2(p-r-1) + (v-1)p warm-up chunk forwards, then one more before its first backward; in
    stage units (a chunk counts 1/v) rank 0 holds p + (p-1)/v = p (1 + (p-1)/(p v)) micro-batches
    (Korthikanti et al. 2022), more than 1F1B's p."""
    peaks = peak_in_flight(interleaved_actions(p, 4 * p, v))
    assert peaks == [(2 * (p - r - 1) + (v - 1) * p + 1) / v for r in range(p)]
    assert peaks[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_a_stalled_action_is_found_and_explains_a_bubble_below_the_formula():
    """Lesson 05's failure on a quiet machine (fresh-clone make course): the interleaved replay 0.024
    below its formula. One forward on rank 0 stalled 100 ms in the steady state gives that; the
    average load cannot show it, stalled_actions does."""
    acts = schedule_actions("interleaved", 4, 8, 2)
    even = measured_durations(simulate(acts, t_f=0.030, t_b=0.060))
    assert stalled_actions(simulate(acts, durations=even), over_s=0.02) == []
    assert stall_reason({"lib_interleaved": []}) is None
    stalled = dict(even)
    stalled[("F", 5, 0)] += 0.1
    tl = simulate(acts, durations=stalled)
    assert bubble_fraction(tl, t0=0.0) < bubble_formula(4, 8, 2) - 0.02
    found = stalled_actions(tl, over_s=0.02)
    assert [(a["rank"], a["kind"], a["mb"], a["stage"]) for a in found] == [(0, "F", 5, 0)]
    assert found[0]["s"] == pytest.approx(0.115) and found[0]["median_s"] == pytest.approx(0.015)
    assert stall_reason({"gpipe": [], "lib_interleaved": found}) == (
        "lib_interleaved: rank 0's forward of micro-batch 5 (stage 0) took 115 ms, 100 ms over the median "
        "forward: stage times were not equal, as the formula assumes")
    assert stalled_actions(tl, over_s=0.2) == []
    with pytest.raises(ValueError, match="over_s is how much longer"):
        stalled_actions(tl, over_s=0)
    # stages of unequal cost (load balancing): the last stage 30 ms slower is no stall per stage, one
    # backward 50 ms over its stage's median is
    acts = schedule_actions("gpipe", 2, 4)
    d = {(k, i, s): (0.01 + 0.03 * s) * (1 if k == "F" else 2) for r in acts for k, i, s in r}
    assert len(stalled_actions(simulate(acts, durations=d), over_s=0.02)) == 4     # per kind: stage 1 backwards
    assert stalled_actions(simulate(acts, durations=d), over_s=0.02, per_stage=True) == []
    d[("B", 2, 1)] += 0.05
    found = stalled_actions(simulate(acts, durations=d), over_s=0.02, per_stage=True)
    assert [(a["rank"], a["kind"], a["mb"]) for a in found] == [(1, "B", 2)]
    assert stall_reason({"equal gpipe": found}) == (
        "equal gpipe: rank 1's backward of micro-batch 2 (stage 1) took 130 ms, 50 ms over its stage's "
        "median backward: stage times were not the ones the prediction assumes")


def test_simulate_with_durations():
    acts = one_f_one_b_actions(3, 4)
    default = simulate(acts)
    assert simulate(acts, durations=measured_durations(default)) == default
    slow = {k: (3.0 if k == ("F", 0, 1) else d) for k, d in measured_durations(default).items()}
    assert max(a["end"] for r in simulate(acts, durations=slow) for a in r) == pytest.approx(
        max(a["end"] for r in default for a in r) + 2.0)      # on the critical path: the step is 2 longer


def test_saved_activation_bytes_counts_distinct_tensors():
    import torch
    from mgpu_utils.parallel.pipeline import build_model, saved_activation_bytes
    mb, d, k = 3, 8, 4
    x = torch.randn(mb, d)
    # k blocks of Linear + Tanh: the input plus k Tanh outputs (Tanh k's output is Linear k+1's input)
    assert saved_activation_bytes(build_model(k, d), x) == (k + 1) * mb * d * 4
    assert saved_activation_bytes(torch.nn.Sequential(torch.nn.Tanh()), x.requires_grad_()) == mb * d * 4


def test_argument_validation_names_the_fix():
    import torch
    from mgpu_utils.parallel import tensor_parallel as tp
    from mgpu_utils.parallel.pipeline import check_args
    parts = ["naive", "lib_interleaved"]
    check_args(16, 32, 8, 2, 4, parts)                         # valid: no error
    with pytest.raises(ValueError, match="--micro-batches a multiple of the world size 4, got 6: use --micro-batches"):
        check_args(24, 36, 6, 2, 4, parts)
    check_args(24, 36, 6, 2, 4, ["naive", "gpipe"])            # fine without the interleaved part
    with pytest.raises(ValueError, match="--layers 12 does not split into 8 .*use a multiple of 8"):
        check_args(12, 32, 8, 2, 4, parts)
    with pytest.raises(ValueError, match="--global-batch 30 is not divisible by --micro-batches 8"):
        check_args(16, 30, 8, 2, 4, parts)
    assert tp.sequence_slice(12, 1, 4) == slice(3, 6)
    with pytest.raises(ValueError, match="sequence length 10 does not split evenly over 4 ranks: use .*multiple of 4"):
        tp.sequence_slice(10, 0, 4)
    assert tp.valid_world_sizes(8, 256, 12) == [1, 2, 4]
    assert tp.valid_world_sizes(6, 24, 18) == [1, 2, 3, 6]
    with pytest.raises(ValueError, match="hidden size 30 .* 4 ranks: use --width a multiple of --heads 4"):
        tp.Attention(30, 4)
    with pytest.raises(ValueError, match="size 10 does not split evenly over 4 ranks: use a sequence length"):
        tp.check_split(torch.zeros(2, 10, 3).shape[1], 4, "dimension 1 of size", "use a sequence length divisible")


def test_simulate_detects_a_deadlock():
    bad = [[("F", 0, 0), ("B", 0, 0)], [("B", 0, 1), ("F", 0, 1)]]   # last stage backward before forward
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(bad)


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 3), (4, 8), (4, 1)])
def test_executor_messages_are_deadlock_free_with_rendezvous_sends(name, p, m):
    acts = schedule_actions(name, p, m)
    plans = [p2p_plan(acts[r], r, p) for r in range(p)]
    assert check_p2p_deadlock_free(plans) == (2 * (p - 1) * (1 if name == "naive" else m))


def test_deadlock_checker_can_fail():
    # both ranks send first, each waiting for a receive the other posts only later: NCCL hangs
    plans = [[[("send", 1, "a")], [("recv", 1, "b")]], [[("send", 0, "b")], [("recv", 0, "a")]]]
    with pytest.raises(ValueError, match="deadlock"):
        check_p2p_deadlock_free(plans)
    # the interleaved order with one send + one receive per batch is such a case (why the
    # hand-written executor does not run it; Megatron posts both directions together there)
    acts = interleaved_actions(2, 4, 2)
    with pytest.raises(ValueError, match="deadlock"):
        check_p2p_deadlock_free([p2p_plan(acts[r], r, 2) for r in range(2)])


def test_plots_and_explorer():
    import matplotlib
    matplotlib.use("Agg")
    from mgpu_utils.figures.model_parallel import draw_layer_split, draw_tp_mlp, explorer, plot_timeline

    fig = plot_timeline(simulate(one_f_one_b_actions(4, 8)), "1f1b")
    assert sum(len(c.get_paths()) for c in fig.axes[0].collections) == 4 * 16
    assert draw_layer_split(4).axes and draw_tp_mlp(2).axes
    box = explorer(4, 8, "gpipe")
    box.children[0].children[2].value = "interleaved"          # redraws without error
    assert box.children[0].children[0].value == 4


@pytest.mark.parametrize("nproc,stage_ms", [(2, 30), (4, 0)])
def test_pipeline_schedules_equal_single_device(nproc, stage_ms, starts_processes, capsys):
    """Every part against the single-device model; timelines complete; on 2 ranks, with 30 ms sleeps per
    stage, every schedule replayed with its measured durations gives (p-1)/(v*m+p-1) within 0.02, and the
    measured bubbles lie within 0.1 above it (the time between actions) and below the naive one: on a quiet
    machine (mgpu_utils.timing.LoadWatch) and when no action stalled 20 ms or more over the median of its
    kind (lesson 05 claims the same so), as the formula assumes equal stage times. One action 20 ms long
    moves a bubble by up to 0.013 at p = 2, m = 8 (schedules.simulate); a 100 ms stall failed lesson 05 once."""
    from mgpu_utils.timing import LoadWatch

    with LoadWatch(cores=2) as machine:
        res = launch("pipeline_parallel.py", nproc=nproc, show="none", args=["--stage-ms", stage_ms])
    assert set(res["checks"]) == {"naive", "gpipe", "1f1b", "lib_gpipe", "lib_1f1b", "lib_interleaved"}
    for part, errs in res["checks"].items():     # out_err None: the last stage returned no output
        assert errs["out_err"] is not None and errs["out_err"] < TOL, (part, errs)
        assert errs["loss_err"] < TOL and errs["grad_err"] < TOL, (part, errs)
    m, p = res["micro"], nproc
    for part, tl in res["timelines"].items():
        v = res["chunks"] if part == "lib_interleaved" else 1
        n_mb = 1 if part == "naive" else m
        assert [len(acts) for acts in tl] == [2 * n_mb * v] * p, part
        for acts in tl:
            assert all(a["end"] >= a["start"] >= 0 for a in acts)
    for part, tl in res["timelines"].items():      # every rank ran exactly the action list, library included
        name = part.removeprefix("lib_")
        ran = [[(a["kind"], a["mb"], a["stage"]) for a in sorted(acts, key=lambda a: a["start"])] for acts in tl]
        assert ran == schedule_actions(name, p, 1 if name == "naive" else m, res["chunks"]), part
    assert peak_in_flight(res["timelines"]["1f1b"]) == [min(p - r, m) for r in range(p)]
    assert peak_in_flight(res["timelines"]["gpipe"]) == [m] * p
    if stage_ms:
        # 20 runs on 2 cores: measured - formula 0.010..0.047 (the time between actions), the replay with the
        # measured durations and free messages -0.001..0.004; with one core kept busy the replay was 0.012 off
        # (measured again for the stall check: see the commit that added it)
        naive = bubble_fraction(res["timelines"]["naive"], t0=0.0)
        off = {}
        for part in ("gpipe", "1f1b", "lib_gpipe", "lib_1f1b", "lib_interleaved"):
            tl, name = res["timelines"][part], part.removeprefix("lib_")
            v = res["chunks"] if name == "interleaved" else 1
            formula = bubble_formula(p, m, v)
            replay = simulate(schedule_actions(name, p, m, v), durations=measured_durations(tl))
            measured = bubble_fraction(tl, t0=0.0)
            off[part] = (bubble_fraction(replay, t0=0.0) - formula, measured - formula, measured < naive)
        # the formula assumes equal stage times: an action stalled 20 ms or more says this run cannot show it
        stalls = stall_reason({part: stalled_actions(tl, over_s=0.02) for part, tl in res["timelines"].items()})
        with capsys.disabled():             # the line says whether the bounds were asserted, and why not
            machine.claim(all(abs(r) < 0.02 and -0.01 < d < 0.1 and below for r, d, below in off.values()),
                          "replayed bubbles within 0.02 of (p-1)/(v*m+p-1), measured ones within -0.01..0.1 "
                          f"and below naive: {({k: (round(r, 3), round(d, 3)) for k, (r, d, _) in off.items()})}",
                          unless=stalls)


@pytest.mark.parametrize("nproc", [2, 4])
def test_tensor_parallel_layers_equal_dense(nproc, starts_processes):
    res = launch("tensor_parallel.py", nproc=nproc, show="none")
    assert set(res["errors"]) == {f"scratch_{n}" for n in ("mlp", "attention", "mlp_sp")} | \
        {f"dtensor_{n}" for n in ("mlp", "attention", "attention_prep", "block_sp")}
    for name, errs in res["errors"].items():
        assert max(errs.values()) < TOL, (name, errs)
    size = res["batch"] * res["seq"] * res["hidden"] * 4
    ops = lambda log: [(c["op"], c["phase"], c["bytes"]) for c in log]  # noqa: E731
    assert ops(res["comm"]["scratch_mlp"]) == [("all_reduce", "forward", size), ("all_reduce", "backward", size)]
    assert ops(res["comm"]["scratch_attention"]) == ops(res["comm"]["scratch_mlp"])
    # sequence parallel: b2's gradient is summed over ranks inside the module (no all-reduce by the
    # caller: the script compares b2.grad with the dense gradient as it is after backward)
    assert sorted(ops(res["comm"]["scratch_mlp_sp"])) == sorted(
        [(op, ph, size) for op in ("all_gather", "reduce_scatter") for ph in ("forward", "backward")]
        + [("all_reduce", "backward", res["hidden"] * 4)])
    pl = res["grad_placements"]
    assert pl["norm.weight"] == pl["norm.bias"] == "P(sum)", pl
    c = res["comm"]
    assert c["dtensor_mlp"] == {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}}
    assert c["dtensor_attention_prep"] == c["dtensor_mlp"]
    assert c["dtensor_attention"]["backward"] == {"all_reduce": 3}
    assert c["dtensor_block_sp"]["forward"] == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}


def test_scripts_run_as_plain_python(starts_processes):
    """World size 1 without torchrun: the hand-written parts run, the library parts say SKIPPED."""
    for script, args in (("pipeline_parallel.py", ["--stage-ms", "0", "--schedules", "naive,gpipe,1f1b,lib_1f1b"]),
                         ("tensor_parallel.py", [])):
        out = subprocess.run([sys.executable, str(REPO_ROOT / "launch_scripts" / script), *args],
                             capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert out.returncode == 0, out.stderr[-2000:]
        assert "SKIPPED" in out.stdout and "MGPU_RESULT" in out.stdout


def test_schedule_defaults_errors_and_explicit_window():
    """Defaults (one micro-batch for naive, two chunks for interleaved), the exact error messages, and a
    bubble over an explicit [t0, t1] window, by hand."""
    from mgpu_utils.parallel.schedules import interleaved_actions, naive_actions, one_f_one_b_actions
    assert naive_actions(3) == naive_actions(3, 1) and len(naive_actions(3)[0]) == 2
    assert interleaved_actions(2, 4) == interleaved_actions(2, 4, 2) == schedule_actions("interleaved", 2, 4)
    assert interleaved_actions(2, 4, 1) == one_f_one_b_actions(2, 4)
    assert schedule_actions("naive", 2, 3) == naive_actions(2, 3)
    with pytest.raises(ValueError, match=r"^interleaved 1F1B needs m divisible by p, got m=3, p=2$"):
        interleaved_actions(2, 3)
    with pytest.raises(ValueError, match=r"^schedule must be one of .*, got 'zigzag'$"):
        schedule_actions("zigzag", 2, 4)
    tl = [[{"start": 1.0, "end": 2.0}], [{"start": 2.0, "end": 3.0}]]
    assert bubble_fraction(tl) == pytest.approx(1 - 2 / (2 * 2))                 # window 1..3
    assert bubble_fraction(tl, t0=0.0) == pytest.approx(1 - 2 / (2 * 3))         # window 0..3
    assert bubble_fraction(tl, t0=0.0, t1=4.0) == pytest.approx(1 - 2 / (2 * 4))  # window 0..4


def test_schedule_arguments_and_interleaved_durations_by_hand():
    """Mutants the first mutation runs left alive in schedules.py (bad arguments, v passed through,
    a chunk's default duration t/v, the deadlock message when one rank has finished)."""
    for args, name in (((0, 4, 2), "p"), ((2, 0, 2), "m"), ((2, 4, 0), "v")):
        with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
            interleaved_actions(*args)
    assert schedule_actions("interleaved", 2, 4, 3) == interleaved_actions(2, 4, 3) != interleaved_actions(2, 4, 2)
    tl = simulate(interleaved_actions(2, 2, 2), t_f=1.0, t_b=2.0)      # 2 chunks: each action takes t/2
    for acts in tl:
        assert sum(a["end"] - a["start"] for a in acts) == pytest.approx(2 * (1.0 + 2.0))   # m (t_f + t_b)
    with pytest.raises(ValueError, match=r"next actions per rank \{1: \('B', 0, 1\)\}$"):
        simulate([[("F", 0, 0)], [("B", 0, 1)]])                       # rank 0 finished, rank 1 stuck


def test_p2p_plan_by_hand_with_chunks():
    """Rank 0 of p = 2 holding stages 0 and 2 of 4 (v = 2), derived by hand from the rule: batch i sends
    action i-1's output and receives action i's input; stage s lives on rank s % p."""
    acts = [("F", 0, 0), ("F", 0, 2), ("B", 0, 2), ("B", 0, 0)]
    assert p2p_plan(acts, 0, 2) == [
        [],
        [("send", 1, ("F", 0, 0)), ("recv", 1, ("F", 0, 1))],
        [("send", 1, ("F", 0, 2)), ("recv", 1, ("B", 0, 3))],
        [("send", 1, ("B", 0, 2)), ("recv", 1, ("B", 0, 1))],
        [],
    ]
    # one rank holding both stages: every message stays inside the rank, no op at all
    assert p2p_plan([("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0)], 0, 1) == [[]] * 5
    assert p2p_plan([], 0, 2) == [[]]


def test_deadlock_checker_by_hand():
    kf, kb = ("F", 0, 0), ("B", 0, 1)
    # receive listed before send in both batches: still one exchange, two messages
    assert check_p2p_deadlock_free([[[("recv", 1, kb), ("send", 1, kf)]], [[("recv", 0, kf), ("send", 0, kb)]]]) == 2
    # rank 0 has nothing to do; ranks 1 and 2 exchange
    assert check_p2p_deadlock_free([[], [[("send", 2, kf)]], [[("recv", 1, kf)]]]) == 1
    # a batch whose first op completes in round 1 and whose second op only in round 2
    assert check_p2p_deadlock_free([[[("send", 1, kf), ("send", 2, kb)]], [[("recv", 0, kf)]],
                                    [[], [("recv", 0, kb)]]]) == 2
    with pytest.raises(ValueError, match=r"^rank 0 sends \('F', 0, 0\) while rank 1 waits for \('B', 0, 1\)$"):
        check_p2p_deadlock_free([[[("send", 1, kf)]], [[("recv", 0, kb)]]])
    # a send to a rank that has finished, and two ranks waiting: the message names both, in order
    with pytest.raises(ValueError, match=r"^deadlock: rank 0 waits on \[\('send', 1, \('F', 0, 0\)\)\]$"):
        check_p2p_deadlock_free([[[("send", 1, kf)]], []])
    with pytest.raises(ValueError, match=r"^deadlock: rank 1 waits on \[\('recv', 2, 'a'\)\], "
                                         r"rank 2 waits on \[\('recv', 1, 'b'\)\]$"):
        check_p2p_deadlock_free([[], [[("recv", 2, "a")]], [[("recv", 1, "b")]]])


@pytest.mark.parametrize("nproc", [2, 4])
def test_vocab_parallel_equals_one_process_without_gathering_logits(nproc, starts_processes):
    """Lesson 05: embedding, LM head and cross-entropy split over the vocabulary (the script assert_closes the
    losses and every gradient shard against one process); here the traffic and the memory by hand."""
    tokens, width, vocab = 64, 64, 32_000
    res = launch("vocab_parallel.py", nproc=nproc, show="none")
    ref, mine = zip(*res["losses"])
    assert max(abs(a - b) for a, b in zip(ref, mine)) < 1e-5
    # forward: the embedding's [tokens, h] sum, then max, sum of exp and the target's logit (one number a
    # token each); backward: the head input's gradient [tokens, h]. Never [tokens, V] logits.
    assert res["collectives_step0"] == [["all_reduce", tokens * width * 4]] + [["all_reduce", tokens * 4]] * 3 \
        + [["all_reduce", tokens * width * 4]]
    assert res["logit_bytes_rank"] * nproc == res["logit_bytes_full"] == tokens * vocab * 4
    assert res["vocab_param_bytes_rank"] * nproc == res["vocab_param_bytes_full"]


def test_vocab_parallel_pieces_in_one_process_and_a_vocabulary_that_does_not_split(starts_processes):
    from mgpu_utils.parallel.vocab_parallel import vocab_range

    assert [vocab_range(12, r, 3) for r in range(3)] == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(ValueError, match="pad it to a multiple of 5"):
        vocab_range(12, 0, 5)
    with pytest.raises(LaunchError, match="does not split over 3 ranks"):
        launch("vocab_parallel.py", nproc=3, show="none", args=["--vocab", 1000])


def _stage_sums(costs, split):
    ends = [sum(split[:i + 1]) for i in range(len(split))]
    return [sum(costs[e - k:e]) for e, k in zip(ends, split)]


def test_balanced_split_is_the_best_contiguous_split():
    """balanced_split against every way to cut the layers (brute force), ties, and bad input named."""
    import itertools
    import random
    from mgpu_utils.parallel.pipeline import balanced_split
    rng = random.Random(0)
    for _ in range(300):
        p = rng.randint(1, 4)
        costs = [rng.choice([0.5, 1, 2, 3, 5]) for _ in range(rng.randint(p, 9))]
        split = balanced_split(costs, p)
        assert len(split) == p and min(split) >= 1 and sum(split) == len(costs), (costs, p, split)
        n = len(costs)
        best = min(max(_stage_sums(costs, [b - a for a, b in zip((0,) + cuts, cuts + (n,))]))
                   for cuts in itertools.combinations(range(1, n), p - 1))
        assert max(_stage_sums(costs, split)) == best, (costs, p, split)
    assert balanced_split([1] * 8, 4) == [2, 2, 2, 2]
    assert balanced_split([1, 1, 1, 1, 2, 2, 2, 2], 2) == [5, 3]          # lesson 05's exercise 05.5
    assert balanced_split([1] * 12 + [2] * 4, 4) == [4, 5, 4, 3]            # the lesson at p = 4
    with pytest.raises(ValueError, match="3 layers cannot fill 4 stages"):
        balanced_split([1, 1, 1], 4)
    with pytest.raises(ValueError, match="must not be negative, got -1"):
        balanced_split([1, -1, 2], 2)


def test_unequal_stage_formulas_equal_the_simulated_schedules():
    """GPipe's step 3 (sum t + (m-1) max t) and its idle share equal schedules.simulate exactly; 1F1B is at
    most that; equal times give (p-1)/(m+p-1)."""
    import random
    from mgpu_utils.parallel.schedules import unequal_stages_bubble, unequal_stages_step
    rng = random.Random(1)
    for _ in range(200):
        p = rng.randint(1, 5)
        m = rng.randint(1, 12)
        t = [rng.choice([0.5, 1, 2, 3]) for _ in range(p)]
        steps = {}
        for name in ("gpipe", "1f1b"):
            acts = schedule_actions(name, p, m)
            tl = simulate(acts, durations={(k, i, s): t[s] * (1 if k == "F" else 2) for r in acts for k, i, s in r})
            steps[name] = max(a["end"] for r in tl for a in r)
            if name == "gpipe":
                assert bubble_fraction(tl, t0=0.0) == pytest.approx(unequal_stages_bubble(t, m), abs=1e-12)
        assert steps["gpipe"] == pytest.approx(unequal_stages_step(t, m)), (p, m, t)
        assert steps["1f1b"] <= steps["gpipe"] + 1e-9, (p, m, t)
    assert unequal_stages_bubble([2.0] * 4, 8) == pytest.approx(bubble_formula(4, 8))
    assert unequal_stages_step([4, 8], 4) == 108 and unequal_stages_step([6, 6], 4) == 90
    with pytest.raises(ValueError, match="need stage times >= 0"):
        unequal_stages_step([1, -1], 4)
    with pytest.raises(ValueError, match="m >= 1"):
        unequal_stages_step([1, 1], 0)


def test_split_and_layer_times_validated_with_the_flag_to_change():
    from mgpu_utils.parallel.pipeline import build_model, check_args, split_stages
    model = build_model(8, 4)
    assert [len(s) for s in split_stages(model, 2, [5, 3])] == [5, 3]
    assert [len(s) for s in split_stages(model, 4)] == [2, 2, 2, 2]
    assert split_stages(model, 2, [5, 3])[1][0] is model[5]
    with pytest.raises(ValueError, match="--split 6,3 must give each of the 2 stages at least one layer"):
        split_stages(model, 2, [6, 3])
    with pytest.raises(ValueError, match="--split 8,0 must give"):
        split_stages(model, 2, [8, 0])
    check_args(8, 16, 4, 2, 2, ["gpipe"], [5, 3], [1.0] * 8)              # valid: no error
    check_args(7, 16, 4, 2, 2, ["gpipe"], [4, 3])                          # a split need not be equal
    with pytest.raises(ValueError, match=r"--split 4,3 must give each of the 2 stages \(one per rank\).*--layers 8"):
        check_args(8, 16, 4, 2, 2, ["gpipe"], [4, 3])
    with pytest.raises(ValueError, match="--split 8 must give each of the 2 stages"):
        check_args(8, 16, 4, 2, 2, ["gpipe"], [8])
    with pytest.raises(ValueError, match="leave lib_interleaved out of --schedules"):
        check_args(8, 16, 4, 2, 2, ["gpipe", "lib_interleaved"], [5, 3])
    with pytest.raises(ValueError, match="leave lib_interleaved out of --schedules"):
        check_args(8, 16, 4, 2, 2, ["lib_interleaved"], None, [1.0] * 8)
    with pytest.raises(ValueError, match=r"--layer-ms needs one time >= 0 per layer \(8 for --layers 8\), got 2"):
        check_args(8, 16, 4, 2, 2, ["gpipe"], None, [1.0, 2.0])
    with pytest.raises(ValueError, match="--layer-ms needs one time >= 0"):
        check_args(8, 16, 4, 2, 2, ["gpipe"], None, [1.0] * 7 + [-1.0])


@pytest.mark.parametrize("nproc", [2, 4])
def test_unequal_stages_equal_single_device_and_last_at_least_their_sleeps(nproc, starts_processes):
    """A pipeline with heavy layers, cut by balanced_split: every schedule equals one device; every forward
    lasts at least its stage's summed layer times and every step at least the prediction (by construction:
    a sleep lasts at least its time and the actions wait for the same inputs as in schedules.simulate)."""
    from mgpu_utils.parallel.pipeline import balanced_split
    costs = [1] * (4 * (nproc - 1)) + [2] * 4
    split, unit_ms, m = balanced_split(costs, nproc), 2, 2 * nproc
    res = launch("pipeline_parallel.py", nproc=nproc, show="none",
                 args=["--layers", len(costs), "--micro-batches", m, "--global-batch", 4 * m,
                       "--layer-ms", ",".join(str(unit_ms * c) for c in costs), "--split", ",".join(map(str, split)),
                       "--schedules", "naive,gpipe,1f1b,lib_gpipe,lib_1f1b"])
    assert res["split"] == split and res["stage_ms"] == [unit_ms * c for c in _stage_sums(costs, split)]
    assert set(res["checks"]) == {"naive", "gpipe", "1f1b", "lib_gpipe", "lib_1f1b"}
    for part, errs in res["checks"].items():
        assert errs["out_err"] is not None and max(errs.values()) < TOL, (part, errs)
    t = [ms / 1e3 for ms in res["stage_ms"]]
    for part in ("gpipe", "1f1b", "lib_gpipe", "lib_1f1b"):
        tl, name = res["timelines"][part], part.removeprefix("lib_")
        for r, acts in enumerate(tl):
            assert all(a["end"] - a["start"] >= t[r] * (1 if a["kind"] == "F" else 2) - 1e-4 for a in acts), part
        acts = schedule_actions(name, nproc, m)
        pred = simulate(acts, durations={(k, i, s): t[s] * (1 if k == "F" else 2) for r in acts for k, i, s in r})
        assert max(a["end"] for r in tl for a in r) >= max(a["end"] for r in pred for a in r) - 1e-3, part
