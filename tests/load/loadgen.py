"""Load a machine the way a busy shared host is loaded, for tests, benchmarks and by hand.

:class:`Load` is a context manager that starts, as real processes:

* CPU spinners: ``2 x os.cpu_count()`` pure busy loops (by default);
* a memory-bandwidth hog: a process copying a numpy buffer far larger than the last-level cache
  (``8 x`` the L3 size read from sysfs, at least 64 MiB) back and forth in a loop;

and, optionally, a thread that judges a candidate in a loop on a judge of its own ("another
verdict beside"). Every process ends by itself: it checks a deadline (``seconds`` after it
started) and asks the kernel to kill it when the process that started it dies
(``PR_SET_PDEATHSIG``), so a test that dies leaves nothing running. On exit of the ``with`` block
every process is killed (SIGKILL) and reaped, and the verdict thread is stopped and its judge
closed.

By hand::

    python tests/load/loadgen.py --seconds 600            # spinners + hog, ten minutes
    python tests/load/loadgen.py --seconds 600 --spinners 8 --no-hog \\
        --beside tests/adversarial/problem_cpu.py tests/adversarial/cpu/correct_baseline.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The child programs. argv: deadline (time.time() seconds), parent pid[, buffer bytes].
# Each asks for SIGKILL when its parent dies and checks the parent is still the one that started
# it (it may have died before the prctl).
_GUARD = r"""
import ctypes, os, signal, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(0)
"""

SPIN_CODE = (
    _GUARD
    + r"""
while time.time() < deadline:
    for _ in range(200_000):
        pass
"""
)

HOG_CODE = (
    _GUARD
    + r"""
import numpy as np
n = int(sys.argv[3]) // 8
a = np.ones(n); b = np.empty(n)
while time.time() < deadline:
    np.copyto(b, a)
    np.copyto(a, b)
