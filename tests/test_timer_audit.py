"""The timer audit: kernel-stamped call windows, the rescale and gap rules, output digests, and
commit-then-choose of audited calls (kerneljudge.timing.timer_rule, kerneljudge.worker.stamps)."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from kerneljudge.timing.sampling import KeptCall
from kerneljudge.timing.sampling import observed as _observed
from kerneljudge.timing.stage import _audit_timed_calls
from kerneljudge.timing.timer_rule import Batch, median_bounds, timer_check
from kerneljudge.verdict import Status
from kerneljudge.worker import measure
from kerneljudge.worker.digest import digest
from kerneljudge.worker.protocol import Channel
from kerneljudge.worker.stamps import (
    KIND_SHA256,
    KIND_TREE,
    BatchObservation,
    CallRecord,
    Observer,
    output_digest,
    socket_pair,
)

ADV = Path(__file__).resolve().parent / "adversarial"


# ------------------------------------------------------------------ the rules, synthetic samples
def _batches(
    rng: np.random.Generator,
    call_ms: float,
    *,
    scale: float = 1.0,
    moved_ms: float = 0.0,
    noise: bool = True,
    rounds: int = 8,
    n: int = 10,
    fixed_ms: float = 0.004,
    gap_ms: float = 0.3,
    preempted_ms: float = 0.0,
    cpu_counted: bool = False,
) -> list[Batch]:
    """Batches of a loop whose calls take ``call_ms`` (plus heavy-tailed preemption that both
    clocks see), ``fixed_ms`` between a stamp and a clock read (plus rare stalls there), a
    clock slowed by ``scale`` and ``moved_ms`` of each call's work done between calls;
    ``preempted_ms``: time off the CPU added to every gap; ``cpu_counted``: the batches carry
    the kernel's count of the CPU time between calls (their work, not the preemption) and a
    trusted worker's own count (the same, used only from the reference's batches)."""
    out = []
    for _ in range(rounds):
        true = np.full(n, call_ms)
        fixed = np.full(n, fixed_ms)
        gaps = np.full(n, gap_ms + moved_ms + preempted_ms)
        if noise:
            true = true * rng.lognormal(0, 0.5, n) + rng.exponential(call_ms, n) * (
                rng.random(n) < 0.4
            )  # 40% of calls preempted, for up to several call times
            fixed = fixed + rng.exponential(0.5, n) * (rng.random(n) < 0.2)  # 20% stalled
            gaps = gaps * rng.lognormal(0, 0.7, n) + rng.exponential(2, n) * (rng.random(n) < 0.3)
        windows = true + fixed
        reported = true / scale
        out.append(
            Batch(n, 1, float(windows.sum() + gaps.sum()), tuple(reported), tuple(windows),
                  tuple(gaps[:-1]),
                  (call_ms * (n + 1) + (gap_ms + moved_ms) * n) if cpu_counted else None, 1,
                  (gap_ms,) * n if cpu_counted else (),
                  (call_ms + fixed_ms,) if cpu_counted else (),
                  (0.1, 0.1))
        )  # fmt: skip
    return out


def test_honest_loops_under_heavy_noise_are_never_rejected() -> None:
    rng = np.random.default_rng(0)
    statuses = []
    for _ in range(400):
        cand_ms = float(rng.choice([0.02, 0.3, 3.0, 40.0]))
        seen = {
            "eager": _batches(rng, float(rng.choice([0.05, 3.0])), rounds=int(rng.integers(1, 9))),
            "candidate": _batches(rng, cand_ms, rounds=int(rng.integers(1, 9))),
        }
        statuses.append(timer_check(seen).status)
    assert "rejected" not in statuses
    assert statuses.count("ok") > 0.9 * len(statuses)


@pytest.mark.parametrize("call_ms", [0.3, 1.0, 3.0, 30.0])
def test_a_clock_slowed_1_2x_is_caught_from_a_few_hundred_microseconds(call_ms: float) -> None:
    rng = np.random.default_rng(1)
    seen = {
        "eager": _batches(rng, 2.0, noise=False),
        "candidate": _batches(rng, call_ms, scale=1.2, noise=False),
    }
    found = timer_check(seen)
    assert found.status == "rejected" and "clock running slow" in found.reason


@pytest.mark.parametrize("call_ms", [1.0, 3.0, 30.0])
def test_a_clock_slowed_1_2x_is_caught_under_load(call_ms: float) -> None:
    rng = np.random.default_rng(2)
    seen = {
        "eager": _batches(rng, 2.0, rounds=8),
        "candidate": _batches(rng, call_ms, scale=1.2, rounds=8),
    }
    assert timer_check(seen).status == "rejected"


def test_work_moved_between_calls_is_caught() -> None:
    rng = np.random.default_rng(3)
    seen = {
        "eager": _batches(rng, 3.0, noise=False),
        "candidate": _batches(rng, 0.3, moved_ms=2.7, noise=False),
    }
    found = timer_check(seen)
    assert found.status == "rejected" and "outside the timed windows" in found.reason


def test_work_moved_between_calls_is_caught_by_the_cpu_count_too() -> None:
    rng = np.random.default_rng(3)
    seen = {
        "eager": _batches(rng, 3.0, noise=False, cpu_counted=True),
        "candidate": _batches(rng, 0.3, moved_ms=2.7, noise=False, cpu_counted=True),
    }
    found = timer_check(seen)
    assert found.status == "rejected" and "CPU time between timed calls" in found.reason
    # the same under heavy preemption of both sides' gaps: the CPU count does not move
    seen = {
        "eager": _batches(rng, 3.0, preempted_ms=9.0, cpu_counted=True),
        "candidate": _batches(rng, 0.3, moved_ms=2.7, preempted_ms=9.0, cpu_counted=True),
    }
    found = timer_check(seen)
    assert found.status == "rejected" and "CPU time between timed calls" in found.reason


def test_gaps_long_only_off_the_cpu_are_inconclusive_not_rejected() -> None:
    """Every gap of the candidate 8 ms longer on the wall clock (the host preempted it there)
    while the kernel counted only the loop's own work in them: not a timer cheat."""
    rng = np.random.default_rng(4)
    seen = {
        "eager": _batches(rng, 0.25, noise=False, gap_ms=0.45, cpu_counted=True),
        "candidate": _batches(rng, 2.0, noise=False, gap_ms=0.6, preempted_ms=8.0,
                              cpu_counted=True),
    }  # fmt: skip
    found = timer_check(seen)
    assert found.status == "inconclusive" and "off the CPU" in found.reason
    # without the count the same gaps are rejected
    seen["candidate"] = _batches(rng, 2.0, noise=False, gap_ms=0.6, preempted_ms=8.0)
    assert timer_check(seen).status == "rejected"


