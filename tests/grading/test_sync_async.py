"""Exercise 09.4's grader (mgpu_utils.grading.coding.sync_async, check_local_sgd), round 2 of issue 55: local SGD
written other ways (one flat all-reduce, an all-gather and a mean, divided before the sum, torch's
PeriodicModelAverager counted right) passes; a step count kept in a module-level global (another instance's
step counts too), gradients averaged instead of parameters and torch's PeriodicModelAverager left to average at
its first call get the hint that names them. Each list is graded in one launch at 3 ranks."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

AVERAGE = ("        world = dist.get_world_size()\n        for p in self.model.parameters():\n"
           "            dist.all_reduce(p)                            # the sum over the ranks, in place\n"
           "            p /= world\n")
COUNT = ("        self.steps += 1\n        if self.steps % self.period:                      "
         "# not an averaging step: no communication at all\n            return\n")
INIT = "        self.steps = 0                                    # optimizer steps taken so far\n"
AVERAGER = ("from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager\n\n\n"
            "class PeriodicAveraging:\n    def __init__(self, model, period):\n        self.model = model\n")
AVERAGED = "\n    def after_step(self):\n        self.averager.average_parameters(self.model.parameters())\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "one all-reduce of the flattened parameters": (
        AVERAGE, "        flat = torch.nn.utils.parameters_to_vector(self.model.parameters())\n"
                 "        dist.all_reduce(flat, op=dist.ReduceOp.SUM)\n"
                 "        flat /= dist.get_world_size()\n"
                 "        torch.nn.utils.vector_to_parameters(flat, self.model.parameters())\n"),
    "an all-gather into a list, then the mean": (
        AVERAGE, "        for p in self.model.parameters():\n"
                 "            parts = [torch.empty_like(p) for _ in range(dist.get_world_size())]\n"
                 "            dist.all_gather(parts, p)\n            p.copy_(torch.stack(parts).mean(0))\n"),
    "divided first, then summed": (
        AVERAGE, "        for p in self.model.parameters():\n            p.div_(dist.get_world_size())\n"
                 "            dist.all_reduce(p, op=dist.ReduceOp.SUM)\n"),
    "torch's PeriodicModelAverager, its warm-up period - 1 steps": (
        None, "import torch\n" + AVERAGER + "        self.averager = PeriodicModelAverager(period, "
                                            "warmup_steps=period - 1)\n" + AVERAGED),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "the step count in a module-level global": (
        ["class PeriodicAveraging:", INIT, COUNT],
        ["_STEPS = 0\n\n\nclass PeriodicAveraging:", "",
         "        global _STEPS\n        _STEPS += 1\n        if _STEPS % self.period:\n            return\n"],
        r"communicated after steps \[2, 5\], one step early, as if the step that another PeriodicAveraging took "
        r".* keep the step count in the object"),
    "the gradients averaged, not the parameters": (
        AVERAGE, "        for p in self.model.parameters():\n            dist.all_reduce(p.grad)\n"
                 "            p.grad /= dist.get_world_size()\n",
        r"after step 3 the parameters are still this rank's own, and their gradients changed: local SGD averages "
        r"the parameters themselves"),
    "torch's PeriodicModelAverager as it comes": (
        None, "import torch\n" + AVERAGER + "        self.averager = PeriodicModelAverager(period)\n" + AVERAGED,
        r"communicated after steps \[1, 4, 7\]; with period 3 they average after steps \[3, 6\] only \(count the "
        r"steps from 1"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        folder = tmp_path / str(k)
        folder.mkdir()
        if old is None:
            path = folder / "09_local_sgd.py"
            path.write_text(new)
            out.append(("09.4", path))
        else:
            out.append(("09.4", wrong(folder, "09.4", old, new)))
    return out


def test_right_local_sgd_passes(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_local_sgd_gets_its_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"09.4": (len(RIGHT), len(WRONG))}
