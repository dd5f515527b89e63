"""What the timed loop's input perturbation keeps: structure found in the inputs' values
(triangular, symmetric, sorted) is never reordered away, and unstructured inputs are changed
exactly as before structure was looked for."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kerneljudge.worker import structure as structure_module
from kerneljudge.worker.perturbation import (
    Plan,
    continuous,
    perturb,
    plan_for,
    plans,
    scale_factors,
    structure,
    uniform_factor,
)

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _symmetric(n: int, *lead: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = torch.rand(*lead, n, n, generator=_gen(1), dtype=torch.float64)
    return ((a + a.transpose(-1, -2)) / 2).to(dtype)


def _plain_perturb(args: list[Any], dims: list[tuple[int, bool] | None], seed: int) -> list[Any]:
    """The change of an unstructured input, written out: the slices along ``dims[i][0]`` in a
    random order (never their own), with ``dims[i][1]`` those along the last dimension
    rolled by a random shift, then one element nudged (the roll bound is never reached);
    None in ``dims`` for a value left as it is (a continuous one of one element: the nudge
    only)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for x, how in zip(args, dims):
        if not isinstance(x, torch.Tensor) or (how is None and not continuous(x)):
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
            continue
        y = x.view(_INT[x.element_size()]).clone()
        if how is not None:
            d, columns = how
            y = y.index_select(d, _never_own(x.shape[d], gen))
            if columns:
                y = y.roll(int(torch.randint(1, x.shape[-1], (1,), generator=gen)), -1)
        j = int(torch.randint(0, x.numel(), (1,), generator=gen))
        if x.element_size() >= 2:
            flat = y.contiguous().view(-1)
            flat[j] ^= int(torch.isfinite(flat.view(x.dtype)[j]))
            y = flat.view(x.shape)
        out.append(y.view(x.dtype))
    return out


def _never_own(n: int, gen: torch.Generator) -> torch.Tensor:
    order = torch.randperm(n, generator=gen)
    return order.roll(1) if torch.equal(order, torch.arange(n)) else order


@pytest.mark.parametrize("tri", [torch.triu, torch.tril])
def test_a_triangular_matrix_keeps_its_rows_and_columns_in_order(tri: Any) -> None:
    x = tri(torch.rand(48, 48, generator=_gen()))
    found = structure(x)
    assert (found.lower_zero, found.upper_zero) == (tri is torch.triu, tri is torch.tril)
    assert not found.symmetric and found.sorted_dims == ()
    assert plan_for(x) == Plan(None, scale="triangular", nudge=False)
    # A batch of them: the batch dimension is the one reordered, the matrices moved whole.
    batch = tri(torch.rand(9, 48, 48, generator=_gen()))
    assert plan_for(batch) == Plan(0, nudge=False)
    (y,) = perturb([batch], [plan_for(batch)], 3)
    assert torch.equal(tri(y), y)
    got = {bytes(m.numpy().tobytes()) for m in y}
    assert got == {bytes(m.numpy().tobytes()) for m in batch} and not torch.equal(y, batch)
    # A batch of few: reordered and scaled. A batch of one is a single matrix.
    few = tri(torch.rand(2, 48, 48, generator=_gen()))
    assert plan_for(few) == Plan(0, scale="triangular", nudge=False)
    (z,) = perturb([few], [plan_for(few)], 3)
    assert torch.equal(tri(z), z) and bool(
        (z[few[[1, 0]] != 0] != few[[1, 0]][few[[1, 0]] != 0]).all()
    )
    assert plan_for(x[None]) == Plan(None, scale="triangular", nudge=False)


