"""3-D parallelism planner: every (dp, tp, pp) layout of a GPT model on a cluster, with memory and
traffic (lesson 06; also 10); context and expert parallelism as two more degrees (lesson 08).

Introduced in ``notebooks/06_hybrid_parallel.ipynb``. For a model, a GPU count, a GPU memory size
and the links inside and between nodes, :func:`plan` lists every layout ``dp * tp * pp = n_gpus``,
whether it is feasible, its memory per GPU and its communication per training step.

Memory per GPU: :func:`mgpu_utils.costs.memory_model.memory_per_gpu` (ZeRO model states, Korthikanti et al.
activations, micro-batches in flight for the pipeline schedule); see that module for sources.

Communication per GPU per step (bytes each GPU sends; a ring all-reduce of S bytes over n GPUs sends
``2(n-1)/n * S`` per GPU, lesson 04):

* dp: with ``f = (dp-1)/dp * n_params/(tp*pp)`` and G, P the gradient and parameter bytes per
  parameter: ZeRO-0 (plain dp) one all-reduce of the accumulated gradients per step, ``2*f*G``; ZeRO-1 a
  reduce-scatter of the gradients plus an all-gather of the updated parameters, ``f*(G+P)``; ZeRO-2
  reduce-scatters the gradients of every micro-batch (it keeps only its shard), ``f*(m*G+P)``; ZeRO-3
  also all-gathers the parameters in forward and in backward of every micro-batch, ``f*m*(G+2P)``.
  With m = 1 and G = P this is the ZeRO paper's 1x / 1x / 1x / 1.5x of an all-reduce (Rajbhandari et al.,
  SC20, section 7). ZeRO-2/3 with pp > 1 is marked infeasible: DeepSpeed refuses it (the per-micro-batch
  gradient and parameter traffic would multiply with the pipeline's micro-batches).
* tp: Megatron layers (Shoeybi et al. 2019, figure 4: four communication operations per layer, forward
  and backward together): 2 all-reduces in forward and 2 in backward per layer and micro-batch, each of ``s*b*h`` activations (``act_bytes``); full
  recomputation repeats the forward ones (6). Sequence parallelism replaces each all-reduce by a
  reduce-scatter plus an all-gather: same bytes.
* pp: per micro-batch a stage sends its output activations (``s*b*h`` values) forward and receives
  the gradient back; a middle stage sends one of each: ``2 * m * s*b*h*act_bytes`` bytes per step (without the
  scatter/gather optimisation of Narayanan et al., SC21, which divides the inter-node part by tp).

Placement (Megatron's order): tp ranks are consecutive (inside a node, over NVLink), then dp, then pp.
A group whose ranks all sit in one node of ``gpus_per_node`` GPUs uses the intra-node link (the dp
groups do when ``tp*dp`` divides ``gpus_per_node``; otherwise some cross a node boundary), otherwise
the inter-node link (one NIC per GPU). Time = bytes / link bandwidth, no overlap, no latency: an upper
bound on the exposed communication for large messages.

Pipeline bubble: ``(pp - 1) / m`` of the ideal compute time for GPipe and 1F1B (Narayanan et al., sec. 2.2),
``m = global_batch / (dp * micro_batch)`` micro-batches per step. As a fraction of the whole step (compute
plus bubble) that is ``(pp - 1) / (m + pp - 1)`` = bubble / (1 + bubble), the form lesson 05 uses.

Activation bytes per value (``act_bytes``) follow the precision: 4 for "fp32", else 2.

Context parallelism (``cp``, lesson 08) splits every sequence over cp GPUs (ring attention,
zig-zag split): activations as for a sequence of ``s/cp`` tokens; per layer and micro-batch the key/value
blocks ``B = (s/cp)*b*(h/tp)*act_bytes`` travel the ring, ``2(cp-1) B`` in forward and ``(4cp-2) B`` in
backward (another ``2(cp-1) B`` with full recomputation); the cp GPUs hold the same parameters, so the
data-parallel gradient reduction spans ``dp*cp`` GPUs (ZeRO still shards over dp here; Megatron's
distributed optimizer shards over dp*cp, a little less memory). Needs ``s`` divisible by ``2*cp``.

Expert parallelism (``ep``, lesson 08) for a mixture-of-experts model (``ModelSpec.n_experts`` > 0: every
layer's MLP, ``8h^2 + 5h`` parameters, becomes E experts plus an ``h x E`` router, tokens to their
``top_k`` experts): the experts are split over ep GPUs taken from the data-parallel ones (ep divides dp),
so a GPU holds the dense part and E/ep experts per layer, and the experts' gradients are reduced over
``dp*cp/ep`` GPUs. Per MoE layer and micro-batch each GPU's ``T = (s/cp)*b`` tokens make ``T*top_k``
assignments, ``(ep-1)/ep`` of them to other GPUs when routing is uniform: dispatch and combine send
``2 * T*top_k*(ep-1)/ep * h*act_bytes`` in forward and as much in backward. Activations are left as the
dense model's (an approximation: a token's MLP activations are kept once per expert it visits). Placement
follows Megatron-Core's order tp, cp, ep, dp, pp.

Compute estimate: ``6 * n_params * tokens`` FLOPs per step (forward 2, backward 4; Kaplan et al. 2020),
+2 for full recomputation (a mixture of experts counts the parameters a token uses: the dense part and
``top_k`` of E experts), at ``efficiency`` (default 0.5) of the GPU's dense bf16 peak. Assumptions, not
measurements: the notebook says so where it prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu_utils.text import LINE_WIDTH, wrap_text
from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
from mgpu_utils.costs.hardware import GPUS
from mgpu_utils.costs.hardware import LINKS as _HW_LINKS
from mgpu_utils.costs.memory_model import (BYTES_PER_PARAM, MemoryBreakdown, memory_per_gpu, model_state_bytes,
                                           transformer_params)

#: Links known to the planner: ``mgpu_utils.costs.hardware.LINKS`` plus the A100-era InfiniBand.
LINKS: dict[str, dict] = {
    **_HW_LINKS,
    "InfiniBand HDR (200 Gb/s)": dict(gbps=25, latency_us=2,
                                      source="NVIDIA DGX A100 user guide: 8 ConnectX-6 HDR 200 Gb/s "
                                             "compute NICs, one per GPU"),
}


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-style model: layers, hidden size, heads, sequence length, vocabulary; ``n_params`` defaults
    to :func:`mgpu_utils.costs.memory_model.transformer_params`."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    seq_len: int
    vocab: int
    n_params: float | None = None
    n_experts: int = 0              # 0: a dense model; E > 0: every layer's MLP is E experts
    top_k: int = 1                  # experts per token

    @property
    def expert_params(self) -> float:
        """Parameters in the experts (all layers): ``L * E * (8h^2 + 5h)``; 0 for a dense model."""
        return self.n_layers * self.n_experts * (8 * self.hidden ** 2 + 5 * self.hidden)

    @property
    def params(self) -> float:
        """All parameters: the dense model's, with each MLP replaced by E experts and a router."""
        dense = self.n_params if self.n_params is not None else transformer_params(
            self.n_layers, self.hidden, self.vocab, self.seq_len)
        if not self.n_experts:
            return dense
        mlp = self.n_layers * (8 * self.hidden ** 2 + 5 * self.hidden)
        return dense - mlp + self.expert_params + self.n_layers * self.hidden * self.n_experts

    @property
    def active_params(self) -> float:
        """Parameters one token uses: the dense part and top_k experts per layer."""
        if not self.n_experts:
            return self.params
        return self.params - self.expert_params * (1 - self.top_k / self.n_experts)


