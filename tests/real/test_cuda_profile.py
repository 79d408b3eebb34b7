"""A profile written by `flashsim calibrate --device cuda` on a real GPU (an NVIDIA H200 lent for one
run on 2026-12-04: scripts/device_cuda_check.sh) loads with today's schema, and its measured numbers
sit inside the GPU's physical limits from the vendor's datasheet, an expectation independent of the
bench code that wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import load_profile

PROFILE = Path(__file__).parent / "data" / "h200-cuda-profile.yaml"
# NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s
H200_HBM_BYTES_PER_S = 4.8e12
H200_HBM_BYTES = 141e9


@pytest.fixture(scope="module")
def profile():
    return load_profile(str(PROFILE))


def test_the_gpu_written_profile_loads_and_says_where_it_comes_from(profile):
    assert profile.source.kind == "measured" and profile.source.date == "2026-12-04"
    assert profile.memory.unified is False          # a discrete GPU: cudaDeviceProp.integrated == 0
    assert "NVIDIA H200" in profile.memory.source


def test_measured_numbers_sit_inside_the_datasheet_limits(profile):
    # a copy kernel cannot beat the HBM's peak; below half of it the bench would be measuring
    # something else (launch overhead, the L2)
    assert 0.5 * H200_HBM_BYTES_PER_S < profile.memory.bandwidth_bytes_per_s <= H200_HBM_BYTES_PER_S
    # totalGlobalMem is the card's HBM less what the driver keeps: within 10% of the datasheet size
    assert 0.9 * H200_HBM_BYTES < profile.memory.capacity_bytes <= 1.1 * H200_HBM_BYTES
    # a batch-1 GEMV does 2 FLOP per weight it reads: at most 1 FLOP per byte for 16-bit weights and
    # 0.5 for fp32, so the HBM's bandwidth bounds it (the quick bench's matrices may sit partly in
    # the 60 MB L2, hence the factor 2 of headroom)
    for dtype, flop_per_byte in (("fp16", 1.0), ("bf16", 1.0), ("fp32", 0.5)):
        assert 0 < profile.compute.gemv_flops_per_s[dtype] <= 2 * flop_per_byte * H200_HBM_BYTES_PER_S
