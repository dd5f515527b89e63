"""The roofline: device table look-ups, the arithmetic, the floor and the CPU measurement."""

from __future__ import annotations

import math

import pytest
import torch

from kerneljudge.problem import Problem
from kerneljudge.timing import roofline as rl


@pytest.mark.parametrize(
    ("torch_name", "expected"),
    [
        ("NVIDIA H200", "NVIDIA H200 SXM 141GB"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe 80GB"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL 94GB"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
        ("NVIDIA B200", "NVIDIA B200 180GB"),
        ("NVIDIA L40S", "NVIDIA L40S 48GB"),
    ],
)
def test_lookup_matches_torch_device_names(torch_name: str, expected: str) -> None:
    spec = rl.lookup(torch_name)
    assert spec is not None and spec.name == expected


def test_lookup_unknown_device_is_none() -> None:
    assert rl.lookup("NVIDIA GeForce GTX 1080") is None
    assert rl.lookup("Some Accelerator") is None


def test_table_is_complete_and_sourced() -> None:
    for spec in rl.DEVICES.values():
        assert spec.memory_bandwidth_bytes_s > 1e11 and spec.fp32_tflops > 0
        assert spec.bf16_tflops and spec.tf32_tflops and spec.l2_bytes and spec.sm_count
        assert "datasheet" in spec.source and not spec.measured
        # Dense tensor-core rates double with each halving of precision on these parts.
        assert spec.bf16_tflops == pytest.approx(2 * spec.tf32_tflops, rel=0.02)
        if spec.fp8_tflops:
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02)
    h100 = rl.DEVICES["NVIDIA H100 SXM5 80GB"]
    assert (h100.memory_bandwidth_bytes_s, h100.bf16_tflops, h100.sm_count) == (3.35e12, 989.4, 132)
    assert rl.DEVICES["NVIDIA A100 SXM4 80GB"].fp8_tflops is None


def test_roofline_arithmetic() -> None:
    h100 = rl.DEVICES["NVIDIA H100 SXM5 80GB"]
    r = rl.roofline(flops=2e12, bytes=3.35e9, time_s=4e-3, spec=h100, dtype=torch.bfloat16)
    assert r.achieved_gbps == pytest.approx(3.35e9 / 4e-3 / 1e9)
    assert r.achieved_tflops == pytest.approx(500.0)
    assert r.bandwidth_fraction == pytest.approx(0.25)
    assert r.compute_fraction == pytest.approx(500.0 / 989.4)
    # Floor: bytes take 1 ms at 3.35 TB/s; 2 PFLOP at 989.4 TFLOP/s take 2.02 ms.
    assert r.floor_s == pytest.approx(max(1e-3, 2e12 / 989.4e12))
    assert not r.below_floor


def test_floor_uses_the_generous_rate_per_precision() -> None:
    h100 = rl.DEVICES["NVIDIA H100 SXM5 80GB"]
    flops = 1e12
    # fp32 may run as 3xTF32 on tensor cores: the floor uses the TF32 rate.
    assert rl.floor_s(flops, None, h100, "float32") == pytest.approx(flops / 494.7e12)
    assert rl.floor_s(flops, None, h100, "float8_e4m3fn") == pytest.approx(flops / 1978.9e12)
    # The fraction of peak for fp32 is against the CUDA-core rate.
    r = rl.roofline(flops, None, 1.0, h100, torch.float32)
    assert r.compute_fraction == pytest.approx(1.0 / 67.0)
    assert r.achieved_gbps is None and r.bandwidth_fraction is None
    # A100 has no FP8: an fp8 rate falls back to BF16.
    a100 = rl.DEVICES["NVIDIA A100 SXM4 80GB"]
    assert a100.peak_tflops("fp8") == a100.bf16_tflops


def test_below_floor() -> None:
    h200 = rl.lookup("NVIDIA H200")
    nbytes = 4.8e9  # exactly 1 ms at 4.8 TB/s
    assert rl.roofline(None, nbytes, 0.5e-3, h200, "bfloat16").below_floor
    assert not rl.roofline(None, nbytes, 0.95e-3, h200, "bfloat16").below_floor  # within margin
    assert not rl.roofline(None, nbytes, 2e-3, h200, "bfloat16").below_floor
    assert rl.roofline(None, None, 1e-9, h200, "bfloat16").floor_s == 0.0


def test_bad_arguments() -> None:
    h100 = rl.DEVICES["NVIDIA H100 SXM5 80GB"]
    with pytest.raises(ValueError, match="time_s"):
        rl.roofline(1.0, 1.0, 0.0, h100, "float32")
    with pytest.raises(ValueError, match="dtype"):
        rl.roofline(1.0, 1.0, 1.0, h100, "int4")


def test_cpu_spec_is_measured_once_and_never_rejects() -> None:
    spec = rl.cpu_spec()
    assert rl.cpu_spec() is spec and rl.lookup("cpu") is spec
    assert spec.measured and "measured" in spec.source
    assert spec.memory_bandwidth_bytes_s > 1e8 and spec.fp32_tflops > 1e-4
    assert spec.bf16_tflops and spec.bf16_tflops > 0
    assert rl.spec_for_device("cpu") is spec
    r = rl.roofline(1e12, 1e12, 1e-9, spec, "float32")
    assert r.floor_s > 1e-9 and not r.below_floor and math.isfinite(r.achieved_gbps)


def test_compute_dtype_reads_the_problem() -> None:
    assert rl.compute_dtype(Problem.load("fp8_blockwise_gemm")) == "float8_e4m3fn"
    assert rl.compute_dtype(Problem.load("rmsnorm")) == "bfloat16"
    assert rl.compute_dtype(Problem.load("layernorm")) == "float32"