#: GPT-3 175B (Brown et al. 2020, table 2.1): 96 layers, d_model 12288, 96 heads, context 2048.
GPT3_175B = ModelSpec("GPT-3 175B", n_layers=96, hidden=12288, n_heads=96, seq_len=2048, vocab=50257)


@dataclass(frozen=True)
class Cluster:
    """GPUs and links. ``gpu`` is a key of :data:`mgpu_utils.costs.hardware.GPUS` (memory and peak);
    ``intra_link`` / ``inter_link`` are keys of :data:`LINKS` (GB/s per GPU per direction)."""

    n_gpus: int
    gpu: str = "A100"
    gpus_per_node: int = 8
    intra_link: str = "NVLink 3 (A100, 12 links)"
    inter_link: str = "InfiniBand HDR (200 Gb/s)"
    memory_gb: float | None = None     # default: the GPU's memory

    def __post_init__(self):
        """Raises ValueError for an unknown GPU or link name (listing the known ones)."""
        if self.gpu not in GPUS:
            raise ValueError(f"unknown gpu {self.gpu!r}; known: {sorted(GPUS)}")
        for kind in ("intra_link", "inter_link"):
            if getattr(self, kind) not in LINKS:
                raise ValueError(f"unknown {kind} {getattr(self, kind)!r}; known: {sorted(LINKS)}")

    @property
    def memory_bytes(self) -> float:
        return (self.memory_gb if self.memory_gb is not None else GPUS[self.gpu]["memory_gb"]) * 1e9


