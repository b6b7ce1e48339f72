"""Two classic distributed bugs, on purpose, with a short timeout (notebooks/04_collectives.ipynb).

  --case mismatch : rank 0 calls all_reduce while the other ranks call broadcast.
  --case missing  : the last rank skips the all_reduce (it "forgot" a collective) and lingers.
  --case ok       : every rank calls the same all_reduce (the control run).

Without help a mismatch can hang or silently produce garbage, and a missing rank leaves the others
waiting until the collective timeout. Run with TORCH_DISTRIBUTED_DEBUG=DETAIL and torch checks, before
each collective, that all ranks are calling the same one with the same shapes, and names the ranks
that do not. The collective timeout here is --timeout seconds, so nothing hangs for long.

Run:
    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node 4 launch_scripts/collective_errors.py --case mismatch
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

from mgpu_utils.dist import distributed, emit_result


def main():
    p = argparse.ArgumentParser(description="mismatched and missing collectives")
    p.add_argument("--case", choices=["mismatch", "missing", "ok"], default="ok")
    p.add_argument("--timeout", type=float, default=5.0, help="collective timeout in seconds")
    args = p.parse_args()

    with distributed(timeout_s=args.timeout) as ctx:
        if not dist.is_initialized() or ctx.world_size < 2:
            raise SystemExit("these bugs need at least 2 ranks: torchrun --standalone --nproc-per-node 2 ...")
        ctx.log(f"TORCH_DISTRIBUTED_DEBUG={os.environ.get('TORCH_DISTRIBUTED_DEBUG', 'OFF')}, "
                f"timeout {args.timeout:g} s")
        # region bugs
        t = torch.ones(4, device=ctx.device) * (ctx.rank + 1)
        last = ctx.world_size - 1
        if args.case == "mismatch" and ctx.rank != 0:
            dist.broadcast(t, src=0)                 # the bug: everyone else broadcasts
        elif args.case == "missing" and ctx.rank == last:
            time.sleep(args.timeout * 3)             # the bug: this rank never joins the all-reduce
        else:
            dist.all_reduce(t)
        # endregion
        emit_result({"case": args.case, "world_size": ctx.world_size, "result": t.tolist()})


if __name__ == "__main__":
    main()
