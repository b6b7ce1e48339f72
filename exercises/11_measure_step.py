"""Exercise 11.5: time a step and compute its MFU (notebooks/11_benchmarking.ipynb, sections 1 and 4).

Write measure_step(step, sync, warmup, repeats, peak_flops) -> dict, for one rank of a DDP job:

  * step(): one training step of this rank (forward, backward with DDP's all-reduce, optimizer). Like a CUDA
    step it is asynchronous: it returns when its work is queued, before it is done;
  * sync(): waits until every queued piece of work is done (what torch.cuda.synchronize() does on a GPU);
  * warmup, repeats: untimed steps first, then timed ones; every rank calls step() equally often;
  * peak_flops: this rank's peak, in FLOP/s.

Return {"step_s": the median seconds of one step over the timed steps, "flops": the FLOPs of one step of
this rank, counted with torch.utils.flop_counter.FlopCounterMode, "mfu": flops / step_s / peak_flops (a
fraction)}. The grader's step is as slow at first as a first GPU step is (lazy initialisation,
autotuning), and its queued work takes a known time, varied from step to step, so a clock read before the
work is done shows, and so does any number but the median of the timed steps.
Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("11.5")
"""
import time


def measure_step(step, sync, warmup, repeats, peak_flops):
    """This rank's median step time after warm-up, one step's FLOPs, and the MFU."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)        # TODO: when is the step's work done?
    step_s = sum(times) / len(times)                   # TODO: warm-up, median
    flops = 0                                          # TODO: count one step's FLOPs
    return {"step_s": step_s, "flops": flops, "mfu": flops / step_s / peak_flops}