def test_a_borderline_difference_is_inconclusive_not_rejected() -> None:
    eager = [Batch(4, 1, 0.0, (1.0,) * 4, (1.01,) * 4, (0.2,) * 4)]
    # the candidate's e: half far out, half like the reference's: the point estimate is past
    # the bound, the interval is not
    cand = [Batch(6, 1, 0.0, (1.0,) * 6, (1.01, 1.01, 1.01, 1.5, 1.5, 1.5), (0.2,) * 6)]
    found = timer_check({"eager": eager, "candidate": cand})
    assert found.status == "inconclusive"


def _stalled_reference(stalls: int, calls: int = 16) -> list[Batch]:
    """A reference of ``calls`` 5 ms calls in batches of 4, ``e`` alternating 0.02 and 0.05 ms,
    of which ``stalls`` calls were preempted for 6 ms between a stamp and a clock read."""
    e = np.array([0.02, 0.05] * (calls // 2))
    e[np.linspace(0, calls - 1, stalls).astype(int)] += 6.0
    return [
        Batch(4, 1, 0.0, (5.0,) * 4, tuple(5.0 + e[i : i + 4]), (0.3,) * 3)
        for i in range(0, calls, 4)
    ]


def test_a_clock_slowed_100x_is_not_passed_by_a_few_stalled_reference_calls() -> None:
    """Three stalls among the reference's 16 calls lift the upper bound of its median ``e`` to
    6 ms: a 100x slowed clock in 5 ms calls would pass that rule. It is measured again instead,
    and against the reference's calls of both timings it is rejected."""
    slowed = [Batch(100, 1, 0.0, (0.05,) * 100, (5.03,) * 100, (0.3,) * 99) for _ in range(4)]
    first = timer_check({"eager": _stalled_reference(3), "candidate": slowed})
    assert first.status == "inconclusive" and "stalled" in first.reason, first
    earlier = {"eager": _stalled_reference(3)}
    found = timer_check({"eager": _stalled_reference(3), "candidate": slowed}, earlier=earlier)
    assert found.status == "rejected" and "clock running slow" in found.reason, found
    honest = [Batch(100, 1, 0.0, (5.0,) * 100, (5.04,) * 100, (0.3,) * 99) for _ in range(4)]
    assert timer_check({"eager": _stalled_reference(3), "candidate": honest}).status == "ok"
    again = timer_check({"eager": _stalled_reference(3), "candidate": honest}, earlier=earlier)
    assert again.status == "ok", again


def test_an_earlier_timings_reference_calls_decide_nothing_where_the_new_ones_did_not_stall() -> (
    None
):
    """The first timing's reference batches are read only by the rescale rule, and only where
    the new reference calls stalled: quiet earlier calls (an ``e`` and a gap of a hundredth of
    the new ones') change no answer about a candidate measured beside a slower reference loop."""
    loop = [Batch(4, 1, 0.0, (5.0,) * 4, (5.4,) * 4, (1.0,) * 3) for _ in range(4)]
    quiet = [Batch(4, 1, 0.0, (5.0,) * 4, (5.004,) * 4, (0.01,) * 3) for _ in range(4)]
    honest = [Batch(100, 1, 0.0, (5.0,) * 100, (5.4,) * 100, (1.0,) * 99) for _ in range(4)]
    assert timer_check({"eager": loop, "candidate": honest}).status == "ok"
    found = timer_check({"eager": loop, "candidate": honest}, earlier={"eager": quiet})
    assert found.status == "ok", found
    # the same candidate against the quiet loop is refused on both rules: the earlier calls
    # would have decided had they been read
    assert timer_check({"eager": quiet, "candidate": honest}).status != "ok"


def test_median_bounds_hold_the_median() -> None:
    lo, med, hi = median_bounds(list(range(101)))
    assert lo < med == 50 < hi
    assert median_bounds([3.0]) == (3.0, 3.0, 3.0)


# ------------------------------------------------------------------ digests
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]


@pytest.mark.parametrize("kind", [KIND_SHA256, KIND_TREE])
@pytest.mark.parametrize("dtype", DTYPES)
def test_any_single_bit_change_changes_the_digest(kind: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(7, 5, generator=gen) * 50).to(dtype)  # 35 elements: not whole words
    if dtype is torch.bool:
        x = torch.rand(7, 5, generator=gen) > 0.5
    base = output_digest(x, kind)
    assert output_digest(x.clone(), kind) == base
    raw = x.reshape(-1).view(torch.uint8)
    for byte in range(raw.numel()):
        for bit in range(8):
            y = raw.clone()
            y[byte] ^= 1 << bit
            changed = y.view(dtype).reshape(x.shape)
            assert output_digest(changed, kind) != base, (byte, bit)
    # the tree digest changes in both lanes
    if kind == KIND_TREE:
        y = raw.clone()
        y[0] ^= 1
        a, b = digest(y.view(dtype))
        assert a != digest(x)[0] and b != digest(x)[1]


def test_digest_covers_length_and_layout() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert output_digest(x.t(), KIND_TREE) == output_digest(x.t().contiguous(), KIND_TREE)
    assert output_digest(x, KIND_TREE) != output_digest(x.t().contiguous(), KIND_TREE)
    assert output_digest(torch.zeros(4), KIND_TREE) != output_digest(torch.zeros(5), KIND_TREE)
    assert output_digest(torch.zeros(0), KIND_SHA256) == output_digest(
        torch.zeros(0, dtype=torch.int8), KIND_SHA256
    )


# ------------------------------------------------------------------ the loop and the observer
def _observe(fn, sets, n: int, warmup: int, keep, threads_before=None, kept_before=None,  # type: ignore[no-untyped-def]
             reject_threads=True, recycle=None, device="cpu", flush=None, poison_bytes=0,
             timeout_s=30):  # fmt: skip
    """``time_calls`` of ``fn`` observed through a stamp socket (tests/gpu uses it too):
    ``(its result, the observer)``, ``keep`` the audit's choice per timed call."""
    sup, wrk = socket_pair()
    box: dict = {}

    def request(op, timeout_s, **fields):  # type: ignore[no-untyped-def]
        link = fields["link"]
        box["result"] = measure.time_calls(
            fn,
            sets,
            n=fields["n"],
            warmup=fields["warmup"],
            device=torch.device(device),
            flush=flush,
            poison_bytes=poison_bytes,
            link=measure.Link(wrk, link["batch"]),
            seed=link["seed"],
            threads_before=threads_before,
            reject_threads=reject_threads,
            kept_before=kept_before,
            recycle=recycle,
        )
        return {"times_ms": box["result"][0]}

    try:
        reply, obs = Observer(sup).run(request, timeout_s, n=n, warmup=warmup, keep=keep)
    finally:
        sup.close()
        wrk.close()
    return box["result"], obs


def test_a_slot_kept_anew_drops_the_earlier_batchs_outputs_of_that_slot() -> None:
    """An earlier batch's kept outputs of a slot this batch keeps again are given up when the new
    ones are kept (on a GPU their memory is then free for the new ones); other slots stay."""
    sets = [[torch.randn(16, 8)]]
    old = {0: [torch.zeros(3)], 1: [torch.ones(3)]}
    (_, kept, _), obs = _observe(torch.tanh, sets, 6, 1, lambda i: 0 if i == 3 else -1,
                                 kept_before=old)  # fmt: skip
    assert set(kept) == {0} and set(old) == {1}
    args = measure.perturb(sets[0], [True], obs.calls[1 + 3].seed)
    assert torch.equal(kept[0][0], torch.tanh(args[0]))


def test_a_wait_for_the_audit_slot_is_not_the_workers_time_between_calls() -> None:
    """A GPU loop that holds no committed outputs waits for each call's slot after its commit;
    the time between calls runs from the latest of the commit and both answers (ns stamps)."""
    obs = BatchObservation(n=1, warmup=1)
    obs.calls[0] = CallRecord(1, start_ns=0, end_ns=1_000, commit_ns=1_100, next_seed_ns=1_000)
    obs.calls[0].slot_ns = 5_000  # the slot went out late: the worker waited for it
    obs.calls[1] = CallRecord(2, start_ns=6_000, end_ns=7_000, commit_ns=7_100)
    _, gaps = _observed(obs)
    assert gaps == (pytest.approx((100 + 1_000) / 1e6),)
    obs.calls[0].slot_ns = None  # no slot stamp: from the commit and the seed, as before
    assert _observed(obs)[1] == (pytest.approx((100 + 4_900) / 1e6),)


def test_observed_calls_hold_their_reported_times_and_kept_outputs_bind() -> None:
    sets = [[torch.randn(64, 32)], [torch.randn(64, 32)]]
    (times, kept, _), obs = _observe(lambda x: torch.tanh(x @ x.T), sets, 12, 2, lambda i: i % 3)
    assert obs.complete()
    assert all(rec.commit_ns <= rec.slot_ns for rec in obs.calls.values())  # type: ignore[operator]
    windows, gaps = _observed(obs)
    assert len(windows) == 12 and len(gaps) == 13
    assert all(w >= t for w, t in zip(windows, times))  # the stamps enclose the clock reads
    assert sorted(kept) == [0, 1, 2]
    for slot, outs in kept.items():
        i = max(j for j, rec in obs.calls.items() if rec.slot == slot)
        rec = obs.calls[i]
        assert [output_digest(t, kind) for t, (kind, _) in zip(outs, rec.digests)] == rec.digests
        args = measure.perturb(sets[i % 2], [True], rec.seed)
        assert torch.equal(outs[0], torch.tanh(args[0] @ args[0].T))
    assert len({rec.seed for rec in obs.calls.values()}) == 14  # drawn by the observer


def test_a_thread_alive_at_the_end_mark_fails_the_call_without_grace() -> None:
    from kerneljudge.worker.sandbox import thread_idents

    release = threading.Event()

    def fn(x: torch.Tensor) -> torch.Tensor:
        threading.Thread(target=release.wait, daemon=True).start()
        return x * 2

    try:
        with pytest.raises(measure.ThreadLeftRunning, match="still running when forward"):
            _observe(fn, [[torch.randn(8)]], 3, 0, lambda i: -1, threads_before=thread_idents())
    finally:
        release.set()


def test_the_references_loop_makes_the_same_thread_check_and_lets_it_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both sides' loops look for a thread left running after every call (work outside the
    window that slows the next call: made on one side only, it biased identity speedups of
    microsecond calls); only the candidate's raises."""
    from kerneljudge.worker.sandbox import thread_idents

    release = threading.Event()
    looked: list[int] = []

    def counted() -> set[int]:
        looked.append(1)
        return thread_idents()

    def fn(x: torch.Tensor) -> torch.Tensor:
        threading.Thread(target=release.wait, daemon=True).start()
        return x * 2

    monkeypatch.setattr(measure, "_thread_idents", counted)
    try:
        before = thread_idents()
        (times, _, _), _ = _observe(
            fn, [[torch.randn(8)]], 3, 1, lambda i: -1, threads_before=before, reject_threads=False
        )
        assert len(times) == 3 and len(looked) == 4  # every call, the warm-up's too
    finally:
        release.set()