"""
)


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache sysfs lists for cpu0 (bytes); 32 MiB when unknown."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or 32 * 1024**2


@dataclass
class BesideRecord:
    """What the verdict thread beside the load saw: one ``(status, reason)`` per verdict and the
    text of any exception ``Judge.evaluate`` raised."""

    verdicts: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _Beside(threading.Thread):
    """Judges ``candidate`` on ``problem`` in a loop, on a judge of its own, until stopped."""

    def __init__(self, problem: str | Path, candidate: str | Path, config: Any) -> None:
        super().__init__(name="kj-load-beside", daemon=True)
        self.problem, self.candidate, self.config = problem, candidate, config
        self.stop = threading.Event()
        self.record = BesideRecord()

    def run(self) -> None:
        from kerneljudge.judge import Judge

        try:
            with Judge(self.problem, self.config) as judge:
                while not self.stop.is_set():
                    verdict = judge.evaluate(self.candidate)
                    self.record.verdicts.append((verdict.status.value, verdict.reason))
        except Exception as exc:  # noqa: BLE001 - recorded for the caller to judge
            self.record.errors.append(f"{type(exc).__name__}: {exc}")


class Load:
    """Busy loops, a memory-bandwidth hog and optionally a verdict loop, while the block runs.

    Args:
        seconds: every load process ends by itself this many seconds after start (wall time).
        spinners: busy-loop processes (None: ``2 * os.cpu_count()``).
        hog_bytes: size of each of the hog's two buffers (bytes; None: ``8 x`` the last-level
            cache, at least 64 MiB); 0 starts no hog.
        beside: ``(problem, candidate)`` to judge in a loop on a thread meanwhile, or None.
        beside_config: the :class:`kerneljudge.judge.JudgeConfig` of that judge (None: the
            defaults with a short timing budget and the eager baseline only).

    Attributes:
        pids: the load processes' pids (after ``__enter__``).
        beside: the verdict loop's record (:class:`BesideRecord`), or None without one.
    """

    def __init__(
        self,
        seconds: float = 600.0,
        *,
        spinners: int | None = None,
        hog_bytes: int | None = None,
        beside: tuple[str | Path, str | Path] | None = None,
        beside_config: Any = None,
    ) -> None:
        self.seconds = seconds
        self.spinners = 2 * (os.cpu_count() or 1) if spinners is None else spinners
        self.hog_bytes = (
            max(64 * 1024**2, 8 * last_level_cache_bytes()) if hog_bytes is None else hog_bytes
        )
        self._beside_args = beside
        self._beside_config = beside_config
        self._procs: list[subprocess.Popen[bytes]] = []
        self._thread: _Beside | None = None
        self.beside: BesideRecord | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _spawn(self, code: str, *extra: str) -> None:
        deadline = time.time() + self.seconds
        args = [sys.executable, "-c", code, repr(deadline), str(os.getpid()), *extra]
        self._procs.append(
            subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        )

    def __enter__(self) -> Load:
        try:
            for _ in range(self.spinners):
                self._spawn(SPIN_CODE)
            if self.hog_bytes > 0:
                self._spawn(HOG_CODE, str(self.hog_bytes))
            if self._beside_args is not None:
                config = self._beside_config or _default_beside_config()
                self._thread = _Beside(*self._beside_args, config)
                self.beside = self._thread.record
                self._thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def alive(self) -> int:
        """How many load processes are still running."""
        return sum(p.poll() is None for p in self._procs)

    def close(self, beside_wait_s: float = 120.0) -> None:
        """Kill and reap every load process; stop the verdict loop (waiting up to
        ``beside_wait_s`` for the verdict in progress, whose judge then closes its workers)."""
        if self._thread is not None:
            self._thread.stop.set()
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGKILL)
                except OSError:
                    pass
        for p in self._procs:
            p.wait()
        if self._thread is not None:
            self._thread.join(beside_wait_s)


def load_tier_config(cache: Path) -> Any:
    """The load tier's judge configuration (tests/load/test_honest_under_load.py, and
    benchmarks/timer_cheats_under_load.py): the CPU, the eager baseline only, two trials, a
    0.3 s timing budget, builds cached under ``cache``."""
    from kerneljudge.judge import JudgeConfig
    from kerneljudge.timing import TimingConfig

    return JudgeConfig(
        device="cpu",
        trials=2,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=0.3),
        cache_dir=cache,
    )


def _default_beside_config() -> Any:
    from kerneljudge.judge import JudgeConfig
    from kerneljudge.timing import TimingConfig

    return JudgeConfig(
        device="cpu", baselines=("eager",), timing_config=TimingConfig(max_time_s=0.3)
    )


@dataclass
class _Every:
    """Prints how many load processes run, every ``period`` seconds."""

    load: Load
    period: float = 30.0

    def ticks(self, seconds: float) -> Iterator[int]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(self.period, max(0.0, end - time.monotonic())))
            yield self.load.alive()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Load this machine: busy loops and a memory hog.")
    ap.add_argument("--seconds", type=float, default=600.0, help="how long (default 600)")
    ap.add_argument("--spinners", type=int, default=None, help="busy loops (default 2 x cores)")
    ap.add_argument(
        "--hog-mib", type=int, default=None, help="hog buffer MiB (default 8 x L3); 0: no hog"
    )
    ap.add_argument("--no-hog", action="store_true", help="start no memory hog")
    ap.add_argument(
        "--beside",
        nargs=2,
        metavar=("PROBLEM", "CANDIDATE"),
        help="also judge CANDIDATE on PROBLEM in a loop meanwhile",
    )
    args = ap.parse_args(argv)
    hog = 0 if args.no_hog else (None if args.hog_mib is None else args.hog_mib * 1024**2)
    if args.beside:
        try:
            import kerneljudge  # noqa: F401
        except ImportError:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    load = Load(args.seconds, spinners=args.spinners, hog_bytes=hog, beside=args.beside)
    print(
        f"loading for {args.seconds:.0f} s: {load.spinners} spinners, "
        f"hog {load.hog_bytes / 1024**2:.0f} MiB x 2"
        + (f", judging {args.beside[1]} beside" if args.beside else ""),
        flush=True,
    )
    try:
        with load:
            for alive in _Every(load).ticks(args.seconds):
                line = f"  {alive} load processes running"
                if load.beside is not None:
                    statuses = [s for s, _ in load.beside.verdicts]
                    line += f"; verdicts beside: {len(statuses)}, " + ", ".join(
                        f"{s} {statuses.count(s)}" for s in sorted(set(statuses))
                    )
                print(line, flush=True)
    except KeyboardInterrupt:
        print("interrupted: load stopped", flush=True)
    if load.beside is not None:
        bad = [f"{s}: {r[:160]}" for s, r in load.beside.verdicts if s != "correct"]
        print(
            f"verdicts beside: {len(load.beside.verdicts)}, not correct: {len(bad)}",
            *bad,
            *load.beside.errors,
            sep="\n  ",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
