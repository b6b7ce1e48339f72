"""Exercise 06.3's grader (mgpu_utils.grading.coding.hybrid, check_two_d), round 2 of issue 55: the 2-D step
written other ways (f as a hook on z's gradient, g as a plain all-reduce, divided before the all-reduce and
zeroed in place, one flat all-reduce over dp_group, torch.optim.SGD) passes; f's all-reduce in the forward, W0's
gradient summed over tp_group in place of f and the replicated parameters averaged over every rank get the hint
that names them. Each list is graded in one launch at 3 ranks (meshes 3x1 and 1x3)."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

F_APPLY = "    z = CopyToTP.apply(z, tp_group)\n"
G_LINE = ('    y = ReduceFromTP.apply(h @ params["w2"].T, tp_group) + params["b2"]   '
          '# row parallel, then the bias once\n')
SYNC = ("            dist.all_reduce(p.grad, group=dp_group)      # the mean over the replicas of this shard\n"
        "            p.grad /= dp\n            p -= lr * p.grad\n            p.grad = None\n")
F_BACKWARD = ("        grad = grad.contiguous()\n        dist.all_reduce(grad, group=ctx.group)   "
              "# every tp rank's column slice fed on the same x\n        return grad, None\n")

RIGHT = {   # name: (text of the solution, replaced by)
    "f as a hook on z's gradient": (
        F_APPLY, "    def summed(grad):\n        grad = grad.clone()\n        dist.all_reduce(grad, group=tp_group)\n"
                 "        return grad\n    z.register_hook(summed)\n"),
    "g as a plain in-place all-reduce (autograd passes its gradient through)": (
        G_LINE, '    y = h @ params["w2"].T\n    dist.all_reduce(y, group=tp_group)\n    y = y + params["b2"]\n'),
    "divided before the all-reduce, gradients zeroed in place": (
        SYNC, "            p.grad /= dp\n            dist.all_reduce(p.grad, group=dp_group)\n"
              "            p -= lr * p.grad\n            p.grad.zero_()\n"),
    "one flat all-reduce of every gradient over dp_group": (
        "    with torch.no_grad():\n        for p in params.values():\n" + SYNC,
        "    with torch.no_grad():\n        flat = torch.cat([p.grad.reshape(-1) for p in params.values()])\n"
        "        dist.all_reduce(flat, group=dp_group)\n        flat /= dp\n        offset = 0\n"
        "        for p in params.values():\n            p -= lr * flat[offset:offset + p.numel()].view_as(p)\n"
        "            offset += p.numel()\n            p.grad = None\n"),
    "torch.optim.SGD for the update": (
        "    with torch.no_grad():\n        for p in params.values():\n" + SYNC,
        "    opt = torch.optim.SGD(params.values(), lr=lr)\n    with torch.no_grad():\n"
        "        for p in params.values():\n            dist.all_reduce(p.grad, group=dp_group)\n"
        "            p.grad /= dp\n    opt.step()\n    opt.zero_grad(set_to_none=True)\n"),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "f's all-reduce in the forward": (
        ["        return x.view_as(x)\n", F_BACKWARD],
        ["        x = x.clone()\n        dist.all_reduce(x, group=group)\n        return x\n",
         "        return grad, None\n"],
        r"mesh 1x3, dp x tp\): the loss is that of z summed over tp_group, tp = 3 times too large: f all-reduced in "
        r"the forward"),
    "W0's gradient summed over tp_group instead of f": (
        [F_APPLY, "    dp = dist.get_world_size(dp_group)\n"],
        ["", "    dist.all_reduce(params[\"w0\"].grad, group=tp_group)\n    dp = dist.get_world_size(dp_group)\n"],
        r"mesh 1x3, dp x tp\): the result is right, but there is no f: W0's gradient was all-reduced over tp_group "
        r"after the backward \(36 elements\)"),
    "replicated parameters averaged over every rank": (
        "        for p in params.values():\n" + SYNC,
        "        for name, p in params.items():\n            if name in (\"w1\", \"w2\"):         # sharded\n"
        "                dist.all_reduce(p.grad, group=dp_group)\n                p.grad /= dp\n"
        "            else:                                # replicated: over every rank\n"
        "                dist.all_reduce(p.grad)\n                p.grad /= dist.get_world_size()\n"
        "            p -= lr * p.grad\n            p.grad = None\n",
        r"mesh 1x3, dp x tp\): the result is right, but W0's or b2's gradient was averaged over every rank, "
        r"tp_group included"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("06.3", wrong(tmp_path / str(k), "06.3", old, new)))
    return out


def test_right_steps_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_steps_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"06.3": (len(RIGHT), len(WRONG))}
