"""Test helper: each rank prints a line from C (printf), not from Python, and ends normally.

    torchrun --standalone --nproc-per-node 2 tests/scripts/c_print.py
"""
import ctypes

import torch.distributed as dist

dist.init_process_group("gloo")
ctypes.CDLL(None).printf(b"printed by C in rank %d\n", dist.get_rank())
# as mgpu_utils.dist.shutdown does: without a collective, a rank can tear down its connections while a slow peer
# is still connecting to it (a busy make test: "Gloo connectFullMesh failed ... Connection closed by peer")
dist.barrier()
dist.destroy_process_group()
