"""Exercise 06.3's grader (mgpu_utils.grading.coding.hybrid, check_two_d), round 2 of issue 55: the 2-D step
written other ways (f as a hook on z's gradient, g as a plain all-reduce, divided before the all-reduce and
zeroed in place, one flat all-reduce over dp_group, torch.optim.SGD) passes; f's all-reduce in the forward, W0's
gradient summed over tp_group in place of f and the replicated parameters averaged over every rank get the hint
that names them. Each list is graded in one launch at 3 ranks (meshes 3x1 and 1x3)."""
import re

from helpers import red_team, solution, wrong
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
    "no tensor parallelism: whole weights all-reduced from zero-padded shards, four float32 packed into each "
    "complex128 element to match f's and g's element counts (a thirteenth red team's 063_r13w01)": (
        None, red_team("063_r13w01"), r"mesh 1x3, dp x tp\): the result is right, but at step 1 the all-reduces over "
                                      r"tp_group sent [\d,]+ elements"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        if old is None:                                    # a whole file (a red team's)
            path = tmp_path / str(k) / "06_two_d_step.py"
            path.write_text(new)
            out.append(("06.3", path))
            continue
        out.append(("06.3", wrong(tmp_path / str(k), "06.3", old, new)))
    return out


def test_right_steps_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_steps_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


# 06.4 (design): whole files, as a student would write them. The worked solution counts as one right variant.
HEAD = ("from mgpu_utils.costs.hardware import GPUS\nfrom mgpu_utils.costs.memory_model import memory_per_gpu\n"
        "from mgpu_utils.costs.planner import LINKS\n\n\n")
LEAST = HEAD + """def choose_layout(model, cluster, global_batch):
    n, node = cluster.n_gpus, cluster.gpus_per_node
    for tp, pp in sorted(((t, p) for t in (1, 2, 4, 8) for p in range(1, n + 1)), key=lambda x: (x[0] * x[1], -x[0])):
        if tp > node or model.n_heads % tp or n % (tp * pp) or model.n_layers % pp or global_batch % (n // (tp * pp)):
            continue
        dp = n // (tp * pp)
        mem = memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len, 1,
                             n_params=model.params, zero_stage=1, dp=dp, tp=tp, pp=pp, recompute="selective",
                             n_micro=global_batch // dp)
        if mem.total <= cluster.memory_bytes:
            return {"dp": dp, "tp": tp, "pp": pp, "recompute": "selective", "zero_stage": 1}
"""
RULES = '''from mgpu_utils.costs.hardware import GPUS
from mgpu_utils.costs.memory_model import memory_per_gpu
from mgpu_utils.costs.planner import LINKS


def choose_layout(model, cluster, global_batch):
    """Rules of thumb: the least model parallelism that fits, tp inside a node before pp; then more of it while
    the data-parallel all-reduce of the gradients would cost more than a fifth of the compute."""
    n, node = cluster.n_gpus, cluster.gpus_per_node
    flops = GPUS[cluster.gpu]["bf16_tflops"] * 1e12 * 0.5
    compute_s = 6 * model.params * global_batch * model.seq_len / (n * flops)
    fast_tp = LINKS[cluster.intra_link]["gbps"] >= 100             # NVLink-class links inside a node
    options = []
    for tp in [t for t in (1, 2, 4, 8) if t <= node and model.n_heads % t == 0 and n % t == 0]:
        if tp > 1 and not fast_tp:
            continue                                               # no tensor parallelism over PCIe
        for pp in [p for p in range(1, n // tp + 1) if (n // tp) % p == 0 and model.n_layers % p == 0]:
            dp = n // (tp * pp)
            if global_batch % dp or global_batch // dp < 4 * (pp - 1):
                continue                                           # a bubble over a fifth of the step
            mem = memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len, 1,
                                 n_params=model.params, zero_stage=1, dp=dp, tp=tp, pp=pp, recompute="selective",
                                 n_micro=global_batch // dp)
            if mem.total <= cluster.memory_bytes:
                link = cluster.intra_link if node % (tp * dp) == 0 else cluster.inter_link
                grad_s = 4 * model.params / (tp * pp) / (LINKS[link]["gbps"] * 1e9)
                options.append((grad_s > compute_s / 5, tp * pp, -tp, dp, tp, pp))
    _, _, _, dp, tp, pp = min(options)
    return {"dp": dp, "tp": tp, "pp": pp, "recompute": "selective", "zero_stage": 1}
'''
R3 = '''from mgpu_utils.costs.hardware import GPUS
from mgpu_utils.costs.memory_model import memory_per_gpu
from mgpu_utils.costs.planner import LINKS


def choose_layout(model, cluster, global_batch):
    """Every layout that fits with ZeRO-1 and selective recomputation, scored by its bubble and the gradient
    all-reduce only (tensor and pipeline traffic left out), the options as a micro-batch of 1."""
    n = cluster.n_gpus
    node = cluster.gpus_per_node
    speed = {True: LINKS[cluster.intra_link]["gbps"] * 1e9, False: LINKS[cluster.inter_link]["gbps"] * 1e9}
    t_compute = 6 * model.params * global_batch * model.seq_len / (n * GPUS[cluster.gpu]["bf16_tflops"] * 0.5e12)
    scored = []
    for tp in range(1, node + 1):
        for pp in range(1, n + 1):
            if node % tp or model.n_heads % tp or model.hidden % tp or model.n_layers % pp or n % (tp * pp):
                continue
            dp = n // (tp * pp)
            if global_batch % dp:
                continue
            m = global_batch // dp
            if memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len, 1,
                              n_params=model.params, zero_stage=1, dp=dp, tp=tp, pp=pp, n_micro=m,
                              recompute="selective").total > cluster.memory_bytes:
                continue
            t = t_compute * (pp - 1) / m + t_compute
            t += 4 * (dp - 1) / dp * model.params / (tp * pp) / speed[node % (tp * dp) == 0]
            scored.append((t, dp, tp, pp))
    t, dp, tp, pp = min(scored)
    return dict(dp=dp, tp=tp, pp=pp, micro_batch=1, recompute="selective", zero_stage=1)
'''
LAYOUT_RIGHT = {   # name: the file's text
    "rules of thumb: the least model parallelism that fits, no tensor parallelism over PCIe, more sharding while "
    "the gradient all-reduce costs over a fifth of the compute": RULES,
    "the worked solution returning numpy integers and ring_bytes_per_rank for the all-reduces": None,
}
LAYOUT_WRONG = {   # name: (the file's text, the hint it must get)
    "data parallelism only": (
        "def choose_layout(model, cluster, global_batch):\n    return {\"dp\": cluster.n_gpus, \"tp\": 1, \"pp\": 1}\n",
        r"for GPT-3 175B on 1024 A100, batch 1536 the layout dp=1024 tp=1 pp=1 is not feasible: global batch 1536 is "
        r"not a multiple"),
    "the least model parallelism that fits, traffic ignored": (
        LEAST,
        r"for 13B on 64 A100, batch 64 the layout dp=64 tp=1 pp=1 recompute='selective' zero_stage=1 takes [0-9.]+ s "
        r"per step by the planner, 2\.[0-9]+x the best layout's .*dp traffic [0-9.]+ s \(InfiniBand HDR"),
    "tensor parallelism 8 always": (
        HEAD + "def choose_layout(model, cluster, global_batch):\n    n = cluster.n_gpus\n"
        "    for pp in [p for p in range(1, n // 8 + 1) if (n // 8) % p == 0 and model.n_layers % p == 0]:\n"
        "        dp = n // (8 * pp)\n"
        "        mem = memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len, 1,\n"
        "                             n_params=model.params, zero_stage=1, dp=dp, tp=8, pp=pp, recompute='selective',\n"
        "                             n_micro=max(1, global_batch // dp))\n"
        "        if mem.total <= cluster.memory_bytes and global_batch % dp == 0:\n"
        "            return {'dp': dp, 'tp': 8, 'pp': pp, 'recompute': 'selective', 'zero_stage': 1}\n",
        r"for 1\.3B on 32 A100, batch 512 the layout dp=4 tp=8 pp=1 .* 1\.2[6-9]x the best"),
    "only the bubble and the gradient all-reduce scored (tensor traffic left out)": (
        R3,
        r"for 1\.3B on 32 A100, batch 512 the layout dp=1 tp=8 pp=4 .* 1\.[3-9][0-9]x the best .*Where your step "
        r"goes: .*tp traffic [0-9.]+ s \(NVLink 3"),
    "tensor parallelism across two nodes": (
        "def choose_layout(model, cluster, global_batch):\n    n = cluster.n_gpus\n"
        "    return {'dp': n // 16, 'tp': 16, 'pp': 1, 'zero_stage': 1, 'recompute': 'selective'}\n",
        r"for GPT-3 175B on 1024 A100, batch 1536 the layout dp=64 tp=16 pp=1 .* is not feasible: tp=16 does not "
        r"fit in a node of 8 GPUs\. Tensor parallelism all-reduces activations four times per layer: keep tp inside"),
    "the planner asked to choose": (
        "from mgpu_utils.costs import planner\n\n\ndef choose_layout(model, cluster, global_batch):\n"
        "    best = planner.plan(model, cluster, global_batch=global_batch)[0]\n"
        "    return {'dp': best.dp, 'tp': best.tp, 'pp': best.pp}\n",
        r"06\.4 asks you to choose: planner\.plan is switched off while choose_layout runs"),
    "evaluate imported by name to score every layout": (
        "from mgpu_utils.costs.planner import evaluate\n\n\ndef choose_layout(model, cluster, global_batch):\n"
        "    n = cluster.n_gpus\n"
        "    lays = [evaluate(model, cluster, n // (t * p), t, p, global_batch=global_batch) for t in (1, 2, 4, 8)\n"
        "            for p in (1, 2, 4, 8) if n % (t * p) == 0]\n"
        "    best = min((x for x in lays if x.feasible), key=lambda x: x.step_s)\n"
        "    return {'dp': best.dp, 'tp': best.tp, 'pp': best.pp}\n",
        r"06\.4 asks you to choose: planner\.evaluate is switched off"),
    "the answers written down for the six named jobs": (
        "ANSWERS = {1024: (16, 8, 8), 16: (8, 1, 2), 256: (16, 4, 4), 32: (8, 1, 4), 64: (2, 8, 4)}\n\n\n"
        "def choose_layout(model, cluster, global_batch):\n"
        "    dp, tp, pp = (8, 1, 4) if cluster.gpu == 'H100 PCIe' else ANSWERS.get(cluster.n_gpus, (cluster.n_gpus, 1, 1))\n"
        "    return {'dp': dp, 'tp': tp, 'pp': pp, 'recompute': 'selective', 'zero_stage': 1}\n",
        r"for an unnamed job: 30B on 128 H100, batch 128 the layout dp=128 tp=1 pp=1 .* does not fit: needs "),
    "dp * tp * pp short of the GPUs": (
        "def choose_layout(model, cluster, global_batch):\n    return {'dp': 8, 'tp': 8, 'pp': 8}\n",
        r"for GPT-3 175B on 1024 A100, batch 1536 the layout dp=8 tp=8 pp=8 cannot be run: dp\*tp\*pp = 512 but the "
        r"cluster has 1024 GPUs"),
    "a tuple, not a dict": (
        "def choose_layout(model, cluster, global_batch):\n    return (cluster.n_gpus // 8, 8, 1)\n",
        r"for GPT-3 175B on 1024 A100, batch 1536 choose_layout returned \(128, 8, 1\): return a dict"),
}


def _layout_cases(tmp_path, texts):
    out = []
    for k, text in enumerate(texts):
        (tmp_path / f"l{k}").mkdir()
        path = tmp_path / f"l{k}" / "06_choose_layout.py"
        path.write_text(text)
        out.append(("06.4", path))
    return out


def _right_layout_texts():
    sol = solution("06.4").read_text()
    numpy_ints = sol.replace("    return {\"dp\": dp, \"tp\": tp, \"pp\": pp,",
                             "    import numpy as np\n    return {\"dp\": np.int64(dp), \"tp\": np.int64(tp), \"pp\": np.int64(pp),")
    numpy_ints = numpy_ints.replace(
        "            dp_s = 2 * (dp - 1) / dp * model.params / (tp * pp) * 2 / link_bps(node % (tp * dp) == 0)",
        "            dp_s = ring_bytes_per_rank(model.params / (tp * pp) * 2, dp) / link_bps(node % (tp * dp) == 0)")
    numpy_ints = "from mgpu_utils.costs.bandwidth import ring_bytes_per_rank\n" + numpy_ints
    assert numpy_ints.count("np.int64") == 3 and "ring_bytes_per_rank(" in numpy_ints
    return [RULES, numpy_ints]


def test_the_template_names_the_graders_first_six_jobs():
    """06.4's template lists the jobs the grader names (named_jobs()), as the grader has them: a student tries
    the same ones."""
    import importlib.util

    from mgpu_utils.env import REPO_ROOT
    from mgpu_utils.grading.coding.hybrid import LAYOUT_JOBS

    spec = importlib.util.spec_from_file_location("template_06_4", REPO_ROOT / "exercises" / "06_choose_layout.py")
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    assert template.named_jobs() == list(LAYOUT_JOBS[:6])
    assert all(not name.startswith("an unnamed") for name, *_ in LAYOUT_JOBS[:6])
    assert all(name.startswith("an unnamed job: ") for name, *_ in LAYOUT_JOBS[6:])


def test_right_layouts_pass(tmp_path, starts_processes):
    hints = grade_many(_layout_cases(tmp_path, _right_layout_texts()), 1)
    assert hints == [None] * len(LAYOUT_RIGHT), dict(zip(LAYOUT_RIGHT, hints))


def test_wrong_layouts_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_layout_cases(tmp_path, [t for t, _ in LAYOUT_WRONG.values()]), 1)
    for (name, (_, want)), hint in zip(LAYOUT_WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"06.3": (len(RIGHT), len(WRONG)), "06.4": (len(LAYOUT_RIGHT), len(LAYOUT_WRONG))}
