"""How the timed loop changes an input between calls, keeping the structure its values show.

Each continuous floating input (:func:`continuous`: not a mask, not ids) gets a :class:`Plan`
(:func:`plan_for`, decided once per input set from its values). Structure is read off a
fixed-seed sample of the values (:func:`structure`): triangular or symmetric in the last two
dimensions, sorted along a dimension. A dimension that holds structure is never reordered
(rows of a triangular matrix in another order are no longer triangular, and a kernel that
relies on the stated structure would be judged wrong on them). An input with no structure has
the slices along one dimension put in a random order, those along its last dimension rolled by
a random shift (so that a forward that treats rows on their own cannot answer from a cache of
rows), and one element nudged by one ulp. A structured input is not nudged (one ulp can break
a tie of a sorted line, exact symmetry or a zero); its free dimensions are reordered the same
way, and where none with at least :data:`ORDERED_SLICES_MIN` slices is free, it is also changed
in a way that keeps its structure: a triangular or symmetric matrix's rows and columns scaled
by positive factors below one (the same factors for rows and columns of a symmetric one, so it
stays symmetric; zeros and a band kept, definiteness up to rounding), anything else (a sorted
vector, a matrix sorted along its rows) scaled by one factor in (1/2, 1). Factors below one
cannot overflow. One factor is the weakest change: a forward whose output scales with its
input can undo it from a cache, and in bfloat16 it has 120 values; and rounding after it can
make two neighbouring values of a sorted line equal (order is kept, strict order not).

A sample can miss structure (a triangular matrix with fewer than :data:`MATRIX_PAIRS_MIN`
pairs below its diagonal, a sorted line too short to tell from chance, structure of other
kinds); the problem then sets ``ROLL_TIMED_INPUTS = False`` and its inputs are only nudged
(which can break a tie of a sorted line, or make a zero the smallest subnormal). Distinct random
values pass for structured with odds below 2^-30 per dimension (:func:`structure`); values
with many ties (a ReLU's zeros) more often, and then get a structured input's change.

Everything here is exact and deterministic given the values and the seed, on any device: the
samples and factors are drawn by CPU generators, the sampled values are compared on the host
in float64 (exact for every floating dtype read here), and a scaling is IEEE multiplies in the
input's dtype, so the candidate's worker and the reference's build the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kerneljudge.worker.structure import CPU as _CPU
from kerneljudge.worker.structure import (
    FLOAT_DTYPES,
    MATRIX_PAIRS_MIN,
    SAMPLED_LINE_POINTS,
    SAMPLED_LINES,
    SAMPLED_PAIRS,
    SORTED_ODDS_BITS,
    Structure,
    structure,
)
from kerneljudge.worker.structure import INT_VIEW as _INT_VIEW

__all__ = [
    "CONTINUOUS_BLOCK",
    "MATRIX_PAIRS_MIN",
    "ORDERED_SLICES_MIN",
    "PERMUTED_ROWS_MAX",
    "SAMPLED_LINES",
    "SAMPLED_LINE_POINTS",
    "SAMPLED_PAIRS",
    "SORTED_ODDS_BITS",
    "Plan",
    "Structure",
    "continuous",
    "nudge",
    "perturb",
    "plan_for",
    "plans",
    "scale_factors",
    "storage_order",
    "structure",
    "uniform_factor",
    "writable",
]

# Captured at import (the worker imports this before candidate code runs).
_copy = torch.Tensor.copy_

#: Elements :func:`continuous` reads at a time: the first block decides for almost every real
#: input (a random float tensor), so the cost does not grow with the tensor.
CONTINUOUS_BLOCK = 1 << 16
#: The longest dimension whose slices :func:`perturb` puts in a random order (longer: rolled).
PERMUTED_ROWS_MAX = 1 << 20
#: Slices a dimension needs for its orders to be many (8! - 1 = 40319 other orders): the first
#: free dimension with this many is reordered; with none, a structured input gets a change that
#: keeps its structure on top (a first dimension of 2 alone gave an input set one timed content).
ORDERED_SLICES_MIN = 8
#: Elements one multiply of :func:`perturb`'s scaling, or one step of its column roll, covers
#: on the CPU (:func:`_block`; 64 times that on a GPU).
_SCALE_BLOCK = 1 << 20
#: Scale factors lie in (1 - 2^(1-this), 1 - 2^-this] (:func:`scale_factors`).
_SCALE_EXP = 5


def continuous(x: Any) -> bool:
    """Whether ``x`` is a floating tensor with some non-integer value (not a mask or ids),
    laid out densely (contiguous, or a permutation of contiguous: a transpose, channels last).

    Reads ``CONTINUOUS_BLOCK`` elements at a time in storage order and stops at the first
    block with a finite non-integer value, so the answer depends on the values only and is the
    same wherever it is computed (the supervisor and both workers decide it on the same inputs).
    A slice with gaps or an expanded view (a stride of 0, rows that are one row) is not
    changed between timed calls: its values are copied as they are.
    """
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
        return False
    flat = storage_order(x)
    if flat is None or x.element_size() not in _INT_VIEW:
        return False
    if x.dtype not in FLOAT_DTYPES:  # most fp8 formats lack these ops: no change for them
        try:
            return _any_fraction(flat)
        except (RuntimeError, TypeError):
            return False
    return _any_fraction(flat)  # a device error here is the worker's fault, not "no"


def storage_order(x: torch.Tensor) -> torch.Tensor | None:
    """``x``'s elements as a 1-dim view in the order they lie in memory, where ``x`` is dense
    and non-overlapping (its dimensions, sorted by stride, are contiguous); else None."""
    if x.is_contiguous():
        return x.view(-1)
    strides = x.stride()
    by_stride = sorted(range(x.dim()), key=lambda d: (-strides[d], d))
    dense = x.permute(by_stride)
    return dense.view(-1) if dense.is_contiguous() else None


def _any_fraction(flat: torch.Tensor) -> bool:
    for start in range(0, flat.numel(), CONTINUOUS_BLOCK):
        block = flat[start : start + CONTINUOUS_BLOCK]
        finite = torch.isfinite(block)  # in x's own dtype: raises for most fp8 formats
        v = block.float()
        if bool((finite & (v != v.trunc())).any()):
            return True
    return False


@dataclass(frozen=True)
class Plan:
    """How :func:`perturb` changes one continuous input between timed calls (:func:`plan_for`).

    Attributes:
        reorder: the dimension whose slices are put in a random order (None: none).
        columns: the last dimension's slices also rolled by a random shift, 1 to size - 1
            (where it is free and not ``reorder``): with the rows alone reordered, a forward
            that treats each row on its own (a Linear layer) could answer from a cache of rows
            keyed on their values. A roll, not a random order: on a busy 2-core CPU, for a
            4096 x 4096 float32 input, a gather along the last dimension took 142-156 ms, the
            roll 44-62 ms, the row order alone 7-20 ms.
        scale: ``"triangular"``, the last two dimensions scaled by positive row and column
            factors (:func:`scale_factors`; zeros stay zeros); ``"symmetric"``, the same with
            one set of factors for rows and columns (exact symmetry and zeros; definiteness
            up to rounding: a nearly singular one can round to indefinite); ``"uniform"``,
            every element by one positive factor (order along every dimension, zeros and
            symmetry kept); None.
        nudge: one random element moved by one ulp (unstructured inputs only).
    """

    reorder: int | None
    columns: bool = False
    scale: Literal["triangular", "symmetric", "uniform"] | None = None
    nudge: bool = True


def plan_for(x: torch.Tensor) -> Plan:
    """How :func:`perturb` changes the floating tensor ``x`` (:func:`structure`).

    The dimensions free to reorder: those longer than one that hold no structure (sorted
    along them, or one of the last two of a triangular or symmetric input). The one reordered:
    the first free one with ``ORDERED_SLICES_MIN`` slices or more, the last dimension tried
    last (a gather along it moves single elements); with none that long, the free one with
    the most slices. The last dimension is rolled too where it is free and another is the one
    reordered (``Plan.columns``). An input with no structure:
    those reorders and the nudge. A structured one: no nudge, and where no free dimension has
    ``ORDERED_SLICES_MIN`` slices, also a symmetric matrix's rows and columns scaled by one
    set of factors, else a triangular one's by factors of their own (neither where it is
    sorted along them), else one factor for all of it.
    """
    found = structure(x)
    last = x.dim() - 1
    kept = set(found.sorted_dims)
    if found.matrix:
        kept |= {last - 1, last}
    free = [d for d in range(x.dim()) if x.shape[d] > 1 and d not in kept]
    free = [d for d in free if d != last] + [d for d in free if d == last]
    reorder = next((d for d in free if x.shape[d] >= ORDERED_SLICES_MIN), None)
    if reorder is None and free:
        reorder = max(free, key=lambda d: x.shape[d])  # the first of the longest
    columns = reorder is not None and reorder != last and last in free
    if not kept:
        return Plan(reorder, columns)
    if reorder is not None and x.shape[reorder] >= ORDERED_SLICES_MIN:
        return Plan(reorder, columns, nudge=False)
    sorted_matrix = bool({last - 1, last} & set(found.sorted_dims))
    if found.symmetric and not sorted_matrix:
        return Plan(reorder, columns, scale="symmetric", nudge=False)
    if (found.lower_zero or found.upper_zero) and not sorted_matrix:
        return Plan(reorder, columns, scale="triangular", nudge=False)
    return Plan(reorder, columns, scale="uniform", nudge=False)


def plans(values: Sequence[Any]) -> list[Plan | None]:
    """Per value, how the timed loop changes it between calls: :func:`plan_for` for a
    :func:`continuous` tensor, None (copied unchanged) for anything else."""
    return [plan_for(x) if continuous(x) else None for x in values]


def scale_factors(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """``n`` factors in (1 - 2s, 1 - s], s = 2^-5, drawn from ``gen``: ``(n,)`` CPU tensor of
    ``dtype`` (float16, bfloat16, float32 or float64), each exactly ``1 - s - k 2^-(m+1)`` for
    m the dtype's mantissa bits and an integer k < s 2^(m+1) (the dtype's spacing in [1/2, 1)),
    so its value is the same in any dtype it is converted to on the way. A product of two is
    at most (1 - s)^2 = 0.9385 (a value times it moves by 6.1% or more, past the loosest usual
    rtol, 1e-2; 5% or more after its rounding in bfloat16) and never overflows."""
    mant = -int(math.log2(torch.finfo(dtype).eps))
    k = torch.randint(
        0, 1 << (mant + 1 - _SCALE_EXP), (n,), generator=gen, dtype=torch.int64, device=_CPU
    )
    return (1 - 2.0**-_SCALE_EXP - k.double() * 2.0 ** -(mant + 1)).to(dtype)


def uniform_factor(dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """One factor in (1/2, 1 - 2^-5], drawn from ``gen``: a 0-dim CPU tensor of ``dtype``
    (float16, bfloat16, float32 or float64), exactly ``1 - 2^-5 - k 2^-(m+1)`` (m the dtype's
    mantissa bits, at most 52; k < 2^m - 2^(m-4)): 120 values in bfloat16, 960 in float16,
    2^23 - 2^19 in float32. Below one, so a finite input stays finite."""
    mant = -int(math.log2(torch.finfo(dtype).eps))
    top = (1 << mant) - (1 << (mant + 1 - _SCALE_EXP))
    k = torch.randint(0, top, (1,), generator=gen, dtype=torch.int64, device=_CPU)
    return (1 - 2.0**-_SCALE_EXP - k.double() * 2.0 ** -(mant + 1)).to(dtype)[0]


def _scale(x: torch.Tensor, y: torch.Tensor, how: str, gen: torch.Generator) -> None:
    """``y`` (``x``'s shape and dtype; may be ``x``) = ``x`` scaled by positive factors, each
    product rounded once in ``x``'s dtype (IEEE: the same bits on any device). ``how``
    ``"uniform"``: every element by one factor (:func:`uniform_factor`); ``"triangular"``:
    over the last two dimensions (R, C), ``y[..., i, j] = x[..., i, j] * (r[i] * c[j])``
    (:func:`scale_factors`); ``"symmetric"``: the same with ``c = r`` (IEEE multiplies
    commute, so ``r[i] * r[j]`` is symmetric bit for bit). Written a block of rows at a time
    (:func:`_block`)."""
    if how == "uniform":
        torch.mul(x, uniform_factor(x.dtype, gen).to(x.device), out=y)
        return
    rows, cols = x.shape[-2], x.shape[-1]
    r = scale_factors(rows, x.dtype, gen).to(x.device)
    c = r if how == "symmetric" else scale_factors(cols, x.dtype, gen).to(x.device)
    step = max(1, _block(x) // cols)
    for i in range(0, rows, step):
        factors = r[i : i + step, None] * c[None, :]
        torch.mul(x[..., i : i + step, :], factors, out=y[..., i : i + step, :])


def nudge(args: list[Any], which: list[bool], gen: torch.Generator) -> None:
    """Move one random element of each tensor flagged in ``which`` by one ulp, in place.

    Flipping the lowest mantissa bit keeps a finite value of 2 bytes or more finite; an
    infinity (it would become NaN) and 1-byte (fp8) formats, where the flip can make a NaN,
    are left alone. The draw is made either way, so the generator's sequence does not depend
    on the values, and the test of the value runs on the tensor's device (no synchronisation).
    """
    for x, flagged in zip(args, which):
        if flagged:
            j = int(torch.randint(0, x.numel(), (1,), generator=gen, device=_CPU))
            if x.element_size() < 2:
                continue
            view = x.view(_INT_VIEW[x.element_size()]).view(-1)
            # flip the lowest mantissa bit (one ulp) where the value is finite
            view[j] ^= torch.isfinite(x.view(-1)[j]).to(view.dtype)


def perturb(
    args: list[Any],
    which: Sequence[Plan | bool | None],
    seed: int,
    roll: bool = True,
    *,
    into: list[Any] | None = None,
) -> list[Any]:
    """The inputs of one timed call: ``args`` with each tensor that ``which`` gives a
    :class:`Plan` (True: :func:`plan_for` it here) changed as the plan says; other tensors
    cloned, non-tensors as they are.

    The changes, in this order: the slices along ``plan.reorder`` put in a random order other
    than their own (``torch.randperm``; past :data:`PERMUTED_ROWS_MAX` of them rolled by a
    random shift, 1 to size-1: a roll alone gives a set a few hundred inputs, which a cache
    keyed on a few elements covers within a thousand calls), which keeps every value; with
    ``plan.columns``, the slices along the last dimension rolled by a random shift (1 to
    size-1); with ``plan.scale``, the scaling of :func:`_scale` (each element moved by 3% or
    more before its rounding in the dtype, by factors below one, :func:`scale_factors`,
    :func:`uniform_factor`); with ``plan.nudge``, one random element moved by one ulp.
    ``roll=False`` (a problem's ``ROLL_TIMED_INPUTS = False``, for structure :func:`structure`
    cannot see): the nudge only, whatever the plan. Exact and deterministic given ``seed``
    (CPU generator draws), on any device: the reference is run on the same inputs rebuilt.
    A changed input has ``x``'s layout (a transposed input comes back transposed).

    ``into``: an earlier return value of this function, whose tensors are written over where
    one has the shape, dtype and device the new input needs (and is contiguous, or has ``x``'s
    strides where ``x`` is not: :func:`writable`), instead of new ones allocated; the values
    are the same either way. On the CPU a new tensor of hundreds of MB costs its fresh pages
    on top of the copy (a 128 MiB input on a 2-core host: 51 ms a call against 25 ms written
    over, docs/benchmarks/2026-12-02-cpu-timed-loop.md).
    """
    gen = torch.Generator().manual_seed(seed)
    spare = list(into) if into is not None else []
    out: list[Any] = []
    for i, (x, how) in enumerate(zip(args, which)):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        dest = writable(spare[i] if i < len(spare) else None, x)
        change = plan_for(x) if how is True else how if isinstance(how, Plan) else None
        if change is None:
            out.append(_copy(dest, x) if dest is not None else x.clone())
            continue
        if not roll:
            change = Plan(None)
        bits = x.view(_INT_VIEW[x.element_size()])  # moved as integers: CUDA has no fp8 roll
        laid_out = x.is_contiguous()  # else built contiguous, then copied into x's layout
        y = (
            dest.view(bits.dtype)
            if dest is not None and laid_out
            else torch.empty(x.shape, dtype=bits.dtype, device=x.device)
        )
        src = bits  # what the next change reads: y once one has written it
        d = change.reorder
        if d is not None and x.shape[d] <= PERMUTED_ROWS_MAX:
            torch.index_select(bits, d, _order(x.shape[d], gen).to(x.device), out=y)
            src = y
        elif d is not None:  # torch.roll's result, written as its two slices
            size = x.shape[d]
            shift = int(torch.randint(1, size, (1,), generator=gen, device=_CPU))
            _copy(y.narrow(d, shift, size - shift), bits.narrow(d, 0, size - shift))
            _copy(y.narrow(d, 0, shift), bits.narrow(d, size - shift, shift))
            src = y
        if change.columns:
            if src is not y:
                _copy(y, bits)
                src = y
            size = x.shape[-1]
            _roll_columns(y, int(torch.randint(1, size, (1,), generator=gen, device=_CPU)))
        if change.scale is not None:
            _scale(src.view(x.dtype), y.view(x.dtype), change.scale, gen)
            src = y
        if src is not y:
            _copy(y, bits)
        y = y.view(x.dtype)
        if change.nudge:
            nudge([y], [True], gen)
        if not laid_out:  # x's own layout (a transpose stays one)
            y = _copy(dest if dest is not None else torch.empty_like(x), y)
        out.append(y)
    return out


def _roll_columns(y: torch.Tensor, shift: int) -> None:
    """Roll the contiguous ``y`` by ``shift`` along its last dimension, in place (the bits
    of ``torch.roll(y, shift, -1)``), a block of about :func:`_block` elements at a time: a
    copy of a block, not of all of ``y``."""
    cols = y.shape[-1]
    rows = y.view(-1, cols)
    step = max(1, _block(y) // cols)
    for i in range(0, rows.shape[0], step):
        part = rows[i : i + step]
        was = part.clone()
        _copy(part[:, shift:], was[:, : cols - shift])
        _copy(part[:, :shift], was[:, cols - shift :])


def _block(x: torch.Tensor) -> int:
    """Elements a blockwise change of ``x`` (a scaling, a column roll) covers at a time:
    ``_SCALE_BLOCK`` on the CPU, 64 times that on a GPU (an 8 GiB input in 32 blocks, not
    2048 blocks of two or three launches each)."""
    return _SCALE_BLOCK if x.device.type == "cpu" else _SCALE_BLOCK << 6


def _order(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random order of ``n`` > 1 indices other than their own (a draw of the identity is
    shifted by one)."""
    order = torch.randperm(n, generator=gen, device=_CPU)
    if torch.equal(order, torch.arange(n, device=_CPU)):
        order = order.roll(1)
    return order


def writable(t: Any, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """``t`` when a copy of ``like`` (converted to ``dtype``, default its own) can be written
    over it in place: a tensor of its shape, that dtype and its device, contiguous (where
    ``like`` is; else with ``like``'s strides), whose storage is all there (a call can resize
    it through an alias); else None."""
    if (
        isinstance(t, torch.Tensor)
        and t.shape == like.shape
        and t.dtype == (dtype or like.dtype)
        and t.device == like.device
        and (
            t.is_contiguous()
            if like.is_contiguous()
            else t.stride() == like.stride() and storage_order(like) is not None
        )
        and t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * t.element_size()
    ):
        return t
    return None
