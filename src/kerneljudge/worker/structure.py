"""What structure a tensor's values show, read off a fixed-seed sample: triangular or symmetric
in the last two dimensions, sorted along a dimension (:func:`structure`). The timed loop keeps
what it finds (:mod:`kerneljudge.worker.perturbation`).

The answer depends on the values alone, on any device and layout: positions are drawn by a CPU
generator under a fixed seed, the sampled values are gathered in one indexing and compared on
the host in float64 (exact for the four dtypes read here), so the candidate's worker and the
reference's find the same structure in the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "CPU",
    "FLOAT_DTYPES",
    "INT_VIEW",
    "MATRIX_PAIRS_MIN",
    "SAMPLED_LINES",
    "SAMPLED_LINE_POINTS",
    "SAMPLED_PAIRS",
    "SORTED_ODDS_BITS",
    "Structure",
    "structure",
]

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: Where every draw and index is made (a candidate may change torch's default device).
CPU = torch.device("cpu")
#: The dtypes whose structure is read (and that the timed loop may scale).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
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
#: Relative difference within which a pair counts as symmetric: 8 units of the dtype's eps (a
#: Gram matrix computed in blocks can differ from its transpose in the last bits).
_SYMMETRIC_EPS = 8


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


def _gather(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The values of ``x`` at the flat (row-major) indices ``flat`` (CPU int64), in float64 on
    the host: one copy of the indices to ``x``'s device and one of the values back. Gathered
    as integers (every dtype has an integer view of its size), converted on the host."""
    bits = x.view(INT_VIEW[x.element_size()])
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
        below = torch.tril_indices(m, m, -1, device=CPU)
        i, j = below[0].repeat(batch), below[1].repeat(batch)
        b = torch.arange(batch, device=CPU).repeat_interleave(per)
    else:
        b = torch.randint(0, batch, (SAMPLED_PAIRS,), generator=gen, device=CPU)
        i = torch.randint(0, m, (SAMPLED_PAIRS,), generator=gen, device=CPU)
        j = torch.randint(0, m - 1, (SAMPLED_PAIRS,), generator=gen, device=CPU)
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
        line = torch.arange(count, device=CPU)
    else:
        line = torch.randint(0, count, (SAMPLED_LINES,), generator=gen, device=CPU)
    if n <= SAMPLED_LINE_POINTS:
        at = torch.arange(n, device=CPU)
    else:
        at = torch.randint(0, n, (SAMPLED_LINE_POINTS,), generator=gen, device=CPU)
        at = at.sort().values
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
    if not x.numel() or x.dtype not in FLOAT_DTYPES:
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
