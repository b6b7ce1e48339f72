"""Pipeline-parallel runtime pieces: the toy model, a timing wrapper, the layer split (equal, or balanced
by layer cost) and a hand-written schedule executor (notebooks/05_model_parallel.ipynb,
launch_scripts/pipeline_parallel.py).

Every stage maps a ``(micro_batch, d)`` float tensor to the same shape, so every message between
stages has one shape. Times are ``time.perf_counter()`` seconds relative to the start each rank sets
(:meth:`Recorder.start`, right after a barrier). Those starts differ by the barrier's exit skew, so
the launch script shifts every rank's times to one origin (:meth:`Recorder.shift`, the earliest
start over ranks): ``perf_counter`` is the system-wide monotonic clock, the same for every process
of one machine (across nodes clocks differ, and this shift would not be exact).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from mgpu_utils.parallel.schedules import p2p_plan


def build_model(n_layers: int, d: int, seed: int = 0) -> nn.Sequential:
    """``n_layers`` blocks of ``Linear(d, d) + Tanh``, the same weights on every rank (seeded)."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(n_layers):
        lin = nn.Linear(d, d)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d, d, generator=g) / d**0.5)
            lin.bias.copy_(0.1 * torch.randn(d, generator=g))
        blocks.append(nn.Sequential(lin, nn.Tanh()))
    return nn.Sequential(*blocks)


