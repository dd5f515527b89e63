"""How the timed loop changes an input between calls, keeping the structure its values show.

Each continuous floating input (:func:`continuous`: not a mask, not ids) gets a :class:`Plan`
(:func:`plan_for`, decided once per input set from its values). Structure is read off a
fixed-seed sample of the values (:func:`structure`): triangular or symmetric in the last two
dimensions, sorted along a dimension. A dimension that holds structure is never reordered
(rows of a triangular matrix in another order are no longer triangular, and a kernel that
relies on the stated structure would be judged wrong on them). An input with no structure has
the slices along one dimension put in a random order and one element nudged by one ulp, as
before structure was looked for. A structured input is not nudged (one ulp can break a tie of
a sorted line, exact symmetry or a zero); where no dimension with at least
:data:`ORDERED_SLICES_MIN` slices is free to reorder, it is changed in a way that keeps its
structure: a symmetric matrix's rows and columns put in the same random order, a triangular
one's rows and columns scaled by positive factors, anything else scaled by one positive factor.

A sample can miss structure (a triangular matrix with fewer than :data:`MATRIX_PAIRS_MIN`
pairs below its diagonal, a sorted line too short to tell from chance, structure of other
kinds); the problem then sets ``ROLL_TIMED_INPUTS = False``. A random input is taken for a
structured one with odds below 2^-30 (:func:`structure`).

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
#: Slices a dimension needs for its orders to be many (8! - 1 = 40319 other orders): the first
#: free dimension with this many is reordered; with none, a structured input gets a change that
#: keeps its structure on top (a first dimension of 2 alone gave an input set one timed content).
ORDERED_SLICES_MIN = 8
#: Positions below (and their mirrors above) the diagonal :func:`structure` reads: all of them
#: where the matrices hold no more.
SAMPLED_PAIRS = 1024
#: Pairs :func:`structure` needs to call the last two dimensions triangular or symmetric: a
#: random input with half its values zero (a ReLU's output) passes for triangular at odds 2^-32.
MATRIX_PAIRS_MIN = 32
#: Lines along a dimension :func:`structure` reads to decide whether it is sorted (all where
#: there are no more), and points per line (a sorted sample of positions past that length).
SAMPLED_LINES = 64
SAMPLED_LINE_POINTS = 256
#: A dimension counts as sorted only where its sampled lines would all be monotone by chance
#: with odds below 2^-this for distinct random values (a line of p points: 2 / p!).
SORTED_ODDS_BITS = 30
#: Seed of the generator that picks the sampled positions: the same on every side.
_SAMPLE_SEED = 0x57A7
#: Elements of the factor block one multiply of :func:`perturb`'s scaling covers at a time.
_SCALE_BLOCK = 1 << 20
_SCALED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Relative difference within which a pair counts as symmetric: 8 units of the dtype's eps (a
#: Gram matrix computed in blocks can differ from its transpose in the last bits).
_SYMMETRIC_EPS = 8


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
    if x.dtype not in _SCALED_DTYPES:  # most fp8 formats lack these ops: no change for them
        try:
            return _any_fraction(flat)
        except (RuntimeError, TypeError):
            return False
    return _any_fraction(flat)  # a device error here is the worker's fault, not "no"


def _any_fraction(flat: torch.Tensor) -> bool:
    for start in range(0, flat.numel(), CONTINUOUS_BLOCK):
        block = flat[start : start + CONTINUOUS_BLOCK]
        finite = torch.isfinite(block)  # in x's own dtype: raises for most fp8 formats
        v = block.float()
        if bool((finite & (v != v.trunc())).any()):
            return True
    return False


@dataclass(frozen=True)
class Structure:
    """What :func:`structure` found in a tensor's values.

    Attributes:
        lower_zero: every sampled position below the diagonal of the last two dimensions is 0
            (upper triangular).
        upper_zero: every sampled position above it is 0 (lower triangular).
        symmetric: square in the last two dimensions and equal to its transpose at every
            sampled pair, within 8 eps of the dtype relative to the larger magnitude.
        sorted_dims: dimensions along which every sampled line is non-decreasing, or every
            one non-increasing (constant lines count as either), read only where chance
            would pass distinct random values with odds below 2^-``SORTED_ODDS_BITS``.
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
    """How :func:`perturb` changes one continuous input between timed calls (:func:`plan_for`).

    Attributes:
        reorder: the dimension whose slices are put in a random order (None: none).
        symmetric: the last two dimensions put in one random order together (rows and columns
            of a symmetric matrix: it stays symmetric, every value kept).
        scale: ``"triangular"``, the last two dimensions scaled by positive row and column
            factors (:func:`scale_factors`; zeros stay zeros); ``"uniform"``, every element by
            one positive factor (order along every dimension, zeros and symmetry kept); None.
        nudge: one random element moved by one ulp (unstructured inputs only).
    """

    reorder: int | None
    symmetric: bool = False
    scale: Literal["triangular", "uniform"] | None = None
    nudge: bool = True


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


