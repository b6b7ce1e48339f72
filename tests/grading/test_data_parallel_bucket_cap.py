"""Exercise 03.9's grader (design: DDP's bucket size; mgpu_utils.grading.coding.data_parallel.check_bucket_cap):
right answers written as students would (the worked solution's own timeline, two rules of thumb) pass; wrong ones
(too small, too big, DDP's default everywhere, a cap that ignores the link, bytes for MiB, the simulator asked to
choose, answers written down for the named cases, not a number) get the hint that names the mistake. The check
needs no process group and runs no timing: the files are graded in this process (launch_scripts/grade_exercise.py
runs the same check; tests/grading/test_runner.py grades the worked solution, the template and one mistake there).
"""
import importlib.util
import re
import types

from helpers import solution
from mgpu_utils.env import REPO_ROOT
from mgpu_utils.grading.coding.data_parallel import BUCKET_CASES, check_bucket_cap
from mgpu_utils.grading.runner import problem_hint

HEAD = "MIB = 2 ** 20\n\n\n"
SQRT_RULE = HEAD + '''def choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps):
    """When the link is busy for the whole backward, the step is about: the first bucket's fill time (C / k) plus
    every call's latency (k a) plus the bytes' time. C / k + k a is least at k = sqrt(C / a) equal buckets."""
    a = 2 * (n - 1) * alpha_s
    k = max(1.0, (sum(backward_s) / a) ** 0.5)
    return sum(grad_bytes) / k / MIB
'''
LATENCY_RULE = '''from mgpu_utils.costs.bandwidth import ring_allreduce_model


def choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps):
    """The smallest bucket whose latency is at most a tenth of its all-reduce: small buckets overlap best, and this
    one wastes little on latency."""
    cap = 1024
    while ring_allreduce_model(0, n, alpha_s, bandwidth_bps) > 0.1 * ring_allreduce_model(cap, n, alpha_s,
                                                                                           bandwidth_bps):
        cap *= 1.25
    return cap / 2 ** 20
'''
RIGHT = {   # name: the file's text (None: the worked solution)
    "the worked solution: its own timeline, caps 10 % apart": None,
    "k = sqrt(backward / latency) equal buckets": SQRT_RULE,
    "the smallest bucket whose latency is a tenth of its all-reduce (ring_allreduce_model)": LATENCY_RULE,
}
FN = "def choose_bucket_cap_mb(grad_bytes, backward_s, n, alpha_s, bandwidth_bps):\n"
WRONG = {   # name: (the file's text, the hint it must get)
    "too small: one all-reduce per gradient": (
        FN + "    return 0.001\n",
        r"for ResNet-50, 32 images per GPU, 32 L4 over 100 GbE your cap of 0\.001 MiB .* 4\.70x the best .* 115 "
        r"buckets for 161 gradients, about one all-reduce per gradient, .* latency 2\(n-1\) alpha = 620 us"),
    "too big: one bucket at the end of backward": (
        FN + "    return sum(grad_bytes) / 2 ** 20\n",
        r"for ResNet-50, 64 images per GPU, 8 A100 over PCIe 4\.0 your cap of 97\.5 MiB .* 1\.70x .* one bucket, "
        r"whose all-reduce \(5\.60 ms\) can only start when backward ends: none of it overlaps"),
    "a tenth of the model, whatever the link": (
        FN + "    return sum(grad_bytes) / 10 / 2 ** 20\n",
        r"for ResNet-50, 32 images per GPU, 32 L4 over 100 GbE .* 1\.16x .* stayed the same when this case's link "
        r"was made slower"),
    "the latency's share of a bucket fixed, forgetting the per-byte factor (alpha n B, 10x too small)": (
        FN + "    return alpha_s * n * bandwidth_bps / 2 ** 20\n",
        r"for ResNet-50, 32 images per GPU, 32 L4 over 100 GbE your cap of 3\.81 MiB .* 1\.49x .* Too many buckets "
        r"for this link"),
    "the worked solution's cap in bytes": (
        None, r"Read as bytes, your numbers would pass every case: bucket_cap_mb counts MiB"),
    "the simulator asked to choose": (
        "from mgpu_utils.costs.overlap import best_bucket_cap\n\n\n" + FN +
        "    return best_bucket_cap(grad_bytes, backward_s, n, alpha_s, bandwidth_bps)[0] / 2 ** 20\n",
        r"03\.9 asks you to choose: best_bucket_cap is switched off while choose_bucket_cap_mb runs"),
    "bucket_timeline through its module, to score a few caps": (
        "from mgpu_utils.costs import overlap\n\n\n" + FN +
        "    return min((1, 25, 100), key=lambda c: overlap.bucket_timeline(grad_bytes, backward_s, c * 2 ** 20, n,"
        " alpha_s, bandwidth_bps).step_s)\n",
        r"03\.9 asks you to choose: bucket_timeline is switched off"),
    "good answers written down for the four named cases, DDP's default elsewhere": (
        "ANSWERS = {(161, 8): 0.25, (161, 32): 50.0, (147, 8): 27.0, (292, 64): 96.0}\n\n\n" + FN +
        "    return ANSWERS.get((len(grad_bytes), n), 25.0)\n",
        r"for an unnamed case: a 1\.3B decoder .* your cap of 25 MiB .* 1\.47x .* stayed the same when this case's "
        r"link was made slower .* 74 all-reduce\(s\), 75\.48 ms of them latency"),
    "a string": (FN + "    return '25'\n",
                 r"for ResNet-50, 64 images per GPU, 8 A100 over PCIe 4\.0 choose_bucket_cap_mb returned '25': "
                 r"return one positive number"),
}


