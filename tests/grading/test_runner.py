"""Coding exercises (mgpu_utils.grading.runner): the worked solution passes the grader under torchrun at every world size
the exercise uses, the untouched template fails with the hint meant for it, and a typical wrong solution gets its
specific hint. Function-style exercises are graded several to a launch (grade_many); check_script itself is
run end to end for each mode."""
import re

import pytest

from mgpu_utils.grading.catalog import EXERCISES
from mgpu_utils.grading.runner import EXERCISES_DIR, check_script, exercise_file, grade_many
from helpers import solution, wrong

FUNCTIONS = sorted(i for i, g in EXERCISES.items() if g.entry)

TEMPLATE_HINTS = {
    "03.4": r"is still this rank's own .* all-reduce it",
    "03.5": r"is still this rank's own .* all-reduce it",
    "03.6": r"is still this rank's own .* all-reduce it",
    "04.4": r"rank \d: the entry for rank \d",
    "04.5": r"returned its own share of chunk \d, unchanged",
    "05.4": r"rank 0 holds 5 micro-batches' activations at once .* at most min\(p - r, m\) = 2",
    "07.4": r"only \d+% of the parameters that Adam updates moved .* gather every slice on every rank",
    "09.4": r"the ranks never communicated: after steps \[3, 6\]",
    "10.5": r"neither G nor D changed in \d steps",
    "10.7": r"for the digits MLP of section 1 find_b_crit returned None: return the critical batch size",
    "08.3": r"returned out1 and lse1 unchanged",
    "06.3": r"mesh 2x1, dp x tp\): after step 1 the gradients are those of this rank's rows only",
    "06.4": r"for GPT-3 175B on 1024 A100, batch 1536 the layout dp=1024 tp=1 pp=1 is not feasible",
    "12.5": r"those of a snapshot without the optimizer's state, the scheduler's and every rank's random state",
    "11.5": r"rank \d: sync\(\) was called 0 time\(s\) for 8 timed steps: the median needs each step's own time",
    "07.5": r"with SGD with momentum, no parameter moved in 3 steps",
    "03.7": r"after your wrapper was built the ranks' weights still differed",
    "03.9": r"for ResNet-50, 64 images per GPU, 8 A100 over PCIe 4\.0 your cap of 25 MiB .* You return 25 MiB for "
            r"every model and link",
    "13.1": r"the matrix at 2 ranks: dp2 equal; cp2 equal; ep2 layers\.\d\.feed_forward\.moe\.experts\.\d\.\S+ off by "
            r".* Only the layouts with ep fail, and there only the experts' weights",
    "07.6": r"\(MLP\): your wrapper's parameters\(\) hold 1,810 elements, the whole model 1,810: keep only .* at most 907",
}

SYNC_START = "        sync()                                   # the clock starts when the queue is empty ...\n"  # 11.5
SYNC_END = "        sync()                                   # ... and stops when this step's work is done\n"
MFU = '"mfu": flops / step_s / peak_flops'

MISTAKES = {   # exercise: (text of the solution, replaced by, the hint it must get at world size 3)
    "03.4": ("p.grad /= world", "pass", r"is 3 times DDP's .* divide by the world size"),
    "03.5": (["self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))", "            work.wait()"],
             ["self.pending.append((p, None))", "            dist.all_reduce(p.grad)"],
             r"6 all-reduce call\(s\) for 6 parameters, 0 of them started inside backward"),
    "03.6": ("if sum(q.grad.numel() * q.grad.element_size() for q in self.bucket) >= self.bucket_bytes:", "if True:",
             r"6 all-reduce call\(s\); the rule gives 2 for gradients of \[40, 1280, 128, 4096, 128, 8192\] bytes"),
    "04.4": ("send_index = (rank - step) % world", "send_index = rank", r"the entry for rank \d holds rank \d's tensor"),
    "04.5": ("chunks[recv_index] += incoming", "chunks[recv_index] = incoming.clone()",
             r"returned rank \d's share of chunk \d alone .* replaced on the way, not added to"),
    "05.4": ("warmup = min(p - r - 1, m)", "warmup = min(p - r, m)", r"rank 0 holds 4 micro-batches.* = 3: start"),
    "07.4": ("        reduce_scatter_single(g, grads)\n        g /= self.world",
             "        g.copy_(grads[self.rank * self.size:(self.rank + 1) * self.size])", r"is g the mean over the ranks"),
    "09.4": ("            p /= world\n", "", r"after step 3 the parameters are the sum over the ranks, 3 times the mean"),
    "10.5": ("D(fake.detach())", "D(fake)", r"the step failed: .* Keep the fakes out of D's backward"),
    "10.7": ('fit_critical_batch(batches, steps)["b_crit"]', 'fit_critical_batch(batches, steps)["s_min"]',
             r"for the digits MLP of section 1 you returned 4\d\.\d+, this task's S_min"),
    "08.3": ("    big = torch.maximum(lse1, lse2)", "    big = torch.zeros_like(lse1)",
             r"inf or nan when the scores are large .* Subtract the larger of lse1 and lse2"),
    "06.3": ("            p.grad /= dp\n", "", r"mesh 3x1, .* the sum over dp_group, dp = 3 times the mean"),
    "06.4": ("            if memory.total > cluster.memory_bytes:\n                continue\n", "",
             r"for an unnamed job: 13B on one node of 8 A100, batch 256 the layout dp=8 tp=1 pp=1 .* does not fit: "
             r"needs [0-9.]+ GB per GPU > 80 GB"),
    "12.5": (['"optimizer": opt.state_dict(), ', '    opt.load_state_dict(state["optimizer"])\n'], ["", ""],
             r"those of a snapshot without the optimizer's state\."),
    "11.5": ([SYNC_START, SYNC_END], ["", ""], r"ms per step, less than a step takes \(30 ms on the host, then 40 ms"),
    "07.5": ("            all_gather_single(full, shard.detach())        # every rank's updated chunk, on every rank\n",
             "            full = torch.cat([p.detach().reshape(-1), p.new_zeros(size * self.world - p.numel())])\n"
             "            full[self.rank * size:(self.rank + 1) * size] = shard.detach()\n",
             r"with SGD with momentum, only 3\d% of the parameters .* moved .* gather every slice on every rank"),
    "03.7": ("            flat /= self.world\n", "", r"is 3 times DDP's .* divide by the world size"),
    "03.9": ("        return 2 * (n - 1) * alpha_s + ", "        return ",     # the latency left out of the timeline
             r"32 L4 over 100 GbE your cap of .* about one all-reduce per gradient"),
    "13.1": ('dim == "ep" and ".experts." in name', 'dim != "cp" and ".experts." in name',
             r"Under dp3 \(no ep\) the expert layers\.\d\.feed_forward\.moe\.experts\.\d\.\S+ differs"),
    # torch < 2.13 has all_gather_into_tensor where 2.13 has all_gather_single (mgpu_utils.compat)
    "07.6": ("        reduce_scatter_single(out, flat)  ",
             "        out = flat.view(ctx.world, -1)[dist.get_rank()].clone()  ",
             r"\(MLP, float32\): step 1 called \['all_gather_(single|into_tensor)'\]; a ZeRO-3 step all-gathers"),
}


