"""Staleness in an asynchronous parameter server: an event simulation (notebooks/09_sync_vs_async.ipynb).

A parameter server (PS) holds the parameters and a version counter. Each worker pulls the parameters
(version v), computes a gradient for a fixed time, and pushes it; the PS applies it at once, so the
version becomes v' + 1, and the gradient's **staleness** is v' - v: how many other updates were applied
while it was being computed. The worker pulls again right away.

Because every worker always has exactly one gradient in flight, each update is "seen" as staleness by
the W - 1 gradients in flight on the other workers, so the mean staleness is at most W - 1 and tends
to W - 1 over a long run, whatever the workers' speeds (Little's law); the speeds only shape the
distribution: a slow worker's gradients are staler (it sees more updates per step), a fast worker's fresher.
"""

from __future__ import annotations

import heapq
import math


def simulate_ps(step_seconds, updates: int, start_seconds=None) -> list[tuple[int, int]]:
    """Simulate an asynchronous PS whose workers take fixed times per gradient (PS and network instant).

    Args:
        step_seconds: time per gradient of each worker (seconds, > 0), or None for a worker that finished no
            gradient in the measured run (on a busy machine a worker that starts late can miss a short run: it
            pulls once and never pushes); worker ids are 0 .. W-1.
        updates: number of updates the PS applies.
        start_seconds: when each worker makes its first pull (seconds, >= 0; default all 0). A worker that
            starts late pulls the version of that moment, and the others push without it until then: on a
            busy machine one worker can start tens of milliseconds after the others (lesson 09 passes the
            measured starts).

    Returns:
        ``[(worker, staleness)]`` in the order the PS applied them (ties: lower worker id first).

    Raises:
        ValueError: no workers, a time <= 0, a start < 0 or a start list of another length, updates < 0, or
            more updates than workers that push.
    """
    times = [math.inf if t is None else float(t) for t in step_seconds]
    starts = [0.0] * len(times) if start_seconds is None else [float(t) for t in start_seconds]
    if not times or min(times) <= 0 or updates < 0 or len(starts) != len(times) or min(starts) < 0:
        raise ValueError(f"need >= 1 worker with times > 0, as many starts >= 0 and updates >= 0, "
                         f"got times {times}, starts {starts}, updates {updates}")
    if updates and all(math.isinf(t) for t in times):
        raise ValueError(f"{updates} updates asked, but no worker pushes (every time is None)")
    heap = [(t, 0, w) for w, t in enumerate(starts)]    # (time, 0: pull / 1: push, worker)
    heapq.heapify(heap)
    base, version, out = [0] * len(times), 0, []
    while version < updates:
        t, push, w = heapq.heappop(heap)
        if push:
            out.append((w, version - base[w]))
            version += 1
        base[w] = version                               # the worker pulls the new version at once
        if not math.isinf(times[w]):                    # a worker that never finishes pushes nothing
            heapq.heappush(heap, (t + times[w], 1, w))
    return out
