"""Test helper: each rank prints a line from C (printf), not from Python, and ends normally.

    torchrun --standalone --nproc-per-node 2 tests/scripts/c_print.py
"""
import ctypes

import torch.distributed as dist

dist.init_process_group("gloo")
ctypes.CDLL(None).printf(b"printed by C in rank %d\n", dist.get_rank())
dist.destroy_process_group()
