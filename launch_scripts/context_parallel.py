"""Context parallelism: ring attention and Ulysses from scratch, proven equal to one process (lesson 08).

The sequence (--seq tokens) is split over the ranks; every rank builds the same full q, k, v and upstream
gradient (one seed), computes attention on one process as the reference, then runs each mode on its own
tokens and checks its output rows and q, k, v gradients (assert_close, fp32), without and with a causal mask:

  ring      ring attention (mgpu_utils.parallel.context), contiguous shards: rank r has tokens [rL, (r+1)L)
  zigzag    the same ring with the zig-zag split: rank r has chunks r and 2n-1-r of 2n
  ulysses   all-to-all from sequence shards to head shards, attention on H/n heads, all-to-all back
  torch     PyTorch's context_parallel around F.scaled_dot_product_attention (forward checked; on CPU the
            math kernel; where it has no sharded kernel for the device, e.g. causal on CPU, "skipped" says so)

The bytes each rank sent are checked against the formulas (mgpu_utils.parallel.context). With the causal mask the
scores each rank computed and its CPU time in attention (at --time-seq) show the imbalance of contiguous shards and
its fix. The memory sweep counts the bytes autograd keeps for backward (SavedTensorCounter): ring attention on this
rank against attention on one process. Rank 0 prints one JSON line.
World size: any that divides --seq by 2n (and --heads, for ulysses).
    torchrun --standalone --nproc-per-node 4 launch_scripts/context_parallel.py
"""
import argparse
import math
import statistics
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.testing import assert_close

from mgpu_utils.checks import exact_fp32
from mgpu_utils.dist import device_mesh, distributed, emit_result
from mgpu_utils.measure.memory import SavedTensorCounter
from mgpu_utils.parallel.context import new_log, ring_attention, shard, ulysses_attention

MODES = ("ring", "zigzag", "ulysses", "torch")


def reference_attention(q, k, v, causal):
    """softmax(q k^T / sqrt(D)) v on one process, written out (it keeps the S x S probabilities)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def run_mode(mode, q, k, v, causal, log):
    """This rank's output rows for q, k, v (its own tokens), by one mode."""
    if mode == "ulysses":
        return ulysses_attention(q, k, v, causal=causal, log=log)
    return ring_attention(q, k, v, seq_len=q.shape[2] * dist.get_world_size(),
                          layout="zigzag" if mode == "zigzag" else "contiguous", causal=causal, log=log)


def inputs(args, device):
    """q, k, v and the upstream gradient w, full length, the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.sequences, args.heads, args.seq, args.head_dim)
    return [torch.randn(shape, generator=g).to(device) for _ in range(4)]


def check_torch(args, rank, n, device):
    """PyTorch's context_parallel against the reference (forward): (rows, why a case cannot run)."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard  # as torch's tutorial
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = inputs(args, device)[:3]
    mesh, rows, reasons, cpu = device_mesh(device.type, (n,)), [], [], device.type == "cpu"
    for causal in (False, True):
        bufs = [t.clone() for t in (q, k, v)]                # context_parallel shards them in place
        kernel = sdpa_kernel(SDPBackend.MATH) if cpu and not causal else nullcontext()
        try:     # on CPU the math kernel: DTensor shards the flash one by decomposing it (15 s a rank)
            with kernel, context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
                out = torch.nn.functional.scaled_dot_product_attention(*bufs, is_causal=causal)
        except NotImplementedError as e:                     # no sharded attention kernel for this device
            reasons.append(f"torch causal={causal}: context_parallel does not run on {device.type} "
                           f"in torch {torch.__version__}: " + str(e).strip().splitlines()[0][:160])
            continue
        full = context_parallel_unshard(mesh, [out], [2])[0]
        assert_close(full, reference_attention(q, k, v, causal), rtol=1e-4, atol=1e-4)
        rows.append({"mode": "torch", "causal": causal, "world_size": n})
    return rows, reasons


def expected_bytes(mode, kv_bytes, n):
    """(forward, backward) bytes each rank sends, from the formulas (kv_bytes: this rank's K)."""
    if mode == "ulysses":
        return 4 * kv_bytes * (n - 1) // n, 4 * kv_bytes * (n - 1) // n
    return 2 * (n - 1) * kv_bytes, (2 * (n - 1) + 2 * n) * kv_bytes if n > 1 else 0


