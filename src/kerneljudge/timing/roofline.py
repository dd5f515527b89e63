"""Roofline: achieved throughput against a device's peaks, and the physical time floor.

A forward call that moves ``bytes`` through device memory and does ``flops`` floating-point
operations cannot finish faster than ``floor_s = max(bytes / peak_bandwidth, flops / peak_rate)``
(Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4), 2009). A measured time below that floor means the candidate
skipped work (cached results, aliased outputs, a timer it fooled); the judge rejects it.

Peak figures come from the vendors' datasheets (dense tensor-core figures: the datasheets print
the 2:4-sparsity figures, twice the dense ones, marked with an asterisk) and are cited per entry
in :attr:`DeviceSpec.source`. For the CPU there is no datasheet to trust: :func:`cpu_spec`
measures a copy bandwidth and a matmul rate once per process; those figures are marked
``measured`` and never give a ``below_floor`` rejection (caches beat a measured DRAM copy).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DEVICES",
    "FLOOR_MARGIN",
    "DeviceSpec",
    "RooflineResult",
    "compute_dtype",
    "cpu_spec",
    "floor_s",
    "lookup",
    "roofline",
    "spec_for_device",
]

#: A time counts as below the floor when it is under ``FLOOR_MARGIN * floor_s``: 10% of slack
#: for timer resolution and for the counts being a model of the work, not a measurement.
FLOOR_MARGIN = 0.9

_MiB = 1024 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one device.

    Attributes:
        name: a readable name, e.g. ``"NVIDIA H100 SXM5 80GB"``.
        memory_bandwidth_bytes_s: peak DRAM (HBM/GDDR) bandwidth in bytes per second.
        fp32_tflops: peak dense FP32 rate on the CUDA cores (no tensor cores), TFLOP/s.
        tf32_tflops: peak dense TF32 tensor-core rate, TFLOP/s (None where absent).
        bf16_tflops: peak dense BF16/FP16 tensor-core rate with FP32 accumulation, TFLOP/s.
        fp8_tflops: peak dense FP8 tensor-core rate, TFLOP/s (None where the device has none).
        l2_bytes: L2 cache size in bytes (None when unknown); the timing stage flushes more.
        sm_count: streaming multiprocessors (CPU: threads used).
        source: where the figures come from (datasheet, or how they were measured).
        measured: True for figures measured on this machine rather than taken from a datasheet.
    """

    name: str
    memory_bandwidth_bytes_s: float
    fp32_tflops: float
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    l2_bytes: int | None
    sm_count: int | None
    source: str
    measured: bool = False

    def peak_tflops(self, dtype: torch.dtype | str) -> float:
        """The nominal peak for ``dtype``: what "fraction of peak" is measured against.

        fp32 (and fp64) use the CUDA-core FP32 rate; bf16/fp16 the BF16 tensor-core rate; fp8
        the FP8 tensor-core rate (the BF16 rate on devices without FP8).
        """
        precision = _precision(dtype)
        if precision == "fp32":
            return self.fp32_tflops
        if precision == "tf32":
            return self.tf32_tflops or self.fp32_tflops
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops or self.fp32_tflops

    def floor_tflops(self, dtype: torch.dtype | str) -> float:
        """The rate used for the time floor: the fastest an admissible kernel could go.

        Generous on purpose, so that no honest kernel falls below the floor: an fp32 problem may
        run on TF32 tensor cores with split-precision tricks (3xTF32), so its floor uses the TF32
        rate; the other precisions use :meth:`peak_tflops`.
        """
        if _precision(dtype) in ("fp32", "tf32"):
            return max(self.fp32_tflops, self.tf32_tflops or 0.0)
        return self.peak_tflops(dtype)