GAN_D_BLOCK = ("    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) \\\n"
               "        + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)      "
               "# detach: G stays out of D's backward\n"
               "    opt_d.zero_grad(set_to_none=True)\n    d_loss.backward()\n    opt_d.step()\n")
GAN_G_BLOCK = ("    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)             # through the updated D\n"
               "    opt_g.zero_grad(set_to_none=True)\n    g_loss.backward()\n    opt_g.step()\n")

MERGE_LSE = "    lse = big + torch.log(torch.exp(lse1 - big) + torch.exp(lse2 - big))\n"
MERGE_OUT = "    out = out1 * torch.exp(lse1 - lse)[..., None] + out2 * torch.exp(lse2 - lse)[..., None]\n"

TWO_D_G = 'ReduceFromTP.apply(h @ params["w2"].T, tp_group)'   # 06.3's g in the solution

MORE_MISTAKES = {   # name: (exercise, text of the solution, replaced by, the hint it must get at world size 3)
    "11.5 no warm-up": ("11.5", "    for _ in range(warmup):                      "
                                "# lazy initialisation, autotuning, allocator: not timed\n        step()\n", "",
                        r"step\(\) ran 9 time\(s\) for 2 warm-up and 8 timed steps: run the warm-up steps"),
    "11.5 one sync for all the timed steps": (
        "11.5", ["    times = []\n    for _ in range(repeats):\n" + SYNC_START + "        t0 = time.perf_counter()\n"
                 "        step()\n" + SYNC_END + "        times.append(time.perf_counter() - t0)\n"],
        ["    sync()\n    t0 = time.perf_counter()\n    for _ in range(repeats):\n        step()\n"
         "    sync()\n    times = [(time.perf_counter() - t0) / repeats]\n"],
        r"sync\(\) was called \d time\(s\) for 8 timed steps: the median needs each step's own time"),
    "12.5 snapshot copied onto the path": ("12.5", ["import os\n", "        os.replace(tmp, path)  "],
                                           ["import os\nimport shutil\n", "        shutil.copy(tmp, path)  "],
                                           r"halfway through writing the second snapshot, the path no longer held"),
    "03.7 buckets sent in finish()": (
        "03.7", ["self.bucket, self.pending = [], []", "            self.send()\n\n    def send",
                 "        if self.bucket:\n            self.send()\n"],
        ["self.bucket, self.pending, self.closed = [], [], []",
         "            self.closed.append(self.bucket)\n            self.bucket = []\n\n    def send",
         "        for b in self.closed:\n            self.bucket = b\n            self.send()\n        self.closed = []\n"
         "        if self.bucket:\n            self.send()\n"],
        r"3 bucket\(s\) of 1448 bytes fill up during backward, but 0 all-reduce\(s\) started there"),
    "03.7 without the broadcast": ("03.7", "                dist.broadcast(t, src=0)  ", "                pass  ",
                                   r"the ranks' weights still differed .* DDP broadcasts rank 0's parameters"),
    "03.7 hooks per module, a tied weight twice": (
        "03.7", "        for p in module.parameters():",
        "        for p in (q for m in module.modules() for q in m.parameters(recurse=False)):",
        r"3 all-reduce call\(s\); the rule gives 2 .* \(on a model that uses one weight twice"),
    "03.7 buffers left out of the broadcast": ("03.7", "list(module.parameters()) + list(module.buffers())",
                                               "list(module.parameters())",
                                               r"the ranks' weights still differed .* \(and buffers\)"),
    "03.7 never waited": ("03.7", "            work.wait()\n", "", r"3 of the 3 asynchronous all-reduces were never"),
    "03.7 the open bucket forgotten": ("03.7", "        if self.bucket:\n            self.send()\n", "",
                                       r"is still this rank's own .* all-reduce it"),
    "07.6 all-reduce, then a slice": ("07.6", "        reduce_scatter_single(out, flat)  ",
                                      "        dist.all_reduce(flat); out = flat.view(ctx.world, -1)[dist.get_rank()]  ",
                                      r"\(MLP, float32\): step 1 all-reduced \(4 call\(s\)\); ZeRO-3 reduce-scatters"),
    "07.6 gathered parameters kept": ("07.6", "        return torch.func.functional_call(",
                                      "        self.kept = full\n        return torch.func.functional_call(",
                                      r"\(MLP, float32\): after step 1 your wrapper holds [\d,]+ bytes besides its "
                                      r"shards, .*not in an attribute"),
    "07.6 full parameters kept": ("07.6", "            p.data = torch.empty(0)  ", "            pass  ",
                                  r"\(MLP, float32\): after step 1 your wrapper holds 7,240 bytes besides its shards"),
    "07.6 compute dtype ignored": ("07.6", ["dtype = self.compute_dtype or torch.float32",
                                            "        if self.compute_dtype is not None and x.is_floating_point():\n"
                                            "            x = x.to(self.compute_dtype)\n"], ["dtype = torch.float32", ""],
                                   r"\(MLP\): with compute_dtype=bfloat16 the Linear layers saw weights of "
                                   r"\['torch.float32'\]"),
    "07.6 shards in the compute dtype": ("07.6", "flat[rank * size:(rank + 1) * size].clone()",
                                         "flat[rank * size:(rank + 1) * size].clone().to(compute_dtype or torch.float32)",
                                         r"\(MLP, compute dtype bfloat16\): the shards are torch.bfloat16"),
    "07.6 a shard that is a view of the whole parameter": (
        "07.6", "torch.nn.Parameter(flat[rank * size:(rank + 1) * size].clone())",
        "torch.nn.Parameter(flat[rank * size:(rank + 1) * size])",
        r"\(MLP, float32\): after step 1 your wrapper holds [\d,]+ bytes besides its shards"),
    "07.6 gradients summed": ("07.6", "return out / ctx.world, None, None", "return out, None, None",
                              r"\(MLP, float32\): after 3 steps the model is one process's trained on the sum"),
    "07.5 gradients summed": ("07.5", "shard.grad = g / self.world", "shard.grad = g",
                              r"with SGD with momentum, after 3 steps the parameters differ .* the mean over"),
    "07.5 keyword arguments lost": ("07.5", "optimizer_class(inner_groups, **defaults)",
                                    "optimizer_class(inner_groups, lr=defaults['lr'])",
                                    r"does the inner optimizer get every keyword argument"),
    "synchronised at the start of each step only": ("11.5", SYNC_END, "",
                                     r"less than a step takes \(30 ms on the host, then 40 ms of queued work or "
                                     r"more\): the clock was read before"),
    "warm-up in the mean": ("11.5", ["    for _ in range(warmup):                      "
                                     "# lazy initialisation, autotuning, allocator: not timed\n        step()\n",
                                     "statistics.median(times)"], ["", "statistics.mean(times)"],
                            r"far above the median of the timed steps \(\d+ ms\): the first step, 0.8 s"),
    "two steps counted": ("11.5", "        step()                                   # one more step, counted (not timed)\n",
                          "        step()\n        step()\n", r"FLOPs, the count of 2 steps .* count one step"),
    "MFU in percent": ("11.5", MFU, '"mfu": 100 * flops / step_s / peak_flops', r"is a percentage; return the fraction"),
    "MFU times the world size": ("11.5", MFU, '"mfu": flops * __import__("torch").distributed.get_world_size() '
                                              '/ step_s / peak_flops', r"is 3 times flops / step_s / peak_flops"),
    "snapshot without the scheduler": ("12.5", ['"scheduler": sched.state_dict(),\n                 ',
                                                '    sched.load_state_dict(state["scheduler"])\n'], ["", ""],
                                       r"those of a snapshot without the scheduler's\."),
    "rank 0's random state on every rank": ("12.5", 'state["rng"][dist.get_rank()]', 'state["rng"][0]',
                                            r"every rank restoring rank 0's random state"),
    "snapshot written in place": ("12.5", ['        tmp = f"{path}.tmp"\n', "        os.replace(tmp, path)  "],
                                  ["        tmp = path\n", "        pass  "],
                                  r"halfway through writing the second snapshot, the path no longer held the first"),
    "every rank writes": ("12.5", ["    if dist.get_rank() == 0:\n", 'tmp = f"{path}.tmp"'],
                          ["    if True:\n", 'tmp = f"{path}.tmp{dist.get_rank()}"'],
                          r"ranks \[1, 2\] wrote files too: only rank 0 writes"),
    "resume one step late": ("12.5", '    return state["step"]', '    return state["step"] + 1',
                             r"those of a resume one step late"),
    "f left out": ("06.3", "    z = CopyToTP.apply(z, tp_group)\n", "",
                   r"mesh 1x3, .* W0's gradient is only the part that flows through this rank's hidden units"),
    "g from torch.distributed.nn": ("06.3", ["import torch.nn.functional as F\n", TWO_D_G],
                                    ["import torch.nn.functional as F\nimport torch.distributed.nn.functional as dnn\n",
                                     'dnn.all_reduce(h @ params["w2"].T, group=tp_group)'],
                                    r"mesh 1x3, .* W0, W1 and W2 are tp = 3 times too large: g's backward is "
                                    r"the identity"),
    "g left out": ("06.3", TWO_D_G, '(h @ params["w2"].T)',
                   r"mesh 1x3, .* the loss is that of this rank's partial output"),
    "bias before g": ("06.3", TWO_D_G + ' + params["b2"]',
                      'ReduceFromTP.apply(h @ params["w2"].T + params["b2"], tp_group)',
                      r"mesh 1x3, .* the loss is that of y with b2 added 3 times"),
    "gradients never cleared": ("06.3", "            p.grad = None\n", "",
                                r"mesh 3x1, .* step 1 was right; at step 2 step 1's gradients were still there"),
    "divided by the world size": ("06.3", "dp = dist.get_world_size(dp_group)", "dp = dist.get_world_size()",
                                  r"mesh 1x3, .* divided by the world size 3; the mean is over dp_group, 1 rank"),
    "gradients averaged over every rank": ("06.3", "dist.all_reduce(p.grad, group=dp_group)",
                                           "dist.all_reduce(p.grad)", r"mesh 1x3, .* all-reduced over every rank"),
    "merged lse is the larger one": ("08.3", "    return out, lse\n", "    return out, big\n",
                                     r"the output is right, but the lse returned is max\(lse1, lse2\)"),
    "outputs averaged": ("08.3", MERGE_OUT, "    out = (out1 + out2) / 2\n", r"plain average of out1 and out2"),
    "outputs added": ("08.3", MERGE_OUT, "    out = out1 + out2\n", r"the output is out1 \+ out2"),
    "naive formula in float64": ("08.3", MERGE_LSE, "    lse = torch.log(torch.exp(lse1.double()) + "
                                 "torch.exp(lse2.double())).float()\n",
                                 r"inf or nan when the scores are large \(here up to \d{4}\)"),
    "weights from the larger lse": ("08.3", MERGE_OUT, "    out = out1 * torch.exp(lse1 - big)[..., None] + "
                                    "out2 * torch.exp(lse2 - big)[..., None]\n",
                                    r"weights the parts by exp\(lse_i - max\(lse1, lse2\)\)"),
    "merged lse is the sum of the two": ("08.3", "    return out, lse\n", "    return out, lse1 + lse2\n",
                                         r"the lse returned is lse1 \+ lse2, not log\(exp\(lse1\) \+ exp\(lse2\)\)"),
    "broadcast instead of all-reduce": ("03.4", "dist.all_reduce(p.grad)  ", "dist.broadcast(p.grad, src=0)  ",
                                        r"is rank 0's own gradient .* a broadcast copies one rank's gradient"),
    "maximum instead of sum": ("03.4", "dist.all_reduce(p.grad)  ", "dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)  ",
                               r"is the element-wise maximum over the ranks .*dist.ReduceOp.SUM"),
    "all-reduce of a copy": ("03.4", "dist.all_reduce(p.grad)  ", "dist.all_reduce(p.grad.clone())  ",
                             r"is this rank's own divided by 3: the all-reduce's result was not kept"),
    "divide on rank 0 only": ("03.4", "p.grad /= world", "p.grad /= world if dist.get_rank() == 0 else 1",
                              r"rank [12]: the gradient of .* is 3 times DDP's"),
    "03.5 without the division": ("03.5", "            p.grad /= self.world\n", "",
                                  r"is 3 times DDP's .* divide by the world size"),
    "pending work never cleared": ("03.5", "        self.pending.clear()\n", "",
                                   r"the result is right, but what your wrapper holds after each step grows: .*\(a "
                                   r"list of pending work never cleared"),
    "the last bucket forgotten": ("03.6", "        if self.bucket:                                   "
                                          "# what is left after backward\n            self.send(self.bucket)\n"
                                          "            self.bucket = []\n", "",
                                  r"is still this rank's own .* all-reduce it"),
    "03.6 without the division": ("03.6", "            flat /= self.world\n", "",
                                  r"is 3 times DDP's .* divide by the world size"),
    "buckets counted in elements": ("03.6", "q.grad.numel() * q.grad.element_size() for", "q.grad.numel() for",
                                    r"the rule gives 2 for gradients of \[40, 1280, 128, 4096, 128, 8192\] bytes"),
    "backward before forward in the steady state": ("05.4", '[("F", warmup + i, r), ("B", i, r)]',
                                                    '[("B", i, r), ("F", warmup + i, r)]', r"deadlocks"),
    "no warm-up": ("05.4", "warmup = min(p - r - 1, m)", "warmup = 0",
                   r"the bubble is .*, more than 1F1B's \(p-1\)/\(m\+p-1\) .* \(rank 0 runs 1 forward\(s\) before"),
    "the same warm-up on every rank": ("05.4", "warmup = min(p - r - 1, m)", "warmup = min(p - 1, m)",
                                       r"the bubble is 0.545, more than .* \(rank 1 runs 3 forward\(s\) before its "
                                       r"first backward; 1F1B's rank r runs min\(p - r, m\) = 2\)"),
    "a cool-down over the wrong micro-batches": ("05.4", "range(m - warmup, m)", "range(warmup, m)",
                                                 r"must hold \('F', i, r\) and \('B', i, r\) exactly once"),
    "averaging after every step": ("09.4", "        if self.steps % self.period:                      "
                                           "# not an averaging step: no communication at all\n            return\n", "",
                                   r"communicated after steps \[1, 2, 3, 4, 5, 6, 7\]; with period 3"),
    "averaging from the first step": ("09.4", "if self.steps % self.period:", "if (self.steps - 1) % self.period:",
                                      r"communicated after steps \[1, 4, 7\]; .* the first averaging follows step 3"),
    "every step, all_reduce imported by name": (
        "09.4", ["import torch.distributed as dist\n", "dist.all_reduce(p)  ", "dist.get_world_size()",
                 "        if self.steps % self.period:                      "
                 "# not an averaging step: no communication at all\n            return\n"],
        ["from torch.distributed import all_reduce, get_world_size\n", "all_reduce(p)  ", "get_world_size()", ""],
        r"communicated after steps \[1, 2, 3, 4, 5, 6, 7\]"),
    "G stepped before D": ("10.5", GAN_D_BLOCK + GAN_G_BLOCK, GAN_G_BLOCK + GAN_D_BLOCK,
                           r"the parameters are those of G stepping before D"),
    "G's fakes labelled fake": ("10.5", "D(fake), ones)", "D(fake), zeros)", r"G's loss labels its fakes 0"),
    "D's gradients never zeroed": ("10.5", "    opt_d.zero_grad(set_to_none=True)\n", "",
                                   r"D's gradients carried over from the step before"),
    "G's gradients never zeroed": ("10.5", "    opt_g.zero_grad(set_to_none=True)\n", "",
                                   r"G's gradients accumulated over the steps"),
    "parameters broadcast from rank 0": ("09.4", "dist.all_reduce(p)  ", "dist.broadcast(p, src=0)  ",
                                         r"after step 3 the parameters are rank 0's own .* a broadcast copies"),
    "all-reduce of a copy of the parameters": ("09.4", "dist.all_reduce(p)  ", "dist.all_reduce(p.clone())  ",
                                               r"after step 3 the parameters are still this rank's own"),
}


