"""Lesson 11: scaling laws and predictions, the scaling study, per-rank traces, FLOP counting and MFU."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mgpu_utils.costs import scaling
from mgpu_utils.measure import scaling_study
from mgpu_utils.costs.bandwidth import ring_allreduce_model
from mgpu_utils.launch.launcher import launch
from mgpu_utils.models import byte_gpt2
from mgpu_utils.measure.profiling import breakdown, load_spans, trace_file

ROOT = Path(__file__).resolve().parents[2]


# --- scaling laws (pure) ---

def test_speedups_are_throughput_ratios():
    rows = [{"world_size": 1, "samples_per_s": 100.0}, {"world_size": 2, "samples_per_s": 180.0},
            {"world_size": 4, "samples_per_s": 300.0}]
    assert scaling.speedups(rows) == {1: {"speedup": 1.0, "efficiency": 1.0}, 2: {"speedup": 1.8, "efficiency": 0.9},
                                      4: {"speedup": 3.0, "efficiency": 0.75}}
    with pytest.raises(ValueError, match="world size 1"):
        scaling.speedups(rows[1:])
    with pytest.raises(ValueError, match="two runs with world size 2"):
        scaling.speedups(rows + [rows[1]])


def test_amdahl_fit_recovers_the_serial_fraction():
    n = np.array([1, 2, 4, 8])
    for f in (0.0, 0.05, 0.3):
        assert scaling.fit_amdahl(n, scaling.amdahl_speedup(n, f)) == pytest.approx(f, abs=1e-12)
    assert scaling.amdahl_speedup(4, 0.2) == pytest.approx(1 / (0.2 + 0.8 / 4))
    assert scaling.fit_amdahl([1, 2], [1.0, 1.7]) == pytest.approx(2 / 1.7 - 1)   # one point: exact
    assert scaling.gustafson_speedup(8, 0.25) == pytest.approx(8 - 0.25 * 7)
    for law in (scaling.amdahl_speedup, scaling.gustafson_speedup):
        with pytest.raises(ValueError, match="serial fraction"):
            law(4, 1.5)
        with pytest.raises(ValueError, match="world size"):
            law(0, 0.1)
    with pytest.raises(ValueError, match="more than 1 rank"):
        scaling.fit_amdahl([1], [1.0])
    with pytest.raises(ValueError, match="one speed-up per world size"):
        scaling.fit_amdahl([1, 2], [1.0])


def test_critical_batch_fit_recovers_the_model():
    b = np.array([4, 8, 16, 64, 256])
    fit = scaling.fit_critical_batch(b, scaling.critical_batch_steps(b, 50.0, 20.0))
    assert fit["s_min"] == pytest.approx(50.0) and fit["b_crit"] == pytest.approx(20.0)
    assert fit["e_min"] == pytest.approx(1000.0) and fit["max_rel_error"] < 1e-9
    assert scaling.critical_batch_steps(20, 50, 20) == pytest.approx(100)       # S(B_crit) = 2 S_min
    noisy = scaling.critical_batch_steps(b, 50.0, 20.0) * np.array([1.1, 0.9, 1.05, 0.95, 1.0])
    assert scaling.fit_critical_batch(b, noisy)["max_rel_error"] == pytest.approx(0.1, abs=0.05)
    with pytest.raises(ValueError, match="do not fit"):
        scaling.fit_critical_batch([4, 8, 16], [10, 20, 40])            # rising with B
    with pytest.raises(ValueError, match="do not fit"):
        scaling.fit_critical_batch([8, 64], [385, 19])                  # falling faster than 1 / B
    with pytest.raises(ValueError, match="2 different batch sizes"):
        scaling.fit_critical_batch([4, 4], [10, 20])
    with pytest.raises(ValueError, match="batch > 0"):
        scaling.critical_batch_steps(0, 50, 20)


def test_two_level_allreduce_by_hand():
    """Lesson 11's nodes: NVLink inside a node of 8, one NIC per GPU between nodes."""
    from mgpu_utils.costs.bandwidth import hierarchical_allreduce_model, ring_allreduce_model

    nv, ib, s = (1e-6, 450e9), (2e-6, 50e9), 256e6
    inside = 2 * 7 * 1e-6 + 2 * 7 / 8 * s / 450e9                  # reduce-scatter + all-gather over NVLink
    across = 2 * 7 * 2e-6 + 2 * 7 / 8 * (s / 8) / 50e9              # 8 nodes, each GPU's eighth on its NIC
    assert hierarchical_allreduce_model(s, 64, 8, nv, ib) == pytest.approx(inside + across)
    assert hierarchical_allreduce_model(s, 8, 8, nv, ib) == pytest.approx(ring_allreduce_model(s, 8, *nv))
    # a node injects 8 NICs: far faster than one flat ring at one NIC's bandwidth
    assert hierarchical_allreduce_model(s, 64, 8, nv, ib) < 0.25 * ring_allreduce_model(s, 64, *ib)
    with pytest.raises(ValueError, match="do not fill nodes of 8: use a multiple of 8"):
        hierarchical_allreduce_model(s, 12, 8, nv, ib)
    step = scaling.predict_step(64, 0.015, s, *nv, mode="weak", gpus_per_node=8, inter_node=ib)
    assert step == pytest.approx(0.015 + inside + across)
    with pytest.raises(ValueError, match="together"):
        scaling.predict_step(64, 0.015, s, *nv, gpus_per_node=8)


