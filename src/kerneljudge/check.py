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

Both numbers are always reported. Comparisons run on CPU in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kerneljudge.verdict import Mismatch, TrialResult

__all__ = ["K_MAX", "K_NORM", "compare_outputs", "flatten_outputs"]

#: Slack of the oracle rule over the reference's own largest elementwise error.
K_MAX = 16.0
#: Slack of the oracle rule over the reference's own normwise error.
K_NORM = 16.0
_MAX_MISMATCHES = 5


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
        e64, a64 = e.cpu().double(), a.cpu().double()
        o64 = _as_tensor(o_raw).cpu().double() if use_oracle and o_raw is not None else None

        e_fin, a_fin = torch.isfinite(e64), torch.isfinite(a64)
        if not torch.equal(e_fin, a_fin) or not torch.equal(
            torch.where(e_fin, 0.0, e64).nan_to_num(3.0),
            torch.where(a_fin, 0.0, a64).nan_to_num(3.0),
        ):
            bad = (e_fin != a_fin).nonzero()
            where = tuple(bad[0].tolist()) if len(bad) else ()
            return fail(
                f"{label} has non-finite values where the reference has none, first at {where}"
            )
        diff = torch.where(e_fin, (a64 - e64).abs(), 0.0)
        n = diff.numel()
        if n:
            max_abs = max(max_abs, float(diff.max()))
            mean_acc += float(diff.sum())
            n_total += n
            denom = e64.abs().clamp_min(atol)
            max_rel = max(max_rel, float(torch.where(e_fin, diff / denom, 0.0).max()))
        close = bool(torch.allclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True))
        all_close &= close

        failed_here = False
        if o64 is not None and n:
            fin = e_fin & torch.isfinite(o64)
            cand = torch.where(fin, (a64 - o64).abs(), 0.0)
            refe = torch.where(fin, (e64 - o64).abs(), 0.0)
            eps = torch.finfo(e.dtype).eps
            scale = float(torch.where(fin, o64.abs(), 0.0).max())
            floor = eps * scale
            b_max = max(K_MAX * float(refe.max()), floor)
            b_norm = max(K_NORM * float(refe.norm()), floor * math.sqrt(n))
            ora_err = max(ora_err, float(cand.max()))
            ref_err = max(ref_err, float(refe.max()))
            bound = max(bound, b_max)
            if float(cand.max()) > b_max:
                failed_here = True
                reason = reason or (
                    f"{label}: max error vs float64 {float(cand.max()):.3g} exceeds "
                    f"{b_max:.3g} ({K_MAX:g} x the reference's own error or its rounding floor)"
                )
                bad_mask = cand > b_max
            elif float(cand.norm()) > b_norm:
                failed_here = True
                reason = reason or (
                    f"{label}: error norm vs float64 {float(cand.norm()):.3g} exceeds {b_norm:.3g}"
                )
                bad_mask = cand > float(refe.max())
        elif not use_oracle and not close:
            failed_here = True
            reason = reason or f"{label} not allclose(atol={atol:g}, rtol={rtol:g})"
            bad_mask = ~torch.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)
        if failed_here and not mismatches:
            flat = bad_mask.flatten().nonzero().flatten()[:_MAX_MISMATCHES].tolist()
            shape = tuple(e.shape)
            mismatches = tuple(
                Mismatch(
                    index=_unravel(j, shape),
                    expected=float(e64.flatten()[j]),
                    got=float(a64.flatten()[j]),
                )
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


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return tuple(reversed(out))
