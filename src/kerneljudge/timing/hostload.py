"""The host's load while timing, read from ``/proc`` by the supervisor, and the noise rule.

What is read (Linux ``proc(5)``; a reading the host does not expose is None):

* ``/proc/loadavg``, fourth field ``R/T``: R tasks runnable host-wide at that instant; read
  between batches, while the timed workers wait for the next request, so ``R - 1`` (less the
  reader) are other tasks;
* ``/proc/pressure/cpu``, ``some ... total=`` (microseconds in which some task waited for a
  CPU; the kernel's pressure stall information);
* ``/proc/stat``, the ``cpuN`` lines of the timing cores: ``iowait`` and ``steal`` over all
  ticks;
* ``/proc/<pid>/task/<tid>/status`` ``nonvoluntary_ctxt_switches`` (the thread was preempted)
  and ``/proc/<pid>/task/<tid>/schedstat`` second field (nanoseconds runnable but waiting on a
  run queue), summed over the timed workers' threads.

The rule (:func:`noise_reasons`) and its thresholds are the module's constants.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kerneljudge.verdict import HostLoad
from kerneljudge.worker.process import timing_cpu

__all__ = [
    "IOWAIT_MAX",
    "PREEMPTIONS_PER_S_MAX",
    "ROUND_SPREAD_MAX",
    "RUN_DELAY_MAX",
    "STEAL_MAX",
    "LoadMonitor",
    "Readings",
    "host_load",
    "noise_reasons",
    "timing_cores",
]

#: The timed workers' threads were preempted more than this often per second of timing and per
#: intra-op thread of one timed worker (:attr:`~kerneljudge.verdict.HostLoad.preemptions_per_s`).
#: A scheduler slice is 0.75-3 ms (EEVDF's base slice grows with log2 of the CPU count), so 20
#: preemptions a second hand about 1.5-6% of the time to other tasks; a pinned worker on a
#: quiet host is preempted a few times a second (kernel threads).
PREEMPTIONS_PER_S_MAX = 20.0
#: The timed workers' threads waited for a CPU more than this share of the time (run delay per
#: intra-op thread of one timed worker, :attr:`~kerneljudge.verdict.HostLoad.run_delay`): times
#: are inflated by about that much, unevenly between batches.
RUN_DELAY_MAX = 0.05
#: More than this share of the timing cores' time was stolen by the hypervisor.
STEAL_MAX = 0.05
#: More than this share of the timing cores' time waited for I/O (paging, swapping).
IOWAIT_MAX = 0.20
#: A contestant's per-round batch medians spread (interquartile range over median) more than
#: this: its speed moved between rounds by more than the 1-5% a quiet host shows.
ROUND_SPREAD_MAX = 0.10


def timing_cores(kind: str, threads: int = 0) -> tuple[tuple[int, ...], int]:
    """The CPU cores the timed workers are pinned to and their torch intra-op thread count.

    CUDA: :func:`~kerneljudge.worker.process.timing_cpu` (the highest core this process may
    use), one thread (host-side launch overhead is part of every timed call). CPU: the
    highest ``max(1, (n - 1) // 2)`` of the ``n`` cores this process may use (on 2 cores: 1),
    leaving the rest to the supervisor and the rest of the host, with one thread per reserved
    core, or ``threads`` when it is smaller and > 0.
    """
    if kind == "cuda":
        return (timing_cpu(),), 1
    allowed = sorted(os.sched_getaffinity(0))
    k = max(1, (len(allowed) - 1) // 2)
    return tuple(allowed[-k:]), (min(threads, k) if threads > 0 else k)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _runnable() -> int | None:
    text = _read("/proc/loadavg")
    try:
        return int(text.split()[3].split("/")[0]) if text else None
    except (IndexError, ValueError):
        return None


def _pressure_us() -> int | None:
    text = _read("/proc/pressure/cpu")
    for line in (text or "").splitlines():
        if line.startswith("some"):
            for item in line.split():
                if item.startswith("total="):
                    return int(item[6:])
    return None


def _cpu_ticks(cores: Sequence[int]) -> tuple[int, int, int] | None:
    """(all, iowait, steal) ticks of ``cores`` (all CPUs when empty), from ``/proc/stat``."""
    text = _read("/proc/stat")
    if text is None:
        return None
    names = {f"cpu{c}" for c in cores} if cores else {"cpu"}
    total = iowait = steal = 0
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in names:
            ticks = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            iowait += ticks[4] if len(ticks) > 4 else 0
            steal += ticks[7] if len(ticks) > 7 else 0
    return (total, iowait, steal) if total else None


def _task_counters(pid: int) -> dict[int, tuple[int, int | None]]:
    """tid -> (involuntary context switches, run-queue wait in ns or None) of ``pid``'s threads."""
    out: dict[int, tuple[int, int | None]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        status = _read(f"/proc/{pid}/task/{tid}/status") or ""
        switches = next(
            (int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("nonvoluntary")),
            None,
        )
        if switches is None:
            continue
        sched = (_read(f"/proc/{pid}/task/{tid}/schedstat") or "").split()
        out[int(tid)] = (switches, int(sched[1]) if len(sched) > 1 else None)
    return out


@dataclass
class Readings:
    """Raw deltas of one or more timing passes (see the module docstring for the sources)."""

    seconds: float = 0.0
    runnable: list[int] = field(default_factory=list)
    pressure_us: int | None = None
    ticks: tuple[int, int, int] | None = None
    preemptions: int | None = None
    run_delay_ns: int | None = None

    def __add__(self, other: Readings) -> Readings:
        def add(a: int | None, b: int | None) -> int | None:
            if a is None or b is None:
                return a if b is None else b
            return a + b

        def add_ticks(
            a: tuple[int, int, int] | None, b: tuple[int, int, int] | None
        ) -> tuple[int, int, int] | None:
            if a is None or b is None:
                return a if b is None else b
            return (a[0] + b[0], a[1] + b[1], a[2] + b[2])

        return Readings(
            self.seconds + other.seconds,
            self.runnable + other.runnable,
            add(self.pressure_us, other.pressure_us),
            add_ticks(self.ticks, other.ticks),
            add(self.preemptions, other.preemptions),
            add(self.run_delay_ns, other.run_delay_ns),
        )


class LoadMonitor:
    """Reads the host's load over one timing pass: :meth:`start`, :meth:`between_batches`
    after every batch, :meth:`stop` (returns the pass's :class:`Readings`).

    Args:
        pids: the timed workers' process ids.
        cores: the timing cores (``/proc/stat`` is read for these; all CPUs when empty).
    """

    def __init__(self, pids: Sequence[int], cores: Sequence[int]) -> None:
        self.pids = list(pids)
        self.cores = list(cores)
        self._t0 = 0.0
        self._runnable: list[int] = []
        self._pressure: int | None = None
        self._ticks: tuple[int, int, int] | None = None
        self._tasks: dict[tuple[int, int], tuple[int, int | None]] = {}

    def _tasks_now(self) -> dict[tuple[int, int], tuple[int, int | None]]:
        return {(p, t): c for p in self.pids for t, c in _task_counters(p).items()}

    def start(self) -> None:
        self._runnable = []
        self._pressure = _pressure_us()
        self._ticks = _cpu_ticks(self.cores)
        self._tasks = self._tasks_now()
        self._t0 = time.monotonic()

    def between_batches(self) -> None:
        running = _runnable()
        if running is not None:
            self._runnable.append(max(0, running - 1))

    def stop(self) -> Readings:
        seconds = time.monotonic() - self._t0
        pressure, ticks, tasks = _pressure_us(), _cpu_ticks(self.cores), self._tasks_now()
        # Threads present at both ends; one that ended meanwhile loses its counts.
        both = [k for k in tasks if k in self._tasks]
        switches = sum(tasks[k][0] - self._tasks[k][0] for k in both)
        delays = [(tasks[k][1], self._tasks[k][1]) for k in both]
        known = [(a, b) for a, b in delays if a is not None and b is not None]
        delay = sum(a - b for a, b in known) if delays and len(known) == len(delays) else None
        return Readings(
            seconds=seconds,
            runnable=list(self._runnable),
            pressure_us=(
                pressure - self._pressure
                if pressure is not None and self._pressure is not None
                else None
            ),
            ticks=(
                (ticks[0] - self._ticks[0], ticks[1] - self._ticks[1], ticks[2] - self._ticks[2])
                if ticks is not None and self._ticks is not None
                else None
            ),
            preemptions=switches if both else None,
            run_delay_ns=delay,
        )


def noise_reasons(host: HostLoad, cores: int, threads: int) -> tuple[str, ...]:
    """Why the timing was noisy: one sentence per reading past its threshold (empty: quiet).

    A reading counts when it is present and past its threshold:

    * ``run_queue`` (median) above the host's CPUs outside the ``cores`` timing cores: other
      runnable tasks outnumber the cores they could have to themselves, so some share the
      timing cores (the scheduler balances them onto every core);
    * ``preemptions_per_s`` above :data:`PREEMPTIONS_PER_S_MAX`;
    * ``run_delay`` above :data:`RUN_DELAY_MAX`;
    * ``steal`` above :data:`STEAL_MAX`, ``iowait`` above :data:`IOWAIT_MAX`;
    * a contestant's ``round_spread`` above :data:`ROUND_SPREAD_MAX`.

    ``cpu_pressure`` is reported, not ruled on: it counts a wait of any task on any CPU,
    also outside the timing cores; the run queue and the workers' own run delay say whether
    the contention reached them. ``threads`` is the timed workers' thread count (for the
    wording only).
    """
    reasons = []
    outside = max(0, (os.cpu_count() or host.cpus) - cores)
    if host.run_queue is not None and host.run_queue > outside:
        reasons.append(
            f"{host.run_queue:g} other runnable tasks (median) for the {outside} CPU(s) "
            f"outside the {cores} timing core(s)"
        )
    if host.preemptions_per_s is not None and host.preemptions_per_s > PREEMPTIONS_PER_S_MAX:
        reasons.append(
            f"the timed workers were preempted {host.preemptions_per_s:.0f} times a second "
            f"per thread ({threads} thread(s))"
        )
    if host.run_delay is not None and host.run_delay > RUN_DELAY_MAX:
        reasons.append(f"the timed workers waited {host.run_delay:.0%} of the time for a CPU")
    if host.steal is not None and host.steal > STEAL_MAX:
        reasons.append(f"the hypervisor stole {host.steal:.0%} of the timing cores' time")
    if host.iowait is not None and host.iowait > IOWAIT_MAX:
        reasons.append(f"the timing cores waited for I/O {host.iowait:.0%} of the time")
    for name, spread in host.round_spread.items():
        if spread > ROUND_SPREAD_MAX:
            reasons.append(f"{name}'s batch medians spread {spread:.0%} between rounds")
    return tuple(reasons)


def host_load(
    readings: Readings,
    cores: Sequence[int],
    threads: int,
    round_spread: dict[str, float] | None = None,
) -> HostLoad:
    """The :class:`HostLoad` of ``readings`` with its noise rule applied.

    Args:
        readings: the deltas of the timing passes reported.
        cores: the timing cores; threads: the timed workers' intra-op threads.
        round_spread: contestant -> spread of its batch medians between rounds
            (:func:`kerneljudge.timing.round_spread`).
    """
    span = max(readings.seconds, 1e-9)
    per_thread = span * max(1, threads)
    ticks = readings.ticks
    host = HostLoad(
        cpus=len(os.sched_getaffinity(0)),
        seconds=readings.seconds,
        run_queue=float(np.median(readings.runnable)) if readings.runnable else None,
        run_queue_max=max(readings.runnable) if readings.runnable else None,
        cpu_pressure=(
            min(1.0, readings.pressure_us / 1e6 / span)
            if readings.pressure_us is not None
            else None
        ),
        steal=ticks[2] / ticks[0] if ticks and ticks[0] > 0 else None,
        iowait=ticks[1] / ticks[0] if ticks and ticks[0] > 0 else None,
        preemptions=readings.preemptions,
        preemptions_per_s=(
            readings.preemptions / per_thread if readings.preemptions is not None else None
        ),
        run_delay=(
            min(1.0, readings.run_delay_ns / 1e9 / per_thread)
            if readings.run_delay_ns is not None
            else None
        ),
        round_spread=dict(round_spread or {}),
    )
    reasons = noise_reasons(host, len(cores), threads)
    return dataclasses.replace(host, noisy=bool(reasons), noise_reasons=reasons)
