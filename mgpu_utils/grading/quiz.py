"""The quiz of every lesson (00-13): a wrong answer gets a hint, a right one a confirmation.

Each lesson ends with exercises; a cell looks like::

    from mgpu_utils.grading.quiz import check
    answer = None          # your answer here
    check("03.1", answer)

Instructors (or stuck students) see the worked solution with ``solution("03.1")``.
Exercises are registered here, per lesson, so a new lesson adds its own entries to ``EXERCISES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mgpu_utils.text import wrap_text


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
    "01.3": Exercise(
        "A kernel runs 256-thread blocks with 48 registers per thread on an H100 (65,536 registers and at most "
        "2,048 threads per SM, no shared memory). What is its occupancy (resident warps / 64, between 0 and 1)?",
        _float_answer(0.625, 0.01, [(lambda v: abs(v - 1) < 0.01, "the threads allow 8 blocks, but the registers "
                                     "allow fewer: 48 x 256 registers per block"),
                                    (lambda v: abs(v - 2 / 3) < 0.01, "blocks are whole: 65,536 / (48 x 256) = 5.3, "
                                     "so 5 blocks of 8 warps"),
                                    (lambda v: abs(v - 0.75) < 0.01, "count again: 5 blocks x 8 warps = 40 of 64")],
                      "0.625: 48 x 256 = 12,288 registers per block, 5 blocks fit in 65,536, 5 x 8 = 40 warps of 64"),
        "0.625 = occupancy(256, 48, 0, sm_limits(capability=(9, 0)))['occupancy']."),
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
    "03.8": Exercise(
        "A validation set of 10,001 images is evaluated on 64 ranks with DistributedSampler (shuffle=False, "
        "drop_last=False), and accuracy is all-reduced as (correct, count). How many images are counted twice?",
        _int_answer(47, {63: "at most world size - 1 can be repeated; here ceil(10001/64) x 64 - 10001",
                         0: "10,001 is not a multiple of 64: the sampler pads every rank to the same count",
                         10048: "that is how many are counted in all; subtract the 10,001 real ones",
                         157: "that is each rank's count; the padding is 64 x 157 - 10,001",
                         "default": "ceil(10001 / 64) x 64 - 10001"},
                    "47: every rank gets ceil(10001/64) = 157 images, 64 x 157 = 10,048, so 47 are repeats "
                    "(ddp_uneven.py --case eval counts them)"),
        "47 = 64 x ceil(10001 / 64) - 10001; the fix gathers (index, correct) and counts each index once."),
    "04.1": Exercise(
        "Ring all-reduce of a 16 MiB gradient on 8 ranks: how many MiB does each rank send in total?",
        _float_answer(28.0, 1e-6, [(lambda v: abs(v - 16) < 1e-6, "that is one copy of the tensor; the ring sends "
                                    "2(n-1) chunks of S/n"),
                                   (lambda v: abs(v - 32) < 1e-6, "2 x 16 is the large-n limit; with n = 8 it is "
                                    "2 x 7/8 x 16"),
                                   (lambda v: abs(v - 14) < 1e-6, "that is one phase; there are two "
                                    "(reduce-scatter and all-gather)")],
                      "2(n-1)/n x S = 2 x 7/8 x 16 MiB = 28 MiB, almost independent of n: why rings scale"),
        "28: each of the 2(n-1) = 14 steps sends one chunk of 16/8 = 2 MiB (mgpu_utils.costs.bandwidth.ring_bytes_per_rank)."),
    "04.2": Exercise(
        "nccl-tests reports all_gather on 4 ranks: size 1 GB (the output), time 0.1 s. What busbw in GB/s?",
        _float_answer(7.5, 1e-3, [(lambda v: abs(v - 10) < 1e-3, "10 GB/s is algbw = size / time; busbw "
                                   "multiplies it by the all_gather factor (n-1)/n"),
                                  (lambda v: abs(v - 15) < 1e-3, "2(n-1)/n is all_reduce's factor; all_gather's "
                                   "is (n-1)/n")],
                      "algbw = 1 GB / 0.1 s = 10 GB/s, busbw = 10 x 3/4 = 7.5 GB/s"),
        "7.5 = busbw_gbps('all_gather', 1e9, 0.1, 4)."),
    "04.3": Exercise(
        "ZeRO-2 and FSDP leave each rank only its shard of the summed gradients. For 1 GiB of fp32 gradients on "
        "8 ranks, with the collective that does it in one call (bandwidth-optimal), how many MiB does each rank "
        "send?",
        _float_answer(896.0, 1e-6, [(lambda v: abs(v - 1792) < 1e-6, "1792 MiB is an all-reduce, 2(n-1)/n x S: "
                                     "a shard needs only the reduce-scatter half"),
                                    (lambda v: abs(v - 128) < 1e-6, "128 MiB is the shard each rank keeps, "
                                     "not what it sends"),
                                    (lambda v: abs(v - 1024) < 1e-6, "each rank sends n - 1 chunks of S/n, "
                                     "not the whole buffer")],
                      "reduce-scatter: (n-1)/n x S = 7/8 x 1024 MiB = 896 MiB, half of an all-reduce"),
        "896 = (8 - 1) / 8 x 1024: a reduce-scatter (the table of section 1), half of an all-reduce."),
    "05.1": Exercise(
        "GPipe with p = 8 stages and m = 24 micro-batches: what fraction of the step is bubble (idle)?",
        _float_answer(7 / 31, 0.01, [(lambda v: abs(v - 7 / 24) < 2e-3, "the step lasts m + p - 1 slots, not m: "
                                      "divide by 24 + 7"),
                                     (lambda v: abs(v - 7 / 8) < 2e-3, "that is the naive split without "
                                      "micro-batches, (p-1)/p"),
                                     (lambda v: abs(v - 7 / 32) < 2e-3, "p - 1 = 7 slots of bubble among m + p - 1 "
                                      "= 31, not 32")],
                      "(p-1)/(m+p-1) = 7/31 = 0.226: each rank idles p-1 slots while the pipeline fills and drains"),
        "7/31 = 0.226 = mgpu_utils.parallel.schedules.bubble_formula(8, 24); 1F1B has the same bubble."),
    "05.2": Exercise(
        "Same pipeline (p = 8, m = 24) with 1F1B: how many micro-batches' activations does stage 0 hold at its peak?",
        _int_answer(8, {24: "that is GPipe, which runs all m forwards before any backward",
                        1: "stage 0 runs p - 1 warm-up forwards before its first backward",
                        7: "p - 1 warm-up forwards, plus the one of the first 1F1B pair",
                        "default": "count the forwards stage 0 runs before its first backward frees one"},
                    "min(p, m) = 8: 1F1B frees a micro-batch's activations as soon as its backward runs, so "
                    "memory grows with p, not with m"),
        "8 = peak_in_flight(one_f_one_b_actions(8, 24))[0] = memory_model.in_flight_micro_batches('1f1b', 8, 24)."),
    "05.3": Exercise(
        "Megatron tensor parallelism without sequence parallelism: how many all-reduces does one transformer "
        "layer (attention + MLP) issue per training step, forward and backward together?",
        _int_answer(4, {2: "2 is the forward only (g after attention and after the MLP); the f operators "
                           "all-reduce in backward",
                        1: "one per block per direction: attention and MLP, forward and backward",
                        8: "each block has one f and one g, each all-reducing in one direction only",
                        "default": "count f and g per block, times two blocks"},
                    "4: g all-reduces forward and f backward, once for attention and once for the MLP"),
        "4 = 2 x tp_bytes_per_layer(...)['collectives_per_pass']; the run counted them in COMM_LOG."),
    "05.6": Exercise(
        "Vocabulary-parallel cross-entropy on t = 8 ranks, V = 50,304, 8,192 tokens, fp32: instead of an "
        "all-gather of the logits, three all-reduces of one number per token (max, sum of exponentials, target "
        "logit). Counting a ring all-gather as receiving (t-1)/t of the gathered tensor and a ring all-reduce as "
        "2(t-1)/t of its tensor, how many times fewer bytes does each rank receive?",
        _float_answer(8384, 1e-3, [(lambda v: abs(v - 16768) < 1, "a ring all-reduce moves 2(t-1)/t of its tensor "
                                    "per rank, twice an all-gather's (t-1)/t"),
                                   (lambda v: abs(v - 50304) < 1, "three all-reduces, each 2(t-1)/t x 8,192 x 4 "
                                    "bytes"),
                                   (lambda v: abs(v - 25152) < 1, "count all three all-reduces (max, sum of "
                                    "exponentials, target logit), each 2(t-1)/t of its tensor"),
                                   (lambda v: abs(v - 1048) < 1, "the gathered logits are V wide per token, not V/t")],
                      "(t-1)/t x 8,192 x V x 4 bytes against 3 x 2(t-1)/t x 8,192 x 4 bytes: V / 6 = 8,384; the "
                      "logits never leave the rank that computed them"),
        "8384 = V / 6: the all-gather brings (t-1)/t x N V x 4 bytes, the three all-reduces 3 x ring_bytes_per_rank("
        "4 N, t) = 3 x 2(t-1)/t x 4 N; the ratio does not depend on t or on the number of tokens."),
    "05.5": Exercise(
        "Eight layers with forward times 1, 1, 1, 1, 2, 2, 2, 2 ms (backward twice that) on p = 2 stages, GPipe "
        "with m = 4 micro-batches. With the best split, how many ms does one step take (messages free)?",
        _float_answer(90, 0.01, [(lambda v: abs(v - 108) < 0.5, "108 ms is the equal split (4 + 4 layers: stages "
                                  "of 4 and 8 ms); move a layer to balance the stages"),
                                 (lambda v: abs(v - 72) < 0.5, "72 ms is a pipeline without fill and drain, "
                                  "3 m sum(t) / p; micro-batch 0 still crosses both stages first"),
                                 (lambda v: abs(v - 30) < 0.5, "30 ms is the forward only; the backward takes "
                                  "twice as long"),
                                 (lambda v: abs(v - 117) < 0.5, "117 ms splits 3 + 5 layers (stages of 3 and 9 ms): "
                                  "the heavy layers need fewer per stage, not more")],
                      "90 ms: the split 5 + 3 layers gives stages of 6 and 6 ms, and GPipe's step is "
                      "3 (sum(t) + (m-1) max(t)) = 3 (12 + 3 x 6)"),
        "90 = unequal_stages_step([6, 6], 4) with the split balanced_split([1, 1, 1, 1, 2, 2, 2, 2], 2) = [5, 3]."),
    "06.1": Exercise(
        "GPT-3 175B with Megatron tensor parallelism (sequence length s = 2048, micro-batch b = 1, hidden "
        "h = 12288, bf16 activations, tp = 8): how many MB (1e6 bytes) is the tensor that one tensor-parallel "
        "all-reduce sums?",
        _float_answer(2048 * 12288 * 2 / 1e6, 0.01,
                      [(lambda v: abs(v - 2048 * 12288 * 2 / 8e6) < 0.1, "the all-reduce sums the full (s, b, h) "
                        "activation: each rank holds a partial sum of all of it, not a 1/tp slice"),
                       (lambda v: abs(v - 2048 * 12288 * 4 / 1e6) < 0.5, "bf16 is 2 bytes per element, not 4"),
                       (lambda v: abs(v - 4 * 2048 * 12288 * 2 / 1e6) < 1, "that is the 4 all-reduces of one "
                        "layer together; the question asks for one")],
                      "s x b x h x 2 bytes = 2048 x 12288 x 2 = 50.3 MB, whatever tp is"),
        "50.3 MB = 2048 x 1 x 12288 x 2 bytes; a layer issues 4 of them per micro-batch (2 forward, 2 backward), "
        "and a ring all-reduce sends 2(tp-1)/tp of it per GPU."),
    "06.2": Exercise(
        "GPT-3 175B (174.6e9 parameters), mixed-precision Adam, no ZeRO, tp=8, pp=16, dp=8 on 1024 GPUs: "
        "model states (parameters + gradients + optimizer) per GPU, in GB (1e9 bytes)?",
        _float_answer(21.83, 0.01, [(lambda v: abs(v - 2.73) < 0.05, "2.73 GB is either the 16-bit parameters "
                                     "alone or the states divided over all 1024 GPUs; without ZeRO the 8 dp "
                                     "replicas each hold a full copy of their tp x pp shard"),
                                    (lambda v: abs(v - 2794) < 10, "that is the whole model's states on one "
                                     "GPU (plain DDP); tp and pp split them over 8 x 16 GPUs"),
                                    (lambda v: abs(v - 174.6 * 12 / 128) < 0.1, "16 bytes per parameter: "
                                     "2 (bf16 weights) + 2 (gradients) + 12 (fp32 master, momentum, variance)")],
                      "16 bytes x 174.6e9 / (8 x 16) = 21.8 GB: model_state_bytes(N, tp=8, pp=16).total / 1e9"),
        "21.8 GB = 16 x 174.6e9 / 128 / 1e9. The activations (55.6 GB without recomputation) come on top."),
    "07.1": Exercise(
        "A 1.5B-parameter model, mixed-precision Adam, 8 GPUs, ZeRO stage 2: GB (1e9 bytes) of model states per GPU?",
        _float_answer(5.625, 2e-3, [(lambda v: abs(v - 24) < 0.05, "24 GB is 16 bytes x 1.5B: stage 0, nothing sharded"),
                                    (lambda v: abs(v - 8.25) < 0.05, "that is stage 1 (only the optimizer states "
                                     "sharded); stage 2 shards the gradients too"),
                                    (lambda v: abs(v - 3.0) < 0.05, "that is stage 3 (everything sharded); stage 2 "
                                     "keeps the 2-byte parameters whole")],
                      "2 x 1.5 (parameters, whole) + (2 + 12) x 1.5 / 8 (gradients and optimizer states, sharded) "
                      "= 3 + 2.625 = 5.625 GB"),
        "5.625 = calculate(1.5e9, zero_stage=2, dp=8).total / 1e9."),
    "07.2": Exercise(
        "One GPT layer, s=2048, b=1, h=4096, a=32, no recomputation, no tensor parallelism: GB (1e9 bytes) of "
        "activations by Korthikanti's formula?",
        _float_answer(0.956301312, 5e-3,
                      [(lambda v: abs(v - 0.285) < 0.005, "that is only 34*s*b*h: add the attention term 5*a*s^2*b"),
                       (lambda v: abs(v - 0.0168) < 0.001, "that is full recomputation (2*s*b*h); here nothing is "
                        "recomputed"),
                       (lambda v: abs(v - 0.671) < 0.005, "that is only the attention term 5*a*s^2*b; add 34*s*b*h")],
                      "s*b*h*(34 + 5*a*s/h) = 8,388,608 x (34 + 80) = 0.956 GB per layer: the s^2 attention term "
                      "is larger than everything else at this length"),
        "0.956 = activation_bytes_per_layer(2048, 1, 4096, 32) / 1e9."),
    "07.3": Exercise(
        "DDP, 8 micro-batches per optimizer step: without no_sync, how many times more gradient bytes does each "
        "rank all-reduce per step than with no_sync?",
        _int_answer(8, {1: "without no_sync every micro-batch's backward all-reduces all gradients",
                        7: "no_sync saves 7 of the 8 rounds; the question asks for the ratio 8 / 1",
                        "default": "count the all-reduce rounds per step in each case"},
                    "8: one full all-reduce per micro-batch instead of one per step (grad_accumulation.py counted it)"),
        "8 = micro-batches per step: every backward outside no_sync all-reduces every gradient byte once."),
    "07.7": Exercise(
        "A 24-block GPT under FSDP2 with fully_shard on every block and then on the root (default "
        "reshard_after_forward), on 8 ranks: how many all-gathers does one training step issue?",
        _int_answer(49, {25: "a block reshards after its forward, so backward gathers it again: 2 per block",
                         48: "the root (embeddings, final norm, LM head) is a unit too: one more",
                         24: "count the root, and the second all-gather of every block in backward",
                         2: "that is one unit for the whole model; here every block is its own unit",
                         "default": "1 for the root + 2 per block (forward, and again in backward)"},
                    "49 = 1 + 2 x 24: the root once (it stays gathered until backward), each block in forward "
                    "and again in backward (fsdp2_practice.py counts 1 + 2L for its L = 4 blocks)"),
        "49 = 1 + 2 x 24 (and 25 reduce-scatters, one per unit); the number of ranks does not change the count."),
    "07.8": Exercise(
        "A GPT with a vocabulary of 50,257 and width 4,096 in fp32 (nn.Embedding for tokens, attention as four "
        "[4,096 x 4,096] nn.Linear, MLP [16,384 x 4,096] and [4,096 x 16,384], an untied LM head with no bias) is "
        "built on the meta device, sharded over 64 ranks and initialised by section 5c's replay. How many GB "
        "(1e9 bytes) of whole weights does one rank hold at most at one time?",
        _float_answer(0.8234, 1e-2, [
            (lambda v: abs(v - 0.2684) < 0.01, "that is one MLP matrix; the vocabulary's modules are larger"),
            (lambda v: abs(v - 1.6468) < 0.02, "the replay draws one module at a time: the embedding and "
                                               "the head are never whole together"),
            (lambda v: abs(v - 0.8234 / 64) < 0.001, "that is the shard a rank keeps; the replay draws the "
                                                     "module whole first"),
        ], "0.823 GB = 50,257 x 4,096 x 4 bytes: the token embedding (or the head, the same size), the largest "
           "module; the number of ranks does not change it"),
        "50,257 x 4,096 x 4 B = 0.823 GB: the replay holds the largest module whole, once."),
    "09.1": Exercise(
        "Ring all-reduce of a 100 MB fp32 gradient over 8 ranks on 10 GbE (B = 1.25 GB/s, alpha = 20 us): "
        "the modelled time in milliseconds?",
        _float_answer(140.28, 1e-3, [(lambda v: abs(v - 80) < 0.5, "S/B is one copy of the gradient; a ring sends "
                                      "2(n-1)/n x S per rank"),
                                     (lambda v: abs(v - 160) < 0.5, "2S/B is the large-n limit; with n = 8 it is "
                                      "2 x 7/8 x S/B, plus the latency"),
                                     (lambda v: abs(v - 140) < 0.2, "close: add the latency term 2(n-1) x alpha"),
                                     (lambda v: abs(v - 0.14028) < 1e-3, "that is seconds; the answer is in ms")],
                      "2(n-1)(alpha + S/(nB)) = 14 x (20 us + 10 ms) = 140.28 ms: the bandwidth term dominates"),
        "140.28 = ring_allreduce_seconds(100e6, 8, 'Ethernet 10 GbE') * 1e3 (mgpu_utils.costs.interconnect)."),
    "09.2": Exercise(
        "An asynchronous parameter server has 4 equally fast workers. In a long run, how many versions old "
        "(staleness) is an applied gradient on average?",
        _int_answer(3, {4: "a gradient does not see its own update: count the other workers",
                        0: "that is synchronous SGD; here the others keep pushing while you compute",
                        1: "each of the other workers pushes once while you compute one gradient",
                        "default": "count the updates the other workers apply while you compute one gradient"},
                    "W - 1 = 3: while you compute, each of the 3 others pushes once (Little's law: the mean is "
                    "at most W - 1 whatever the speeds)"),
        "3 = W - 1; mgpu_utils.parallel.staleness.simulate_ps([1.0] * 4, 4000) gives a mean of 3 (minus start-up)."),
    "09.3": Exercise(
        "Local SGD on 8 ranks, averaging every H = 8 steps, 800 steps: how many all-reduces does each rank "
        "take part in?",
        _int_answer(100, {800: "that is synchronous SGD (H = 1): local SGD averages only every H steps",
                          6400: "each all-reduce involves all ranks at once: count calls, not ranks x calls",
                          12: "the number of ranks does not divide the count: steps / H",
                          "default": "steps / H"},
                    "800 / 8 = 100 all-reduces of the parameters: 8x less communication than synchronous SGD"),
        "100 = steps // H, as local_sgd.py counts them (allreduce_calls)."),
    "09.5": Exercise(
        "Top-k sparsification keeps 1% of a 25e6-parameter fp32 gradient on 8 ranks and sends each kept entry as "
        "an (index, value) pair of two fp32 numbers by a ring all-gather, as sparsify.py's hook does; dense is a "
        "ring all-reduce of fp32. How many times fewer bytes does each rank send with top-k?",
        _float_answer(12.5, 1e-3, [(lambda v: abs(v - 100) < 0.5, "1/ratio counts only what each rank keeps; each "
                                    "rank also forwards every other rank's pairs (an all-gather grows with n)"),
                                   (lambda v: abs(v - 50) < 0.5, "a pair is 8 bytes, and the all-gather forwards "
                                    "the other ranks' pairs too: (n-1) x 8 k bytes against 2(n-1)/n x 4P"),
                                   (lambda v: abs(v - 25) < 0.5, "the dense ring all-reduce sends 2(n-1)/n x 4P "
                                    "bytes per rank, not (n-1)/n x 4P"),
                                   (lambda v: abs(v - 0.08) < 1e-3, "that is top-k's bytes over dense's; the "
                                    "question asks how many times fewer")],
                      "dense 2(n-1)/n x 4P = 175 MB per rank, top-k (n-1) x 8 x 0.01P = 14 MB: 12.5 = 1/(n x ratio), "
                      "so the saving shrinks as n grows (the all-gather carries every rank's pairs)"),
        "12.5 = ring_bytes_per_rank(4 * 25e6, 8) / (7 * 8 * 0.01 * 25e6) = 1 / (8 x 0.01): the sparse all-gather "
        "brings each rank every other rank's k pairs, so with n ranks the saving is 1/(n x ratio)."),
    "09.6": Exercise(
        "DiLoCo on 8 workers: H = 500 inner steps between outer steps, 10,000 inner steps in all, a model of "
        "1e9 parameters whose change (pseudo-gradient) is all-reduced in fp32 by a ring. How many GB (1e9 bytes) "
        "does each worker send over the whole run?",
        _float_answer(140, 1e-3, [(lambda v: abs(v - 160) < 0.5, "a ring sends 2(n-1)/n x S per rank, not 2S: "
                                   "with n = 8, 1.75 S"),
                                  (lambda v: abs(v - 80) < 0.5, "an all-reduce sends about twice the tensor per "
                                   "rank: reduce-scatter and all-gather, 2(n-1)/n x S"),
                                  (lambda v: abs(v - 70) < 0.5, "fp32 is 4 bytes per parameter"),
                                  (lambda v: abs(v - 70000) < 10, "that is an all-reduce every step; DiLoCo "
                                   "communicates once per H = 500 steps"),
                                  (lambda v: abs(v - 7) < 0.01, "that is one outer step; count 10,000 / 500 = 20")],
                      "10,000 / 500 = 20 outer steps, each a ring all-reduce of 4 GB: 20 x 2 x 7/8 x 4 GB = 140 GB, "
                      "500 times less than all-reducing fp32 gradients every step (70,000 GB)"),
        "140 = 20 x ring_bytes_per_rank(4e9, 8) / 1e9 (mgpu_utils.costs.bandwidth)."),
    "10.1": Exercise(
        "A recipe trains with a learning rate of 0.1 for a global batch of 256. You move it to 64 GPUs with 32 "
        "images each and keep the number of epochs. By the linear scaling rule, what learning rate do you use?",
        _float_answer(0.8, 1e-3, [(lambda v: abs(v - 0.1) < 1e-6, "the batch grew: the rule scales the rate with it"),
                                  (lambda v: abs(v - 0.0125) < 1e-4, "the rate grows with the batch, it does not "
                                   "shrink: multiply by 2048 / 256"),
                                  (lambda v: abs(v - 3.2) < 1e-3, "the global batch is 64 x 32 = 2048, and the "
                                   "factor is 2048 / 256, not 32"),
                                  (lambda v: abs(v - 6.4) < 1e-3, "the factor is 2048 / 256 = 8, not the GPU count")],
                      "global batch 64 x 32 = 2048 = 8 x 256, so 8 x 0.1 = 0.8, reached by a warm-up over the "
                      "first epochs (Goyal et al. 2017)"),
        "0.8 = 0.1 x (64 x 32) / 256; case_resnet.py --lr 0.1 --base-batch 256 --scale-lr computes the same."),
    "10.2": Exercise(
        "A 13-billion-parameter model trains on 260 billion tokens with full activation recomputation, on 512 A100s "
        "achieving 120 TFLOP/s each. How many days does it take?",
        _float_answer(5.094, 0.01, [(lambda v: abs(v - 3.82) < 0.05, "6 N D leaves out the recomputed forward: "
                                     "with full recomputation it is 8 N D"),
                                    (lambda v: abs(v - 122.3) < 1, "that is hours; the answer is in days"),
                                    (lambda v: abs(v - 440104) < 500, "that is seconds; the answer is in days"),
                                    (lambda v: abs(v - 2608) < 30, "divide by all 512 GPUs' FLOP/s, not one's")],
                      "8 x 13e9 x 260e9 = 2.70e22 FLOPs / (512 x 120e12 FLOP/s) = 440,000 s = 5.1 days"),
        "5.094 = 8 * 13e9 * 260e9 / (512 * 120e12) / 86400, as lesson 10 computes GPT-3's 34 days."),
    "10.3": Exercise(
        "ddp = DDP(BertForMaskedLM(cfg)). Which expression gives the model's configuration: ddp.config, "
        "ddp.module.config or ddp.model.config?",
        _choice("ddp.module.config", {"ddp.config": "DDP is a wrapper: it does not forward the model's attributes "
                                      "(AttributeError, as in the notebook)",
                                      "ddp.model.config": "the wrapped model is stored under another name",
                                      "default": "one of the three expressions, as written"},
                "DDP keeps the wrapped model as .module; save_pretrained and generate are reached the same way"),
        "ddp.module.config: DDP(model).module is model."),
    "10.4": Exercise(
        "(optional) In one step of case_gan.py, how many times does the discriminator's forward run on each rank?",
        _int_answer(3, {2: "real and fake for D's own step, and once more for the generator's step",
                        1: "D sees real images and fake ones in its own step, and the fakes again for G",
                        "default": "count the calls d(...) in one iteration of the loop"},
                    "3: D(real) and D(fake.detach()) for the discriminator's step, D(fake) for the generator's; "
                    "each backward that reaches D makes its DDP reducer all-reduce D's gradients"),
        "3 = d(real), d(fake.detach()), d(fake): see the step picture at the top of lesson 09."),
    "10.6": Exercise(
        "McCandlish et al. (2018): the steps to a target are S(B) = S_min (1 + B_crit / B). A model needs "
        "S_min = 2,000 steps and its critical batch B_crit is 1,024. You go from a global batch of 1,024 to 4,096 "
        "(4 times the GPUs, the same batch per GPU). By what factor does the number of steps fall?",
        _float_answer(1.6, 1e-3, [(lambda v: abs(v - 4) < 1e-3, "that is perfect scaling, which holds only well "
                                   "below B_crit: compute S(1024) and S(4096)"),
                                  (lambda v: abs(v - 0.625) < 1e-3, "that is new steps / old steps; the factor "
                                   "they fall by is old / new"),
                                  (lambda v: abs(v - 2) < 1e-3, "that is S(1024) / S_min; the new batch is 4,096"),
                                  (lambda v: abs(v - 1.25) < 1e-3, "that is S(4096) / S_min; divide S(1024) by "
                                   "S(4096)"),
                                  (lambda v: abs(v - 2.5) < 1e-3, "that is how many more examples E = S B the run "
                                   "uses; the question asks for steps")],
                      "S(1024) = 2,000 x 2 = 4,000 and S(4096) = 2,000 x 1.25 = 2,500: 1.6 times fewer steps for "
                      "4 times the GPUs, and each image is used 2.5 times as often (E = S B)"),
        "1.6 = critical_batch_steps(1024, 2000, 1024) / critical_batch_steps(4096, 2000, 1024) "
        "(mgpu_utils.costs.scaling)."),
    "11.1": Exercise(
        "Strong scaling: one rank takes 200 ms per step; 4 ranks take 62.5 ms per step on the same global batch. "
        "What is the parallel efficiency at 4 ranks, in percent?",
        _float_answer(80.0, 1e-3, [(lambda v: abs(v - 3.2) < 0.01, "3.2 is the speed-up; the efficiency divides it "
                                    "by the number of ranks"),
                                   (lambda v: abs(v - 0.8) < 0.01, "that is a fraction; the answer is in percent"),
                                   (lambda v: abs(v - 31.25) < 0.1, "that is time(4) / time(1): the speed-up is "
                                    "the inverse")],
                      "speed-up 200 / 62.5 = 3.2, efficiency 3.2 / 4 = 80%"),
        "80 = 100 x (200 / 62.5) / 4; mgpu_utils.costs.scaling.speedups gives it from the throughputs (the same global "
        "batch 1 / 0.2 and 1 / 0.0625 times per second)."),
    "11.2": Exercise(
        "A job has a serial fraction f = 5% (Amdahl). What speed-up can 16 ranks give at most, on a fixed problem?",
        _float_answer(9.14, 0.005, [(lambda v: abs(v - 16) < 0.01, "16 is the ideal; the serial part does not "
                                     "shrink with more ranks"),
                                    (lambda v: abs(v - 20) < 0.01, "20 = 1/f is the limit for infinitely many "
                                     "ranks; with 16, add (1 - f) / 16"),
                                    (lambda v: abs(v - 15.25) < 0.01, "that is Gustafson's scaled speed-up (the "
                                     "problem grows with N); Amdahl keeps the problem fixed")],
                      "1 / (0.05 + 0.95 / 16) = 9.14: 16 ranks at 57% efficiency; no number of ranks beats 20"),
        "9.14 = amdahl_speedup(16, 0.05) (mgpu_utils.costs.scaling)."),
    "11.3": Exercise(
        "A 1.3-billion-parameter transformer trains at 20,000 tokens per second on one A100 (312 TFLOP/s dense "
        "bf16). Using 6 N FLOPs per token, what is its MFU, in percent?",
        _float_answer(50.0, 0.01, [(lambda v: abs(v - 16.7) < 0.5, "2 N is the forward pass only: training is "
                                    "forward + backward, 6 N"),
                                   (lambda v: abs(v - 0.5) < 0.01, "that is a fraction; the answer is in percent"),
                                   (lambda v: abs(v - 33.3) < 0.5, "4 N is the backward alone: add the forward")],
                      "6 x 1.3e9 x 20,000 = 1.56e14 FLOP/s = 156 TFLOP/s, half of 312: MFU 50%"),
        "50 = 100 * 6 * 1.3e9 * 20_000 / 312e12."),
    "11.4": Exercise(
        "(optional) A run uses 64 GPUs for 72 hours at 2.50 per GPU-hour. What does it cost?",
        _float_answer(11520.0, 1e-3, [(lambda v: abs(v - 180) < 0.5, "that is one GPU's cost: multiply by 64"),
                                      (lambda v: abs(v - 4608) < 1, "the price is per hour, the run 72 hours: "
                                       "4608 is GPU-hours")],
                      "64 x 72 = 4,608 GPU-hours x 2.50 = 11,520"),
        "11520 = run_cost(64, 72, 2.50) (mgpu_utils.measure.energy)."),
    "12.1": Exercise(
        "A snapshot costs the job C = 2 minutes and the job fails on average once every M = 6 hours. By Young's "
        "formula, every how many minutes of training should it write a snapshot?",
        _float_answer(37.95, 0.01, [(lambda v: abs(v - 26.83) < 0.5, "sqrt(C M) leaves out the factor 2: sqrt(2 C M)"),
                                    (lambda v: abs(v - 1440) < 5, "2 C M is the square of the interval: take the "
                                     "square root"),
                                    (lambda v: abs(v - 0.6325) < 0.01, "that is hours; the answer is in minutes"),
                                    (lambda v: abs(v - 2277) < 10, "that is seconds; the answer is in minutes")],
                      "sqrt(2 x 2 min x 360 min) = sqrt(1440) = 37.9 minutes; the snapshots then cost 2/37.9 = 5.3% "
                      "of the time and the lost work as much again"),
        "37.95 = young_interval(120, 6 * 3600) / 60 (mgpu_utils.costs.fault)."),
    "12.2": Exercise(
        "elastic_train.py snapshots every 5 steps. Rank 1 is killed right before step index 23 (steps count from 0; "
        "the snapshot taken after 20 steps, steps 0-19, was complete). After the restart, at which step index does "
        "training resume?",
        _int_answer(20, {23: "the state of steps 20-22 was never saved: the restart goes back to the newest snapshot",
                         22: "only snapshots survive a crash, and the last one holds 20 steps (0-19)",
                         25: "a snapshot in the future does not exist yet",
                         0: "the snapshot is there to avoid exactly that",
                         "default": "the newest complete snapshot: a multiple of 5 at most 23"},
                    "20: the newest complete snapshot holds steps 0-19; steps 20, 21 and 22 are computed again "
                    "(the lost work)"),
        "20 = (23 // 5) * 5: the script reports it as resumed_from_step."),
    "12.3": Exercise(
        "A job trains on 4 nodes of 8 GPUs with a global batch of 768 samples. One node is lost; the elastic job "
        "continues on the other 3 nodes and keeps the global batch (as elastic_train.py does). How many samples "
        "does each GPU now process per step?",
        _int_answer(32, {24: "24 = 768 / 32 was the share before the loss: now fewer GPUs share the same 768",
                         256: "that is one node's share: each node has 8 GPUs",
                         192: "192 = 768 / 4 is one node's share before the loss, and each node has 8 GPUs",
                         "default": "the global batch is kept: divide it by the GPUs that are left"},
                    "32 = 768 / (3 x 8)"),
        "32 = 768 / 24: the 24 remaining GPUs share the same global batch, so each takes more (24 -> 32) and every "
        "step averages over the same 768 samples. Keeping 24 per GPU instead would shrink the global batch to 576, "
        "a different run, and by the linear scaling rule the learning rate should shrink by the same factor, 0.75."),
    "12.4": Exercise(
        "A training run needs 20 hours of training. The partition's time limit is 4 hours per job; job.sbatch asks "
        "for the signal 120 s before the limit (the snapshot is written in that time), and every run of the job "
        "spends its first 5 minutes starting (preflight, rendezvous, loading the snapshot). How many runs of the "
        "job does the training take (the job requeues itself as in section 9)?",
        _int_answer(6, {5: "5 = 20 / 4 counts every minute of a run as training: each run loses 5 minutes at the "
                           "start and 2 minutes before its limit",
                        "default": "each run trains 240 - 5 - 2 minutes; how many such runs cover 1,200 minutes?"},
                    "6 = ceil(1200 / 233)"),
        "6: each run trains 4 h - 5 min - 2 min = 233 minutes, and 20 h = 1,200 minutes; 1200 / 233 = 5.15, so a "
        "sixth run trains the last 35 minutes. The 7 minutes per run are 3% here; with a 30-minute limit they "
        "would be 23%, which is why long runs ask for the longest time limit the cluster allows."),
    "13.2": Exercise(
        "The layout dp4-tp2-pp2 on 16 ranks, in the capstone's mesh order (pp, dp, tp; tp fastest, as in "
        "section 1): which rank holds the other pipeline stage for rank 5, its partner in its pp group?",
        _int_answer(13, {4: "rank 4 is rank 5's tp partner: neighbouring ranks differ in tp, the fastest "
                            "dimension",
                         7: "rank 7 is a dp neighbour of rank 5 (dp steps by the tp size, 2)",
                         3: "rank 3 is a dp neighbour of rank 5 (dp steps by the tp size, 2)",
                         "default": "rank = (pp x 4 + dp) x 2 + tp: find rank 5's coordinates, then change pp only"},
                    "13 = (1 x 4 + 2) x 2 + 1: rank 5 is (pp 0, dp 2, tp 1), its partner (pp 1, dp 2, tp 1)"),
        "13: torch.arange(16).view(2, 4, 2) puts rank 5 at (0, 2, 1); the same (dp, tp) at pp = 1 is 8 + 5 = 13. "
        "pp steps by dp x tp = 8 ranks: the slowest dimension, so a pipeline's stages sit far apart in rank "
        "(on a cluster, on other nodes), and tp's partners next to each other (one node's NVLink)."),
    "13.3": Exercise(
        "Rank 127 of dp8-tp4-pp4 (section 5, key/value heads 4) holds 41,472 bytes of parameters on a middle "
        "stage. Under dp16-tp2-pp4 on the same 128 ranks, how many bytes does a middle-stage rank hold?",
        _int_answer(82_432, {82_944: "82,944 = 2 x 41,472 halves the tp split of the norms too: the norms are "
                                     "whole on every tp rank (2 x 64 floats per block), only the seven matrices "
                                     "are split",
                             20_736: "20,736 halves the bytes: a smaller tp splits each matrix over fewer ranks, "
                                     "so each holds more",
                             "default": "a middle stage is one block: its seven matrices (40,960 floats) over tp, "
                                        "plus its two norms whole (128 floats), 4 bytes each"},
                    "82,432 = 4 x (40,960 / 2 + 128)"),
        "82,432 bytes: the block's matrices wq, wk, wv, wo (4 x 4,096) and w1, w3, w2 (3 x 8,192) are 40,960 floats, "
        "split by tp = 2 into 20,480; its two RMSNorm weights (2 x 64) are whole on every tp rank; 20,608 x 4 "
        "bytes. Doubling tp does not halve the bytes exactly, because the replicated norms do not shrink."),
    "08.1": Exercise(
        "Ring attention on 8 ranks: each rank's block of keys K is 64 MiB (its share of the sequence, every head, "
        "bf16), and V the same. How many MiB does each rank send in one forward pass of one attention layer?",
        _int_answer(896, {448: "V travels with K: two blocks per hop",
                          1024: "8 ranks need 7 hops, not 8: a rank's own block is already there",
                          1920: "that is backward (K, V and dK, dV: 4n - 2 blocks); forward passes K and V on "
                                "n - 1 times",
                          2816: "that is forward and backward together; the question is forward only",
                          "default": "2 (n - 1) x 64 MiB: K and V, passed on n - 1 times"},
                    "2 x (8 - 1) x 64 = 896 MiB: K and V, each passed on 7 times"),
        "896 = 2 * (8 - 1) * 64 (mgpu_utils.parallel.context; context_parallel.py counts it as fwd_bytes)."),
    "08.2": Exercise(
        "The same layer with Ulysses on 8 ranks (K, and so Q, V and the output, are 64 MiB per rank): how many MiB "
        "does each rank send in forward?",
        _float_answer(224.0, 1e-3, [(lambda v: abs(v - 168) < 0.5, "three all-to-alls bring q, k, v to head "
                                     "shards; a fourth brings the output back to sequence shards"),
                                    (lambda v: abs(v - 256) < 0.5, "an all-to-all keeps 1/n of the tensor on the "
                                     "rank: it sends (n - 1)/n of it"),
                                    (lambda v: abs(v - 896) < 0.5, "that is the ring's number")],
                      "4 x 7/8 x 64 = 224 MiB: 4 all-to-alls, each sending 7/8 of a 64 MiB tensor; the ring sends "
                      "896, n/2 = 4 times more"),
        "224 = 4 * (8 - 1) / 8 * 64: q, k, v to head shards and the output back, each sending (n-1)/n."),
    "08.4": Exercise(
        "(optional) A mixture-of-experts layer with 64 experts routes each token to its top 2, with capacity factor "
        "1.25. One rank routes 4,096 tokens. How many assignments can one expert take from it (the capacity)?",
        _int_answer(160, {80: "each token makes top_k = 2 assignments: T x k / E, times the capacity factor",
                          128: "that is T x k / E, the mean load: the capacity factor leaves 25% room above it",
                          "default": "ceil(capacity_factor x T x top_k / E)"},
                    "ceil(1.25 x 4096 x 2 / 64) = 160"),
        "160 = math.ceil(1.25 * 4096 * 2 / 64): mgpu_utils.parallel.experts.route computes it as capacity."),
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
        print(wrap_text(f"[{exercise_id}] {'correct' if ok else 'not yet'}: {text}"))
    return ok


def solution(exercise_id: str) -> str:
    """The worked solution (for instructors, or after you tried). Prints it and returns it."""
    text = _get(exercise_id).solution
    print(wrap_text(f"[{exercise_id}] solution: {text}"))
    return text