class _Pipes:
    """The hand-over end of a worker: the descriptors handed to it, by label."""

    reply_limit_bytes = 0

    def __init__(self) -> None:
        self.handed: dict[str, int] = {}

    def hand_over(self, fd: int, token: bytes) -> None:
        self.handed[token.hex()] = os.dup(fd)


class _Revealing(_Pipes):
    """A candidate worker's ``timed_outputs`` answer, as code in its process may rewrite it:
    the slot's outputs written to the pipe handed over for them."""

    def __init__(self, slots: dict) -> None:
        super().__init__()
        self.slots = slots

    def request(self, op: str, timeout_s: float, **fields):  # type: ignore[no-untyped-def]
        assert op == "timed_outputs"
        (slot,) = fields["slots"]
        fd = self.handed.pop(fields["side"])
        try:
            if slot not in self.slots:
                return {"slots": {}, "n_sets": 1}
            Channel(-1, fd).send({"outputs": self.slots[slot]})
        finally:
            os.close(fd)
        return {"slots": {slot: len(self.slots[slot])}, "n_sets": 1}


class _AuditingReference(_Pipes):
    """The reference's side of an audit as the reference worker answers it: the outputs read
    from their pipe, compared (here: always equal) and digested by the kinds committed."""

    @property
    def worker(self) -> _AuditingReference:
        return self

    def run_timed_call(self, *args: object) -> None:
        pass

    def audit(self, outputs, kinds, timeout_s, side=None, **kw):  # type: ignore[no-untyped-def]
        from kerneljudge.check.beside import OutputsLost
        from kerneljudge.verdict import TrialResult

        chan = Channel(self.handed.pop(side["side"]), -1)
        try:
            outputs = chan.recv(timeout_s=10.0).get("outputs")
        finally:
            chan.close()
        if outputs is None:
            raise OutputsLost("it sent no outputs")
        digests = [output_digest(t, k) for t, k in zip(outputs, kinds)]
        return TrialResult(index=0, passed=True, reason=""), digests, len(outputs)