def printed(capsys):
    """What the grader printed, with its wrapped lines joined again (it wraps at 100 characters)."""
    return re.sub(r"\n +", " ", capsys.readouterr().out)


def test_every_function_exercise_is_covered():
    assert set(TEMPLATE_HINTS) == set(MISTAKES) == set(FUNCTIONS)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_solutions_pass_at_2_3_and_4_ranks(world, starts_processes):
    """Issue 33's bar: every worked solution passes at 2, 3 and 4 ranks, also where check_script grades a
    student at fewer (EXERCISES[...].world_sizes: what a student waits for, not what the check can do)."""
    hints = grade_many([(i, solution(i)) for i in FUNCTIONS], world)
    assert hints == [None] * len(FUNCTIONS), dict(zip(FUNCTIONS, hints))


def test_stretch_solutions_pass_under_real_torchrun(monkeypatch, starts_processes):
    """Off Linux (macOS) the grader starts its ranks with real torchrun, not forked from a warm template: the
    stretch exercises' worked solutions pass there too, 07.5 first (its first optimizer imported torch._dynamo,
    whose probe of the temp folder, a file written, was refused as the student's own)."""
    monkeypatch.setenv("MGPU_LAUNCH", "torchrun")
    stretch = ["07.5", "07.6", "03.7"]
    hints = grade_many([(i, solution(i)) for i in stretch], 2)
    assert hints == [None] * len(stretch), dict(zip(stretch, hints))


