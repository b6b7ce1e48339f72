"""Solution of exercise 03.9: a bucket size chosen by simulating the backward pass (for instructors).

The timeline of one backward pass, written out: gradients become ready from the last parameter to the first,
fill the open bucket until it holds the cap, and each full bucket's all-reduce starts when the link is free.
Caps from the smallest gradient to the whole model, 10 % apart, are tried; the one whose backward plus exposed
communication is shortest wins.
"""
MIB = 2 ** 20


def step_seconds(grad_bytes, backward_s, cap, n, alpha_s, bandwidth_bps):
    """Backward plus the communication still running when it ends, with buckets of ``cap`` bytes."""
    def allreduce_s(size):
        return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * size / bandwidth_bps
    now = link_free = held = 0.0
    for size, seconds in zip(reversed(grad_bytes), reversed(backward_s)):
        now += seconds                                   # this gradient is ready
        held += size
        if held >= cap:                                  # the bucket is full: send it when the link is free
            link_free = max(link_free, now) + allreduce_s(held)
            held = 0.0
    if held:                                             # the last bucket goes when backward ends
        link_free = max(link_free, now) + allreduce_s(held)
    return max(now, link_free)


def choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps):
    """DDP's bucket_cap_mb (MiB) for this model on this link."""
    cap, best = min(grad_bytes), None
    while cap < 1.1 * sum(grad_bytes):
        t = step_seconds(grad_bytes, backward_s, cap, n, alpha_s, bandwidth_bps)
        if best is None or t < best[0]:
            best = (t, cap)
        cap *= 1.1
    return best[1] / MIB
