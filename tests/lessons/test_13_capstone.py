"""The capstone (issue 59; notebooks/13_capstone.ipynb runs a subset of it): one TinyLlama
trained 10 steps under every layout capstone_train.py knows, each equal to one process within 1e-5 (fp32), and
planted bugs that the matrix catches. One launch per world size (the script trains its --layouts in turn)."""
import functools
import re

import pytest
import torch

from mgpu_utils.launch.launcher import LaunchError, launch
from mgpu_utils.models import LlamaConfig, tiny_llama
from mgpu_utils.parallel.layouts import DIMS, PARITY_ARGS, PARITY_MATRIX, parse_layout, stored_parity_matrix
from mgpu_utils.text_data import byte_corpus, get_batch, split

TOL, STEPS, GLOBAL_BATCH, SEQ, LR = 1e-5, 10, 16, 32, 0.2

MATRIX, MATRIX_ARGS = PARITY_MATRIX, PARITY_ARGS     # world size -> layouts, and that launch's extra arguments
STORED_FIX = "the stored matrix is stale: run `python benchmarks/capstone_matrix.py` and commit its table"


@functools.cache
def reference_losses(layers: int = 4) -> list[float]:
    """The reference written here, not taken from the script: plain SGD on the whole batch in this process."""
    train, _ = split(byte_corpus())
    model = tiny_llama(LlamaConfig(layers=layers), seed=0)
    opt, losses = torch.optim.SGD(model.parameters(), lr=LR), []
    for step in range(STEPS):
        xb = get_batch(train, step, GLOBAL_BATCH, SEQ, 0)
        loss = torch.nn.functional.cross_entropy(model(xb[:, :-1]).flatten(0, 1), xb[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def one_process_losses():
    return reference_losses()


def check(res, layouts, one_process_losses):
    assert list(res["layouts"]) == layouts and res["steps"] == STEPS
    torch.testing.assert_close(res["ref_losses"], one_process_losses, rtol=TOL, atol=0)
    assert one_process_losses[-1] < one_process_losses[0] - 1.5           # it learns: 5.56 -> 3.61 (2 blocks: 3.62)
    for name, r in res["layouts"].items():
        assert r["max_param_diff"] <= TOL and r["max_loss_diff"] <= TOL * one_process_losses[0], (name, r)
        assert r["dp"] * r["fsdp"] * r["ep"] * r["cp"] * r["tp"] * r["pp"] == res["world_size"], name
        assert r["experts"] == (4 if r["ep"] > 1 else 0), name
        if r["experts"] == 0:                           # the dense model: its losses are one process's
            torch.testing.assert_close(r["losses"], one_process_losses, rtol=TOL, atol=0)


@pytest.mark.parametrize("nproc", sorted(MATRIX))
def test_every_layout_equals_one_process(nproc, starts_processes):
    """One launch per world size; at 32 ranks the 4-D and 5-D layouts (2 blocks: its own reference here)."""
    args = MATRIX_ARGS.get(nproc, [])
    layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 4
    res = launch("capstone_train.py", nproc, args=["--layouts", *MATRIX[nproc], *args], show="none", timeout_s=400)
    check(res, MATRIX[nproc], reference_losses(layers))
    stored = stored_parity_matrix()["layouts"]          # what lesson 13 shows: still what the script computes
    for name, r in res["layouts"].items():
        s = stored[name]
        assert s["experts"] == r["experts"] and s["args"] == args, (name, STORED_FIX)
        torch.testing.assert_close([s["loss_first"], s["loss_last"]], [r["losses"][0], r["losses"][-1]],
                                   rtol=TOL, atol=0, msg=lambda m: f"{name}: {m}\n{STORED_FIX}")


def test_the_matrix_has_every_parallelism_and_2d_to_5d():
    layouts = [parse_layout(t, w) for w, ts in MATRIX.items() for t in ts]
    assert len(layouts) >= 12 and all(any(L[d] > 1 for L in layouts) for d in DIMS)
    assert {sum(L[d] > 1 for d in DIMS) for L in layouts} >= {1, 2, 3, 4, 5}


def test_the_stored_matrix_is_the_matrix():
    """Lesson 13 shows the layouts it does not run from benchmarks/capstone_matrix.py's stored table: it must name
    exactly the matrix's layouts at their world sizes and arguments, each within the tolerance."""
    stored, fix = stored_parity_matrix(), STORED_FIX
    want = {t: (w, PARITY_ARGS.get(w, [])) for w, ts in MATRIX.items() for t in ts}
    assert {t: (r["world"], r["args"]) for t, r in stored["layouts"].items()} == want, fix
    assert sorted(map(int, stored["seconds"])) == sorted(MATRIX), fix
    assert all(r["max_param_diff"] <= TOL and r["max_loss_diff"] <= TOL * r["loss_first"]
               for r in stored["layouts"].values())


def test_mixture_of_experts_layouts(starts_processes):
    """The MoE model under dp, fsdp, pp, ep, and cp with the contiguous split (the matrix's cp is zigzag)."""
    layouts = ["dp2", "fsdp2", "pp2:GPipe", "ep2", "cp2"]
    res = launch("capstone_train.py", 2, args=["--experts", 4, "--cp-layout", "contiguous", "--layouts", *layouts],
                 show="none")
    assert list(res["layouts"]) == layouts and res["params"] == 332_352   # 4 x (4 x 16,576 + 256) for 4 x 24,576
    assert all(r["max_param_diff"] <= TOL for r in res["layouts"].values())


# a planted bug -> the layout that shows it, and the parameter the message must name
BUGS = {"norm-grad": ("dp2", r"\S*norm\.weight"),        # the 9 RMSNorm weights keep their replica's gradient
        "pp-unscaled": ("pp2:GPipe", r"\S+"),          # 4 micro-batches' gradients summed: 4 times the step
        "cp-positions": ("cp2", r"\S+")}               # rotary embeddings at a cp rank's own positions 0..S/cp-1


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_matrix_catches_a_planted_bug(bug, starts_processes):
    """Each bug misses one process by far more than 1e-5 (measured, torch 2.14: norm-grad 0.011 in norm.weight,
    pp-unscaled 0.96 in the embedding, cp-positions 0.0022 in the embedding), and the message names the layout, the parameter and the number."""
    layout, param = BUGS[bug]
    with pytest.raises(LaunchError, match=rf"layout {layout}: {param} differs from one process by") as err:
        launch("capstone_train.py", 2, args=["--bug", bug, "--layouts", layout], show="none")
    by = float(re.search(r"differs from one process by ([0-9.e+-]+) and", str(err.value)).group(1))
    assert by > 100 * TOL, by


def test_fsdp_under_a_zero_bubble_schedule_is_refused_with_the_reason(starts_processes):
    with pytest.raises(LaunchError, match=r"no fsdp under a zero-bubble schedule.*use 1F1B"):
        launch("capstone_train.py", 4, args=["--layouts", "fsdp2-pp2:ZBVZeroBubble"], show="none")


def test_the_layout_at_128_ranks_under_a_fake_process_group():
    """dp8-tp4-pp4 at world size 128 in this one process: a fake process group (torch's backend "fake") plays rank
    127, whose collectives return at once with no data. It tells the mesh's coordinates, each rank's parameter
    shards (every stage is built here: a stage's TP shards are the same on each of its tp ranks) and the
    collectives a step calls; no numerics (what comes back from a collective is not the sum). TinyLlama with
    kv_heads 4 (divisible by tp), 4 blocks: one per stage. Per rank, fp32: a block's wq, wk, wv, wo, w1, w2, w3 split
    by tp, its 2 norms whole; the first stage adds the embedding's V/tp rows, the last the final norm and its copy of
    the tied output's V/tp rows."""
    from mgpu_utils.models import LlamaConfig
    from mgpu_utils.parallel.layouts import fake_rank, parse_layout

    L, cfg = parse_layout("dp8-tp4-pp4", 128), LlamaConfig(kv_heads=4)
    pp, dp, tp = L["pp"], L["dp"], L["tp"]
    w, v, f, hd = cfg.width, cfg.vocab, cfg.ffn, cfg.width // cfg.heads
    block = (2 * cfg.heads * hd * w + 2 * cfg.kv_heads * hd * w + 3 * f * w) // tp + 2 * w   # elements per rank
    expected = [4 * (block + (v * w // tp if s == 0 else 0) + (w + v * w // tp if s == pp - 1 else 0))
                for s in range(pp)]
    assert expected == [57_856, 41_472, 41_472, 58_112]                        # bytes per rank, by pp coordinate
    sim = fake_rank("dp8-tp4-pp4", 128, 127, cfg, SEQ)
    assert sim["coordinate"] == {"pp": 3, "dp": 7, "tp": 3}                     # (pp, dp, tp), tp fastest
    assert sim["fake_sum"] == 1.0                                               # no numerics: not 128
    for s, stage in enumerate(sim["stages"]):
        for n, (mine, whole) in stage["shapes"].items():   # each weight split by tp along one dimension, norms whole
            assert mine in ([whole] if "norm" in n else [(whole[0] // tp, whole[1]), (whole[0], whole[1] // tp)]), \
                (s, n, mine)
        assert stage["bytes"] == expected[s], s
        assert stage["out_shape"] == ((2, SEQ, v) if s == pp - 1 else (2, SEQ // tp, w)), s
        # a block's forward: 2 all-gathers (into attention, into the MLP), 2 reduce-scatters (out of them), and
        # backward the other of each; the embedding's forward a reduce-scatter (backward: a gather); the output
        # gathers its tokens (backward: a reduce-scatter) and then its vocabulary-sharded logits, (B, S, V) on
        # every tp rank: the gather a vocabulary-parallel loss (lesson 05) would avoid
        n = 4 * (4 // pp) + (s in (0, pp - 1))
        assert stage["comm"] == {"all_gather_into_tensor": n + (s == pp - 1), "reduce_scatter_tensor": n}, \
            (s, stage["comm"])


@pytest.mark.parametrize("dp, tp", [(2, 2), (2, 4)])
def test_local_tensor_mode_equals_the_gloo_ranks_and_one_process(tmp_path, dp, tp, starts_processes):
    """The same code (layouts.dp_tp_gradients) on dp x tp gloo ranks (launch_scripts/dp_tp_step.py) and under
    LocalTensorMode in one process: every rank's gradients. At dp2-tp2 every sum has two operands, so the order
    cannot matter and they are equal bit for bit; at dp2-tp4 (8 ranks) the reduce-scatters of TP's backward sum 4
    operands, gloo in its ring's order and LocalTensor in rank order: equal to float32 rounding (measured: 3.4e-8).
    Both are within 1e-5 of one process on the whole batch."""
    import importlib.util

    from mgpu_utils.models import LlamaConfig
    from mgpu_utils.parallel.layouts import local_tensor_gradients, next_token_loss
    from mgpu_utils.source import load_script

    if importlib.util.find_spec("torch.distributed._local_tensor") is None:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed._local_tensor (2.14 has it)")
    r = launch("dp_tp_step.py", nproc=dp * tp, args=["--tp", tp, "--dump", tmp_path / "grads.pt"], show="none")
    assert (r["world_size"], r["dp"], r["tp"]) == (dp * tp, dp, tp) and r["max_grad_diff"] <= TOL
    cfg = LlamaConfig(kv_heads=4, layers=1)
    batch = load_script("dp_tp_step.py").batch_for(dp, cfg.vocab)
    local = local_tensor_gradients(cfg, dp, tp, batch)
    ref = tiny_llama(cfg, seed=0)
    next_token_loss(ref(batch[:, :-1]), batch[:, 1:]).backward()
    one = {n: q.grad for n, q in ref.named_parameters()}
    gloo = torch.load(tmp_path / "grads.pt")
    assert len(local) == len(gloo) == dp * tp and sorted(local[0]) == sorted(one) == r["names"]
    for rank in range(dp * tp):
        for n, g in local[rank].items():
            torch.testing.assert_close(g, one[n], rtol=0, atol=TOL)
            if tp == 2:
                assert torch.equal(gloo[rank][n], g), (rank, n, (gloo[rank][n] - g).abs().max().item())
            else:
                torch.testing.assert_close(gloo[rank][n], g, rtol=0, atol=1e-6)
