"""Timing on a noisy host: per-round intervals, the noise rule, re-measurement, batch limits,
the floor rule's bound, and a CPU verdict of an honest candidate under real load."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig, Verdict
from kerneljudge.timing import (
    BatchLimit,
    bootstrap_speedup,
    measure_judged,
    round_spread,
    speedups,
)
from kerneljudge.timing import hostload as hl
from kerneljudge.timing.stage import below_floor, roofline_of
from kerneljudge.verdict import DeviceInfo, HostLoad, Measurement, Speedup, TimingResult, decode
from kerneljudge.verdict.render import noise_line, render_verdict, verdict_summary

FIXTURES = Path(__file__).parent / "fixtures"


def _rounds(levels: list[float], n: int, rng: np.random.Generator) -> list[list[float] | None]:
    """One batch of ``n`` samples per round, around each round's level (1% spread)."""
    return [list(level * (1 + 0.01 * rng.standard_normal(n))) for level in levels]


def _flat(batches: list[list[float] | None]) -> list[float]:
    return [x for b in batches if b for x in b]


def test_step_drift_in_one_contestant_widens_the_interval_to_the_truth() -> None:
    # True speedup 1 (the same work on both sides). From round 5 on the host's load slows the
    # baseline's batches 3x (a multi-threaded reference on an oversubscribed host), not the
    # candidate's: pooled, the baseline's median is a slowed one.
    rng = np.random.default_rng(1)
    base = _rounds([1.0] * 5 + [3.0] * 7, 30, rng)
    cand = _rounds([1.0] * 12, 30, rng)
    samples = {"eager": _flat(base), "candidate": _flat(cand)}
    _, old = bootstrap_speedup(samples["eager"], samples["candidate"])
    assert not old[0] <= 1.0 <= old[1]  # the samples-only interval excludes the truth
    (s,) = speedups(samples, batches={"eager": base, "candidate": cand})
    assert s.ci95_samples == old
    assert s.ci95[0] <= 1.0 <= s.ci95[1]
    assert s.ci95_rounds is not None and s.ci95_rounds[0] <= 1.0
    assert round_spread(base) > hl.ROUND_SPREAD_MAX


def test_drift_common_to_both_contestants_keeps_the_interval_tight() -> None:
    # A step that slows both alike (same moment): every round's ratio stays 2.
    rng = np.random.default_rng(2)
    levels = [1.0] * 5 + [3.0] * 7
    base = _rounds([2 * x for x in levels], 30, rng)
    cand = _rounds(levels, 30, rng)
    (s,) = speedups(
        {"eager": _flat(base), "candidate": _flat(cand)}, batches={"eager": base, "candidate": cand}
    )
    assert s.ci95[0] <= 2.0 <= s.ci95[1]
    assert s.ci95[1] - s.ci95[0] < 0.05 * 2
    assert round_spread(cand) > hl.ROUND_SPREAD_MAX  # the host moved: the rule sees it


def test_resting_rounds_are_skipped_by_the_round_ratios() -> None:
    rng = np.random.default_rng(3)
    base = _rounds([1.0] * 6, 20, rng)
    cand = _rounds([0.5] * 6, 20, rng)
    cand[2] = None  # the candidate rested in round 2
    (s,) = speedups(
        {"eager": _flat(base), "candidate": _flat(cand)}, batches={"eager": base, "candidate": cand}
    )
    assert s.ci95_rounds is not None and s.ci95_rounds[0] <= 2.0 <= s.ci95_rounds[1]


def _quiet_readings(seconds: float = 1.0) -> hl.Readings:
    return hl.Readings(
        seconds=seconds,
        runnable=[0, 0, 1],
        pressure_us=int(0.01 * seconds * 1e6),
        ticks=(1000, 5, 0),
        preemptions=2,
        run_delay_ns=int(1e6),
    )


def test_noise_rule_on_synthetic_host_readings() -> None:
    quiet = hl.host_load(_quiet_readings(), (1,), 1, {"eager": 0.02, "candidate": 0.01})
    assert not quiet.noisy and quiet.noise_reasons == ()
    assert quiet.preemptions_per_s == pytest.approx(2.0)
    assert quiet.run_delay == pytest.approx(1e-3)
    assert quiet.steal == 0.0 and quiet.iowait == pytest.approx(0.005)
    assert quiet.cpu_pressure == pytest.approx(0.01)
    changes = {
        "preempted": dict(preemptions=400),
        "waited": dict(run_delay_ns=int(0.3e9)),
        "hypervisor": dict(ticks=(1000, 0, 100)),
        "I/O": dict(ticks=(1000, 300, 0)),
        "runnable": dict(runnable=[(os.cpu_count() or 2) + 3] * 3),
    }
    for words, change in changes.items():
        host = hl.host_load(dataclasses.replace(_quiet_readings(), **change), (1,), 1)
        assert host.noisy and len(host.noise_reasons) == 1, (words, host)
        assert words in host.noise_reasons[0]
    spread = hl.host_load(_quiet_readings(), (1,), 1, {"eager": 0.4})
    assert spread.noisy and "eager's batch medians" in spread.noise_reasons[0]
    # Per timed thread: 40 preemptions a second over 4 threads is 10 each, under the bound.
    assert not hl.host_load(
        dataclasses.replace(_quiet_readings(), preemptions=40), (0, 1, 2, 3), 4
    ).noisy
    # Host-wide CPU pressure alone is reported, not ruled on.
    loud = hl.host_load(dataclasses.replace(_quiet_readings(), pressure_us=900_000), (1,), 1)
    assert loud.cpu_pressure == pytest.approx(0.9) and not loud.noisy
    # Readings the host does not expose are None and rule nothing.
    bare = hl.host_load(hl.Readings(seconds=1.0), (1,), 1)
    assert bare.run_queue is None and bare.steal is None and not bare.noisy


