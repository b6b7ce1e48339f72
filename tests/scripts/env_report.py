"""Test helper: every rank reports what it was started with (environment, argv, path, threads, cwd).

    torchrun --standalone --nproc-per-node 2 tests/scripts/env_report.py --flag value
"""
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import mgpu_utils

dist.init_process_group("gloo")
report = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "path": sys.path,
    "cwd": os.getcwd(),
    "name": __name__,
    "file": __file__,
    "threads": torch.get_num_threads(),
    "numpy_draw": float(np.random.rand()),
    "torch_seed": torch.initial_seed(),
    "fresh_mgpu_utils": not hasattr(mgpu_utils, "_template_marker"),
    "stdout_is_file": not sys.stdout.isatty(),
}
try:
    from threadpoolctl import threadpool_info

    report["blas_threads"] = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
except ImportError:
    report["blas_threads"] = None
reports = [None] * dist.get_world_size()
dist.all_gather_object(reports, report)
if dist.get_rank() == 0:
    print("MGPU_RESULT " + json.dumps({"ranks": reports}), flush=True)
dist.destroy_process_group()
