"""Exercise 08.3's grader (mgpu_utils.grading.coding.context_experts, check_attention_merge), round 2 of issue 55:
the merge written other ways (torch.logaddexp, a softmax over the two lse, log1p of the smaller share, a sigmoid
weight) passes; the weights swapped, the smaller lse subtracted and the newest block's lse returned get the hint
that names them. Each list is graded in one launch at 3 ranks."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

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
