"""Test helper: how a rank ends through mgpu_utils.dist.distributed() (the shared shutdown path).

--mode ok: a DDP model stays alive to the end (it keeps the gloo process group and its worker threads
alive past destroy_process_group()); every rank registers an atexit callback (must run) and holds a
module-level object whose finalizer would print at interpreter finalization (must not: os._exit).
--mode raise / sysexit: --rank fails with a ValueError / calls sys.exit(--code).

    torchrun --standalone --nproc-per-node 2 tests/scripts/exit_paths.py --mode ok
"""
import argparse
import atexit
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu_utils.dist import distributed, emit_result


class Finalized:
    def __del__(self):
        print("FINALIZED: the interpreter ran its finalization", flush=True)


KEEP = Finalized()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ok", "raise", "sysexit"], default="ok")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--code", type=int, default=3)
    args = p.parse_args()
    with distributed(quiet=True) as ctx:
        atexit.register(print, f"ATEXIT rank {ctx.rank}", flush=True)
        model = torch.nn.Linear(4, 2)
        ddp = DDP(model) if dist.is_initialized() else model
        ddp(torch.ones(3, 4)).sum().backward()
        if ctx.rank == args.rank and args.mode == "raise":
            raise ValueError("exit path boom")
        if ctx.rank == args.rank and args.mode == "sysexit":
            sys.exit(args.code)
        emit_result({"world_size": ctx.world_size, "grad_sum": model.weight.grad.sum().item()})


if __name__ == "__main__":
    main()
