"""mgpu_utils.costs.overlap: DDP's buckets overlapping backward, simulated (lesson 03, exercise 03.9)."""
import random

import pytest

from mgpu_utils.costs.overlap import (MIB, best_bucket_cap, bucket_timeline, distinct_caps, resnet_gradients,
                                      transformer_gradients)

# three gradients, in model.parameters() order; backward runs from the last: ready at 3, 5 and 6 s
GRADS, BACKWARD = [100, 200, 300], [1.0, 2.0, 3.0]


def test_a_timeline_by_hand():
    """2 ranks, alpha 0.5 s, 100 bytes/s: an all-reduce of S bytes takes 2 * 0.5 + S / 100 seconds."""
    tl = bucket_timeline(GRADS, BACKWARD, 400, 2, 0.5, 100.0)
    assert tl.buckets == ((2, 1), (0,))                 # 300 + 200 >= 400 closes the first bucket at 5 s
    assert tl.bucket_bytes == (500, 100) and tl.closed_s == (5.0, 6.0)
    assert tl.start_s == (5.0, 11.0) and tl.end_s == (11.0, 13.0)   # the second waits for the link
    assert tl.backward_s == 6.0 and tl.exposed_s == 7.0 and tl.step_s == 13.0
    assert tl.latency_s == 2.0 and tl.comm_s == 8.0


def test_one_bucket_and_one_per_gradient():
    whole = bucket_timeline(GRADS, BACKWARD, 10 ** 9, 4, 1e-3, 1e3)
    assert whole.buckets == ((2, 1, 0),) and whole.start_s == (6.0,)       # nothing overlaps
    each = bucket_timeline(GRADS, BACKWARD, 0, 4, 1e-3, 1e3)
    assert each.buckets == ((2,), (1,), (0,)) and each.closed_s == (3.0, 5.0, 6.0)
    alone = bucket_timeline(GRADS, BACKWARD, 0, 1, 1e-3, 1e3)             # one rank sends nothing
    assert alone.exposed_s == 0.0 and alone.step_s == 6.0


def test_the_best_cap_is_the_best_of_every_bucketing():
    """best_bucket_cap (every candidate at once, in numpy) agrees with bucket_timeline tried cap by cap."""
    rng = random.Random(3)
    for _ in range(5):
        g = [rng.randint(1, 10 ** 6) for _ in range(30)]
        t = [rng.uniform(0, 1e-3) for _ in range(30)]
        args = (g, t, rng.choice([2, 8, 64]), rng.uniform(1e-6, 1e-4), rng.uniform(1e9, 5e10))
        cap, tl = best_bucket_cap(*args)
        steps = [bucket_timeline(*args[:2], c, *args[2:]).step_s for c in distinct_caps(g)]
        assert tl.step_s == pytest.approx(min(steps), rel=1e-9)
        assert bucket_timeline(*args[:2], cap, *args[2:]).step_s == tl.step_s
        # no cap in between does better (by construction: simulated times, no clock is read)
        assert all(bucket_timeline(*args[:2], c * 0.999, *args[2:]).step_s >= tl.step_s * (1 - 1e-9)
                   for c in distinct_caps(g))


def test_distinct_caps_are_the_sums_of_consecutive_gradients():
    assert distinct_caps([100, 200, 300]) == [100, 200, 300, 500, 600]


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="one entry per gradient"):
        bucket_timeline([1, 2], [1.0], 10, 2, 1e-6, 1e9)
    with pytest.raises(ValueError, match="cap_bytes must be a number >= 0"):
        bucket_timeline(GRADS, BACKWARD, -1, 2, 1e-6, 1e9)
    with pytest.raises(ValueError, match="bandwidth_bps > 0"):
        best_bucket_cap(GRADS, BACKWARD, 2, 1e-6, 0)


def test_the_models_have_their_published_sizes():
    g, t = resnet_gradients(1, 1e12)
    assert len(g) == 161 and sum(g) == 4 * 25_557_032                    # torchvision's resnet50
    g, t = transformer_gradients(12, 768, 50257, 1, 1e12)
    h = 768
    assert len(g) == 1 + 12 * 12 + 2 and sum(g) == 4 * (50257 * h + 12 * (12 * h * h + 13 * h) + 2 * h)
    g, t = transformer_gradients(2, 64, 100, 1, 1e12, tied=False, bytes_per_grad=2)
    assert g[-1] == 2 * 100 * 64 and t[-1] == pytest.approx(4 * 100 * 64 / 1e12)
    assert MIB == 2 ** 20
