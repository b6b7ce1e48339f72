"""Occupancy: how many warps of one kernel an SM keeps resident at once (lesson 01, section 7).

An SM runs the warps (32 threads each) of several thread blocks side by side and switches between them
when one waits for memory: the more warps resident, the more latency it can hide. How many blocks fit is
the smallest of four limits: the threads (warps) per SM, the blocks per SM, the registers (a thread's
registers times the block's threads, per SM) and the shared memory per block. Occupancy is the resident
warps over the SM's maximum. Higher is not always faster (a kernel that reuses registers well can win at
50%), but a kernel at 25% rarely hides its memory latency.

The limits are NVIDIA's "Technical Specifications per Compute Capability" (CUDA C++ Programming Guide);
the allocation rules are those of NVIDIA's CUDA Occupancy Calculator: registers are given to a warp in
units of 256, warps in groups of 4, shared memory in units of 256 bytes before compute capability 8.0
and of 128 bytes from 8.0 on, when the runtime also starts to reserve 1 KB of shared memory per block.
Checked in ``tests/package/test_costs_occupancy.py`` against the CUDA C++ Best Practices Guide's example
(compute capability 7.0, 37 registers per thread: 75% with 128-thread blocks, four resident blocks of 320
threads).
"""

from __future__ import annotations

WARP = 32
REG_UNIT, WARP_GROUP, MAX_REGS_PER_THREAD, MAX_THREADS_PER_BLOCK = 256, 4, 255, 1024

#: Per compute capability (major, minor): threads, blocks, 32-bit registers and shared memory (bytes,
#: the largest carve-out) per SM, the most shared memory one block may opt in to, the shared memory
#: the runtime reserves per block, and the unit shared memory is allocated in. ``gpus``: examples, as in :data:`mgpu_utils.costs.hardware.GPUS`.
SM_LIMITS: dict[tuple[int, int], dict] = {
    (7, 0): dict(gpus="V100", max_threads=2048, max_blocks=32, regs=65536, smem=96 * 1024,
                 smem_block=96 * 1024, reserved_smem=0, smem_unit=256),
    (7, 5): dict(gpus="T4", max_threads=1024, max_blocks=16, regs=65536, smem=64 * 1024,
                 smem_block=64 * 1024, reserved_smem=0, smem_unit=256),
    (8, 0): dict(gpus="A100", max_threads=2048, max_blocks=32, regs=65536, smem=164 * 1024,
                 smem_block=163 * 1024, reserved_smem=1024, smem_unit=128),
    (8, 6): dict(gpus="A40, RTX 30xx", max_threads=1536, max_blocks=16, regs=65536, smem=100 * 1024,
                 smem_block=99 * 1024, reserved_smem=1024, smem_unit=128),
    (8, 9): dict(gpus="L4, RTX 40xx", max_threads=1536, max_blocks=24, regs=65536, smem=100 * 1024,
                 smem_block=99 * 1024, reserved_smem=1024, smem_unit=128),
    (9, 0): dict(gpus="H100, H200", max_threads=2048, max_blocks=32, regs=65536, smem=228 * 1024,
                 smem_block=227 * 1024, reserved_smem=1024, smem_unit=128),
}


def sm_limits(props=None, capability: tuple[int, int] | None = None) -> dict:
    """The per-SM limits of a device: from its properties where CUDA reports them, else from the table.

    Args:
        props: ``torch.cuda.get_device_properties(i)`` (threads, registers and shared memory per SM are
            read from it; the blocks per SM, which CUDA does not report through torch, from the table).
        capability: ``(major, minor)`` when there is no device (the CPU tier), e.g. ``(9, 0)``.

    Returns:
        ``{"gpus", "max_threads", "max_blocks", "regs", "smem", "smem_block", "reserved_smem",
        "smem_unit", "capability", "note"}``; ``note`` is None, or says which row of the table stood in
        for a device whose compute capability the table does not hold (the nearest one below it, else the
        lowest): its blocks per SM and allocation rules are then assumed, not known.

    Raises:
        ValueError: no argument given, or (without a device) a compute capability the table does not
            hold (it names the ones it does).
    """
    note = None
    if props is not None:
        capability = row = (props.major, props.minor)
        if row not in SM_LIMITS:
            below = [c for c in SM_LIMITS if c < row]
            row = max(below) if below else min(SM_LIMITS)
            note = (f"compute capability {capability[0]}.{capability[1]} is not in the table: blocks per SM "
                    f"and allocation units assumed from {row[0]}.{row[1]}")
    elif capability not in SM_LIMITS:
        known = ", ".join(f"{a}.{b}" for a, b in SM_LIMITS)
        raise ValueError(f"no SM limits for compute capability {capability}: the table has {known} "
                         f"(pass capability=(major, minor) of the nearest one)")
    else:
        row = capability
    lim = dict(SM_LIMITS[row], capability=capability, note=note)
    if props is not None:
        lim.update(max_threads=props.max_threads_per_multi_processor, regs=props.regs_per_multiprocessor,
                   smem=props.shared_memory_per_multiprocessor,
                   smem_block=props.shared_memory_per_block_optin, gpus=props.name)
    return lim


def occupancy(threads_per_block: int, regs_per_thread: int, smem_per_block: int, limits: dict) -> dict:
    """Resident blocks and warps of one kernel on one SM, and which resource limits them.

    Args:
        threads_per_block: 1 to 1024.
        regs_per_thread: 32-bit registers per thread, as ``nvcc --ptxas-options=-v`` reports (0 to 255).
        smem_per_block: shared memory per block in bytes (static plus dynamic).
        limits: from :func:`sm_limits`.

    Returns:
        ``{"blocks", "warps", "occupancy" (resident warps / the SM's maximum, 0 to 1), "limited_by"
        (the resource that allows the fewest blocks: "threads", "blocks", "registers" or "shared
        memory"), "per_limit" ({resource: blocks it allows})}``.

    Raises:
        ValueError: a block over 1024 threads, over 255 registers per thread, or more shared memory than
            a block may have, each naming the limit.
    """
    if not 1 <= threads_per_block <= MAX_THREADS_PER_BLOCK:
        raise ValueError(f"a block holds 1 to {MAX_THREADS_PER_BLOCK} threads, got {threads_per_block}")
    if not 0 <= regs_per_thread <= MAX_REGS_PER_THREAD:
        raise ValueError(f"a thread has at most {MAX_REGS_PER_THREAD} registers (the compiler spills the "
                         f"rest to local memory), got {regs_per_thread}")
    if not 0 <= smem_per_block <= limits["smem_block"]:
        raise ValueError(f"a block may use at most {limits['smem_block']} bytes of shared memory on this "
                         f"device, got {smem_per_block}")
    max_warps = limits["max_threads"] // WARP
    warps = -(-threads_per_block // WARP)                    # a partial warp still takes a whole one
    per = {"threads": max_warps // warps, "blocks": limits["max_blocks"]}
    if regs_per_thread:
        per_warp = -(-regs_per_thread * WARP // REG_UNIT) * REG_UNIT
        warps_by_regs = limits["regs"] // per_warp // WARP_GROUP * WARP_GROUP
        per["registers"] = warps_by_regs // warps
    if smem_per_block:
        unit = limits["smem_unit"]
        need = -(-(smem_per_block + limits["reserved_smem"]) // unit) * unit
        per["shared memory"] = limits["smem"] // need
    limited_by = min(per, key=per.get)
    blocks = per[limited_by]
    return {"blocks": blocks, "warps": blocks * warps, "occupancy": blocks * warps / max_warps,
            "limited_by": limited_by, "per_limit": per}
