"""Exercise 06.3: one SGD step on a data x tensor mesh, from scratch (notebooks/06_hybrid_parallel.ipynb,
section 3; the tensor-parallel operators f and g of lesson 05).

The model, in one process (x [b, d], target [b, o], mean squared error over the global batch):

    z = relu(x W0^T)               W0 [d, d]   replicated: every rank holds all of it
    h = relu(z W1^T)               W1 [n, d]   column parallel: tp rank t holds rows t n/tp .. (t+1) n/tp - 1
    y = h W2^T + b2                W2 [o, n]   row parallel: tp rank t holds the matching columns of W2
                                   b2 [o]      replicated

The ranks form a dp x tp mesh, numbered as init_device_mesh("cpu", (dp, tp)) numbers them: rank = i tp + t.
The ranks of one tp group hold the shards of one copy of the model and see the same rows of the batch; the
ranks of one dp group hold the same shard and see different rows (the batch is split over the dp groups).

Write train_step(params, x, target, tp_group, dp_group, lr) -> float. ``params`` is this rank's
{"w0", "w1", "w2", "b2"}: leaf tensors with requires_grad. x and target are this rank's rows. It must

  1. compute y with one all-reduce over tp_group in the forward (g, after the row-parallel layer) and one in
     the backward (f, before the column-parallel layer: W0's gradient needs every tp rank's part);
  2. make each gradient the one of the global batch's loss: the mean over the dp group;
  3. update every parameter in place, p <- p - lr * grad, and leave no gradient behind for the next step;
  4. return this rank's loss (the mean over its rows) as a Python float.

The grader runs two steps at every layout its world size allows (2 ranks: 2x1 and 1x2; 4 ranks: 4x1, 2x2 and
1x4) and compares every rank's shard with the same steps in one process. Grade it from a notebook cell:
    from mgpu_utils.grading.runner import check_script
    check_script("06.3")
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


class CopyToTP(torch.autograd.Function):
    """f: identity forward; in backward, the input's gradient summed over the tp group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None                 # TODO: the sum over ctx.group (one all-reduce)


class ReduceFromTP(torch.autograd.Function):
    """g: in forward, the partial outputs summed over the tp group; in backward, the identity."""

    @staticmethod
    def forward(ctx, x, group):
        return x                          # TODO

    @staticmethod
    def backward(ctx, grad):
        return grad, None                 # TODO: is this right?


def train_step(params, x, target, tp_group, dp_group, lr):
    """One SGD step on this rank's shard of the model and of the batch; returns the loss on its rows."""
    z = F.relu(x @ params["w0"].T)
    h = F.relu(z @ params["w1"].T)                       # TODO: f, g and the bias, each in its place
    y = h @ params["w2"].T + params["b2"]
    loss = F.mse_loss(y, target)
    loss.backward()
    with torch.no_grad():
        for p in params.values():
            p -= lr * p.grad                             # TODO: the gradient of the global batch first
    return loss.item()