class _Monitor:
    """Stands in for :class:`LoadMonitor`: counts passes, reports quiet readings."""

    def __init__(self) -> None:
        self.passes = 0

    def start(self) -> None:
        self.passes += 1

    def between_batches(self) -> None:
        pass

    def stop(self) -> hl.Readings:
        return _quiet_readings(0.1)


def _contestants(monitor: _Monitor, noisy_passes: set[int]):  # type: ignore[no-untyped-def]
    """eager at 2 ms, the candidate at 1 ms; in a noisy pass every other eager batch is 3x."""
    batches = {"eager": 0}

    def eager(n: int, warmup: int) -> list[float]:
        batches["eager"] += 1
        slow = monitor.passes in noisy_passes and batches["eager"] % 2
        return [6.0 if slow else 2.0] * n

    def candidate(n: int, warmup: int) -> list[float]:
        return [1.0] * n

    return {"eager": eager, "candidate": candidate}


CONFIG = TimingConfig(min_time_s=0.0, max_time_s=0.05, min_rounds=8, min_samples=5)


def test_a_noisy_pass_is_measured_again_and_a_quiet_second_pass_is_reported() -> None:
    monitor = _Monitor()
    judged = measure_judged(_contestants(monitor, {1}), CONFIG, monitor, (1,), 1)  # type: ignore[arg-type]
    assert monitor.passes == 2 and judged.passes == 2
    assert not judged.host.noisy
    assert set(judged.samples["eager"]) == {2.0}  # the second pass alone
    (s,) = judged.speedups
    assert s.median == pytest.approx(2.0) and s.ci95 == pytest.approx((2.0, 2.0))


def test_two_noisy_passes_flag_the_verdict_and_widen_the_interval() -> None:
    monitor = _Monitor()
    judged = measure_judged(_contestants(monitor, {1, 2}), CONFIG, monitor, (1,), 1)  # type: ignore[arg-type]
    assert judged.passes == 2 and judged.host.noisy
    assert any("eager's batch medians" in r for r in judged.host.noise_reasons)
    (s,) = judged.speedups
    # Round ratios were 2 and 6: the widened interval spans where they fell.
    assert s.ci95[0] <= 2.0 and s.ci95[1] >= 6.0 * 0.99
    # Without re-measurement a noisy pass is flagged and widened at once.
    monitor = _Monitor()
    once = measure_judged(
        _contestants(monitor, {1}),  # type: ignore[arg-type]
        dataclasses.replace(CONFIG, remeasure=False),
        monitor,  # type: ignore[arg-type]
        (1,),
        1,
    )
    assert monitor.passes == 1 and once.passes == 1 and once.host.noisy


def test_load_monitor_reads_this_host() -> None:
    monitor = hl.LoadMonitor([os.getpid()], hl.timing_cores("cpu")[0])
    monitor.start()
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        pass
    monitor.between_batches()
    r = monitor.stop()
    assert r.seconds > 0
    if Path("/proc/loadavg").exists():
        assert len(r.runnable) == 1 and r.runnable[0] >= 0
        assert r.preemptions is not None and r.preemptions >= 0
        assert r.ticks is not None and r.ticks[0] > 0
    host = hl.host_load(r, hl.timing_cores("cpu")[0], 1)
    assert host.cpus == len(os.sched_getaffinity(0))


