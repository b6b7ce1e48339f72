"""Exercise 10.5's grader (mgpu_utils.grading.coding.case_studies, check_gan_step), round 2 of issue 55: the GAN
step written other ways (one batch through D with the loss doubled, softplus losses, D's fakes made under
no_grad, the modules' zero_grad, D frozen during G's step) passes; G's loss on detached fakes, D's loss halved,
the losses returned as tensors or in the other order (the grader now checks what each step returns) and G's
loss through D's output from before D's step get the hint that names them. Each list is graded in one launch at
3 ranks. Since a fifteenth red team (2026-12-07): the whole batch gathered and trained on the modules inside DDP,
the grader's SGD hard-coded with a made-up pair returned per rank, a step right for two calls only, and DDP bypassed
are refused; the whole batch's losses all-reduced and returned on every rank pass.

Exercise 10.7 (design, check_b_crit): three other ways to find B_crit (read off where the steps are twice the
fewest, a line through the examples, factors of 4 and a fit in log space) and the worked solution with one seed
pass; eight wrong ones (the knee where the steps stop falling, a fixed range of batches, a blind range past the
budget, the budget's error caught, runs short of the target counted, a sweep that starts too large, E_min, the
batch of the fewest examples) get the hint that names them. 10.7's check is pure numpy, the same at any world
size: its tables are graded in this process, with no launch."""
import importlib.util
import re
import types

from helpers import red_team, solution, wrong
from mgpu_utils.grading.coding.case_studies import check_b_crit
from mgpu_utils.grading.runner import grade_many, problem_hint

D_LOSS = ("    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) \\\n"
          "        + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)      "
          "# detach: G stays out of D's backward\n")