def test_the_reference_worker_digests_outputs_as_the_candidate_committed() -> None:
    """The digests the reference worker computes of outputs shown for an audit (a tree
    digest on its device) are those :func:`output_digest` gives where the call ran."""
    from kerneljudge.worker.kept_trials import KeptTrials

    outputs = [torch.randn(3, 5), torch.arange(7, dtype=torch.int32)]
    for device in (None, torch.device("cpu")):
        for kind in (KIND_SHA256, KIND_TREE):
            got = KeptTrials._digests(outputs, [kind, kind], device)
            assert [tuple(d) for d in got] == [output_digest(t, kind) for t in outputs]
    first = [list(output_digest(outputs[0], KIND_TREE))]
    assert KeptTrials._digests(outputs, [KIND_TREE], None) == first  # fewer kinds, fewer


def test_an_output_revealed_other_than_the_one_committed_is_rejected() -> None:
    from kerneljudge import JudgeConfig

    committed = torch.zeros(16)  # what the call returned (and the worker digested)
    honest = torch.randn(16)  # what it shows once it knows the call is audited
    call = KeptCall(index=3, n_sets=1, seed=7, digests=(output_digest(committed),))
    cfg = JudgeConfig(run_timeout_s=10.0)

    def audited(slots: dict, kept: KeptCall) -> tuple[Status, str]:
        return _audit_timed_calls(
            cfg,
            _Revealing(slots),  # type: ignore[arg-type]
            _AuditingReference(),  # type: ignore[arg-type]
            ["0"],
            1e-3,
            1e-3,
            True,
            {0: kept},
        )

    status, why = audited({0: [honest]}, call)
    assert status is Status.REJECTED and "not those the worker committed to" in why
    status, why = audited({}, call)
    assert status is Status.REJECTED and "did not keep" in why
    # Outputs with no digest committed for them (here: none at all), shown once the call is
    # known to be audited: their number is counted where they arrive, not taken from the worker.
    status, why = audited({0: [honest]}, KeptCall(index=3, n_sets=1, seed=7, digests=()))
    assert status is Status.REJECTED and "not those the worker committed to" in why