@dataclass(frozen=True)
class RooflineResult:
    """Achieved throughput of one timed call.

    Attributes:
        achieved_gbps: bytes / time, in GB/s (1e9 bytes per second); None without a byte count.
        achieved_tflops: flops / time, in TFLOP/s; None without a FLOP count.
        bandwidth_fraction: achieved bandwidth over the device's peak bandwidth.
        compute_fraction: achieved rate over :meth:`DeviceSpec.peak_tflops` for the dtype.
        floor_s: ``max(bytes / peak bandwidth, flops / floor rate)`` in seconds (0 when neither
            count is known).
        below_floor: the time is under ``FLOOR_MARGIN * floor_s`` on a datasheet device: the
            call cannot have done the work. Always False for measured (CPU) figures.
    """

    achieved_gbps: float | None
    achieved_tflops: float | None
    bandwidth_fraction: float | None
    compute_fraction: float | None
    floor_s: float
    below_floor: bool = False


# Dense figures: each datasheet prints tensor-core rates "with sparsity" (marked *); the dense
# rate is half of that. SM counts and L2 sizes come from the architecture whitepapers.
_H100_SRC = (
    "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column: 3.35 TB/s HBM3, FP32 67 "
    "TFLOPS, TF32 989 / BF16 1,979 / FP8 3,958 TFLOPS with sparsity; NVIDIA H100 Tensor Core "
    "GPU Architecture whitepaper: 132 SMs, 50 MB L2"
)
_DEVICES: tuple[tuple[tuple[str, ...], DeviceSpec], ...] = (
    (
        ("h200", "nvl"),
        DeviceSpec(
            "NVIDIA H200 NVL",
            4.8e12,
            60.0,
            417.5,
            835.5,
            1670.5,
            50 * _MiB,
            132,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 NVL column: 4.8 TB/s HBM3e, FP32 "
            "60 TFLOPS, TF32 835 / BF16 1,671 / FP8 3,341 TFLOPS with sparsity; GH100: 50 MB L2",
        ),
    ),
    (
        ("h200",),
        DeviceSpec(
            "NVIDIA H200 SXM 141GB",
            4.8e12,
            67.0,
            494.7,
            989.4,
            1978.9,
            50 * _MiB,
            132,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM column: 4.8 TB/s HBM3e, FP32 "
            "67 TFLOPS, TF32 989 / BF16 1,979 / FP8 3,958 TFLOPS with sparsity; same GH100 die "
            "as H100 SXM: 132 SMs, 50 MB L2",
        ),
    ),
    (
        ("h100", "pcie"),
        DeviceSpec(
            "NVIDIA H100 PCIe 80GB",
            2.0e12,
            51.0,
            378.0,
            756.0,
            1513.0,
            50 * _MiB,
            114,
            "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 PCIe column: 2 TB/s HBM2e, FP32 51 "
            "TFLOPS, TF32 756 / BF16 1,513 / FP8 3,026 TFLOPS with sparsity; 114 SMs, 50 MB L2",
        ),
    ),
    (
        ("h100", "nvl"),
        DeviceSpec(
            "NVIDIA H100 NVL 94GB",
            3.9e12,
            60.0,
            417.5,
            835.5,
            1670.5,
            50 * _MiB,
            132,
            "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 NVL column: 3.9 TB/s HBM3, FP32 60 "
            "TFLOPS, TF32 835 / BF16 1,671 / FP8 3,341 TFLOPS with sparsity; 50 MB L2",
        ),
    ),
    (
        ("h100",),
        DeviceSpec(
            "NVIDIA H100 SXM5 80GB",
            3.35e12,
            67.0,
            494.7,
            989.4,
            1978.9,
            50 * _MiB,
            132,
            _H100_SRC,
        ),
    ),
    (
        ("a100", "pcie", "80gb"),
        DeviceSpec(
            "NVIDIA A100 PCIe 80GB",
            1.935e12,
            19.5,
            156.0,
            312.0,
            None,
            40 * _MiB,
            108,
            "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB PCIe column: 1,935 GB/s "
            "HBM2e, FP32 19.5 TFLOPS, TF32 156 / BF16 312 TFLOPS dense; NVIDIA A100 Tensor Core "
            "GPU Architecture whitepaper: 108 SMs, 40 MB L2",
        ),
    ),
    (
        ("a100", "80gb"),
        DeviceSpec(
            "NVIDIA A100 SXM4 80GB",
            2.039e12,
            19.5,
            156.0,
            312.0,
            None,
            40 * _MiB,
            108,
            "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB SXM column: 2,039 GB/s "
            "HBM2e, FP32 19.5 TFLOPS, TF32 156 / BF16 312 TFLOPS dense; NVIDIA A100 Tensor Core "
            "GPU Architecture whitepaper: 108 SMs, 40 MB L2",
        ),
    ),
    (
        ("a100",),
        DeviceSpec(
            "NVIDIA A100 40GB",
            1.555e12,
            19.5,
            156.0,
            312.0,
            None,
            40 * _MiB,
            108,
            "NVIDIA A100 Tensor Core GPU datasheet (2021), A100 40GB columns: 1,555 GB/s HBM2, "
            "FP32 19.5 TFLOPS, TF32 156 / BF16 312 TFLOPS dense; 108 SMs, 40 MB L2",
        ),
    ),
    (
        ("b200",),
        DeviceSpec(
            "NVIDIA B200 180GB",
            8.0e12,
            75.0,
            1125.0,
            2250.0,
            4500.0,
            126 * _MiB,
            148,
            "NVIDIA HGX B200 datasheet (2024), per GPU (8-GPU figures / 8): 8 TB/s HBM3e, FP32 75 "
            "TFLOPS, TF32 2.25 / BF16 4.5 / FP8 9 PFLOPS with sparsity; 148 SMs and 126 MB L2 "
            "as measured by Chips and Cheese, 'Nvidia's B200: Keeping the CUDA Juggernaut Rolling'",
        ),
    ),
    (
        ("l40s",),
        DeviceSpec(
            "NVIDIA L40S 48GB",
            864e9,
            91.6,
            183.0,
            362.05,
            733.0,
            96 * _MiB,
            142,
            "NVIDIA L40S datasheet (2023): 864 GB/s GDDR6, FP32 91.6 TFLOPS, TF32 366 / BF16 733 "
            "/ FP8 1,466 TFLOPS with sparsity; AD102 with 142 SMs and 96 MB L2 (NVIDIA Ada "
            "Lovelace architecture whitepaper)",
        ),
    ),
)

