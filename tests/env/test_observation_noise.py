"""The agent's benchmark observation says when the host was noisy and when the timer audit
was undecided, in the words of the verdict."""

from __future__ import annotations

from kerneljudge.env.observations import benchmark_text
from kerneljudge.verdict import HostLoad, Measurement, Speedup, Status, TimingResult, Verdict


def _verdict(host: HostLoad | None, note: str = "") -> Verdict:
    m = [
        Measurement("eager", 50, 2.0, 1.9, 2.1, 1.8, 2.0, (1.95, 2.05)),
        Measurement("candidate", 50, 1.0, 0.9, 1.1, 0.8, 1.0, (0.95, 1.05)),
    ]
    timing = TimingResult(
        clock="monotonic",
        measurements=tuple(m),
        speedups=(Speedup("eager", 2.0, (1.2, 3.1)),),
        rounds=9,
        stop_reason="max_time",
        host=host,
        passes=2 if host and host.noisy else 1,
        timer_note=note,
    )
    return Verdict(
        status=Status.CORRECT,
        reason="",
        problem="p",
        candidate_sha256="0" * 64,
        backend="cpp",
        timing=timing,
    )


def test_a_noisy_host_is_named_in_the_observation() -> None:
    host = HostLoad(cpus=2, seconds=2.0, noisy=True, noise_reasons=("7 other runnable tasks",))
    text = benchmark_text("run_benchmark", _verdict(host))
    assert "Host noisy while timing (after 2 passes): 7 other runnable tasks" in text
    assert "intervals are widened" in text


def test_a_quiet_host_adds_nothing_and_an_undecided_audit_is_named() -> None:
    quiet = benchmark_text("run_benchmark", _verdict(HostLoad(cpus=2, seconds=2.0)))
    assert "noisy" not in quiet.lower()
    noted = benchmark_text("run_benchmark", _verdict(None, "inconclusive, measured again"))
    assert "Timer audit: inconclusive, measured again" in noted