def test_predicted_step_strong_weak_and_overlap():
    comm2 = 2 * 1e-4 + 1.0 * 8e6 / 1e9                 # 2 ranks: 2(n-1) alpha + 2(n-1)/n * S / B
    assert scaling.predict_step(1, 0.2, 8e6, 1e-4, 1e9) == pytest.approx(0.2)   # no communication alone
    assert scaling.predict_step(2, 0.2, 8e6, 1e-4, 1e9) == pytest.approx(0.1 + comm2)
    assert scaling.predict_step(2, 0.2, 8e6, 1e-4, 1e9, mode="weak") == pytest.approx(0.2 + comm2)
    assert scaling.predict_step(2, 0.2, 8e6, 1e-4, 1e9, overlap=1.0) == pytest.approx(max(0.1, comm2))
    assert scaling.predict_step(2, 0.01, 8e6, 1e-4, 1e9, overlap=0.5) == pytest.approx(0.005 + comm2 - 0.0025)
    pred = scaling.predict_scaling([1, 2], 0.2, 8e6, 1e-4, 1e9, mode="weak")
    assert pred[2]["speedup"] == pytest.approx(2 * 0.2 / (0.2 + comm2)) and pred[1]["efficiency"] == 1.0
    for bad in ({"n": 0}, {"mode": "both"}, {"overlap": 1.5}):
        kw = {"n": 2, "compute_s": 0.2, "grad_bytes": 1e6, "alpha_s": 0.0, "bandwidth_bps": 1e9} | bad
        with pytest.raises(ValueError):
            scaling.predict_step(**kw)
    assert scaling.gpu_compute_seconds(1e15, 1000, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="share of the peak"):
        scaling.gpu_compute_seconds(1e15, 1000, 0.0)


# --- the study (pure, on synthetic runs) ---

def _row(mode, n, sps, sweep=()):
    return {"mode": mode, "world_size": n, "samples_per_s": sps, "threads_per_rank": 1, "local_batch": 64,
            "global_batch": 64 * n, "step_seconds": 64 * n / sps, "compute_seconds": 0.1, "allreduce_s": list(sweep)}


def test_study_fits_amdahl_within_the_cores_and_alpha_beta_on_the_sweep(tmp_path):
    alpha, bw, sizes = 2e-4, 1.5e9, [1 << 16, 1 << 20, 1 << 23]
    sweep = {n: [[b, float(ring_allreduce_model(b, n, alpha, bw))] for b in sizes] for n in (2, 4)}
    strong = [_row("strong", 1, 100.0), _row("strong", 2, 100 * scaling.amdahl_speedup(2, 0.1), sweep[2]),
              _row("strong", 4, 120.0, sweep[4])]                          # 4 ranks on 2 cores: left out
    weak = [_row("weak", 1, 50.0), _row("weak", 2, 95.0)]
    res = scaling_study.study(strong, weak, cores=2)
    assert res["serial_fraction"] == pytest.approx(0.1)
    assert res["alpha_beta"]["world_size"] == 2
    assert res["alpha_beta"]["alpha_s"] == pytest.approx(alpha)
    assert res["alpha_beta"]["bandwidth_bps"] == pytest.approx(bw)
    assert res["alpha_beta"]["max_rel_error"] < 1e-9
    assert res["weak"][2] == {"speedup": 1.9, "efficiency": 0.95} and weak[1]["speedup"] == 1.9
    scaling_study.write_csv(strong + weak, tmp_path / "s.csv")
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0].split(",") == list(scaling_study.COLUMNS) and len(lines) == 6
    table = scaling_study.report_table(strong + weak)
    assert "n/a" in table and "1.90x" in table and len(table.splitlines()) == 6
    assert scaling_study.world_sizes(1) == [1] and scaling_study.world_sizes(2) == [1, 2] and scaling_study.world_sizes(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match="divisible"):
        scaling_study.scaling_runs([1, 3], "strong", 64)


