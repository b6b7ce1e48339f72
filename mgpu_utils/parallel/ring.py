"""The ring all-reduce schedule, simulated step by step (notebooks/04_collectives.ipynb).

The same index rules as ``launch_scripts/ring_allreduce.py``: with n ranks and the tensor split
into n chunks, at reduce-scatter step s (0 <= s < n-1) rank r sends chunk (r - s) mod n to rank r+1
and adds the chunk (r - s - 1) mod n it receives from rank r-1; at all-gather step s rank r sends
chunk (r + 1 - s) mod n and overwrites chunk (r - s) mod n with what it receives.
"""

from __future__ import annotations


def ring_schedule(n: int) -> list[dict]:
    """The 2(n-1) steps of ring all-reduce on n ranks.

    Returns:
        A list of steps; step k is ``{"phase": "reduce-scatter" | "all-gather", "send": [c_0, ..., c_{n-1}],
        "recv": [...]}`` where ``send[r]`` is the chunk rank r sends to rank (r+1) mod n and ``recv[r]``
        the chunk it receives from rank (r-1) mod n.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    steps = []
    for s in range(n - 1):
        steps.append({"phase": "reduce-scatter", "send": [(r - s) % n for r in range(n)],
                      "recv": [(r - s - 1) % n for r in range(n)]})
    for s in range(n - 1):
        steps.append({"phase": "all-gather", "send": [(r + 1 - s) % n for r in range(n)],
                      "recv": [(r - s) % n for r in range(n)]})
    return steps


def ring_states(n: int) -> list[list[list[frozenset]]]:
    """Which ranks' data each rank's copy of each chunk contains, before step 0 and after every step.

    Returns:
        ``states[k][r][c]``: frozenset of source ranks summed into rank r's chunk c after k steps
        (k = 0 is the start: ``{r}``); 2(n-1) + 1 states. After the last step every entry is all n ranks.
    """
    state = [[frozenset([r]) for _ in range(n)] for r in range(n)]
    states = [state]
    for step in ring_schedule(n):
        new = [row[:] for row in state]
        for r in range(n):
            left, c = (r - 1) % n, step["recv"][r]
            assert step["send"][left] == c, "the left neighbour sends the chunk this rank expects"
            new[r][c] = state[r][c] | state[left][c] if step["phase"] == "reduce-scatter" else state[left][c]
        state = new
        states.append(state)
    return states
