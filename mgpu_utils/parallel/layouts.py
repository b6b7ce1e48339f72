"""The capstone's layouts of one model (used by ``launch_scripts/capstone_train.py``, issue 59;
notebooks/13_capstone.ipynb): a layout string parsed into the sizes of a DeviceMesh, and the pieces that put
:class:`mgpu_utils.models.TinyLlama` (or a pipeline stage of it) on that mesh, built from the lessons' own parts.

* **tp** (05): Megatron tensor parallelism with sequence parallelism, PyTorch's ``parallelize_module``
  (:func:`tensor_parallel`).
* **cp** (08): context parallelism: each cp rank holds a slice of the sequence (or two, zigzag), its attention
  is lesson 08's ring attention over the mesh's "cp" group, rotary embeddings at the tokens' global positions
  (:class:`ContextParallelAttention`, :func:`context_parallel`).
* **ep** (08): expert parallelism: every mixture-of-experts layer becomes lesson 08's
  :class:`~mgpu_utils.parallel.experts.ExpertParallelMoE` over the "ep" group (:func:`expert_parallel`).
* What the replicas must reduce: :func:`reduce_gradients` (dp, ep, cp), :func:`tie_group` and
  :func:`sum_tied` (a pipeline's two copies of the tied embedding), :func:`local_grad` (a DTensor's shard).
* One rank of a large layout in this process, under a fake process group: :func:`fake_rank` (lesson 13).
* Every rank of a dp x tp step in this process, under ``LocalTensorMode``: :func:`local_tensor_gradients`, the same
  code as on gloo ranks (:func:`dp_tp_gradients`; lesson 13).

Nothing runs at import time. Everything is fp32 on the ranks' device; the groups are a DeviceMesh's.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mgpu_utils.models import rotary
from mgpu_utils.parallel.context import chunk_ranges, ring_attention
from mgpu_utils.parallel.experts import ExpertParallelMoE

#: The mesh's dimensions, slowest first (tp fastest, as Megatron-LM orders them; cp and ep inside the replicas).
DIMS = ("pp", "dp", "fsdp", "ep", "cp", "tp")

#: The parity matrix: world size -> the layouts ``capstone_train.py`` trains in one launch at that size (each
#: against one process within 1e-5 after 10 SGD steps). DP, FSDP2, TP + SP, PP (seven schedules), CP (lesson
#: 08's ring attention, zigzag), EP (4 experts, against its own one process; with dp and cp only: the script refuses
#: experts with tp), 2-D and 3-D combinations (dp x fsdp is HSDP), and at 32 ranks a 4-D and a 5-D layout
#: (size-2 dimensions: 16 and 32 ranks at least). Run by
#: tests/lessons/test_13_capstone.py (every launch) and benchmarks/capstone_matrix.py (timed, stored for lesson 13,
#: which runs one launch live). Left out, and refused by the script: FSDP2 under a schedule that splits the backward
#: into input and weight gradients (InterleavedZeroBubble, ZBVZeroBubble, DualPipeV; torch 2.14, gloo): every stage
#: ends off one process after 10 steps (fsdp2-pp2: 0.046 with ZBVZeroBubble, 0.068 with DualPipeV), while the
#: same schedules pass without FSDP and FSDP2 passes under 1F1B, GPipe, Interleaved1F1B and LoopedBFS.
PARITY_MATRIX = {
    1: ["dp"],
    2: ["dp2", "fsdp2", "tp2", "pp2:1F1B", "pp2:LoopedBFS", "cp2", "ep2"],
    4: ["dp2-tp2", "fsdp2-tp2", "dp2-pp2:InterleavedZeroBubble", "tp2-pp2:ZBVZeroBubble", "fsdp2-pp2:Interleaved1F1B",
        "fsdp4", "dp2-cp2", "cp2-tp2", "dp2-ep2"],
    8: ["dp2-fsdp2-tp2", "dp2-tp2-pp2:Interleaved1F1B", "fsdp2-tp2-pp2:1F1B", "dp2-fsdp2-pp2:GPipe",
        "dp4-pp2:DualPipeV", "dp8", "cp2-tp2-pp2:1F1B", "dp2-ep2-cp2"],
    32: ["dp4-cp2-tp2-pp2:1F1B", "dp2-fsdp2-cp2-tp2-pp2:1F1B"],
}
#: Extra ``capstone_train.py`` arguments per world size of :data:`PARITY_MATRIX`. At 32 ranks (32 processes on the
#: course's 2-core floor) a 2-block model and 2 micro-batches, for both layouts: 42 s for the two (the stored
#: table's run) instead of 62 s for the 5-D one alone with 4 blocks and 4 micro-batches (torch 2.14, 2 quiet
#: cores); the start-up of 32 processes is most of what is left.
PARITY_ARGS = {32: ["--layers", "2", "--micro-batches", "2"]}
#: The whole matrix's last run, stored by benchmarks/capstone_matrix.py (JSON): what lesson 13 shows for the
#: layouts it does not run live.
STORED_MATRIX = Path(__file__).resolve().parents[2] / "benchmarks" / "stored" / "capstone_matrix.json"


def stored_parity_matrix() -> dict:
    """The stored run of the whole :data:`PARITY_MATRIX` (lesson 13): ``{"torch", "cpu_cores", "date", "seconds":
    {world: s}, "total_seconds", "layouts": {layout: {"world", "experts", "loss_first", "loss_last",
    "max_param_diff", "max_loss_diff"}}}``.

    Raises:
        FileNotFoundError: no stored table (run ``python benchmarks/capstone_matrix.py``).
    """
    import json

    if not STORED_MATRIX.is_file():
        raise FileNotFoundError(f"{STORED_MATRIX} is missing: run `python benchmarks/capstone_matrix.py` to store "
                                "the whole matrix")
    return json.loads(STORED_MATRIX.read_text())


def next_token_loss(logits, targets):
    """Cross-entropy of logits (B, S, vocab) float32 against targets (B, S) int64: the mean over the B x S tokens."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def parse_layout(text: str, world: int) -> dict:
    """A layout string at this world size -> the size of every dimension of :data:`DIMS` and the schedule.

    ``"dp2-tp2-pp2:GPipe"`` -> ``{"pp": 2, "dp": 2, "fsdp": 1, "ep": 1, "cp": 1, "tp": 2, "schedule": "GPipe"}``:
    sizes joined by "-" in any order, size-1 dimensions left out, dp (if not given) what the others leave of the
    world; after ":" a ``torch.distributed.pipelining`` schedule name (default "1F1B").

    Raises:
        SystemExit: a part that is not a dimension of :data:`DIMS` and a size (the launch script's message).
    """
    spec, _, schedule = text.partition(":")
    L = {**{d: 1 for d in DIMS}, "dp": 0, "schedule": schedule or "1F1B"}
    for part in filter(None, spec.split("-")):
        name = part.rstrip("0123456789")
        if name not in DIMS:
            raise SystemExit(f"layout {text!r}: {part!r} is not one of {', '.join(DIMS)} and a size, e.g. tp2")
        L[name] = int(part[len(name):] or 0)
    L["dp"] = L["dp"] or world // max(1, L["fsdp"] * L["ep"] * L["cp"] * L["tp"] * L["pp"])
    return L


