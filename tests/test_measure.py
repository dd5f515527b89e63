"""The timed loop's input perturbation and the supervisor's timer consistency rule."""

from __future__ import annotations

import os

import pytest
import torch

from kerneljudge.timing.stage import Batch
from kerneljudge.timing.timer_rule import TimerCheck, timer_check
from kerneljudge.worker.measure import (
    LOOP_DEVICE_SHARE,
    PIPELINE_DEPTH,
    continuous,
    perturb,
    pipeline_depth,
    time_calls,
)


def _inputs() -> list[object]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.5).float()
    ids = torch.randint(0, 9, (4,), generator=g)
    row = torch.randn(1, 7, generator=g)
    return [x, mask, ids, row, 3]


def test_perturb_is_exact_given_the_seed_and_changes_every_continuous_input() -> None:
    args = _inputs()
    which = [continuous(a) for a in args]
    assert which == [True, False, False, True, False]
    a = perturb(args, which, 12345)
    b = perturb(args, which, 12345)
    for u, v in zip(a, b):
        if isinstance(u, torch.Tensor):
            assert torch.equal(u.view(torch.uint8), v.view(torch.uint8))
    x, mask, ids, row, k = a
    # rows along dim 0 (6 of them) and columns reordered and nudged: same values but one
    assert not torch.equal(x, args[0])
    assert torch.allclose(x.flatten().sort().values, args[0].flatten().sort().values, atol=1e-6)
    # every perturbed row holds an original row's values (but one element), in another order
    originals = {tuple(r.sort().values.tolist()) for r in args[0]}
    assert sum(tuple(r.sort().values.tolist()) in originals for r in x) >= 5
    assert not any(torch.equal(r, o) for r in x for o in args[0])
    # a tensor with a single row is reordered along its first longer dimension
    assert not torch.equal(row, args[3])
    # masks, ids and non-tensors are copied unchanged, never aliased
    assert torch.equal(mask, args[1]) and mask.data_ptr() != args[1].data_ptr()
    assert torch.equal(ids, args[2]) and k == 3
    # another seed gives other inputs
    c = perturb(args, which, 54321)
    assert not torch.equal(c[0], x)


def test_perturb_leaves_the_set_untouched() -> None:
    args = _inputs()
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    perturb(args, [continuous(a) for a in args], 7)
    assert all(torch.equal(a, b) for a, b in zip(args, before) if isinstance(a, torch.Tensor))


def test_timed_calls_see_new_content() -> None:
    # 255 shifts x 16384 elements: a repeat among 21 calls has odds of about 1 in 20,000
    args = [torch.randn(256, 64, generator=torch.Generator().manual_seed(1))]
    seen: list[torch.Tensor] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return x * 2

    # without a stamp link (outside a verdict): seeds from this process, nothing kept; the
    # kept outputs and their seeds under a link are tested in test_timer_audit.py
    times, kept, wall = time_calls(
        fn, [args], n=20, warmup=1, device=torch.device("cpu"), flush=None, poison_bytes=0
    )
    assert len(times) == 20 and wall > 0
    assert len({tuple(s.flatten().tolist()) for s in seen}) == len(seen)  # all distinct
    assert kept == {}


def test_freed_memory_is_poisoned_after_the_inputs_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making a call's inputs frees blocks that held them (a transposed input is built
    contiguous, then copied into its own layout): the poison comes after, so an output the
    call leaves unwritten cannot read this call's inputs from a reused block."""
    from kerneljudge.worker import measure

    events: list[str] = []
    made, poisoned = measure.perturb, measure.poison
    monkeypatch.setattr(
        measure, "perturb", lambda *a, **k: events.append("inputs") or made(*a, **k)
    )
    monkeypatch.setattr(
        measure, "poison", lambda *a, **k: events.append("poison") or poisoned(*a, **k)
    )

    def fn(x: torch.Tensor) -> torch.Tensor:
        events.append("call")
        return x * 2

    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(2)).t()
    time_calls(fn, [[x]], n=3, warmup=1, device=torch.device("cpu"), flush=None, poison_bytes=4096)
    assert events == ["inputs", "poison", "call"] * 4


def test_old_wall_clock_sums_no_longer_decide() -> None:
    # batches without stamped windows (the sum rule's inputs only): no rule fires
    seen = {
        "eager": [Batch(10, 1, 30.0, (2.0,) * 10) for _ in range(6)],
        "candidate": [Batch(10, 1, 30.0, (0.05,) * 10) for _ in range(6)],
    }
    assert timer_check(seen) == TimerCheck("ok")


