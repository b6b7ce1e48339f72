"""FSDP2 for a model that outgrows one device (issue 36, lessons 06 and 07): fsdp2_scale.py under real torchrun at
1, 2 and 4 ranks. Meta-device init equal to one process's init (and the per-shard reset shown wrong), explicit
forward prefetching in the per-rank timeline, FSDP + tensor parallel on a (dp, tp) mesh, torch.compile per block,
each against one process (the script trains the reference on every rank); CPU offload reported as needing CUDA.
Each run is held to the facts of the tier it reports (its "device"): a GPU machine's 1-rank launch is NCCL on
cuda:0, with DTensor's random tracker, offload run and inductor."""
import sys

import pytest

from mgpu_utils.launch.launcher import LaunchError, launch

FP32 = 1e-5      # SGD with momentum: rounding only (measured 6e-8 to 1.2e-7 at 2 and 4 ranks)


def gathered_ahead(line, i):
    """How many blocks ahead of block i the all-gathers issued before block i's forward reach (root: 1)."""
    return line[:line.index(f"F{i}")].count("AG") - (i + 2)


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_fsdp2_meta_init_prefetch_tp_compile_equal_one_process(nproc, starts_processes):
    r = launch("fsdp2_scale.py", nproc=nproc, show="none")
    on_gpu = r["device"] == "cuda"      # the tier the script ran on: NCCL on cuda:LOCAL_RANK, else gloo on the CPU
    assert r["device"] in ("cpu", "cuda")
    m, L = r["meta"], 4
    assert m["replayed"]["init_max_diff"] == 0.0                  # the same numbers, bit for bit
    assert m["replayed"]["trained_max_diff"] < FP32
    w = m["reset_per_shard"]
    if on_gpu:          # DTensor's tracker draws from the CUDA generator: not one process's (CPU) numbers
        assert w["dtensor_rng"] == "OffsetBasedRNGTracker" and w["init_max_diff"] > 0.01
    else:               # CPU mesh, no tracker: every rank draws the first rows ...
        assert w["dtensor_rng"] is None and w["max_diff_from_first_rows"] == 0.0
        if nproc > 1:   # ... so wrong on every rank but 0
            assert w["init_max_diff"] > 0.01
    assert m["replayed"]["held_bytes"] == m["largest_module_bytes"] < m["model_bytes"] / 8
    p = r["prefetch"]
    if nproc > 1:       # one rank: FSDP2 sends nothing
        assert [gathered_ahead(p["default"], i) for i in range(L)] == [0] * L
        assert [gathered_ahead(p["explicit"], i) for i in range(L)] == [1] * (L - 1) + [0]
        assert p["default"].count("AG") == p["explicit"].count("AG") == 1 + 2 * L   # root once, blocks twice
        assert p["default"].count("RS") == 1 + L
        for line in p.values():     # backward: block i-1 gathered before block i's gradients are reduced
            assert all(line[line.index(f"B{i}") + 1:line.index(f"B{i - 1}")] == ["AG", "RS"] for i in range(1, L))
    t = r["tp"]
    dp, tp = t["mesh"]
    assert dp * tp == nproc and tp == (2 if nproc % 2 == 0 else 1)
    assert t["up_local_shape"][0] * nproc == t["up_shape"][0]     # split over tp, then again over dp
    assert t["max_diff_vs_one_process"] < FP32
    off = r["offload"]
    if on_gpu:          # lesson 07's claims: shards on the CPU, the same numbers, less held on the device
        assert off["ran"] and off["offloaded"]["shard_device"] == "cpu"
        assert off["on_device"]["shard_device"].startswith("cuda")
        assert all(off[how]["max_diff_vs_one_process"] < FP32 for how in ("on_device", "offloaded"))
        assert 0 <= off["offloaded"]["device_bytes"] < off["on_device"]["device_bytes"]
    else:
        assert off == {"ran": False, "why": "the device is the cpu already: nothing to offload to "
                       "(CPUOffloadPolicy frees an accelerator's memory)"}
    c = r["compile"]
    assert c["backend"] == ("inductor" if on_gpu else "aot_eager") and c["graphs"] == 1   # identical blocks
    assert c["max_diff_vs_eager"] < FP32 and c["max_diff_vs_one_process"] < FP32