def test_a_symmetric_matrix_gets_one_set_of_factors_for_rows_and_columns() -> None:
    x = _symmetric(40)
    found = structure(x)
    assert found.symmetric and not (found.lower_zero or found.upper_zero)
    assert plan_for(x) == Plan(None, scale="symmetric", nudge=False)
    (y,) = perturb([x], [plan_for(x)], 13)
    assert torch.equal(y, y.T) and not torch.equal(y, x)
    r = scale_factors(40, torch.float32, _gen(13))
    assert torch.equal(y, x * (r[:, None] * r[None, :]))
    assert plan_for(_symmetric(40, 3)) == Plan(0, scale="symmetric", nudge=False)
    assert plan_for(_symmetric(40, 8)) == Plan(0, nudge=False)
    x[3, 7] += 0.5  # one pair off: the small matrix is read whole, so this is seen
    assert plan_for(x) == Plan(0, columns=True)


def test_a_matrix_symmetric_to_a_few_ulps_is_symmetric() -> None:
    a = torch.randn(40, 40, generator=_gen(14))  # 780 pairs: all read
    gram = a @ a.T
    off = gram.clone()
    off.view(torch.int32)[5, 9] += 3  # three ulps away from its mirror
    assert structure(off).symmetric
    off[5, 9] *= 1.001
    assert not structure(off).symmetric


def test_sorted_dimensions_are_left_in_order() -> None:
    g = _gen(2)
    ascending = torch.rand(8, 100, generator=g).sort(-1).values
    assert structure(ascending).sorted_dims == (1,)
    assert plan_for(ascending) == Plan(0, nudge=False)
    # The bundled cumsum problem's input: (B, L) rows sorted in descending order.
    probs = (3.0 * torch.randn(16, 4096, generator=g)).softmax(-1)
    rows = probs.sort(-1, descending=True).values
    assert structure(rows).sorted_dims == (1,) and plan_for(rows) == Plan(0, nudge=False)
    # Sorted along the first dimension: the next one is reordered, and scaled (6 slices).
    columns = torch.randn(50, 6, generator=g).sort(0).values
    assert plan_for(columns) == Plan(1, scale="uniform", nudge=False)
    (y,) = perturb([columns], [plan_for(columns)], 5)
    assert (y.diff(dim=0) < 0).sum() == 0 and not torch.equal(y.sort(0).values, columns)
    # A sorted vector has nothing to reorder: one factor for all of it, order kept.
    vector = torch.rand(1000, generator=g).sort().values
    assert plan_for(vector) == Plan(None, scale="uniform", nudge=False)
    (v,) = perturb([vector], [plan_for(vector)], 5)
    assert (v.diff() < 0).sum() == 0 and bool((v < vector).all())


def test_a_sorted_half_vector_with_ties_stays_sorted() -> None:
    """A sorted float16 vector of 100k elements holds many ties; one ulp on one of them (the
    nudge) would have left it unsorted, and a kernel that searches it would differ."""
    vector = torch.rand(100_000, generator=_gen(15)).half().sort().values
    assert len(vector.unique()) < vector.numel()
    plan = plan_for(vector)
    assert not plan.nudge
    for seed in range(20):
        (v,) = perturb([vector], [plan], seed)
        assert (v.diff() < 0).sum() == 0


def test_short_or_narrow_inputs_are_not_taken_for_structured() -> None:
    """Chance alone makes a random 3-vector sorted one time in three and a column of two a
    triangle half the time (a ReLU's zeros): too few samples to tell is no structure."""
    g = _gen(16)
    for n in (3, 4, 12):
        for _ in range(50):
            x = torch.rand(n, generator=g)
            assert structure(x).sorted_dims == () and plan_for(x) == Plan(0)
    pairs = torch.relu(torch.randn(4096, 2, generator=g))
    assert not structure(pairs).matrix and plan_for(pairs) == Plan(0, columns=True)
    assert not structure(torch.relu(torch.randn(2, 1000, generator=g))).matrix


def test_a_first_dimension_of_two_is_not_the_one_reordered() -> None:
    """Two rows have one other order: with the first dimension of a (2, 32, 64, 16) input
    reordered, a cache keyed on a few elements saw one timed content per input set."""
    x = torch.randn(2, 32, 64, 16, generator=_gen(17))
    assert plan_for(x) == Plan(1, columns=True)
    keys = set()
    plan = plan_for(x)
    for seed in range(300):
        (y,) = perturb([x], [plan], seed)
        flat = y.reshape(-1)
        keys.add(tuple(float(flat[i]) for i in (0, 1, 4096, 8192, 30000, 65535)))
    assert len(keys) > 250