def test_the_nudge_never_makes_a_nan() -> None:
    from kerneljudge.worker.measure import nudge

    inf = torch.full((8,), float("inf"))
    nudge([inf], [True], torch.Generator().manual_seed(0))
    assert torch.isinf(inf).all()
    fp8 = torch.full((64,), 448.0).to(torch.float8_e4m3fn)  # the largest finite e4m3 value
    for seed in range(20):
        nudge([fp8], [True], torch.Generator().manual_seed(seed))
    assert torch.isfinite(fp8.float()).all()
    x = torch.ones(16)
    nudge([x], [True], torch.Generator().manual_seed(0))
    assert (x != 1).sum() == 1 and torch.isfinite(x).all()


def test_without_roll_only_the_nudge_changes_the_inputs() -> None:
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    (y,) = perturb([x], [True], 99, roll=False)
    assert (y != x).sum() == 1


def test_continuous_reads_past_an_integral_first_block() -> None:
    from kerneljudge.worker.measure import CONTINUOUS_BLOCK

    mask = torch.zeros(3 * CONTINUOUS_BLOCK)
    mask[::7] = 1.0
    assert not continuous(mask)  # a 0/1 mask, in floats
    late = mask.clone()
    late[-1] = 0.5  # the only fraction, in the last block
    assert continuous(late)
    late[-1] = float("nan")  # non-finite values decide nothing
    assert not continuous(late)
    assert continuous(torch.randn(5, 7, dtype=torch.bfloat16))
    assert not continuous(torch.arange(10))  # integer dtype
    assert continuous(torch.randn(8, 8).t())  # a transpose: dense, read in storage order
    assert not continuous(torch.randn(8, 8)[:, ::2])  # a slice with gaps: left alone


def test_fp8_inputs_keep_their_classification_and_roll_as_bytes() -> None:
    x = torch.randn(6, 5)
    # isfinite has no kernel for e4m3fn: such inputs are left alone, as they always were.
    assert not continuous(x.to(torch.float8_e4m3fn))
    e5m2 = x.to(torch.float8_e5m2)
    assert continuous(e5m2)
    (moved,) = perturb([e5m2], [True], seed=11)
    assert moved.dtype == torch.float8_e5m2 and moved.shape == e5m2.shape
    gen = torch.Generator().manual_seed(11)
    order = torch.randperm(e5m2.shape[0], generator=gen)
    order = order.roll(1) if torch.equal(order, torch.arange(len(order))) else order
    shift = int(torch.randint(1, e5m2.shape[1], (1,), generator=gen))
    # the same bytes, rows reordered and columns rolled (1-byte formats are not nudged)
    want = e5m2.view(torch.uint8)[order].roll(shift, -1)
    assert torch.equal(want, moved.view(torch.uint8))


def test_tqdm_monitor_thread_is_not_a_lingering_candidate_thread() -> None:
    """tqdm starts one monitor thread per process for its bars (torch.compile's autotuning
    does, inside a call): it is not counted; any other new thread is."""
    import threading

    from tqdm import tqdm

    from kerneljudge.worker.sandbox import thread_idents

    if tqdm.monitor is not None:  # a monitor from an earlier test: start a new one here
        tqdm.monitor.exit()
        tqdm.monitor = None
    before = thread_idents()
    bar = tqdm(total=2, mininterval=0.01, disable=False, file=open(os.devnull, "w"))
    bar.update(1)
    try:
        assert any(t.name == "tqdm_monitor" for t in threading.enumerate())
        assert thread_idents() - before == set()
        stop = threading.Event()
        other = threading.Thread(target=stop.wait, name="other")
        other.start()
        try:
            assert thread_idents() - before == {other.ident}
        finally:
            stop.set()
            other.join()
    finally:
        bar.close()


def test_tqdm_monitor_thread_is_not_lingering_after_a_call() -> None:
    """The same for the check after an untimed call (``lingering_threads``)."""
    from tqdm import tqdm

    from kerneljudge.worker.sandbox import lingering_threads, thread_idents

    if tqdm.monitor is not None:  # a monitor from an earlier test: start a new one here
        tqdm.monitor.exit()
        tqdm.monitor = None
    before = thread_idents()
    with open(os.devnull, "w") as sink:
        bar = tqdm(total=2, mininterval=0.01, file=sink)
        bar.update(1)
        try:
            assert lingering_threads(before, grace_s=0.05) == []
        finally:
            bar.close()


