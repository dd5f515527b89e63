"""What the timed loop's input perturbation keeps: structure found in the inputs' values
(triangular, symmetric, sorted) is never reordered away, and unstructured inputs are changed
exactly as before structure was looked for."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kerneljudge.worker import perturbation
from kerneljudge.worker.perturbation import (
    Plan,
    continuous,
    perturb,
    plan_for,
    plans,
    scale_factors,
    structure,
)

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _symmetric(n: int, *lead: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = torch.rand(*lead, n, n, generator=_gen(1), dtype=torch.float64)
    return ((a + a.transpose(-1, -2)) / 2).to(dtype)


def _old_perturb(args: list[Any], which: list[bool], seed: int) -> list[Any]:
    """The perturbation before structure was looked for: the first dimension longer than one
    in a random order (never its own), then one element nudged (the bound is never reached)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for x, flagged in zip(args, which):
        if not isinstance(x, torch.Tensor) or not flagged:
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
            continue
        bits = x.view(_INT[x.element_size()])
        dims = [d for d in range(x.dim()) if x.shape[d] > 1]
        if dims:
            order = torch.randperm(x.shape[dims[0]], generator=gen)
            if torch.equal(order, torch.arange(x.shape[dims[0]])):
                order = order.roll(1)
            y = bits.index_select(dims[0], order).contiguous()
        else:
            y = bits.clone()
        j = int(torch.randint(0, x.numel(), (1,), generator=gen))
        if x.element_size() >= 2:
            flat = y.view(-1)
            flat[j] ^= int(torch.isfinite(y.view(x.dtype).view(-1)[j]))
        out.append(y.view(x.dtype))
    return out


@pytest.mark.parametrize("tri", [torch.triu, torch.tril])
def test_a_triangular_matrix_keeps_its_rows_and_columns_in_order(tri: Any) -> None:
    x = tri(torch.rand(48, 48, generator=_gen()))
    found = structure(x)
    assert (found.lower_zero, found.upper_zero) == (tri is torch.triu, tri is torch.tril)
    assert not found.symmetric and found.sorted_dims == ()
    assert plan_for(x) == Plan(None, "triangular")
    # A batch of them: the batch dimension is the one reordered.
    batch = tri(torch.rand(5, 48, 48, generator=_gen()))
    assert plan_for(batch) == Plan(0)
    (y,) = perturb([batch], [plan_for(batch)], 3)
    assert (tri(y) != y).sum() <= 1  # triangular but for the nudged element
    got = {bytes(m.numpy().tobytes()) for m in y}
    assert len(got & {bytes(m.numpy().tobytes()) for m in batch}) >= 4  # matrices moved whole
    # A batch of one is a single matrix.
    assert plan_for(x[None]) == Plan(None, "triangular")


def test_a_symmetric_matrix_is_found_and_its_batch_dimension_reordered() -> None:
    x = _symmetric(40)
    found = structure(x)
    assert found.symmetric and not (found.lower_zero or found.upper_zero)
    assert plan_for(x) == Plan(None, "symmetric")
    assert plan_for(_symmetric(40, 3)) == Plan(0)
    x[3, 7] += 0.5  # one pair off: the small matrix is read whole, so this is seen
    assert plan_for(x) == Plan(0)


def test_sorted_dimensions_are_left_in_order() -> None:
    g = _gen(2)
    ascending = torch.rand(8, 100, generator=g).sort(-1).values
    assert structure(ascending).sorted_dims == (1,) and plan_for(ascending) == Plan(0)
    # The bundled cumsum problem's input: (B, L) rows sorted in descending order.
    probs = (3.0 * torch.randn(16, 4096, generator=g)).softmax(-1)
    rows = probs.sort(-1, descending=True).values
    assert structure(rows).sorted_dims == (1,) and plan_for(rows) == Plan(0)
    # Sorted along the first dimension: the next one is reordered.
    columns = torch.randn(50, 6, generator=g).sort(0).values
    assert plan_for(columns) == Plan(1)
    (y,) = perturb([columns], [plan_for(columns)], 5)
    assert (y.diff(dim=0) < 0).sum() <= 1  # still sorted along it but for the nudge
    # A sorted vector has nothing to reorder: the nudge only.
    vector = torch.rand(1000, generator=g).sort().values
    assert plan_for(vector) == Plan(None)
    (v,) = perturb([vector], [plan_for(vector)], 5)
    assert (v != vector).sum() == 1


