"""Test helper: the mixed tier (more ranks than GPUs) simulated on a CPU-only machine.

Unless CUDA_VISIBLE_DEVICES is the empty string (GPUs hidden, as the launcher does for ranks on gloo),
this process pretends to see one CUDA GPU, as a Colab rank would. Then every rank trains DDP(SmallCNN)
on CPU/gloo with torch's PowerSGD hook, whose code calls torch.cuda.synchronize() whenever
torch.cuda.is_available(): with the GPU visible that fails on the CPU tensors.

    torchrun --standalone --nproc-per-node 2 tests/scripts/mixed_tier.py
"""
import os

import torch

if os.environ.get("CUDA_VISIBLE_DEVICES") != "":  # a visible GPU, as CUDA would report it
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda i=0: (8, 0)
    torch.cuda.get_device_name = lambda i=0: "simulated GPU"

import torch.nn.functional as F  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from mgpu_utils.dist import distributed, emit_result  # noqa: E402
from mgpu_utils.models import SmallCNN  # noqa: E402


def main():
    with distributed() as ctx:
        torch.manual_seed(0)
        ddp = DDP(SmallCNN())
        ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2), powerSGD_hook)
        x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
        for _ in range(3):                       # 2 plain all-reduce steps, then PowerSGD
            F.cross_entropy(ddp(x), y).backward()
        emit_result({"backend": ctx.backend, "reason": ctx.reason, "device": str(ctx.device),
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "steps": 3})


if __name__ == "__main__":
    main()
