"""Exercise 13.1's grader (mgpu_utils.grading.coding.capstone, check_sync_gradients): the gradient sync written
other ways (one flat buffer per group, the experts filtered out of the ep list, divided before the sums) passes;
each way of getting the experts, the router or the division wrong gets the hint that names it from the matrix.
Each list is graded in one launch at 4 ranks (dp, cp, ep alone and in pairs)."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

SKIP = ('            if dim == "ep" and ".experts." in name:    # the all-to-all\'s backward summed it over ep '
        'already\n                continue\n')
REDUCE = "            dist.all_reduce(p.grad, group=group)\n"
DIVIDE = "        p.grad /= replicas\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "one flat buffer per group": (
        ["import torch.distributed as dist\n", SKIP + REDUCE],
        ["import torch\nimport torch.distributed as dist\n",
         "            pass\n"
         '        grads = [p.grad for name, p in params if not (dim == "ep" and ".experts." in name)]\n'
         "        flat = torch.cat([g.reshape(-1) for g in grads])\n"
         "        dist.all_reduce(flat, group=group)\n"
         "        for g, new in zip(grads, flat.split([g.numel() for g in grads])):\n"
         "            g.copy_(new.view_as(g))\n"]),
    "the experts filtered out of the ep list": (
        ["        for name, p in params:\n" + SKIP],
        ['        mine = [(n, p) for n, p in params if dim != "ep" or "experts" not in n.split(".")]\n'
         "        for name, p in mine:\n"]),
    "divided before the sums": (
        ["    replicas = 1\n", DIVIDE],
        ["    replicas = 1\n    for group in groups.values():\n        replicas *= dist.get_world_size(group)\n"
         "    for name, p in params:\n        p.grad.div_(replicas)\n", "        pass\n"]),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 4 ranks)
    "every parameter left out of the sum over ep": (
        SKIP, '            if dim == "ep":\n                continue\n',
        r"Under ep \(ep4\) \S+ differs: the ep ranks hold different rows and the same router, "
        r"attention and norms"),
    "the router left out of the sum over ep with the experts": (
        '".experts." in name', '"moe" in name',
        r"Under ep \(ep4\) layers\.\d\.feed_forward\.moe\.gate\.weight differs: .* sum every parameter but the "
        r"experts over the ep group too"),
    "the experts left out of every sum": (
        'dim == "ep" and ".experts." in name', '".experts." in name',
        r"Under dp4 \(no ep\) the expert layers\.\d\.feed_forward\.moe\.experts\.\d\.\S+ differs: .* needs the sum "
        r"over dp and cp like any other"),
    "the experts not divided by ep": (
        DIVIDE,
        '        p.grad /= replicas // (groups["ep"].size() if "ep" in groups and ".experts." in name else 1)\n',
        r"Under ep the experts' gradients are ep times one process's: right to leave them out of the sum over ep"),
    "the experts divided by ep once more": (
        DIVIDE, '        p.grad /= replicas * (groups["ep"].size() if "ep" in groups and ".experts." in name else 1)\n',
        r"Under ep the experts' gradients are 1/ep of one process's"),
    "summed, never divided": (
        DIVIDE, "        pass\n",
        r"Every failing gradient is dp x ep x cp times one process's: .* divide the sum by the number of replicas"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("13.1", wrong(tmp_path / str(k), "13.1", old, new)))
    return out


def test_right_syncs_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 4)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_syncs_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 4)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"13.1": (len(RIGHT), len(WRONG))}