def test_timing_cores() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    cores, threads = hl.timing_cores("cpu")
    k = max(1, (len(allowed) - 1) // 2)
    assert cores == tuple(allowed[-k:]) and threads == k
    assert hl.timing_cores("cpu", threads=1)[1] == 1
    assert hl.timing_cores("cuda") == ((allowed[-1],), 1)


def test_batch_limit_scales_with_the_work_and_keeps_a_cap() -> None:
    limit = BatchLimit()
    assert limit.limit_s(2, 8.0) == 16.0  # nothing measured: each call may take a trial's limit
    # nothing measured yet (the first batch, a few calls): no cap, so a candidate as slow as
    # its trials allowed is not cut short by the batch's cap
    assert limit.limit_s(6, 8.0) == 48.0
    limit.observe(10, 1.0)  # 0.1 s a call
    assert limit.limit_s(10, 8.0) == pytest.approx(20.0)  # 20 x 10 calls x 0.1 s
    assert limit.limit_s(1, 8.0) == 8.0  # never below the request limit
    assert limit.limit_s(1000, 8.0) == 40.0  # a hang is still caught
    limit.observe(10, 0.1)  # a faster batch does not lower the estimate
    assert limit.limit_s(10, 8.0) == pytest.approx(20.0)


def test_floor_rule_decides_from_the_upper_bound_of_the_median() -> None:
    floor = 1.0
    # The median (0.85 ms) is under 0.9 x the floor, but its 95% interval reaches above it.
    near = [0.5] * 6 + [0.85] + [1.2] * 6
    assert float(np.median(near)) < 0.9 * floor
    assert not below_floor(near, floor)
    assert below_floor([0.5] * 13, floor)
    assert not below_floor([], floor)

    problem = SimpleNamespace(
        flop_count=lambda: None,
        byte_count=lambda inputs, outputs: 4.8e9,  # 1 ms at the H200's 4.8 TB/s
        module=SimpleNamespace(),
        dtype="torch.bfloat16",
    )
    ref = SimpleNamespace(problem=problem)
    info = DeviceInfo(kind="cuda", name="NVIDIA H200")
    r_near = roofline_of(ref, near, info, [], None)  # type: ignore[arg-type]
    assert r_near is not None and r_near.floor_ms == pytest.approx(1.0, rel=0.05)
    assert not r_near.below_floor
    r_low = roofline_of(ref, [0.5] * 13, info, [], None)  # type: ignore[arg-type]
    assert r_low is not None and r_low.below_floor


def _noisy_timing() -> TimingResult:
    host = HostLoad(
        cpus=2,
        seconds=2.1,
        run_queue=4.0,
        run_queue_max=5,
        preemptions=900,
        preemptions_per_s=420.0,
        round_spread={"eager": 0.3, "candidate": 0.05},
        noisy=True,
        noise_reasons=("4 other runnable tasks (median) for the 1 CPU(s) outside",),
    )
    m = Measurement("candidate", 40, 1.0, 0.9, 1.1, 0.8, 1.0, (0.95, 1.05))
    return TimingResult(
        clock="monotonic",
        measurements=(m, dataclasses.replace(m, name="eager")),
        speedups=(Speedup("eager", 1.0, (0.5, 2.0), (0.98, 1.02), (0.6, 1.7)),),
        rounds=20,
        stop_reason="max_time",
        host=host,
        passes=2,
        threads=1,
        cores=(1,),
    )


def test_host_load_round_trips_and_renders_one_line() -> None:
    timing = _noisy_timing()
    assert decode(TimingResult, _jsonable(timing)) == timing
    v = Verdict(Status.CORRECT, "", "p", "0" * 64, "torch", timing=timing)
    assert Verdict.from_json(v.to_json()) == v
    out = io.StringIO()
    render_verdict(v, Console(file=out, width=200))
    text = out.getvalue()
    assert "host noisy while timing (after 2 passes): 4 other runnable tasks" in text
    assert "timed on core 1, 1 thread" in text
    assert noise_line(timing) in text
    assert verdict_summary(v).endswith("(95% CI 0.50-2.00, host noisy)")
    quiet = dataclasses.replace(timing, host=dataclasses.replace(timing.host, noisy=False))
    assert noise_line(quiet) == ""


def _jsonable(timing: TimingResult) -> dict:  # type: ignore[type-arg]
    import json

    v = Verdict(Status.CORRECT, "", "p", "", "torch", timing=timing)
    return json.loads(v.to_json())["timing"]


def _identity_candidate(tmp: Path) -> Path:
    source = (FIXTURES / "tiny_problem.py").read_text()
    path = tmp / "identity.py"
    path.write_text(re.sub(r"^class Model\b", "class ModelNew", source, flags=re.M))
    return path


def test_identity_candidate_under_real_load_is_covered_or_flagged(tmp_path: Path) -> None:
    candidate = _identity_candidate(tmp_path)
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path / "cache",
        run_timeout_s=60.0,
        baselines=("eager",),
        trials=2,
        timing_config=TimingConfig(max_time_s=0.5, min_samples=5),
    )
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        with Judge(FIXTURES / "tiny_problem.py", config) as judge:
            for _ in range(2 * len(os.sched_getaffinity(0))):
                spinners.append(
                    subprocess.Popen(
                        [sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL
                    )
                )
            v = judge.evaluate(candidate)
            ref_pid = judge.reference.session("cpu", "public").worker.worker_pid()
            pinned = os.sched_getaffinity(ref_pid)
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    assert v.status is Status.CORRECT, v.reason
    assert v.timing is not None and v.timing.host is not None
    s = v.timing.speedup("eager")
    assert s is not None
    assert s.ci95[0] <= 1.0 <= s.ci95[1] or v.timing.host.noisy, (s, v.timing.host)
    cores, threads = hl.timing_cores("cpu")
    assert v.timing.cores == cores and v.timing.threads == threads
    assert pinned == set(cores)
    assert v.timing.passes in (1, 2)
    assert v.timing.host.preemptions is None or v.timing.host.preemptions >= 0
    assert Verdict.from_json(v.to_json()) == v
