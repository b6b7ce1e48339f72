"""Synchronous all-reduce SGD against an asynchronous parameter server on digits, each with and without a
straggler, in one launch (notebooks/09_sync_vs_async.ipynb).

Ranks 1..W (W = world size - 1) are the workers in both modes (a small MLP, plain SGD, batches of b).
* sync: every worker computes the gradient of its batch, the workers all-reduce (average) it and all take
  the same step with lr x W (global batch W x b, linear scaling).
* async: rank 0 is a parameter server (PS) holding the parameters and a version. A worker pulls them,
  computes a gradient, pushes it with the version it used; the PS applies it at once (lr), replies with
  the new parameters, and answers "stop" once --steps x W updates were applied (as many gradients as
  sync). Every received gradient is applied exactly once; staleness = PS version when applied - version
  the gradient was computed on. PS messages are point-to-point ops on a gloo group (recv from any
  source returns the sender), also when the job runs on NCCL: parameters travel as CPU tensors.
* straggler: rank --straggler sleeps --delay-ms per step (sleep is honest on a busy CPU; compute is not).
Parameter snapshots (with their time) are scored on the test set after each run: not in the wall-clock.
Rank 0 prints JSON per run: accuracy curve (gradients, seconds, accuracy), staleness histogram (async: also
per worker, with its start after the first worker's and its mean step, over all its steps and over each
half), pushes sent/applied, bytes sent. --dump PATH: rank 0 saves {run: final flat parameters} (tests).

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/sync_async.py --delay-ms 40
"""
import argparse
import collections
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mgpu_utils.checks import exact_fp32
from mgpu_utils.data import batch_stream, load_data
from mgpu_utils.dist import distributed, emit_result, new_group
from mgpu_utils.costs.bandwidth import ring_bytes_per_rank
from mgpu_utils.models import make_mlp
from mgpu_utils.timing import synced_clock


