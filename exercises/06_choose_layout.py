"""Exercise 06.4 (design): choose the layout of a training job (notebooks/06_hybrid_parallel.ipynb, section 4;
the planner and its costs of that section, the memory model of lesson 07).

Write choose_layout(model, cluster, global_batch) -> dict. ``model`` is a planner.ModelSpec (n_layers, hidden,
n_heads, seq_len, vocab; ``model.params`` its parameter count), ``cluster`` a planner.Cluster (n_gpus,
gpus_per_node, gpu: a key of mgpu_utils.costs.hardware.GPUS, intra_link / inter_link: keys of planner.LINKS,
memory_bytes), ``global_batch`` the sequences per optimizer step. Return the layout as a dict:

    {"dp": 16, "tp": 8, "pp": 8}                       # dp * tp * pp == cluster.n_gpus
    # and, if you choose them (else 1, "none", 0): "micro_batch", "recompute" ("none", "selective" or "full")
    # and "zero_stage" (0 to 3)

The grader asks your function about the six jobs below and about four more of the same kind that it does not
name. It scores each answer with the planner: the layout must fit in the GPU's memory and its estimated step
time must be at most 1.25 times that of the best layout the planner finds (any dp, tp, pp, micro-batch,
recomputation and ZeRO stage). Several layouts pass each time; no single rule of thumb passes all six.

    GPT-3 175B, 1024 A100 (80 GB), global batch 1536          the lesson's example
    7B (32 layers, h 4096), 16 A100 40GB, batch 256            memory is tight
    70B (80 layers, h 8192, 4096 tokens), 256 H100, batch 1024
    1.3B (24 layers, h 2048), 32 A100, batch 512               a small model
    13B (40 layers, h 5120), 64 A100, batch 64                 a small global batch
    20B (44 layers, h 6144), 32 H100 PCIe, GPUs of a node linked by PCIe 5.0, batch 256

planner.plan and planner.evaluate are switched off while your function runs (they would choose for you).
Decide from what each degree costs, as section 4 of the lesson explains them: memory per GPU
(mgpu_utils.costs.memory_model.memory_per_gpu may be used), the data-parallel all-reduce of the gradients, the
tensor-parallel all-reduces of every layer, the pipeline's bubble (pp - 1) / m, and which link each crosses.
Try it on a job in a cell first:

    from mgpu_utils.costs import planner
    lay = choose_layout(planner.GPT3_175B, planner.Cluster(1024, "A100"), 1536)
    print(planner.table([planner.evaluate(planner.GPT3_175B, planner.Cluster(1024, "A100"), lay["dp"], lay["tp"],
                                          lay["pp"], global_batch=1536)]))

Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("06.4")
"""


def choose_layout(model, cluster, global_batch):
    """The layout of ``model`` on ``cluster`` for ``global_batch`` sequences per step: {"dp", "tp", "pp", ...}."""
    # TODO: weigh memory, the data-parallel all-reduce, tensor parallelism's per-layer traffic and the pipeline's
    # bubble, and return the layout you choose
    return {"dp": cluster.n_gpus, "tp": 1, "pp": 1}