def test_a_device_error_while_reading_the_sample_is_not_no_structure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fails(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(structure_module, "_gather", fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        structure(torch.rand(64, 64).triu())


def test_unstructured_inputs_get_a_reorder_and_the_nudge() -> None:
    g = _gen(4)
    args: list[Any] = [
        torch.randn(6, 5, generator=g),
        torch.randn(1, 7, generator=g),
        torch.randn(7, 1, 5, generator=g),
        torch.randn(3, 4, 5, 6, generator=g),
        torch.randn(32, 32, generator=g),
        torch.randn(2, 9, 9, generator=g).half(),
        torch.randn(3, 20, generator=g),
        torch.randn(1, 1, generator=g) + 0.5,
        (torch.rand(6, 5, generator=g) > 0.5).float(),  # a mask: copied
        torch.randint(0, 9, (4,), generator=g),
        2.5,
    ]
    # The first free dimension with 8 slices or more, the last dimension tried last; with
    # none that long, the longest (the first of them); and the last one too where it is
    # free and not that one.
    dims = [(0, True), (1, False), (0, True), (3, False), (0, True), (1, True), (1, False)]
    dims += [None, None, None, None]
    found = plans(args)
    for x, plan, how in zip(args, found, dims):
        if isinstance(x, torch.Tensor) and continuous(x):
            want = Plan(None) if how is None else Plan(*how)
            assert plan == want, (tuple(x.shape), plan)
        else:
            assert plan is None
    for seed in (0, 1, 12345):
        new = perturb(args, found, seed)
        written = _plain_perturb(args, dims, seed)
        for u, v in zip(new, written):
            if isinstance(u, torch.Tensor):
                assert torch.equal(u.view(torch.uint8), v.view(torch.uint8))
            else:
                assert u == v
    # True asks perturb to decide the plan itself: the same result.
    flags = [p is not None for p in found]
    for u, v in zip(perturb(args, flags, 9), perturb(args, found, 9)):
        assert not isinstance(u, torch.Tensor) or torch.equal(u, v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("tri", [torch.triu, torch.tril])
def test_the_scaling_keeps_the_triangle_exactly_and_moves_every_value(
    dtype: torch.dtype, tri: Any
) -> None:
    n = 64
    x = tri(torch.rand(n, n, generator=_gen(6), dtype=torch.float64) + 0.1).to(dtype)
    plan = plan_for(x)
    assert plan == Plan(None, scale="triangular", nudge=False)
    (y,) = perturb([x], [plan], 21)
    assert y.dtype == dtype and y.shape == x.shape and torch.equal(y, tri(y))
    nonzero = x != 0
    moved = (y.double() - x.double()).abs() / x.double().abs()
    least = 0.05 if torch.finfo(dtype).bits == 16 else 0.06  # 1 - (1 - s)^2, less a rounding
    assert float(moved[nonzero].min()) >= least and float(moved[nonzero].max()) < 0.15
    # The same bits as the stated formula: each row and column factor drawn from the call's
    # generator, their product rounded once in the dtype, then the product with the value.
    gen = _gen(21)
    r = scale_factors(n, dtype, gen)
    c = scale_factors(n, dtype, gen)
    assert torch.equal(y, x * (r[:, None] * c[None, :]))
    # Deterministic given the seed; another seed gives other factors.
    assert torch.equal(perturb([x], [plan], 21)[0], y)
    assert not torch.equal(perturb([x], [plan], 22)[0], y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_scale_factors_lie_in_their_range_and_are_exact_in_their_dtype(dtype: torch.dtype) -> None:
    s = 2.0**-5
    f = scale_factors(4096, dtype, _gen(8))
    wide = f.double()
    assert bool((wide <= 1 - s).all()) and bool((wide > 1 - 2 * s).all())
    assert torch.equal(wide.to(dtype), f) and len(wide.unique()) > 1
    gen = _gen(9)
    one = torch.stack([uniform_factor(dtype, gen) for _ in range(2000)]).double()
    assert bool((one <= 1 - s).all()) and bool((one > 0.5).all())
    assert torch.equal(one.to(dtype).double(), one)
    assert len(one.unique()) >= (100 if dtype is torch.bfloat16 else 500)


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
    gather = structure_module._gather

    def counted(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        read.append(flat.numel())
        return gather(x, flat)

    monkeypatch.setattr(structure_module, "_gather", counted)
    x = torch.rand(3, 700, 700, generator=_gen(11)).triu()
    assert plan_for(x) == Plan(0, scale="triangular", nudge=False)
    bound = 2 * structure_module.SAMPLED_PAIRS
    bound += 3 * structure_module.SAMPLED_LINES * structure_module.SAMPLED_LINE_POINTS
    assert read == [read[0]] and read[0] <= bound


def test_rows_come_back_in_another_order_of_their_own() -> None:
    """With the rows alone reordered, a forward that treats each row on its own (a Linear
    layer) could answer every timed call from a cache of its rows, keyed on a few of their
    values: the last dimension is rolled too, so no row comes back as it was (each is a roll
    of one of the originals)."""
    x = torch.randn(256, 512, generator=_gen(18))
    plan = plan_for(x)
    assert plan == Plan(0, columns=True)
    originals = {r.numpy().tobytes() for r in x}
    multisets = {r.sort().values.numpy().tobytes() for r in x}
    for seed in range(5):
        (y,) = perturb([x], [plan], seed)
        same = sum(r.numpy().tobytes() in originals for r in y)
        assert same <= 1  # the nudged row aside, none
        moved = sum(r.sort().values.numpy().tobytes() in multisets for r in y)
        assert moved >= 255


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_symmetric_band_keeps_its_band_and_nothing_overflows(dtype: torch.dtype) -> None:
    """A symmetric tridiagonal matrix is read as symmetric only (the band is too thin for the
    sampled pairs to call it triangular): its change keeps every zero, so a kernel that reads
    only the band is still right; and factors below one keep the largest values finite."""
    n = 512
    g = _gen(30)
    d, e = torch.rand(n, generator=g) + 1, torch.rand(n - 1, generator=g)
    band = (torch.diag(d) + torch.diag(e, 1) + torch.diag(e, -1)).to(dtype)
    band *= torch.finfo(dtype).max / 2.5  # near the top of the range
    assert plan_for(band) == Plan(None, scale="symmetric", nudge=False)
    for seed in range(4):
        (y,) = perturb([band], [plan_for(band)], seed)
        assert torch.equal(y, y.T) and torch.equal(y != 0, band != 0)
        assert bool(torch.isfinite(y).all()) and not torch.equal(y, band)
    vector = torch.linspace(-1, 1, 1000).to(dtype) * torch.finfo(dtype).max
    (v,) = perturb([vector], [plan_for(vector)], 3)
    assert plan_for(vector).scale == "uniform" and bool(torch.isfinite(v).all())


def test_a_transposed_or_channels_last_input_is_changed_and_keeps_its_layout() -> None:
    """A dense input in another layout gets the change its values would get contiguous, bit
    for bit, and comes back in its own layout; a slice with gaps or an expanded view does not
    count as continuous (copied as it is)."""
    g = _gen(31)
    for x in (
        torch.randn(96, 64, generator=g).t(),
        torch.randn(4, 8, 5, 6, generator=g).to(memory_format=torch.channels_last),
    ):
        assert not x.is_contiguous() and continuous(x)
        plan = plans([x])
        assert plan == plans([x.contiguous()]) and plan[0] is not None
        (y,) = perturb([x], plan, 12)
        (z,) = perturb([x.contiguous()], plan, 12)
        assert y.stride() == x.stride() and torch.equal(y, z) and not torch.equal(y, x)
    assert not continuous(torch.randn(8, 64, generator=g)[:, ::2])
    assert not continuous(torch.randn(64, generator=g).expand(8, 64))
