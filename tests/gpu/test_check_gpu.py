"""GPU tier: the comparison computed on the GPU (the reference worker's, ``device="cuda"``)
decides as the CPU's does, on outputs that span several of its chunks."""

from __future__ import annotations

import pytest
import torch

import kerneljudge.check as check
from kerneljudge.check import compare_outputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["oracle", "allclose"])
def test_gpu_comparison_decides_as_the_cpu(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setattr(check, "DEVICE_CHUNK", 1 << 16)  # several chunks on the device
    g = torch.Generator().manual_seed(5)
    oracle = torch.randn(5 * (1 << 16) + 11, generator=g, dtype=torch.float64)
    ref = oracle.float()
    honest = (oracle + 1e-9 * torch.randn(oracle.shape, generator=g, dtype=torch.float64)).float()
    wrong = honest.clone()
    wrong[[70_000, 200_000, 300_000]] += 1.0
    late_nan = honest.clone()
    late_nan[250_000] = float("nan")
    for cand in (honest, wrong, late_nan):
        kw = {"oracle": oracle, "atol": 1e-4, "rtol": 1e-4, "mode": mode}
        on_cpu = compare_outputs(ref, cand, **kw)  # type: ignore[arg-type]
        on_gpu = compare_outputs(ref, cand, device="cuda", **kw)  # type: ignore[arg-type]
        assert (on_gpu.passed, on_gpu.reason) == (on_cpu.passed, on_cpu.reason)
        assert on_gpu.mismatches == on_cpu.mismatches
        assert on_gpu.max_abs_err == pytest.approx(on_cpu.max_abs_err, rel=1e-12)
        assert on_gpu.mean_abs_err == pytest.approx(on_cpu.mean_abs_err, rel=1e-9)