def flat_grad(model, x, y):
    """Gradient of the mean cross-entropy on (x, y) as one flat vector."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@torch.no_grad()
def accuracy(model, theta, x, y):
    """Test accuracy of the flat parameters theta (loaded into model)."""
    vector_to_parameters(theta.to(x.device), model.parameters())
    return (model(x).argmax(1) == y).float().mean().item()


def run_sync(a, ctx, model, theta0, data, workers, W, delay):
    """Workers: all-reduce SGD for a.steps steps. Returns snapshots [(gradients, s, theta)]."""
    X, Y, train = data
    stream = batch_stream(train, W, ctx.rank - 1, a.per_rank_batch, a.seed)
    theta = theta0.to(ctx.device).clone()
    dist.barrier(group=workers)                           # the workers start the clock together
    snaps, step_s, t0 = [(0, 0.0, theta0.clone())], [], time.perf_counter()
    for step in range(1, a.steps + 1):
        ts, idx = time.perf_counter(), next(stream)
        vector_to_parameters(theta, model.parameters())
        g = flat_grad(model, X[idx], Y[idx])
        time.sleep(delay)                                 # the straggler (0 elsewhere)
        dist.all_reduce(g, group=workers)               # sum over workers ...
        theta = theta - a.lr * W * (g / W)                # ... average, global-batch step (a new tensor)
        step_s.append(synced_clock(ctx.device) - ts)      # on NCCL the all-reduce returns once queued
        if step % a.eval_every == 0 or step == a.steps:
            th = theta.cpu()                              # waits for the device before the time is read
            snaps.append((step * W, time.perf_counter() - t0, th))
    return snaps, step_s


def run_ps(a, theta0, group, W, proj):
    """Rank 0: the parameter server. Returns snapshots, applied pushes, theta, hello times."""
    P, budget, theta, version, active = theta0.numel(), a.steps * W, theta0.clone(), 0, W
    msg, reply = torch.empty(P + 3), torch.empty(P + 2)   # [kind, base version, seq, grad]; [stop, version, theta]
    snaps, applied, t0, hello = [(0, 0.0, theta0.clone())], [], time.perf_counter(), {}
    while active:
        src = dist.recv(msg, group=group)                 # from any worker: returns the sender's rank
        if msg[0] == 1:                                   # a gradient: apply it now, once
            g, staleness = msg[3:], version - int(msg[1])
            theta.add_(g, alpha=-a.lr)
            version += 1
            applied.append([src, int(msg[2]), staleness, time.perf_counter() - t0,
                            torch.dot(proj, g.double()).item()])
            if version % (a.eval_every * W) == 0 or version == budget:
                snaps.append((version, time.perf_counter() - t0, theta.clone()))
        else:                                             # hello: the worker starts now (its first pull)
            hello[src] = time.perf_counter() - t0
        reply[0], reply[1], reply[2:] = float(stop := version >= budget), float(version), theta
        dist.send(reply, dst=src, group=group)
        active -= int(stop)
    return snaps, applied, theta, hello


def run_worker(a, ctx, model, data, group, W, delay, proj):
    """Ranks 1..W, async: pull, compute, push until the PS says stop. Returns pushes, step times."""
    X, Y, train = data
    stream = batch_stream(train, W, ctx.rank - 1, a.per_rank_batch, a.seed)
    msg, reply = torch.zeros(proj.numel() + 3), torch.empty(proj.numel() + 2)
    dist.send(msg, dst=0, group=group)                    # kind 0: hello, send me the parameters
    dist.recv(reply, src=0, group=group)
    pushes, step_s, seq = [], [], 0
    while reply[0] == 0:
        ts, idx = time.perf_counter(), next(stream)
        vector_to_parameters(reply[2:].to(ctx.device), model.parameters())
        g = flat_grad(model, X[idx], Y[idx]).cpu()
        time.sleep(delay)
        msg[0], msg[1], msg[2], msg[3:] = 1.0, reply[1], float(seq), g
        pushes.append([ctx.rank, seq, torch.dot(proj, g.double()).item()])   # a checksum of g
        dist.send(msg, dst=0, group=group)
        dist.recv(reply, src=0, group=group)
        step_s.append(time.perf_counter() - ts)
        seq += 1
    return pushes, step_s


def main():
    p = argparse.ArgumentParser(description="sync all-reduce vs async parameter server, with a straggler")
    g = p.add_argument_group("training and straggler")
    g.add_argument("--steps", type=int, default=80, help="sync steps; async applies steps x W updates")
    g.add_argument("--per-rank-batch", type=int, default=16, help="per worker and gradient")
    g.add_argument("--lr", type=float, default=0.1, help="per gradient of one batch (sync: x W)")
    g.add_argument("--eval-every", type=int, default=5, help="sync steps (async: x W updates) between snapshots")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--delay-ms", type=float, default=40.0, help="sleep per step on the straggler; 0: no runs with one")
    g.add_argument("--straggler", type=int, default=1, help="the slow rank (a worker: 1..W)")
    g.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"],
                   help="which trainings to run (e.g. --modes async for a staleness sweep)")
    g.add_argument("--dump", default="", help="rank 0 saves {run: final flat parameters} here (tests)")
    a = p.parse_args()

    with distributed() as ctx, exact_fp32():          # TF32 off: results are compared
        world, rank, device = ctx.world_size, ctx.rank, ctx.device
        if world < 2:
            raise ValueError(f"needs a parameter server and at least one worker, got world size {world}: "
                             "use --nproc-per-node 2 or more (4: a PS and 3 workers)")
        if not 1 <= a.straggler <= (W := world - 1):
            raise ValueError(f"--straggler must be a worker rank 1..{W}, got {a.straggler}")
        train, test = load_data()
        data, (Xt, Yt) = (*(t.to(device) for t in train.tensors), train), (t.to(device) for t in test.tensors)
        torch.manual_seed(a.seed)
        model = make_mlp(128, 1, flatten=True).to(device)  # 64 -> 128 -> 10, 9,610 parameters
        theta0 = parameters_to_vector(model.parameters()).detach().cpu().clone()
        proj = torch.randn(P := theta0.numel(), generator=torch.Generator().manual_seed(1234), dtype=torch.float64)
        ps_group, workers = new_group(backend="gloo"), new_group(ranks=list(range(1, world)))
        runs, finals = {}, {}
        for delay in [0.0] + ([a.delay_ms / 1000] if a.delay_ms > 0 else []):
            for mode in a.modes:
                name, out = mode + (" + straggler" if delay else ""), {"rank": rank}
                d = delay if rank == a.straggler else 0.0
                if mode == "sync" and rank > 0:
                    snaps, out["step_s"] = run_sync(a, ctx, model, theta0, data, workers, W, d)
                    if rank == 1:                          # every worker holds the same parameters
                        out["curve"] = [(n, s, accuracy(model, th, Xt, Yt)) for n, s, th in snaps]
                        out["final"] = snaps[-1][2]
                elif mode == "async" and rank == 0:
                    snaps, out["applied"], out["final"], out["hello"] = run_ps(a, theta0, ps_group, W, proj)
                    out["curve"] = [(n, s, accuracy(model, th, Xt, Yt)) for n, s, th in snaps]
                    out["projection"] = torch.dot(proj, (theta0 - out["final"]).double()).item() / a.lr
                elif mode == "async":
                    out["pushes"], out["step_s"] = run_worker(a, ctx, model, data, ps_group, W, d, proj)
                dist.all_gather_object(parts := [None] * world, out, group=ps_group)
                if rank == 0:
                    runs[name], finals[name] = summarize(parts, mode, W, P, a, delay)
        if a.dump and rank == 0:
            torch.save(finals, a.dump)
        dist.barrier(group=ps_group)
        emit_result({"world_size": world, "workers": W, "backend": ctx.backend, "params": P,
                     "per_rank_batch": a.per_rank_batch, "lr": a.lr, "steps": a.steps, "delay_ms": a.delay_ms,
                     "straggler": a.straggler, "runs": runs})


def summarize(parts, mode, W, P, a, delay):
    """Rank 0: one run's result dict (JSON-able) and its final flat parameters."""
    holder = parts[1] if mode == "sync" else parts[0]
    res = {"mode": mode, "delay_s": delay, "curve": holder["curve"], "seconds": holder["curve"][-1][1],
           "mean_step_s": {str(q["rank"]): sum(q["step_s"]) / len(q["step_s"]) if q["step_s"] else None
                           for q in parts[1:]}}                 # None: finished no step (a late start, async)
    if mode == "sync":
        res.update(updates=a.steps, gradients=a.steps * W, bytes_sent=a.steps * W * ring_bytes_per_rank(4 * P, W))
    else:
        applied, sent = parts[0]["applied"], [x for q in parts[1:] for x in q["pushes"]]
        res["updates"] = res["gradients"] = len(applied)
        res["staleness_hist"] = sorted(collections.Counter(x[2] for x in applied).items())
        res["staleness_by_rank"] = {str(r): [x[2] for x in applied if x[0] == r] for r in range(1, W + 1)}
        first = min(parts[0]["hello"].values())           # each worker's start, after the first one's (s)
        res["start_s"] = {str(r): parts[0]["hello"][r] - first for r in range(1, W + 1)}
        res["step_halves_s"] = {str(q["rank"]): [sum(h) / max(1, len(h)) for h in (q["step_s"][:len(q["step_s"]) // 2],
                                q["step_s"][len(q["step_s"]) // 2:])] for q in parts[1:]}   # steady speeds?
        res["pushes_sent"] = sorted([x[0], x[1], x[2]] for x in sent)
        res["pushes_applied"] = sorted([x[0], x[1], x[4]] for x in applied)
        res.update(projection_displacement=parts[0]["projection"], projection_sum_applied=sum(x[4] for x in applied))
        res["bytes_sent"] = (len(applied) + W) * 4 * (2 * P + 5)   # push + reply per message, hellos too
    return res, holder["final"]


if __name__ == "__main__":
    main()