def test_perturb_into_an_earlier_result_gives_the_same_bits_as_a_row_order() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 1, 5, generator=g)
    strided = torch.randn(5, 8, generator=g).t()  # not contiguous: comes back transposed
    half = torch.randn(9, 3, generator=g).half()
    ids = torch.randint(0, 9, (4, 2), generator=g)
    args = [x, strided, half, ids, 2.5]
    which = [True, True, True, False, False]
    fresh = perturb(args, which, 77)
    spare = perturb(args, which, 5)  # another call's inputs, to be written over
    pointers = [t.data_ptr() for t in spare if isinstance(t, torch.Tensor)]
    again = perturb(args, which, 77, into=spare)
    assert [t.data_ptr() for t in again if isinstance(t, torch.Tensor)] == pointers
    for u, v in zip(fresh, again):
        if isinstance(u, torch.Tensor):
            assert u.stride() == v.stride() and u.shape == v.shape
            assert torch.equal(u.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8))
    assert again[4] == 2.5
    # The same as the rows along the first dimension in a random order (not their own), the
    # columns rolled, then the lowest bit of one element flipped, with the same draws.
    gen = torch.Generator().manual_seed(77)
    for t, got in zip(args[:3], fresh[:3]):
        order = torch.randperm(t.shape[0], generator=gen)
        assert not torch.equal(order, torch.arange(len(order)))  # (else rolled by one)
        shift = int(torch.randint(1, t.shape[-1], (1,), generator=gen))
        j = int(torch.randint(0, t.numel(), (1,), generator=gen))
        bits = t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)
        want = bits.index_select(0, order).roll(shift, -1).contiguous().view(-1)
        want[j] ^= 1
        assert torch.equal(got.contiguous().view(bits.dtype).view(-1), want)
    # A spare of another shape or dtype is not written over.
    other = perturb([x.double()], [True], 77, into=[x.clone()])
    assert other[0].dtype == torch.float64


def test_timed_calls_get_aliases_whose_metadata_they_cannot_change_for_the_next_call() -> None:
    seen: list[torch.Tensor] = []

    class Shrinks(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.clone())
            y = x.sum(0)
            x.resize_(1)  # the alias is changed, not the loop's buffer
            return y

    sets = [[torch.randn(64, 8, generator=torch.Generator().manual_seed(2))]]
    times, _, _ = time_calls(
        Shrinks(), sets, n=4, warmup=1, device=torch.device("cpu"), flush=None, poison_bytes=0
    )
    assert len(times) == 4 and all(t.shape == (64, 8) for t in seen)
    assert len({bytes(t.numpy().tobytes()) for t in seen}) == len(seen)


def test_float64_oracle_writes_its_converted_inputs_over_the_spare_it_was_given() -> None:
    from kerneljudge.worker.forward import float64_oracle, to_double

    class Sum(torch.nn.Module):
        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return x.sum(-1) + ids

    g = torch.Generator().manual_seed(4)
    x, ids = torch.randn(32, 16, generator=g), torch.randint(0, 5, (32,), generator=g)
    spare: list[object] = []
    cpu = torch.device("cpu")
    first = float64_oracle(Sum(), [x, ids], cpu, spare=spare)
    assert isinstance(spare[0], torch.Tensor) and spare[0].dtype == torch.float64
    assert spare[1] is None  # not converted: not kept
    pointer = spare[0].data_ptr()
    y = torch.randn(32, 16, generator=g)
    second = float64_oracle(Sum(), [y, ids], cpu, spare=spare)
    assert spare[0].data_ptr() == pointer
    assert torch.equal(second, y.double().sum(-1) + ids)
    assert torch.equal(first, x.double().sum(-1) + ids)
    # Another shape, a non-contiguous value or a float64 one is not written over.
    assert to_double([x.t()], into=[spare[0]])[0].data_ptr() != pointer
    d = x.double()
    assert to_double([d], into=[spare[0]])[0] is d


