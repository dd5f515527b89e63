"""GPU tier: the comparison computed on the GPU (the reference worker's, ``device="cuda"``)
decides as the CPU's does, on outputs that span several of its chunks."""

from __future__ import annotations

import math

import pytest
import torch

import kerneljudge.check as check
from kerneljudge.check import compare_outputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["oracle", "allclose"])
def test_gpu_comparison_decides_as_the_cpu(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setattr(check, "DEVICE_CHUNK", 1 << 14)  # several chunks on the device,
    monkeypatch.setattr(check.fused, "CHUNK", 1 << 16)  # smaller than the fused comparison's
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


def test_the_fused_chunk_row_is_the_masked_row() -> None:
    """One kernel per chunk (:mod:`kerneljudge.check.fused`) gives the masked torch
    computation's row: the same flags and maxima, sums equal to rounding, on finite chunks,
    matching and mismatching non-finite values, a signed zero, ``atol`` 0, an infinite
    ``rtol``, half-precision chunks and no oracle."""
    from kerneljudge.check import _chunk_stats, fused

    dev = torch.device("cuda")
    assert fused.warm(dev)
    g = torch.Generator().manual_seed(11)
    o = torch.randn(50_000, generator=g, dtype=torch.float64) * 10
    e = o.float()
    a = (o + 1e-5 * torch.randn(50_000, generator=g, dtype=torch.float64)).float()
    e[7] = a[7] = 0.0
    a[8], e[8] = -0.0, 0.0
    cases = {"finite": (e, a)}
    for name, (i, ve, va) in {
        "matching nan": (5, float("nan"), float("nan")),
        "matching inf": (5, float("inf"), float("inf")),
        "inf signs": (5, float("inf"), -float("inf")),
        "nan against inf": (5, float("nan"), float("inf")),
        "late nan": (40_000, 1.0, float("nan")),
    }.items():
        ee, aa = e.clone(), a.clone()
        ee[i], aa[i] = ve, va
        cases[name] = (ee, aa)
    cases["bf16"] = (e.bfloat16(), a.bfloat16())
    for name, (ee, aa) in cases.items():
        for oracle in (o, None):
            for atol, rtol in ((1e-5, 1e-3), (0.0, 1e-3), (1e-5, math.inf)):
                on = [t.to(dev) for t in (ee, aa)]
                row = fused.chunk_row(*on, oracle.to(dev) if oracle is not None else None,
                                      atol, rtol).tolist()  # fmt: skip
                masked = _chunk_stats(
                    ee.double(), aa.double(), oracle, atol, rtol, lazy=True
                ).tolist()
                where = (name, oracle is None, atol, rtol)
                assert len(row) == len(masked) == 10, where
                for k in (0, 1, 3, 4, 5, 7, 9):  # flags and maxima
                    assert row[k] == masked[k] or (row[k] != row[k] and masked[k] != masked[k]), (
                        where,
                        k,
                    )
                for k in (2, 6, 8):  # sums, in another order
                    assert row[k] == pytest.approx(masked[k], rel=1e-12, nan_ok=True), (where, k)
                assert math.copysign(1.0, row[1]) == math.copysign(1.0, masked[1]), where
