"""Every point-to-point op and collective on small tensors, recorded before and after on every rank.

For notebooks/04_collectives.ipynb: rank r starts with x_r = [10r, 10r+1, ..., 10r+k-1] (k = 2n, so
it splits into n chunks; 100r + j when 2n > 10), each op runs on a fresh copy, and rank 0 gathers every rank's tensors
before and after so the notebook can draw them. The barrier records when each rank arrived and left
(rank r sleeps 50r ms first). A capability probe tries each op with each dtype on this backend and
checks the fallbacks that older releases needed on gloo (AVG = SUM / n; reduce_scatter = all_reduce
+ own chunk; all_to_all = n-1 rounds of isend/irecv) against the real ops.

Run:
    torchrun --standalone --nproc-per-node 4 launch_scripts/collectives_demo.py
"""
import time

import torch
import torch.distributed as dist

from mgpu_utils.compat import all_gather_single, reduce_scatter_single
from mgpu_utils.dist import distributed, emit_result


def run_ops(x, rank, n):
    """{op: this rank's tensor after the op}; each op gets its own copy of x (shape (2n,))."""
    out = {}
    c = x.clone()
    if rank == 0:                             # blocking point-to-point: rank 0 -> rank 1
        dist.send(c, dst=1)
    elif rank == 1:
        dist.recv(c, src=0)
    out["send/recv (0 to 1)"] = c
    c, buf = x.clone(), torch.empty_like(x)   # non-blocking: everyone sends right, receives from left
    for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, c, (rank + 1) % n),   # posted together: no
                                     dist.P2POp(dist.irecv, buf, (rank - 1) % n)]):  # cycle of waiting sends
        r.wait()
    out["isend/irecv (ring shift)"] = buf
    c = x.clone()
    dist.broadcast(c, src=0)
    out["broadcast"] = c
    c = torch.empty(2, dtype=x.dtype, device=x.device)
    dist.scatter(c, list(x.clone().chunk(n)) if rank == 0 else None, src=0)
    out["scatter"] = c
    bufs = [torch.empty_like(x) for _ in range(n)] if rank == 0 else None
    dist.gather(x.clone(), bufs, dst=0)
    out["gather"] = torch.cat(bufs) if rank == 0 else torch.empty(0, dtype=x.dtype, device=x.device)
    c = x.clone()
    dist.reduce(c, dst=0)                     # only rank 0's result is defined
    out["reduce"] = c if rank == 0 else torch.empty(0, dtype=x.dtype, device=x.device)
    c = x.clone()
    dist.all_reduce(c)
    out["all_reduce"] = c
    c = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
    all_gather_single(c, x.clone())
    out["all_gather"] = c
    c = torch.empty(2, dtype=x.dtype, device=x.device)
    reduce_scatter_single(c, x.clone())
    out["reduce_scatter"] = c
    c = torch.empty_like(x)
    dist.all_to_all_single(c, x.clone())
    out["all_to_all"] = c
    return out


def probe(device, n, rank):
    """Which op/dtype pairs this backend runs: {op: {dtype: "ok" or the error's first line}}."""
    ops = {"all_reduce SUM": lambda t: dist.all_reduce(t),
           "all_reduce AVG": lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG),
           "all_reduce MAX": lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX),
           "broadcast": lambda t: dist.broadcast(t, 0),
           "all_gather": lambda t: all_gather_single(torch.empty(n * 2 * n, dtype=t.dtype,
                                                                           device=device), t),
           "reduce_scatter": lambda t: reduce_scatter_single(torch.empty(2, dtype=t.dtype, device=device), t),
           "all_to_all": lambda t: dist.all_to_all_single(torch.empty_like(t), t)}
    table = {}
    for name, op in ops.items():
        table[name] = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
            try:
                op(torch.ones(2 * n, dtype=dtype, device=device))
                table[name][str(dtype).replace("torch.", "")] = "ok"
            except Exception as e:  # the probe's purpose: record what is unsupported
                table[name][str(dtype).replace("torch.", "")] = str(e).splitlines()[0][:80]
    return table


def fallbacks_match(x, rank, n):
    """The fallbacks equal the real ops (so they are safe where an op is missing)."""
    avg = x.clone().float()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    s = x.clone().float()
    dist.all_reduce(s)
    rs = torch.empty(2, dtype=x.dtype, device=x.device)
    reduce_scatter_single(rs, x.clone())
    full = x.clone()
    dist.all_reduce(full)
    a2a = torch.empty_like(x)
    dist.all_to_all_single(a2a, x.clone())
    mine = list(x.chunk(n))
    got = [mine[rank].clone()] + [None] * (n - 1)
    for k in range(1, n):                     # round k: send chunk to rank+k, receive from rank-k
        buf = torch.empty_like(mine[0])
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine[(rank + k) % n].contiguous(), (rank + k) % n),
                                         dist.P2POp(dist.irecv, buf, (rank - k) % n)]):
            r.wait()
        got[k] = buf
    by_source = [got[(rank - src) % n] for src in range(n)]
    return {"AVG = SUM / n": torch.allclose(avg, s / n),
            "reduce_scatter = all_reduce + own chunk": torch.equal(rs, full.chunk(n)[rank]),
            "all_to_all = n-1 rounds of isend/irecv": torch.equal(a2a, torch.cat(by_source))}


def main():
    with distributed() as ctx:
        if not dist.is_initialized() or ctx.world_size < 2:
            raise SystemExit("collectives need at least 2 ranks: torchrun --standalone --nproc-per-node 4 ...")
        rank, n, dev = ctx.rank, ctx.world_size, ctx.device
        base = 10 if 2 * n <= 10 else 100         # values 10r + j (or 100r + j) show where they came from
        x = torch.arange(2 * n, device=dev) + base * rank
        after = {k: v.tolist() for k, v in run_ops(x, rank, n).items()}
        time.sleep(0.05 * rank)                   # ranks reach the barrier at different times
        arrive = time.time()
        dist.barrier()
        leave = time.time()
        mine = {"before": x.tolist(), "after": after, "barrier": [arrive, leave],
                "fallbacks": fallbacks_match(x, rank, n)}
        everyone = [None] * n
        dist.all_gather_object(everyone, mine)
        table = probe(dev, n, rank)
        t0 = min(e["barrier"][0] for e in everyone)
        ops = {op: [e["after"][op] for e in everyone] for op in everyone[0]["after"]}
        ok = sum(v == "ok" for d in table.values() for v in d.values())
        ctx.log(f"{len(ops)} ops recorded on {n} ranks; probe: {ok}/{sum(len(d) for d in table.values())} "
                f"op/dtype pairs supported by {ctx.backend}")
        emit_result({"world_size": n, "backend": ctx.backend, "base": base, "before": [e["before"] for e in everyone],
                     "after": ops, "barrier_ms": [[1e3 * (e["barrier"][0] - t0), 1e3 * (e["barrier"][1] - t0)]
                                                  for e in everyone],
                     "probe": table, "fallbacks_equal": all(all(e["fallbacks"].values()) for e in everyone),
                     "fallbacks": everyone[0]["fallbacks"]})


if __name__ == "__main__":
    main()
