"""mgpu_utils.checks: a tolerance that follows each tensor's scale catches what assert_close's default misses."""
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from mgpu_utils.checks import assert_tensors_close, check_optimizer_matches
from mgpu_utils.models import make_mlp


def mlp_grads():
    torch.manual_seed(0)
    model = make_mlp(256, 10)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_identical_tensors_pass_and_report_zero():
    g = mlp_grads()
    assert assert_tensors_close(g, [t.clone() for t in g]) == 0.0


def test_a_zeroed_layer_passes_the_default_but_not_the_scaled_check():
    """Lesson 03's MLP: a layer whose gradient is lost passes assert_close's default atol=1e-5."""
    g = mlp_grads()
    broken = [t.clone() for t in g]
    small = min(range(len(g) - 2), key=lambda i: g[i].abs().max().item())   # a deep, small-gradient layer
    broken[small].zero_()
    assert_close(broken, g)                                  # the weak check stays green ...
    with pytest.raises(AssertionError, match=f"tensor {small}: differs"):
        assert_tensors_close(broken, g)                      # ... this one fails


def test_a_missing_average_and_rounding_noise():
    g = mlp_grads()
    with pytest.raises(AssertionError):
        assert_tensors_close([2 * t for t in g], g)          # summed over 2 ranks, never averaged
    noisy = [t * (1 + 1e-6) for t in g]                      # float32 summation-order noise passes
    assert assert_tensors_close(noisy, g) < 1e-5


def test_mismatched_counts_and_shapes_are_named():
    with pytest.raises(AssertionError, match="2 tensors against 1"):
        assert_tensors_close([torch.ones(2), torch.ones(2)], [torch.ones(2)])
    with pytest.raises(AssertionError, match="tensor w: shape"):
        assert_tensors_close([torch.ones(3)], [torch.ones(2)], names=["w"])


def test_exact_fp32_turns_tf32_off_and_restores_it():
    import torch
    from mgpu_utils.checks import exact_fp32
    b = torch.backends
    before = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision)
    b.cudnn.conv.fp32_precision = "tf32"                       # the cuDNN default
    try:
        with exact_fp32():
            assert (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision) == ("ieee", "ieee")
        assert b.cudnn.conv.fp32_precision == "tf32"
        with pytest.raises(KeyError):                          # restored on an error too
            with exact_fp32():
                raise KeyError("x")
        assert (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision) == (before[0], "tf32")
    finally:
        b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision = before


def test_exact_fp32_asks_cudnn_for_deterministic_algorithms_and_restores():
    """Issue 31 (misleading on GPUs): two runs of one GPU job compared exactly need cuDNN without atomics."""
    import torch

    from mgpu_utils.checks import exact_fp32

    b = torch.backends
    before = (b.cudnn.deterministic, b.cudnn.benchmark)
    with exact_fp32():
        assert b.cudnn.deterministic and not b.cudnn.benchmark
    assert (b.cudnn.deterministic, b.cudnn.benchmark) == before


def test_max_abs_diff_walks_nested_states():
    import torch

    from mgpu_utils.checks import max_abs_diff

    a = {"model": {"w": torch.zeros(3)}, "optim": {"state": [torch.ones(2), torch.empty(0)], "lr": 0.1}}
    b = {"model": {"w": torch.tensor([0.0, -0.5, 0.25])}, "optim": {"state": [torch.ones(2), torch.empty(0)], "lr": 0.1}}
    assert max_abs_diff(a, b) == 0.5 and max_abs_diff(a, a) == 0.0 and max_abs_diff([], []) == 0.0
    with pytest.raises(AssertionError):
        max_abs_diff(a, {"model": a["model"]})                  # a missing key is not a zero difference
    with pytest.raises(AssertionError):
        max_abs_diff({"lr": 0.1}, {"lr": 0.2})


def test_an_optimizer_of_other_tensors_is_refused_and_a_partial_one_passes():
    """In one process: the same rule fully_shard breaks (tests/lessons/test_07_memory_fsdp2_practice.py runs the FSDP2 case)."""
    model = make_mlp(8, 1)
    check_optimizer_matches(model, torch.optim.SGD(model.parameters(), lr=0.1))
    check_optimizer_matches(model, torch.optim.SGD(model[0].parameters(), lr=0.1))     # only the first layer
    other = make_mlp(8, 1)
    with pytest.raises(ValueError, match=r"holds 4 of its 4 tensors .*build the optimizer after fully_shard"):
        check_optimizer_matches(model, torch.optim.SGD(other.parameters(), lr=0.1))