def check(mode, causal, args, rank, n, device):
    """Run one mode against the reference; returns its row (bytes, work, errors)."""
    layout = "zigzag" if mode == "zigzag" else "contiguous"
    q, k, v, w = inputs(args, device)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*full, causal)
    (ref * w).sum().backward()
    mine = [shard(t, rank, n, layout).requires_grad_() for t in (q, k, v)]
    log = new_log()
    out = run_mode(mode, *mine, causal, log)
    fwd = dict(log)
    (out * shard(w, rank, n, layout)).sum().backward()
    assert_close(out, shard(ref, rank, n, layout).detach(), rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", mine, full):
        assert_close(a.grad, shard(b.grad, rank, n, layout), rtol=1e-5, atol=1e-5,
                     msg=lambda m, name=name: f"{mode} causal={causal}: d{name} differs: {m}")
    kv_bytes = mine[1].numel() * mine[1].element_size()
    want = expected_bytes(mode, kv_bytes, n)
    got = (fwd["bytes_sent"], log["bytes_sent"] - fwd["bytes_sent"])
    assert got == want, f"{mode}: sent {got} bytes (forward, backward), the formula says {want}"
    return {"mode": mode, "causal": causal, "world_size": n, "kv_bytes": kv_bytes,
            "fwd_bytes": got[0], "bwd_bytes": got[1], "score_elems": fwd["score_elems"],
            "peak_block_elems": fwd["peak_block_elems"],
            "max_err_out": (out - shard(ref, rank, n, layout)).abs().max().item()}


def compute_seconds(mode, args, n, device):
    """Median CPU seconds this rank spent in attention blocks (forward + backward, causal): its work."""
    shape = (args.sequences, args.heads, args.time_seq // (2 * n) * 2, args.head_dim)   # zig-zag: 2 chunks
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
    logs = [new_log() for _ in range(args.repeats + 1)]          # the first one warms up
    for log in logs:
        run_mode(mode, q, k, v, True, log).sum().backward()
    return statistics.median(log["compute_s"] for log in logs[1:])


def saved_bytes(seq, args, rank, n, device):
    """Bytes kept for backward: (ring attention on this rank, plain attention of the whole sequence)."""
    shape = (args.sequences, args.heads, seq, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
    with SavedTensorCounter() as plain:
        reference_attention(q, k, v, True)
    mine = [shard(t, rank, n).detach().requires_grad_() for t in (q, k, v)]
    with SavedTensorCounter() as ring:
        ring_attention(*mine, seq_len=seq, causal=True)
    return ring.bytes, plain.bytes


def main():
    p = argparse.ArgumentParser(description="ring attention and Ulysses against attention on one process")
    g = p.add_argument_group("problem")
    g.add_argument("--seq", type=int, default=48, help="tokens in the whole sequence (split over the ranks)")
    g.add_argument("--heads", type=int, default=4, help="attention heads (Ulysses splits them over the ranks)")
    g.add_argument("--head-dim", type=int, default=8, help="size of one head")
    g.add_argument("--sequences", type=int, default=2, help="sequences in the batch (the same on every rank)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("what to run")
    g.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    g.add_argument("--repeats", type=int, default=3, help="timed forward + backward per mode (median)")
    g.add_argument("--time-seq", type=int, default=1024, help="sequence length of the timed causal runs")
    g.add_argument("--sweep-seq", default="64,128,256", help="sequence lengths of the memory sweep ('' = none)")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown mode(s) {sorted(unknown)}: choose from {', '.join(MODES)}")

    with distributed() as ctx, exact_fp32():
        if not dist.is_initialized():
            raise SystemExit("needs a process group: run under torchrun (--nproc-per-node 1 works)")
        rank, n = ctx.rank, ctx.world_size
        rows, skipped = [], []
        for mode in modes:
            if mode == "torch":
                got, reasons = check_torch(args, rank, n, ctx.device)
                rows, skipped = rows + got, skipped + reasons
                for r in got:
                    ctx.log(f"torch    causal={r['causal']!s:5s} equal to one process (output)")
                for reason in reasons:
                    ctx.log(f"SKIPPED {reason}")
                continue
            if mode == "ulysses" and args.heads % n:
                skipped.append(f"ulysses: {args.heads} heads are not divisible by {n} ranks")
                ctx.log(f"SKIPPED {skipped[-1]}")
                continue
            for causal in (False, True):
                row = check(mode, causal, args, rank, n, ctx.device)
                per_rank = row["score_elems_per_rank"] = [None] * n
                dist.all_gather_object(per_rank, row["score_elems"])
                rows.append(row)
                ctx.log(f"{mode:8s} causal={causal!s:5s} equal to one process (output, dq, dk, dv); sent "
                        f"{row['fwd_bytes']} + {row['bwd_bytes']} bytes (formula); scores per rank {per_rank}")
        timings = {}
        for mode in (m for m in modes if m in ("ring", "zigzag")):    # Ulysses: every rank has all S tokens
            secs = [None] * n
            dist.all_gather_object(secs, compute_seconds(mode, args, n, ctx.device))
            timings[mode] = secs
            ctx.log(f"{mode:8s} causal, S={args.time_seq // (2 * n) * 2 * n}: attention compute per rank (CPU time) "
                    + " ".join(f"{s * 1e3:.0f} ms" for s in secs))
        memory = [dict(zip(("seq", "ring_saved_bytes", "plain_saved_bytes"), (s, *saved_bytes(s, args, rank, n,
                  ctx.device)))) for s in (int(v) for v in args.sweep_seq.split(",") if v)]
        for m in memory:
            ctx.log(f"S={m['seq']}: kept for backward: ring {m['ring_saved_bytes'] / 1e3:.1f} kB per rank, "
                    f"one process {m['plain_saved_bytes'] / 1e3:.1f} kB")
        emit_result({"world_size": n, "backend": ctx.backend, "seq": args.seq, "heads": args.heads,
                     "head_dim": args.head_dim, "sequences": args.sequences, "checks": rows,
                     "skipped": skipped, "compute_seconds_per_rank": timings, "memory": memory})


if __name__ == "__main__":
    main()