def test_templates_fail_with_their_hints(starts_processes):
    hints = grade_many([(i, EXERCISES_DIR / EXERCISES[i].template) for i in FUNCTIONS], 2)
    for i, hint in zip(FUNCTIONS, hints):
        assert hint and re.search(TEMPLATE_HINTS[i], hint), (i, hint)


def test_typical_mistakes_get_their_hints(tmp_path, starts_processes):
    hints = grade_many([(i, wrong(tmp_path, i, *MISTAKES[i][:2])) for i in FUNCTIONS], 3)
    for i, hint in zip(FUNCTIONS, hints):
        assert hint and re.search(MISTAKES[i][2], hint), (i, hint)


def test_more_mistakes_get_their_hints(tmp_path, starts_processes):
    """The common mistakes beyond the first: each wrong solution fails at 3 ranks with the hint that names it."""
    names = list(MORE_MISTAKES)
    cases = []
    for k, name in enumerate(names):
        exercise_id, old, new, _ = MORE_MISTAKES[name]
        folder = tmp_path / str(k)
        folder.mkdir()
        cases.append((exercise_id, wrong(folder, exercise_id, old, new)))
    hints = grade_many(cases, 3)
    for name, hint in zip(names, hints):
        assert hint and re.search(MORE_MISTAKES[name][3], hint), (name, hint)


def test_check_script_confirms_with_the_measurements(capsys, starts_processes):
    assert check_script("03.4", solution("03.4"), world_sizes=(2,))
    out = printed(capsys)
    assert "[03.4] correct" in out and re.search(r"world size 2: one step .* ms with yours, .* ms with DDP", out)
    assert check_script("07.4", solution("07.4"), world_sizes=(2,))
    held, full = map(lambda t: int(t.replace(",", "")), re.search(
        r"your optimizer holds ([\d,]+) bytes on rank 0; Adam's moments for the whole model are ([\d,]+)",
        printed(capsys)).groups())
    assert held <= full / 2 * 1.05 + 256                   # two ranks: about half each


HANG_WRONG = {   # a wrong fix of 04.6: (text of the solution, replaced by)
    "broadcast": ("dist.all_reduce(t)  ", "dist.broadcast(t, src=0)  "),
    "reduce to rank 0": ("dist.all_reduce(t)  ", "dist.reduce(t, dst=0)  "),
    "closed form on every rank": ("dist.all_reduce(t)  ",
                                  "t.fill_(ctx.world_size * (ctx.world_size + 1) / 2)  "),
    "nothing at all": ("dist.all_reduce(t)  ", "pass  "),
    "the old template's last line": ("emit_every_rank(ctx, t) ",
                                     '__import__("mgpu_utils.dist").dist.emit_result({"world_size": ctx.world_size, "total": 1}) '),
}


