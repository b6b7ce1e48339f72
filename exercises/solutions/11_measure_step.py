"""Solution of exercise 11.5: time a step and compute its MFU (for instructors)."""
import statistics
import time

from torch.utils.flop_counter import FlopCounterMode


def measure_step(step, sync, warmup, repeats, peak_flops):
    """This rank's median step time after warm-up, one step's FLOPs, and the MFU."""
    for _ in range(warmup):                      # lazy initialisation, autotuning, allocator: not timed
        step()
    times = []
    for _ in range(repeats):
        sync()                                   # the clock starts when the queue is empty ...
        t0 = time.perf_counter()
        step()
        sync()                                   # ... and stops when this step's work is done
        times.append(time.perf_counter() - t0)
    with FlopCounterMode(display=False) as counter:
        step()                                   # one more step, counted (not timed)
    sync()
    step_s, flops = statistics.median(times), counter.get_total_flops()
    return {"step_s": step_s, "flops": flops, "mfu": flops / step_s / peak_flops}