#: The datasheet devices, by name.
DEVICES: dict[str, DeviceSpec] = {spec.name: spec for _, spec in _DEVICES}


def lookup(device_name: str) -> DeviceSpec | None:
    """The spec for a device name as ``torch.cuda.get_device_name`` gives it, or None.

    Matching is by case-insensitive substrings, most specific first: ``"NVIDIA H200"`` gives the
    H200 SXM, ``"NVIDIA H100 80GB HBM3"`` the H100 SXM5, ``"NVIDIA A100-SXM4-80GB"`` the A100
    SXM4 80GB. ``"cpu"`` gives the measured :func:`cpu_spec` (measuring it on first use).
    """
    name = device_name.strip().lower()
    if name == "cpu":
        return cpu_spec()
    for needles, spec in _DEVICES:
        if all(n in name for n in needles):
            return spec
    return None


def compute_dtype(problem: Any) -> str:
    """The precision a problem's FLOPs run at, for the roofline's peak rate.

    ``COMPUTE_DTYPE`` when the problem file sets it (an FP8 GEMM with bf16 outputs sets
    ``"float8_e4m3fn"``: its floor must use the FP8 rate, or honest kernels fall below it),
    else the problem's ``DTYPE``. ``problem`` is a :class:`kerneljudge.problem.Problem`.
    """
    raw = getattr(problem.module, "COMPUTE_DTYPE", None)
    return str(raw) if raw else str(problem.dtype).removeprefix("torch.")