@pytest.mark.parametrize("path, sizes, hint", [
    ("solution", (3,), r"\[04.6\] correct"),
    ("solution", (4,), r"\[04.6\] correct"),
    ("template", (2,), r"the job hung in a collective: rank 0 waits in all_reduce \(line \d+\)"),
    ("broadcast", (3,), r"every rank holds rank 0's numbers .* a broadcast copies one rank's t and adds nothing"),
    ("reduce to rank 0", (2,), r"rank 1 (still holds its own numbers|ends with) .* the sum over the ranks"),
    ("closed form on every rank", (2,), r"rank 0 ends with \[3.0, 3.0, 3.0, 3.0\], expected the sum"),
    ("nothing at all", (2,), r"rank 0 still holds its own numbers .* dist.all_reduce on every rank"),
    ("the old template's last line", (2,), r"reported no t for each of the 2 ranks .* start again from it"),
])
def test_the_hang_exercise(tmp_path, path, sizes, hint, capsys, starts_processes):
    file = {"solution": solution("04.6"), "template": EXERCISES_DIR / EXERCISES["04.6"].template}.get(path) \
        or wrong(tmp_path, "04.6", *HANG_WRONG[path])
    assert check_script("04.6", file, world_sizes=sizes) == (path == "solution")
    out = printed(capsys)
    assert re.search(hint, out), out


BLOCKING = {   # the ring with blocking calls, send then receive on every rank: buffered for a few elements only
    "04.4": ("        ops = [dist.P2POp(dist.isend, out[send_index], right), dist.P2POp(dist.irecv, out[recv_index], "
             "left)]\n        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n",
             "        dist.send(out[send_index], right)\n        dist.recv(out[recv_index], left)\n"),
    "04.5": ("        ops = [dist.P2POp(dist.isend, chunks[send_index], right), dist.P2POp(dist.irecv, incoming, left)]\n"
             "        for work in dist.batch_isend_irecv(ops):\n            work.wait()\n",
             "        dist.send(chunks[send_index], right)\n        dist.recv(incoming, left)\n"),
}


@pytest.mark.parametrize("exercise_id", ["04.4", "04.5"])
def test_a_blocking_ring_deadlocks_on_the_large_message(tmp_path, exercise_id, capsys, starts_processes):
    """Blocking send-then-receive on every rank passes with a few elements (gloo buffers them) and must fail:
    the grader's 16 MiB message makes it deadlock, and the hint says where it waits."""
    path = wrong(tmp_path, exercise_id, *BLOCKING[exercise_id])
    assert not check_script(exercise_id, path, world_sizes=(2,))
    assert re.search(r"hung", printed(capsys))


def test_collectives_are_refused_where_the_exercise_is_point_to_point(tmp_path, capsys, starts_processes):
    path = tmp_path / "cheat.py"
    path.write_text("import torch, torch.distributed as dist\n"
                    "def ring_all_gather(x):\n"
                    "    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]\n"
                    "    dist.all_gather(out, x)\n"
                    "    return out\n")
    assert not check_script("04.4", path, world_sizes=(2,))
    assert "allows point-to-point only, and dist.all_gather was called" in printed(capsys)


def test_exercise_file_copies_the_template_once(tmp_path, monkeypatch):
    import mgpu_utils.grading.runner as graded

    monkeypatch.setattr(graded, "WORKSPACE", tmp_path / "ws")
    mine = exercise_file("04.4")
    assert mine.read_text() == (EXERCISES_DIR / "04_ring_all_gather.py").read_text()
    mine.write_text("# my edits\n")
    assert exercise_file("04.4").read_text() == "# my edits\n"
    with pytest.raises(KeyError, match="known: 03.4"):
        exercise_file("99.9")


def test_load_exercise_loads_your_latest_copy(tmp_path, monkeypatch):
    """10.7's try-it cell: the copy is made on the first call, and every call loads the file as it is now."""
    import mgpu_utils.grading.runner as graded

    monkeypatch.setattr(graded, "WORKSPACE", tmp_path / "ws")
    assert graded.load_exercise("10.7").find_b_crit(None) is None                  # the template
    exercise_file("10.7").write_text("def find_b_crit(task):\n    return 42.0\n")
    assert graded.load_exercise("10.7").find_b_crit(None) == 42.0


def test_a_lesson_goes_on_with_the_students_function_once_it_passes(tmp_path, monkeypatch, capsys):
    """yours_or_library (lesson 08, after 08.3): the library's until the grader passes, then the student's own,
    loaded from workspace/; and each time one line that says which."""
    import mgpu_utils.grading.runner as graded
    from mgpu_utils.parallel import context

    monkeypatch.setattr(graded, "WORKSPACE", tmp_path / "ws")
    assert graded.yours_or_library("08.3", False, context.merge) is context.merge
    assert "the lesson goes on with the course's mgpu_utils.parallel.context.merge until yours passes" in \
        capsys.readouterr().out
    exercise_file("08.3").write_text("def merge(out1, lse1, out2, lse2):\n    return 'mine'\n")
    assert graded.yours_or_library("08.3", True, context.merge)(1, 2, 3, 4) == "mine"
    assert "the lesson goes on with your merge" in capsys.readouterr().out
    with pytest.raises(ValueError, match="04.6 is a script, not a function"):
        graded.yours_or_library("04.6", True, context.merge)


def test_reset_starts_over_and_keeps_the_old_copy(tmp_path, monkeypatch):
    import mgpu_utils.grading.runner as graded

    monkeypatch.setattr(graded, "WORKSPACE", tmp_path / "ws")
    template = (EXERCISES_DIR / "04_ring_all_gather.py").read_text()
    assert graded.reset_exercise("04.4").read_text() == template          # nothing to keep yet
    for edit in ("# first try\n", "# second try\n"):
        exercise_file("04.4").write_text(edit)
        assert graded.reset_exercise("04.4").read_text() == template
    old = tmp_path / "ws" / "old"
    assert [p.read_text() for p in sorted(old.iterdir())] == ["# first try\n", "# second try\n"]
    with pytest.raises(KeyError, match="known: 03.4"):
        graded.reset_exercise("99.9")


