"""Preflight before a big job: can every node reach the rendezvous, and every rank its GPU and its peers?

Two checks, one file (notebooks/12_fault_tolerance.ipynb, cluster/README.md):

* **Nodes** (plain python, one process per node, before torchrun: job.sbatch runs it with srun, multinode.sh
  on each host). Node 0 serves a store at --endpoint; every node signs in with its host name. A node that
  cannot connect within --timeout says so, and node 0 names every node missing, with the usual fixes (not
  after torchrun's 10-minute timeout). Node rank and count: --node-rank, --nnodes, or Slurm's.
* **Ranks** (under torchrun): each rank reports its host, node, local rank, device, backend and
  CUDA_VISIBLE_DEVICES; rank 0 prints them as a table with the variables that matter (NCCL_*, MASTER_*,
  GLOO_*). Then: an all-gather of the ranks' ids (each rank's own slot must hold its id), a monitored
  barrier on gloo (it names the rank that did not arrive within --timeout), and an all-reduce bandwidth
  sweep (algbw, busbw as nccl-tests count them). --require-gpu fails on a rank that got no GPU.

Run (ranks; nodes: add --nnodes N --node-rank K --endpoint HOST:PORT and start it without torchrun):
    torchrun --standalone --nproc-per-node 4 launch_scripts/preflight.py --max-mib 4
"""
import argparse
import datetime
import json
import os
import socket
import sys
import time

if "RANK" not in os.environ:     # the node check: c10d's retry warnings (C++ frames) would bury its own one line
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
import torch  # noqa: E402 (after the log level, which torch reads when it loads)
import torch.distributed as dist

from mgpu_utils.costs.bandwidth import algbw_gbps, busbw_gbps
from mgpu_utils.dist import distributed, emit_result, new_group