# ------------------------------------------------------------------ verdicts on the CPU
@pytest.fixture(scope="module")
def cpu_judge(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from kerneljudge import Judge, JudgeConfig
    from kerneljudge.timing import TimingConfig

    config = JudgeConfig(
        cache_dir=tmp_path_factory.mktemp("cache"),
        run_timeout_s=60.0,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=1.0),
    )
    with Judge(ADV / "problem_cpu.py", config) as j:
        yield j


@pytest.mark.parametrize(
    "name, statuses, words",
    [
        ("cheat_rescaled_clock_2_7x.py", {Status.REJECTED}, "clock running slow"),
        ("cheat_rescaled_clock_1_2x.py", {Status.REJECTED}, "clock running slow"),
        ("cheat_thread_deferral.py", {Status.REJECTED}, "still running when forward returned"),
        ("cheat_audit_steering.py", {Status.REJECTED, Status.INCORRECT}, ""),
        ("cheat_patch_op_time.py", {Status.REJECTED}, "not marked on the stamp socket"),
    ],
)
def test_timing_cheats_are_caught(cpu_judge, name: str, statuses: set, words: str) -> None:  # type: ignore[no-untyped-def]
    v = cpu_judge.evaluate(ADV / "cpu" / name)
    assert v.status in statuses, (v.status, v.reason)
    assert words in v.reason


def test_the_honest_baseline_passes_the_timer_audit(cpu_judge) -> None:  # type: ignore[no-untyped-def]
    v = cpu_judge.evaluate(ADV / "cpu" / "correct_baseline.py")
    assert v.status is Status.CORRECT, v.reason


def test_idle_time_before_the_first_call_buys_no_slack_for_moved_work() -> None:
    """A candidate that sleeps before its first start mark (or inside a few windows) to lower
    the CPU-time floor is still rejected: those times count at most a few times the
    reference's, or a few median windows."""
    rng = np.random.default_rng(5)
    eager = _batches(rng, 3.0, noise=False, cpu_counted=True)
    cand = _batches(rng, 0.3, moved_ms=2.7, noise=False, cpu_counted=True)
    padded = [
        dataclasses.replace(b, edges_ms=(600.0, 0.1), windows_ms=(*b.windows_ms[:-2], 300.0, 300.0))
        for b in cand
    ]
    found = timer_check({"eager": eager, "candidate": padded})
    assert found.status == "rejected", found


def test_one_stalled_batch_does_not_reject_an_honest_loop() -> None:
    """A collection pause or one-time work in one gap of one batch makes that batch's floor
    high; the lower median over batches does not move."""
    rng = np.random.default_rng(6)
    eager = _batches(rng, 0.05, noise=False, gap_ms=0.1, cpu_counted=True)
    cand = _batches(rng, 0.05, noise=False, gap_ms=0.1, cpu_counted=True)
    cand[0] = dataclasses.replace(cand[0], tree_cpu_ms=(cand[0].tree_cpu_ms or 0) + 150.0)
    assert timer_check({"eager": eager, "candidate": cand}).status != "rejected"


def test_few_call_batches_with_long_edges_do_not_hide_moved_work() -> None:
    """Batches as a 2-core host under load gave them for a candidate computing each call's
    outputs before its start mark (cheat_precompute_between_calls; linear + GELU, about 5 ms
    of CPU time per call moved out, windows of 0.07 ms): each timing's first batch of 3 calls
    has 13-20 ms before its first and after its last window spread over 5 gaps, which sinks
    its floor below the limit; the batches of 200 calls carry the work. Weighted by their
    gaps, the batches reject it (unweighted, the lower median was a 3-call batch's)."""

    def cand(n: int, warmup: int, tree: float, edges: tuple[float, float]) -> Batch:
        return Batch(n, warmup, 0.0, (0.05,) * n, (0.066,) * n, (10.0,) * (n + warmup - 1),
                     tree, 1, (), (0.066,) * warmup, edges)  # fmt: skip

    def ref(n: int, warmup: int, between: float, edges: tuple[float, float]) -> Batch:
        return Batch(n, warmup, 0.0, (5.4,) * n, (5.45,) * n, (2.5,) * (n + warmup - 1), None,
                     1, (between,) * (n + warmup - 1), (5.45,) * warmup, edges)  # fmt: skip

    seen = {
        "eager": [ref(3, 3, 2.34, (19.5, 12.4)), ref(6, 1, 2.22, (7.7, 14.3)),
                  ref(3, 3, 2.25, (34.2, 10.1))],
        "candidate": [cand(3, 3, 47.94, (14.15, 18.72)), cand(200, 1, 1367.45, (29.11, 37.16)),
                      cand(3, 3, 52.18, (20.23, 13.43)), cand(200, 1, 1469.5, (22.35, 45.79))],
    }  # fmt: skip
    found = timer_check(seen)
    assert found.status == "rejected" and "CPU time between timed calls" in found.reason, found
    # the same loop doing only the reference's work between calls passes
    honest = [dataclasses.replace(b, tree_cpu_ms=(b.n + b.warmup - 1) * 2.3 + 30.0,
                                  gaps_ms=(2.5,) * (b.n + b.warmup - 1))
              for b in seen["candidate"]]  # fmt: skip
    assert timer_check({**seen, "candidate": honest}).status == "ok"


