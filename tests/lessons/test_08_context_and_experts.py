"""Lesson 08: ring attention, zig-zag, Ulysses and the expert-parallel MoE layer against one process, under
real torchrun (the scripts assert_close every output and gradient inside each rank); their formulas by hand."""
import math

import pytest
import torch
from torch.testing import assert_close

from mgpu_utils.launch.launcher import LaunchError, launch
from mgpu_utils.parallel.context import chunk_ranges, merge, shard
from mgpu_utils.parallel.experts import MoE, route

SEQ, HEADS, HEAD_DIM, SEQS = 48, 4, 8, 2


@pytest.mark.parametrize("nproc", [2, 4])
def test_ring_zigzag_ulysses_equal_one_process(nproc, starts_processes):
    modes = ["--modes", "ring,zigzag,ulysses,torch"]
    res = launch("context_parallel.py", nproc=nproc, show="none",
                 args=["--repeats", 1, "--time-seq", 64, "--sweep-seq", "32,64", *modes])
    rows = {(r["mode"], r["causal"]): r for r in res["checks"]}
    for causal in (False, True):          # PyTorch's own: checked where it runs, else said why not
        ran, said = ("torch", causal) in rows, any(f"torch causal={causal}:" in s for s in res["skipped"])
        assert ran != said, (causal, res["skipped"])
    rows = {key: r for key, r in rows.items() if key[0] != "torch"}
    assert set(rows) == {(m, c) for m in ("ring", "zigzag", "ulysses") for c in (False, True)}
    kv = SEQS * HEADS * (SEQ // nproc) * HEAD_DIM * 4                      # this rank's K, fp32 bytes
    for (mode, causal), r in rows.items():
        assert r["kv_bytes"] == kv
        if mode == "ulysses":
            assert (r["fwd_bytes"], r["bwd_bytes"]) == (4 * kv * (nproc - 1) // nproc,) * 2
        else:                                     # K and V travel n-1 hops; with dK, dV n more in backward
            assert (r["fwd_bytes"], r["bwd_bytes"]) == (2 * (nproc - 1) * kv, (4 * nproc - 2) * kv)
        assert r["max_err_out"] < 1e-5
    block = SEQS * HEADS * (SEQ // nproc) ** 2                                 # one L x L score block
    assert rows["ring", False]["score_elems_per_rank"] == [nproc * block] * nproc
    assert rows["ring", True]["score_elems_per_rank"] == [(r + 1) * block for r in range(nproc)]
    assert rows["zigzag", True]["score_elems_per_rank"] == [(2 * nproc + 1) * block // 4] * nproc
    assert rows["ring", True]["peak_block_elems"] == block
    assert rows["zigzag", True]["peak_block_elems"] == block // 4
    for m in res["memory"]:                       # ring keeps q, k, v, out and the log-sum-exp per row
        local = SEQS * HEADS * m["seq"] // nproc
        assert m["ring_saved_bytes"] == local * (4 * HEAD_DIM + 1) * 4
        assert m["plain_saved_bytes"] >= SEQS * HEADS * m["seq"] ** 2 * 4       # the S x S probabilities
    assert set(res["compute_seconds_per_rank"]) == {"ring", "zigzag"}


def test_ulysses_says_why_it_cannot_split_the_heads(starts_processes):
    res = launch("context_parallel.py", nproc=3, show="none",
                 args=["--modes", "ulysses,zigzag", "--repeats", 1, "--time-seq", 48, "--sweep-seq", ""])
    assert res["skipped"] == ["ulysses: 4 heads are not divisible by 3 ranks"]     # and it says so
    assert {r["mode"] for r in res["checks"]} == {"zigzag"}
    with pytest.raises(LaunchError, match="divisible by 2 x world size"):
        launch("context_parallel.py", nproc=2, show="none", args=["--seq", 50, "--modes", "zigzag"])


@pytest.mark.parametrize("nproc", [2, 4])
def test_expert_parallel_equal_one_process_and_trained(nproc, starts_processes):
    res = launch("expert_parallel.py", nproc=nproc, show="none", args=["--steps", 30])
    layouts = {(c["dp"], c["ep"]) for c in res["checks"]}
    assert layouts == ({(1, 4), (2, 2)} if nproc == 4 else {(1, 2)})
    for c in res["checks"]:
        # one h=16 fp32 row per assignment sent to another rank's expert (dispatch) and per row another rank
        # sent here (combine), in forward and again in backward
        assert c["fwd_bytes"] == c["bwd_bytes"] == (c["rows_out"] + c["rows_in"]) * 16 * 4 > 0
        assert c["assignments"] == 2 * 24                                     # top-2 of 24 tokens, none dropped
        experts = 8 // c["ep"]
        assert c["param_bytes_rank"] < c["param_bytes_full"] and c["param_bytes_rank"] == (
            16 * 8 + experts * (16 * 32 + 32 + 32 * 16 + 16)) * 4            # router + this rank's experts
    no_aux, aux = (sum(v[-10:]) / 10 for v in (res["imbalance"]["0.0"], res["imbalance"]["0.05"]))
    assert no_aux > aux + 0.5, f"the balancing loss should spread the load: {no_aux:.2f} vs {aux:.2f}"
    dropped = [c["dropped"] for c in res["capacity"]]
    sent = [c["bytes_sent"] for c in res["capacity"]]
    assert dropped == sorted(dropped, reverse=True) and sent == sorted(sent) and dropped[0] > dropped[-1]


def test_expert_count_must_split(starts_processes):
    with pytest.raises(LaunchError, match="cannot be split over 3 ranks"):
        launch("expert_parallel.py", nproc=3, show="none", args=["--steps", 1])


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_layouts_cover_the_sequence_once(layout, world):
    seq = 16 * world
    tokens = sorted(t for r in range(world) for a, b in chunk_ranges(r, world, seq, layout) for t in range(a, b))
    assert tokens == list(range(seq))
    x = torch.arange(seq).view(1, 1, seq, 1)
    assert torch.cat([shard(x, r, world, layout) for r in range(world)], 2).flatten().sort().values.tolist() == tokens
    with pytest.raises(ValueError, match="divisible"):
        chunk_ranges(0, world, seq + 1, layout) if world > 1 else chunk_ranges(0, 2, 3, layout)


def test_merge_is_attention_over_the_union_and_survives_large_scores():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 9, 4), torch.randn(2, 9, 4)
    for scale in (1.0, 300.0):                       # exp(300 * 4) overflows fp32 without the max subtraction
        s = q @ k.transpose(-2, -1) * scale
        ref = torch.softmax(s, -1) @ v
        parts = [(torch.softmax(s[..., a:b], -1) @ v[:, a:b], torch.logsumexp(s[..., a:b], -1))
                 for a, b in ((0, 4), (4, 9))]
        out, lse = merge(*parts[0], *parts[1])
        assert_close(out, ref) and assert_close(lse, torch.logsumexp(s, -1))
    empty = (torch.zeros(2, 5, 4), torch.full((2, 5), float("-inf")))
    out, lse = merge(*empty, *parts[1])              # a row without keys yet: the other part as it is
    assert_close(out, parts[1][0]) and assert_close(lse, parts[1][1])


def test_route_capacity_priority_and_balancing_loss():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.1, 0.4], [0.1, 0.8, 0.1]])
    r = route(probs, top_k=2, capacity_factor=0.75)   # C = ceil(0.75 * 4 * 2 / 3) = 2 per expert
    assert r["capacity"] == 2
    assert r["token"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3] and r["expert"].tolist() == [0, 0, 0, 1, 1, 1, 2, 0]
    # expert 0: first choices of tokens 0, 1 are served; token 2's first choice and token 3's second are not
    assert r["keep"].tolist() == [True, True, False, True, True, False, True, False]
    assert r["load"].tolist() == [4, 3, 1]
    assert math.isclose(r["aux"].item(), 3 * sum(l / 8 * p for l, p in zip([4, 3, 1], probs.mean(0).tolist())),
                        rel_tol=1e-6)
    uniform = route(torch.full((6, 3), 1 / 3), top_k=1, capacity_factor=None)
    assert uniform["keep"].all() and math.isclose(uniform["aux"].item(), 1.0, rel_tol=1e-6)
    collapsed = route(torch.tensor([[1.0, 0.0, 0.0]] * 6), top_k=1, capacity_factor=None)
    assert math.isclose(collapsed["aux"].item(), 3.0, rel_tol=1e-6)     # E when one expert takes all


