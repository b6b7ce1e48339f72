"""Lesson 07: memory measurement (mgpu_utils.measure.memory), the calculator, and ZeRO/FSDP/no_sync under torchrun."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from mgpu_utils.launch.launcher import launch
from mgpu_utils.measure.memory import SavedTensorCounter, TransformerBlock, checkpointed, gpu_peak, state_bytes, tensor_bytes
from mgpu_utils.costs.memory_model import calculate
from mgpu_utils.figures.memory import plot_memory
from mgpu_utils.costs.memory_model import activation_bytes_per_layer, activation_elements_per_layer


# ---------------------------------------------------------------- measurement against known tensors

def test_tensor_bytes_counts_each_storage_once():
    x = torch.zeros(1000)                                   # 4000 bytes
    assert tensor_bytes([x, x[5:], x.view(10, 100).t(), None]) == 4000
    assert tensor_bytes([x, x.clone(), x.double()]) == 4000 + 4000 + 8000
    assert tensor_bytes([x[:1]]) == 4000                    # a slice keeps the whole storage alive
    assert tensor_bytes([x, torch.ones(3, dtype=torch.int8)], exclude=[x.view(2, 500)]) == 3


def test_saved_tensor_counter_known_ops():
    u = torch.randn(100, requires_grad=True)
    v = torch.randn(100, requires_grad=True)
    w = nn.Parameter(torch.randn(100, 100))
    with SavedTensorCounter(exclude=[w]) as saved:
        (u * v).sum()                                       # saves u and v: 800 bytes
        (u * 2).sum()                                       # saves nothing
        (w @ u).sum()                                       # saves w (excluded) and u (already counted)
        torch.exp(v.double()).sum()                         # saves its fp64 output: 800 bytes
    assert saved.bytes == 400 + 400 + 800
    assert saved.by_dtype() == {"float32": 800, "float64": 800}


def test_saved_tensor_counter_survives_address_reuse():
    """A storage freed inside the block must not hide a later tensor that gets the same address."""
    import gc
    import weakref
    refs = []
    with SavedTensorCounter() as saved:
        for _ in range(5):
            b = torch.ones(1000, requires_grad=True) * 2            # an intermediate (mul by 2 saves nothing)
            torch.sin(b)                                # saves its input b: 4000 bytes; the output is discarded
            refs.append(weakref.ref(b))
            del b                                       # without a held reference b's storage is freed here
        assert all(r() is not None for r in refs), "counted storages stay alive inside the block"
    assert saved.bytes == 5 * 4000 and len(saved.records) == 5
    gc.collect()
    assert all(r() is None for r in refs), "and are released when the block ends"


def test_state_bytes_fp32_adam_is_4_4_8_plus_step_counters():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    opt = torch.optim.Adam(model.parameters())
    F.cross_entropy(model(torch.randn(5, 10)), torch.tensor([0, 1, 2, 0, 1])).backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    m = state_bytes(model, opt)
    assert (m["params"], m["grads"]) == (4 * n, 4 * n)
    assert m["optimizer"] == 8 * n + 4 * 4                  # exp_avg, exp_avg_sq + a float32 step per tensor
    with gpu_peak("cpu") as peak:
        pass
    assert "skipped" in peak


def test_transformer_block_matches_korthikanti_at_fp32():
    s, b, h, a = 16, 2, 32, 4
    block = TransformerBlock(h, a, p_drop=0.1).train()
    with SavedTensorCounter(exclude=block.parameters()) as saved:
        block(torch.randn(s, b, h, requires_grad=True))
    with SavedTensorCounter() as probe:
        F.dropout(torch.ones(100, requires_grad=True), 0.1, training=True)
    el = activation_elements_per_layer(s, b, h, a)
    assert saved.bytes == 4 * el["values"] + probe.bytes / 100 * el["masks"] + 2 * 2 * s * b * 4
    assert 2 * el["values"] + el["masks"] == activation_bytes_per_layer(s, b, h, a)
    block.eval()                                            # no dropout: no masks saved
    with SavedTensorCounter(exclude=block.parameters()) as no_drop:
        block(torch.randn(s, b, h, requires_grad=True))
    assert no_drop.bytes < saved.bytes


# ---------------------------------------------------------------- accumulation and checkpointing equivalence

@pytest.mark.parametrize("every", [1, 2, 4])
def test_checkpointing_same_grads_and_keeps_only_segment_inputs(every):
    s, b, h, a, layers = 8, 2, 16, 2, 4
    torch.manual_seed(0)
    stack = nn.Sequential(*[TransformerBlock(h, a, p_drop=0.1) for _ in range(layers)]).train()
    x = torch.randn(s, b, h)
    results = []
    for e in (0, every):
        stack.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with SavedTensorCounter(exclude=stack.parameters()) as saved:
            out = checkpointed(stack, e)(x)
        out.mean().backward()
        results.append((saved.bytes, [p.grad.clone() for p in stack.parameters()]))
    assert_close(results[1][1], results[0][1])
    assert results[1][0] == layers // every * s * b * h * 4
    assert results[0][0] > 10 * results[1][0]
    with pytest.raises(ValueError):
        checkpointed(stack, -1)


# ---------------------------------------------------------------- calculator

@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_calculator_reproduces_the_zero_paper(stage, gb):
    m = calculate(7.5e9, precision="mixed", optimizer="adam", zero_stage=stage, dp=64)
    assert round(m.total / 1e9, 1) == gb and m.activations == 0


def test_calculator_transformer_shape_and_plot():
    m = calculate(layers=4, hidden=64, heads=4, seq_len=32, micro_batch=2, vocab=100, precision="fp32", dp=2)
    # by hand, fp32: per layer s*b*h*(16 values x 4 B + 2 masks x 1 B) + a*s^2*b*(2 values x 4 B + 1 mask x 1 B)
    s, b, h, a = 32, 2, 64, 4
    assert m.activations == 4 * (s * b * h * (16 * 4 + 2) + a * s * s * b * (2 * 4 + 1))
    mixed = calculate(layers=4, hidden=64, heads=4, seq_len=32, micro_batch=2, vocab=100, dp=2)
    assert mixed.activations == 4 * s * b * h * (34 + 5 * a * s / h)        # Korthikanti: 16-bit values
    with pytest.raises(ValueError, match="n_params"):
        calculate()
    import matplotlib
    matplotlib.use("Agg")
    fig = plot_memory({"a": m, "b": {"params": 1e9}}, capacity=2e9)
    assert len(fig.axes) == 1
    from mgpu_utils.figures.memory import calculator
    box = calculator(show_static=False, n_params=1e6, layers=0, dp=4)
    assert box is not None and len(box.children) == 6


# ---------------------------------------------------------------- under torchrun

@pytest.mark.parametrize("nproc", [2, 4])
def test_zero1_and_fsdp_equal_single_process_and_shard_as_predicted(nproc, starts_processes):
    r = launch("zero_fsdp.py", nproc=nproc, show="none", timeout_s=300)
    assert r["world_size"] == nproc and set(r["modes"]) == {"ddp", "zero1", "fsdp2", "fsdp3"}
    n = r["params"]
    for mode, m in r["modes"].items():
        assert m["max_grad_diff"] < 1e-5 and m["max_param_diff"] < 1e-5, mode
        assert m["max_grad_norm_ratio_error"] < 1e-4, f"{mode}: gradients summed instead of averaged?"
        calc = calculate(n, precision="fp32", optimizer="adam", zero_stage=m["zero_stage"], dp=nproc)
        for rank in m["per_rank"]:
            total = rank["params_after_forward"] + rank["grads"] + rank["optimizer"]
            assert abs(total / calc.total - 1) <= 0.10, (mode, rank, calc)
    ddp, zero1, fsdp3 = (r["modes"][k]["per_rank"] for k in ("ddp", "zero1", "fsdp3"))
    assert ddp[0]["params_sharded"] == ddp[0]["grads"] == 4 * n
    # ZeRO-1: every parameter's Adam state lives on exactly one rank
    assert sum(x["optimizer"] for x in zero1) == ddp[0]["optimizer"]
    # FSDP: the shards cover the model (padding makes them a little larger, never smaller)
    assert 4 * n <= sum(x["params_sharded"] for x in fsdp3) <= 4 * n * 1.01
    assert r["modes"]["fsdp2"]["per_rank"][0]["params_after_forward"] >= 4 * n > fsdp3[0]["params_after_forward"]


def test_no_sync_counts_and_checkpointing_under_ddp(starts_processes):
    r = launch("grad_accumulation.py", nproc=2, args=["--micro-batches", "4", "--global-batch", "64"], show="none",
               timeout_s=300)
    every, quiet = r["accumulation"]["every"], r["accumulation"]["no_sync"]
    assert quiet["allreduce_bytes"] == r["grad_bytes"]
    assert every["allreduce_bytes"] == 4 * r["grad_bytes"]
    assert r["max_grad_diff_accumulation"] < 1e-5 and r["max_grad_diff_checkpointing"] < 1e-5
    saved = [c["saved_bytes"] for c in r["checkpointing"]]
    assert saved[0] == saved[1] > saved[2] > saved[3]