def _probe_and_long(tree_long: float, tree_probe: float = 40.0) -> list[Batch]:
    """A timing's candidate batches: its 3-call probe and one batch of 200 calls (0.066 ms
    windows, 20 ms edges), with the tree CPU times given."""
    return [
        Batch(3, 3, 0.0, (0.05,) * 3, (0.066,) * 3, (2.5,) * 5, tree_probe, 1, (), (0.066,) * 3,
              (20.0, 20.0)),
        Batch(200, 1, 0.0, (0.05,) * 200, (0.066,) * 200, (2.5,) * 200, tree_long, 1, (), (0.066,),
              (20.0, 20.0)),
    ]  # fmt: skip


def _ref_timing() -> list[Batch]:
    return [Batch(6, 1, 0.0, (5.4,) * 6, (5.45,) * 6, (2.5,) * 6, None, 1, (2.2,) * 6, (5.45,),
                  (10.0, 10.0)) for _ in range(3)]  # fmt: skip


def test_one_long_batch_alone_decides_nothing_and_the_next_timing_decides_with_it() -> None:
    """One long batch past the limit (one-time work of 500 ms in it, or moved work on every
    call) beside a probe that is not is ``inconclusive``; a second timing is judged on the
    candidate's batches of both: the honest loop's clean second timing leaves one batch past
    (not rejected), the cheat's puts two past (rejected)."""
    honest_first = _probe_and_long(200 * 2.2 + 60.0 + 500.0)  # its loop's work, edges, once
    first = {"eager": _ref_timing(), "candidate": honest_first}
    assert timer_check(first).status == "inconclusive"
    clean = {"eager": _ref_timing(), "candidate": _probe_and_long(200 * 2.2 + 60.0)}
    assert timer_check(clean, earlier=first).status != "rejected"
    moved = _probe_and_long(200 * (2.2 + 5.0) + 60.0)
    cheat_first = {"eager": _ref_timing(), "candidate": moved}
    assert timer_check(cheat_first).status == "inconclusive"
    found = timer_check({"eager": _ref_timing(), "candidate": moved}, earlier=cheat_first)
    assert found.status == "rejected" and "CPU time between timed calls" in found.reason, found


@pytest.mark.parametrize("nbytes", [0, 3, 4, 36, 4096 + 6, 3 * 4096 + 4])
def test_the_tree_digest_is_the_same_made_in_blocks(nbytes: int) -> None:
    """The digest made a few leaves at a time (bounded temporaries, for outputs of GiBs) is
    the one made over all leaves at once, for sizes around the power-of-two padding."""
    x = torch.randint(
        0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes)
    )
    whole = digest(x, chunk_words=1 << 30)
    for block in (1, 2, 3, 6, 8, 64):
        assert digest(x, chunk_words=block) == whole
    if nbytes:
        y = x.clone()
        y[-1] ^= 1
        assert digest(y, chunk_words=8) != whole