def test_moe_layer_matches_a_loop_over_tokens():
    torch.manual_seed(0)
    moe = MoE(6, 12, n_experts=4, top_k=2, capacity_factor=None)
    x = torch.randn(10, 6)
    y, r = moe(x)
    probs = torch.softmax(moe.gate(x), -1)
    for t in range(10):
        w, e = probs[t].topk(2)
        assert_close(y[t], sum(w[i] * moe.experts[int(e[i])](x[t]) for i in range(2)))


def test_planner_context_and_expert_parallel_by_hand():
    """Lesson 08's two degrees in the planner (mgpu_utils.costs.planner), every number written out here."""
    from mgpu_utils.costs.memory_model import memory_per_gpu, model_state_bytes
    from mgpu_utils.costs.planner import Cluster, ModelSpec, evaluate

    dense = ModelSpec("toy", n_layers=4, hidden=1024, n_heads=16, seq_len=8192, vocab=32000)
    c16 = Cluster(16)
    lay = evaluate(dense, c16, dp=2, tp=2, pp=1, cp=4, global_batch=4)
    assert lay.feasible and lay.n_micro == 2
    kv = 8192 // 4 * 1 * (1024 // 2) * 2                       # one rank's K block of one layer, bf16
    assert lay.comm_bytes["cp"] == 4 * 2 * (2 * 3 + (4 * 4 - 2)) * kv     # layers x micro x (fwd + bwd) hops
    assert lay.comm_bytes["dp"] == 2 * (8 - 1) / 8 * dense.params / 2 * 2 # all-reduce over dp x cp = 8 GPUs
    assert lay.links["cp"] == c16.intra_link and lay.links["dp"] == c16.inter_link   # tp x cp = 8 per node
    want = memory_per_gpu(4, 1024, 16, 32000, 2048, 1, n_params=dense.params, dp=2, tp=2, n_micro=2)
    assert lay.memory.total == want.total                       # the activations of 2048 tokens
    assert evaluate(dense, c16, dp=2, tp=2, pp=1, cp=4, global_batch=4).step_s == lay.step_s
    full = evaluate(dense, c16, dp=2, tp=2, pp=1, cp=4, global_batch=4, recompute="full")
    assert full.comm_bytes["cp"] == 4 * 2 * (2 * 3 + 14 + 2 * 3) * kv  # forward again in backward

    moe = ModelSpec("toy-moe", n_layers=4, hidden=1024, n_heads=16, seq_len=8192, vocab=32000, n_experts=8,
                    top_k=2)
    expert = 4 * 8 * (8 * 1024 ** 2 + 5 * 1024)
    assert moe.expert_params == expert
    assert moe.params == dense.params - 4 * (8 * 1024 ** 2 + 5 * 1024) + expert + 4 * 1024 * 8
    assert moe.active_params == moe.params - expert * (1 - 2 / 8)
    lay = evaluate(moe, c16, dp=8, tp=2, pp=1, ep=4, global_batch=8)
    assert lay.feasible and lay.n_micro == 1
    assert lay.comm_bytes["ep"] == 4 * 1 * 4 * 8192 * 2 * (3 / 4) * 1024 * 2  # 4 all-to-alls of T*k rows
    non_expert = moe.params - expert
    assert lay.comm_bytes["dp"] == 2 * ((8 - 1) / 8 * non_expert / 2 + (2 - 1) / 2 * expert / (4 * 2)) * 2
    states = model_state_bytes(non_expert, dp=8, tp=2)
    ex = model_state_bytes(expert / 4, dp=2, tp=2)
    assert lay.memory.params == states.params + ex.params and lay.memory.optimizer == states.optimizer + ex.optimizer
    assert lay.links["ep"] == c16.intra_link                    # tp x ep = 8 GPUs: one node
    assert math.isclose(lay.compute_s, 6 * moe.active_params * 8 * 8192 / (16 * 312e12 * 0.5))
    assert not evaluate(moe, c16, dp=8, tp=2, pp=1, ep=3, global_batch=8).feasible
    assert "2 x 3 chunks" in evaluate(dense, Cluster(6), dp=1, tp=2, pp=1, cp=3, global_batch=1).problems[0]
    with pytest.raises(ValueError, match=r"dp\*tp\*pp\*cp = 32"):
        evaluate(dense, c16, dp=4, tp=2, pp=1, cp=4, global_batch=4)