def tensor_parallel(model, tp_mesh) -> None:
    """Megatron TP + sequence parallelism of a TinyLlama or a pipeline stage of it, in place: wq, wk, wv, w1, w3
    split by columns, wo, w2 by rows, the embedding and output by vocabulary rows; between the blocks a rank holds
    its 1/tp of the tokens (``Shard(1)``), the norms replicated (their gradients summed by DTensor).
    ``tp_mesh``: a 1-D DeviceMesh. Needs kv_heads and the (local) sequence divisible by its size."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel as Col, PrepareModuleInput
    from torch.distributed.tensor.parallel import RowwiseParallel as Row, SequenceParallel, parallelize_module

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(), "attention": gather, "attention.wq": Col(), "attention.wk": Col(),
            "attention.wv": Col(), "attention.wo": Row(output_layouts=Shard(1)), "ffn_norm": SequenceParallel(),
            "feed_forward": gather, "feed_forward.w1": Col(), "feed_forward.w3": Col(),
            "feed_forward.w2": Row(output_layouts=Shard(1))})
    plan = {"tok_embeddings": Row(input_layouts=Replicate(), output_layouts=Shard(1)), "norm": SequenceParallel(),
            "output": Col(input_layouts=Shard(1), output_layouts=Replicate())}        # those this stage has
    parallelize_module(model, tp_mesh, {k: style for k, style in plan.items() if getattr(model, k) is not None})
    if model.tok_embeddings is not None and model.output is not None:
        model.output.weight = model.tok_embeddings.weight        # parallelize_module made two copies: tie again


class ContextParallelAttention(nn.Module):
    """A TinyLlama attention (:class:`mgpu_utils.models.GroupedQueryAttention`, its projections taken over, so the
    parameter names stay) on this cp rank's tokens: (B, L, width) -> (B, L, width), L = seq_len / cp.

    The rank's tokens are those of ``chunk_ranges(cp rank, cp, seq_len, layout)`` (lesson 08: "contiguous", or
    "zigzag", load-balanced under the causal mask); rotary embeddings use their global positions; the key/value
    heads are repeated to the query heads (GQA) and the causal attention over the whole sequence is lesson 08's
    :func:`~mgpu_utils.parallel.context.ring_attention` over ``group``. Under TP a rank holds heads/tp of the
    heads and runs the same code (the ring then carries those heads only).
    """

    def __init__(self, attn: nn.Module, group, seq_len: int, layout: str = "zigzag"):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo, self.hd, self.base = attn.wq, attn.wk, attn.wv, attn.wo, attn.hd, attn.base
        self.group, self.seq_len, self.layout = group, seq_len, layout
        ranges = chunk_ranges(dist.get_rank(group), dist.get_world_size(group), seq_len, layout)
        dev = attn.wq.weight.device
        self.positions = torch.cat([torch.arange(a, b, device=dev) for a, b in ranges])   # (L,) int64, global

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.hd) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, self.base, self.positions), rotary(k, self.base, self.positions)
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)                 # GQA: share kv heads
        out = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), seq_len=self.seq_len,
                             layout=self.layout, causal=True, group=self.group)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def context_parallel(model, group, seq_len: int, layout: str = "zigzag") -> None:
    """Every block's attention of a TinyLlama (or stage) made a :class:`ContextParallelAttention`, in place; do it
    before :func:`tensor_parallel` and FSDP. The rank's inputs and targets then are ``cp_shard`` of the batch's.

    Raises:
        ValueError: ``seq_len`` not divisible by the group's size (zigzag: twice its size)."""
    for block in model.layers.values():
        block.attention = ContextParallelAttention(block.attention, group, seq_len, layout)


