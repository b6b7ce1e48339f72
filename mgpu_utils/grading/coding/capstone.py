"""The graded coding exercise of lesson 13, the capstone (notebooks/13_capstone.ipynb): 13.1, a gradient sync
with one planted bug, found from the parity matrix alone.

The student's ``sync_gradients(params, groups)`` runs after backward in a small mixture-of-experts TinyLlama
(:mod:`mgpu_utils.models`, lesson 08's ``MoE``) under every layout of replicas the world size allows: dp, cp
(lesson 08's ring attention, :func:`mgpu_utils.parallel.layouts.context_parallel`), ep (lesson 08's
``ExpertParallelMoE``), and at 4 ranks their 2-D combinations. After each of 2 SGD steps every rank compares
its gradients, parameter by parameter, with one process's on the whole batch (trained on each rank: the same
seed, the same result). The problem it reports is the matrix: per layout, the worst parameter, its difference
and the factor between the gradients; the hints below name the mistake from which parameters and layouts fail.
"""

from __future__ import annotations

import torch

from mgpu_utils.grading.common import CodingExercise, always, note

STEPS, BATCH, SEQ, LR, TOL = 2, 12, 24, 0.2, 1e-5     # 12 rows: divisible by dp x ep at 2, 3 and 4 ranks


def _layouts(world: int) -> list[dict]:
    """The replica layouts at this world size: each of dp, cp, ep alone, and at 4 ranks the three pairs."""
    one = [{"dp": world}, {"cp": world}, {"ep": world}]
    two = [{"dp": 2, "ep": 2}, {"dp": 2, "cp": 2}, {"ep": 2, "cp": 2}] if world == 4 else []
    return [{d: L.get(d, 1) for d in ("dp", "ep", "cp")} for L in one + two]


def layout_name(L: dict) -> str:
    """{"dp": 2, "ep": 2, "cp": 1} -> "dp2-ep2" (the capstone's layout strings)."""
    return "-".join(f"{d}{n}" for d, n in L.items() if n > 1)


def _factor(got, want) -> float:
    """The least-squares factor c of got = c want (2.0: twice the gradient); nan for a zero reference."""
    den = (want.double() ** 2).sum().item()
    return (got.double() * want.double()).sum().item() / den if den else float("nan")


def _reference(cfg, batches, device):
    """One process on the whole batch: the gradients of each step (by name), SGD between them."""
    from mgpu_utils.models import tiny_llama
    from mgpu_utils.parallel.experts import MoE
    from mgpu_utils.parallel.layouts import next_token_loss

    model = tiny_llama(cfg, 0, MoE).to(device)
    opt, grads = torch.optim.SGD(model.parameters(), lr=LR), []
    for xb in batches:
        opt.zero_grad()
        next_token_loss(model(xb[:, :-1]), xb[:, 1:]).backward()
        grads.append({n: q.grad.detach().clone() for n, q in model.named_parameters()})
        opt.step()
    return grads


def _run_layout(fn, L, cfg, batches, ref, ctx) -> dict | None:
    """Train L's replica of this rank with ``fn`` syncing its gradients; returns the worst parameter that differs
    from one process after ``fn`` at the first step where one does ({"param", "diff", "factor", "step",
    "expert"}), or None."""
    from mgpu_utils.dist import device_mesh
    from mgpu_utils.models import tiny_llama
    from mgpu_utils.parallel.experts import MoE
    from mgpu_utils.parallel.layouts import EXPERT, context_parallel, cp_shard, expert_parallel, next_token_loss

    names = tuple(d for d in L if L[d] > 1)
    mesh = device_mesh(ctx.device.type, tuple(L[d] for d in names), mesh_dim_names=names)
    at = {d: mesh.get_local_rank(d) if d in names else 0 for d in L}
    groups = {d: mesh.get_group(d) for d in names}
    model, rename = tiny_llama(cfg, 0, MoE).to(ctx.device), (lambda n: n)
    if L["cp"] > 1:
        context_parallel(model, groups["cp"], SEQ)
    if L["ep"] > 1:
        rename = expert_parallel(model, groups["ep"])
    rows, data_rank = BATCH // (L["dp"] * L["ep"]), at["dp"] * L["ep"] + at["ep"]
    params = list(model.named_parameters())
    opt, worst = torch.optim.SGD([q for _, q in params], lr=LR), None
    for step, xb in enumerate(batches):
        x, y = (cp_shard(t[data_rank * rows:(data_rank + 1) * rows], groups.get("cp")) for t in (xb[:, :-1], xb[:, 1:]))
        opt.zero_grad()
        next_token_loss(model(x), y).backward()
        fn(params, dict(groups))
        for n, q in params:
            want = ref[step][rename(n)]
            got = q.grad if q.grad is not None else torch.zeros_like(want)
            d = (got.double() - want.double()).abs().max().item()
            if not d <= TOL:
                d = float("inf") if d != d else d
                if worst is None or (worst["step"] == step + 1 and d > worst["diff"]):
                    worst = {"param": rename(n), "diff": d, "factor": _factor(got, want), "step": step + 1,
                             "expert": bool(EXPERT.search(n))}
        opt.step()                                      # every rank runs every step: no rank left waiting
    return worst


