"""Timing statistics and the alternation protocol (with deterministic fake samplers)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from kerneljudge.timing import (
    TimingConfig,
    bootstrap_medians,
    bootstrap_speedup,
    measure_alternating,
    measure_rounds,
    median_ci,
    speedups,
    summarise,
)


def test_median_ci_covers_the_median_and_narrows_with_n() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(10, 1, 30)
    large = rng.normal(10, 1, 3000)
    lo_s, hi_s = median_ci(small)
    lo_l, hi_l = median_ci(large)
    assert lo_s <= np.median(small) <= hi_s
    assert lo_l <= np.median(large) <= hi_l
    assert (hi_l - lo_l) < (hi_s - lo_s) / 4


def test_median_ci_coverage_is_about_95_percent() -> None:
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        lo, hi = median_ci(rng.exponential(1.0, 101))
        hits += lo <= np.log(2) <= hi  # the exponential's true median
    assert 0.90 <= hits / 400 <= 0.99


def test_summarise() -> None:
    m = summarise("x", [1.0, 2.0, 3.0, 4.0, 100.0])
    assert m.median_ms == 3.0 and m.min_ms == 1.0 and m.samples == 5
    assert m.iqr_ms == pytest.approx(2.0)


def test_bootstrap_speedup_interval() -> None:
    rng = np.random.default_rng(2)
    base = list(rng.normal(2.0, 0.05, 200))
    cand = list(rng.normal(1.0, 0.02, 200))
    point, (lo, hi) = bootstrap_speedup(base, cand)
    assert lo < point < hi and 1.9 < lo and hi < 2.1
    assert bootstrap_speedup(base, cand) == (point, (lo, hi))  # seeded: reproducible


@pytest.mark.parametrize("n", [1, 2, 7, 8, 301, 1000])
def test_bootstrap_medians_match_resampling(n: int) -> None:
    """Drawn from order statistics, the bootstrap medians have the distribution that resampling
    n values with replacement and taking numpy's median gives (even n: the two middle values'
    mean), within the Monte Carlo error of 20,000 draws each."""
    rng = np.random.default_rng(n)
    x = np.sort(rng.lognormal(0.0, 0.3, n))
    x[: n // 4] = x[0]  # ties among the fastest, as a timer's resolution makes them
    rng.shuffle(x)
    draws = 20_000
    fast = bootstrap_medians(x, draws, np.random.default_rng(1))
    slow = np.median(x[np.random.default_rng(2).integers(0, n, (draws, n))], axis=1)
    spread = float(np.percentile(slow, 97.5) - np.percentile(slow, 2.5)) or 1.0
    for q in (2.5, 25, 50, 75, 97.5):
        assert abs(np.percentile(fast, q) - np.percentile(slow, q)) < 0.05 * spread, q
    assert np.isin(fast, np.concatenate([x, (x[:, None] + x[None, :]).ravel() / 2])).all()


@pytest.mark.parametrize("n", [4, 5])
def test_bootstrap_medians_have_the_exact_resampling_distribution(n: int) -> None:
    """Against every one of the n**n equally likely resamples: each possible median's share."""
    import itertools
    from collections import Counter

    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0][:n])
    exact = Counter(float(np.median(x[list(i)])) for i in itertools.product(range(n), repeat=n))
    draws = 200_000
    got = Counter(bootstrap_medians(x, draws, np.random.default_rng(3)).tolist())
    assert set(got) <= set(exact)
    for value, count in exact.items():
        p = count / n**n
        assert abs(got[value] / draws - p) < 5 * (p * (1 - p) / draws) ** 0.5 + 1e-9, value


def test_alternation_rotates_order_and_stops_on_precision() -> None:
    calls: list[str] = []
    rng = np.random.default_rng(3)

    def sampler(name: str, mean: float):
        def sample(n: int, warmup: int) -> list[float]:
            calls.append(name)
            return list(rng.normal(mean, mean * 0.01, n))

        return sample

    samples, rounds, stop = measure_alternating(
        {"eager": sampler("eager", 2.0), "candidate": sampler("candidate", 1.0)},
        TimingConfig(
            min_samples=10,
            rel_precision=0.01,
            min_time_s=0,
            min_rounds=1,
            max_time_s=5,
            batch_target_ms=10,
        ),
    )
    assert stop == "precision"
    body = calls[2:]  # after the two calibration calls
    assert body[:4] == ["eager", "candidate", "candidate", "eager"]
    assert len(samples["eager"]) >= 10 and len(samples["candidate"]) >= 10
    (s,) = speedups(samples)
    assert s.baseline == "eager" and s.median == pytest.approx(2.0, rel=0.02)


