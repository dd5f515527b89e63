"""Correctness stage: compare a candidate's outputs with the reference's, trial by trial.

Two rules decide a trial (``mode``):

``"oracle"`` (the default)
    The reference is also evaluated in float64 (the *oracle*). The float32 (or bf16/fp16)
    reference's own error against the oracle measures how much rounding noise the problem has at
    its stated precision; a candidate passes when its error against the oracle is comparable:

    * elementwise: ``max|cand - oracle| <= max(K_MAX * max|ref - oracle|, eps * scale)``
    * normwise:    ``||cand - oracle||_2 <= max(K_NORM * ||ref - oracle||_2, eps*scale*sqrt(n))``

    where ``eps`` is the machine epsilon of the problem's dtype, ``scale = max|oracle|`` (the
    absolute floor scaled to the output's magnitude) and ``n`` the element count. An honest kernel
    that sums in another order has errors of the reference's order (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., ch. 3: the error bound of a sum of ``k`` terms is
    ``O(k eps)`` for every order), so it passes; a kernel that computes in a lower precision
    (tf32 rounds products to 2^-11, bf16 to 2^-8, against fp32's 2^-24) is thousands of times
    off and fails.

``"allclose"``
    ``torch.allclose(cand, ref, atol, rtol)`` against the reference itself, with the per-dtype
    defaults fp32 1e-4 and fp16/bf16 1e-2, as the task prompts state the rule.

Both numbers are always reported. Comparisons run in float64, a chunk at a time: on the CPU on
the calling thread, or on a GPU when asked (``device``), one fused kernel per chunk
(:mod:`kerneljudge.check.fused`), with one wait for the device per output (:func:`_scan`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kerneljudge.check import fused
from kerneljudge.verdict import Mismatch, TrialResult

__all__ = ["CHUNK", "DEVICE_CHUNK", "K_MAX", "K_NORM", "compare_outputs", "flatten_outputs"]

#: Slack of the oracle rule over the reference's own largest elementwise error.
K_MAX = 16.0
#: Slack of the oracle rule over the reference's own normwise error.
K_NORM = 16.0
_MAX_MISMATCHES = 5
#: Elements compared per step on the CPU (see :func:`_scan`): below torch's intra-op grain size
#: (32,768), and as close to it as a multiple of 1,024 gets, so that the fixed cost of each of
#: a chunk's operations is spread over as many elements as one thread takes (128 MiB of float32
#: compared in 0.54 s with these chunks, 0.75 s with 16,384, on a 2-core host:
#: docs/benchmarks/2026-12-05-cpu-compare-one-sweep.md).
CHUNK = 31_744
#: Elements compared per step on a GPU (2^22): about ten float64 intermediates of this size,
#: some 340 MiB of device memory, at a time.
DEVICE_CHUNK = 1 << 22


def flatten_outputs(outputs: Any) -> list[Any]:
    """Outputs as a flat list: a tensor becomes ``[tensor]``, nested tuples/lists are flattened."""
    if isinstance(outputs, (tuple, list)):
        return [y for x in outputs for y in flatten_outputs(x)]
    return [outputs]


def _as_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (bool, int, float)):
        return torch.tensor(x)
    return None


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def compare_outputs(
    expected: Any,
    actual: Any,
    *,
    oracle: Any = None,
    atol: float,
    rtol: float,
    mode: str = "oracle",
    index: int = 0,
    device: torch.device | str | None = None,
) -> TrialResult:
    """Compare one trial's candidate outputs with the reference's.

    Args:
        expected: the reference outputs at the problem's dtype: a tensor or a (nested) tuple.
        actual: the candidate's outputs, same structure.
        oracle: the reference evaluated in float64, same structure; None turns the oracle rule
            off (``mode="oracle"`` then falls back to allclose).
        atol, rtol: the allclose tolerances (reported always; decisive in ``"allclose"`` mode).
        mode: ``"oracle"`` or ``"allclose"``.
        index: the trial's number, carried into the result.
        device: where the float64 statistics are computed: None or ``"cpu"`` on the CPU, a
            chunk at a time; a CUDA device there, the tensors copied a chunk at a time (they
            may live anywhere). Comparisons of exact dtypes run on the CPU.

    Returns:
        A :class:`TrialResult`: errors are maxima over all output tensors; ``mismatches`` lists
        up to five offending elements of the first failing output, by flat index.

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode not in ("oracle", "allclose"):
        raise ValueError(f"unknown tolerance mode {mode!r} (use 'oracle' or 'allclose')")
    exp_list = flatten_outputs(expected)
    act_list = flatten_outputs(actual)
    ora_list = flatten_outputs(oracle) if oracle is not None else [None] * len(exp_list)
    use_oracle = mode == "oracle" and oracle is not None
    fail = lambda reason, **kw: TrialResult(index=index, passed=False, reason=reason, **kw)  # noqa: E731

    if len(act_list) != len(exp_list):
        return fail(f"returned {len(act_list)} outputs, expected {len(exp_list)}")

    max_abs = mean_acc = max_rel = 0.0
    n_total = 0
    all_close = True
    ora_err = ref_err = bound = 0.0
    reason = ""
    mismatches: tuple[Mismatch, ...] = ()
    for i, (e_raw, a_raw, o_raw) in enumerate(zip(exp_list, act_list, ora_list)):
        label = f"output {i}" if len(exp_list) > 1 else "output"
        e, a = _as_tensor(e_raw), _as_tensor(a_raw)
        if e is None:
            continue  # non-tensor reference output (e.g. None): nothing to compare
        if a is None:
            return fail(f"{label} is {type(a_raw).__name__}, expected a tensor {_describe(e)}")
        if a.shape != e.shape:
            return fail(f"{label} has shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        if a.dtype != e.dtype:
            return fail(f"{label} has dtype {a.dtype}, expected {e.dtype}")
        if a.is_complex() or not (a.is_floating_point() or e.is_floating_point()):
            same = bool(torch.equal(a.cpu(), e.cpu()))
            all_close &= same
            if not same and not reason:
                reason = f"{label} differs from the reference (exact comparison)"
            continue
        o = _as_tensor(o_raw) if use_oracle and o_raw is not None else None
        st = _scan(e, a, o, atol, rtol, device)
        if st.nonfinite_at is not None:
            return fail(
                f"{label} has non-finite values where the reference has none, "
                f"first at {_unravel(st.nonfinite_at, tuple(e.shape)) if e.dim() else ()}"
            )
        n = e.numel()
        if n:
            max_abs = max(max_abs, st.max_abs)
            mean_acc += st.sum_abs
            n_total += n
            max_rel = max(max_rel, st.max_rel)
        all_close &= st.close

        failed_here = False
        bad_mask: Callable[..., torch.Tensor] | None = None
        if o is not None and n:
            eps = torch.finfo(e.dtype).eps
            floor = eps * st.scale
            b_max = max(K_MAX * st.ref_max, floor)
            b_norm = max(K_NORM * math.sqrt(st.ref_sq), floor * math.sqrt(n))
            ora_err = max(ora_err, st.cand_max)
            ref_err = max(ref_err, st.ref_max)
            bound = max(bound, b_max)
            if st.cand_max > b_max:
                failed_here = True
                reason = reason or (
                    f"{label}: max error vs float64 {st.cand_max:.3g} exceeds "
                    f"{b_max:.3g} ({K_MAX:g} x the reference's own error or its rounding floor)"
                )
                bad_mask = functools.partial(_oracle_error_above, b_max)
            elif math.sqrt(st.cand_sq) > b_norm:
                failed_here = True
                reason = reason or (
                    f"{label}: error norm vs float64 {math.sqrt(st.cand_sq):.3g} exceeds "
                    f"{b_norm:.3g}"
                )
                bad_mask = functools.partial(_oracle_error_above, st.ref_max)
        elif not use_oracle and not st.close:
            failed_here = True
            reason = reason or f"{label} not allclose(atol={atol:g}, rtol={rtol:g})"
            bad_mask = functools.partial(_not_close, atol, rtol)
        if failed_here and not mismatches and bad_mask is not None:
            flat = _first_where(bad_mask, e, a, o, device)
            shape = tuple(e.shape)
            ef, af = e.reshape(-1), a.reshape(-1)
            mismatches = tuple(
                Mismatch(index=_unravel(j, shape), expected=float(ef[j]), got=float(af[j]))
                for j in flat
            )
    return TrialResult(
        index=index,
        passed=not reason,
        reason=reason,
        max_abs_err=max_abs,
        mean_abs_err=mean_acc / n_total if n_total else 0.0,
        max_rel_err=max_rel,
        allclose=all_close,
        oracle_err=ora_err if use_oracle else None,
        reference_err=ref_err if use_oracle else None,
        oracle_bound=bound if use_oracle else None,
        mismatches=mismatches,
    )


@dataclass
class _Scan:
    """What one pass over an output tensor found (float64 sums and maxima)."""

    nonfinite_at: int | None = None  # flat index of the first non-finite mismatch
    max_abs: float = 0.0
    sum_abs: float = 0.0
    max_rel: float = 0.0
    close: bool = True
    cand_max: float = 0.0  # |candidate - oracle|
    cand_sq: float = 0.0
    ref_max: float = 0.0  # |reference - oracle|
    ref_sq: float = 0.0
    scale: float = 0.0  # max |oracle|


def _chunk_size(where: torch.device, fuse: bool = False) -> int:
    if fuse:
        return fused.CHUNK
    return CHUNK if where.type == "cpu" else DEVICE_CHUNK


def _pieces(
    where: torch.device, n: int, *tensors: torch.Tensor | None, fuse: bool = False
) -> Iterator[tuple[int, list[torch.Tensor | None]]]:
    """``(start, [float64 slice on where, ...])`` for consecutive chunks of the flattened
    ``tensors`` (each copied to ``where`` as it is, then converted there; with ``fuse``, the
    fused comparison's chunks, not converted)."""
    flat = [t.reshape(-1) if t is not None else None for t in tensors]
    size = _chunk_size(where, fuse)
    f64 = not fuse
    for lo in range(0, n, size):
        yield (
            lo,
            [_to(t[lo : lo + size].to(where), f64) if t is not None else None for t in flat],
        )


def _to(t: torch.Tensor, f64: bool) -> torch.Tensor:
    return t.to(torch.float64) if f64 else t


def _nonfinite_mismatch(e64: torch.Tensor, a64: torch.Tensor) -> torch.Tensor:
    """Mask of the positions where the non-finite values of ``e64`` and ``a64`` differ: NaN
    counts as 3 and infinities as the largest finite values, so equal where both agree."""
    e_fin, a_fin = torch.isfinite(e64), torch.isfinite(a64)
    e_nf = torch.where(e_fin, 0.0, e64).nan_to_num(3.0)
    a_nf = torch.where(a_fin, 0.0, a64).nan_to_num(3.0)
    return (e_fin != a_fin) | (e_nf != a_nf)


def _chunk_stats(
    e64: torch.Tensor,
    a64: torch.Tensor,
    o64: torch.Tensor | None,
    atol: float,
    rtol: float,
    lazy: bool,
) -> torch.Tensor | list[float]:
    """One chunk's statistics: ``[non-finite mismatch (0/1), max_abs, sum_abs, max_rel,
    allclose (0/1), cand_max, cand_sq, ref_max, ref_sq, scale]`` (the oracle's five are 0
    without an oracle). ``lazy``: as one float64 tensor on the chunk's device, computed
    without waiting for it; else as floats, a chunk with only finite values skipping the
    non-finite masks."""
    if not lazy:
        fast = _finite_chunk_stats(e64, a64, o64, atol, rtol)
        if fast is not None:
            return fast
    e_fin, a_fin = torch.isfinite(e64), torch.isfinite(a64)
    bad: torch.Tensor | float = 0.0
    if lazy or not (bool(e_fin.all()) and bool(a_fin.all())):
        bad = _nonfinite_mismatch(e64, a64).any()
    diff = torch.where(e_fin, (a64 - e64).abs(), 0.0)
    e_abs = torch.where(e_fin, e64.abs(), 0.0)
    rel = _no_zero_over_zero(torch.where(e_fin, diff / e_abs.clamp_min(atol), 0.0), atol)
    # allclose's rule |a - e| <= atol + rtol |e|; non-finite positions are equal here.
    close = (diff <= atol + rtol * e_abs).all()
    row: list[torch.Tensor | float] = [bad, diff.max(), diff.sum(), rel.max(), close]
    if o64 is not None:
        fin = e_fin & torch.isfinite(o64)
        cand = torch.where(fin, (a64 - o64).abs(), 0.0)
        refe = torch.where(fin, (e64 - o64).abs(), 0.0)
        scale = torch.where(fin, o64.abs(), 0.0).max()
        row += [cand.max(), cand.square().sum(), refe.max(), refe.square().sum(), scale]
    else:
        row += [0.0] * 5
    if not lazy:
        return [float(x) for x in row]
    zero = torch.zeros((), dtype=torch.float64, device=e64.device)
    return torch.stack([x.to(torch.float64) if isinstance(x, torch.Tensor) else zero for x in row])


def _finite_chunk_stats(
    e64: torch.Tensor, a64: torch.Tensor, o64: torch.Tensor | None, atol: float, rtol: float
) -> list[float] | None:
    """:func:`_chunk_stats` of a chunk whose values are all finite (None when one is not): the
    same statistics, bit for bit, without the masks, which change nothing there (a chunk on
    the CPU). Every statistic is taken in one sweep of operations, read with one
    ``tolist``: a non-finite value of ``e64``, ``a64`` or ``o64`` makes a difference's minimum
    or maximum non-finite (NaN propagates through them, an infinity reaches them), which then
    sends the chunk to the masks. allclose's elementwise test runs only where the largest
    difference exceeds ``atol`` (below it every element passes, ``rtol`` being finite
    and at least 0)."""
    diff = a64 - e64
    parts = list(torch.aminmax(diff))
    if o64 is not None:
        cand, refe = a64 - o64, e64 - o64
        parts += [*torch.aminmax(cand), *torch.aminmax(refe), *torch.aminmax(o64)]
        parts += [cand.square_().sum(), refe.square_().sum()]
    diff.abs_()
    e_abs = e64.abs()
    floor = e_abs.clamp_min(atol)
    parts += [diff.sum(), _no_zero_over_zero(torch.div(diff, floor, out=floor), atol).max()]
    values = torch.stack(parts).tolist()
    if not all(math.isfinite(v) for v in values[: 6 if o64 is not None else 2]):
        return None
    max_abs = _abs_max(values[0], values[1])
    shortcut = max_abs <= atol and 0 <= rtol < math.inf  # (an infinite rtol times 0 is NaN)
    close = shortcut or bool((diff <= e_abs.mul_(rtol).add_(atol)).all())
    row = [0.0, max_abs, values[-2], values[-1], float(close)]
    if o64 is None:
        return row + [0.0] * 5
    o_min, o_max, cand_sq, ref_sq = values[6:10]
    return row + [
        _abs_max(values[2], values[3]),
        cand_sq,
        _abs_max(values[4], values[5]),
        ref_sq,
        _abs_max(o_min, o_max),
    ]


def _abs_max(low: float, high: float) -> float:
    """The largest absolute value of a tensor whose minimum is ``low`` and maximum ``high``
    (a zero as +0.0, as ``abs(t).max()`` gives it)."""
    return max(abs(low), abs(high))


def _no_zero_over_zero(rel: torch.Tensor, atol: float) -> torch.Tensor:
    """``rel`` (relative errors, ``|diff| / max(|ref|, atol)``) with the NaN of 0/0, which only
    ``atol`` 0 allows, counted as no error (in place): a NaN would hide its chunk's largest
    relative error from the maximum over chunks."""
    return rel.nan_to_num_(nan=0.0, posinf=math.inf) if atol <= 0 else rel


def _scan(
    e: torch.Tensor,
    a: torch.Tensor,
    o: torch.Tensor | None,
    atol: float,
    rtol: float,
    device: torch.device | str | None = None,
    lazy: bool | None = None,
    fuse: bool = True,
) -> _Scan:
    """Every statistic :func:`compare_outputs` needs of one floating output, in one pass.

    On the CPU (``device`` None or ``"cpu"``) the tensors are read :data:`CHUNK` elements at a
    time and converted to float64 chunk by chunk: the intermediates of a chunk stay in the
    CPU's cache, and an operation on fewer than torch's grain size (32,768) elements runs on
    the calling thread, so a comparison neither waits for an intra-op thread whose core a
    worker holds nor allocates float64 copies of the whole output; the scan stops at the
    first chunk with a non-finite mismatch. On a GPU each chunk of :data:`DEVICE_CHUNK`
    elements is copied there and its statistics stay there: the host waits once, for all of
    them (``lazy``: the default off the CPU); there one kernel makes a chunk's terms from its
    elements in their own dtypes (:func:`kerneljudge.check.fused.chunk_row`; the torch
    operations on float64 copies where it cannot, where it ran out of memory, or without
    ``fuse``). Either way they are combined on the host in chunk order. Non-finite values must sit
    where the reference's do, with the same value (NaN, +inf or -inf); positions where the
    reference is not finite count as no error.
    """
    where = torch.device(device) if device is not None else torch.device("cpu")
    lazy = where.type != "cpu" if lazy is None else lazy
    fuse = fuse and lazy and fused.available(where, e, a, o)
    rows: list[Any] = []
    size = _chunk_size(where, fuse)
    for _, (e64, a64, o64) in _pieces(where, e.numel(), e, a, o, fuse=fuse):
        assert e64 is not None and a64 is not None
        if fuse:
            try:
                rows.append(fused.chunk_row(e64, a64, o64, atol, rtol))
                continue
            except RuntimeError:  # out of memory, or NVRTC failed: the torch way's chunks
                del e64, a64, o64, rows
                return _scan(e, a, o, atol, rtol, device, lazy, fuse=False)
        rows.append(_chunk_stats(e64, a64, o64, atol, rtol, lazy))
        if not lazy and rows[-1][0]:
            break
    st = _Scan()
    values = torch.stack(rows).tolist() if lazy and rows else rows  # the one wait for the device
    for k, row in enumerate(values):
        bad, max_abs, sum_abs, max_rel, close, cand_max, cand_sq, ref_max, ref_sq, scale = row
        if bad:  # its first position, found in that chunk (in smaller ones, if fused)
            lo = k * size
            e_k, a_k = e.reshape(-1)[lo : lo + size], a.reshape(-1)[lo : lo + size]
            first = _first_where(lambda e64, a64, _: _nonfinite_mismatch(e64, a64), e_k, a_k,
                                 None, device)  # fmt: skip
            st.nonfinite_at = lo + first[0]
            return st
        st.max_abs = max(st.max_abs, max_abs)
        st.sum_abs += sum_abs
        st.max_rel = max(st.max_rel, max_rel)
        st.close = st.close and bool(close)
        if o is not None:
            st.cand_max = max(st.cand_max, cand_max)
            st.cand_sq += cand_sq
            st.ref_max = max(st.ref_max, ref_max)
            st.ref_sq += ref_sq
            st.scale = max(st.scale, scale)
    return st


def _first_where(
    mask: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    e: torch.Tensor,
    a: torch.Tensor,
    o: torch.Tensor | None,
    device: torch.device | str | None,
) -> list[int]:
    """The first :data:`_MAX_MISMATCHES` flat indices where ``mask`` (of float64 chunks of
    ``e``, ``a``, ``o``) holds, read chunk by chunk (no float64 copy of a whole output)."""
    where = torch.device(device) if device is not None else torch.device("cpu")
    found: list[int] = []
    for lo, (e64, a64, o64) in _pieces(where, e.numel(), e, a, o):
        assert e64 is not None and a64 is not None
        hits = mask(e64, a64, o64).nonzero().flatten()[: _MAX_MISMATCHES - len(found)]
        found += [lo + int(j) for j in hits.tolist()]
        if len(found) >= _MAX_MISMATCHES:
            break
    return found


def _oracle_error_above(
    bound: float, e64: torch.Tensor, a64: torch.Tensor, o64: torch.Tensor | None
) -> torch.Tensor:
    """Mask of the elements whose error against the oracle exceeds ``bound``."""
    assert o64 is not None
    fin = torch.isfinite(e64) & torch.isfinite(o64)
    return torch.where(fin, (a64 - o64).abs(), 0.0) > bound


def _not_close(
    atol: float, rtol: float, e64: torch.Tensor, a64: torch.Tensor, _: torch.Tensor | None
) -> torch.Tensor:
    """Mask of the elements that fail allclose's rule."""
    return ~torch.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return tuple(reversed(out))