CHEATS = {   # (exercise, the file a student looking for the easy way could write, the hint it must get at 3 ranks)
    "a snapshot kept in memory": ("12.5", (
        "import copy, torch\n"
        "def save_snapshot(path, model, opt, sched, step):\n"
        "    torch._stash = copy.deepcopy((model.state_dict(), opt.state_dict(), sched.state_dict(), step,\n"
        "                                  torch.get_rng_state()))\n"
        "def load_snapshot(path, model, opt, sched):\n"
        "    m, o, s, step, rng = torch._stash\n"
        "    model.load_state_dict(m); opt.load_state_dict(o); sched.load_state_dict(s); torch.set_rng_state(rng)\n"
        "    return step\n"), r"the job resumed, but rank 0 wrote no file"),
    "the whole optimizer in a Module": ("07.5", (
        "import torch, torch.distributed as dist\n"
        "class ShardedOptimizer(torch.nn.Module):\n"
        "    def __init__(self, params, optimizer_class, **defaults):\n"
        "        super().__init__()\n"
        "        self.params = list(params)\n"
        "        self.run = optimizer_class(self.params, **defaults).step\n"
        "    def step(self):\n"
        "        for p in self.params:\n"
        "            dist.all_reduce(p.grad)\n"
        "            p.grad /= dist.get_world_size()\n"
        "        self.run()\n"
        "    def zero_grad(self):\n"
        "        for p in self.params:\n"
        "            p.grad = None\n"), r"holds 7,240 bytes of state .* the optimizer in one process holds 7,240"),
    "the whole optimizer inside": ("07.5", (
        "import torch, torch.distributed as dist\n"
        "class ShardedOptimizer:\n"
        "    def __init__(self, params, optimizer_class, **defaults):\n"
        "        self.params = list(params)\n"
        "        self.inner = optimizer_class(self.params, **defaults)\n"
        "    def step(self):\n"
        "        for p in self.params:\n"
        "            dist.all_reduce(p.grad)\n"
        "            p.grad /= dist.get_world_size()\n"
        "        self.inner.step()\n"
        "    def zero_grad(self):\n"
        "        self.inner.zero_grad()\n"), r"holds 7,240 bytes of state .* the optimizer in one process holds 7,240"),
    "whole weights assembled on every tp rank": ("06.3", (
        "import torch, torch.distributed as dist\n"
        "import torch.nn.functional as F\n"
        "def train_step(params, x, target, tp_group, dp_group, lr):\n"
        "    tp, t, n = dist.get_world_size(tp_group), dist.get_rank(tp_group), params['w1'].shape[0]\n"
        "    w1 = torch.zeros(n * tp, params['w1'].shape[1]); w1[t * n:(t + 1) * n] = params['w1'].detach()\n"
        "    w2 = torch.zeros(params['w2'].shape[0], n * tp); w2[:, t * n:(t + 1) * n] = params['w2'].detach()\n"
        "    dist.all_reduce(w1, group=tp_group); dist.all_reduce(w2, group=tp_group)\n"
        "    w1.requires_grad_(); w2.requires_grad_()\n"
        "    y = F.relu(F.relu(x @ params['w0'].T) @ w1.T) @ w2.T + params['b2']\n"
        "    loss = F.mse_loss(y, target)\n"
        "    loss.backward()\n"
        "    params['w1'].grad = w1.grad[t * n:(t + 1) * n].clone()\n"
        "    params['w2'].grad = w2.grad[:, t * n:(t + 1) * n].contiguous()\n"
        "    with torch.no_grad():\n"
        "        for p in params.values():\n"
        "            dist.all_reduce(p.grad, group=dp_group)\n"
        "            p -= lr * p.grad / dist.get_world_size(dp_group)\n"
        "            p.grad = None\n"
        "    return loss.item()\n"),
        r"mesh 1x3, dp x tp\): the result is right, but at step 1 the all-reduces over tp_group sent 480 elements "
        r"in 2 call\(s\); .* g's \[rows, O\] \(96 elements\) .* f's \[rows, D\] \(144\)"),
    "full gradients left on the module": ("07.6", (
        "import torch, torch.distributed as dist\n"
        "from mgpu_utils.compat import all_gather_single, reduce_scatter_single\n"
        "class MyFSDP(torch.nn.Module):\n"
        "    def __init__(self, module, compute_dtype=None):\n"
        "        super().__init__()\n"
        "        W, r = dist.get_world_size(), dist.get_rank()\n"
        "        self.inner, self.full, shards = [module], [], []\n"
        "        for p in module.parameters():\n"
        "            size = -(-p.numel() // W)\n"
        "            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(size * W - p.numel())])\n"
        "            shards.append(torch.nn.Parameter(flat[r * size:(r + 1) * size].clone()))\n"
        "            self.full.append((p, p.shape))\n"
        "            p.register_post_accumulate_grad_hook(self.hook(shards[-1], p.shape))\n"
        "            p.data = torch.empty(0)\n"
        "        self.shards = torch.nn.ParameterList(shards)\n"
        "    def hook(self, s, shape):\n"
        "        def reduce(p):\n"
        "            W = dist.get_world_size()\n"
        "            flat = torch.zeros(s.numel() * W)\n"
        "            flat[:shape.numel()] = p.grad.reshape(-1)\n"
        "            out = torch.empty(s.numel())\n"
        "            reduce_scatter_single(out, flat)\n"
        "            s.grad = out / W\n"
        "            p.grad.zero_()\n"
        "            p.data = torch.empty(0)\n"
        "        return reduce\n"
        "    def forward(self, x):\n"
        "        W = dist.get_world_size()\n"
        "        for (p, shape), s in zip(self.full, self.shards):\n"
        "            buf = torch.empty(s.numel() * W)\n"
        "            all_gather_single(buf, s.detach())\n"
        "            p.data = buf[:shape.numel()].view(shape)\n"
        "        return self.inner[0](x)\n"),
        r"\(MLP, float32\): after step 1 your wrapper holds [\d,]+ bytes besides its shards"),
    "gather imported by name": ("04.4", (
        "import torch\nfrom torch.distributed import all_gather, get_world_size\n"
        "def ring_all_gather(x):\n"
        "    out = [torch.empty_like(x) for _ in range(get_world_size())]\n"
        "    all_gather(out, x)\n    return out\n"), r"allows point-to-point only, and dist.all_gather was called"),
    "gather through distributed_c10d": ("04.5", (
        "import torch, torch.distributed as dist\n"
        "def ring_reduce_scatter(x):\n"
        "    out = torch.empty(x.numel() // dist.get_world_size())\n"
        "    dist.distributed_c10d.reduce_scatter_tensor(out, x)\n    return out\n"),
        r"allows point-to-point only, and dist.reduce_scatter_tensor was called"),
    "full Adam wrapped in an attribute": ("07.4", (
        "import torch, torch.distributed as dist\n"
        "class ShardedAdam:\n"
        "    def __init__(self, params, lr=1e-3):\n"
        "        self.params = list(params)\n"
        "        self.inner = torch.optim.Adam(self.params, lr=lr, foreach=False)\n"
        "    def step(self):\n"
        "        for p in self.params:\n"
        "            dist.all_reduce(p.grad)\n"
        "            p.grad /= dist.get_world_size()\n"
        "        self.inner.step()\n"
        "    def zero_grad(self):\n"
        "        self.inner.zero_grad()\n"), r"your optimizer holds [\d,]+ bytes .*keep only this rank's slice"),
    "full moments in a dict": ("07.4", (
        "import torch, torch.distributed as dist\n"
        "class ShardedAdam:\n"
        "    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):\n"
        "        self.params, self.lr, self.betas, self.eps, self.t = list(params), lr, betas, eps, 0\n"
        "        self.moments = {id(p): [torch.zeros_like(p), torch.zeros_like(p)] for p in self.params}\n"
        "    @torch.no_grad()\n"
        "    def step(self):\n"
        "        self.t += 1\n"
        "        b1, b2 = self.betas\n"
        "        for p in self.params:\n"
        "            dist.all_reduce(p.grad)\n"
        "            g = p.grad / dist.get_world_size()\n"
        "            m, v = self.moments[id(p)]\n"
        "            m.mul_(b1).add_(g, alpha=1 - b1)\n"
        "            v.mul_(b2).addcmul_(g, g, value=1 - b2)\n"
        "            p -= self.lr * (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + self.eps)\n"
        "    def zero_grad(self):\n"
        "        for p in self.params:\n"
        "            p.grad = None\n"), r"your optimizer holds [\d,]+ bytes"),
}