def test_a_batch_grows_to_what_its_calls_measure_after_a_slow_calibration() -> None:
    """Calls slow only while the batch is sized (a candidate seeking one-call batches, whose
    time around its calls the timer audit spreads over few gaps, or slow first calls) do not
    keep the batch at one call; a batch never shrinks when calls slow down later."""
    made = {"candidate": 0, "eager": 0}

    def sampler(name: str, first_calls: int, first_ms: float, later_ms: float):
        def sample(n: int, warmup: int) -> list[float]:
            out = []
            for _ in range(warmup + n):
                made[name] += 1
                out.append(first_ms if made[name] <= first_calls else later_ms)
            return out[warmup:]

        return sample

    config = TimingConfig(
        min_samples=5, rel_precision=1e-9, min_time_s=0, min_rounds=4, max_time_s=0.5
    )
    rounds = measure_rounds(
        {
            # 40 ms through its warm-up and calibration calls, then 0.1 ms
            "candidate": sampler("candidate", 6, 40.0, 0.1),
            # 1 ms for its first 40 calls, then 40 ms: its batch stays as sized
            "eager": sampler("eager", 40, 1.0, 40.0),
        },
        config,
    )
    cand = [len(b) for b in rounds.batches["candidate"] if b is not None]
    eager = [len(b) for b in rounds.batches["eager"] if b is not None]
    assert cand[0] == 1  # sized by the slow calibration
    assert max(cand) > 1 and cand == sorted(cand)  # then grown, never shrunk
    assert max(cand) <= 200
    assert sum(eager) > 40  # it ran into its slow calls
    assert eager[0] == round(config.batch_target_ms / 1.0) and min(eager) == eager[0]


def test_a_batch_without_a_usable_time_keeps_its_size() -> None:
    """A failed request's NaN (the caller turns it into the verdict) sizes nothing: neither in
    the calibration batch (one call) nor in a later round (the size stays)."""
    asked: list[int] = []

    def sample(n: int, warmup: int) -> list[float]:
        asked.append(n)
        return [math.nan] if len(asked) in (1, 3) else [1.0] * n

    measure_rounds(
        {"candidate": sample},
        TimingConfig(min_samples=3, rel_precision=0.5, min_time_s=0, min_rounds=4, max_time_s=1),
    )
    target = round(TimingConfig().batch_target_ms / 1.0)
    # the probe (3 calls) gave NaN: one call; then grown by 1 ms calls; the NaN reply to the
    # third request left the size as it was
    assert asked[:5] == [3, 1, target, target, target]


def test_noisy_contestant_stops_on_time_or_samples() -> None:
    rng = np.random.default_rng(4)
    samples, _, stop = measure_alternating(
        {"candidate": lambda n, w: list(rng.exponential(1.0, n) * 1e-3)},
        TimingConfig(min_samples=5, rel_precision=1e-6, max_time_s=0.2, max_samples=300),
    )
    assert stop in ("max_time", "max_samples")


def test_precision_stop_waits_for_a_minimum_span() -> None:
    """A tight interval after a few quick rounds is not enough: the samples must span
    ``min_time_s`` and ``min_rounds``."""
    rng = np.random.default_rng(5)

    def sample(n: int, warmup: int) -> list[float]:
        time.sleep(0.001)  # a batch takes time, as real calls do
        return list(rng.normal(1.0, 0.001, n))

    t0 = time.monotonic()
    _, rounds, stop = measure_alternating(
        {"candidate": sample},
        TimingConfig(min_samples=5, min_time_s=0.2, min_rounds=12, max_samples=100_000),
    )
    assert stop == "precision"
    assert rounds >= 12 and time.monotonic() - t0 >= 0.2


def test_fewer_timed_calls_are_audited_where_their_outputs_would_not_fit() -> None:
    """Eight audited calls, unless eight kept outputs exceed an eighth of the device's memory;
    never fewer than two."""
    from kerneljudge.timing.stage import AUDITED_CALLS, MIN_AUDITED_CALLS, audited_calls
    from kerneljudge.verdict import DeviceInfo

    gib = 1 << 30
    h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", memory_bytes=140 * gib)
    assert audited_calls(256 << 20, h200) == AUDITED_CALLS
    assert audited_calls(2 * gib, h200) == AUDITED_CALLS
    assert audited_calls(5 * gib, h200) == 3  # 17.5 GiB of room
    assert audited_calls(6 * gib, h200) == MIN_AUDITED_CALLS
    assert audited_calls(100 * gib, h200) == MIN_AUDITED_CALLS
    assert audited_calls(0, h200) == AUDITED_CALLS
    assert audited_calls(1 << 20, DeviceInfo(kind="cpu", name="cpu")) == AUDITED_CALLS
