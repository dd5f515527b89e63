"""Waiting for a confined command to end, and reading its worker's own exit status
(supervisor side; :mod:`kerneljudge.worker.confine` starts the commands)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

from kerneljudge.worker.confine import features

__all__ = ["MIN_SHARE", "HostShareClock", "exit_status", "exited"]

#: The least share of the host a :class:`HostShareClock` counts for an interval: a limit it
#: keeps lasts at most 3 times its length in wall time, however loaded the host (or however
#: many tasks the timed command runs itself: they count among the runnable tasks).
MIN_SHARE = 1 / 3


def _runnable() -> int | None:
    """Tasks runnable host-wide now (``/proc/loadavg``'s fourth field, ``R/T``), this reader
    included; None where it cannot be read."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


class HostShareClock:
    """Seconds of the host a command had since the clock was made: wall time, each interval
    between two :meth:`tick` calls weighted by ``min(1, cpus / (R - 1))``, where ``R`` is
    ``/proc/loadavg``'s count of runnable tasks at the tick less the reader (the command's own
    running processes among them) and ``cpus`` the host's CPU count; never less than
    :data:`MIN_SHARE`. On a host with a CPU free for each runnable task it is the wall clock;
    with 5 other runnable tasks on 2 CPUs each second counts 0.4 (the command's own
    running tasks count among them, so a command cannot slow its clock below
    :data:`MIN_SHARE`). A limit kept on this clock
    holds a command to what it would do on a quiet host, and still ends one that hangs.

    Args:
        cpus: the host's CPUs (None: ``os.cpu_count()``).
    """

    def __init__(self, cpus: int | None = None) -> None:
        self.cpus = cpus or os.cpu_count() or 1
        self.started = self._last = time.monotonic()
        self.elapsed = 0.0

    def tick(self) -> float:
        """Add the interval since the last tick at the host's share now; the seconds so far."""
        now = time.monotonic()
        runnable = _runnable()
        share = 1.0 if runnable is None else min(1.0, self.cpus / max(1, runnable - 1))
        self.elapsed += (now - self._last) * max(MIN_SHARE, share)
        self._last = now
        return self.elapsed

    def wall(self) -> float:
        """Wall seconds since the clock was made."""
        return time.monotonic() - self.started


def exited(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    poll: Callable[[], None] | None = None,
    clock: HostShareClock | None = None,
) -> bool:
    """Wait up to ``timeout_s`` seconds for ``proc`` to exit, without reaping it: while it is
    a zombie its pid, and so its process group id, cannot name another process. ``poll`` is
    called while it waits (every 20 ms). ``clock``: the seconds are that clock's (ticked every
    20 ms); None: wall seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        if poll is not None:
            poll()
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                return True
        except ChildProcessError:
            return True
        if clock is not None:
            if clock.tick() >= timeout_s:
                return False
            time.sleep(0.02)
            continue
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.02, max(deadline - time.monotonic(), 0.0)))


def exit_status(returncode: int | None) -> int | None:
    """The worker's own exit status from that of its confined command: negative N when signal
    N killed it (the namespace's PID 1 reports it as 128 + N)."""
    if returncode is not None and features().unshare and 128 < returncode < 128 + 65:
        return 128 - returncode
    return returncode