def cheat_file(tmp_path, name):
    path = tmp_path / f"{name.replace(' ', '_')}.py"
    path.write_text(CHEATS[name][1])
    return path


@pytest.mark.parametrize("name", ["gather imported by name", "gather through distributed_c10d"])
def test_collectives_are_refused_however_they_are_reached(name, tmp_path, capsys, starts_processes):
    exercise_id, _, want = CHEATS[name]
    assert not check_script(exercise_id, cheat_file(tmp_path, name), world_sizes=(2,))
    assert re.search(want, printed(capsys))


def test_easy_ways_round_fail_with_their_hints(tmp_path, starts_processes):
    names = ["full Adam wrapped in an attribute", "full moments in a dict", "the whole optimizer inside",
             "a snapshot kept in memory", "the whole optimizer in a Module",
             "whole weights assembled on every tp rank", "full gradients left on the module"]
    cases = [(CHEATS[n][0], cheat_file(tmp_path, n)) for n in names]
    cases += [("03.5", wrong(tmp_path, "03.5", "            work.wait()\n", "")),
              ("03.6", wrong(tmp_path, "03.6", "            work.wait()\n", ""))]
    hints = grade_many(cases, 3)
    wanted = [CHEATS[n][2] for n in names] + [r"6 of the 6 asynchronous all-reduces were never waited for",
                                              r"2 of the 2 asynchronous all-reduces were never waited for"]
    for (exercise_id, path), hint, want in zip(cases, hints, wanted):
        assert hint is not None and re.search(want, hint), (exercise_id, path.name, hint)


def test_held_bytes_finds_every_tensor_once():
    import torch

    from mgpu_utils.grading.common import held_bytes

    w = torch.nn.Parameter(torch.zeros(10))
    w.grad = torch.ones(10)
    m = torch.zeros(4)

    class Opt:
        def __init__(self):
            self.params, self.m, self.alias = [w], m, m[:2]          # a view of m: the same storage
            self.nested = {"v": [torch.zeros(3, dtype=torch.float64)]}
            self.inner = torch.optim.Adam([w])
    opt = Opt()
    assert held_bytes(opt, exclude=[w]) == 4 * 4 + 3 * 8                   # m once, v; not w or its grad
    opt.inner.step()                                                        # Adam's own state: 2 x 10 floats + step
    assert held_bytes(opt, exclude=[w]) >= 4 * 4 + 3 * 8 + 2 * 10 * 4



def test_held_bytes_counts_the_room_a_parameter_leaves_in_its_storage():
    import torch

    from mgpu_utils.grading.common import held_bytes

    flat = torch.zeros(10 + 6)                         # two parameters tiling 10 floats, then 6 of hidden state
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2, 3))
    a.data, b.data = flat[:4], flat[4:10].view(2, 3)

    class Opt:
        def __init__(self):
            self.params, self.state = [a, b], flat[10:]
    assert held_bytes(Opt(), exclude=[a, b]) == 6 * 4                      # the room, not the parameters
    exact = torch.zeros(10)                                                 # a flat buffer the parameters tile
    a.data, b.data = exact[:4], exact[4:].view(2, 3)
    opt = Opt()
    opt.state = torch.zeros(6)
    assert held_bytes(opt, exclude=[a, b]) == 6 * 4                        # only the state's own 6 floats
    a.data, b.data = exact[:6].view(2, 3)[0], exact[:6].view(2, 3)        # overlapping views: counted once
    opt.state = None
    assert held_bytes(opt, exclude=[a, b]) == 4 * 4                        # 4 floats of room after them


def test_held_bytes_counts_numpy_arrays_and_sparse_indices():
    import torch

    from mgpu_utils.grading.common import held_bytes

    moments = torch.arange(12.0)
    kept = moments.numpy().copy()                       # the state parked as a numpy copy: 12 float32
    view = kept[3:]                                     # a view of it: the same buffer, once
    assert held_bytes({"parked": [(0, "m", kept), (0, "v", view)]}) == 12 * 4
    shared = moments.numpy()                            # no copy: the tensor's own storage, once
    assert held_bytes([moments, shared]) == 12 * 4
    sparse = torch.zeros(4, 5).index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(7.0)).to_sparse()
    assert held_bytes([sparse]) == 1 * 4 + 2 * 1 * 8    # one value, and its 2-D index in int64


def test_held_bytes_walks_a_done_futures_value_and_a_done_works_result():
    """A twenty-eighth red team's 07.6 k05 kept the whole gathered model as a completed Future's value, which C++
    holds: counted now, as is a completed Work's result; a future not yet done holds nothing to count."""
    import torch
    import torch.distributed as dist

    from mgpu_utils.grading.common import held_bytes

    done = torch.futures.Future()
    done.set_result([torch.zeros(100), {"w": torch.zeros(28)}])
    assert held_bytes({"kept": done}) == 128 * 4
    assert held_bytes([torch.futures.Future()]) == 0
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        work = dist.all_reduce(torch.ones(50), async_op=True)
        work.wait()
        assert held_bytes([work]) == 50 * 4
    finally:
        if own:
            dist.destroy_process_group()


def test_held_bytes_sees_state_in_a_strided_parameters_gaps_and_behind_a_memoryview():
    """A thirty-second red team's 07.5 q01 made each parameter a view with every stride x4 of a buffer 4 times its
    size, the optimizer's state in the gaps: the room counted is the buffer less the parameter's elements, not less
    its span. Its q03 and 07.6 q03 kept the state behind torch.frombuffer's count, reached through a memoryview:
    a memoryview counts its bytes, with or without ``python``."""
    import torch

    from mgpu_utils.grading.common import held_bytes

    buffer = torch.zeros(4 * 64)
    weight = buffer[::4]                                 # 64 elements, every 4th: 192 elements of gaps
    assert held_bytes([buffer], exclude=[weight]) == 192 * 4
    tiled = torch.zeros(64)
    assert held_bytes([tiled], exclude=[tiled[:32], tiled[32:]]) == 0        # parameters that tile it: no room
    whole = torch.zeros(1000)
    view = memoryview(whole.numpy())
    assert held_bytes({"kept": view}) == 1000 * 4
    assert held_bytes({"kept": [torch.frombuffer(view, dtype=torch.float32, count=10), view]}) >= 1000 * 4


