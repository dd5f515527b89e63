"""How the timed loop changes an input between calls, keeping the structure its values show.

Each continuous floating input (:func:`continuous`: not a mask, not ids) gets a :class:`Plan`
(:func:`plan_for`, decided once per input set from its values): which dimension's slices
:func:`perturb` puts in a random order, or, where every dimension longer than one holds
structure, whether it scales the last two dimensions instead. Structure is read off a
fixed-seed sample of the values (:func:`structure`): triangular or symmetric in the last two
dimensions, sorted along a dimension. A dimension that holds structure is never reordered
(rows of a triangular matrix in another order are no longer triangular, and a kernel that
relies on the stated structure would be judged wrong on them). A sample can take an
unstructured input for a structured one (a weaker change, never a wrong verdict); it never
misses true structure, since every sampled position of a structured input satisfies it.

Everything here is exact and deterministic given the values and the seed, on any device: the
samples and factors are drawn by CPU generators, the sampled values are compared on the host
in float64 (exact for every floating dtype), and the scaling is two IEEE multiplies in the
input's dtype, so the candidate's worker and the reference's build the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "CONTINUOUS_BLOCK",
    "PERMUTED_ROWS_MAX",
    "SAMPLED_LINES",
    "SAMPLED_LINE_POINTS",
    "SAMPLED_PAIRS",
    "Plan",
    "Structure",
    "continuous",
    "nudge",
    "perturb",
    "plan_for",
    "plans",
    "scale_factors",
    "structure",
    "writable",
]

# Captured at import (the worker imports this before candidate code runs).
_copy = torch.Tensor.copy_
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: Elements :func:`continuous` reads at a time: the first block decides for almost every real
#: input (a random float tensor), so the cost does not grow with the tensor.
CONTINUOUS_BLOCK = 1 << 16
#: The longest dimension whose slices :func:`perturb` puts in a random order (longer: rolled).
PERMUTED_ROWS_MAX = 1 << 20
#: Positions below (and their mirrors above) the diagonal :func:`structure` reads: all of them
#: where the matrices hold no more.
SAMPLED_PAIRS = 1024
#: Lines along a dimension :func:`structure` reads to decide whether it is sorted (all where
#: there are no more), and points per line (a sorted sample of positions past that length).
SAMPLED_LINES = 64
SAMPLED_LINE_POINTS = 256
#: Seed of the generator that picks the sampled positions: the same on every side.
_SAMPLE_SEED = 0x57A7
#: Elements of the factor block one multiply of :func:`perturb`'s scaling covers at a time.
_SCALE_BLOCK = 1 << 20
_SCALED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def continuous(x: Any) -> bool:
    """Whether ``x`` is a floating tensor with some non-integer value (not a mask or ids).

    Reads ``CONTINUOUS_BLOCK`` elements at a time in storage order and stops at the first
    block with a finite non-integer value, so the answer depends on the values only and is the
    same wherever it is computed (the supervisor and both workers decide it on the same inputs).
    """
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
        return False
    if not x.is_contiguous() or x.element_size() not in _INT_VIEW:
        return False
    flat = x.reshape(-1)
    try:
        for start in range(0, flat.numel(), CONTINUOUS_BLOCK):
            block = flat[start : start + CONTINUOUS_BLOCK]
            finite = torch.isfinite(block)  # in x's own dtype: raises for most fp8 formats
            v = block.float()
            if bool((finite & (v != v.trunc())).any()):
                return True
    except (RuntimeError, TypeError):  # a dtype without these ops (most fp8 formats)
        return False
    return False


@dataclass(frozen=True)
class Structure:
    """What :func:`structure` found in a tensor's values.

    Attributes:
        lower_zero: every sampled position below the diagonal of the last two dimensions is 0
            (upper triangular).
        upper_zero: every sampled position above it is 0 (lower triangular).
        symmetric: square in the last two dimensions and equal to its transpose at every
            sampled pair.
        sorted_dims: dimensions (of size 3 or more) along which every sampled line is
            non-decreasing, or every one non-increasing (constant lines count as either).
    """

    lower_zero: bool = False
    upper_zero: bool = False
    symmetric: bool = False
    sorted_dims: tuple[int, ...] = ()

    @property
    def matrix(self) -> bool:
        """Triangular or symmetric in the last two dimensions."""
        return self.lower_zero or self.upper_zero or self.symmetric


@dataclass(frozen=True)
class Plan:
    """How :func:`perturb` changes one continuous input between timed calls.

    Attributes:
        reorder: the dimension whose slices are put in a random order: the first one longer
            than one with no structure along it; None: none is reordered.
        scale: with no dimension to reorder, how the last two dimensions are scaled by
            positive factors (:func:`scale_factors`): ``"symmetric"``, one set for rows and
            columns (a symmetric matrix stays symmetric); ``"triangular"``, a set each (zeros
            stay zeros); None: the nudge only.
    """

    reorder: int | None
    scale: Literal["symmetric", "triangular"] | None = None


def _gather(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The values of ``x`` at the flat (row-major) indices ``flat`` (CPU int64), in float64 on
    the host: one copy of the indices to ``x``'s device and one of the values back. Gathered
    as integers (every dtype has an integer view of its size), converted on the host."""
    bits = x.view(_INT_VIEW[x.element_size()])
    if x.is_contiguous():
        got = bits.reshape(-1)[flat.to(x.device)]
    else:  # one index per dimension: no copy of x
        got = bits[tuple(torch.stack(torch.unravel_index(flat, x.shape)).to(x.device))]
    return got.cpu().view(x.dtype).double()