G_LOSS = "    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)             # through the updated D\n"
FAKE = "    fake = G(z)\n"
RETURN = "    return d_loss.item(), g_loss.item()\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "real and fakes through D in one batch, the loss doubled": (
        D_LOSS, "    d_loss = 2 * F.binary_cross_entropy_with_logits(D(torch.cat([real, fake.detach()])),\n"
                "                                                    torch.cat([ones, zeros]))\n"),
    "the losses written with softplus": (
        [D_LOSS, G_LOSS],
        ["    d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()\n",
         "    g_loss = F.softplus(-D(fake)).mean()\n"]),
    "D's fakes made under no_grad, G run again for its own step": (
        [FAKE, D_LOSS, G_LOSS],
        ["    with torch.no_grad():\n        fake = G(z)\n",
         D_LOSS.replace("fake.detach()", "fake"),
         "    g_loss = F.binary_cross_entropy_with_logits(D(G(z)), ones)\n"]),
    "the modules' zero_grad": (
        ["    opt_d.zero_grad(set_to_none=True)\n", "    opt_g.zero_grad(set_to_none=True)\n"],
        ["    D.zero_grad()\n", "    G.zero_grad()\n"]),
    "D frozen during G's step": (
        G_LOSS, "    D.requires_grad_(False)\n" + G_LOSS + "    D.requires_grad_(True)\n"),
    "the whole batch's losses returned on every rank (all-reduced)": (
        RETURN, "    import torch.distributed as dist\n"
                "    both = torch.tensor([d_loss.item(), g_loss.item()], dtype=torch.float64)\n"
                "    dist.all_reduce(both)\n    both /= dist.get_world_size()\n"
                "    return both[0].item(), both[1].item()\n"),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "G's loss on detached fakes": (
        G_LOSS, G_LOSS.replace("D(fake)", "D(fake.detach())"),
        r"G never changed, and no gradient reached it: G's loss must go back through G, D\(fake\), not "
        r"D\(fake.detach\(\)\)"),
    "real and fakes through D in one batch, the mean of both": (
        D_LOSS, "    d_loss = F.binary_cross_entropy_with_logits(D(torch.cat([real, fake.detach()])),\n"
                "                                                torch.cat([ones, zeros]))\n",
        r"the parameters are those of D's loss halved: the mean over real and fakes in one batch"),
    "the losses returned as tensors": (
        RETURN, "    return d_loss, g_loss\n",
        r"G and D are right, but gan_step returned \(Tensor, Tensor\): return \(d_loss, g_loss\) as Python floats"),
    "the losses returned in the other order": (RETURN, "    return g_loss.item(), d_loss.item()\n",
                                               r"G and D are right, but the losses returned are \(g_loss, d_loss\)"),
    "the whole batch gathered on every rank and trained on the modules inside DDP (a fifteenth red team's "
    "105_r15w01)": (
        None, red_team("105_r15w01"), r"your gan_step called torch.distributed's all_gather \(\d+ call\(s\) that "
                                      r"carry data\): this step moves no data of its own"),
    "the whole batch gathered with the process group's own allgather (a sixteenth red team's 105_r16w01)": (
        None, red_team("105_r16w01"), r"your gan_step called torch.distributed's \w+ \(\d+ call\(s\) that carry data\): this step moves no data of its own"),
    "DDP's sync switched off (no_sync), the whole batch gathered with a functional all-gather (105_r16w02)": (
        None, red_team("105_r16w02"), r"your gan_step called torch.distributed's \w+ \(\d+ call\(s\) that carry data\): this step moves no data of its own"),
    "trained on .module, DDP called under no_grad for show, gradients averaged with the group's own allreduce (105_r16w03)": (
        None, red_team("105_r16w03"), r"your gan_step called torch.distributed's \w+ \(\d+ call\(s\) that carry data\): this step moves no data of its own"),
    "the whole batch smuggled through G's reducer as upstream gradients of extra backwards (an eighteenth red team's 105_r18w02)": (
        None, red_team("105_r18w02"), r"rank \d: at step \d G computed on \d+ rows, where this rank's share of the batch is \d+"),
    "the whole batch broadcast with DDP's own _distributed_broadcast_coalesced (105_r18w03)": (
        None, red_team("105_r18w03"), r"your gan_step called torch.distributed's broadcast \(\d+ call\(s\) that carry data\)"),
    "the grader's SGD hard-coded, the optimizers given ignored, rank 0 returning the sum (105_r15w02)": (
        None, red_team("105_r15w02"), r"after \d steps the parameters differ from one process's by"),
    "right for two calls, G's step skipped from the third (105_r15w03)": (
        None, red_team("105_r15w03"), r"after \d steps the parameters differ from one process's by"),
    "the right step on G.module and D.module, DDP bypassed (its gradients never averaged) on the rows of every rank "
    "rebuilt from a seed": (
        ["    fake = G(z)\n"],
        ["    G, D = G.module, D.module\n    fake = G(z)\n"],
        r"parameters differ from one process's|was never called"),
    "each rank returning a made-up pair whose mean is right: rank 0 the sum, the others zeros": (
        RETURN, "    import torch.distributed as dist\n"
                "    both = torch.tensor([d_loss.item(), g_loss.item()], dtype=torch.float64)\n"
                "    dist.all_reduce(both)\n"
                "    return (both[0].item(), both[1].item()) if dist.get_rank() == 0 else (0.0, 0.0)\n",
        r"G and D are right, but at step 1 rank \d returned \([-\d.]+, [-\d.]+\), and its own rows' losses are"),
    "G's loss from D's output before D's step": (
        [D_LOSS, G_LOSS],
        [D_LOSS + "    d_fake = D(fake)\n", "    g_loss = F.binary_cross_entropy_with_logits(d_fake, ones)\n"],
        r"the step failed: one of the variables needed for gradient computation has been modified by an inplace "
        r"operation.* G's loss went back through D's output from before opt_d.step\(\)"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        if old is None:                                   # a whole file (a red team's)
            (tmp_path / str(k) / "wrong_10_gan_step.py").write_text(new)
            out.append(("10.5", tmp_path / str(k) / "wrong_10_gan_step.py"))
        else:
            out.append(("10.5", wrong(tmp_path / str(k), "10.5", old, new)))
    return out


def test_right_gan_steps_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_gan_steps_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


# 10.7 (design): whole files, as a student would write them, or the worked solution with a part replaced.
B_SWEEP = """    batches, steps = [], []
    batch, guess, flat = 1, 1000, 0
    while flat < 2:
        s = steps_at(task, batch, guess)
        if steps and s > 0.85 * steps[-1]:                # this doubling saved under 15%
            flat += 1
        batches.append(batch)
        steps.append(s)
        batch, guess = 2 * batch, int(1.2 * s) + 10       # a larger batch never needs more steps
"""
B_FIXED = "    batches = [1, 2, 4, 8, 16, 32, 64]\n    steps = [steps_at(task, b, 1000) for b in batches]\n"
B_RETURN = 'fit_critical_batch(batches, steps)["b_crit"]'
B_RERUN = """        losses = task.train(batch, max_steps, seed)
        while losses[-1] > task.target:                  # stopped short: the same run, four times longer
            max_steps *= 4
            losses = task.train(batch, max_steps, seed)
"""
B_READ_OFF = '''import math


def find_b_crit(task):
    """Read off: double the batch (one seed) until the steps stop falling; S_min ~ the fewest steps seen; B_crit is
    where the steps cross twice that, interpolated in log B."""
    batch, max_steps, rows = 1, 10_000, []
    while True:
        losses = task.train(batch, max_steps)
        if losses[-1] > task.target:
            max_steps *= 10
            continue
        rows.append((batch, len(losses)))
        if len(rows) >= 3 and rows[-1][1] > 0.9 * rows[-3][1]:
            break
        batch, max_steps = batch * 2, 2 * len(losses) + 10
    s_min = min(s for _, s in rows)
    for (b1, s1), (b2, s2) in zip(rows, rows[1:]):
        if s1 >= 2 * s_min >= s2:
            f = math.log(s1 / (2 * s_min)) / math.log(s1 / s2)
            return b1 * (b2 / b1) ** f
    return rows[0][0]
'''
B_EXAMPLES = '''import numpy as np


def steps(task, batch, seed, cap):
    while True:
        losses = task.train(batch, cap, seed)
        if losses[-1] <= task.target:
            return len(losses)
        cap *= 3


def find_b_crit(task):
    """Examples to the target, E = S B = S_min B + S_min B_crit, a straight line in B: B_crit = intercept / slope.
    Two seeds (their mean), the batch doubled until a doubling saves under 10%."""
    b, cap, B, E, last = 1, 5000, [], [], None
    while True:
        s = np.mean([steps(task, b, seed, cap) for seed in (11, 12)])
        B.append(b)
        E.append(s * b)
        if last is not None and s > 0.9 * last:
            break
        last, b, cap = s, b * 2, int(s) + 50
    slope, intercept = np.polyfit(B, E, 1, w=1 / np.array(E))
    return float(intercept / slope)
'''
B_LOG_FIT = '''import numpy as np


def median_steps(task, batch, cap, seeds=5):
    out = []
    for seed in range(seeds):
        while True:
            losses = task.train(batch, cap, seed)
            if losses[-1] <= task.target:
                out.append(len(losses))
                break
            cap *= 8
    return float(np.median(out)), cap


def find_b_crit(task):
    """Batches by factors of 4 from 1, five seeds each, until a factor of 4 saves under 10%; then S_min and B_crit
    by least squares in log S over a grid of B_crit (S_min in closed form for each)."""
    B, S, b, cap = [], [], 1, 2000
    while len(S) < 2 or S[-1] < 0.9 * S[-2]:
        s, cap = median_steps(task, b, cap)
        B.append(b)
        S.append(s)
        b, cap = 4 * b, int(s * 1.3) + 20
    B, logS = np.array(B, float), np.log(S)
    best = None
    for bc in np.geomspace(0.1, 1e6, 4000):
        shape = np.log1p(bc / B)
        log_smin = np.mean(logS - shape)
        err = np.sum((logS - shape - log_smin) ** 2)
        if best is None or err < best[0]:
            best = (err, bc)
    return float(best[1])
'''
B_CRIT_RIGHT = {   # name: the file's text, or (text of the worked solution, replaced by)
    "read off: one seed, S_min the fewest steps seen, B_crit where the steps cross twice that": B_READ_OFF,
    "a line through the examples, E = S_min B + S_min B_crit, two seeds": B_EXAMPLES,
    "factors of 4, five seeds, B_crit by least squares in log S over a grid": B_LOG_FIT,
    "the worked solution with one seed per batch": ("SEEDS = 3", "SEEDS = 1"),
}
B_CRIT_WRONG = {   # name: (the file's text, or (text of the worked solution, replaced by), the hint it must get)
    "the knee: the first batch where a doubling saved under 15%": (
        ("            flat += 1\n", "            return batch\n"),
        r"for the digits MLP of section 1 your B_crit, 128, is more than 1\.5x too high .* B_crit is not "
        r"where the steps stop falling"),
    "a fixed range of batches, 1 to 64": (
        (B_SWEEP, B_FIXED),
        r"for unnamed task 4 find_b_crit raised ValueError: the steps do not fit .* \(your sweep: \d+ run\(s\) at "
        r"batches 1 to 64, .*\)\. The sweep stopped where the steps were still falling fast"),
    "a blind range of batches, 1 to 65,536": (
        (B_SWEEP, B_FIXED.replace("[1, 2, 4, 8, 16, 32, 64]", "[4 ** k for k in range(9)]")),
        r"for the digits MLP of section 1 your sweep asked for [\d,]+ examples, over the task's budget of "
        r"900,000 \(task\.budget; .*\)\. Far above B_crit a larger batch saves few steps"),
    "the budget's error caught, the sweep cut short": (
        (B_SWEEP, "    batches, steps = [4 ** k for k in range(9)], []\n    for b in batches:\n        try:\n"
                  "            steps.append(steps_at(task, b, 1000))\n        except Exception:\n"
                  "            batches = batches[:len(steps)]\n            break\n"),
        r"for the digits MLP of section 1 your sweep asked for [\d,]+ examples, over the task's budget"),
    "runs short of the target counted as steps": (
        (B_RERUN, "        losses = task.train(batch, 20_000, seed)\n"),
        r"for a small language model your B_crit, .* is more than 1\.5x off, and at batch\(es\) \[1, 2, 4\] no run "
        r"reached task\.target within its max_steps"),
    "a sweep that starts at 64": (
        ("batch, guess, flat = 1, 1000, 0", "batch, guess, flat = 64, 1000, 0"),
        r"for the digits MLP of section 1 your B_crit, [\d.]+, is more than 1\.5x off, and your sweep "
        r"\(\d+ run\(s\) at batches 64 to 256, .*\) started where a doubling of the batch already saves little"),
    "E_min returned": (
        (B_RETURN, 'fit_critical_batch(batches, steps)["e_min"]'),
        r"for the digits MLP of section 1 you returned 8\d\d\.\d, this task's S_min x B_crit"),
    "the batch of the fewest examples": (
        (B_RETURN, "min(batches, key=lambda b: b * steps[batches.index(b)])"),
        r"for the digits MLP of section 1 your B_crit, 2, is more than 1\.5x too low"),
}


def _b_crit_hint(tmp_path, k, text):
    """10.7 graded in this process: None when ``text`` passes, else its hint."""
    if isinstance(text, tuple):
        old, new = text
        text = solution("10.7").read_text()
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"b{k}_10_find_b_crit.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"b_crit_{k}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    problems = []
    check_b_crit(module.find_b_crit, types.SimpleNamespace(rank=0, world_size=1), problems)
    return problem_hint("10.7", problems[0], 1) if problems else None


def test_right_b_crit_sweeps_pass(tmp_path):
    hints = {name: _b_crit_hint(tmp_path, k, text) for k, (name, text) in enumerate(B_CRIT_RIGHT.items())}
    assert hints == dict.fromkeys(B_CRIT_RIGHT), hints


def test_wrong_b_crit_sweeps_get_their_hints(tmp_path):
    for k, (name, (text, want)) in enumerate(B_CRIT_WRONG.items()):
        hint = _b_crit_hint(tmp_path, k, text)
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"10.5": (len(RIGHT), len(WRONG)), "10.7": (len(B_CRIT_RIGHT), len(B_CRIT_WRONG))}