SHOWN = ("MASTER_", "NCCL_", "GLOO_", "TORCH_NCCL", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NTASKS")
FIXES = ("check: the endpoint is the first node's address as the other nodes see it (RDZV_HOST); "
         "the port is open between the nodes (firewall, RDZV_PORT); the first node's step started")


def endpoint_problem(host, port, serve):
    """What is wrong with the endpoint, found at once (a name that does not resolve; for node 0, which serves it,
    an address that is not this node's, or a port another process holds), with the fix; None if nothing is."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        return f"{host} does not resolve ({e.strerror}); fix: RDZV_HOST, the first node's name or address"
    for where, what in (((addr[0], 0), "address"), (("", port), "port")) if serve else ():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # as the store: a closed one's port is free
            try:
                s.bind(where)
            except OSError:
                return (f"{host} ({addr[0]}) is not an address of this node; fix: RDZV_HOST, an address of the first "
                        "node (it serves the rendezvous)") if what == "address" else \
                    f"another process holds the port {port}: choose another (RDZV_PORT)"
    return None


def reach(host, port, seconds):
    """Connect until ``host:port`` answers (None) or ``seconds`` pass (the last error: torch's client would take 3x)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(2.0, left))):
                return None
        except OSError as e:
            if left <= 0.2:
                return f"{type(e).__name__}: {e.strerror or e}"
            time.sleep(0.2)


def check_nodes(args):
    """The node check: returns 0 when all --nnodes nodes signed in at the endpoint, else 1."""
    n = args.nnodes or int(os.environ.get("SLURM_NTASKS", "1"))
    k = args.node_rank if args.node_rank is not None else int(os.environ.get("SLURM_PROCID", "0"))
    host, _, port = args.endpoint.rpartition(":")
    me = f"node {k} ({socket.gethostname()})"
    what = ("cannot serve the rendezvous" if k == 0 else "cannot reach the rendezvous") + f" at {args.endpoint}"
    problem = endpoint_problem(host, int(port), k == 0)
    if problem:
        print(f"{me} {what}: {problem}", flush=True)
        return 1
    wait = datetime.timedelta(seconds=args.timeout)
    t0 = time.monotonic()
    error = None if k == 0 else reach(host, int(port), args.timeout)
    try:
        store = None if error else dist.TCPStore(host, int(port), None, k == 0, wait, wait_for_workers=False)
    except Exception as e:       # a server answered, but not the store ("Ping failed"), or it went away
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if error:                    # refused, unreachable, something else there: the usual fixes
        print(f"{me} {what} within {time.monotonic() - t0:.0f} s (--timeout {args.timeout:g}):\n  {error}\n"
              f"  {FIXES}", flush=True)
        return 1
    store.set(f"node{k}", socket.gethostname())
    store.add("signed_in", 1)
    if k != 0:
        store.wait(["verdict"], wait + datetime.timedelta(seconds=10))   # node 0 waits up to --timeout
        verdict = store.get("verdict").decode()
        store.add("read", 1)                          # the last call: node 0 may close the store after it
        print(f"{me} reached the rendezvous at {args.endpoint}: {verdict}", flush=True)
        return 0 if verdict.startswith("all") else 1
    deadline = time.monotonic() + args.timeout
    while store.add("signed_in", 0) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    missing = [i for i in range(n) if not store.check([f"node{i}"])]
    hosts = {i: store.get(f"node{i}").decode() for i in range(n) if i not in missing}
    verdict = (f"all {n} nodes signed in" if not missing else
               f"{len(missing)} of {n} nodes missing: " + ", ".join(f"node {i}" for i in missing))
    store.set("verdict", verdict)
    print(f"{me}: {verdict} at {args.endpoint} " + json.dumps({f"node {i}": h for i, h in hosts.items()}))
    for i in missing:
        print(f"  node {i} did not reach the rendezvous within {args.timeout:g} s: see its own output;\n"
              f"  {FIXES}")
    deadline = time.monotonic() + 5                   # the store lives until the others have read it
    while store.add("read", 0) < n - 1 - len(missing) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 1 if missing else 0


def time_allreduce(t, repeats, group):
    """Median seconds of one all-reduce of ``t`` (the slowest rank's, after one warm-up call)."""
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if t.is_cuda:
            torch.cuda.synchronize()
        sec = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(sec, op=dist.ReduceOp.MAX, group=group)
        times.append(sec.item())
    return sorted(times[1:])[repeats // 2]


def check_ranks(args, ctx):
    """The rank checks under torchrun; raises with the rank and the fix when one fails."""
    n = ctx.world_size
    me = {"rank": ctx.rank, "host": socket.gethostname(), "node": int(os.environ.get("GROUP_RANK", "0")),
          "local_rank": ctx.local_rank, "device": str(ctx.device), "backend": ctx.backend,
          "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")}
    if args.require_gpu and ctx.device.type != "cuda":
        raise RuntimeError(f"rank {ctx.rank} on {me['host']} got no GPU ({ctx.reason}); fix: ask Slurm for one "
                           "GPU per rank (--gpus-per-node), or start fewer ranks per node (NPROC_PER_NODE)")
    if not dist.is_initialized():
        emit_result({"world_size": 1, "ranks": [me], "sweep": []})
        return
    cpu = new_group(backend="gloo")               # monitored_barrier needs gloo, also beside NCCL
    table = [None] * n
    dist.all_gather_object(table, me, group=cpu)
    row = "{:>4} {:>4} {:<16} {:>5} {:<8} {:<7} {}".format
    ctx.log("\n".join([row("rank", "node", "host", "local", "device", "backend", "CUDA_VISIBLE_DEVICES")] +
                      [row(r["rank"], r["node"], r["host"][:16], r["local_rank"], r["device"], r["backend"],
                           r["CUDA_VISIBLE_DEVICES"]) for r in table]))
    ctx.log("environment: " + (" ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                        if k.startswith(SHOWN)) or "(none of NCCL_*, MASTER_*, GLOO_*)"))
    gathered = [torch.zeros(1, dtype=torch.int64, device=ctx.device) for _ in range(n)]
    dist.all_gather(gathered, torch.tensor([ctx.rank], device=ctx.device))
    ids = torch.cat(gathered).cpu()
    wrong = [r for r in range(n) if ids[r] != r]
    if wrong:
        raise RuntimeError(f"all-gather put wrong values in the slots of ranks {wrong}: {ids.tolist()}")
    dist.monitored_barrier(group=cpu, timeout=datetime.timedelta(seconds=args.timeout), wait_all_ranks=True)
    ctx.log(f"all-gather of {n} rank ids: correct; monitored barrier: all {n} ranks arrived")
    sweep, size = [], 4096
    while size <= args.max_mib * 2**20:
        t = torch.ones(size // 4, device=ctx.device)
        sec = time_allreduce(t, args.repeats, cpu)
        sweep.append({"bytes": size, "seconds": sec, "algbw_GBps": algbw_gbps(size, sec),
                      "busbw_GBps": busbw_gbps("all_reduce", size, sec, n)})
        size *= 8
    ctx.log("all-reduce     size  algbw GB/s  busbw GB/s\n" + "\n".join(
        f"{s['bytes'] / 2**10:12.0f} KiB {s['algbw_GBps']:10.3f} {s['busbw_GBps']:10.3f}" for s in sweep))
    emit_result({"world_size": n, "ranks": table, "sweep": sweep})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_argument_group("nodes (plain python, one process per node, before torchrun)")
    g.add_argument("--endpoint", help="HOST:PORT where node 0 serves the check's store")
    g.add_argument("--nnodes", type=int, help="number of nodes (default: $SLURM_NTASKS)")
    g.add_argument("--node-rank", type=int, help="this node's index, 0..nnodes-1 (default: $SLURM_PROCID)")
    g = p.add_argument_group("ranks (under torchrun)")
    g.add_argument("--max-mib", type=int, default=4, help="largest all-reduce of the sweep, MiB")
    g.add_argument("--repeats", type=int, default=5, help="timed all-reduces per size")
    g.add_argument("--require-gpu", action="store_true", help="fail on a rank that got no GPU")
    g = p.add_argument_group("both")
    g.add_argument("--timeout", type=float, default=30, help="seconds to wait for a node or a rank")
    args = p.parse_args()
    if "RANK" not in os.environ:
        if not args.endpoint:
            p.error("without torchrun this is the node check: give --endpoint HOST:PORT "
                    "(or start it with torchrun for the rank checks)")
        sys.exit(check_nodes(args))
    with distributed() as ctx:
        check_ranks(args, ctx)


if __name__ == "__main__":
    main()