def _lines(shape: torch.Size, d: int, gen: torch.Generator) -> torch.Tensor | None:
    """Flat indices (lines, points) of points along dimension ``d``: ``SAMPLED_LINES`` lines
    (all where there are no more), each at every position in order or, when longer than
    ``SAMPLED_LINE_POINTS``, at that many random positions in increasing order. None where
    all of them being monotone would not tell sorted values from chance
    (``SORTED_ODDS_BITS``)."""
    n = shape[d]
    inner = shape[d + 1 :].numel()
    count = shape.numel() // n
    lines = min(count, SAMPLED_LINES)
    points = min(n, SAMPLED_LINE_POINTS)
    # log2 of 1 / P(a line of `points` distinct random values is monotone) = log2(points! / 2)
    if lines * (math.lgamma(points + 1) - math.log(2)) / math.log(2) < SORTED_ODDS_BITS:
        return None
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

    Reads at most ``2 x SAMPLED_PAIRS`` elements for the last two dimensions (where both are
    longer than one and hold ``MATRIX_PAIRS_MIN`` pairs below the diagonal) and
    ``SAMPLED_LINES x SAMPLED_LINE_POINTS`` per dimension long enough to tell sorted values
    from chance, gathered in one indexing on ``x``'s device and compared on the host in
    float64 (exact for float16, bfloat16, float32 and float64: the same answer on any
    device); nothing the size of ``x`` is allocated. A NaN in a sample counts as no
    structure. Any layout of those four dtypes; other dtypes and empty tensors have none.
    Errors of ``x``'s device propagate (a silent "none" on one side only would give the two
    sides different plans).
    """
    if not x.numel() or x.dtype not in _SCALED_DTYPES:
        return Structure()
    gen = torch.Generator().manual_seed(_SAMPLE_SEED)
    parts: list[torch.Tensor] = []
    matrix = x.dim() >= 2 and x.shape[-2] > 1 and x.shape[-1] > 1
    if matrix:
        m = min(x.shape[-2], x.shape[-1])
        matrix = x.shape.numel() // (x.shape[-2] * x.shape[-1]) * (m * (m - 1) // 2) >= (
            MATRIX_PAIRS_MIN
        )
    if matrix:
        parts.extend(_pairs(x.shape, gen))
    dims: list[int] = []
    lines: list[torch.Tensor] = []
    for d in range(x.dim()):
        grid = _lines(x.shape, d, gen) if x.shape[d] >= 3 else None
        if grid is not None:
            dims.append(d)
            lines.append(grid)
    parts.extend(t.reshape(-1) for t in lines)
    if not parts:
        return Structure()
    values = _gather(x, torch.cat(parts))
    pieces = list(values.split([t.numel() for t in parts]))
    facts: dict[str, Any] = {}
    if matrix:
        below, above = pieces.pop(0), pieces.pop(0)
        facts["lower_zero"] = bool((below == 0).all())
        facts["upper_zero"] = bool((above == 0).all())
        near = _SYMMETRIC_EPS * torch.finfo(x.dtype).eps * torch.maximum(below.abs(), above.abs())
        facts["symmetric"] = x.shape[-2] == x.shape[-1] and bool(
            ((below - above).abs() <= near).all()
        )
    found = []
    for d, grid, got in zip(dims, lines, pieces):
        v = got.view(grid.shape)
        step_up, step_down = v[:, 1:] >= v[:, :-1], v[:, 1:] <= v[:, :-1]
        if bool(step_up.all()) or bool(step_down.all()):
            found.append(d)
    return Structure(**facts, sorted_dims=tuple(found))


def plan_for(x: torch.Tensor) -> Plan:
    """How :func:`perturb` changes the floating tensor ``x`` (:func:`structure`).

    The dimensions free to reorder: those longer than one that hold no structure (sorted
    along them, or one of the last two of a triangular or symmetric input). The one reordered:
    the first free one with ``ORDERED_SLICES_MIN`` slices or more, the last dimension tried
    last (a gather along it moves single elements); with none that long, the free one with
    the most slices. An input with no structure: that reorder and the nudge (with a first
    dimension of ``ORDERED_SLICES_MIN`` or more, the change made before structure was looked
    for). A structured one: no nudge, and where no free dimension has ``ORDERED_SLICES_MIN``
    slices, also a symmetric matrix's rows and columns in one random order, else a
    triangular one's rows and columns scaled (unless it is sorted along them), else one
    factor for all of it.
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
    if not kept:
        return Plan(reorder)
    if reorder is not None and x.shape[reorder] >= ORDERED_SLICES_MIN:
        return Plan(reorder, nudge=False)
    sorted_matrix = bool({last - 1, last} & set(found.sorted_dims))
    if found.symmetric and not sorted_matrix:
        return Plan(reorder, symmetric=True, nudge=False)
    if (found.lower_zero or found.upper_zero) and not sorted_matrix:
        return Plan(reorder, scale="triangular", nudge=False)
    return Plan(reorder, scale="uniform", nudge=False)