def _cpu_kernel(kind: str, lane: int) -> Callable[..., torch.Tensor]:
    """The fused kernels' arithmetic in torch's int64 ops on the CPU (the driver around them
    is what these tests check; tests/gpu/test_stamps_gpu.py runs the kernels themselves)."""
    import kerneljudge.worker.digest as tree

    a, b, m1, m2, c = tree._CONSTANTS[lane]
    p = tree.P

    def leaf(w: torch.Tensor) -> torch.Tensor:
        u = w.to(torch.int64) & 0xFFFFFFFF
        return ((u >> 16) * a + (u & 0xFFFF) + b) % p

    def node(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        x = (left * m1 + right * m2 + c) % p
        x2 = x * x % p
        return x2 * x2 % p * x % p

    def run(*columns: torch.Tensor) -> torch.Tensor:
        v = [leaf(x) if kind == "leaf" else x.to(torch.int64) for x in columns]
        while len(v) > 1:
            v = [node(v[i], v[i + 1]) for i in range(0, len(v), 2)]
        return v[0].to(torch.int32)

    return run


@pytest.mark.parametrize(
    "nbytes", [3, 31, 32, 33, 256, 260, 288, 1000, 4096 * 9 + 5, 32 * 8**4, 32 * 8**4 + 3]
)
def test_the_fused_digest_is_the_tree_digest(nbytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole groups of eight words reduced eight at a time, the partial last group, the padding
    of each level and the top levels in Python's integers: the same two lanes as the tree made
    level by level, for sizes around every boundary, from an aligned or an unaligned start."""
    import kerneljudge.worker.digest as tree

    monkeypatch.setattr(tree, "_kernel", _cpu_kernel)
    g = torch.Generator().manual_seed(nbytes)
    base = torch.randint(0, 256, (nbytes + 1,), dtype=torch.uint8, generator=g)
    for raw in (base[:nbytes], base[1:]):
        assert tree._fused_digest(raw) == digest(raw, fused=False)
    y = base[:nbytes].clone()
    y[nbytes // 2] ^= 0x10
    assert tree._fused_digest(y) != digest(base[:nbytes], fused=False)


def test_the_warm_up_runs_every_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 4 KiB a worker digests at its start (``warm``) reach both kernels of both lanes, so
    no later fused digest compiles one; off CUDA it does nothing and gives the kernels up for
    no one."""
    import kerneljudge.worker.digest as tree

    assert tree.warm(torch.device("cpu")) is False and not tree._UNCOMPILED
    called: set[tuple[str, int]] = set()

    def recorded(kind: str, lane: int) -> Callable[..., torch.Tensor]:
        called.add((kind, lane))
        return _cpu_kernel(kind, lane)

    monkeypatch.setattr(tree, "_kernel", recorded)
    raw = torch.zeros(tree._WARM_BYTES, dtype=torch.uint8)
    assert tree._fused_digest(raw) == tree.digest(raw, fused=False)
    assert called == {(k, lane) for k in ("leaf", "node") for lane in (0, 1)}


def test_the_audited_calls_the_supervisor_sizes_fit_the_workers_device_room() -> None:
    from kerneljudge.timing.stage import AUDIT_KEEP_SHARE

    assert measure.SNAPSHOT_DEVICE_SHARE >= AUDIT_KEEP_SHARE


def test_the_fused_kernels_source_computes_the_trees_residues(tmp_path: Path) -> None:
    """The fused kernels' source, compiled here by the host's C++ compiler (the same 64-bit
    arithmetic as on the device): for words and nodes at the edges of their ranges, each
    entry gives the residue of the eight-leaf subtree that Python's exact integers give, and
    its reduction gives the residue of values around multiples of ``P`` up to ``2**62``."""
    import shutil
    import subprocess

    import kerneljudge.worker.digest as tree

    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler on this host")
    rng = np.random.default_rng(3)
    edges = [0, 1, 0xFFFF, 0x10000, tree.P - 1, tree.P, 0x7FFFFFFF, -1, -(2**31)]
    words = [edges[:8], edges[-8:], *rng.integers(-(2**31), 2**31, (20, 8)).tolist()]
    nodes = [[tree.P - 1] * 8, [0] * 8, *rng.integers(0, tree.P, (20, 8)).tolist()]
    program = ["#include <cstdio>"]
    calls = []
    for lane in (0, 1):
        a, b, m1, m2, c = tree._CONSTANTS[lane]
        for kind, rows in (("leaf", words), ("node", nodes)):
            f = "kj_leaf<W>" if kind == "leaf" else "(W)"
            body = tree._FUSED_COMMON.format(a=a, b=b, m1=m1, m2=m2, c=c)
            body += tree._FUSED_ENTRY.format(kind=kind, lane=lane, f=f)
            program.append(f"namespace {kind}{lane} {{ {body} }}")
            for row in rows:
                args = ", ".join(f"{v}" for v in row)
                calls.append(
                    f'std::printf("%d\\n", {kind}{lane}::kj_digest_{kind}_{lane}<int>({args}));'
                )
                u = [v & 0xFFFFFFFF for v in row]
                level = [tree._leaf(lane, v) for v in u] if kind == "leaf" else list(row)
                while len(level) > 1:
                    level = [
                        tree._node(lane, level[i], level[i + 1]) for i in range(0, len(level), 2)
                    ]
                calls[-1] += f" // {level[0]}"
    p = tree.P
    reduced = [0, 1, p - 1, p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1, 2**31, 2**32 - 1, 2**62 - 1]
    reduced += [k * p + d for k in rng.integers(1, 2**31, 12).tolist() for d in (-1, 0, 1)]
    for x in reduced:
        calls.append(f'std::printf("%lld\\n", leaf0::kj_mod<long long>({x}LL)); // {x % p}')
    program.append("int main() {\n" + "\n".join(calls) + "\nreturn 0; }")
    source = tmp_path / "fused.cpp"
    source.write_text("\n".join(program))
    subprocess.run([compiler, "-O1", "-o", str(tmp_path / "fused"), str(source)], check=True)
    got = subprocess.run([str(tmp_path / "fused")], capture_output=True, text=True, check=True)
    expected = [int(line.rsplit("// ", 1)[1]) for line in calls]
    assert [int(v) for v in got.stdout.split()] == expected


@pytest.mark.parametrize("depth", [0, 2])
def test_a_committed_calls_copies_are_not_held_past_their_slot(
    monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    """When a call's forward starts, the loop holds the committed copies of at most ``depth``
    earlier calls (their slots on the way), as ``pipeline_depth`` counts them on a GPU (where
    it is 0 for GiB outputs): a copy whose slot said "not kept" is gone by then."""
    import weakref

    copies: list[weakref.ref] = []
    digest = measure._output_digest

    def recording(t: torch.Tensor, kind: int | None = None) -> tuple[int, bytes]:
        copies.append(weakref.ref(t))
        return digest(t, kind)

    live: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        live.append(sum(ref() is not None for ref in copies))
        return torch.tanh(x)

    monkeypatch.setattr(measure, "_output_digest", recording)
    monkeypatch.setattr(measure, "PIPELINE_DEPTH", depth)
    _observe(fn, [[torch.randn(16, 8)]], 8, 1, lambda i: -1, recycle=False)  # a GPU's loop
    assert len(live) == 9 and max(live) == depth


def test_a_slot_kept_anew_lets_its_earlier_copy_go_before_the_new_one_goes_to_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the device's room a kept call's copies go to the host (page-locked on a GPU); the
    copy kept earlier in that slot is let go first, so the host block it held can take the new
    one instead of a second block of the same size beside it. Here every copy counts as device
    bytes against no room, so each slot kept anew takes the host path."""
    import weakref

    previous: dict[int, weakref.ref] = {}
    alive_at_copy: list[bool] = []
    slots = iter([0, 0, 1, 0])

    def on_host(held: list[torch.Tensor]) -> list[torch.Tensor]:
        slot = next(slots)
        alive_at_copy.append(slot in previous and previous[slot]() is not None)
        copies = [t.clone() for t in held]
        previous[slot] = weakref.ref(copies[0])
        for t in copies:
            t.on_the_host = True  # type: ignore[attr-defined]
        return copies

    monkeypatch.setattr(measure, "_host_copies", on_host)
    monkeypatch.setattr(measure, "_device_bytes", lambda ts: sum(
        t.numel() * t.element_size() for t in measure.flatten_tensors(ts)
        if not getattr(t, "on_the_host", False)))  # fmt: skip
    keep = {2: 0, 3: 0, 5: 1, 6: 0}  # timed call -> slot (the warm-up call is 0)
    (_, kept, _), _ = _observe(torch.tanh, [[torch.randn(16, 8)]], 7, 1, lambda i: keep.get(i, -1),
                               recycle=False)  # a GPU's loop  # fmt: skip
    assert alive_at_copy == [False, False, False, False]
    assert set(kept) == {0, 1}


def test_a_cpu_loop_writes_a_calls_copies_into_those_of_a_call_not_kept() -> None:
    """On the CPU the end-mark copies of a call whose slot said "not kept" take the next call's
    copies (no fresh memory per call); a kept call's copies are not written again once kept,
    and each kept copy is the output of its own call's inputs."""
    sets = [[torch.randn(16, 8)]]
    digested: list[torch.Tensor] = []  # each copy committed, in order (held: identities stay)
    digest = measure._output_digest

    def recording(t: torch.Tensor, kind: int | None = None) -> tuple[int, bytes]:
        digested.append(t)
        return digest(t, kind)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "_output_digest", recording)
        # Timed calls 3, 5 and 6 kept (calls 4, 6 and 7 after the warm-up call), 5 in 3's slot.
        keep = {3: 0, 5: 0, 6: 1}
        (_, kept, _), obs = _observe(torch.tanh, sets, 10, 1, lambda i: keep.get(i, -1))

    def times(t: torch.Tensor) -> int:
        return sum(d is t for d in digested)

    assert len(digested) == 11 and max(map(times, digested)) > 1  # copies written again
    # Call 4's copies, replaced in their slot, no longer audited: written again later.
    assert any(d is digested[4] for d in digested[5:])
    for slot, call in ((0, 6), (1, 7)):
        assert digested[call] is kept[slot][0]
        assert all(d is not kept[slot][0] for d in digested[call + 1 :])  # not written again
        args = measure.perturb(sets[0], [True], obs.calls[call].seed)
        assert torch.equal(kept[slot][0], torch.tanh(args[0]))
    # A dense output is written into a clone of one like it (its strides kept, a transposed
    # one's too); another shape, strides or dtype, or one output of several that does not
    # match, makes new copies of all.
    t = torch.randn(2, 4).t()
    assert measure._fits(t.clone(), t) and not measure._fits(t.contiguous(), t)
    assert not measure._fits(torch.zeros(4, 2, dtype=torch.float64), t)
    one, two = torch.zeros(3), torch.zeros(4)
    new = measure._end_copies([torch.ones(3), torch.ones(5)], [one, two])
    assert new[0] is not one and new[0].shape == (3,) and new[1].shape == (5,)
    again = measure._end_copies([torch.ones(3), torch.ones(4)], [one, two])
    assert again[0] is one and again[1] is two and torch.equal(one, torch.ones(3))


@pytest.mark.parametrize("high", [False, True])
def test_every_datagram_sent_before_the_reply_is_observed_once_the_reply_wakes_the_reader(
    high: bool,
) -> None:
    """The observer's reader thread ends when the request returns (woken at once, not on a
    poll's timeout), but only after it read every datagram the worker sent before its reply:
    here three the observer cannot parse, counted as junk, sent just before the reply; a
    second run on the same socket starts with none left over. ``high``: the same with the
    socket and the wake-up pipe at descriptors past 1023 (a judge process with many open),
    which ``select`` would refuse."""
    import resource

    held: list[int] = []
    if high:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"this host allows {hard} open descriptors")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
        while not held or held[-1] < 1030:
            held.append(os.dup(0))
    sup, wrk = socket_pair()
    assert not high or sup.fileno() > 1023

    def request(op, timeout_s, **fields):  # type: ignore[no-untyped-def]
        for _ in range(3):
            wrk.send(b"zz")
        return {"times_ms": []}

    try:
        for _ in range(2):
            _, obs = Observer(sup).run(request, 5.0, n=0, warmup=0, keep=lambda i: -1)
            assert obs.junk == 3
    finally:
        sup.close()
        wrk.close()
        for fd in held:
            os.close(fd)
    alive = [t.name for t in threading.enumerate() if t.name == "kj-stamps"]
    assert alive == []