def split_stages(model: nn.Sequential, n_stages: int, sizes: list[int] | None = None) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` consecutive slices: of equal length, or of ``sizes`` blocks each
    (e.g. from :func:`balanced_split`).

    Raises:
        ValueError: the number of blocks is not divisible by ``n_stages`` (no ``sizes``), or ``sizes``
            does not hold ``n_stages`` positive counts adding up to the number of blocks.
    """
    if sizes is None:
        if len(model) % n_stages:
            raise ValueError(f"{len(model)} layers do not split into {n_stages} equal stages: "
                             f"use --layers divisible by {n_stages}")
        sizes = [len(model) // n_stages] * n_stages
    sizes = [int(k) for k in sizes]
    if len(sizes) != n_stages or min(sizes) < 1 or sum(sizes) != len(model):
        raise ValueError(f"--split {','.join(map(str, sizes))} must give each of the {n_stages} stages at "
                         f"least one layer and add up to the {len(model)} layers")
    ends = [sum(sizes[:i + 1]) for i in range(n_stages)]
    return [model[e - k:e] for e, k in zip(ends, sizes)]


def balanced_split(costs: list[float], n_stages: int) -> list[int]:
    """Layers per stage that make the slowest stage as fast as it can be (lesson 05).

    Cuts the layers, in order, into ``n_stages`` consecutive groups so that the largest group sum of
    ``costs`` (a layer's time, measured or from FLOPs: any unit) is as small as possible; a pipeline
    runs at the pace of its slowest stage. Dynamic programming over (layers so far, stages so far),
    O(n_stages x layers^2); among equally good splits the first found (earlier cuts) is returned.

    Returns:
        ``n_stages`` positive layer counts adding up to ``len(costs)``.

    Raises:
        ValueError: fewer layers than stages, or a negative cost.
    """
    n = len(costs)
    if n < n_stages or n_stages < 1:
        raise ValueError(f"{n} layers cannot fill {n_stages} stages: "
                         "every stage needs at least one layer")
    if min(costs) < 0:
        raise ValueError(f"layer costs must not be negative, got {min(costs)}")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    inf = float("inf")
    # best[k][i]: the smallest slowest-stage cost of the first i layers on k stages;
    # cut[k][i]: where the k-th stage starts in that split
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(best[k - 1][j], pre[i] - pre[j])
                if c < best[k][i] - 1e-12:
                    best[k][i], cut[k][i] = c, j
    sizes, i = [], n
    for k in range(n_stages, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return sizes[::-1]


class Recorder:
    """Collects ``{"kind", "mb", "stage", "start", "end"}`` events (seconds since ``t0``).

    ``sleep_s``: extra time each stage forward sleeps (backward sleeps twice as long), so a timeline
    measured on a few shared CPU cores shows the schedule's structure rather than core contention.
    Recording happens only while ``enabled``.
    """

    def __init__(self):
        self.events, self.enabled, self.sleep_s, self.t0 = [], False, 0.0, 0.0
        self._count, self._open = {}, {}

    def start(self, sleep_s: float | dict[int, float] = 0.0) -> None:
        """Clear the events, reset the micro-batch counters, set the clock origin and start recording.

        ``sleep_s``: seconds per stage forward, one for all stages or ``{stage: seconds}`` (stages of
        unequal cost, lesson 05's load balancing)."""
        self.events, self._count, self._open = [], {}, {}
        self.sleep_s, self.enabled, self.t0 = sleep_s, True, time.perf_counter()

    def stop(self) -> list[dict]:
        self.enabled, self.sleep_s = False, 0.0
        return self.events

    def shift(self, t0: float) -> float:
        """Re-express the recorded events relative to the absolute ``perf_counter`` time ``t0`` (e.g.
        the earliest start over ranks) instead of this rank's own start. Returns the offset added."""
        off = self.t0 - t0
        for ev in self.events:
            ev["start"] += off
            ev["end"] += off
        self.t0 = t0
        return off

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def begin(self, kind: str, stage: int) -> None:
        mb = self._count.get((kind, stage), 0)    # every schedule here runs micro-batches in order per stage
        self._count[(kind, stage)] = mb + 1
        self._open[stage] = {"kind": kind, "mb": mb, "stage": stage, "start": self.now()}
        t = self.sleep_s.get(stage, 0.0) if isinstance(self.sleep_s, dict) else self.sleep_s
        if t:
            time.sleep(t * (2 if kind == "B" else 1))

    def end(self, stage: int) -> None:
        ev = self._open.pop(stage)
        ev["end"] = self.now()
        self.events.append(ev)


class _Mark(torch.autograd.Function):
    """Identity whose backward tells the recorder that backward reached this point."""

    @staticmethod
    def forward(ctx, x, rec, stage, what):
        ctx.rec, ctx.stage, ctx.what = rec, stage, what
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if ctx.rec.enabled:
            if g.is_cuda:
                torch.cuda.synchronize(g.device)
            ctx.rec.begin("B", ctx.stage) if ctx.what == "begin" else ctx.rec.end(ctx.stage)
        return g, None, None, None


class Timed(nn.Module):
    """Wraps a stage: records when its forward and its backward run (and sleeps, see Recorder).

    Backward start = when the output's gradient arrives, end = when the input's gradient is done
    (the input is made to require grad so that point exists on the first stage too)."""

    def __init__(self, module: nn.Module, stage: int, rec: Recorder):
        super().__init__()
        self.module, self.stage, self.rec = module, stage, rec

    def forward(self, x):
        if not self.rec.enabled or x.is_meta:
            return self.module(x)
        if not x.requires_grad:
            x = x.detach().requires_grad_(True)
        if x.is_cuda:                                   # NCCL's work.wait() does not block the host:
            torch.cuda.synchronize(x.device)            # wait for the received input before the clock
        self.rec.begin("F", self.stage)
        out = self.module(_Mark.apply(x, self.rec, self.stage, "end"))
        if out.is_cuda:
            torch.cuda.synchronize(out.device)
        self.rec.end(self.stage)
        return _Mark.apply(out, self.rec, self.stage, "begin")


def layer_split_step(stage: nn.Module, x, y, loss_fn, rank: int, p: int):
    """One training step of a model cut into p stages, stage r on rank r, no micro-batches.

    Forward: rank r receives the activation from rank r-1, runs its layers, sends the result to
    rank r+1; the last rank computes the loss. Backward: the last rank calls ``loss.backward()``,
    the others receive the gradient of their output from rank r+1 and send the gradient of their
    input to rank r-1. Only one rank computes at any moment.

    Returns:
        ``(out, loss)``: this stage's output (detached) and, on the last rank, the loss (else None).
    """
    inp = x if rank == 0 else torch.empty_like(x)
    if rank > 0:
        dist.recv(inp, src=rank - 1)                    # activation from the previous stage
        inp.requires_grad_(True)
    out = stage(inp)
    if rank < p - 1:
        dist.send(out.detach(), dst=rank + 1)           # activation to the next stage
        grad = torch.empty_like(out)
        dist.recv(grad, src=rank + 1)                   # d loss / d out, from the next stage
        out.backward(grad)
        loss = None
    else:
        loss = loss_fn(out, y)
        loss.backward()
    if rank > 0:
        dist.send(inp.grad, dst=rank - 1)               # d loss / d inp, to the previous stage
    return out.detach(), loss


def run_schedule(actions: list[tuple], stages: dict, x_mbs: list, y_mbs: list, loss_fn, rank: int,
                 p: int):
    """The hand-written executor: runs this rank's actions (:mod:`mgpu_utils.parallel.schedules`).

    Args:
        actions: ``[(kind, mb, stage), ...]`` for this rank; stage s lives on rank ``s % p``.
        stages: ``{stage index: module}`` for the stages of this rank.
        x_mbs, y_mbs: input and target micro-batches (used on the first and the last stage).
        loss_fn: loss of one micro-batch; each is divided by the number of micro-batches, so the
            accumulated gradients equal those of the mean loss over the whole batch.

    Messages are posted with ``dist.batch_isend_irecv`` in the batches of
    :func:`mgpu_utils.parallel.schedules.p2p_plan` (a send and the next receive together: safe with
    NCCL).

    Returns:
        ``(loss, out)`` on the rank that holds the last stage: the summed loss and the last stage's
        outputs of all micro-batches, concatenated (detached); ``(None, None)`` elsewhere.
    """
    m, n_stages = len(x_mbs), p * (1 + max(s for _, _, s in actions) // p)
    like = x_mbs[0]
    msgs, saved, total, outs = {}, {}, None, []         # msgs: tensors produced for another stage
    for a, batch in zip(list(actions) + [None], p2p_plan(actions, rank, p)):
        ops = []
        for op, peer, key in batch:
            if op == "send":
                ops.append(dist.P2POp(dist.isend, msgs.pop(key), peer))
            else:
                msgs[key] = torch.empty_like(like)
                ops.append(dist.P2POp(dist.irecv, msgs[key], peer))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()
        if a is None:
            break
        kind, mb, s = a
        if kind == "F":
            inp = x_mbs[mb] if s == 0 else msgs.pop(("F", mb, s - 1)).requires_grad_(True)
            out = stages[s](inp)
            if s == n_stages - 1:
                outs.append(out.detach())
                out = loss_fn(out, y_mbs[mb]) / m
                total = out.detach() if total is None else total + out.detach()
            else:
                msgs[("F", mb, s)] = out.detach()
            saved[(mb, s)] = (inp, out)
        else:
            inp, out = saved.pop((mb, s))               # activations freed after their backward
            out.backward() if s == n_stages - 1 else out.backward(msgs.pop(("B", mb, s + 1)))
            if s > 0:
                msgs[("B", mb, s)] = inp.grad
    return total, (torch.cat(outs) if outs else None)


def saved_activation_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes that autograd keeps for the backward of ``module(x)``: measured, not computed.

    Runs one forward under ``torch.autograd.graph.saved_tensors_hooks`` and adds up the distinct
    storages saved for backward, leaving out the module's parameters (they are stored anyway). A
    tensor saved by two operations (the Tanh output of block k is also the input of Linear k+1) is
    counted once. The input ``x`` counts if an operation saves it (a Linear does).
    """
    params = {q.untyped_storage().data_ptr() for q in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def check_args(layers: int, batch: int, micro: int, chunks: int, world_size: int, schedules: list[str],
               split: list[int] | None = None, layer_ms: list[float] | None = None) -> None:
    """Validate the pipeline script's sizes up front (launch_scripts/pipeline_parallel.py).

    Raises:
        ValueError: naming the argument to change, if --global-batch is not divisible by
            --micro-batches, --layers not by the number of stages (world size, times --chunks for the
            interleaved schedule), or --micro-batches not a multiple of the world size for the
            interleaved schedule; if --split does not give each of the world size's stages at least one
            layer adding up to --layers, or comes with lib_interleaved; if --layer-ms does not give one
            time >= 0 per layer.
    """
    if batch % micro:
        raise ValueError(f"--global-batch {batch} is not divisible by --micro-batches {micro}: "
                         f"use a multiple of {micro}")
    inter = "lib_interleaved" in schedules
    if layer_ms is not None and (len(layer_ms) != layers or min(layer_ms) < 0):
        raise ValueError(f"--layer-ms needs one time >= 0 per layer ({layers} for --layers {layers}), "
                         f"got {len(layer_ms)}: {','.join(map(str, layer_ms))}")
    if inter and (split is not None or layer_ms is not None):
        raise ValueError("--split and --layer-ms set one stage per rank: leave lib_interleaved out of --schedules")
    if split is not None:
        if len(split) != world_size or min(split) < 1 or sum(split) != layers:
            raise ValueError(f"--split {','.join(map(str, split))} must give each of the {world_size} stages "
                             f"(one per rank) at least one layer and add up to --layers {layers}")
        return
    n = world_size * (chunks if inter else 1)
    if layers % n:
        raise ValueError(f"--layers {layers} does not split into {n} equal stages "
                         f"({world_size} ranks{f' x {chunks} chunks' if inter else ''}): use a multiple of {n}")
    if inter and micro % world_size:
        raise ValueError(f"the interleaved schedule needs --micro-batches a multiple of the world size "
                         f"{world_size}, got {micro}: use --micro-batches {world_size * max(1, round(micro / world_size))} "
                         f"(or leave lib_interleaved out of --schedules)")