def plans(values: Sequence[Any]) -> list[Plan | None]:
    """Per value, how the timed loop changes it between calls: :func:`plan_for` for a
    :func:`continuous` tensor, None (copied unchanged) for anything else."""
    return [plan_for(x) if continuous(x) else None for x in values]


def scale_factors(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """``n`` factors in [1 + s, 1 + 2s), s = 2^-10 for float32 and float64, 2^-5 for float16
    and bfloat16, drawn from ``gen``: ``(n,)`` CPU tensor of ``dtype``, each exactly
    ``1 + s + k 2^-m`` for m the dtype's mantissa bits and an integer k < s 2^m, so its value
    is the same in any dtype it is converted to on the way. A product of two is at least
    (1 + s)^2: 0.2% for the wide dtypes, 6.3% for the 16-bit ones (past their usual rtol of
    1e-2; a value times it, rounded in bfloat16, moves by 5% or more)."""
    mant = -int(math.log2(torch.finfo(dtype).eps))
    e = 10 if torch.finfo(dtype).bits >= 32 else 5  # s = 2^-e
    k = torch.randint(0, 1 << (mant - e), (n,), generator=gen, dtype=torch.int64)
    return (1 + 2.0**-e + k.double() * 2.0**-mant).to(dtype)


def _scale(x: torch.Tensor, y: torch.Tensor, how: str, gen: torch.Generator) -> None:
    """``y`` (``x``'s shape and dtype; may be ``x``) = ``x`` scaled by positive factors, each
    product rounded once in ``x``'s dtype (IEEE: the same bits on any device). ``how``
    ``"uniform"``: every element by one factor (the product of two of
    :func:`scale_factors`, rounded once); ``"triangular"``: over the last two dimensions
    (R, C), ``y[..., i, j] = x[..., i, j] * (r[i] * c[j])``, written a block of rows at a
    time."""
    if how == "uniform":
        f = scale_factors(2, x.dtype, gen)
        torch.mul(x, (f[0] * f[1]).to(x.device), out=y)
        return
    rows, cols = x.shape[-2], x.shape[-1]
    r = scale_factors(rows, x.dtype, gen).to(x.device)
    c = scale_factors(cols, x.dtype, gen).to(x.device)
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
    :class:`Plan` (True: :func:`plan_for` it here) changed as the plan says; other tensors
    cloned, non-tensors as they are.

    The changes, in this order: the slices along ``plan.reorder`` put in a random order other
    than their own (``torch.randperm``; past :data:`PERMUTED_ROWS_MAX` of them rolled by a
    random shift, 1 to size-1: a roll alone gives a set a few hundred inputs, which a cache
    keyed on a few elements covers within a thousand calls), which keeps every value and every
    line along the other dimensions; with ``plan.symmetric``, the last two dimensions put in
    one random order other than their own together; with ``plan.scale``, the scaling of
    :func:`_scale` (each element moved by a factor of at least (1 + s)^2,
    :func:`scale_factors`); with ``plan.nudge``, one random element moved by one ulp.
    ``roll=False`` (a problem's ``ROLL_TIMED_INPUTS = False``, for structure
    :func:`structure` cannot see): the nudge only, whatever the plan. Exact and deterministic
    given ``seed`` (CPU generator draws), on any device: the reference is run on the same
    inputs rebuilt.

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
        if not roll:
            change = Plan(None)
        bits = x.view(_INT_VIEW[x.element_size()])  # moved as integers: CUDA has no fp8 roll
        y = (
            dest.view(bits.dtype)
            if dest is not None
            else torch.empty(x.shape, dtype=bits.dtype, device=x.device)
        )
        src = bits  # what the next change reads: y once one has written it
        d = change.reorder
        if d is not None and x.shape[d] <= PERMUTED_ROWS_MAX:
            torch.index_select(bits, d, _order(x.shape[d], gen).to(x.device), out=y)
            src = y
        elif d is not None:  # torch.roll's result, written as its two slices
            size = x.shape[d]
            shift = int(torch.randint(1, size, (1,), generator=gen))
            _copy(y.narrow(d, shift, size - shift), bits.narrow(d, 0, size - shift))
            _copy(y.narrow(d, 0, shift), bits.narrow(d, size - shift, shift))
            src = y
        if change.symmetric:  # rows and columns in one order: P x P^T
            order = _order(x.shape[-1], gen).to(x.device)
            rows = torch.index_select(src, x.dim() - 2, order)
            torch.index_select(rows, x.dim() - 1, order, out=y)
            del rows
            src = y
        if change.scale is not None:
            _scale(src.view(x.dtype), y.view(x.dtype), change.scale, gen)
            src = y
        if src is not y:
            _copy(y, bits)
        y = y.view(x.dtype)
        if change.nudge:
            nudge([y], [True], gen)
        out.append(y)
    return out


def _order(n: int, gen: torch.Generator) -> torch.Tensor:
    """A random order of ``n`` > 1 indices other than their own (a draw of the identity is
    shifted by one)."""
    order = torch.randperm(n, generator=gen)
    if torch.equal(order, torch.arange(n)):
        order = order.roll(1)
    return order


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
