"""mgpu_utils.costs.hardware: the spec tables of lessons 01 and 02 and the names a GPU reports matched to them."""
import pytest

from mgpu_utils.costs.hardware import GPUS, LINKS, match_gpu


@pytest.mark.parametrize("name,key", [("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None),
                                      ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"),
                                      ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "A100"),
                                      ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
                                      ("Tesla V100-SXM2-32GB", "V100"), ("NVIDIA L4", "L4"),
                                      ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
                                      ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA L40S", None),
                                      ("NVIDIA RTX A6000", None)])
def test_match_gpu(name, key):
    assert match_gpu(name) == key


def test_spec_tables_are_complete():
    for g in GPUS.values():
        assert g["sms"] > 0 and g["hbm_gbps"] > 0 and g["fp32_tflops"] > 0 and g["fp16_tflops"] > 0 and g["source"]
        assert g["bf16_tflops"] in (None, g["fp16_tflops"])            # dense tensor cores: bf16 = fp16 where both exist
    assert GPUS["A100 40GB"]["hbm_gbps"] < GPUS["A100 80GB PCIe"]["hbm_gbps"] < GPUS["A100"]["hbm_gbps"]
    assert all(l["gbps"] > 0 and l["source"] for l in LINKS.values())
