"""Exercise 06.4 (design): choose the layout of a training job (notebooks/06_hybrid_parallel.ipynb, section 4,
"3-D parallelism: planning", and its part "Deeper: the planner's assumptions, checked", which gives every cost
formula; the memory model of lesson 07).

Write choose_layout(model, cluster, global_batch) -> dict. ``model`` is a planner.ModelSpec (n_layers, hidden,
n_heads, seq_len, vocab; ``model.params`` its parameter count), ``cluster`` a planner.Cluster (n_gpus,
gpus_per_node, gpu: a key of mgpu_utils.costs.hardware.GPUS, intra_link / inter_link: keys of planner.LINKS;
``cluster.memory_bytes`` the memory of one GPU), ``global_batch`` the sequences per optimizer step. Return the
layout as a dict:

    {"dp": 16, "tp": 8, "pp": 8}                       # dp * tp * pp == cluster.n_gpus
    # and, if you choose them (else 1, "none", 0): "micro_batch", "recompute" ("none", "selective" or "full")
    # and "zero_stage" (0 to 3)

The grader asks your function about the six jobs of named_jobs() below and about four more of the same kind that
it does not name. It scores each answer with the planner as lesson 06 uses it (mixed precision with Adam, 16
bytes per parameter; the 1F1B schedule; 50 % of the GPU's bf16 peak; no sequence parallelism): the layout must
fit in the GPU's memory and its estimated step time must be at most 1.25 times that of the best layout the
planner finds (any dp, tp, pp, micro-batch, recomputation and ZeRO stage). Several layouts pass each time; no
single rule of thumb passes all ten. A job that fails gets a hint with where your step's time goes and where the
best layout's does.

planner.plan and planner.evaluate are switched off while your function runs (they would choose for you).
Decide from what each degree costs: memory per GPU (mgpu_utils.costs.memory_model.memory_per_gpu may be used),
the data-parallel all-reduce of the gradients, the tensor-parallel all-reduces of every layer, the pipeline's
bubble (pp - 1) / m, and which link each one crosses. Try it on the named jobs in a cell first (here the planner
may be used, to see how your answers score):

    from mgpu_utils.costs import planner
    for name, model, cluster, batch in named_jobs():
        lay = choose_layout(model, cluster, batch)
        options = {k: lay[k] for k in ("micro_batch", "recompute", "zero_stage") if k in lay}
        print(name, lay)
        print(planner.table([planner.evaluate(model, cluster, lay["dp"], lay["tp"], lay["pp"], global_batch=batch,
                                              **options)]))

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("06.4")
"""


def named_jobs():
    """The six jobs the grader names: (name, planner.ModelSpec, planner.Cluster, global batch)."""
    from mgpu_utils.costs.planner import GPT3_175B, Cluster, ModelSpec

    nv4, ndr = "NVLink 4 (H100, 18 links)", "InfiniBand NDR (400 Gb/s)"
    return [   # ModelSpec(name, n_layers, hidden, n_heads, seq_len, vocab); Cluster(n_gpus, gpu, ...): 8 GPUs a node
        ("GPT-3 175B on 1024 A100, batch 1536", GPT3_175B, Cluster(1024, "A100"), 1536),
        ("7B on 16 A100 40GB, batch 256", ModelSpec("7B", 32, 4096, 32, 2048, 50257), Cluster(16, "A100 40GB"), 256),
        ("70B on 256 H100, batch 1024", ModelSpec("70B", 80, 8192, 64, 4096, 32000),
         Cluster(256, "H100", intra_link=nv4, inter_link=ndr), 1024),
        ("1.3B on 32 A100, batch 512", ModelSpec("1.3B", 24, 2048, 16, 2048, 50257), Cluster(32, "A100"), 512),
        ("13B on 64 A100, batch 64", ModelSpec("13B", 40, 5120, 40, 2048, 50257), Cluster(64, "A100"), 64),
        ("20B on 32 H100 PCIe (PCIe 5.0 in a node), batch 256", ModelSpec("20B", 44, 6144, 48, 2048, 50257),
         Cluster(32, "H100 PCIe", intra_link="PCIe 5.0 x16", inter_link=ndr), 256),
    ]


def choose_layout(model, cluster, global_batch):
    """The layout of ``model`` on ``cluster`` for ``global_batch`` sequences per step: {"dp", "tp", "pp", ...}."""
    # TODO: weigh memory, the data-parallel all-reduce, tensor parallelism's per-layer traffic and the pipeline's
    # bubble, and return the layout you choose
    return {"dp": cluster.n_gpus, "tp": 1, "pp": 1}