def cp_shard(t, group, layout: str = "zigzag"):
    """This cp rank's tokens of (B, S) ids or targets, in :func:`~mgpu_utils.parallel.context.chunk_ranges`
    order: (B, S / cp); ``group`` None: ``t`` itself."""
    if group is None:
        return t
    ranges = chunk_ranges(dist.get_rank(group), dist.get_world_size(group), t.shape[1], layout)
    return torch.cat([t[:, a:b] for a, b in ranges], 1)


EXPERT = re.compile(r"(\.moe\.experts\.)(\d+)\.")


def expert_parallel(model, group):
    """Every mixture-of-experts layer of a TinyLlama (or stage) made lesson 08's ``ExpertParallelMoE`` over
    ``group``, in place: this rank keeps the router and experts ``r E/n ... (r+1) E/n - 1`` (r: its rank in the
    group of n), numbered from 0 in its module. Returns ``global_name(name) -> name``, which renumbers this
    rank's expert parameters as in the whole model ("...moe.experts.0.fc1.weight" on rank 1 of 2, 4 experts:
    "...moe.experts.2.fc1.weight").

    Raises:
        ValueError: the experts are not divisible by the group's size (``ExpertParallelMoE``'s message)."""
    local, first = 0, 0
    for block in model.layers.values():
        block.feed_forward.moe = ExpertParallelMoE(block.feed_forward.moe, group)
        local = block.feed_forward.moe.local
        first = dist.get_rank(group) * local
    return lambda name: EXPERT.sub(lambda m: f"{m.group(1)}{first + int(m.group(2))}.", name)


