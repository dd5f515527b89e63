"""The timed loop's input perturbation and the supervisor's timer consistency rule."""

from __future__ import annotations

import os

import torch

from kerneljudge.timing.stage import Batch
from kerneljudge.timing.timer_rule import TimerCheck, timer_check
from kerneljudge.worker.measure import continuous, perturb, time_calls


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
    # rolled along dim 0 (6 rows) and nudged: same values but one, different content
    assert not torch.equal(x, args[0])
    assert torch.allclose(x.flatten().sort().values, args[0].flatten().sort().values, atol=1e-6)
    # rows along later dims stay rows: every perturbed row is an original row (but one element)
    originals = {tuple(r.tolist()) for r in args[0]}
    assert sum(tuple(r.tolist()) in originals for r in x) >= 5
    # a tensor with a single row is rolled along its first longer dimension
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
    assert not continuous(torch.randn(8, 8).t())  # not contiguous: left alone


def test_fp8_inputs_keep_their_classification_and_roll_as_bytes() -> None:
    x = torch.randn(6, 5)
    # isfinite has no kernel for e4m3fn: such inputs are left alone, as they always were.
    assert not continuous(x.to(torch.float8_e4m3fn))
    e5m2 = x.to(torch.float8_e5m2)
    assert continuous(e5m2)
    (rolled,) = perturb([e5m2], [True], seed=11)
    assert rolled.dtype == torch.float8_e5m2 and rolled.shape == e5m2.shape
    shifts = [
        s
        for s in range(1, 6)
        if torch.equal(torch.roll(e5m2.view(torch.uint8), s, 0), rolled.view(torch.uint8))
    ]
    assert len(shifts) == 1  # the same bytes, rolled (1-byte formats are not nudged)


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
