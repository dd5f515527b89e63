"""The correctness rule: honest reorderings pass, lower precision and real bugs fail."""

from __future__ import annotations

import math

import pytest
import torch

from kerneljudge.check import CHUNK, compare_outputs


def _matmul_case(k: int = 4096, scale: float = 10.0):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, k, generator=g) * scale
    b = torch.randn(k, 32, generator=g)
    oracle = a.double() @ b.double()
    reference = a @ b
    return a, b, reference, oracle


def test_honest_reordered_sum_passes_oracle_but_not_plain_allclose() -> None:
    """Outputs of magnitude ~1e3: an fp32 sum in another order fails atol=rtol=1e-4, honestly."""
    a, b, reference, oracle = _matmul_case()
    # Another summation order: 64 partial sums over chunks of k, added up at the end.
    chunked = sum(a[:, i::64] @ b[i::64, :] for i in range(64))
    res = compare_outputs(reference, chunked, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert res.passed, res.reason
    assert res.max_abs_err > 1e-4  # plain allclose would have failed it
    assert not res.allclose
    plain = compare_outputs(
        reference, chunked, oracle=oracle, atol=1e-4, rtol=1e-4, mode="allclose"
    )
    assert not plain.passed


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_lower_precision_fails_the_oracle(low: torch.dtype) -> None:
    a, b, reference, oracle = _matmul_case(k=512, scale=1.0)
    cheap = (a.to(low) @ b.to(low)).float()
    res = compare_outputs(reference, cheap, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed and "float64" in res.reason
    assert res.oracle_err > res.oracle_bound


def test_tf32_like_rounding_fails_the_oracle() -> None:
    a, b, reference, oracle = _matmul_case(k=1024, scale=1.0)

    def tf32(x: torch.Tensor) -> torch.Tensor:  # keep 10 mantissa bits, as tf32 does
        bits = x.view(torch.int32) & ~0x1FFF
        return bits.view(torch.float32)

    res = compare_outputs(reference, tf32(a) @ tf32(b), oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed


def test_single_wrong_element_is_caught_and_reported() -> None:
    a, b, reference, oracle = _matmul_case(k=256, scale=1.0)
    bad = reference.clone()
    bad[3, 7] += 0.05
    res = compare_outputs(reference, bad, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed
    assert res.mismatches[0].index == (3, 7)
    assert res.mismatches[0].got == pytest.approx(float(bad[3, 7]))


def test_structure_shape_dtype_and_nonfinite() -> None:
    x = torch.randn(4, 4)
    assert "shape" in compare_outputs(x, x[:2], atol=1e-4, rtol=1e-4).reason
    assert "dtype" in compare_outputs(x, x.half(), atol=1e-4, rtol=1e-4).reason
    assert "returned 1 outputs" in compare_outputs((x, x), x, atol=1e-4, rtol=1e-4).reason
    y = x.clone()
    y[1, 1] = float("nan")
    res = compare_outputs(x, y, oracle=x.double(), atol=1e-4, rtol=1e-4)
    assert not res.passed and "non-finite" in res.reason and "(1, 1)" in res.reason


def test_matching_nonfinite_positions_are_accepted() -> None:
    x = torch.tensor([1.0, float("-inf"), 3.0])
    res = compare_outputs(x, x.clone(), oracle=x.double(), atol=1e-4, rtol=1e-4)
    assert res.passed, res.reason


def test_tuple_outputs_and_integer_outputs() -> None:
    x = torch.randn(8)
    idx = torch.arange(8)
    ok = compare_outputs(
        (x, idx), (x.clone(), idx.clone()), oracle=(x.double(), idx), atol=1e-4, rtol=1e-4
    )
    assert ok.passed
    bad = compare_outputs(
        (x, idx), (x.clone(), idx.flip(0)), oracle=(x.double(), idx), atol=1e-4, rtol=1e-4
    )
    assert not bad.passed and "output 1" in bad.reason


def test_reported_errors_measure_against_the_reference() -> None:
    ref = torch.tensor([1.0, 2.0, 0.0])
    got = torch.tensor([1.0, 2.002, 0.0001])
    res = compare_outputs(ref, got, atol=1e-4, rtol=1e-4, mode="allclose")
    assert res.max_abs_err == pytest.approx(0.002, rel=1e-4)
    assert res.mean_abs_err == pytest.approx((0.002 + 0.0001) / 3, rel=1e-3)
    assert res.max_rel_err == pytest.approx(1.0, rel=1e-3)  # 1e-4 / max(0, atol)
    assert not res.allclose and not res.passed


def test_statistics_span_every_chunk_and_point_at_the_right_element() -> None:
    """The comparison reads the output a chunk at a time: maxima, sums and the first bad
    element must be those of the whole tensor, wherever in it they are."""
    g = torch.Generator().manual_seed(3)
    shape = (3, CHUNK + 7)  # three chunks and a bit
    oracle = torch.randn(shape, generator=g, dtype=torch.float64)
    ref = oracle.float()
    cand = (oracle + 1e-9 * torch.randn(shape, generator=g, dtype=torch.float64)).float()
    res = compare_outputs(ref, cand, oracle=oracle, atol=1e-4, rtol=1e-4)
    diff = (cand.double() - ref.double()).abs()
    assert res.passed, res.reason
    assert res.max_abs_err == pytest.approx(float(diff.max()), rel=1e-12)
    assert res.mean_abs_err == pytest.approx(float(diff.mean()), rel=1e-9)
    assert res.reference_err == pytest.approx(float((ref.double() - oracle).abs().max()), rel=1e-12)

    wrong = cand.clone()
    wrong[2, CHUNK] += 1.0  # in the last chunk
    res = compare_outputs(ref, wrong, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed
    assert [m.index for m in res.mismatches] == [(2, CHUNK)]
    assert res.max_abs_err == pytest.approx(1.0, rel=1e-3)

    nan_late = cand.clone()
    nan_late[1, 5] = float("nan")  # the second chunk
    res = compare_outputs(ref, nan_late, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed and "first at (1, 5)" in res.reason

    inf_ref, inf_cand = ref.clone(), cand.clone()
    inf_ref[2, 3], inf_cand[2, 3] = float("inf"), float("-inf")  # same place, other sign
    res = compare_outputs(inf_ref, inf_cand, oracle=oracle, atol=1e-4, rtol=1e-4)
    assert not res.passed and "first at (2, 3)" in res.reason


def test_no_error_where_the_reference_is_not_finite_even_with_zero_atol() -> None:
    ref = torch.tensor([0.0, float("inf"), 2.0])
    cand = torch.tensor([1.0, float("inf"), 2.0])
    res = compare_outputs(ref, cand, atol=0.0, rtol=1e-4, mode="allclose")
    assert res.max_rel_err == float("inf")  # 1/0 at the first element, nothing from the inf
    assert res.max_abs_err == 1.0 and not res.passed


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(name, reference, candidate, oracle) over several chunks: honest, wrong in late chunks,
    non-finite (matching, and mismatching late)."""
    g = torch.Generator().manual_seed(11)
    oracle = torch.randn(5 * 1000 + 3, generator=g, dtype=torch.float64)
    ref = oracle.float()
    honest = (oracle + 1e-9 * torch.randn(oracle.shape, generator=g, dtype=torch.float64)).float()
    wrong = honest.clone()
    wrong[[1500, 2999, 3000, 4100, 4200, 5001]] += 1.0  # six, across four chunks of 1000
    nan_ref, nan_both = ref.clone(), honest.clone()
    nan_ref[[10, 2500]] = float("nan")
    nan_both[[10, 2500]] = float("nan")
    nan_late = honest.clone()
    nan_late[4321] = float("nan")
    return [
        ("honest", ref, honest, oracle),
        ("wrong", ref, wrong, oracle),
        ("matching nan", nan_ref, nan_both, oracle),
        ("late nan", ref, nan_late, oracle),
    ]


@pytest.mark.parametrize("mode", ["oracle", "allclose"])
def test_chunk_size_and_lazy_scan_do_not_change_the_result(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The statistics waited for once (the GPU's way, here on the CPU) and any chunk size
    give the verdict of the plain scan: the same pass, reason, mismatches (first five, in
    order, across chunks) and maxima; sums equal to rounding."""
    import kerneljudge.check as check

    for name, ref, cand, oracle in _cases():
        kw = {"oracle": oracle, "atol": 1e-4, "rtol": 1e-4, "mode": mode}
        plain = compare_outputs(ref, cand, **kw)  # type: ignore[arg-type]
        for chunk in (7, 1000, 1 << 20):
            for lazy in (False, True):
                monkeypatch.setattr(check, "CHUNK", chunk)
                scan = check._scan
                monkeypatch.setattr(
                    check, "_scan", lambda *a, _s=scan, _l=lazy, **k: _s(*a, **k, lazy=_l)
                )
                got = compare_outputs(ref, cand, **kw)  # type: ignore[arg-type]
                monkeypatch.undo()
                where = (name, chunk, lazy)
                assert (got.passed, got.reason) == (plain.passed, plain.reason), where
                assert got.mismatches == plain.mismatches, where
                assert got.max_abs_err == plain.max_abs_err, where
                assert got.oracle_err == plain.oracle_err, where
                assert got.mean_abs_err == pytest.approx(plain.mean_abs_err, rel=1e-12), where
    wrong = compare_outputs(*_cases()[1][1:3], oracle=_cases()[1][3], atol=1e-4, rtol=1e-4)
    assert [m.index for m in wrong.mismatches] == [(1500,), (2999,), (3000,), (4100,), (4200,)]


def test_float64_oracle_reaches_submodules_used_through_a_closure_and_restores_the_model() -> None:
    """A reference that calls a submodule through a ``lambda`` over it (as KernelBench's
    MiniGPTBlock does) gets a float64 oracle; the model keeps its own parameter and buffer
    objects, values and dtypes, tied parameters included."""
    from torch import nn

    from kerneljudge.worker.forward import float64_oracle

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(16)
            self.mlp = nn.ModuleDict({"fc": nn.Linear(16, 32), "proj": nn.Linear(32, 16)})
            m = self.mlp
            self.mlpf = lambda x: m["proj"](torch.tanh(m["fc"](x)))
            self.tied = self.mlp["fc"]  # the same Linear registered twice
            self.register_buffer("shift", torch.full((16,), 0.25, dtype=torch.float16))
            self.register_buffer("steps", torch.arange(16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlpf(self.ln(x)) + self.shift.to(x.dtype) + self.steps

    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 16)
    params = {name: (p, p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    oracle = float64_oracle(model, [x], torch.device("cpu"))
    assert oracle is not None and oracle.dtype == torch.float64
    # The float64 result is the float32 one to float32 rounding.
    assert torch.allclose(oracle, model(x).double(), atol=1e-5)
    for name, p in model.named_parameters():
        same, ptr, value = params[name]
        assert same is p and p.data_ptr() == ptr and torch.equal(p.detach(), value)
    for name, b in model.named_buffers():
        assert buffers[name] is b
    assert model.shift.dtype == torch.float16 and model.steps.dtype == torch.int64


def test_float64_oracle_leaves_a_stateful_reference_as_it_was() -> None:
    """What a reference changes in place during the float64 call (a counter buffer, a float64
    parameter) is changed in copies, not in the reference."""
    from torch import nn

    from kerneljudge.worker.forward import float64_oracle

    class Stateful(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
            self.scale = nn.Parameter(torch.ones(3, dtype=torch.float64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            self.scale.data.mul_(2)
            return x * self.scale

    model = Stateful()
    oracle = float64_oracle(model, [torch.ones(3)], torch.device("cpu"))
    assert torch.equal(oracle, torch.full((3,), 2.0, dtype=torch.float64))
    assert int(model.calls) == 0 and torch.equal(model.scale.detach(), torch.ones(3).double())


def test_the_finite_fast_path_gives_the_masked_statistics_exactly() -> None:
    """A chunk whose values are all finite skips the masks: its statistics are those of the
    masked computation (the lazy path, which always masks), bit for bit."""
    from kerneljudge.check import _chunk_stats

    g = torch.Generator().manual_seed(3)
    o = torch.randn(5000, generator=g, dtype=torch.float64) * 10
    e = o.float().double()
    a = (o + 1e-6 * torch.randn(5000, generator=g, dtype=torch.float64)).float().double()
    e[7] = 0.0  # a zero reference element: the relative error's floor
    for oracle in (o, None):
        for atol in (1e-5, 0.0):
            fast = _chunk_stats(e, a, oracle, atol, 1e-3, lazy=False)
            masked = _chunk_stats(e, a, oracle, atol, 1e-3, lazy=True)
            assert isinstance(masked, torch.Tensor)
            assert fast == pytest.approx(masked.tolist(), rel=0, abs=0, nan_ok=True)
            # Signs too (approx takes -0.0 for 0.0): identical outputs give +0.0 errors.
            same = _chunk_stats(e, e.clone(), e.clone(), atol, 1e-3, lazy=False)
            assert [math.copysign(1.0, x) for x in same] == [1.0] * 10


def test_the_finite_fast_path_leaves_every_non_finite_chunk_to_the_masks() -> None:
    """A NaN or an infinity in any of the three chunks (the oracle's included), or a difference
    that overflows float64, sends the chunk to the masks (None); allclose's test is decided
    elementwise whenever a difference exceeds ``atol``."""
    from kerneljudge.check import _finite_chunk_stats

    base = torch.linspace(-4.0, 4.0, 100, dtype=torch.float64)
    for which in range(3):
        for bad in (float("nan"), float("inf"), -float("inf")):
            chunks = [base.clone(), base.clone(), base.clone()]
            chunks[which][37] = bad
            assert _finite_chunk_stats(*chunks, 1e-5, 1e-3) is None, (which, bad)
    huge = torch.tensor([1e308, 0.0], dtype=torch.float64)
    assert _finite_chunk_stats(huge, -huge, None, 1e-5, 1e-3) is None
    # |diff| above atol everywhere: close by rtol alone, then not.
    ref = base + 10.0
    within = _finite_chunk_stats(ref, ref * (1 + 5e-4), base.clone(), 1e-5, 1e-3)
    beyond = _finite_chunk_stats(ref, ref * (1 + 5e-3), base.clone(), 1e-5, 1e-3)
    assert within is not None and beyond is not None
    assert within[1] > 1e-5 and within[4] == 1.0 and beyond[4] == 0.0


def test_an_infinite_rtol_is_decided_elementwise_and_0_over_0_hides_no_error() -> None:
    """allclose's shortcut (every difference at most ``atol``) needs a finite ``rtol``: with
    ``rtol`` inf, ``inf * 0`` is NaN and a zero reference element fails, as in the masks. With
    ``atol`` 0, an element where reference and candidate are both 0 counts as no relative
    error, so it never hides another element's from the maximum (whatever the chunks)."""
    import kerneljudge.check as check

    e = torch.tensor([0.0, 1.0], dtype=torch.float64)
    fast = check._chunk_stats(e, e.clone(), None, 1e-5, math.inf, lazy=False)
    masked = check._chunk_stats(e, e.clone(), None, 1e-5, math.inf, lazy=True)
    assert isinstance(fast, list) and isinstance(masked, torch.Tensor)
    assert fast[4] == masked.tolist()[4] == 0.0
    ref = torch.ones(40_000)
    ref[0] = 0.0
    cand = ref.clone()
    cand[20_000] = 2.0
    for chunk in (7, 16_384, check.CHUNK, 1 << 20):
        check.CHUNK, saved = chunk, check.CHUNK
        try:
            res = compare_outputs(ref, cand, atol=0.0, rtol=1e-4, mode="allclose")
        finally:
            check.CHUNK = saved
        assert res.max_rel_err == 1.0, chunk


def test_the_fused_kernels_entries_are_the_comparisons_and_the_cpu_keeps_torchs_way() -> None:
    """The fused comparison's sources name their entry functions as jiterator reads them (the
    last function of each source, whose name becomes the kernel's), and a comparison off CUDA
    never takes that path."""
    from torch.cuda.jiterator import _CodeParser

    from kerneljudge.check import fused

    with_oracle = fused._COMMON + fused._WITH_ORACLE
    without = fused._COMMON + fused._WITHOUT_ORACLE
    assert _CodeParser(with_oracle).function_name == "kj_compare_oracle"
    assert _CodeParser(without).function_name == "kj_compare"
    assert _CodeParser(with_oracle).return_type == "void"
    x = torch.ones(4, dtype=torch.float64)
    assert not fused.available(torch.device("cpu"), x, x, x)
    assert fused.available(torch.device("cuda"), x.float(), x.float(), x)
    assert not fused.available(torch.device("cuda"), x.float(), x.float(), x.float())
    assert not fused.warm(torch.device("cpu"))