# --- traces (pure, on a synthetic trace) ---

def _event(name, ts, dur, tid=1, cat="user_annotation"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_breakdown_of_a_synthetic_trace(tmp_path):
    events = [_event("forward", 0, 1000), _event("backward", 1000, 3000), _event("optimizer", 4000, 500),
              _event("autograd::engine::evaluate_function: MmBackward0", 1000, 2000, cat="cpu_op"),
              _event("gloo:all_reduce", 2500, 1000, tid=7),               # 500 us under compute, 500 after it
              _event("c10d::allreduce_", 2500, 5, cat="cpu_op"),           # the enqueue: not the work
              _event("gloo:all_reduce", 3200, 600, tid=8),                # overlaps the first: union 2500..3800
              {"ph": "M", "name": "thread_name", "tid": 7}]
    path = trace_file(tmp_path, 3)
    path.write_text(json.dumps({"traceEvents": events}))
    t = load_spans(path)
    assert t["rank"] == 3 and [s["kind"] for s in t["spans"]].count("all-reduce") == 2
    b = breakdown(t)
    assert b == {"steps": 1, "data": 0.0, "forward": 1.0, "backward": 3.0, "optimizer": 0.5,
                 "all-reduce": 1.3, "overlapped": 0.5, "exposed": pytest.approx(0.8)}
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        load_spans(tmp_path / "x.json")
    path.write_text(json.dumps({"traceEvents": events[1:3]}))
    with pytest.raises(ValueError, match="no 'forward'"):
        breakdown(load_spans(path))


def test_a_gpu_trace_is_read_on_the_device_timeline(tmp_path):
    """Issue 31 (misleading on GPUs): on a GPU the host's autograd calls only enqueue kernels and return, so
    an NCCL kernel that runs while the host is still in autograd but no GPU kernel runs is exposed, not
    overlapped; and the phases are the profiler's GPU-side record of them."""
    events = [_event("forward", 0, 100), _event("backward", 100, 300),               # host: enqueue only
              _event("forward", 0, 1000, cat="gpu_user_annotation"),
              _event("backward", 1000, 3000, cat="gpu_user_annotation"),
              _event("autograd::engine::evaluate_function: MmBackward0", 100, 3900, cat="cpu_op"),
              _event("sm80_xmma_gemm", 1000, 1500, tid=7, cat="kernel"),           # GPU compute 1000..2500
              _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2000, 1000, tid=9, cat="kernel")]
    path = trace_file(tmp_path, 0)
    path.write_text(json.dumps({"traceEvents": events}))
    t = load_spans(path)
    assert t["timeline"] == "device"
    b = breakdown(t)
    assert b["forward"] == 1.0 and b["backward"] == 3.0                   # the GPU's phases, not the host's
    assert b["all-reduce"] == 1.0 and b["overlapped"] == 0.5 and b["exposed"] == 0.5


# --- launches ---