def _pairs(shape: torch.Size, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of positions (i, j), i > j, in the leading square of the last two
    dimensions of every matrix (all of them up to ``SAMPLED_PAIRS``, else a sample), and of
    their mirrors (j, i)."""
    r, c = shape[-2], shape[-1]
    m, batch = min(r, c), shape.numel() // (r * c)
    per = m * (m - 1) // 2
    if batch * per <= SAMPLED_PAIRS:
        below = torch.tril_indices(m, m, -1)
        i, j = below[0].repeat(batch), below[1].repeat(batch)
        b = torch.arange(batch).repeat_interleave(per)
    else:
        b = torch.randint(0, batch, (SAMPLED_PAIRS,), generator=gen)
        i = torch.randint(0, m, (SAMPLED_PAIRS,), generator=gen)
        j = torch.randint(0, m - 1, (SAMPLED_PAIRS,), generator=gen)
        j = j + (j >= i).long()  # another index than i, uniform
        i, j = torch.maximum(i, j), torch.minimum(i, j)
    base = b * (r * c)
    return base + i * c + j, base + j * c + i


def _lines(shape: torch.Size, d: int, gen: torch.Generator) -> torch.Tensor:
    """Flat indices (lines, points) of points along dimension ``d``: ``SAMPLED_LINES`` lines
    (all where there are no more), each at every position in order or, when longer than
    ``SAMPLED_LINE_POINTS``, at that many random positions in increasing order."""
    n = shape[d]
    inner = shape[d + 1 :].numel()
    count = shape.numel() // n
    if count <= SAMPLED_LINES:
        line = torch.arange(count)
    else:
        line = torch.randint(0, count, (SAMPLED_LINES,), generator=gen)
    if n <= SAMPLED_LINE_POINTS:
        at = torch.arange(n)
    else:
        at = torch.randint(0, n, (SAMPLED_LINE_POINTS,), generator=gen).sort().values
    start = (line // inner) * (n * inner) + line % inner
    return start[:, None] + at[None, :] * inner


def structure(x: torch.Tensor) -> Structure:
    """The structure ``x``'s values show at a fixed-seed sample of positions.

    Reads at most ``2 x SAMPLED_PAIRS`` elements for the last two dimensions (when both are
    longer than one) and ``SAMPLED_LINES x SAMPLED_LINE_POINTS`` per dimension of size 3 or
    more, gathered in one indexing on ``x``'s device and compared on the host in float64
    (exact for every floating dtype: the same answer on any device); nothing the size of
    ``x`` is allocated. A NaN in a sample counts as no structure. A floating ``x`` of any
    layout; an empty one, or one whose values cannot be converted, has none.
    """
    if not x.numel() or x.element_size() not in _INT_VIEW:
        return Structure()
    gen = torch.Generator().manual_seed(_SAMPLE_SEED)
    parts: list[torch.Tensor] = []
    matrix = x.dim() >= 2 and x.shape[-2] > 1 and x.shape[-1] > 1
    if matrix:
        parts.extend(_pairs(x.shape, gen))
    dims = [d for d in range(x.dim()) if x.shape[d] >= 3]
    lines = [_lines(x.shape, d, gen) for d in dims]
    parts.extend(t.reshape(-1) for t in lines)
    if not parts:
        return Structure()
    try:
        values = _gather(x, torch.cat(parts))
    except (RuntimeError, TypeError):  # a dtype with no float64 conversion
        return Structure()
    pieces = list(values.split([t.numel() for t in parts]))
    facts: dict[str, Any] = {}
    if matrix:
        below, above = pieces.pop(0), pieces.pop(0)
        facts["lower_zero"] = bool((below == 0).all())
        facts["upper_zero"] = bool((above == 0).all())
        facts["symmetric"] = x.shape[-2] == x.shape[-1] and bool((below == above).all())
    found = []
    for d, grid, got in zip(dims, lines, pieces):
        v = got.view(grid.shape)
        step_up, step_down = v[:, 1:] >= v[:, :-1], v[:, 1:] <= v[:, :-1]
        if bool(step_up.all()) or bool(step_down.all()):
            found.append(d)
    return Structure(**facts, sorted_dims=tuple(found))


def plan_for(x: torch.Tensor) -> Plan:
    """How :func:`perturb` changes the floating tensor ``x`` (:func:`structure`): reorder the
    first dimension longer than one that holds no structure (sorted along it, or one of the
    last two of a triangular or symmetric input); with none left, scale the last two
    dimensions of a triangular or symmetric float16, bfloat16, float32 or float64 input that
    is sorted along neither of them (the scaling would undo that); else the nudge only.
    An unstructured input's plan reorders its first dimension longer than one, as it always
    did."""
    found = structure(x)
    kept = set(found.sorted_dims)
    if found.matrix:
        kept |= {x.dim() - 2, x.dim() - 1}
    free = [d for d in range(x.dim()) if x.shape[d] > 1 and d not in kept]
    if free:
        return Plan(free[0])
    if (
        found.matrix
        and x.dtype in _SCALED_DTYPES
        and not {x.dim() - 2, x.dim() - 1} & set(found.sorted_dims)
    ):
        return Plan(None, "symmetric" if found.symmetric else "triangular")
    return Plan(None)


def plans(values: Sequence[Any]) -> list[Plan | None]:
    """Per value, how the timed loop changes it between calls: :func:`plan_for` for a
    :func:`continuous` tensor, None (copied unchanged) for anything else."""
    return [plan_for(x) if continuous(x) else None for x in values]


def scale_factors(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """``n`` factors in [1 + s, 1 + 2s), s = max(2^-10, 4 x eps of ``dtype``), drawn from
    ``gen``: ``(n,)`` CPU tensor of ``dtype`` (float16, bfloat16, float32 or float64), each
    exactly ``1 + s + k 2^-m`` for m the dtype's mantissa bits and an integer k < s 2^m, so
    its value is the same in any dtype it is converted to on the way. A product of two is at
    least 1 + 2s (about 0.2%): far past the judge's tolerance, within the inputs' range."""
    mant = -int(math.log2(torch.finfo(dtype).eps))
    e = min(10, mant - 2)  # s = 2^-e
    k = torch.randint(0, 1 << (mant - e), (n,), generator=gen, dtype=torch.int64)
    return (1 + 2.0**-e + k.double() * 2.0**-mant).to(dtype)


def _scale(x: torch.Tensor, y: torch.Tensor, how: str, gen: torch.Generator) -> None:
    """``y`` (``x``'s shape and dtype) = ``x`` scaled over its last two dimensions (R, C):
    ``y[..., i, j] = x[..., i, j] * (r[i] * c[j])``, each product rounded once in ``x``'s
    dtype (IEEE: the same bits on any device), written a block of rows at a time. ``how``
    ``"symmetric"``: c = r, so y[i, j] and y[j, i] are the same product of the same values."""
    rows, cols = x.shape[-2], x.shape[-1]
    r = scale_factors(rows, x.dtype, gen)
    c = r if how == "symmetric" else scale_factors(cols, x.dtype, gen)
    r, c = r.to(x.device), c.to(x.device)
    step = max(1, _SCALE_BLOCK // cols)
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
            j = int(torch.randint(0, x.numel(), (1,), generator=gen))
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
    :class:`Plan` (True: :func:`plan_for` it here) changed as the plan says, then one random
    element nudged by one ulp; other tensors cloned, non-tensors as they are.

    The change: the slices along ``plan.reorder`` put in a random order other than their own
    (``torch.randperm``; past :data:`PERMUTED_ROWS_MAX` of them rolled by a random shift, 1 to
    size-1: a roll alone gives a set a few hundred inputs, which a cache keyed on a few
    elements covers within a thousand calls), which keeps every value and every line along
    the other dimensions; else the last two dimensions scaled by ``plan.scale`` (factors of
    :func:`scale_factors`: each element by 0.2% to 12%, which keeps a triangular or symmetric matrix
    so); else nothing. ``roll=False`` (a problem's ``ROLL_TIMED_INPUTS = False``, for structure
    :func:`structure` cannot see): the nudge only. Exact and deterministic given ``seed`` (CPU
    generator draws), on any device: the reference is run on the same inputs rebuilt.

    ``into``: an earlier return value of this function, whose tensors are written over where
    one has the shape, dtype and device the new input needs (and is contiguous), instead of
    new ones allocated; the values are the same either way. On the CPU a new tensor of
    hundreds of MB costs its fresh pages on top of the copy (a 128 MiB input on a 2-core
    host: 51 ms a call against 25 ms written over, docs/benchmarks/2026-12-02-cpu-timed-loop.md).
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
            out.append(_copy(dest, x) if dest is not None and x.is_contiguous() else x.clone())
            continue
        d = change.reorder if roll else None
        bits = x.view(_INT_VIEW[x.element_size()])  # moved as integers: CUDA has no fp8 roll
        y = (
            dest.view(bits.dtype)
            if dest is not None
            else torch.empty(x.shape, dtype=bits.dtype, device=x.device)
        )
        if d is not None and x.shape[d] <= PERMUTED_ROWS_MAX:
            order = torch.randperm(x.shape[d], generator=gen)
            if torch.equal(order, torch.arange(x.shape[d])):  # never the rows' own order
                order = order.roll(1)
            torch.index_select(bits, d, order.to(x.device), out=y)
        elif d is not None:  # torch.roll's result, written as its two slices
            size = x.shape[d]
            shift = int(torch.randint(1, size, (1,), generator=gen))
            _copy(y.narrow(d, shift, size - shift), bits.narrow(d, 0, size - shift))
            _copy(y.narrow(d, 0, shift), bits.narrow(d, size - shift, shift))
        elif roll and change.scale is not None:
            _scale(x, y.view(x.dtype), change.scale, gen)
        else:
            _copy(y, bits)
        y = y.view(x.dtype)
        nudge([y], [True], gen)
        out.append(y)
    return out


def writable(t: Any, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """``t`` when a copy of ``like`` (converted to ``dtype``, default its own) can be written
    over it in place: a contiguous tensor of its shape, that dtype and its device, whose
    storage is all there (a call can resize it through an alias); else None."""
    if (
        isinstance(t, torch.Tensor)
        and t.shape == like.shape
        and t.dtype == (dtype or like.dtype)
        and t.device == like.device
        and t.is_contiguous()
        and t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * t.element_size()
    ):
        return t
    return None
