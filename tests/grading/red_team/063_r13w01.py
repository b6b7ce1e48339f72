"""WRONG (06.3): no tensor parallelism at all: every rank assembles the WHOLE W1 and W2 each step (zero-padded shards all-reduced over tp_group) and runs the full model locally, hidden by packing 4 float32 into each complex128 element so the two tp all-reduces have exactly f's and g's element counts."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _gather_packed(shards, fulls, t, tp, numel, group):
    """All-reduce over ``group`` one complex128 tensor of ``numel`` elements holding the zero-padded whole
    tensors ``fulls`` (shapes), this rank's ``shards`` placed at tp rank t's slots."""
    flat = torch.zeros(4 * numel, dtype=torch.float32)
    offset, where = 0, []
    for shard, (shape, dim) in zip(shards, fulls):
        whole = torch.zeros(shape)
        n = shard.shape[dim]
        whole.narrow(dim, t * n, n).copy_(shard.detach())
        flat[offset:offset + whole.numel()] = whole.reshape(-1)
        where.append((offset, shape))
        offset += whole.numel()
    assert offset <= flat.numel()
    packed = flat.view(torch.complex128)              # 4 float32 in each element: sums of +0.0 keep the bits
    dist.all_reduce(packed, group=group)
    flat = packed.view(torch.float32)
    return [flat[o:o + torch.Size(s).numel()].view(s).clone() for o, s in where]


def train_step(params, x, target, tp_group, dp_group, lr):
    tp, t = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    w0, w1, w2, b2 = params["w0"], params["w1"], params["w2"], params["b2"]
    n = w1.shape[0]
    N, D, O = n * tp, w1.shape[1], w2.shape[0]
    if tp > 1:
        (W1,) = _gather_packed([w1], [((N, D), 0)], t, tp, len(x) * D, tp_group)   # f's count of elements
        (W2,) = _gather_packed([w2], [((O, N), 1)], t, tp, len(x) * O, tp_group)   # g's count
    else:
        W1, W2 = w1.detach(), w2.detach()
    rows = slice(t * n, (t + 1) * n)
    W1 = torch.cat([W1[:t * n], w1, W1[(t + 1) * n:]], 0)          # own shard keeps its gradient
    W2 = torch.cat([W2[:, :t * n], w2, W2[:, (t + 1) * n:]], 1)
    z = F.relu(x @ w0.T)
    y = F.relu(z @ W1.T) @ W2.T + b2                                 # the whole model, locally
    loss = F.mse_loss(y, target)
    loss.backward()
    dp = dist.get_world_size(dp_group)
    with torch.no_grad():
        for p in params.values():
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= dp
            p -= lr * p.grad
            p.grad = None
    return loss.item()
