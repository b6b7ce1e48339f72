"""Hints that name the mistake made, not another one (issue 55, hole 7): each wrong solution below once got a
hint about something else (in brackets)."""
import re

from helpers import solution, wrong
from mgpu_utils.grading.runner import EXERCISES_DIR, grade, grade_many

REDUCE = "        dist.all_reduce(p.grad)          # sum over the ranks (dist.ReduceOp.AVG on NCCL does both at once)\n"
WAIT_COPY = ("            work.wait()\n            flat /= self.world\n            offset = 0\n            for p in params:\n"
             "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
             "                offset += p.numel()\n")
COPY_WAIT = ("            flat /= self.world\n            offset = 0\n            for p in params:\n"
             "                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n"
             "                offset += p.numel()\n            work.wait()\n")


def test_hints_name_the_mistake(tmp_path, starts_processes):
    cases = {   # name: (exercise, file, the hint it must get at 2 ranks)
        "03.4 divided, never all-reduced ['pass p.grad itself, not a copy']": (
            "03.4", (REDUCE, ""), r"this rank's own divided by 2, and no all-reduce ran"),
        "03.7 copied back before wait() ['pass p.grad itself, not a copy']": (
            "03.7", (WAIT_COPY, COPY_WAIT), r"the all-reduced values never reached p.grad.* wait for each handle first"),
        "04.4 untouched template [a difference of 5.57e+37, uninitialised memory]": (
            "04.4", None, r"the entry for rank 1 was never written \(world size 2, length 1\)"),
    }
    files = []
    for k, (name, (exercise_id, change, _)) in enumerate(cases.items()):
        (tmp_path / str(k)).mkdir()
        files.append((exercise_id, wrong(tmp_path / str(k), exercise_id, *change) if change
                      else EXERCISES_DIR / "04_ring_all_gather.py"))
    for (name, (*_, want)), hint in zip(cases.items(), grade_many(files, 2)):
        assert hint and re.search(want, hint), (name, hint)


def test_a_collective_on_rank_0_only_is_named_a_mismatch(tmp_path, starts_processes):
    """[rank 0 killed by signal SIGABRT without a Python traceback]"""
    path = wrong(tmp_path, "03.4", REDUCE, "        if dist.get_rank() == 0:\n            dist.all_reduce(p.grad)\n")
    passed, hint = grade("03.4", path, world_sizes=(2,))
    assert not passed and re.search(r"the ranks' collectives did not match \(gloo: .*collective mismatch", hint), hint


def test_an_endless_loop_is_not_called_a_hang_in_a_collective(tmp_path, monkeypatch, starts_processes):
    """[after 126 s: the job hung in a collective]: the ranks print their stacks 5 s before the limit."""
    import mgpu_utils.grading.runner as runner

    monkeypatch.setattr(runner, "GRADE_TIMEOUT_S", 20)
    path = wrong(tmp_path, "03.4", "    world = dist.get_world_size()\n",
                 "    world = dist.get_world_size()\n    while world > 0:\n        world = world * 1\n")
    passed, hint = grade("03.4", path, world_sizes=(2,))
    assert not passed and re.search(r"ran past 20 s, and no rank was waiting in a collective .* rank 0 at line \d+ "
                                    r"\(average_gradients\): (while world > 0:|world = world \* 1).* A loop that never ends\?", hint), hint
    assert solution("03.4").is_file()


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"03.4": (0, 3), "03.7": (0, 1), "04.4": (0, 0)}
