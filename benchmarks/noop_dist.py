"""A no-op distributed job: join the process group, one barrier, leave. For launch_overhead.py.

Run:
    torchrun --standalone --nproc-per-node 4 benchmarks/noop_dist.py
"""
import json
import os

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    print("MGPU_RESULT " + json.dumps({"world_size": dist.get_world_size(), "pid": os.getpid()}), flush=True)
dist.destroy_process_group()