def _load(text, name):
    module = types.ModuleType(name)
    exec(compile(text, f"<{name}>", "exec"), module.__dict__)
    return module.choose_bucket_cap_mb


def _hint(fn):
    problems = []
    info = check_bucket_cap(fn, types.SimpleNamespace(rank=0, world_size=1), problems)
    return (problem_hint("03.9", problems[0], 1) if problems else None), info


def test_right_caps_pass():
    worked = solution("03.9").read_text()
    for name, text in RIGHT.items():
        hint, info = _hint(_load(text or worked, "right"))
        assert hint is None, (name, hint)
        assert 1.0 <= info["worst"] <= 1.10, (name, info)


def test_wrong_caps_get_their_hints():
    worked = solution("03.9").read_text()
    in_bytes = worked.replace("    return best[1] / MIB\n", "    return best[1]\n")
    assert in_bytes != worked
    for name, (text, want) in WRONG.items():
        hint, _ = _hint(_load(text or in_bytes, "wrong"))
        assert hint and re.search(want, hint), (name, hint)


def test_the_simulator_is_back_after_the_check():
    """The functions switched off while the student's code runs work again afterwards, also after it raised."""
    from mgpu_utils.costs import overlap

    hint, _ = _hint(_load(WRONG["the simulator asked to choose"][0], "cheat"))
    assert hint
    name, case = BUCKET_CASES[0]
    assert overlap.best_bucket_cap(**case)[1].step_s > 0


def test_no_fixed_size_and_no_fixed_share_passes_every_case():
    """What the template and the lesson say: every fixed cap (1 KiB to 4 GiB, 10 % apart) and every fixed share
    of the model (1/1 to 1/100) fails at least one case; so a rule must look at the case."""
    from mgpu_utils.costs.overlap import best_bucket_cap, bucket_timeline

    best = [best_bucket_cap(**case)[1].step_s * 1.10 for _, case in BUCKET_CASES]

    def passes_all(cap_of):
        return all(bucket_timeline(**case, cap_bytes=cap_of(case)).step_s <= b
                   for (_, case), b in zip(BUCKET_CASES, best))
    cap = 1024.0
    while cap < 4 * 2 ** 30:
        assert not passes_all(lambda case: cap), cap
        cap *= 1.1
    for k in range(1, 101):
        assert not passes_all(lambda case: sum(case["grad_bytes"]) / k), k


def test_the_template_names_the_graders_first_four_cases():
    """03.9's template lists the cases the grader names (named_models()), as the grader has them."""
    spec = importlib.util.spec_from_file_location("template_03_9", REPO_ROOT / "exercises" / "03_bucket_cap.py")
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    assert template.named_models() == list(BUCKET_CASES[:4])
    assert all(not name.startswith("an unnamed") for name, _ in BUCKET_CASES[:4])
    assert all(name.startswith("an unnamed case: ") for name, _ in BUCKET_CASES[4:])


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar; the worked
#: solution is counted there).
COUNTS = {"03.9": (len(RIGHT) - 1, len(WRONG))}