def test_a_sweep_task_is_deterministic_follows_s_of_b_and_refuses_bad_runs():
    """10.7's simulated task: the same run twice and a longer run give the same losses; the median steps over
    seeds follow S(B) = S_min (1 + B_crit / B) within 10%; bad arguments and a run past the budget are refused
    with a message, and a refused run costs nothing."""
    import numpy as np
    import pytest

    from mgpu_utils.costs.scaling import critical_batch_steps
    from mgpu_utils.grading.coding.case_studies import MAX_STEPS, SWEEP_TASKS, BudgetSpent, SweepTask

    name, s_min, b_crit, seed, budget = SWEEP_TASKS[0]
    task = SweepTask(name, s_min, b_crit, seed, budget_e_min=budget)
    short, again, longer = task.train(8, 20, 1), task.train(8, 20, 1), task.train(8, 10_000, 1)
    assert np.array_equal(short, again) and np.array_equal(longer[:20], short)
    assert short[-1] > task.target >= longer[-1] and task.runs[0] == (8, 1, 20, False)
    for batch in (1, 20, 400):
        steps = np.median([len(task.train(batch, 100_000, s)) for s in range(5)])
        assert abs(steps / critical_batch_steps(batch, s_min, b_crit) - 1) < 0.1, (batch, steps)
    for bad, match in (((0, 10), "batch must be at least 1"), ((2.5, 10), "batch must be a whole number"),
                       ((8, MAX_STEPS + 1), "max_steps must be at most"), ((8, 10, -1), "seed must be at least 0")):
        with pytest.raises(ValueError, match=match):
            task.train(*bad)
    spent = task.spent
    with pytest.raises(BudgetSpent, match=r"over its budget of 900,000 \(task.budget\)"):
        task.train(100_000, 1000)
    assert task.spent == spent and task.asked > task.budget
