"""Exercise checker: a wrong answer gets a hint, a right one a confirmation.

Each lesson ends with exercises; a cell looks like::

    from mgpu_utils.exercises import check
    answer = None          # your answer here
    check("03.1", answer)

Instructors (or stuck students) see the worked solution with ``solution("03.1")``.
Exercises are registered here, per lesson, so a new lesson adds its own entries to ``EXERCISES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Exercise:
    """One exercise: the question, a checker returning (correct, feedback), and the solution text."""

    question: str
    checker: Callable[[Any], tuple[bool, str]]
    solution: str


def _int_answer(expected: int, hints: dict, explain: str):
    def checker(answer):
        try:
            value = int(answer.strip()) if isinstance(answer, str) else int(answer)
            if not isinstance(answer, str) and value != answer:
                raise ValueError
        except (TypeError, ValueError):
            return False, f"expected a whole number, got {answer!r}"
        if value == expected:
            return True, explain
        return False, hints.get(value, hints.get("default", "not quite: re-read the cells above"))
    return checker


def _float_answer(expected: float, rel: float, hints: list, explain: str):
    """hints: [(predicate(value) -> bool, hint)], tried in order."""
    def checker(answer):
        try:
            value = float(answer)
        except (TypeError, ValueError):
            return False, f"expected a number, got {answer!r}"
        if abs(value - expected) <= rel * abs(expected):
            return True, explain
        for pred, hint in hints:
            if pred(value):
                return False, hint
        return False, "not quite: re-read the formula above"
    return checker


def _choice(expected: str, hints: dict, explain: str):
    def checker(answer):
        value = str(answer).strip().lower()
        if value == expected:
            return True, explain
        return False, hints.get(value, hints.get("default", "not quite"))
    return checker


EXERCISES: dict[str, Exercise] = {
    "00.1": Exercise(
        "hello_dist.py all-reduces (sums) the rank ids. With 8 ranks, what is sum_of_ranks on rank 0?",
        _int_answer(28, {36: "ranks are numbered from 0, not 1: 0 + 1 + ... + 7",
                         7: "that is rank 7's own id; the all-reduce adds every rank's id",
                         8: "that is the world size; the all-reduce adds the ids 0..7",
                         "default": "add the rank ids 0 + 1 + ... + (n-1) = n(n-1)/2"},
                    "0 + 1 + ... + 7 = 8*7/2 = 28, and every rank holds the same sum after an all-reduce"),
        "n(n-1)/2 with n = 8 gives 28. Check: launch('hello_dist.py', nproc=8)['sum_of_ranks']."),
    "00.2": Exercise(
        "A Colab user has 1 GPU and launches 4 ranks. Which backend does the course choose: 'nccl' or 'gloo'?",
        _choice("gloo", {"nccl": "NCCL needs one GPU per rank; 4 ranks on 1 GPU fail with 'Duplicate GPU detected'",
                         "default": "answer 'nccl' or 'gloo'"},
                "gloo: 4 ranks but 1 GPU, and NCCL needs one GPU per rank (choose_backend(4, num_gpus=1))"),
        "gloo. choose_backend(4, num_gpus=1) returns ('gloo', ...): NCCL refuses two ranks on one GPU."),
    "01.1": Exercise(
        "Arithmetic intensity (FLOP per byte) of a 3072 x 3072 x 3072 bf16 matmul, minimum traffic 3n^2 elements?",
        _float_answer(1024.0, 1e-3, [(lambda v: abs(v - 512) < 1, "2 bytes per element for bf16, not 4"),
                                     (lambda v: abs(v - 2048) < 1, "the traffic is 3 n^2 elements of 2 bytes "
                                      "each: I = 2n^3 / (3 n^2 x 2) = n / 3")],
                      "I = 2n^3 / (3 n^2 x 2 bytes) = n/3 = 1024 FLOP/byte: far right of any ridge point"),
        "1024 = mgpu_utils.timing.matmul_intensity(3072, 2)."),
    "01.2": Exercise(
        "Ridge point of an H100 SXM for dense bf16 (989 TFLOPS, 3.35 TB/s), in FLOP per byte?",
        _float_answer(295.0, 0.005, [(lambda v: abs(v - 0.295) < 0.01, "use the same units: 989e12 / 3.35e12"),
                                     (lambda v: abs(v - 3.39) < 0.05, "that is bandwidth / peak; the ridge is "
                                      "peak / bandwidth")],
                      "989e12 / 3.35e12 = 295 FLOP/byte: a kernel needs ~300 FLOP per byte to be compute-bound"),
        "295 = 989 / 3.35."),
    "02.1": Exercise(
        "Each of 4 replicas returns the gradient of its mean loss over 16 samples. By what do you multiply "
        "the SUM of the 4 gradients to get the full-batch (64) gradient?",
        _float_answer(0.25, 1e-6, [(lambda v: abs(v - 1 / 64) < 1e-6, "each replica already averaged over its 16 "
                                    "samples; only the 4 replicas remain to average"),
                                   (lambda v: abs(v - 1) < 1e-6, "the sum of 4 means is 4 times the mean"),
                                   (lambda v: abs(v - 4) < 1e-6, "divide, do not multiply: 1/4")],
                      "1/4: the mean of 4 equal-size means is the mean over all 64 samples (DDP divides by world size)"),
        "0.25 = 1 / R: DDP's all-reduce sums and divides by the world size, exactly this."),
    "02.2": Exercise(
        "nn.DataParallel on 8 GPUs: how many model copies leave GPU 0 per training step (one per receiving GPU)?",
        _int_answer(7, {8: "GPU 0 keeps the original; it copies to the other 7",
                        0: "DataParallel replicates the module in every forward call, since the weights change",
                        1: "one copy per receiving GPU, every step",
                        "default": "count the GPUs other than GPU 0"},
                    "7: replicate() broadcasts the parameters from GPU 0 to the 7 other GPUs in every forward"),
        "7 (the other GPUs), every step: one reason DDP, which keeps a replica in place per process, is faster."),
    "03.1": Exercise(
        "The training set has 1,438 digits. With 4 ranks, how many samples does DistributedSampler give "
        "each rank per epoch (drop_last=False)?",
        _int_answer(360, {359: "1438/4 = 359.5: DistributedSampler rounds up and pads by repeating samples",
                          1438: "that is the whole training set; each rank gets only its shard",
                          "default": "ceil(1438 / 4)"},
                    "ceil(1438/4) = 360: the sampler pads with 2 repeated samples so every rank takes the same "
                    "number of steps (unequal step counts would deadlock the all-reduce)"),
        "360 = ceil(1438 / 4); len(DistributedSampler(train, num_replicas=4, rank=0)) == 360."),
    "03.2": Exercise(
        "One GPU must reproduce the gradient of 4 ranks x 16 samples using micro-batches of 16. "
        "How many micro-batches do you accumulate before optimizer.step()?",
        _int_answer(4, {64: "64 is the global batch in samples; count micro-batches of 16",
                        16: "16 is the micro-batch size",
                        1: "one micro-batch of 16 gives a gradient of 16 samples, not 64",
                        "default": "global batch / micro-batch size"},
                    "4 micro-batches of 16 = 64 samples; divide each micro-batch loss by 4 so the sum is a mean"),
        "4: accumulate 4 backward passes of loss/4 (under model.no_sync() for the first 3 with DDP), then step."),
    "03.3": Exercise(
        "With DDP on 8 ranks, a student writes (loss * 8).backward(). By what factor are the gradients "
        "too large compared with 1 process on the global batch?",
        _int_answer(8, {1: "DDP already averages over ranks (sum / world size); scaling the loss scales the result",
                        64: "only the loss is scaled once; DDP's average does not add another factor",
                        "default": "DDP's all-reduce averages: what does multiplying each rank's loss do?"},
                    "8: DDP averages gradients over ranks, so multiplying the loss by the world size "
                    "multiplies the averaged gradient by 8 (the ddp_internals run measured a ratio of the world size)"),
        "8. Gradients are linear in the loss; DDP averages, so the result is world_size x too large."),
    "04.1": Exercise(
        "Ring all-reduce of a 16 MiB gradient on 8 ranks: how many MiB does each rank send in total?",
        _float_answer(28.0, 1e-6, [(lambda v: abs(v - 16) < 1e-6, "that is one copy of the tensor; the ring sends "
                                    "2(n-1) chunks of S/n"),
                                   (lambda v: abs(v - 32) < 1e-6, "2 x 16 is the large-n limit; with n = 8 it is "
                                    "2 x 7/8 x 16"),
                                   (lambda v: abs(v - 14) < 1e-6, "that is one phase; there are two "
                                    "(reduce-scatter and all-gather)")],
                      "2(n-1)/n x S = 2 x 7/8 x 16 MiB = 28 MiB, almost independent of n: why rings scale"),
        "28: each of the 2(n-1) = 14 steps sends one chunk of 16/8 = 2 MiB (mgpu_utils.ring.ring_bytes_per_rank)."),
    "04.2": Exercise(
        "nccl-tests reports all_gather on 4 ranks: size 1 GB (the output), time 0.1 s. What busbw in GB/s?",
        _float_answer(7.5, 1e-3, [(lambda v: abs(v - 10) < 1e-3, "10 GB/s is algbw = size / time; busbw "
                                   "multiplies it by the all_gather factor (n-1)/n"),
                                  (lambda v: abs(v - 15) < 1e-3, "2(n-1)/n is all_reduce's factor; all_gather's "
                                   "is (n-1)/n")],
                      "algbw = 1 GB / 0.1 s = 10 GB/s, busbw = 10 x 3/4 = 7.5 GB/s"),
        "7.5 = busbw_gbps('all_gather', 1e9, 0.1, 4)."),
    "04.3": Exercise(
        "ZeRO-2 / FSDP give each rank only its shard of the summed gradients. Which collective does that "
        "in one call: 'all_reduce', 'reduce_scatter', 'all_gather' or 'all_to_all'?",
        _choice("reduce_scatter", {"all_reduce": "all_reduce gives every rank the whole sum: more than a shard",
                                   "all_gather": "all_gather collects shards without summing; FSDP uses it for "
                                                 "the parameters before forward",
                                   "all_to_all": "all_to_all exchanges different data without summing (MoE)",
                                   "default": "one of 'all_reduce', 'reduce_scatter', 'all_gather', 'all_to_all'"},
                "reduce_scatter: sum, and leave rank r with chunk r only (half of an all-reduce)"),
        "reduce_scatter (and all_gather to rebuild parameters): all_reduce = reduce_scatter + all_gather."),
    "08.1": Exercise(
        "Ring all-reduce of a 100 MB fp32 gradient over 8 ranks on 10 GbE (B = 1.25 GB/s, alpha = 20 us): "
        "the modelled time in milliseconds?",
        _float_answer(140.28, 1e-3, [(lambda v: abs(v - 80) < 0.5, "S/B is one copy of the gradient; a ring sends "
                                      "2(n-1)/n x S per rank"),
                                     (lambda v: abs(v - 160) < 0.5, "2S/B is the large-n limit; with n = 8 it is "
                                      "2 x 7/8 x S/B, plus the latency"),
                                     (lambda v: abs(v - 140) < 0.2, "close: add the latency term 2(n-1) x alpha"),
                                     (lambda v: abs(v - 0.14028) < 1e-3, "that is seconds; the answer is in ms")],
                      "2(n-1)(alpha + S/(nB)) = 14 x (20 us + 10 ms) = 140.28 ms: the bandwidth term dominates"),
        "140.28 = ring_allreduce_seconds(100e6, 8, 'Ethernet 10 GbE') * 1e3 (mgpu_utils.interconnect)."),
    "08.2": Exercise(
        "An asynchronous parameter server has 4 equally fast workers. In a long run, how many versions old "
        "(staleness) is an applied gradient on average?",
        _int_answer(3, {4: "a gradient does not see its own update: count the other workers",
                        0: "that is synchronous SGD; here the others keep pushing while you compute",
                        1: "each of the other workers pushes once while you compute one gradient",
                        "default": "count the updates the other workers apply while you compute one gradient"},
                    "W - 1 = 3: while you compute, each of the 3 others pushes once (Little's law: the mean is "
                    "at most W - 1 whatever the speeds)"),
        "3 = W - 1; mgpu_utils.staleness.simulate_ps([1.0] * 4, 4000) gives a mean of 3 (minus start-up)."),
    "08.3": Exercise(
        "Local SGD on 8 ranks, averaging every H = 8 steps, 800 steps: how many all-reduces does each rank "
        "take part in?",
        _int_answer(100, {800: "that is synchronous SGD (H = 1): local SGD averages only every H steps",
                          6400: "each all-reduce involves all ranks at once: count calls, not ranks x calls",
                          12: "the number of ranks does not divide the count: steps / H",
                          "default": "steps / H"},
                    "800 / 8 = 100 all-reduces of the parameters: 8x less communication than synchronous SGD"),
        "100 = steps // H, as local_sgd.py counts them (allreduce_calls)."),
}


def question(exercise_id: str) -> str:
    """The text of an exercise. Raises KeyError (listing the known ids) for an unknown id."""
    return _get(exercise_id).question


def _get(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise KeyError(f"unknown exercise {exercise_id!r}; known: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[exercise_id]


def check(exercise_id: str, answer: Any, quiet: bool = False) -> bool:
    """Check an answer; print a confirmation or a hint.

    Args:
        exercise_id: e.g. "03.1" (lesson number, exercise number).
        answer: your answer; None means "not answered yet" (no hint is spent).
        quiet: do not print.

    Returns:
        True if the answer is right.

    Raises:
        KeyError: unknown exercise id.
    """
    ex = _get(exercise_id)
    if answer is None:
        ok, text = False, "not answered yet: replace None with your answer and run the cell again"
    else:
        ok, text = ex.checker(answer)
    if not quiet:
        print(f"[{exercise_id}] {'correct' if ok else 'not yet'}: {text}")
    return ok


def solution(exercise_id: str) -> str:
    """The worked solution (for instructors, or after you tried). Prints it and returns it."""
    text = _get(exercise_id).solution
    print(f"[{exercise_id}] solution: {text}")
    return text
