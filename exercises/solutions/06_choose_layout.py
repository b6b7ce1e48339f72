"""Solution of exercise 06.4: a layout chosen from an estimate of each degree's cost (for instructors).

Every (tp, pp) that can split the model (tp inside a node and dividing the heads, pp dividing the layers, dp
dividing the batch) and fits in memory with ZeRO-1 and selective recomputation, scored by compute with the
pipeline's bubble plus the three kinds of traffic over the link each crosses; the cheapest wins.
"""
from mgpu_utils.costs.hardware import GPUS
from mgpu_utils.costs.memory_model import memory_per_gpu
from mgpu_utils.costs.planner import LINKS


def choose_layout(model, cluster, global_batch):
    """The layout of ``model`` on ``cluster`` for ``global_batch`` sequences per step: {"dp", "tp", "pp", ...}."""
    n, node = cluster.n_gpus, cluster.gpus_per_node
    compute_s = 6 * model.params * global_batch * model.seq_len / (n * GPUS[cluster.gpu]["bf16_tflops"] * 1e12 * 0.5)

    def link_bps(inside_a_node):
        return LINKS[cluster.intra_link if inside_a_node else cluster.inter_link]["gbps"] * 1e9

    act_bytes = model.seq_len * model.hidden * 2                # one sequence's activations between layers, bf16
    best = None
    for tp in [t for t in range(1, node + 1) if node % t == 0 and n % t == 0 and model.n_heads % t == 0]:
        for pp in [p for p in range(1, n // tp + 1) if (n // tp) % p == 0 and model.n_layers % p == 0]:
            dp = n // (tp * pp)
            if global_batch % dp:
                continue
            m = global_batch // dp                          # micro-batches of one sequence per step
            memory = memory_per_gpu(model.n_layers, model.hidden, model.n_heads, model.vocab, model.seq_len, 1,
                                    n_params=model.params, zero_stage=1, dp=dp, tp=tp, pp=pp,
                                    recompute="selective", n_micro=m)
            if memory.total > cluster.memory_bytes:
                continue
            dp_s = 2 * (dp - 1) / dp * model.params / (tp * pp) * 2 / link_bps(node % (tp * dp) == 0)
            tp_s = model.n_layers / pp * m * 4 * 2 * (tp - 1) / tp * act_bytes / link_bps(True)
            pp_s = 2 * m * act_bytes / link_bps(node % (tp * dp * pp) == 0) if pp > 1 else 0.0
            step_s = compute_s * (1 + (pp - 1) / m) + dp_s + tp_s + pp_s
            if best is None or step_s < best[0]:
                best = (step_s, dp, tp, pp)
    _, dp, tp, pp = best
    return {"dp": dp, "tp": tp, "pp": pp, "recompute": "selective", "zero_stage": 1}
