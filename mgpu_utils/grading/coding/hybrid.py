"""The graded exercises of lesson 06, hybrid parallelism (notebooks/06_hybrid_parallel.ipynb): 06.3, an SGD step
on a data x tensor mesh, f and g from scratch; 06.4 (design), the layout of a training job chosen for ten jobs.

06.4's check (:func:`check_layout`) asks the student's ``choose_layout`` about :data:`LAYOUT_JOBS`, with the
planner's ``plan`` and ``evaluate`` switched off while it runs, then scores each answer with the planner against
the best layout it finds (:func:`best_layout`): it must fit in memory and be at most :data:`LAYOUT_SLACK` times
slower; the hint names the job, where the student's step time goes and where the best one's does.

The check runs two steps at every dp x tp mesh of the world (:func:`two_d_layouts`) against the same steps in
one process, counts what the all-reduces over the tensor-parallel group send (:func:`tp_traffic`), and names a
wrong result from the known mistakes' results (:data:`TWO_D_FORWARDS` x :data:`TWO_D_SYNCS`). The hints of the
problems it reports and the exercise's record are here too.
"""

from __future__ import annotations

import datetime
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mgpu_utils.grading.common import CodingExercise, always, diff, note, switched_off
from mgpu_utils.measure.comm_calls import patched_collectives


#: Exercise 06.3's model: W0 [D, D] replicated, W1 [N, D] column parallel, W2 [O, N] row parallel, b2 [O]
#: replicated; a global batch of B rows. N splits over tp = 1, 2, 3, 4 and 6, B over dp up to 8. N D and O N exceed
#: what g and f send (B/dp x O and B/dp x D elements), so whole weights cannot pass for activations (tp_traffic).
TWO_D_SIZES = {"D": 6, "N": 48, "O": 4, "B": 24}
#: Known wrong forwards and backwards of 06.3, named by what they do (the first that matches wins).
TWO_D_FORWARDS = ("right", "no_f", "g_backward_sum", "bias_every_rank", "no_g", "f_forward_sum")
#: Known wrong data-parallel averages of 06.3: per rank's gradient of its shard, before the update.
TWO_D_SYNCS = ("right", "none", "sum", "div_world", "world_dp", "world_mean")