def test_call_copies_write_over_the_spare_copies_a_worker_keeps() -> None:
    from kerneljudge.worker.calls import call_copies

    g = torch.Generator().manual_seed(8)
    x, strided = torch.randn(16, 4, generator=g), torch.randn(4, 16, generator=g).t()
    spares: dict[str, list[object]] = {}
    first = call_copies([x, strided, 3], spares)
    assert spares["args"] is first and first[2] == 3
    assert all(torch.equal(u, v) and u.data_ptr() != v.data_ptr() for u, v in zip(first, [x]))
    pointer = first[0].data_ptr()
    y = torch.randn(16, 4, generator=g)
    second = call_copies([y, strided, 3], spares)
    assert second[0].data_ptr() == pointer and torch.equal(second[0], y)
    assert torch.equal(second[1], strided) and second[1].data_ptr() != strided.data_ptr()
    # A call that writes to its copy leaves the inputs as they were; without spares, new copies.
    second[0].zero_()
    assert not torch.equal(y, second[0])
    assert call_copies([y])[0].data_ptr() not in (pointer, y.data_ptr())
    # A spare of another shape is not written over.
    assert call_copies([torch.randn(3)], spares)[0].shape == (3,)


def test_a_spare_whose_storage_a_call_resized_is_not_written_over() -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(6))
    spare = perturb([x], [True], 1)
    spare[0].detach().untyped_storage().resize_(0)  # what a call can do through its alias
    again = perturb([x], [True], 2, into=spare)
    assert again[0].untyped_storage().nbytes() == x.numel() * 4
    got, want = again[0].reshape(-1).sort().values, x.reshape(-1).sort().values
    assert torch.allclose(got, want, atol=1e-5)


def test_a_rows_order_is_never_their_own_and_past_the_bound_they_are_rolled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two rows are always swapped (a random order may draw the identity: it is shifted by
    one), and two columns (rolled by one); a first dimension longer than
    ``PERMUTED_ROWS_MAX`` is rolled instead."""
    from kerneljudge.worker import perturbation

    x = torch.tensor([[1.5, 2.5], [3.5, 4.5]])
    for seed in range(20):
        (y,) = perturb([x], [True], seed)
        swapped = x[[1, 0]][:, [1, 0]]
        assert (y != swapped).sum() <= 1 and torch.allclose(y, swapped, rtol=1e-6, atol=0)
    monkeypatch.setattr(perturbation, "PERMUTED_ROWS_MAX", 4)
    long = torch.tensor([3.5, 1.5, 8.5, 2.5, 6.5, 4.5, 7.5, 5.5])  # 8 rows of one element: rolled
    (rolled,) = perturb([long], [True], 3)
    shifts = [s for s in range(1, 8) if (torch.roll(long, s) != rolled).sum() <= 1]
    assert len(shifts) == 1


def test_a_gpu_loop_holds_no_committed_outputs_where_its_buffers_would_pass_its_share() -> None:
    """The 6 GiB input and output of KernelBench's 19_ReLU on an 80 GiB card: the loops'
    timed calls peaked at 43 and 49 GiB with two copies held, and one ran out of memory. The
    depth is read from sizes alone, alike on both sides."""
    gib = 2**30
    card = 80 * gib
    assert pipeline_depth(6 * gib, 6 * gib, card) == 0
    assert pipeline_depth(gib, gib, card) == PIPELINE_DEPTH
    share = int(LOOP_DEVICE_SHARE * card)
    at_share = share // (4 + PIPELINE_DEPTH)  # 2 inputs and 2 + depth outputs, all this size
    assert pipeline_depth(at_share, at_share, card) == PIPELINE_DEPTH
    assert pipeline_depth(at_share + 3, at_share, card) == 0  # 6 bytes past it
    assert pipeline_depth(at_share, at_share, card, static_bytes=6) == 0  # a graph's copies
    assert pipeline_depth(0, 0, 0) == PIPELINE_DEPTH  # nothing on the device: nothing to hold


def test_inputs_that_are_no_kept_set_are_not_held_while_timed() -> None:
    """A worker's current inputs that are not one of its kept input sets (a trial run again
    through the host with ``keep`` false) are let go when a ``time`` request starts: the
    kept sets are what the loop times, and later requests that read the current inputs get
    the latest set."""
    import weakref

    from kerneljudge.worker.runtime import Worker

    worker = Worker("reference", torch.device("cpu"))
    worker.model = torch.nn.Tanh()
    kept, other = torch.randn(4, 8), torch.randn(4, 8)
    worker.sets, worker.nudgeable, worker.inputs = [[kept]], [[None]], [other]
    gone = weakref.ref(other)
    del other
    reply = worker.op_time({"n": 3, "warmup": 1})
    assert len(reply["times_ms"]) == 3
    assert worker.inputs is worker.sets[-1] and gone() is None
