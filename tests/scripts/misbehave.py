"""Test helper: one rank misbehaves in a chosen way; the others wait in an all-reduce.

    torchrun --standalone --nproc-per-node 2 tests/scripts/misbehave.py --mode exit --rank 1
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["raise", "exit", "sleep", "kill", "ok"], default="ok")
p.add_argument("--rank", type=int, default=1, help="the rank that misbehaves")
p.add_argument("--tag", default="", help="ignored; lets a test find these processes by command line")
p.add_argument("--message", default="plain failure without helpers", help="the message of --mode raise")
p.add_argument("--pid-dir", default="", help="each rank writes its pid to DIR/rank<r>.pid (tests check they end)")
args = p.parse_args()

rank = int(os.environ.get("RANK", 0))
dist.init_process_group("gloo")
if args.pid_dir:
    with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
print(f"ready {rank}", flush=True)
if rank == args.rank:
    if args.mode == "raise":   # plain script, no mgpu_utils: the launcher must parse the traceback
        raise RuntimeError(args.message)
    if args.mode == "exit":    # no traceback at all
        sys.stdout.flush()
        os._exit(3)
    if args.mode == "kill":    # killed by a signal (out of memory looks like this)
        os.kill(os.getpid(), signal.SIGKILL)
if args.mode == "sleep":
    time.sleep(600)
t = torch.ones(1)
dist.all_reduce(t)             # survivors wait here for the misbehaving rank
print(f"sum {t.item()}", flush=True)
dist.destroy_process_group()
