"""The memory formulas against the papers' own numbers (mgpu_utils.costs.memory_model)."""
import pytest

from mgpu_utils.costs.memory_model import (activation_bytes_per_layer, in_flight_micro_batches,
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
    from mgpu_utils.costs.memory_model import BYTES_PER_PARAM
    precisions = {p for p, _ in BYTES_PER_PARAM}
    optimizers = {o for _, o in BYTES_PER_PARAM}
    assert set(BYTES_PER_PARAM) == {(p, o) for p in precisions for o in optimizers}


# ---- formulas, each against a value written out by hand (a one-line bug in the code must fail here)

def test_calculator_counts_pipeline_micro_batches_in_flight():
    """1F1B: the first stage holds pp micro-batches of its L/pp layers (Narayanan et al. 2021)."""
    from mgpu_utils.costs.memory_model import calculate
    s, b, h, a = 32, 1, 64, 4
    per_layer = s * b * h * (34 + 5 * a * s / h)                    # Korthikanti, 16-bit values
    m = calculate(layers=8, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=256, pp=4)
    assert m.activations == (8 // 4) * 4 * per_layer
    assert calculate(layers=8, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=256, pp=1).activations == 8 * per_layer


def test_calculator_applies_recomputation():
    from mgpu_utils.costs.memory_model import calculate
    s, b, h, a = 32, 2, 64, 4
    full = calculate(layers=4, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=256, recompute="full")
    assert full.activations == 4 * 2 * s * b * h                       # only each layer's 16-bit input
    sel = calculate(layers=4, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=256, recompute="selective")
    assert sel.activations == 4 * 34 * s * b * h                        # the 5as/h attention term is gone


def test_full_recomputation_with_sequence_parallelism_is_split_over_tp():
    s, b, h, a = 2048, 1, 12288, 96
    assert activation_bytes_per_layer(s, b, h, a, tp=8, sequence_parallel=True, recompute="full") == 2 * s * b * h / 8
    assert activation_bytes_per_layer(s, b, h, a, tp=8, recompute="full") == 2 * s * b * h   # without SP: replicated


def test_planner_counts_six_tp_all_reduces_per_layer_with_full_recomputation():
    """2 forward + 2 backward all-reduces per layer and micro-batch; full recomputation repeats the 2
    forward ones (Korthikanti et al. 2023): 6, each a ring all-reduce of s*b*h values."""
    from mgpu_utils.costs.planner import Cluster, ModelSpec, evaluate
    toy = ModelSpec("toy", n_layers=4, hidden=64, n_heads=4, seq_len=32, vocab=256, n_params=1e6)
    ring = 2 * (2 - 1) / 2 * 32 * 1 * 64 * 2                          # tp = 2, micro-batch 1, 2-byte values
    none = evaluate(toy, Cluster(4, memory_gb=1), 2, 2, 1, global_batch=8)
    full = evaluate(toy, Cluster(4, memory_gb=1), 2, 2, 1, global_batch=8, recompute="full")
    m = 8 // 2                                                          # micro-batches per step
    assert none.comm_bytes["tp"] == 4 * m * 4 * ring
    assert full.comm_bytes["tp"] == 4 * m * 6 * ring


def test_tp_bytes_per_layer_by_hand():
    """GPT-3 layer, b=1, s=2048, h=12288, bf16, t=8: 2 all-reduces of 48 MiB per pass, each sending
    2*(7/8)*48 MiB per rank."""
    from mgpu_utils.parallel.tensor_parallel import tp_bytes_per_layer
    r = tp_bytes_per_layer(1, 2048, 12288, 8, bytes_per_el=2)
    assert r["tensor_bytes"] == 48 * 2**20
    assert r["sent_per_rank_per_pass"] == 2 * (2 * 7 / 8 * 48 * 2**20) == 176_160_768
    assert r["collectives_per_pass"] == 2
    sp = tp_bytes_per_layer(1, 2048, 12288, 8, bytes_per_el=2, sequence_parallel=True)
    assert sp["collectives_per_pass"] == 4 and sp["sent_per_rank_per_pass"] == 4 * (7 / 8 * 48 * 2**20)


def test_calculator_and_planner_agree_on_activations():
    """One convention: 4-byte activation values for fp32, 2 otherwise, 1-byte masks, in both."""
    from mgpu_utils.costs.memory_model import calculate
    from mgpu_utils.costs.planner import Cluster, ModelSpec, evaluate
    toy = ModelSpec("toy", n_layers=4, hidden=64, n_heads=4, seq_len=32, vocab=256, n_params=1e6)
    for precision in ("fp32", "mixed"):
        lay = evaluate(toy, Cluster(4, memory_gb=1), 4, 1, 1, global_batch=4, precision=precision)
        calc = calculate(layers=4, hidden=64, heads=4, seq_len=32, micro_batch=1, vocab=256, precision=precision, dp=4)
        assert lay.memory.activations == calc.activations, precision


def test_memory_breakdown_in_gb():
    from mgpu_utils.costs.memory_model import MemoryBreakdown
    m = MemoryBreakdown(params=1e9, grads=2e9, optimizer=3e9, activations=4e9)
    assert m.total == 10e9
    assert m.gb() == {"params": 1.0, "grads": 2.0, "optimizer": 3.0, "activations": 4.0, "total": 10.0}


def test_planner_table_prints_every_column_by_hand():
    """One feasible layout of the toy model: each column of the row written out from evaluate()'s fields."""
    from mgpu_utils.costs.planner import Cluster, ModelSpec, evaluate, table
    toy = ModelSpec("toy", n_layers=4, hidden=64, n_heads=4, seq_len=32, vocab=256, n_params=1e6)
    x = evaluate(toy, Cluster(4, memory_gb=1), 2, 2, 1, global_batch=8, precision="fp32")
    head, row = table([x], unit="kB", time_unit="us").splitlines()
    assert head.split() == ["dp", "tp", "pp", "m", "kB/GPU", "dp", "kB", "tp", "kB", "pp", "kB", "dp", "us", "tp", "us",
                            "pp", "us", "bubble", "step", "us", "note"]
    want = [2, 2, 1, x.n_micro, f"{x.memory.total / 1e3:.1f}", f"{x.comm_bytes['dp'] / 1e3:.2f}",
            f"{x.comm_bytes['tp'] / 1e3:.2f}", f"{x.comm_bytes['pp'] / 1e3:.2f}", f"{x.comm_s['dp'] / 1e-6:.2f}",
            f"{x.comm_s['tp'] / 1e-6:.2f}", f"{x.comm_s['pp'] / 1e-6:.2f}", f"{x.bubble:.3f}", f"{x.step_s / 1e-6:.2f}", "ok"]
    assert row.split() == [str(w) for w in want]
    gb = table([x]).splitlines()[1].split()                            # default units: GB and seconds
    assert gb[4] == f"{x.memory.total / 1e9:.1f}" and gb[12] == f"{x.step_s:.2f}"
    big = evaluate(toy, Cluster(4, memory_gb=1e-6), 2, 2, 1, global_batch=8, precision="fp32")   # too small a GPU
    head, row, note = table([big]).splitlines()             # a note too long for the row: on the next line
    assert note == " " * 8 + big.problems[0] and "GB per GPU" in note and row.split()[12] == f"{big.step_s:.2f}"
    assert len(table([x, x, x], limit=2).splitlines()) == 3             # header + 2 rows


def test_planner_table_units_pipeline_columns_and_unsplittable_rows():
    """MB and ms columns, a pipeline layout (non-zero pp columns), a layout that cannot split (memory
    undefined: dashes and every problem, joined by '; '), and plan()'s order, checked by hand."""
    from mgpu_utils.costs.planner import GPT3_175B, Cluster, Layout, ModelSpec, evaluate, plan, table
    toy = ModelSpec("toy", n_layers=4, hidden=64, n_heads=4, seq_len=32, vocab=256, n_params=1e6)
    x = evaluate(toy, Cluster(4, memory_gb=1), 2, 1, 2, global_batch=8, precision="fp32")   # pp = 2
    row = table([x], unit="MB", time_unit="ms").splitlines()[1].split()
    assert row[4:8] == [f"{x.memory.total / 1e6:.1f}", f"{x.comm_bytes['dp'] / 1e6:.2f}",
                        f"{x.comm_bytes['tp'] / 1e6:.2f}", f"{x.comm_bytes['pp'] / 1e6:.2f}"]
    assert row[8:11] == [f"{x.comm_s[k] / 1e-3:.2f}" for k in ("dp", "tp", "pp")] and x.comm_bytes["pp"] > 0
    big = evaluate(GPT3_175B, Cluster(1024), 8, 8, 16, global_batch=1536)
    assert table([big]).splitlines()[1].split()[12] == f"{big.step_s:.2f}" and big.step_s > 1   # by construction: a model's seconds
    bad = evaluate(toy, Cluster(8, gpus_per_node=4, memory_gb=1), 1, 8, 1, global_batch=8)   # tp=8: 2 problems
    assert bad.memory is None and len(bad.problems) == 2
    line = table([bad, x], unit="MB").splitlines()
    assert len(line) == 4 and line[1] == f"{1:>5} {8:>3} {1:>3} {bad.n_micro:>5} {'-':>7}"
    assert line[2] == " " * 8 + "; ".join(bad.problems) and line[3].endswith("  ok")
    short = Layout(1, 8, 1, bad.n_micro, None, problems=["tp=8: no"])            # a note that fits: in the row
    assert table([short]).splitlines()[1] == f"{1:>5} {8:>3} {1:>3} {bad.n_micro:>5} {'-':>7}" + " " * 55 + "tp=8: no"
    edge = [Layout(1, 8, 1, 8, None, problems=["x" * n]) for n in (18, 19)]      # row, 2 spaces, note: 100, 101
    assert [len(table([e]).splitlines()) for e in edge] == [2, 3] and len(table(edge[:1]).splitlines()[1]) == 100
    lays = plan(toy, Cluster(8, gpus_per_node=4, memory_gb=1), global_batch=8, precision="fp32")
    assert all(isinstance(l.dp, int) for l in lays)
    feasible = [l for l in lays if l.feasible]
    assert 0 < len(feasible) < len(lays) and lays[:len(feasible)] == feasible      # feasible ones first
    assert [l.step_s for l in feasible] == sorted(l.step_s for l in feasible)      # by estimated step time
    assert lays[-1].memory is None                      # a layout that cannot split sorts last


def test_parse_layouts_names_the_product_it_needs():
    from mgpu_utils.costs.planner import parse_layouts
    with pytest.raises(ValueError, match=r"needs world size dp\*tp = 6, got 4"):
        parse_layouts("3x2", 4, 4, 12)


def test_planner_orders_infeasible_layouts_and_prints_every_problem():
    """Mutants the first runs left: infeasible layouts that have a memory estimate sort before those that
    cannot split (memory None, step time undefined); pipeline time in ms; two problems joined by '; '."""
    from mgpu_utils.costs.planner import GPT3_175B, Cluster, ModelSpec, evaluate, plan, table
    toy = ModelSpec("toy", n_layers=4, hidden=64, n_heads=4, seq_len=32, vocab=256, n_params=1e6)
    lays = plan(toy, Cluster(8, gpus_per_node=4, memory_gb=0.01), global_batch=8, precision="fp32")
    kinds = [(l.feasible, l.memory is not None) for l in lays]
    assert kinds == sorted(kinds, reverse=True) and (False, True) in kinds and (False, False) in kinds
    big = evaluate(GPT3_175B, Cluster(1024), 8, 8, 16, global_batch=1536)
    assert table([big], time_unit="ms").splitlines()[1].split()[10] == f"{big.comm_s['pp'] * 1e3:.2f}"
    assert big.comm_s["pp"] > 0.1             # by construction: the model's hundreds of ms, not a measurement
    two = evaluate(GPT3_175B, Cluster(1024, memory_gb=10), 4, 16, 16, global_batch=1536)
    assert two.memory is not None and len(two.problems) == 2
    assert table([two]).endswith("\n" + " " * 8 + two.problems[0] + "; " + two.problems[1])
    assert max(map(len, table(plan(GPT3_175B, Cluster(1024, memory_gb=10), global_batch=1536)).splitlines())) <= 100
