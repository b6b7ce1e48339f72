"""Exercise 08.3's grader (mgpu_utils.grading.coding.context_experts, check_attention_merge), round 2 of issue 55:
the merge written other ways (torch.logaddexp, a softmax over the two lse, log1p of the smaller share, a sigmoid
weight) passes; the weights swapped, the smaller lse subtracted and the newest block's lse returned get the hint
that names them. Each list is graded in one launch at 3 ranks."""
import re

import torch
from torch.testing import assert_close

from helpers import solution_module, wrong
from mgpu_utils.grading.runner import grade_many
from mgpu_utils.parallel.context import merge

BIG = "    big = torch.maximum(lse1, lse2)                              # exp(lse - big) <= 1: no overflow\n"
LSE = "    lse = big + torch.log(torch.exp(lse1 - big) + torch.exp(lse2 - big))\n"
OUT = "    out = out1 * torch.exp(lse1 - lse)[..., None] + out2 * torch.exp(lse2 - lse)[..., None]\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "torch.logaddexp": ([BIG, LSE], ["", "    lse = torch.logaddexp(lse1, lse2)\n"]),
    "a softmax over the two lse": (
        [BIG, LSE, OUT],
        ["    both = torch.stack([lse1, lse2])\n", "    lse = torch.logsumexp(both, 0)\n",
         "    w = torch.softmax(both, 0).unsqueeze(-1)\n    out = w[0] * out1 + w[1] * out2\n"]),
    "log1p of the smaller share, unsqueeze for the weights": (
        [LSE, OUT],
        ["    lse = big + torch.log1p(torch.exp(-(lse1 - lse2).abs()))\n",
         "    out = out1 * (lse1 - lse).exp().unsqueeze(-1) + out2 * (lse2 - lse).exp().unsqueeze(-1)\n"]),
    "a sigmoid weight": (
        [BIG, LSE, OUT],
        ["", "    lse = torch.logaddexp(lse1, lse2)\n",
         "    w1 = torch.sigmoid(lse1 - lse2)[..., None]\n    out = w1 * out1 + (1 - w1) * out2\n"]),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "the weights swapped": (
        OUT, "    out = out1 * torch.exp(lse2 - lse)[..., None] + out2 * torch.exp(lse1 - lse)[..., None]\n",
        r"the output weights out1 by exp\(lse2 - lse\) and out2 by exp\(lse1 - lse\): the weights are swapped"),
    "the smaller lse subtracted": (BIG, "    big = torch.minimum(lse1, lse2)\n",
                                   r"inf or nan when the scores are large \(here up to \d+\).* Subtract the larger of "
                                   r"lse1 and lse2"),
    "the newest block's lse returned": ("    return out, lse\n", "    return out, lse2\n",
                                         r"the output is right, but the lse returned is lse2, not log\(exp\(lse1\) "
                                         r"\+ exp\(lse2\)\)"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("08.3", wrong(tmp_path / str(k), "08.3", old, new)))
    return out


def test_right_merges_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_merges_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"08.3": (len(RIGHT), len(WRONG))}


def test_the_library_merge_is_the_worked_solution_written_another_way():
    """Lesson 08 merges with context.merge (a sigmoid share and torch.lerp) until the student's 08.3 passes; the
    worked solution subtracts the larger lse. A class copy keeps the first only: they must agree, at ordinary and
    large scores (exp overflows float32 past 88), from the empty start, and for two empty parts."""
    theirs = solution_module("08.3").merge
    torch.manual_seed(0)
    empty = (torch.zeros(2, 3, 5, 4), torch.full((2, 3, 5), float("-inf")))
    for scale in (1.0, 50.0, 2000.0):
        part1 = (torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5) * scale)
        part2 = (torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5) * scale)
        for a, b in ((part1, part2), (empty, part2), (part1, empty)):
            ours, want = merge(*a, *b), theirs(*a, *b)
            assert_close(ours[0], want[0]) and assert_close(ours[1], want[1])
    out, lse = merge(*empty, *empty)
    assert torch.equal(out, empty[0]) and torch.equal(lse, empty[1])