def one_gpu_run():
    """What fsdp2_scale.py reports at 1 rank on a GPU machine (NCCL on cuda:0), read from the script's code:
    the DTensor tracker, offload run, inductor. Not measured here (no GPU); the numbers are of their tier."""
    def offload(where, held):
        return {"device_bytes": held, "device_peak_bytes": 2 * held, "ms_per_step": [5.0, 1.0, 1.0],
                "shard_device": where, "max_diff_vs_one_process": 0.0}
    return {"world_size": 1, "device": "cuda", "params": 137_674, "steps": 3,
            "meta": {"reset_per_shard": {"init_max_diff": 0.23, "max_diff_from_first_rows": 0.23,
                                         "dtensor_rng": "OffsetBasedRNGTracker"},
                     "replayed": {"init_max_diff": 0.0, "held_bytes": 66_560, "trained_max_diff": 0.0},
                     "model_bytes": 550_696, "largest_module_bytes": 66_560},
            "prefetch": {"default": ["F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"]},
            "tp": {"mesh": [1, 1], "up_placements": ["Shard(dim=0)"], "up_local_shape": [256, 64],
                   "up_shape": [256, 64], "max_diff_vs_one_process": 0.0},
            "offload": {"ran": True, "on_device": offload("cuda:0", 1_652_736), "offloaded": offload("cpu", 0)},
            "compile": {"backend": "inductor", "graphs": 1, "graph_nodes": [40], "ms_per_step_eager": [1.0] * 3,
                        "ms_per_step_compiled": [900.0, 1.0, 1.0], "max_diff_vs_eager": 3e-8,
                        "max_diff_vs_one_process": 3e-8}}


def test_a_gpu_run_is_held_to_the_gpu_tier(monkeypatch):
    """`make test` on a GPU machine: the 1-rank launch runs on cuda:0. The test reads the tier from the result
    and holds it to that tier's facts; and a CPU result with a GPU's facts is still refused."""
    here = sys.modules[__name__]                  # this file, under whatever name pytest imported it

    monkeypatch.setattr(here, "launch", lambda *a, **kw: one_gpu_run())
    here.test_fsdp2_meta_init_prefetch_tp_compile_equal_one_process(1, None)
    cpu_claiming_gpu = {**one_gpu_run(), "device": "cpu"}
    monkeypatch.setattr(here, "launch", lambda *a, **kw: cpu_claiming_gpu)
    with pytest.raises(AssertionError):
        here.test_fsdp2_meta_init_prefetch_tp_compile_equal_one_process(1, None)


def test_a_tp_size_that_does_not_divide_the_world_is_named(starts_processes):
    with pytest.raises(LaunchError) as err:
        launch("fsdp2_scale.py", nproc=2, show="none", args=["--case", "tp", "--tp", "3"])
    assert err.value.exc_type == "ValueError" and "must divide the world size 2" in err.value.message


def test_timeline_figure_names_the_unit_of_each_collective():
    import matplotlib
    matplotlib.use("Agg")
    from mgpu_utils.figures.memory import draw_prefetch_timeline

    line = ["AG", "AG", "F0", "AG", "F1", "AG", "B1", "AG", "RS", "B0", "RS", "RS"]    # 2 blocks, default order
    fig = draw_prefetch_timeline({"default": line})
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["AG\nroot", "AG\n0", "F0", "AG\n1", "F1", "AG\n1", "B1", "AG\n0", "RS\n1", "B0", "RS\n0",
                      "RS\nroot"]