def test_weak_scaling_run_and_its_all_reduce_sweep(starts_processes):
    args = ["--per-rank-batch", 32, "--width", 64, "--layers", 2, "--steps", 2, "--warmup", 1,
            "--sweep-bytes", "4096,65536"]
    one = launch("ddp_speedup.py", nproc=1, args=args, show="none", threads_per_rank=1)
    two = launch("ddp_speedup.py", nproc=2, args=args, show="none", threads_per_rank=1)
    assert (one["global_batch"], two["global_batch"]) == (32, 64) and two["local_batch"] == 32
    assert two["grad_bytes"] == 4 * two["params"]
    assert [b for b, _ in two["allreduce_s"]] == [4096, 65536] and all(t > 0 for _, t in two["allreduce_s"])
    assert one["allreduce_s"] == []                                      # nothing to reduce alone
    if two["energy_j"] is None:                                          # no counters here: said, not hidden
        assert "not available" in two["energy_note"] and two["joules_per_sample"] is None
    else:
        assert two["joules_per_sample"] == pytest.approx(two["energy_j"] / (10 * 64))
        assert two["energy_source"] == "rapl"                           # the CPU tier: the packages


def test_profile_step_writes_one_trace_per_rank_and_counts_the_model_flops(tmp_path, starts_processes):
    cfg = dict(layers=2, embd=64, heads=2, seq=32)
    res = launch("profile_step.py", nproc=2, threads_per_rank=1, show="none",
                 args=["--layers", 2, "--width", 64, "--heads", 2, "--seq", 32, "--per-rank-batch", 4, "--warmup", 1,
                       "--steps", 2, "--traced-steps", 2, "--trace-dir", tmp_path])
    assert res["traces"] == [str(trace_file(tmp_path, r)) for r in (0, 1)]
    for r in (0, 1):
        t = load_spans(res["traces"][r])
        assert t["rank"] == r
        assert any(s["kind"] == "all-reduce" for s in t["spans"]), "the gradient all-reduces are in the trace"
        b = breakdown(t)
        assert b["steps"] == 2 and b["backward"] > 0 and b["all-reduce"] > 0
    # the job's FLOPs per step = world size x one rank's forward + backward, counted here in one process
    model = byte_gpt2(**cfg)
    x = torch.randint(0, 256, (4, 32))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(x, labels=x).loss.backward()
    attention = 3 * 2 * 2 * cfg["layers"] * 4 * 32 * 32 * cfg["embd"]   # fwd + bwd of QK^T and AV: 12 L T^2 d
    assert {str(k) for k in fc.get_flop_counts()["Global"]} >= {"aten.bmm"}, "attention's products are counted"
    assert fc.get_flop_counts()["Global"][torch.ops.aten.bmm] == attention
    assert res["flops_per_step"] == 2 * fc.get_total_flops()
    assert res["tokens_per_step"] == 2 * 4 * 32
    embed = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    assert res["flops_6n"] == 6 * (sum(q.numel() for q in model.parameters()) - embed) * 2 * 4 * 32
    assert res["mfu"] == pytest.approx(res["flops_per_step"] / res["step_seconds"] / (2 * res["peak_flops_per_s"]))
    assert 0 < res["mfu"] < 1


def test_scaling_benchmark_two_ranks_speed_up(tmp_path, capsys, starts_processes):
    """benchmarks/scaling.py --max-nproc 2: it runs, writes its CSV and figure, and on 2 cores that were
    its own (mgpu_utils.timing.LoadWatch) 2 ranks beat 1 clearly. The goal, 1.5 or more, is the
    benchmark's to measure on a quiet machine (20 quiet runs: 1.59-1.79, README), not this test's."""
    from mgpu_utils.env import machine_report
    from mgpu_utils.timing import LoadWatch, usable_cores

    cores = min(machine_report()["cpu_cores_physical"] or 1, usable_cores())
    with LoadWatch(cores=2) as machine:
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--max-nproc", "2",
                              "--steps", "8", "--backend", "gloo", "--out", str(tmp_path)], capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["threads_per_rank"] == 1 and set(res["speedup"]) == {"1", "2"} and res["speedup"]["1"] == 1.0
    assert (tmp_path / "scaling.csv").read_text().count("\n") == 5 and (tmp_path / "scaling.png").stat().st_size
    if cores >= 2:
        assert res["alpha_s"] is not None and res["bandwidth_GBps"] > 0
    machine.ranks_got(res["cpu_share"]["2"])   # cores busy with another machine's work show here
    with capsys.disabled():                 # the line says whether the bound was asserted, and why not
        machine.claim(res["speedup"]["2"] > 1.25, f"2 ranks on 2 cores: speed-up {res['speedup']['2']:.2f} > 1.25")