@dataclass
class Layout:
    """One (dp, tp, pp) layout. Bytes are per GPU per step; seconds = bytes / bandwidth."""

    dp: int
    tp: int
    pp: int
    n_micro: int
    memory: MemoryBreakdown | None
    comm_bytes: dict = field(default_factory=dict)      # {"dp", "tp", "pp"}
    comm_s: dict = field(default_factory=dict)          # {"dp", "tp", "pp"}
    links: dict = field(default_factory=dict)           # {"dp", "tp", "pp"}: link name used
    bubble: float = 0.0
    compute_s: float = 0.0
    problems: list = field(default_factory=list)        # why it is not feasible (empty: feasible)
    cp: int = 1                                         # context-parallel degree (lesson 08)
    ep: int = 1                                         # expert-parallel degree (lesson 08)

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def memory_gb(self) -> float:
        return self.memory.total / 1e9 if self.memory else float("nan")

    @property
    def step_s(self) -> float:
        """Estimated step time: compute x (1 + bubble) + all communication (no overlap)."""
        return self.compute_s * (1 + self.bubble) + sum(self.comm_s.values())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def evaluate(model: ModelSpec, cluster: Cluster, dp: int, tp: int, pp: int, *, global_batch: int,
             micro_batch: int = 1, precision: str = "mixed", optimizer: str = "adam", zero_stage: int = 0,
             recompute: str = "none", sequence_parallel: bool = False, schedule: str = "1f1b",
             act_bytes: int | None = None, efficiency: float = 0.5, cp: int = 1, ep: int = 1) -> Layout:
    """Memory, communication and feasibility of one layout (see the module docstring for the formulas).

    ``act_bytes``: bytes per activation value; default from ``precision`` (4 for "fp32", else 2).
    ``cp``, ``ep``: context- and expert-parallel degrees (lesson 08); ``comm_bytes`` then has "cp" / "ep".

    Raises:
        ValueError: ``dp * tp * pp * cp != cluster.n_gpus``, unknown precision/optimizer.
    """
    if (precision, optimizer) not in BYTES_PER_PARAM:
        raise ValueError(f"unknown precision/optimizer {(precision, optimizer)}; known: {sorted(BYTES_PER_PARAM)}")
    if act_bytes is None:
        act_bytes = 4 if precision == "fp32" else 2
    if dp * tp * pp * cp != cluster.n_gpus:
        raise ValueError(f"dp*tp*pp{'*cp' if cp > 1 else ''} = {dp * tp * pp * cp} but the cluster has "
                         f"{cluster.n_gpus} GPUs")
    problems = []
    if cp > 1 and model.seq_len % (2 * cp):
        problems.append(f"cp={cp} does not divide the sequence of {model.seq_len} into 2 x {cp} chunks")
    if ep > 1 and (dp % ep or not model.n_experts or model.n_experts % ep):
        problems.append(f"ep={ep} must divide dp={dp} and the {model.n_experts} experts")
    if tp > cluster.gpus_per_node or cluster.gpus_per_node % tp:
        problems.append(f"tp={tp} does not fit in a node of {cluster.gpus_per_node} GPUs")
    if model.n_heads % tp or model.hidden % tp:
        problems.append(f"tp={tp} does not divide {model.n_heads} heads / hidden {model.hidden}")
    if model.n_layers % pp:
        problems.append(f"pp={pp} does not divide {model.n_layers} layers")
    if global_batch % (dp * micro_batch):
        problems.append(f"global batch {global_batch} is not a multiple of dp x micro-batch = {dp * micro_batch}")
    if zero_stage >= 2 and pp > 1:
        problems.append(f"ZeRO-{zero_stage} with pp={pp}: not supported (DeepSpeed refuses ZeRO-2/3 with "
                        "pipeline parallelism: gradients/parameters would move every micro-batch)")
    m = max(1, global_batch // (dp * micro_batch))
    lay = Layout(dp, tp, pp, m, None, problems=problems, cp=cp, ep=ep)
    if any("divide" in p for p in problems):
        return lay                                    # memory undefined for a layout that cannot split
    dense = model.params - model.expert_params
    lay.memory = memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len // cp,
                                micro_batch, n_params=dense, precision=precision, optimizer=optimizer,
                                zero_stage=zero_stage, dp=dp, tp=tp, pp=pp,
                                sequence_parallel=sequence_parallel, recompute=recompute,
                                schedule=schedule, n_micro=m, act_bytes=act_bytes)
    if model.n_experts:                               # this GPU's E/ep experts, ZeRO over their replicas
        ex = model_state_bytes(model.expert_params / ep, precision=precision, optimizer=optimizer,
                               zero_stage=zero_stage, dp=max(1, dp // ep), tp=tp, pp=pp)
        lay.memory = MemoryBreakdown(lay.memory.params + ex.params, lay.memory.grads + ex.grads,
                                     lay.memory.optimizer + ex.optimizer, lay.memory.activations)
    if lay.memory.total > cluster.memory_bytes:
        problems.append(f"needs {lay.memory_gb:.1f} GB per GPU > {cluster.memory_bytes / 1e9:.0f} GB")
    s, b, h = model.seq_len // cp, micro_batch, model.hidden       # s: the tokens one GPU holds
    param_b, grad_b, _ = BYTES_PER_PARAM[(precision, optimizer)]
    g, ge = dp * cp, dp * cp // ep                     # GPUs holding the same dense part, the same experts
    f = (g - 1) / g * dense / (tp * pp) + (ge - 1) / ge * model.expert_params / (ep * tp * pp)
    dp_bytes = {0: 2 * f * grad_b, 1: f * (grad_b + param_b), 2: f * (m * grad_b + param_b),
                3: f * m * (grad_b + 2 * param_b)}[zero_stage]
    n_ar = 6 if recompute == "full" else 4
    lay.comm_bytes = {
        "dp": dp_bytes,
        "tp": (model.n_layers // pp) * m * n_ar * ring_bytes_per_rank(s * b * h * act_bytes, tp),
        "pp": 2 * m * s * b * h * act_bytes if pp > 1 else 0.0,
    }
    node = cluster.gpus_per_node
    lay.links = {"tp": cluster.intra_link,
                 "dp": cluster.intra_link if node % (tp * cp * dp) == 0 else cluster.inter_link,
                 "pp": cluster.intra_link if node % (tp * cp * dp * pp) == 0 else cluster.inter_link}
    if cp > 1:
        kv = s * b * (h // tp) * act_bytes
        hops = 2 * (cp - 1) + (4 * cp - 2) + (2 * (cp - 1) if recompute == "full" else 0)
        lay.comm_bytes["cp"] = (model.n_layers // pp) * m * hops * kv
        lay.links["cp"] = cluster.intra_link if node % (tp * cp) == 0 else cluster.inter_link
    if ep > 1:
        lay.comm_bytes["ep"] = (model.n_layers // pp) * m * 4 * s * b * model.top_k * (ep - 1) / ep * h * act_bytes
        lay.links["ep"] = cluster.intra_link if node % (tp * cp * ep) == 0 else cluster.inter_link
    lay.comm_s = {k: v / (LINKS[lay.links[k]]["gbps"] * 1e9) for k, v in lay.comm_bytes.items()}
    lay.bubble = (pp - 1) / m
    flops = (8 if recompute == "full" else 6) * model.active_params * global_batch * model.seq_len
    lay.compute_s = flops / (cluster.n_gpus * GPUS[cluster.gpu]["bf16_tflops"] * 1e12 * efficiency)
    return lay


def parse_layouts(spec: str, world: int, heads: int, global_batch: int) -> list[tuple[int, int]]:
    """Meshes for ``launch_scripts/hybrid_gpt2.py --layouts``: "2x2,1x4" -> ``[(2, 2), (1, 4)]`` (dp, tp).

    "auto": ``(world/2)x2``, or ``world x 1`` for an odd world size or head count.

    Raises:
        ValueError: a malformed item, or a mesh whose dp*tp is not ``world``, whose tp does not divide
        ``heads`` or whose dp does not divide ``global_batch``; one message per failed check, naming the fix.
    """
    spec = spec if spec != "auto" else (f"{world // 2}x2" if world % 2 == 0 and heads % 2 == 0 else f"{world}x1")
    out = []
    for item in spec.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(v.isdigit() and int(v) > 0 for v in parts):
            raise ValueError(f"--layouts {spec!r}: {item!r} is not DPxTP with positive integers, e.g. 2x2,1x4")
        dp, tp = map(int, parts)
        for ok, fix in [(dp * tp == world, f"needs world size dp*tp = {dp * tp}, got {world}: use --nproc-per-node "
                                           f"{dp * tp} or a layout with dp*tp = {world}"),
                        (heads % tp == 0, f"tp={tp} does not divide --heads {heads}: use a tp dividing {heads}"),
                        (global_batch % dp == 0, f"dp={dp} does not divide --global-batch {global_batch}: "
                                                 f"use a multiple of {dp}")]:
            if not ok:
                raise ValueError(f"layout {dp}x{tp} {fix}")
        out.append((dp, tp))
    return out


def plan(model: ModelSpec, cluster: Cluster, **kwargs) -> list[Layout]:
    """Every layout ``dp * tp * pp == cluster.n_gpus``: feasible ones first, by estimated step time.

    Keyword arguments are those of :func:`evaluate` (``global_batch`` is required).
    """
    n = cluster.n_gpus
    lays = [evaluate(model, cluster, n // (tp * pp), tp, pp, **kwargs)
            for tp in _divisors(n) for pp in _divisors(n // tp)]
    return sorted(lays, key=lambda x: (not x.feasible, x.step_s if x.memory else float("inf"), x.tp, x.pp))


def table(layouts: list[Layout], limit: int | None = None, unit: str = "GB", time_unit: str = "s") -> str:
    """A plain-text table: layout, micro-batches, memory per GPU, bytes sent per GPU and time per step by
    kind, bubble, estimated step time, and why a layout is not feasible. ``unit``: "GB", "MB" or "kB"
    (powers of 1000); ``time_unit``: "s", "ms" or "us". A note that does not fit in the row's
    :data:`~mgpu_utils.dist.LINE_WIDTH` characters goes on the lines below it, indented."""
    ub = {"GB": 1e9, "MB": 1e6, "kB": 1e3}[unit]
    ut = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[time_unit]
    rows = [f"{'dp':>5} {'tp':>3} {'pp':>3} {'m':>5} {unit + '/GPU':>7} {'dp ' + unit:>7} {'tp ' + unit:>7} "
            f"{'pp ' + unit:>7} {'dp ' + time_unit:>6} {'tp ' + time_unit:>6} {'pp ' + time_unit:>6} {'bubble':>6} "
            f"{'step ' + time_unit:>7}  note"]
    for x in layouts[:limit]:
        if x.memory is None:
            row, note = f"{x.dp:>5} {x.tp:>3} {x.pp:>3} {x.n_micro:>5} {'-':>7}" + " " * 53, "; ".join(x.problems)
        else:
            cb, cs = x.comm_bytes, x.comm_s
            row = (f"{x.dp:>5} {x.tp:>3} {x.pp:>3} {x.n_micro:>5} {x.memory.total / ub:>7.1f} {cb['dp'] / ub:>7.2f} "
                   f"{cb['tp'] / ub:>7.2f} {cb['pp'] / ub:>7.2f} {cs['dp'] / ut:>6.2f} {cs['tp'] / ut:>6.2f} "
                   f"{cs['pp'] / ut:>6.2f} {x.bubble:>6.3f} {x.step_s / ut:>7.2f}")
            note = "; ".join(x.problems) or "ok"
        fits = len(row) + 2 + len(note) <= LINE_WIDTH
        rows.append(f"{row}  {note}" if fits else f"{row.rstrip()}\n" + wrap_text(" " * 8 + note))
    return "\n".join(rows)
