"""Test helper: a collective on a subgroup that one rank never joins (tests/package/test_dist.py, issue 57).

    MGPU_COLLECTIVE_TIMEOUT_S=3 torchrun --standalone --nproc-per-node 2 tests/scripts/subgroup_hang.py --kind group

--kind group: a new_group of ranks 0 and 1 (2 ranks or more); --kind mesh: the "dp" dimension of a 2 x 2 device
mesh (4 ranks: dp groups {0, 2} and {1, 3}). Rank 1 all-reduces on its group; its peer (rank 0, or rank 3 on the
mesh) and every other rank sleep --sleep seconds without touching any group, so only the subgroup's timeout can
end rank 1's wait (without one it lasts until the peer exits). Rank 1's error says how long it waited.
"""
import argparse
import time

import torch
import torch.distributed as dist

from mgpu_utils.dist import device_mesh, distributed, new_group

p = argparse.ArgumentParser()
p.add_argument("--kind", choices=["group", "mesh"], default="group")
p.add_argument("--sleep", type=float, default=20, help="how long the ranks that do not all-reduce sleep")
a = p.parse_args()

with distributed(quiet=True) as ctx:
    if a.kind == "group":
        group = new_group([0, 1])
    else:
        group = device_mesh(ctx.device.type, (2, 2), mesh_dim_names=("dp", "tp")).get_group("dp")
    if ctx.rank != 1:
        time.sleep(a.sleep)
        raise SystemExit(f"rank {ctx.rank} slept {a.sleep:g} s: rank 1 should have failed before")
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1, device=ctx.device), group=group)
    except Exception as e:
        raise RuntimeError(f"the subgroup all-reduce failed after {time.monotonic() - t0:.1f} s: "
                           f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
    raise SystemExit("the all-reduce completed: it should not")
