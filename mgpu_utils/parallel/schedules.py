"""Pipeline schedules as data: who runs which forward/backward when (notebooks/05_model_parallel.ipynb).

Pure Python (no torch). A schedule is, for every rank, an ordered list of actions
``(kind, micro_batch, stage)`` with ``kind`` "F" (forward) or "B" (backward) and ``stage`` the
global stage index (``rank + p * chunk``: with interleaving a rank holds ``v`` chunks, as in
``torch.distributed.pipelining``). The hand-written executor in ``launch_scripts/pipeline_parallel.py``
runs exactly these lists; :func:`simulate` turns them into a predicted timeline, which the notebook
draws next to the timeline measured on real ranks.

Conventions: p = pipeline stages (ranks), m = micro-batches, v = chunks per rank (interleaved), the
forward of one micro-batch through one whole stage takes ``t_f``, its backward ``t_b`` (default 2 t_f:
backward computes gradients for both the inputs and the weights). Communication time is left out.
Bubble fraction = idle share of the step, averaged over ranks; for GPipe and 1F1B it is
``(p-1)/(m+p-1)``, for interleaved 1F1B ``(p-1)/(v*m+p-1)`` (Narayanan et al., SC21).
"""

from __future__ import annotations

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")


def _check(p: int, m: int, v: int = 1) -> None:
    for k, val in (("p", p), ("m", m), ("v", v)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{k} must be a positive integer, got {val!r}")


def gpipe_actions(p: int, m: int) -> list[list[tuple]]:
    """GPipe: every rank runs all m forwards, then all m backwards (micro-batch order 0..m-1,
    as ``ScheduleGPipe`` does). Returns one action list per rank. With m = 1 this is the naive
    layer split: one batch walks through the stages and back."""
    _check(p, m)
    return [[("F", i, r) for i in range(m)] + [("B", i, r) for i in range(m)] for r in range(p)]


def naive_actions(p: int, m: int = 1) -> list[list[tuple]]:
    """No micro-batching: the whole batch is one micro-batch (``m`` is ignored)."""
    return gpipe_actions(p, 1)


def one_f_one_b_actions(p: int, m: int) -> list[list[tuple]]:
    """1F1B (PipeDream-flush): rank r runs ``w = min(p-r-1, m)`` warm-up forwards, then alternates one
    forward and one backward, then drains the remaining backwards. The same bubble as GPipe, but
    rank r holds at most ``min(p-r, m)`` micro-batches' activations instead of m.

    Built from each action's slot in the rank's list (0-based): forward i at ``max(i, 2i - w)`` (one slot
    each while warming up, then every other slot), backward j at ``min(2j + w + 1, m + j)`` (the slot after
    each steady forward, then one slot each while draining). Exercise 05.4 (lesson 05) builds the same
    lists its own way; the tests check that the two agree.
    """
    _check(p, m)

    def rank_actions(r):
        w = min(p - r - 1, m)
        slot = {("F", i, r): max(i, 2 * i - w) for i in range(m)}
        slot.update({("B", j, r): min(2 * j + w + 1, m + j) for j in range(m)})
        return sorted(slot, key=slot.__getitem__)

    return [rank_actions(r) for r in range(p)]


def interleaved_actions(p: int, m: int, v: int = 2) -> list[list[tuple]]:
    """Interleaved 1F1B (Megatron-LM): rank r holds the v chunks ``r, r+p, ..., r+(v-1)p``.

    Forwards go in rounds of p micro-batches through chunk 0, then the same p through chunk 1, and
    so on; backwards in the same pattern over the chunks in reverse. Warm-up on rank r:
    ``(p-r-1)*2 + (v-1)*p`` forwards (capped at m*v). Needs ``m % p == 0``; v = 1 gives 1F1B.

    Raises:
        ValueError: ``m`` not a multiple of ``p`` (with v > 1).
    """
    _check(p, m, v)
    if v == 1:
        return one_f_one_b_actions(p, m)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m divisible by p, got m={m}, p={p}")

    def unit(k, backward):
        c = (k // p) % v
        return (k // (p * v)) * p + k % p, (v - 1 - c if backward else c)

    out = []
    for r in range(p):
        total = m * v
        warm = min((p - r - 1) * 2 + (v - 1) * p, total)
        acts = []
        for k in range(warm):
            mb, c = unit(k, False)
            acts.append(("F", mb, r + p * c))
        for k in range(total - warm):
            mb, c = unit(warm + k, False)
            acts.append(("F", mb, r + p * c))
            mb, c = unit(k, True)
            acts.append(("B", mb, r + p * c))
        for k in range(total - warm, total):
            mb, c = unit(k, True)
            acts.append(("B", mb, r + p * c))
        out.append(acts)
    return out


def schedule_actions(name: str, p: int, m: int, v: int = 2) -> list[list[tuple]]:
    """Action lists per rank for ``name`` in :data:`SCHEDULES` (``v`` is used by "interleaved")."""
    if name == "naive":
        return naive_actions(p, m)
    if name == "gpipe":
        return gpipe_actions(p, m)
    if name == "1f1b":
        return one_f_one_b_actions(p, m)
    if name == "interleaved":
        return interleaved_actions(p, m, v)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")


def simulate(actions: list[list[tuple]], t_f: float = 1.0, t_b: float = 2.0,
             durations: dict | None = None) -> list[list[dict]]:
    """Predicted timeline: each rank runs its actions in order, each as soon as its input is there.

    F(i, s) needs F(i, s-1) (the activation from the previous stage); B(i, s) needs B(i, s+1)
    (the gradient from the next stage), or F(i, s) on the last stage. A chunk of a rank with v
    chunks takes ``t_f / v`` and ``t_b / v``, unless ``durations`` gives ``{(kind, mb, stage):
    time}`` per action (e.g. measured ones, see :func:`measured_durations`). Messages cost nothing.

    Returns:
        Per rank, a list of ``{"kind", "mb", "stage", "start", "end"}`` (time units of t_f).

    Raises:
        ValueError: the action lists deadlock (an action waits for one that can never run).
    """
    p = len(actions)
    n_stages = 1 + max(a[2] for acts in actions for a in acts)
    v = max(1, n_stages // p)
    done: dict[tuple, float] = {}
    pos, free = [0] * p, [0.0] * p
    out: list[list[dict]] = [[] for _ in range(p)]
    remaining = sum(map(len, actions))
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(actions[r]):
                kind, mb, s = actions[r][pos[r]]
                if kind == "F":
                    dep = ("F", mb, s - 1) if s > 0 else None
                else:
                    dep = ("B", mb, s + 1) if s < n_stages - 1 else ("F", mb, s)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                end = start + (durations[(kind, mb, s)] if durations is not None
                               else (t_f if kind == "F" else t_b) / v)
                done[(kind, mb, s)] = free[r] = end
                out[r].append({"kind": kind, "mb": mb, "stage": s, "start": start, "end": end})
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: actions[r][pos[r]] for r in range(p) if pos[r] < len(actions[r])}
            raise ValueError(f"the schedule deadlocks: next actions per rank {stuck}")
    return out


def measured_durations(timeline: list[list[dict]]) -> dict:
    """``{(kind, mb, stage): end - start}`` of every action of a (measured) timeline."""
    return {(a["kind"], a["mb"], a["stage"]): a["end"] - a["start"] for acts in timeline for a in acts}


def stalled_actions(timeline: list[list[dict]], over_s: float, per_stage: bool = False) -> list[dict]:
    """The actions of a measured timeline that ran more than ``over_s`` seconds longer than the median
    action of their kind (forward or backward) in the same timeline, longest first; with ``per_stage``,
    than the median of their kind on their stage (stages of unequal cost: load balancing).

    The bubble formula assumes equal stage times. An action the operating system stalled (a page
    fault, a burst of another process, a few milliseconds that a machine-wide average load cannot
    show) breaks that on one run: a stalled forward on rank 0 in 1F1B's steady state makes every
    other rank's share of idle time smaller, and the bubble falls below the formula. Lesson 05 checks
    this before it compares bubbles with the formula.

    Args:
        timeline: per rank, ``{"kind", "mb", "stage", "start", "end"}`` (seconds).
        over_s: how much longer than the median of its kind an action may run, in seconds, > 0.
        per_stage: take the median per stage and kind instead of per kind.

    Returns:
        ``{"rank", "kind", "mb", "stage", "s", "median_s", "per_stage"}`` per stalled action (``s``:
        its duration).

    Raises:
        ValueError: ``over_s`` is not positive.
    """
    if not over_s > 0:
        raise ValueError(f"over_s is how much longer than the median an action may run, in seconds, "
                         f"> 0 (e.g. 0.02); got {over_s!r}")
    key = (lambda a: (a["kind"], a["stage"])) if per_stage else (lambda a: a["kind"])
    groups: dict = {}
    for acts in timeline:
        for a in acts:
            groups.setdefault(key(a), []).append(a["end"] - a["start"])
    medians = {k: (sorted(d)[(len(d) - 1) // 2] + sorted(d)[len(d) // 2]) / 2 for k, d in groups.items()}
    out = [{"rank": r, "kind": a["kind"], "mb": a["mb"], "stage": a["stage"], "s": a["end"] - a["start"],
            "median_s": medians[key(a)], "per_stage": per_stage}
           for r, acts in enumerate(timeline) for a in acts
           if a["end"] - a["start"] > medians[key(a)] + over_s]
    return sorted(out, key=lambda x: x["median_s"] - x["s"])


def stall_reason(stalls: dict[str, list[dict]]) -> str | None:
    """One phrase naming the worst of :func:`stalled_actions`' results, per part (``{name: stalls}``),
    for :meth:`mgpu_utils.timing.LoadWatch.claim`'s ``unless``; None when no action stalled."""
    found = [(name, a) for name, rows in stalls.items() for a in rows]
    if not found:
        return None
    name, a = max(found, key=lambda x: x[1]["s"] - x[1]["median_s"])
    what = "forward" if a["kind"] == "F" else "backward"
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    if a.get("per_stage"):
        return (f"{name}: rank {a['rank']}'s {what} of micro-batch {a['mb']} (stage {a['stage']}) took "
                f"{a['s'] * 1e3:.0f} ms, {(a['s'] - a['median_s']) * 1e3:.0f} ms over its stage's median "
                f"{what}{more}: stage times were not the ones the prediction assumes")
    return (f"{name}: rank {a['rank']}'s {what} of micro-batch {a['mb']} (stage {a['stage']}) took "
            f"{a['s'] * 1e3:.0f} ms, {(a['s'] - a['median_s']) * 1e3:.0f} ms over the median {what}{more}: "
            f"stage times were not equal, as the formula assumes")


def bubble_fraction(timeline: list[list[dict]], t0: float | None = None, t1: float | None = None) -> float:
    """Idle share of the step, averaged over ranks: ``1 - busy / (t1 - t0)``.

    ``t0``/``t1`` default to the earliest start and latest end over all ranks (the step). Works on
    :func:`simulate` output and on measured timelines (same keys, seconds instead of units).
    """
    t0 = min(a["start"] for acts in timeline for a in acts) if t0 is None else t0
    t1 = max(a["end"] for acts in timeline for a in acts) if t1 is None else t1
    busy = [sum(a["end"] - a["start"] for a in acts) for acts in timeline]
    return 1.0 - sum(busy) / (len(timeline) * (t1 - t0))


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """``(p-1) / (v*m + p-1)``: the bubble of GPipe and 1F1B (v = 1) and interleaved 1F1B."""
    _check(p, m, v)
    return (p - 1) / (v * m + p - 1)


def unequal_stages_step(stage_t: list[float], m: int) -> float:
    """GPipe's step when stage s's forward takes ``stage_t[s]`` (backward twice that), messages free:
    ``3 (sum(t) + (m-1) max(t))`` (lesson 05, load balancing).

    Micro-batch 0 crosses every stage forward (``sum(t)``), the other m-1 follow at the pace of the
    slowest stage; the backward does the same at twice the times. Exact for GPipe (it equals
    :func:`simulate` of its action lists with these durations); 1F1B overlaps some of the fill and
    drain and is at most this. Equal times t give ``3 t (m + p - 1)``, the ideal ``3 m t`` over
    ``1 - bubble_formula(p, m)``.

    Raises:
        ValueError: no stage, a negative time, or m < 1.
    """
    if not stage_t or min(stage_t) < 0 or m < 1:
        raise ValueError(f"need stage times >= 0 for at least one stage and m >= 1, got {stage_t}, m={m}")
    return 3 * (sum(stage_t) + (m - 1) * max(stage_t))


def unequal_stages_bubble(stage_t: list[float], m: int) -> float:
    """The idle share of GPipe's step, averaged over ranks, when stage times differ:
    ``1 - m sum(t) / (p (sum(t) + (m-1) max(t)))``; equal times give ``(p-1)/(m+p-1)``.

    Idle time now has two sources: the fill and drain (the bubble proper) and, on every rank but the
    slowest, the wait for the slowest stage in the steady state (the imbalance).
    """
    busy = 3 * m * sum(stage_t)
    return 1 - busy / (len(stage_t) * unequal_stages_step(stage_t, m))


def peak_in_flight(timeline_or_actions) -> list[float]:
    """Most micro-batches whose activations a rank holds at once (forward done, backward not yet),
    per rank, in units of one micro-batch through a whole stage (a chunk counts 1/v).

    Accepts action lists (tuples) or a timeline (dicts; actions are taken in order of start time).
    """
    rows = []
    for acts in timeline_or_actions:
        if acts and isinstance(acts[0], dict):
            acts = [(a["kind"], a["mb"], a["stage"]) for a in sorted(acts, key=lambda a: a["start"])]
        rows.append(acts)
    n_stages = 1 + max((a[2] for acts in rows for a in acts), default=0)
    v = max(1, n_stages // max(1, len(rows)))
    peaks = []
    for acts in rows:
        live = peak = 0
        for kind, _, _ in acts:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak / v)
    return peaks


def p2p_plan(actions: list[tuple], rank: int, p: int) -> list[list[tuple]]:
    """The point-to-point messages the hand-written executor posts, for one rank.

    Returns ``len(actions) + 1`` batches: batch i is posted (all together, with
    ``dist.batch_isend_irecv``) and waited for right before action i runs; it holds the send of
    action i-1's result and the receive of action i's input, like Megatron-LM's
    ``send_forward_recv_backward``. Each op is ``("send" | "recv", peer, key)`` with
    ``key = (kind, mb, stage)`` of the action that produced the tensor. Messages between stages of
    the same rank (p = 1, or chunks of one rank) need no op. Stage s lives on rank ``s % p``.
    """
    n_stages = p * (1 + max(a[2] for a in actions) // p) if actions else p
    batches, pending = [], None
    for a in list(actions) + [None]:
        ops = [pending] if pending else []
        pending = None
        if a is not None:
            kind, mb, s = a
            src = s - 1 if kind == "F" else s + 1        # the stage that produced this action's input
            if 0 <= src < n_stages and src % p != rank:
                ops.append(("recv", src % p, (kind, mb, src)))
            dst = s + 1 if kind == "F" else s - 1        # the stage that consumes this action's output
            if 0 <= dst < n_stages and dst % p != rank:
                pending = ("send", dst % p, (kind, mb, s))
        batches.append(ops)
    return batches


def check_p2p_deadlock_free(plans: list[list[list[tuple]]]) -> int:
    """Replay every rank's :func:`p2p_plan` under rendezvous semantics (NCCL's worst case: a send
    completes only when the peer has posted the matching receive, and a rank waits for its whole
    batch before it computes and posts the next). Returns the number of messages matched.

    Raises:
        ValueError: a deadlock (no batch can complete), or a send and a receive between the same
            two ranks that pair up different tensors (messages out of order).
    """
    p = len(plans)
    idx, done, matched = [0] * p, [set() for _ in range(p)], 0
    while any(idx[r] < len(plans[r]) for r in range(p)):
        progress = False
        for a in range(p):
            if idx[a] >= len(plans[a]):
                continue
            for i, (op, b, key) in enumerate(plans[a][idx[a]]):
                if i in done[a] or op != "send" or idx[b] >= len(plans[b]):
                    continue
                for j, (op2, src, key2) in enumerate(plans[b][idx[b]]):
                    if op2 == "recv" and src == a and j not in done[b]:
                        if key2 != key:
                            raise ValueError(f"rank {a} sends {key} while rank {b} waits for {key2}")
                        done[a].add(i)
                        done[b].add(j)
                        matched += 1
                        progress = True
                        break
        for r in range(p):
            if idx[r] < len(plans[r]) and len(done[r]) == len(plans[r][idx[r]]):
                idx[r] += 1
                done[r] = set()
                progress = True
        if not progress:
            raise ValueError("deadlock: " + ", ".join(f"rank {r} waits on {plans[r][idx[r]]}"
                                                      for r in range(p) if idx[r] < len(plans[r])))
    return matched