def check_sync_gradients(fn, ctx, problems):
    """13.1: ``fn(params, groups)`` under each layout of :func:`_layouts` against one process's gradients."""
    from mgpu_utils.models import LlamaConfig
    from mgpu_utils.text_data import byte_corpus, get_batch, split

    cfg = LlamaConfig(layers=2, experts=6 if ctx.world_size == 3 else 4)      # divisible by ep
    train, _ = split(byte_corpus())
    batches = [get_batch(train, s, BATCH, SEQ, 0).to(ctx.device) for s in range(STEPS)]
    ref = _reference(cfg, batches, ctx.device)
    matrix = []
    for L in _layouts(ctx.world_size):
        worst = _run_layout(fn, L, cfg, batches, ref, ctx)
        matrix.append({"layout": layout_name(L), **L, **({"ok": True} if worst is None else {"ok": False, **worst})})
    failed = [m for m in matrix if not m["ok"]]
    if failed:
        return note(problems, {"rank": ctx.rank, "kind": "matrix", "matrix": matrix,
                               "table": "; ".join(_row(m) for m in matrix), **_diagnose(matrix)})
    return {"layouts": [m["layout"] for m in matrix]}


def _row(m: dict) -> str:
    if m["ok"]:
        return f"{m['layout']} equal"
    return f"{m['layout']} {m['param']} off by {m['diff']:.2g} (x{m['factor']:.2f})"


def _diagnose(matrix: list[dict]) -> dict:
    """What the failing layouts and parameters say: ``variant`` and the numbers a hint needs."""
    failed = [m for m in matrix if not m["ok"]]
    with_ep = [m for m in matrix if m["ep"] > 1]
    near = lambda a, b: abs(a - b) < 0.02 * b
    only_ep = all(m["ep"] > 1 for m in failed)
    if only_ep and all(m["expert"] for m in failed) and all(not m["ok"] for m in with_ep):
        if all(near(m["factor"], m["ep"]) for m in failed):
            return {"variant": "experts_not_divided_by_ep", "ep": failed[0]["ep"]}
        if all(near(m["factor"], 1 / m["ep"]) for m in failed):
            return {"variant": "experts_divided_twice", "ep": failed[0]["ep"]}
        return {"variant": "experts_over_ep", "layout": failed[0]["layout"], "param": failed[0]["param"]}
    if only_ep and not any(m["expert"] for m in failed):
        return {"variant": "replicated_not_over_ep", "param": failed[0]["param"], "layout": failed[0]["layout"]}
    if all(near(m["factor"], m["dp"] * m["ep"] * m["cp"]) for m in failed):
        return {"variant": "not_divided"}
    if all(m["expert"] for m in failed) and any(m["ep"] == 1 for m in failed):
        m = next(m for m in failed if m["ep"] == 1)
        return {"variant": "experts_left_out", "param": m["param"], "layout": m["layout"]}
    first = failed[0]
    return {"variant": "other", "layout": first["layout"], "param": first["param"], "factor": first["factor"]}


#: What each problem these checks report tells the student: per kind, ``(when, hint)`` pairs (see
#: :class:`~mgpu_utils.grading.common.CodingExercise`).
HINTS: dict[str, list[tuple]] = {
    "matrix": [
        (lambda p, W: p["variant"] == "experts_over_ep",
         "the matrix at {W} ranks: {table}. Only the layouts with ep fail, and there only the experts' weights (the "
         "router, attention and norms are right). What does an ep rank hold that its ep partners do not, and "
         "whose tokens are in its gradient (lesson 08, expert parallelism)?"),
        (lambda p, W: p["variant"] == "experts_not_divided_by_ep",
         "the matrix at {W} ranks: {table}. Under ep the experts' gradients are ep times one process's: right to "
         "leave them out of the sum over ep (the all-to-all's backward brought every ep rank's tokens), but each "
         "rank's loss is the mean over its own rows, so they still need the division by dp x ep x cp"),
        (lambda p, W: p["variant"] == "experts_divided_twice",
         "the matrix at {W} ranks: {table}. Under ep the experts' gradients are 1/ep of one process's: they hold "
         "every ep rank's tokens already (the all-to-all's backward), so they need no sum over ep and the same "
         "division by dp x ep x cp as every other parameter, not one more by ep"),
        (lambda p, W: p["variant"] == "replicated_not_over_ep",
         "the matrix at {W} ranks: {table}. Under ep ({layout}) {param} differs: the ep ranks hold different rows "
         "and the same router, attention and norms, replicas as under dp: sum every parameter but the experts "
         "over the ep group too"),
        (lambda p, W: p["variant"] == "experts_left_out",
         "the matrix at {W} ranks: {table}. Under {layout} (no ep) the expert {param} differs: there every rank "
         "holds every expert and its own rows or tokens, so an expert's gradient needs the sum over dp and cp "
         "like any other; only the sum over ep is the one it already has"),
        (lambda p, W: p["variant"] == "not_divided",
         "the matrix at {W} ranks: {table}. Every failing gradient is dp x ep x cp times one process's: each "
         "rank's loss is the mean over its own rows and tokens, so divide the sum by the number of replicas"),
        (always, "the matrix at {W} ranks: {table}. The first failing layout, {layout}: {param}'s gradient is "
                 "{factor:.3g} times one process's (1: right); compare what each layout adds with what it reduces")],
}


#: The exercises of this lesson (gathered by :mod:`mgpu_utils.grading.catalog`).
EXERCISES = [
    CodingExercise(
        id="13.1", template="13_sync_gradients.py", entry="sync_gradients", world_sizes=(2, 4),
        check=check_sync_gradients, hints=HINTS,
        what="every parameter's gradient equals one process's after each of 2 steps under dp, cp and ep, alone "
             "and (4 ranks) in pairs",
        on_success=lambda info, world: [f"world size {world}: " + ", ".join(info.get("layouts", []))]),
]
