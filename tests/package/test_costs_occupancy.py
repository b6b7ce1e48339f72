"""Lesson 01, section 7: the occupancy calculator against NVIDIA's published example, every limit by hand,
the GPU path with fake device properties, and bad input named."""
from types import SimpleNamespace

import pytest

from mgpu_utils.costs.occupancy import SM_LIMITS, occupancy, sm_limits


def test_the_best_practices_guide_example():
    """CUDA C++ Best Practices Guide, "Calculating Occupancy": compute capability 7.0, 37 registers per
    thread: 128-thread blocks give 75% with 12 resident blocks; 320-thread blocks, only four blocks."""
    v100 = sm_limits(capability=(7, 0))
    small = occupancy(128, 37, 0, v100)
    assert (small["blocks"], small["occupancy"], small["limited_by"]) == (12, 0.75, "registers")
    big = occupancy(320, 37, 0, v100)
    assert (big["blocks"], big["warps"], big["limited_by"]) == (4, 40, "registers")


def test_each_limit_by_hand():
    h100 = sm_limits(capability=(9, 0))
    # 2048 threads = 64 warps per SM, 32 blocks: 32-thread blocks stop at 32 warps, whatever else
    assert occupancy(32, 0, 0, h100) == {"blocks": 32, "warps": 32, "occupancy": 0.5, "limited_by": "blocks",
                                         "per_limit": {"threads": 64, "blocks": 32}}
    assert occupancy(256, 32, 0, h100)["occupancy"] == 1.0                # 8 blocks x 8 warps
    # 64 registers: 2048 per warp, 32 warps fit in 65536 registers
    assert occupancy(256, 64, 0, h100)["per_limit"]["registers"] == 4
    # 33 registers round up to 40 per thread (1280 per warp, units of 256): 51 warps, 48 in groups of 4
    assert occupancy(128, 33, 0, h100)["per_limit"]["registers"] == 12
    # 48 KB of shared memory plus the 1 KB reserved, in 228 KB: 4 blocks
    s = occupancy(128, 32, 48 * 1024, h100)
    assert (s["blocks"], s["limited_by"], s["occupancy"]) == (4, "shared memory", 0.25)
    # a partial warp takes a whole one: 33 threads are 2 warps
    assert occupancy(33, 0, 0, h100)["per_limit"]["threads"] == 32
    # before compute capability 8.0 nothing is reserved: exactly 2 blocks of 48 KB in 96 KB
    assert occupancy(128, 0, 48 * 1024, sm_limits(capability=(7, 0)))["per_limit"]["shared memory"] == 2
    # and shared memory is allocated in units of 256 bytes there, 128 from 8.0 on: 100 bytes take 256 on a
    # V100 (384 of 96 KB: 384 blocks), 1024 + 128 on an H100 (202 blocks of 228 KB)
    assert occupancy(32, 0, 100, sm_limits(capability=(7, 0)))["per_limit"]["shared memory"] == 384
    assert occupancy(32, 0, 100, h100)["per_limit"]["shared memory"] == 228 * 1024 // 1152
    assert occupancy(1024, 0, 0, sm_limits(capability=(7, 5)))["occupancy"] == 1.0   # T4: 1024 per SM


def test_limits_from_a_device_use_what_cuda_reports():
    """The GPU path without a GPU: torch.cuda.get_device_properties's fields, faked."""
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, max_threads_per_multi_processor=2048,
                            regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                            shared_memory_per_block_optin=232448)
    lim = sm_limits(props)
    assert lim["gpus"] == "NVIDIA H200" and lim["smem"] == 233472 and lim["max_blocks"] == 32
    assert lim["capability"] == (9, 0) and lim["smem_block"] == 232448
    odd = SimpleNamespace(**{**vars(props), "max_threads_per_multi_processor": 1536})
    assert occupancy(256, 0, 0, sm_limits(odd))["per_limit"]["threads"] == 6       # read, not looked up
    assert lim["note"] is None
    # a device the table does not hold (a B200 is 10.0, a P100 6.0) still gets its limits, with a note
    new = sm_limits(SimpleNamespace(**{**vars(props), "name": "NVIDIA B200", "major": 10}))
    assert new["capability"] == (10, 0) and new["max_blocks"] == 32 and new["smem"] == 233472
    assert new["note"] == ("compute capability 10.0 is not in the table: blocks per SM and allocation units "
                           "assumed from 9.0")
    old = sm_limits(SimpleNamespace(**{**vars(props), "major": 6, "minor": 0}))
    assert old["note"].endswith("assumed from 7.0") and old["smem_unit"] == 256


def test_table_is_consistent():
    for cap, lim in SM_LIMITS.items():
        assert lim["max_threads"] % 32 == 0 and lim["smem_block"] <= lim["smem"], cap
        assert lim["reserved_smem"] == (1024 if cap >= (8, 0) else 0), cap
        assert lim["smem_unit"] == (128 if cap >= (8, 0) else 256), cap


@pytest.mark.parametrize("args,words", [
    ((2048, 32, 0), "a block holds 1 to 1024 threads, got 2048"),
    ((0, 32, 0), "a block holds 1 to 1024 threads, got 0"),
    ((256, 300, 0), "at most 255 registers .*spills.*got 300"),
    ((256, 32, 300 * 1024), "at most 232448 bytes of shared memory on this device, got 307200"),
])
def test_bad_input_names_the_limit(args, words):
    with pytest.raises(ValueError, match=words):
        occupancy(*args, sm_limits(capability=(9, 0)))


def test_an_unknown_device_names_the_known_ones():
    with pytest.raises(ValueError, match=r"compute capability \(6, 1\).*7\.0, 7\.5, 8\.0, 8\.6, 8\.9, 9\.0"):
        sm_limits(capability=(6, 1))
    with pytest.raises(ValueError, match="compute capability None"):
        sm_limits()