def local_grad(q):
    """This rank's shard of parameter q's gradient (a plain tensor, laid out as q is: an embedding's comes back
    Replicate under TP, and is redistributed to q's placements first); q's own gradient when q is no DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(q.grad, DTensor) and q.grad.placements != q.placements:
        q.grad = q.grad.redistribute(q.device_mesh, q.placements)
    return q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad


def reduce_gradients(params, mesh, sizes: dict, skip=lambda name: False) -> None:
    """Sum the local gradients of ``params`` ((name, parameter) pairs) over the replicas and divide
    by their count.

    A rank's loss is the mean over its own tokens: its rows (dp, ep; fsdp's reduce-scatter averages
    its own) and its slice of the sequence (cp). The whole batch's gradient is the mean over the
    dp x ep x cp ranks: each gradient is all-reduced (one flat buffer per group) over "dp", "cp"
    and, except an expert's, "ep" (an expert already got the gradients of every ep rank's tokens
    back through the all-to-all), then divided by dp ep cp. ``sizes``: each dimension's size
    (:func:`parse_layout`); ``skip(name)``: parameters left out (a planted bug)."""
    params = [(n, q) for n, q in params if not skip(n)]
    for dim in ("dp", "ep", "cp"):
        grads = [local_grad(q) for n, q in params
                 if sizes[dim] > 1 and not (dim == "ep" and EXPERT.search(n))]
        if grads:
            flat = torch.cat([t.reshape(-1) for t in grads])
            dist.all_reduce(flat, group=mesh.get_group(dim))
            for t, new in zip(grads, flat.split([t.numel() for t in grads])):
                t.copy_(new.view_as(t))
    if sizes["dp"] * sizes["ep"] * sizes["cp"] > 1:
        for _, q in params:
            local_grad(q).div_(sizes["dp"] * sizes["ep"] * sizes["cp"])


def tie_group(mesh, pp: int, last: int, rank: int):
    """The group of this rank's two copies of the tied embedding under a pipeline: the first stage's pp rank (0)
    and ``last``, the pp rank of the last stage (pp - 1, or 0 under a V schedule: None, the copies on one rank),
    at the same coordinates in the other dimensions. Every rank makes every pair's group (a collective); returns
    None on a rank outside all of them. ``mesh``: the layout's DeviceMesh with "pp" as dimension 0."""
    from mgpu_utils.dist import new_group

    mine = None
    for ranks in mesh.mesh.movedim(0, -1).reshape(-1, pp).tolist() if last else []:
        grp = new_group([ranks[0], ranks[last]])
        mine = grp if rank in (ranks[0], ranks[last]) else mine
    return mine


def sum_tied(tied, group) -> None:
    """The gradients of a pipeline's copies of the tied embedding ``tied`` (this rank's: one, or two under a V
    schedule) summed over them and over ``group`` (:func:`tie_group`), each copy given the sum."""
    if group is None and len(tied) < 2:
        return
    total = sum(local_grad(q) for q in tied)
    if group is not None:
        dist.all_reduce(total, group=group)
    for q in tied:
        local_grad(q).copy_(total)