FACTORIES = {"arange", "zeros", "ones", "full", "empty", "tensor", "randn", "rand", "randint", "eye", "linspace"}


@pytest.mark.parametrize("module", ["context", "experts", "vocab_parallel", "sparsify", "layouts"])
def test_new_tensors_in_parallel_code_are_made_on_the_inputs_device(module):
    """On GPUs a tensor made without device= lands on the CPU and a CUDA op refuses it (a CPU mask in
    masked_fill, CPU positions in repeat_interleave: found by a review, cannot run here). Every factory call
    in the code lessons 05, 08 and 09 (and the capstone's layouts) run on the ranks names its device (or is a
    *_like)."""
    import ast
    import inspect

    mod = __import__(f"mgpu_utils.parallel.{module}", fromlist=["_"])
    bare = [f"line {node.lineno}: torch.{node.func.attr}(...)"
            for node in ast.walk(ast.parse(inspect.getsource(mod)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            and node.func.attr in FACTORIES and not any(k.arg == "device" for k in node.keywords)]
    assert not bare, f"mgpu_utils/parallel/{module}.py makes tensors on the default device: {bare}"


def test_the_causal_mask_is_made_where_the_scores_are():
    from mgpu_utils.parallel.context import _pairs

    masks = [m for _, _, m in _pairs([(0, 4)], [(0, 4)], True, torch.device("meta"))]
    assert masks and all(m is not None and m.device.type == "meta" for m in masks)
