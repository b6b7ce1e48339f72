"""The memory formulas against the papers' own numbers (mgpu_utils.memory_model)."""
import pytest

from mgpu_utils.memory_model import (activation_bytes_per_layer, in_flight_micro_batches,
                                     memory_per_gpu, model_state_bytes, transformer_params)


@pytest.mark.parametrize("stage,gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example(stage, gb):
    # ZeRO paper figure 1: 7.5B parameters, Nd = 64, mixed-precision Adam (K = 12)
    m = model_state_bytes(7.5e9, zero_stage=stage, dp=64)
    assert round(m.total / 1e9, 1) == gb


def test_fp32_adam_is_16_bytes_split_4_4_8():
    m = model_state_bytes(1000, precision="fp32", optimizer="adam")
    assert (m.params, m.grads, m.optimizer) == (4000, 4000, 8000)


def test_gpt3_parameter_count():
    assert round(transformer_params(96, 12288, 50257, 2048) / 1e9, 1) == 174.6


def test_korthikanti_activation_terms():
    s, b, h, a = 2048, 1, 12288, 96
    assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, tp=8) == s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert activation_bytes_per_layer(s, b, h, a, tp=8, sequence_parallel=True) == s * b * h / 8 * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, tp=8, sequence_parallel=True, recompute="selective") == s * b * h / 8 * 34
    assert activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * s * b * h


def test_pipeline_in_flight_and_total():
    assert in_flight_micro_batches("gpipe", 4, 8) == 8 and in_flight_micro_batches("1f1b", 4, 8) == 4
    m = memory_per_gpu(8, 64, 4, 256, 32, 2, n_params=1e6, pp=2, schedule="1f1b", n_micro=4,
                       precision="fp32")
    assert m.params == 4 * 1e6 / 2
    assert m.activations == 4 * 2 * activation_bytes_per_layer(32, 2, 64, 4)


@pytest.mark.parametrize("kw", [dict(zero_stage=4), dict(dp=0), dict(precision="fp8")])
def test_bad_input_is_refused(kw):
    with pytest.raises(ValueError):
        model_state_bytes(1e6, **kw)
    with pytest.raises(ValueError, match="divisible by pp"):
        memory_per_gpu(6, 64, 4, 256, 32, 1, pp=4)


def test_every_precision_works_with_every_optimizer():
    """The calculator's dropdowns offer each precision and each optimizer independently."""
    from mgpu_utils.memory_model import BYTES_PER_PARAM
    precisions = {p for p, _ in BYTES_PER_PARAM}
    optimizers = {o for _, o in BYTES_PER_PARAM}
    assert set(BYTES_PER_PARAM) == {(p, o) for p in precisions for o in optimizers}