def fake_rank(layout: str, world: int, rank: int, cfg, seq: int, rows: int = 2) -> dict:
    """One rank of a dp x tp x pp layout at any world size, in this process, under a fake process group (torch's
    backend "fake": every collective returns at once, with no data): capstone lesson 13 and its test.

    Builds each pipeline stage of a TinyLlama of ``cfg`` (a stage's TP shards are the same on each of its tp
    ranks) with :func:`tensor_parallel`, and runs a forward and a backward of ``rows`` sequences of ``seq``
    tokens under ``CommDebugMode``. Returns ``{"coordinate": {dim: index}, "fake_sum": what an all-reduce of 1.0
    returned, "stages": [{"shapes": {name: (local shape, whole shape)}, "bytes": this rank's parameter bytes,
    "out_shape", "comm": {collective: calls}}]}``. Shapes, bytes and calls are what a fake group can tell; the
    values are not (an all-reduce returns its input). Needs no process group already initialised.
    """
    import gc

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from mgpu_utils.dist import device_mesh
    from mgpu_utils.models import pipeline_stage, tiny_llama

    L = parse_layout(layout, world)
    pp, dp, tp = L["pp"], L["dp"], L["tp"]
    full = {n: tuple(q.shape) for n, q in tiny_llama(cfg).named_parameters(remove_duplicate=False)}
    gc.disable()                       # no collection while the fake group's objects are alive
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        mesh = device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        one = torch.ones(1, device="cpu")               # the fake group is a CPU group
        dist.all_reduce(one)
        out = {"coordinate": dict(zip(("pp", "dp", "tp"), mesh.get_coordinate())), "fake_sum": one.item(),
               "stages": []}
        for s in range(pp):
            stage = pipeline_stage(tiny_llama(cfg), s, pp)
            tensor_parallel(stage, mesh["tp"])
            local = {n: q.to_local() if isinstance(q, DTensor) else q for n, q in stage.named_parameters()}
            x = (torch.randint(0, cfg.vocab, (rows, seq), device="cpu") if s == 0
                 else torch.randn(rows, seq // tp, cfg.width, device="cpu"))
            with CommDebugMode() as comm:
                y = stage(x)
                (y.to_local() if isinstance(y, DTensor) else y).sum().backward()
            out["stages"].append({
                "shapes": {n: (tuple(q.shape), full[n]) for n, q in local.items()},
                "bytes": sum(q.numel() * q.element_size() for q in local.values()), "out_shape": tuple(y.shape),
                "comm": {str(op).split(".")[-1]: k for op, k in comm.get_comm_counts().items()}})
        return out
    finally:
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        gc.enable()


def dp_tp_gradients(cfg, dp: int, tp: int, batch: torch.Tensor) -> dict:
    """One step of a TinyLlama of ``cfg`` (seed 0) under dp x tp (mesh order dp, tp; Megatron
    TP + SP, :func:`tensor_parallel`) on the default group of dp * tp ranks, the gradients
    averaged over dp: ``{name: the whole gradient, float32}`` (TP shards gathered by
    ``full_tensor``). Lesson 13 and its test.

    ``batch``: (dp * rows, seq + 1) int64 tokens, the same on every rank; dp rank d trains rows
    [d * rows, (d + 1) * rows), tokens 0..seq-1 against 1..seq. ``rank_map`` picks each rank's
    rows: a plain tensor on a real rank; under ``LocalTensorMode`` a LocalTensor of every
    simulated rank's rows (:func:`local_tensor_gradients`). So the same code runs on gloo ranks
    and in one process. Needs cfg.kv_heads, cfg.heads and seq divisible by tp.
    """
    from torch.distributed._local_tensor import rank_map
    from torch.distributed.tensor import DTensor

    from mgpu_utils.dist import device_mesh
    from mgpu_utils.models import tiny_llama

    mesh = device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = tiny_llama(cfg, seed=0)
    tensor_parallel(model, mesh["tp"])
    rows = batch.shape[0] // dp
    mine = rank_map(lambda r: batch[(r // tp) * rows:(r // tp + 1) * rows])
    logits = model(mine[:, :-1])
    logits = logits.to_local() if isinstance(logits, DTensor) else logits    # replicated (B, S, V)
    next_token_loss(logits, mine[:, 1:]).backward()
    grads = {}
    for name, p in model.named_parameters():
        shard = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(shard, group=mesh["dp"].get_group())                  # the dp replicas' mean
        shard.div_(dp)
        grads[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
    return grads


def local_tensor_gradients(cfg, dp: int, tp: int, batch: torch.Tensor) -> list[dict]:
    """:func:`dp_tp_gradients` for all dp * tp ranks in this one process: a fake process group (no data moves)
    under ``LocalTensorMode``, which holds every rank's tensors and runs each collective on them, so the values
    are real (unlike :func:`fake_rank`'s). Returns ``[{name: gradient} for each rank]``, float32, detached copies.
    Needs no process group already initialised (lesson 13; torch 2.14: ``torch.distributed._local_tensor``).

    Raises:
        ImportError: a torch without ``torch.distributed._local_tensor`` (the floor torch 2.10 has none).
    """
    import gc

    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = dp * tp
    gc.disable()                       # no collection while the fake group's objects are alive (as fake_rank)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with LocalTensorMode(world):
            grads = dp_tp_gradients(cfg, dp, tp, batch)
            return [{n: (g._local_tensors[r] if isinstance(g, LocalTensor) else g).detach().clone()
                     for n, g in grads.items()} for r in range(world)]
    finally:
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        gc.enable()
