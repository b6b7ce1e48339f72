"""Solution of exercise 05.4: the 1F1B schedule (for instructors)."""


def one_f_one_b(p: int, m: int) -> list[list[tuple]]:
    """The 1F1B action list of each rank for p stages (one per rank) and m micro-batches."""
    schedule = []
    for r in range(p):
        warmup = min(p - r - 1, m)            # the last stage starts backwards at once, stage 0 after p - 1 forwards
        actions = [("F", i, r) for i in range(warmup)]
        for i in range(m - warmup):
            actions += [("F", warmup + i, r), ("B", i, r)]
        actions += [("B", i, r) for i in range(m - warmup, m)]
        schedule.append(actions)
    return schedule
