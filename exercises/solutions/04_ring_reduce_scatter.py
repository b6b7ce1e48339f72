"""Solution of exercise 04.5: ring reduce-scatter from point-to-point messages (for instructors)."""
import torch
import torch.distributed as dist


def ring_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Chunk ``rank`` of ``x`` (1-D, ``world_size * k`` elements) summed over all ranks: ``k`` elements."""
    world, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % world, (rank - 1) % world
    chunks = [c.clone() for c in x.chunk(world)]
    incoming = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send_index = (rank - step - 1) % world       # ends, after W - 1 steps, with chunk `rank` complete
        recv_index = (rank - step - 2) % world
        ops = [dist.P2POp(dist.isend, chunks[send_index], right), dist.P2POp(dist.irecv, incoming, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        chunks[recv_index] += incoming
    return chunks[rank]
