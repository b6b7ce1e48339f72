"""Exercise 13.1: find the planted bug from the parity matrix alone (notebooks/13_capstone.ipynb, Exercises).

sync_gradients runs on every rank after backward, before the optimizer's step, in a layout of replicas: dp
(each rank its own rows), cp (each rank its own slice of the sequence, lesson 08's ring attention) and ep (its
own rows, and 1/ep of each mixture-of-experts layer's experts, lesson 08's all-to-all). Each rank's loss is the
mean over its own tokens; after sync_gradients every parameter's .grad must equal one process's gradient of
the whole batch's mean loss.

The function below looks right and passes most of the matrix, but not all of it. Run the grader (it trains a
small mixture-of-experts TinyLlama under dp, cp and ep alone at 2 ranks, then under their pairs at 4, and prints
each layout's worst parameter, its difference and the factor between its gradient and one process's), read
which layouts and which parameters fail, find the line that is wrong and fix it. Keep the signature.

    params: this rank's (name, parameter) pairs, e.g. "layers.0.attention.wq.weight",
        "layers.0.feed_forward.moe.gate.weight" (the router), "layers.0.feed_forward.moe.experts.1.fc1.weight"
        (an expert this rank holds); p.grad is the gradient of this rank's loss.
    groups: {"dp": ProcessGroup, "ep": ..., "cp": ...}: the layout's dimensions of size > 1 only.

Grade it from a notebook cell (2 and 4 ranks):
    from mgpu_utils.grading.runner import check_script
    check_script("13.1")
"""
import torch.distributed as dist


def sync_gradients(params, groups):
    """Every gradient of ``params`` made the whole batch's: summed over the replicas, divided by their count."""
    replicas = 1
    for dim, group in groups.items():
        for name, p in params:
            dist.all_reduce(p.grad, group=group)
        replicas *= dist.get_world_size(group)
    for name, p in params:
        p.grad /= replicas