def spec_for_device(device: torch.device | str) -> DeviceSpec | None:
    """The spec of a torch device: the CPU's measured figures, or the GPU's datasheet entry."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return cpu_spec()
    if dev.type == "cuda":
        return lookup(torch.cuda.get_device_name(dev))
    return None


def floor_s(
    flops: float | None, bytes_: float | None, spec: DeviceSpec, dtype: torch.dtype | str
) -> float:
    """``max(bytes / peak bandwidth, flops / floor rate)`` in seconds; 0 for unknown counts."""
    t_mem = (bytes_ or 0.0) / spec.memory_bandwidth_bytes_s
    t_flop = (flops or 0.0) / (spec.floor_tflops(dtype) * 1e12)
    return max(t_mem, t_flop)


def roofline(
    flops: float | None,
    bytes: float | None,
    time_s: float,
    spec: DeviceSpec,
    dtype: torch.dtype | str,
) -> RooflineResult:
    """Achieved GB/s and TFLOP/s of one call of ``time_s`` seconds, against ``spec``'s peaks.

    Args:
        flops: floating-point operations of the call (``flop_count()``), or None.
        bytes: bytes the call must move through device memory (``byte_count()``), or None.
        time_s: the measured time of one call, seconds (> 0).
        spec: the device's figures (:func:`lookup`, :func:`cpu_spec`).
        dtype: the precision the FLOPs run at (a torch dtype or a name such as ``"bfloat16"``,
            ``"float8_e4m3fn"``); it picks the peak rate.

    Raises:
        ValueError: ``time_s`` is not positive.
    """
    if not time_s > 0:
        raise ValueError(f"time_s must be positive, got {time_s}")
    gbps = bytes / time_s / 1e9 if bytes is not None else None
    tflops = flops / time_s / 1e12 if flops is not None else None
    floor = floor_s(flops, bytes, spec, dtype)
    return RooflineResult(
        achieved_gbps=gbps,
        achieved_tflops=tflops,
        bandwidth_fraction=gbps * 1e9 / spec.memory_bandwidth_bytes_s if gbps is not None else None,
        compute_fraction=tflops / spec.peak_tflops(dtype) if tflops is not None else None,
        floor_s=floor,
        below_floor=(not spec.measured) and time_s < FLOOR_MARGIN * floor,
    )


_PRECISIONS = {
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "float64": "fp32",
    "fp64": "fp32",
    "double": "fp32",
    "tf32": "tf32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "bf16",
    "fp16": "bf16",
    "half": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "fp8": "fp8",
    "float8": "fp8",
}


def _precision(dtype: torch.dtype | str) -> str:
    """``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp8"`` for a dtype or dtype name.

    Raises:
        ValueError: an unknown dtype name.
    """
    key = str(dtype).removeprefix("torch.").lower()
    try:
        return _PRECISIONS[key]
    except KeyError:
        raise ValueError(f"unknown dtype for the roofline: {dtype!r}") from None


def _best_time_s(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@functools.lru_cache(maxsize=1)
def cpu_spec() -> DeviceSpec:
    """Figures for this machine's CPU, measured once per process (about 0.2 s).

    Bandwidth: the best of 5 copies of a 64 MiB float32 buffer (read + write = 128 MiB moved).
    FP32 rate: the best of 3 float32 1024x1024 matmuls (2 n^3 FLOPs); BF16 rate: the same with
    bfloat16 at 512x512. Measured with torch's current thread count.
    """
    src = torch.ones(16 * _MiB, dtype=torch.float32)  # 64 MiB
    dst = torch.empty_like(src)
    copy_s = _best_time_s(lambda: dst.copy_(src), 5)
    bandwidth = 2 * src.numel() * src.element_size() / copy_s

    def rate(n: int, dtype: torch.dtype) -> float:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        return 2 * n**3 / _best_time_s(lambda: a @ b, 3) / 1e12

    fp32 = rate(1024, torch.float32)
    bf16 = rate(512, torch.bfloat16)
    threads = torch.get_num_threads()
    return DeviceSpec(
        name="cpu",
        memory_bandwidth_bytes_s=bandwidth,
        fp32_tflops=fp32,
        tf32_tflops=None,
        bf16_tflops=bf16,
        fp8_tflops=None,
        l2_bytes=None,
        sm_count=threads,
        source=(
            f"measured in-process with {threads} threads: 64 MiB float32 copy "
            f"{bandwidth / 1e9:.1f} GB/s, 1024^3 float32 matmul {fp32 * 1e3:.1f} GFLOP/s, "
            f"512^3 bfloat16 matmul {bf16 * 1e3:.1f} GFLOP/s"
        ),
        measured=True,
    )