def test_unstructured_inputs_are_changed_as_before_bit_for_bit() -> None:
    g = _gen(4)
    args: list[Any] = [
        torch.randn(6, 5, generator=g),
        torch.randn(1, 7, generator=g),
        torch.randn(7, 1, 5, generator=g),
        torch.randn(3, 4, 5, 6, generator=g),
        torch.randn(32, 32, generator=g),
        torch.randn(2, 9, 9, generator=g).half(),
        torch.randn(1, 1, generator=g) + 0.5,
        (torch.rand(6, 5, generator=g) > 0.5).float(),  # a mask: copied
        torch.randint(0, 9, (4,), generator=g),
        2.5,
    ]
    found = plans(args)
    for x, plan in zip(args, found):
        if isinstance(x, torch.Tensor) and continuous(x):
            first = next((d for d in range(x.dim()) if x.shape[d] > 1), None)
            assert plan == Plan(first), (tuple(x.shape), plan)
        else:
            assert plan is None
    for seed in (0, 1, 12345):
        new = perturb(args, found, seed)
        old = _old_perturb(args, [p is not None for p in found], seed)
        for u, v in zip(new, old):
            if isinstance(u, torch.Tensor):
                assert torch.equal(u.view(torch.uint8), v.view(torch.uint8))
            else:
                assert u == v
    # True asks perturb to decide the plan itself: the same result.
    flags = [p is not None for p in found]
    for u, v in zip(perturb(args, flags, 9), perturb(args, found, 9)):
        assert not isinstance(u, torch.Tensor) or torch.equal(u, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["upper", "lower", "symmetric"])
def test_the_scaling_keeps_the_structure_exactly_and_moves_every_value(
    dtype: torch.dtype, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 64
    base = torch.rand(n, n, generator=_gen(6), dtype=torch.float64) + 0.1
    x = {
        "upper": base.triu(),
        "lower": base.tril(),
        "symmetric": (base + base.T) / 2,
    }[kind].to(dtype)
    plan = plan_for(x)
    assert plan == Plan(None, "symmetric" if kind == "symmetric" else "triangular")
    monkeypatch.setattr(perturbation, "nudge", lambda *a, **k: None)  # the scaling alone
    (y,) = perturb([x], [plan], 21)
    assert y.dtype == dtype and y.shape == x.shape
    if kind == "upper":
        assert torch.equal(y, y.triu())
    elif kind == "lower":
        assert torch.equal(y, y.tril())
    else:
        assert torch.equal(y, y.T)
    nonzero = x != 0
    moved = (y.double() - x.double()).abs() / x.double().abs()
    assert bool((moved[nonzero] > 1e-4).all()) and float(moved[nonzero].max()) < 0.15
    # The same bits as the stated formula: each row and column factor drawn from the call's
    # generator, their product rounded once in the dtype, then the product with the value.
    gen = _gen(21)
    r = scale_factors(n, dtype, gen)
    c = r if kind == "symmetric" else scale_factors(n, dtype, gen)
    assert torch.equal(y, x * (r[:, None] * c[None, :]))
    # Deterministic given the seed; another seed gives other factors.
    assert torch.equal(perturb([x], [plan], 21)[0], y)
    assert not torch.equal(perturb([x], [plan], 22)[0], y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_scale_factors_lie_in_their_range_and_are_exact_in_their_dtype(dtype: torch.dtype) -> None:
    s = max(2.0**-10, 4 * torch.finfo(dtype).eps)
    f = scale_factors(4096, dtype, _gen(8))
    wide = f.double()
    assert bool((wide >= 1 + s).all()) and bool((wide < 1 + 2 * s).all())
    assert torch.equal(wide.to(dtype), f) and len(wide.unique()) > 1


def test_without_roll_a_structured_input_is_only_nudged() -> None:
    x = torch.rand(32, 32, generator=_gen(9)).triu()
    (y,) = perturb([x], [plan_for(x)], 4, roll=False)
    assert (y != x).sum() == 1


def test_the_plan_depends_on_the_values_alone() -> None:
    g = _gen(10)
    inputs = [
        torch.rand(64, 64, generator=g).triu(),
        _symmetric(24, 2),
        torch.rand(300, 7, generator=g).sort(0).values,
        torch.randn(9, 33, 5, generator=g),
    ]
    for x in inputs:
        strided = x.transpose(0, -1).contiguous().transpose(0, -1)  # same values, other layout
        assert not strided.is_contiguous() or x.dim() < 2
        assert plan_for(x) == plan_for(x.clone()) == plan_for(strided)
        assert structure(x) == structure(x.clone())


def test_the_structure_check_reads_a_bounded_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    gather = perturbation._gather

    def counted(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        read.append(flat.numel())
        return gather(x, flat)

    monkeypatch.setattr(perturbation, "_gather", counted)
    x = torch.rand(3, 700, 700, generator=_gen(11)).triu()
    assert plan_for(x) == Plan(0)
    bound = 2 * perturbation.SAMPLED_PAIRS
    bound += 3 * perturbation.SAMPLED_LINES * perturbation.SAMPLED_LINE_POINTS
    assert read == [read[0]] and read[0] <= bound