def test_held_bytes_walks_deques_and_with_python_tensor_attributes_and_numbers():
    """03.7's growth check: a history kept in a deque, in a list set on a parameter (counted with or without
    ``python``: a tensor's attributes always are, and a memoryview's bytes), as Python floats, or as bytes,
    bytearrays and memoryviews."""
    import collections
    import sys

    import torch

    from mgpu_utils.grading.common import held_bytes

    w = torch.nn.Parameter(torch.zeros(10))

    class Wrapper:
        def __init__(self):
            self.w, self.sent, self.log = w, collections.deque([torch.zeros(5)]), [[0.5, 1.5]]
    w.history = [torch.zeros(3, dtype=torch.float64)]
    wrapper = Wrapper()
    assert held_bytes(wrapper, exclude=[w]) == 5 * 4 + 3 * 8               # the deque's tensor, w's attribute
    floats = 2 * sys.getsizeof(0.5)
    assert held_bytes(wrapper, exclude=[w], python=True) == 5 * 4 + 3 * 8 + floats
    wrapper.raw = [bytes(16), bytearray(32), memoryview(bytes(64))]
    raw = sys.getsizeof(bytes(16)) + sys.getsizeof(bytearray(32)) + 64
    assert held_bytes(wrapper, exclude=[w], python=True) == 5 * 4 + 3 * 8 + floats + raw
    assert held_bytes(wrapper, exclude=[w]) == 5 * 4 + 3 * 8 + 64          # python=True adds the numbers only


def test_held_bytes_and_reachable_storages_walk_slots():
    """A record of a slotted class (``@dataclass(slots=True)``, a private slot, a subclass's) has no __dict__:
    its tensors are found through its slots."""
    import dataclasses

    import torch

    from mgpu_utils.grading.common import held_bytes, reachable_storages

    @dataclasses.dataclass(slots=True)
    class Record:
        flat: torch.Tensor
        step: int = 0

    class Private:
        __slots__ = ("__kept", "unset")

        def __init__(self, t):
            self.__kept = t

    class Child(Private):
        __slots__ = ("more",)

        def __init__(self, t, u):
            super().__init__(t)
            self.more = u
    a, b, c = torch.zeros(4), torch.zeros(6), torch.zeros(8)
    log = [Record(a), Child(b, c)]
    assert held_bytes(log) == (4 + 6 + 8) * 4
    assert reachable_storages(log) == {t.untyped_storage().data_ptr() for t in (a, b, c)}

    class Callable:                                       # __slots__ and __call__: callable, no __dict__ (a
        __slots__ = ("full", "me")                        # twenty-second red team's 075 b01, 076 b01)

        def __call__(self):
            return self.full

    keep = Callable()
    keep.full, keep.me = [torch.zeros(10)], keep
    assert held_bytes([keep]) == 10 * 4
    assert held_bytes([len, torch.add, print]) == 0       # builtin functions: nothing to walk

def test_a_merge_that_fails_only_from_the_empty_start_is_named():
    """08.3: a merge right on two real parts but nan when lse1 = -inf (how every rank starts) gets its own hint."""
    import types

    import torch

    from mgpu_utils.grading.coding.context_experts import check_attention_merge
    from mgpu_utils.grading.runner import problem_hint
    from mgpu_utils.parallel.context import merge

    def nan_from_empty(o1, l1, o2, l2):
        o, l = merge(o1, l1, o2, l2)
        return torch.where(torch.isinf(l1)[..., None], float("nan"), o), l
    problems = []
    check_attention_merge(nan_from_empty, types.SimpleNamespace(rank=0, world_size=1), problems)
    assert re.search(r"merging into the empty start \(out 0, lse -inf.*\) gives nan",
                     problem_hint("08.3", problems[0], 1))


def test_every_graded_exercise_has_six_wrong_and_three_right_solutions_in_tests():
    """Issue 55's bar: per exercise, at least six known-wrong solutions graded with the hint each must get (the
    untouched template, the tables of this file, and the WRONG tables of the other files of tests/grading/ that
    hold a COUNTS line) and at least three right ones (the worked solution and the RIGHT variants of those files)."""
    import importlib
    from pathlib import Path

    wrong_n = {i: 1 for i in EXERCISES}                             # the template
    right_n = {i: 1 for i in EXERCISES}                             # the worked solution
    for i in MISTAKES:
        wrong_n[i] += 1
    for exercise_id, *_ in list(MORE_MISTAKES.values()) + list(CHEATS.values()):
        wrong_n[exercise_id] += 1
    for i in BLOCKING:
        wrong_n[i] += 1
    wrong_n["04.6"] += len(HANG_WRONG)
    wrong_n["03.5"] += 1                                            # never waited for (easy ways round)
    wrong_n["03.6"] += 1
    right_n["03.7"] += 1                                            # all_reduce imported by name (below)
    files = [p for p in sorted(Path(__file__).parent.glob("test_*.py"))
             if re.search(r"^COUNTS = ", p.read_text(), re.M)]
    assert files
    for path in files:
        for exercise_id, (right, wrong) in importlib.import_module(path.stem).COUNTS.items():
            right_n[exercise_id] += right
            wrong_n[exercise_id] += wrong
    assert all(n >= 6 for n in wrong_n.values()), wrong_n
    assert all(n >= 3 for n in right_n.values()), right_n


def test_lessons_03_to_12_each_grade_a_coding_exercise_they_hold():
    """Issue 33's bar: every lesson from 03 on has a graded coding exercise, and each exercise is graded from
    its own lesson's notebook (check_script("NN.k") in a code cell of notebooks/NN_*.ipynb)."""
    import json

    graded_in = {}
    for nb in sorted((EXERCISES_DIR.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for i in re.findall(r'check_script\("(\d\d\.\d+)"', "".join(cell["source"])):
                    graded_in[i] = nb.name[:2]
    assert set(graded_in) == set(EXERCISES), set(EXERCISES) ^ set(graded_in)
    assert all(graded_in[i] == i[:2] for i in graded_in), graded_in
    assert {i[:2] for i in EXERCISES} >= {f"{n:02d}" for n in range(3, 14)}


def test_a_right_ddp_that_imports_all_reduce_by_name_passes(tmp_path, starts_processes):
    """03.7 counts all-reduce calls however the name is reached (here imported into the student's module)."""
    path = wrong(tmp_path, "03.7", ["import torch.distributed as dist\n", "dist.all_reduce(flat, async_op=True)"],
                 ["import torch.distributed as dist\nfrom torch.distributed import all_reduce\n",
                  "all_reduce(flat, async_op=True)"])
    assert grade_many([("03.7", path)], 2) == [None]
