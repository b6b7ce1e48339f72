"""Exercise 04.4: ring all-gather from point-to-point messages (notebooks/04_collectives.ipynb, section 3).

Write ring_all_gather(x): every rank passes x in, every rank gets back the list of all ranks' tensors
[x_0, x_1, ..., x_{W-1}], as dist.all_gather gives it. Use only point-to-point messages with your two
neighbours in the ring (dist.isend / dist.irecv, or dist.P2POp + dist.batch_isend_irecv): the grader
switches the collectives off while your function runs.

The ring: W - 1 steps. At every step each rank sends one tensor to its right neighbour (rank + 1) and
receives one from its left neighbour (rank - 1), both modulo W. Which tensor goes out at step s?

Grade it from a notebook cell (world sizes 2, 3 and 4; odd lengths):
    from mgpu_utils.grading.runner import check_script
    check_script("04.4")
"""
import torch
import torch.distributed as dist


def ring_all_gather(x: torch.Tensor) -> list[torch.Tensor]:
    """All ranks' ``x`` (same shape and dtype on every rank), in rank order, on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    out = [torch.empty_like(x) for _ in range(world)]
    out[rank] = x.clone()
    for step in range(world - 1):
        send_index = rank          # TODO: the tensor this rank forwards at this step (it is not always its own)
        recv_index = left          # TODO: the tensor that arrives from the left at this step
        # TODO: send out[send_index] to `right` and receive into out[recv_index] from `left`, both at once
        #       (start both, then wait for both: two blocking calls in the same order on every rank deadlock)
    return out