def two_d_layouts(world: int) -> list[tuple[int, int]]:
    """(dp, tp) meshes of ``world`` ranks that 06.3 grades: dp x 1 first, then tp growing; N % tp == 0 and
    B % dp == 0 (world 4: (4, 1), (2, 2), (1, 4))."""
    return [(world // tp, tp) for tp in range(1, world + 1) if world % tp == 0
            and TWO_D_SIZES["N"] % tp == 0 and TWO_D_SIZES["B"] % (world // tp) == 0]


def _two_d_shard(P: dict, t: int, tp: int) -> dict:
    """Tensor-parallel rank t's shard of the whole parameters ``P`` (replicated ones whole)."""
    n = P["w1"].shape[0] // tp
    rows = slice(t * n, (t + 1) * n)
    return {"w0": P["w0"], "w1": P["w1"][rows], "w2": P["w2"][:, rows], "b2": P["b2"]}


def two_d_local(P: dict, x, target, t: int, tp: int, variant: str = "right"):
    """(loss, gradients of tp rank t's shard) before any data-parallel average, on rows ``x``, when every rank
    holds ``P``'s values; ``variant`` (:data:`TWO_D_FORWARDS`) is the forward/backward each rank runs."""
    mine = {k: v.detach().clone().requires_grad_() for k, v in _two_d_shard(P, t, tp).items()}
    z = F.relu(x @ mine["w0"].T)
    parts = []
    for u in range(tp):
        w = mine if u == t else {k: v.detach() for k, v in _two_d_shard(P, u, tp).items()}
        no_sum = variant in ("no_f", "f_forward_sum")     # f's backward does not sum: W0 learns through its own slice
        zu = z if u == t or not no_sum else z.detach()
        if variant == "f_forward_sum":
            zu = zu + (tp - 1) * z.detach()                # f summed in the forward: tp z, its backward the identity
        parts.append(F.relu(zu @ w["w1"].T) @ w["w2"].T)
    S = parts[t] if variant == "no_g" else sum(parts)
    if variant == "g_backward_sum":                          # g's backward sums: every gradient before it x tp
        S = tp * S - (tp - 1) * S.detach()
    b2 = mine["b2"] + (tp - 1) * mine["b2"].detach() if variant == "bias_every_rank" else mine["b2"]
    loss = F.mse_loss(S + b2, target)
    grads = torch.autograd.grad(loss, list(mine.values()))
    return loss.item(), dict(zip(mine, grads))


def two_d_synced(local: dict, dp: int, tp: int, i: int, t: int, variant: str) -> dict:
    """Rank (i, t)'s gradients after the data-parallel step ``variant`` (:data:`TWO_D_SYNCS`), from every
    rank's own ``local[(i, t)]``."""
    world = dp * tp
    group = [local[(j, t)] for j in range(dp)]
    everyone = [local[(j, u)] for j in range(dp) for u in range(tp)]
    total = lambda gs: {k: sum(g[k] for g in gs) for k in gs[0]}
    if variant == "none":
        return local[(i, t)]
    scale, gs = {"right": (dp, group), "sum": (1, group), "div_world": (world, group),
                 "world_dp": (dp, everyone), "world_mean": (world, everyone)}[variant]
    return {k: v / scale for k, v in total(gs).items()}


def check_two_d(fn, ctx, problems, steps=2, lr=0.1):
    """06.3: ``fn(params, x, target, tp_group, dp_group, lr)`` for two SGD steps at every layout of
    :func:`two_d_layouts`, against the same steps in one process; a wrong result is named from the known
    mistakes' results after step 1 (:data:`TWO_D_FORWARDS` x :data:`TWO_D_SYNCS`), or gradients carried into
    step 2. Only all-reduce is allowed: a gather would hold more than this rank's shard."""
    world, rank = ctx.world_size, ctx.rank
    timeout = datetime.timedelta(seconds=ctx.timeout_s)   # the subgroups time out as the default group does
    D, N, O, B = (TWO_D_SIZES[k] for k in "DNOB")
    g = torch.Generator().manual_seed(6)
    P0 = {"w0": torch.randn(D, D, generator=g) / D ** 0.5, "w1": torch.randn(N, D, generator=g) / D ** 0.5,
          "w2": torch.randn(O, N, generator=g) / N ** 0.5, "b2": torch.randn(O, generator=g) * 0.5}
    data = [(torch.randn(B, D, generator=g), torch.randn(B, O, generator=g)) for _ in range(steps)]
    for dp, tp in two_d_layouts(world):
        i, t = divmod(rank, tp)
        tp_group, _ = dist.new_subgroups_by_enumeration(
            [[j * tp + u for u in range(tp)] for j in range(dp)], timeout=timeout)
        dp_group, _ = dist.new_subgroups_by_enumeration(
            [[j * tp + u for j in range(dp)] for u in range(tp)], timeout=timeout)
        rows = lambda j: slice(j * B // dp, (j + 1) * B // dp)
        params = {k: v.clone().requires_grad_() for k, v in _two_d_shard(P0, t, tp).items()}
        P, prev, calls = {k: v.clone() for k, v in P0.items()}, None, []
        base = {"rank": rank, "kind": "two_d", "layout": f"{dp}x{tp}", "dp": dp, "tp": tp}
        mine = {i * tp + u for u in range(tp)}                          # this rank's tp group
        for s in range(steps):
            x, y = data[s][0][rows(i)], data[s][1][rows(i)]
            traffic = []                                                # elements of each all-reduce across tp ranks
            with tp_traffic(calls, traffic, mine, fn):
                got_loss = fn(params, x.clone(), y.clone(), tp_group, dp_group, lr)
            want_traffic = sorted([len(x) * O, len(x) * D]) if tp > 1 else []
            local = {(j, u): two_d_local(P, data[s][0][rows(j)], data[s][1][rows(j)], u, tp)
                     for j in range(dp) for u in range(tp)}
            grads = two_d_synced({k: v[1] for k, v in local.items()}, dp, tp, i, t, "right")
            want = {k: v - lr * grads[k] for k, v in _two_d_shard(P, t, tp).items()}
            bad = next((k for k in want if params[k].shape != want[k].shape
                        or diff(params[k].detach(), want[k]) > 1e-5), None)
            if set(calls) - {"all_reduce"}:
                note(problems, {**base, "what": "collective", "calls": sorted(set(calls) - {"all_reduce"})})
            elif not isinstance(got_loss, (float, int)):
                note(problems, {**base, "what": "loss_type", "got": type(got_loss).__name__})
            elif abs(got_loss - local[(i, t)][0]) > 1e-5:
                named = next((v for v in TWO_D_FORWARDS[1:] if abs(got_loss - two_d_local(
                    P, x, y, t, tp, v)[0]) < 1e-5), None)
                note(problems, {**base, "what": "loss", "step": s + 1, "forward": named, "got": got_loss,
                                "want": local[(i, t)][0]})
            elif bad and s == 0:
                same = params[bad].shape == want[bad].shape
                note(problems, {**base, "what": "step", "param": bad, "max_diff": diff(
                    params[bad].detach(), want[bad]) if same else float("nan"),
                                **_which_two_d(params, P, data[0], dp, tp, i, t, lr, rows)})
            elif bad:
                carried = {k: v - lr * (grads[k] + prev[k]) for k, v in _two_d_shard(P, t, tp).items()}
                was = all(params[k].shape == c.shape and diff(params[k].detach(), c) < 1e-5 for k, c in carried.items())
                note(problems, {**base, "what": "carried" if was else "later", "param": bad, "step": s + 1,
                                "max_diff": diff(params[bad].detach(), want[bad]) if params[bad].shape ==
                                want[bad].shape else float("nan")})
            elif sorted(traffic) != want_traffic:
                note(problems, {**base, "what": "tp_traffic", "step": s + 1, "calls": len(traffic),
                                "got": sum(traffic), "want_g": len(x) * O, "want_f": len(x) * D, "w0": D * D,
                                "named": _which_traffic(traffic, want_traffic, D * D, O)})
            P = {k: v - lr * _full_grad(local, dp, tp, k) for k, v in P.items()}
            prev = grads
        for group in {tp_group, dp_group}:                              # no groups left over for the next layout
            dist.destroy_process_group(group)


def tp_traffic(calls: list, traffic: list, tp_ranks: set, fn=None):
    """06.3's counter: every collective's name goes to ``calls`` (:func:`counted_collectives`), and the float32
    elements' worth (bytes over 4) of every all-reduce over a group holding two or more of ``tp_ranks`` (this
    rank's tensor-parallel group; the default group counts as every rank) to ``traffic``. A right step sends g's and f's
    activations only; whole weights assembled by all-reducing zero-padded shards show up here."""
    def counting(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            if name == "all_reduce":
                group = kwargs.get("group", args[2] if len(args) > 2 else None)
                ranks = set(range(dist.get_world_size())) if group in (None, dist.group.WORLD) \
                    else set(dist.get_process_group_ranks(group))
                if len(ranks & tp_ranks) > 1:                  # in float32 elements: its bytes over 4 (a
                    t = args[0] if args else kwargs["tensor"]  # thirteenth red team's 06.3 x01 packed four
                    traffic.append(t.numel() * t.element_size() // 4)   # float32 to a complex128)
            return original(*args, **kwargs)
        return call
    return patched_collectives(counting, fn)


def _which_traffic(traffic: list, want: list, w0: int, b2: int) -> str | None:
    """06.3, a right result whose all-reduces over tp_group carried other sizes than g's and f's activations
    (``want``): "w0_for_f", W0's gradient (``w0`` elements) all-reduced in place of f; "replicated_world", W0's
    and b2's gradients (``b2`` elements) averaged over every rank besides f and g; None, something else."""
    missing, extra = list(want), []
    for k in traffic:
        if k in missing:
            missing.remove(k)
        else:
            extra.append(k)
    if len(missing) == 1 and missing[0] == max(want) and w0 in extra and set(extra) <= {w0, b2}:
        return "w0_for_f"                                  # f's [rows, D] is the larger of the two (D > O)
    if not missing and extra and set(extra) <= {w0, b2}:
        return "replicated_world"
    return None


def _full_grad(local: dict, dp: int, tp: int, name: str) -> torch.Tensor:
    """The whole model's gradient of ``name`` (mean over the dp groups), assembled from the ranks' shards."""
    mean = lambda u: sum(local[(j, u)][1][name] for j in range(dp)) / dp
    if name == "w1":
        return torch.cat([mean(u) for u in range(tp)], 0)
    if name == "w2":
        return torch.cat([mean(u) for u in range(tp)], 1)
    return mean(0)


def _which_two_d(params, P, batch, dp, tp, i, t, lr, rows) -> dict:
    """The first known mistake (forward, data-parallel step) whose step 1 gives this rank's ``params``."""
    for fwd in TWO_D_FORWARDS:
        local = {(j, u): two_d_local(P, batch[0][rows(j)], batch[1][rows(j)], u, tp, fwd)[1]
                 for j in range(dp) for u in range(tp)}
        for sync in TWO_D_SYNCS:
            grads = two_d_synced(local, dp, tp, i, t, sync)
            if all(params[k].shape == v.shape and diff(params[k].detach(), v - lr * grads[k]) < 1e-5
                   for k, v in _two_d_shard(P, t, tp).items()):
                return {"forward": fwd, "sync": sync}
    return {"forward": None, "sync": None}


#: 06.4's jobs: (name, model, cluster, global batch). The first six are named in the template; the last four are
#: of the same kind, not named (an answer written down per job does not pass them).
def _layout_jobs():
    from mgpu_utils.costs.planner import GPT3_175B, Cluster, ModelSpec

    nv4, ndr = "NVLink 4 (H100, 18 links)", "InfiniBand NDR (400 Gb/s)"
    return (
        ("GPT-3 175B on 1024 A100, batch 1536", GPT3_175B, Cluster(1024, "A100"), 1536),
        ("7B on 16 A100 40GB, batch 256", ModelSpec("7B", 32, 4096, 32, 2048, 50257), Cluster(16, "A100 40GB"), 256),
        ("70B on 256 H100, batch 1024", ModelSpec("70B", 80, 8192, 64, 4096, 32000),
         Cluster(256, "H100", intra_link=nv4, inter_link=ndr), 1024),
        ("1.3B on 32 A100, batch 512", ModelSpec("1.3B", 24, 2048, 16, 2048, 50257), Cluster(32, "A100"), 512),
        ("13B on 64 A100, batch 64", ModelSpec("13B", 40, 5120, 40, 2048, 50257), Cluster(64, "A100"), 64),
        ("20B on 32 H100 PCIe (PCIe 5.0 in a node), batch 256", ModelSpec("20B", 44, 6144, 48, 2048, 50257),
         Cluster(32, "H100 PCIe", intra_link="PCIe 5.0 x16", inter_link=ndr), 256),
        ("an unnamed job: 30B on 128 H100, batch 128", ModelSpec("30B", 48, 7168, 56, 2048, 50257),
         Cluster(128, "H100", intra_link=nv4, inter_link=ndr), 128),
        ("an unnamed job: 13B on one node of 8 A100, batch 256", ModelSpec("13B", 40, 5120, 40, 2048, 50257),
         Cluster(8, "A100"), 256),
        ("an unnamed job: 6.7B on 32 L4 (PCIe 4.0 in a node, 100 GbE between), batch 256",
         ModelSpec("6.7B", 32, 4096, 32, 2048, 50257),
         Cluster(32, "L4", intra_link="PCIe 4.0 x16", inter_link="Ethernet 100 GbE"), 256),
        ("an unnamed job: 6.7B on 128 H200, batch 2048", ModelSpec("6.7B", 32, 4096, 32, 2048, 50257),
         Cluster(128, "H200", intra_link=nv4, inter_link=ndr), 2048),
    )


LAYOUT_JOBS = _layout_jobs()
#: 06.4 accepts a layout whose estimated step time is at most this many times the best layout's.
LAYOUT_SLACK = 1.25
#: The options :func:`best_layout` searches besides dp, tp and pp.
LAYOUT_OPTIONS = {"micro_batch": (1, 2, 4), "recompute": ("none", "selective", "full"), "zero_stage": (0, 1, 2, 3)}


def best_layout(model, cluster, global_batch):
    """The planner's fastest feasible layout over every dp x tp x pp = n_gpus and :data:`LAYOUT_OPTIONS`
    (a ``planner.Layout``, with ``options`` added: its micro-batch, recomputation and ZeRO stage)."""
    import itertools

    from mgpu_utils.costs.planner import evaluate

    n, best = cluster.n_gpus, None
    for tp, pp in ((t, p) for t in range(1, n + 1) if n % t == 0 for p in range(1, n // t + 1) if (n // t) % p == 0):
        for mb, rc, z in itertools.product(*LAYOUT_OPTIONS.values()):
            lay = evaluate(model, cluster, n // (tp * pp), tp, pp, global_batch=global_batch, micro_batch=mb,
                           recompute=rc, zero_stage=z)
            if lay.feasible and (best is None or lay.step_s < best.step_s):
                best, best.options = lay, {"micro_batch": mb, "recompute": rc, "zero_stage": z}
    return best


def _where_time_goes(lay) -> str:
    """A layout's estimated step, by part: "compute 1.6 s, bubble 0.1 s, dp all-reduce 2.0 s (InfiniBand...)"."""
    parts = [f"compute {lay.compute_s:.2f} s", f"bubble {lay.compute_s * lay.bubble:.2f} s"]
    parts += [f"{k} traffic {v:.2f} s ({lay.links[k].split(' (')[0]})" for k, v in lay.comm_s.items() if v > 0]
    return ", ".join(parts)


def _planner_off(fn):
    """planner.plan and planner.evaluate raise while the student's function runs (however it imported them)."""
    from mgpu_utils.costs import planner

    return switched_off(fn, (planner.plan, planner.evaluate))


def check_layout(fn, ctx, problems):
    """06.4: ``fn(model, cluster, global_batch)`` for every job of :data:`LAYOUT_JOBS` (planner off); each answer
    a dict with dp, tp, pp (micro_batch, recompute, zero_stage optional) that the planner finds feasible and at
    most :data:`LAYOUT_SLACK` times slower than :func:`best_layout`. Returns the worst ratio."""
    from mgpu_utils.costs.planner import evaluate

    worst = 0.0
    for name, model, cluster, batch in LAYOUT_JOBS:
        with _planner_off(fn) as planner_used:
            try:
                got = fn(model, cluster, batch)
            except planner_used as e:
                return note(problems, {"rank": ctx.rank, "kind": "layout", "what": "planner", "name": str(e)})
        keys = {"dp", "tp", "pp"}
        if not isinstance(got, dict) or not keys <= set(got) or set(got) - keys - set(LAYOUT_OPTIONS) or not all(
                isinstance(got[k], numbers.Integral) and got[k] > 0 for k in keys):
            return note(problems, {"rank": ctx.rank, "kind": "layout", "what": "form", "job": name,
                                   "got": repr(got)[:120]})
        got = {k: int(v) if isinstance(v, numbers.Integral) else v for k, v in got.items()}   # numpy ints too
        options = {"micro_batch": 1, "recompute": "none", "zero_stage": 0, **{k: got[k] for k in LAYOUT_OPTIONS
                                                                            if k in got}}
        layout = f"dp={got['dp']} tp={got['tp']} pp={got['pp']}" + "".join(
            f" {k}={v!r}" for k, v in options.items() if k in got)
        try:
            lay = evaluate(model, cluster, got["dp"], got["tp"], got["pp"], global_batch=batch, **options)
        except ValueError as e:
            return note(problems, {"rank": ctx.rank, "kind": "layout", "what": "invalid", "job": name,
                                   "layout": layout, "detail": str(e)})
        if not lay.feasible:
            return note(problems, {"rank": ctx.rank, "kind": "layout", "what": "infeasible", "job": name,
                                   "layout": layout, "detail": "; ".join(lay.problems), "gb": cluster.memory_bytes / 1e9,
                                   "memory": "memory" in " ".join(lay.problems) or "GB per GPU" in lay.problems[0],
                                   "node": "node" in lay.problems[0]})
        best = best_layout(model, cluster, batch)
        ratio = lay.step_s / best.step_s
        worst = max(worst, ratio)
        if ratio > LAYOUT_SLACK:
            return note(problems, {"rank": ctx.rank, "kind": "layout", "what": "slow", "job": name, "layout": layout,
                                   "step": lay.step_s, "ratio": ratio, "best_step": best.step_s,
                                   "mine": _where_time_goes(lay), "theirs": _where_time_goes(best),
                                   "slack": LAYOUT_SLACK})
    return {"jobs": len(LAYOUT_JOBS), "worst": worst}


def _layout_lines(info: dict, world: int) -> list[str]:
    """06.4's success lines: the jobs and the slowest answer against the best layout."""
    return [f"{info['jobs']} jobs; your slowest layout is {info['worst']:.2f}x the planner's best (at most "
            f"{LAYOUT_SLACK}x passes)"] if info else []


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "two_d": [
        (lambda p, W: p["what"] == "collective",
         "rank {rank} (mesh {layout}, dp x tp): called {calls}; the only communication here is all-reduce: g's in "
         "the forward, f's in the backward and the average over dp_group. A gather would put more than this rank's "
         "shard in its memory"),
        (lambda p, W: p["what"] == "loss_type",
         "rank {rank}: train_step returned a {got}; return the loss on this rank's rows as a Python float "
         "(loss.item())"),
        (lambda p, W: p["what"] == "tp_traffic" and p.get("named") == "w0_for_f",
         "rank {rank} (mesh {layout}, dp x tp): the result is right, but there is no f: W0's gradient was "
         "all-reduced over tp_group after the backward ({w0} elements). That gives the same W0 here, where W0 is "
         "the only layer before f, but f sums z's gradient, [rows, D] ({want_f} elements), in the backward, which "
         "every layer before it needs: write f's backward (one all-reduce over tp_group)"),
        (lambda p, W: p["what"] == "tp_traffic" and p.get("named") == "replicated_world",
         "rank {rank} (mesh {layout}, dp x tp): the result is right, but W0's or b2's gradient was averaged over "
         "every rank, tp_group included: after f they are equal on the tp ranks, so the mean over dp_group is "
         "already the mean, and averaging over the world sends them tp = {tp} times over. Average every "
         "gradient over dp_group only"),
        (lambda p, W: p["what"] == "tp_traffic",
         "rank {rank} (mesh {layout}, dp x tp): the result is right, but at step {step} the all-reduces over "
         "tp_group sent {got} elements in {calls} call(s); tensor parallelism sends activations only, g's "
         "[rows, O] ({want_g} elements) in the forward and f's [rows, D] ({want_f}) in the backward. A rank that "
         "assembles the whole W1 or W2 is not tensor parallel: it holds, and computes with, every shard. (W0's and "
         "b2's gradients are equal on the tp ranks after f: average them over dp_group only)"),
        (lambda p, W: p["what"] == "loss" and p["forward"] == "no_g",
         "rank {rank} (mesh {layout}, dp x tp): the loss is that of this rank's partial output alone: the "
         "row-parallel layer gives partial sums, and g adds them over tp_group (one all-reduce in the forward)"),
        (lambda p, W: p["what"] == "loss" and p["forward"] == "bias_every_rank",
         "rank {rank} (mesh {layout}, dp x tp): the loss is that of y with b2 added {tp} times: every tp rank added "
         "the bias before g's all-reduce. Add it after g, once"),
        (lambda p, W: p["what"] == "loss" and p["forward"] == "f_forward_sum",
         "rank {rank} (mesh {layout}, dp x tp): the loss is that of z summed over tp_group, tp = {tp} times too "
         "large: f all-reduced in the forward. f is the identity in the forward and sums the gradient in the "
         "backward; g is the one that sums in the forward"),
        (lambda p, W: p["what"] == "loss",
         "rank {rank} (mesh {layout}, dp x tp): at step {step} the loss {got:.6f} differs from one process's "
         "{want:.6f} on this rank's rows: the forward is relu(x W0^T), f, relu(. W1^T), . W2^T, g, + b2"),
        (lambda p, W: p["what"] == "step" and p["forward"] == "no_f",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 W0's gradient is only the part that flows through "
         "this rank's hidden units: every tp rank's slice of W1 used the same z, so f's backward sums z's gradient "
         "over tp_group (one all-reduce)"),
        (lambda p, W: p["what"] == "step" and p["forward"] == "g_backward_sum",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 the gradients of W0, W1 and W2 are tp = {tp} times "
         "too large: g's backward is the identity (y is the sum of the partials, so each partial's gradient is "
         "y's); an all-reduce there, as torch.distributed.nn.functional.all_reduce's backward does, adds {tp} "
         "equal copies"),
        (lambda p, W: p["what"] == "step" and p["sync"] == "none",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 the gradients are those of this rank's rows only: "
         "average them over dp_group (all-reduce, then divide by its size, {dp})"),
        (lambda p, W: p["what"] == "step" and p["sync"] == "sum",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 the gradients are the sum over dp_group, dp = {dp} "
         "times the mean: divide by dp_group's size"),
        (lambda p, W: p["what"] == "step" and p["sync"] == "div_world",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 the gradients are the sum over dp_group divided by "
         "the world size {W}; the mean is over dp_group, {dp} rank(s) (dist.get_world_size(dp_group))"),
        (lambda p, W: p["what"] == "step" and p["sync"] in ("world_dp", "world_mean"),
         "rank {rank} (mesh {layout}, dp x tp): after step 1 the gradients were all-reduced over every rank: "
         "that adds the other tp ranks' shards (other rows of W1, other columns of W2) to this one. Average over "
         "dp_group only"),
        (lambda p, W: p["what"] == "step",
         "rank {rank} (mesh {layout}, dp x tp): after step 1 {param} differs from one process's by "
         "{max_diff:.3g}"),
        (lambda p, W: p["what"] == "carried",
         "rank {rank} (mesh {layout}, dp x tp): step 1 was right; at step {step} step 1's gradients were still "
         "there (backward adds to p.grad): set p.grad = None after the update"),
        (always, "rank {rank} (mesh {layout}, dp x tp): step 1 was right, but at step {step} {param} differs from one "
                 "process's by {max_diff:.3g}: does something carry over from one step to the next?")],
    "layout": [
        (lambda p, W: p["what"] == "planner",
         "06.4 asks you to choose: planner.{name} is switched off while choose_layout runs (it would choose for you; "
         "the grader scores your answer with it afterwards). Estimate each degree's cost yourself; "
         "mgpu_utils.costs.memory_model.memory_per_gpu may be used"),
        (lambda p, W: p["what"] == "form",
         "for {job} choose_layout returned {got}: return a dict with positive ints dp, tp and pp (dp * tp * pp = the "
         "GPUs), and if you like micro_batch, recompute and zero_stage, nothing else: {{\"dp\": 8, \"tp\": 2, "
         "\"pp\": 1}}"),
        (lambda p, W: p["what"] == "invalid",
         "for {job} the layout {layout} cannot be run: {detail}"),
        (lambda p, W: p["what"] == "infeasible" and p["node"],
         "for {job} the layout {layout} is not feasible: {detail}. Tensor parallelism all-reduces activations "
         "four times per layer: keep tp inside one node (a divisor of its GPUs) and split further with pp"),
        (lambda p, W: p["what"] == "infeasible" and p["memory"],
         "for {job} the layout {layout} does not fit: {detail}. Shard the model more (tp inside a node, then pp "
         "across nodes), or shard the optimizer's state (zero_stage) or recompute activations"),
        (lambda p, W: p["what"] == "infeasible",
         "for {job} the layout {layout} is not feasible: {detail}"),
        (always, "for {job} the layout {layout} takes {step:.2f} s per step by the planner, {ratio:.2f}x the best "
                 "layout's {best_step:.2f} s; at most {slack}x passes. Where your step goes: {mine}. The best "
                 "layout's: {theirs}")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="06.3", template="06_two_d_step.py", entry="train_step", world_sizes=(2, 4),
        check=check_two_d, hints=HINTS,
        what="two SGD steps equal one process's at every dp x tp mesh of 2 and 4 ranks, with all-reduce only "
             "(g in the forward, f in the backward, the mean over dp_group)"),
    CodingExercise(
        id="06.4", template="06_choose_layout.py", entry="choose_layout", world_sizes=(1,),
        check=check_layout, hints=HINTS, on_success=_layout_lines,
        what=f"a feasible layout for each of the {len(LAYOUT_JOBS)} jobs, at most {LAYOUT_SLACK}x slower than the "
             "planner's best, chosen without the planner"),
]
